"""
One leader among amp's replicas, through a C{coordination.k8s.io/v1} Lease
(reactor side: the loop and its decisions run on the reactor; each API call
runs in the reactor's thread pool).

L{LeaseElector} reads the Lease every third of its duration and:

  - creates it when there is none (the first replica to do so leads);
  - renews it while it holds it;
  - takes it over when its holder has not renewed it for a whole lease
    duration, measured on this replica's own clock from the moment it saw
    the Lease last change (as client-go's leader election does, so clocks
    that disagree do not matter), or when the holder released it;
  - steps down when it could not renew for two thirds of the duration, so
    that it has stopped before any other replica can take over.

Writes carry the resourceVersion they read: of two replicas racing for the
Lease, one gets a 409 Conflict and stays a follower.  Stopping releases the
Lease (no holder), so another replica takes over at its next read instead of
after the lease duration.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable, Optional, ParamSpec, TypeVar

from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger
from twisted.python.failure import Failure

from amp.kube._client import Conflict, KubeClient, describe
from amp.kube._keep import format_time

if TYPE_CHECKING:
    from amp.reactors import IAmpReactor

_P = ParamSpec("_P")
_T = TypeVar("_T")


class LeaseElector:
    """
    @param client: provides C{read_lease}, C{create_lease}, C{replace_lease}
        (blocking; run in C{reactor}'s thread pool).
    @param reactor: for its thread pool.
    @param clock: for the loop's timers and the Lease's times.
    @param identity: this replica's name in the Lease (unique per process).
    @param duration: the lease duration, in seconds.
    @param request_timeout: the bound on each API call (at most a third of
        C{duration} is used).
    @param on_elected: called when this replica becomes the leader.
    @param on_deposed: called when it stops being the leader.
    """

    log = Logger()

    def __init__(
        self,
        *,
        client: KubeClient,
        reactor: IAmpReactor,
        clock: IReactorTime,
        namespace: str,
        name: str,
        identity: str,
        duration: float,
        request_timeout: float,
        on_elected: Callable[[], None],
        on_deposed: Callable[[], None],
    ) -> None:
        self._client = client
        self._reactor = reactor
        self._clock = clock
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.duration = duration
        self.retry = duration / 3
        self.renew_deadline = duration * 2 / 3
        self._timeout = min(request_timeout, self.retry)
        self._on_elected = on_elected
        self._on_deposed = on_deposed
        self.leader = False
        self._running = False
        self._lease: Optional[dict[str, Any]] = None
        self._observed: Optional[tuple[Any, ...]] = None
        self._observed_at = 0.0
        self._tick_call: Optional[IDelayedCall] = None
        self._deadline_call: Optional[IDelayedCall] = None
        self._last_error = ""

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        self._running = True
        self._tick()

    def stop(self) -> Deferred[None]:
        """
        Stop the loop; a leader steps down and releases the Lease.  The
        Deferred fires once the release is written (or failed).
        """
        self._running = False
        for call in (self._tick_call, self._deadline_call):
            if call is not None and call.active():
                call.cancel()
        self._tick_call = self._deadline_call = None
        if not self.leader:
            return succeed(None)
        self._depose("amp is stopping")
        lease = self._lease
        if lease is None:
            return succeed(None)
        body = self._body(lease, self._clock.seconds(), holder=None)
        body["spec"]["leaseDurationSeconds"] = 1
        d = self._in_pool(self._client.replace_lease, self.namespace, self.name, body, self._timeout)

        def released(result: Any) -> None:
            if isinstance(result, Failure):
                self.log.info(
                    "Lease {namespace}/{name} not released ({error}); it expires on its own",
                    namespace=self.namespace,
                    name=self.name,
                    error=_text(result),
                )
            else:
                self.log.info("Released Lease {namespace}/{name}", namespace=self.namespace, name=self.name)

        return d.addBoth(released)

    # ------------------------------------------------------------ the loop

    def _in_pool(self, f: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> Deferred[_T]:
        return deferToThreadPool(self._reactor, self._reactor.getThreadPool(), f, *args, **kwargs)

    def _tick(self) -> None:
        self._tick_call = None
        if not self._running:
            return
        d = self._in_pool(self._client.read_lease, self.namespace, self.name, self._timeout)
        d.addCallback(self._read)
        d.addErrback(self._failed)
        d.addCallback(self._schedule)

    def _schedule(self, _: Any) -> None:
        if self._running:
            self._tick_call = self._clock.callLater(self.retry, self._tick)

    def _read(self, lease: Optional[dict[str, Any]]) -> Optional[Deferred[None]]:
        if not self._running:
            return None
        now = self._clock.seconds()
        if lease is None:
            body = self._body(None, now, holder=self.identity, acquired=True)
            d = self._in_pool(self._client.create_lease, self.namespace, body, self._timeout)
            return d.addCallbacks(self._won, self._lost)
        meta = lease.get("metadata") or {}
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        seen = (holder, spec.get("renewTime"), meta.get("resourceVersion"))
        if seen != self._observed:
            self._observed, self._observed_at = seen, now
        if holder == self.identity and self.leader:
            body = self._body(lease, now, holder=self.identity)
            d = self._in_pool(self._client.replace_lease, self.namespace, self.name, body, self._timeout)
            return d.addCallbacks(self._renewed, self._lost)
        held_for = spec.get("leaseDurationSeconds") or self.duration
        if holder == self.identity or not holder or now - self._observed_at >= held_for:
            # Free, expired, or ours from before a step-down: take it.
            body = self._body(
                lease,
                now,
                holder=self.identity,
                acquired=True,
                transitions=int(spec.get("leaseTransitions") or 0) + (holder != self.identity),
            )
            d = self._in_pool(self._client.replace_lease, self.namespace, self.name, body, self._timeout)
            return d.addCallbacks(self._won, self._lost)
        if self.leader:
            self._depose(f"the Lease is held by {holder}")
        return None

    def _body(
        self,
        lease: Optional[dict[str, Any]],
        now: float,
        *,
        holder: Optional[str],
        acquired: bool = False,
        transitions: Optional[int] = None,
    ) -> dict[str, Any]:
        spec = dict((lease or {}).get("spec") or {})
        spec.update(
            holderIdentity=holder,
            leaseDurationSeconds=int(math.ceil(self.duration)),
            renewTime=format_time(now, micro=True),
        )
        if acquired or "acquireTime" not in spec:
            spec["acquireTime"] = format_time(now, micro=True)
        if transitions is not None:
            spec["leaseTransitions"] = transitions
        spec.setdefault("leaseTransitions", 0)
        metadata: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if lease is not None:
            old = lease.get("metadata") or {}
            metadata["resourceVersion"] = old.get("resourceVersion")
            if old.get("annotations"):
                metadata["annotations"] = dict(old["annotations"])
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata, "spec": spec}

    def _renewed(self, lease: dict[str, Any]) -> None:
        self._lease = lease
        meta, spec = lease.get("metadata") or {}, lease.get("spec") or {}
        self._observed = (spec.get("holderIdentity") or "", spec.get("renewTime"), meta.get("resourceVersion"))
        self._observed_at = self._clock.seconds()
        self._last_error = ""
        if self._deadline_call is not None and self._deadline_call.active():
            self._deadline_call.cancel()
        self._deadline_call = self._clock.callLater(
            self.renew_deadline, self._depose, f"no renewal for {self.renew_deadline:g}s"
        )

    def _won(self, lease: dict[str, Any]) -> None:
        if not self._running:
            return
        self._renewed(lease)
        if not self.leader:
            self.leader = True
            self.log.info(
                "This replica ({identity}) now leads through Lease {namespace}/{name}",
                identity=self.identity,
                namespace=self.namespace,
                name=self.name,
            )
            self._on_elected()

    def _lost(self, failure: Failure) -> None:
        failure.trap(Conflict)
        self.log.debug(
            "Lease {namespace}/{name}: another replica wrote it first", namespace=self.namespace, name=self.name
        )

    def _failed(self, failure: Failure) -> None:
        error = _text(failure)
        if error != self._last_error:
            self._last_error = error
            self.log.warn(
                "Lease {namespace}/{name} could not be read or written: {error}",
                namespace=self.namespace,
                name=self.name,
                error=error,
            )

    def _depose(self, why: str) -> None:
        if self._deadline_call is not None and self._deadline_call.active():
            self._deadline_call.cancel()
        self._deadline_call = None
        if self.leader:
            self.leader = False
            self.log.info(
                "This replica ({identity}) no longer leads through Lease {namespace}/{name}: {why}",
                identity=self.identity,
                namespace=self.namespace,
                name=self.name,
                why=why,
            )
            self._on_deposed()


def _text(failure: Failure) -> str:
    return describe(failure.value) if isinstance(failure.value, BaseException) else str(failure.value)
