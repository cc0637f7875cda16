"""
The bypassed-Pod report (reactor side).

When amp cannot be reached and its webhook's failurePolicy is C{Ignore}, the
API server admits Pods unchanged and says nothing.  Every Pod amp reviews in
an enabled namespace carries its status stamp, so a Pod without one, created
in a namespace that was enabled at the time, bypassed amp.  The Pod watch
(metadata only; its thread drops stamped, opted-out and old Pods, see
L{amp.kube._keep.PodKeep}) hands the others to L{BypassReporter}, which
judges each and reports it: C{amp_bypassed_pods_total{namespace}}, a warning
log line naming the Pod, and a Warning Event C{AmpBypassed} on the Pod.

Never reported: Pods created before their namespace was enabled (or when
that is unknown), Pods of shadow-mode namespaces, of namespaces amp does not
act on (amp's own, C{kubernetes.protected_namespaces}), of namespaces
not enabled now, and Pods created longer ago than the horizon.  A Pod is
judged a moment (L{SETTLE}) after it is seen, so that the namespace watch,
a separate stream, has caught up with a namespace created or enabled just
before it; a listed Pod created before the namespace list landed is judged
at once.

Only the leader among replicas reports (L{amp.kube._lease}); the Lease
carries, from one leader to the next, how far the report got (L{CHECKED}):
the creation time up to which every Pod was judged, and the Pods reported
after it.  So amp's restart reports what was created while it was down,
and a new leader does not report a Pod twice.  Memory is bounded: Pods are
remembered by uid only once reported, and only while within the horizon.
"""

from __future__ import annotations

import json
import uuid
from collections import OrderedDict, deque
from typing import Any, Callable, Mapping, Optional

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from amp.config import KubernetesConfig
from amp.kube._client import describe
from amp.kube._events import Changed, Crashed, Replaced, Restarting, WatchEvent
from amp.kube._keep import PodSeen, format_time, parse_time
from amp.metrics import Metrics
from amp.namespaces import NamespaceInfo
from amp.reasons import Mode
from amp.rules import STATUS_ANNOTATION, is_enabled, mode, protected_namespaces

#: Seconds between seeing a Pod and judging it.
SETTLE = 1.0
#: Pods seen within this many seconds (by creation time) of the newest one
#: judged may still arrive out of order: the hand-over keeps their uids.
MARGIN = 2.0
#: The Lease annotation that carries the report's progress.
CHECKED = "amp.txn2.com/bypass-checked"
#: Event reason and the component that reports it.
REASON = "AmpBypassed"
COMPONENT = "amp"
#: Bounds on memory: uids remembered, uids handed over, Events waiting.
MAX_REMEMBERED = 100_000
MAX_HANDED_OVER = 200
MAX_QUEUED_EVENTS = 1000


def event_message(pod: PodSeen) -> str:
    """The Event's message: what happened and how to recover."""
    if pod.controller:
        recover = f"Delete the Pod so that its {pod.controller} recreates it through amp."
    else:
        recover = "Delete and create the Pod again so that amp reviews it."
    return (f"Pod was admitted without amp: it has no {STATUS_ANNOTATION} annotation, so amp did not review it "
            f"(amp was unreachable and the webhook's failurePolicy Ignore let the Pod in unchanged). {recover}")


class BypassReporter:
    """
    Judges the Pods the Pod watch hands over, and reports the bypassed ones.

    @param namespaces: answers C{cached(name)} from the namespace cache.
    @param post_event: creates one Event (C{namespace}, body) in the
        thread pool; returns a Deferred.
    @param own_namespace: amp's own namespace (never reported, like the
        protected ones, unless C{kubernetes.allow_protected_namespaces}).
    @param identity: this replica's name, for the Events it writes.
    """

    log = Logger()

    def __init__(
        self,
        *,
        config: KubernetesConfig,
        namespaces: Any,
        clock: IReactorTime,
        metrics: Metrics,
        post_event: Callable[[str, dict[str, Any]], Deferred],
        own_namespace: str,
        identity: str,
    ) -> None:
        self._config = config
        self._horizon = config.bypass.horizon
        # The namespaces amp does not act on are not reported either (the
        # webhook's namespaceSelector leaves them out).
        self._ignored = protected_namespaces(config, own_namespace)
        self._namespaces = namespaces
        self._clock = clock
        self._metrics = metrics
        self._post_event = post_event
        self._identity = identity
        self.active = False
        self._namespaces_listed = False
        self._namespaces_listed_at: Optional[float] = None
        self._reported: OrderedDict[str, float] = OrderedDict()
        self._pending: deque[tuple[float, PodSeen]] = deque()
        self._deleted: set[str] = set()
        self._timer: Optional[IDelayedCall] = None
        self._waiting: list[PodSeen] = []
        self._through: Optional[float] = None
        self._newest: Optional[float] = None
        self._events: deque[tuple[str, dict[str, Any]]] = deque()
        self._posting = False

    # ------------------------------------------------------------ terms

    def start_term(self, previous: Mapping[str, str]) -> None:
        """This replica now reports; C{previous} are the Lease's annotations."""
        self.active = True
        self._through, handed = _read_checked(previous.get(CHECKED))
        for uid in handed:
            self._reported.setdefault(uid, self._through or self._clock.seconds())
        self._newest = None
        self.log.info("Reporting bypassed Pods created after {since}",
                      since=format_time(self._through) if self._through is not None else
                      f"the last {self._horizon:g}s")

    def end_term(self) -> None:
        """Another replica reports now (or amp stops): forget what is pending."""
        self.active = False
        self._pending.clear()
        self._waiting.clear()
        self._deleted.clear()
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None

    def namespaces_listed(self, at: Optional[float] = None) -> None:
        """
        The namespace cache is complete (its list landed C{at}, now if
        None): judge the Pods that waited for it.
        """
        self._namespaces_listed = True
        self._namespaces_listed_at = self._clock.seconds() if at is None else at
        waiting, self._waiting = self._waiting, []
        for pod in waiting:
            self._judge(pod)

    @property
    def remembered(self) -> int:
        """How many reported Pods are remembered (so as not to report them twice)."""
        return len(self._reported)

    def checked(self) -> dict[str, str]:
        """The Lease annotations that hand this report's progress on."""
        through = self._through
        if self._newest is not None:
            through = self._newest - MARGIN
            if self._pending:
                through = min(through, min(p.created for _, p in self._pending) - MARGIN)
            if self._through is not None:
                through = max(through, self._through)
        if through is None:
            return {}
        handed = [uid for uid, created in self._reported.items() if created > through][-MAX_HANDED_OVER:]
        return {CHECKED: json.dumps({"through": format_time(through, micro=True), "reported": handed},
                                    separators=(",", ":"))}

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
                if listed is not None and pod.created < listed - 1 and pod.uid not in self._reported:
                    self._judge(pod)
                else:
                    self._seen(pod)
        elif isinstance(event, Changed):
            if event.kind == "DELETED":
                self._deleted.add(event.obj.uid)
            else:
                self._seen(event.obj)
        elif isinstance(event, Restarting):
            if event.reason != "timeout" or event.error:
                self.log.warn("The Pod watch restarts ({reason}): {error}; next attempt in {delay:.2f}s",
                              reason=event.reason, error=event.error or "-", delay=event.delay)
        elif isinstance(event, Crashed):
            self.log.critical("Pod watch thread failed: {error}", error=event.error)

    def _seen(self, pod: PodSeen) -> None:
        if pod.uid in self._reported:
            return
        self._pending.append((self._clock.seconds() + SETTLE, pod))
        if self._timer is None:
            self._timer = self._clock.callLater(SETTLE, self._settled)

    def _settled(self) -> None:
        self._timer = None
        now = self._clock.seconds()
        while self._pending and self._pending[0][0] <= now:
            _, pod = self._pending.popleft()
            if pod.uid in self._deleted:
                self._deleted.discard(pod.uid)
                continue
            if self._namespaces_listed:
                self._judge(pod)
            else:
                self._waiting.append(pod)
        if not self._pending:
            self._deleted.clear()
        else:
            self._timer = self._clock.callLater(max(0.0, self._pending[0][0] - now), self._settled)

    # ------------------------------------------------------------ judging

    def _judge(self, pod: PodSeen) -> None:
        if self._newest is None or pod.created > self._newest:
            self._newest = pod.created
        if self.bypassed(pod):
            self._report(pod)

    def bypassed(self, pod: PodSeen) -> bool:
        """Whether C{pod} (no stamp, not opted out) bypassed amp."""
        if pod.uid in self._reported:
            return False
        if pod.created < self._clock.seconds() - self._horizon:
            return False
        if self._through is not None and pod.created <= self._through:
            return False
        if pod.namespace in self._ignored:
            return False
        ns = self._namespaces.cached(pod.namespace)
        if not isinstance(ns, NamespaceInfo):
            return False
        if not is_enabled(ns, self._config) or mode(ns, self._config) is Mode.SHADOW:
            return False
        # Whole seconds on both sides: a Pod created in the second the
        # namespace was enabled is not reported.
        return ns.enabled_since is not None and pod.created > ns.enabled_since

    def _report(self, pod: PodSeen) -> None:
        self._remember(pod)
        self._metrics.bypassed_pods.labels(pod.namespace).inc()
        self.log.warn("Pod {namespace}/{pod} was created without amp's review (no {annotation} annotation): "
                      "amp was unreachable and the API server admitted it unchanged",
                      namespace=pod.namespace, pod=pod.name, annotation=STATUS_ANNOTATION)
        if len(self._events) >= MAX_QUEUED_EVENTS:
            self.log.warn("No Event for Pod {namespace}/{pod}: {count} Events are waiting to be sent",
                          namespace=pod.namespace, pod=pod.name, count=len(self._events))
            return
        self._events.append((pod.namespace, self._event(pod)))
        self._send()

    def _remember(self, pod: PodSeen) -> None:
        reported = self._reported
        reported[pod.uid] = pod.created
        if len(reported) % 1024 == 0 or len(reported) > MAX_REMEMBERED:
            oldest = self._clock.seconds() - self._horizon
            for uid in [u for u, created in reported.items() if created < oldest]:
                del reported[uid]
            while len(reported) > MAX_REMEMBERED:
                reported.popitem(last=False)

    def _event(self, pod: PodSeen) -> dict[str, Any]:
        now = format_time(self._clock.seconds())
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{pod.name[:200]}.{uuid.uuid4().hex[:16]}", "namespace": pod.namespace},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": pod.namespace, "name": pod.name,
                               "uid": pod.uid},
            "reason": REASON,
            "type": "Warning",
            "message": event_message(pod),
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": self._identity[:128],
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }

    def _send(self) -> None:
        """Send the queued Events one at a time, leaving the thread pool to the review path."""
        if self._posting or not self._events:
            return
        namespace, body = self._events.popleft()
        self._posting = True

        def sent(result: Any) -> None:
            self._posting = False
            if isinstance(result, Failure):
                self.log.warn("Event {reason} for Pod {namespace}/{pod} not created: {error}", reason=REASON,
                              namespace=namespace, pod=body["involvedObject"]["name"],
                              error=describe(result.value))
            self._send()

        self._post_event(namespace, body).addBoth(sent)


def _read_checked(value: Optional[str]) -> tuple[Optional[float], list[str]]:
    """The hand-over annotation: (through, reported uids); (None, []) if absent or unreadable."""
    if not value:
        return None, []
    try:
        doc = json.loads(value)
        through = parse_time(doc.get("through"))
        reported = [str(uid) for uid in doc.get("reported") or ()][:MAX_HANDED_OVER]
    except (ValueError, AttributeError, TypeError):
        return None, []
    return through, reported
