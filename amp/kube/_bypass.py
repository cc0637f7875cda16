"""
The bypassed-Pod report (reactor side).

When amp cannot be reached and its webhook's failurePolicy is C{Ignore}, the
API server admits Pods unchanged and says nothing.  Every Pod amp reviews in
an enabled namespace carries its status stamp, so a Pod without one, created
while its namespace was enabled, bypassed amp.  The Pod watch (metadata
only; its thread drops stamped, opted-out and old Pods, see
L{amp.kube._keep.PodKeep}) hands the others to L{BypassReporter}, which
judges each (L{amp.kube._verdict.Judge}: the rules, and how a Pod and its
namespace's enabling are ordered to the write) and reports it: a Warning
Event C{AmpBypassed} on the Pod, and then C{amp_bypassed_pods_total{namespace}}
and a warning log line naming the Pod.

The invariant: B{one Event per bypassed Pod, across any sequence of starts,
clean stops, kills and hand-overs of any number of replicas}.  What has been
reported is recorded in the cluster, by the report itself: the Event's name
is made from the Pod's uid (L{amp.kube._verdict.event_name}), so creating it
is claiming the Pod.  The API server creates it once; every later attempt,
by this replica or any other, before or after a hand-over, from a reporter
killed after its request left or from two reporters that briefly overlap,
gets 409 AlreadyExists and reports nothing.  Nothing is carried in memory or
in the Lease for correctness: a new reporter judges every unstamped Pod
within the horizon again, and the Events already there answer for the Pods
already reported.  (Memory only saves requests: the uids this process has
claimed, bounded.)

The counter and the log line follow the Event: the replica whose create
succeeded counts and logs.  A create whose answer was lost (a timeout) and
whose retry meets 409 is counted as this replica's, as it most likely is
(if another replica created the Event meanwhile, both count it).  A
reporter killed between its Event's creation and its answer leaves the
Event without the log line.

The record lasts as long as the Event: the API server deletes Events after
its C{--event-ttl} (1 h by default), so the horizon (50 min by default)
must stay below it, or a Pod older than the TTL whose Event expired would be
reported a second time.  A Pod older than the horizon is never reported.

A Pod is judged a moment (L{SETTLE}) after it is seen, so that the namespace
watch, a separate stream, has caught up with a namespace created or enabled
just before it; a listed Pod created before the namespace list landed is
judged at once.  Only the leader among replicas reports
(L{amp.kube._report}).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from amp.config import KubernetesConfig
from amp.kube._client import describe
from amp.kube._events import Changed, Crashed, Replaced, Restarting, WatchEvent
from amp.kube._keep import PodSeen
from amp.kube._verdict import REASON, Enabled, Judge, Verdict, event_body, event_name, log_line
from amp.metrics import Metrics
from amp.namespaces import INamespaceSource
from amp.rules import STATUS_ANNOTATION

#: Seconds between seeing a Pod and judging it.
SETTLE = 1.0
#: Bounds on memory: uids remembered, Events waiting.
MAX_REMEMBERED = 100_000
MAX_QUEUED_EVENTS = 1000
#: Seconds before the first retry of an Event whose create failed, and the
#: most between two retries.
RETRY_FIRST = 1.0
RETRY_MAX = 30.0


@dataclass(frozen=True, slots=True)
class _Claim:
    pod: PodSeen
    verdict: Verdict


def _permanent(error: BaseException) -> bool:
    """An answer that another attempt would get again (400, 403, 404, 422...)."""
    status = getattr(error, "status", None)
    return isinstance(status, int) and 400 <= status < 500 and status not in (408, 409, 429)


def _may_have_landed(error: BaseException) -> bool:
    """No answer (a timeout, a broken connection) or the server's own timeout: the Event may exist."""
    status = getattr(error, "status", None)
    return not isinstance(status, int) or status == 504


class BypassReporter:
    """
    Judges the Pods the Pod watch hands over, and reports the bypassed ones.

    @param namespaces: answers C{cached(name)} from the namespace cache.
    @param enables: the enabling of a namespace that this replica's
        namespace watch saw (L{amp.kube._verdict.EnableRevisions.get}).
    @param post_event: creates one Event (C{namespace}, body) in the
        thread pool; its Deferred fires True when created, False when it
        exists already (409).
    @param own_namespace: amp's own namespace (never reported, like the
        protected ones, unless C{kubernetes.allow_protected_namespaces}).
    @param identity: this replica's name, for the Events it writes.
    """

    log = Logger()

    def __init__(
        self,
        *,
        config: KubernetesConfig,
        namespaces: INamespaceSource,
        clock: IReactorTime,
        metrics: Metrics,
        post_event: Callable[[str, dict[str, Any]], Deferred[bool]],
        own_namespace: str,
        identity: str,
        enables: Callable[[str], Optional[Enabled]] = lambda name: None,
    ) -> None:
        self._judge = Judge(config, own_namespace)
        self._horizon = config.bypass.horizon
        self._namespaces = namespaces
        self._enables = enables
        self._clock = clock
        self._metrics = metrics
        self._post_event = post_event
        self._identity = identity
        self.active = False
        self._namespaces_listed = False
        self._namespaces_listed_at: Optional[float] = None
        self._claimed: OrderedDict[str, float] = OrderedDict()
        self._pending: deque[tuple[float, PodSeen, bool]] = deque()
        self._deleted: set[str] = set()
        self._timer: Optional[IDelayedCall] = None
        self._waiting: list[tuple[PodSeen, bool]] = []
        self._claims: deque[_Claim] = deque()
        self._queued: set[str] = set()
        self._uncertain: set[str] = set()
        self._posting = False
        self._retry: Optional[IDelayedCall] = None
        self._failures = 0

    # ------------------------------------------------------------ terms

    def start_term(self) -> None:
        """This replica now reports."""
        self.active = True
        self.log.info("Reporting bypassed Pods created in the last {horizon:g}s", horizon=self._horizon)

    def end_term(self) -> None:
        """
        Another replica reports now (or amp stops): forget what is pending.
        An Event already sent still lands or not; either way the next
        reporter's create answers for it.
        """
        self.active = False
        self._pending.clear()
        self._waiting.clear()
        self._deleted.clear()
        self._claims.clear()
        self._queued.clear()
        self._failures = 0
        for call in (self._timer, self._retry):
            if call is not None and call.active():
                call.cancel()
        self._timer = self._retry = None

    def namespaces_listed(self, at: Optional[float] = None) -> None:
        """
        The namespace cache is complete (its list landed C{at}, now if
        None): judge the Pods that waited for it.
        """
        self._namespaces_listed = True
        self._namespaces_listed_at = self._clock.seconds() if at is None else at
        waiting, self._waiting = self._waiting, []
        for pod, exact in waiting:
            self._judged(pod, exact)

    @property
    def remembered(self) -> int:
        """How many claimed Pods are remembered (so as not to ask the API server again)."""
        return len(self._claimed)

    @property
    def queued(self) -> int:
        """How many Events wait to be sent."""
        return len(self._claims)

    # ------------------------------------------------------------ the Pod watch

    def news(self, event: WatchEvent) -> None:
        """The Pod watch's news (through its bridge)."""
        if not self.active:
            return
        if isinstance(event, Replaced):
            # The namespace cache already knows every namespace a Pod
            # created a second before its list landed could be in.
            listed = self._namespaces_listed_at
            for pod in event.items:
                if listed is not None and pod.created < listed - 1:
                    self._judged(pod, False)
                else:
                    self._seen(pod, False)
        elif isinstance(event, Changed):
            if event.kind == "DELETED":
                self._deleted.add(event.obj.uid)
            else:
                self._seen(event.obj, event.kind == "ADDED")
        elif isinstance(event, Restarting):
            if event.reason != "timeout" or event.error:
                self.log.warn(
                    "The Pod watch restarts ({reason}): {error}; next attempt in {delay:.2f}s",
                    reason=event.reason,
                    error=event.error or "-",
                    delay=event.delay,
                )
        elif isinstance(event, Crashed):
            self.log.critical("Pod watch thread failed: {error}", error=event.error)

    def _seen(self, pod: PodSeen, exact: bool) -> None:
        if pod.uid in self._claimed or pod.uid in self._queued:
            return
        self._pending.append((self._clock.seconds() + SETTLE, pod, exact))
        if self._timer is None:
            self._timer = self._clock.callLater(SETTLE, self._settled)

    def _settled(self) -> None:
        self._timer = None
        now = self._clock.seconds()
        while self._pending and self._pending[0][0] <= now:
            _, pod, exact = self._pending.popleft()
            if pod.uid in self._deleted:
                self._deleted.discard(pod.uid)
                continue
            if self._namespaces_listed:
                self._judged(pod, exact)
            else:
                self._waiting.append((pod, exact))
        if not self._pending:
            self._deleted.clear()
        else:
            self._timer = self._clock.callLater(max(0.0, self._pending[0][0] - now), self._settled)

    # ------------------------------------------------------------ judging

    def verdict(self, pod: PodSeen, exact: bool = False) -> Optional[Verdict]:
        """Why C{pod} (no stamp, not opted out) is to be reported, or None."""
        if pod.uid in self._claimed or pod.uid in self._queued:
            return None
        return self._judge(
            pod,
            self._namespaces.cached(pod.namespace),
            self._enables(pod.namespace),
            exact=exact,
            now=self._clock.seconds(),
        )

    def _judged(self, pod: PodSeen, exact: bool) -> None:
        verdict = self.verdict(pod, exact)
        if verdict is None:
            return
        if len(self._claims) >= MAX_QUEUED_EVENTS:
            self.log.warn(
                "Pod {namespace}/{pod} not reported yet: {count} Events are waiting to be sent; "
                "the next list of Pods judges it again",
                namespace=pod.namespace,
                pod=pod.name,
                count=len(self._claims),
            )
            return
        self._claims.append(_Claim(pod, verdict))
        self._queued.add(pod.uid)
        self._send()

    # ------------------------------------------------------------ the record

    def _send(self) -> None:
        """Send the queued Events one at a time, leaving the thread pool to the review path."""
        if self._posting or not self._claims or self._retry is not None:
            return
        claim = self._claims.popleft()
        pod = claim.pod
        self._posting = True
        body = event_body(pod, claim.verdict, identity=self._identity, now=self._clock.seconds())
        self._post_event(pod.namespace, body).addBoth(self._sent, claim)

    def _sent(self, result: Union[bool, Failure], claim: _Claim) -> None:
        self._posting = False
        pod = claim.pod
        uid = pod.uid
        if isinstance(result, Failure):
            error = result.value
            assert error is not None  # a Failure holds its exception
            if not _permanent(error):
                if _may_have_landed(error):
                    if len(self._uncertain) >= MAX_QUEUED_EVENTS:
                        self._uncertain.clear()
                    self._uncertain.add(uid)
                if self.active:
                    self._claims.appendleft(claim)
                    delay = min(RETRY_MAX, RETRY_FIRST * 2**self._failures)
                    self._failures += 1
                    self.log.warn(
                        "Event {reason} for Pod {namespace}/{pod} not created ({error}); trying again in {delay:g}s",
                        reason=REASON,
                        namespace=pod.namespace,
                        pod=pod.name,
                        error=describe(error),
                        delay=delay,
                    )
                    self._retry = self._clock.callLater(delay, self._retried)
                return
            self._queued.discard(uid)
            self._uncertain.discard(uid)
            self._remember(pod)
            self._reported(claim)
            self.log.warn(
                "Event {reason} for Pod {namespace}/{pod} not created: {error}; the next reporter "
                "reports the Pod again",
                reason=REASON,
                namespace=pod.namespace,
                pod=pod.name,
                error=describe(error),
            )
        else:
            self._failures = 0
            self._queued.discard(uid)
            self._remember(pod)
            if result or uid in self._uncertain:
                self._reported(claim)
            else:
                self.log.debug(
                    "Pod {namespace}/{pod} was reported already (Event {event})",
                    namespace=pod.namespace,
                    pod=pod.name,
                    event=event_name(pod),
                )
            self._uncertain.discard(uid)
        self._send()

    def _retried(self) -> None:
        self._retry = None
        self._send()

    def _reported(self, claim: _Claim) -> None:
        pod = claim.pod
        self._metrics.bypassed_pods.labels(pod.namespace).inc()
        self.log.warn(
            log_line(claim.verdict),
            namespace=pod.namespace,
            pod=pod.name,
            annotation=STATUS_ANNOTATION,
            verdict=str(claim.verdict),
        )

    def _remember(self, pod: PodSeen) -> None:
        claimed = self._claimed
        claimed[pod.uid] = pod.created
        if len(claimed) % 1024 == 0 or len(claimed) > MAX_REMEMBERED:
            oldest = self._clock.seconds() - self._horizon
            for uid in [u for u, created in claimed.items() if created < oldest]:
                del claimed[uid]
            while len(claimed) > MAX_REMEMBERED:
                claimed.popitem(last=False)
