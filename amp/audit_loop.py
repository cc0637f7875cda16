"""
The continuous audit (C{audit.continuous}, off by default; reactor side):
the replica holding the Lease C{audit.lease_name} runs the audit of
C{amp audit -A} (L{amp.cli.audit.audit}) on a schedule and after changes,
and exposes what it found as C{amp_audit_pods{namespace,state}}.

When it runs: at once when this replica wins the Lease; then
C{audit.interval} after each audit ends; and after a namespace's endpoints
change (L{poke}, from the namespace watch) or the config is reloaded, but
never sooner than C{audit.min_interval} after the last start (a poke while
an audit runs makes one more run after it, not one per poke).  Only one
audit runs at a time; losing the Lease cancels the next and clears the
gauge, so only the holder exposes it.

The audit's endpoint calls use a client of their own with amp's limits
(L{amp.cli.audit_pipeline}), at the audit's own pace: a live review never
waits for a connection or a breaker because of the audit.  The audit
itself (C{run_audit}) is passed in; the default reads the cluster with the
namespace source's client.
"""

from __future__ import annotations

import socket
import uuid
from typing import TYPE_CHECKING, Callable, Optional, Protocol, Union

from twisted.application.service import Service
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from amp.config import Config

if TYPE_CHECKING:
    from amp.cli.audit import AuditRun
    from amp.kube import KubeClient
    from amp.namespaces import INamespaceSource
    from amp.reactors import IAmpReactor
from amp.metrics import Metrics

__all__ = ["AuditService", "ContinuousAudit", "Elector", "cluster_audit"]


class Elector(Protocol):
    """The Lease loop the audit runs under (an L{amp.kube.LeaseElector})."""

    def start(self) -> None:
        """Take part in the election."""

    def stop(self) -> Deferred[None]:
        """Stop; a leader steps down; fires once the Lease is released (or that failed)."""


def cluster_audit(reactor: IAmpReactor, client: KubeClient) -> Callable[[Config], Deferred[AuditRun]]:
    """The audit of every managed namespace through C{client} (an L{amp.kube.KubeClient})."""
    from amp.cli.audit import AuditOptions, audit
    from amp.cli.audit_cluster import PagedLists, kube_getter

    def run(config: Config) -> Deferred[AuditRun]:
        options = AuditOptions(
            config=config,
            concurrency=config.audit.concurrency,
            rate=config.audit.rate,
            page_size=config.audit.page_size,
        )
        lists = PagedLists(kube_getter(client, config.kubernetes.request_timeout), config.audit.page_size, reactor)
        return audit(reactor, options, lists, where="the namespace cache")

    return run


class ContinuousAudit:
    """
    @param elector_factory: makes the Lease loop, given its
        C{on_elected} and C{on_deposed} (an L{amp.kube.LeaseElector}).
    @param run_audit: one audit with a config; fires with an
        L{amp.cli.audit.AuditRun}.
    """

    log = Logger()

    def __init__(
        self,
        *,
        clock: IReactorTime,
        config: Config,
        metrics: Metrics,
        run_audit: Callable[[Config], Deferred[AuditRun]],
        elector_factory: Callable[[Callable[[], None], Callable[[], None]], Elector],
    ) -> None:
        self._clock = clock
        self._config = config
        self._metrics = metrics
        self._run_audit = run_audit
        self.elector = elector_factory(self._elected, self._deposed)
        self.leader = False
        self._timer: Optional[IDelayedCall] = None
        self._running: Optional[Deferred[AuditRun]] = None
        self._again = False
        self._last_start: Optional[float] = None
        self._series: set[tuple[str, str]] = set()

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        self.elector.start()

    def stop(self) -> Deferred[None]:
        self._deposed()
        return self.elector.stop()

    def set_config(self, config: Config) -> None:
        """A reloaded config: the next audit uses it, soon (see L{poke})."""
        self._config = config
        self.poke("config reloaded")

    def poke(self, why: str) -> None:
        """Something the audit depends on changed: audit again as soon as the pace allows."""
        if not self.leader:
            return
        if self._running is not None:
            self._again = True
            return
        self.log.debug("Audit soon: {why}", why=why)
        self._schedule(self._earliest())

    # ------------------------------------------------------------ the schedule

    def _earliest(self) -> float:
        now = self._clock.seconds()
        if self._last_start is None:
            return now
        return max(now, self._last_start + self._config.audit.min_interval)

    def _schedule(self, at: float) -> None:
        now = self._clock.seconds()
        if self._timer is not None and self._timer.active():
            if self._timer.getTime() <= at:
                return
            self._timer.cancel()
        self._timer = self._clock.callLater(max(0.0, at - now), self._run)

    def _run(self) -> None:
        self._timer = None
        if not self.leader or self._running is not None:
            return
        self._last_start = self._clock.seconds()
        self._again = False
        running: Deferred[AuditRun]
        try:
            running = self._run_audit(self._config)
        except Exception:
            running = Deferred()
            running.errback(Failure())
        self._running = running
        running.addBoth(self._finished, running)

    def _finished(self, result: Union[AuditRun, Failure], running: Deferred[AuditRun]) -> None:
        if self._running is not running:
            return  # deposed while it ran: its result is not this replica's to show
        self._running = None
        if isinstance(result, Failure):
            self._metrics.audit_runs.labels("error").inc()
            self.log.warn("The continuous audit failed: {error}", error=result.getErrorMessage())
        else:
            self._metrics.audit_runs.labels("ok").inc()
            self._publish(result)
        if self.leader:
            now = self._clock.seconds()
            self._schedule(self._earliest() if self._again else now + self._config.audit.interval)

    def _publish(self, found: AuditRun) -> None:
        counts: dict[tuple[str, str], int] = {}
        for w in found.workloads:
            for pod in w.pods:
                key = (w.key.namespace, pod.state.value)
                counts[key] = counts.get(key, 0) + 1
        for key in self._series - set(counts):
            self._metrics.audit_pods.remove(*key)
        for (namespace, state), n in counts.items():
            self._metrics.audit_pods.labels(namespace, state).set(n)
        self._series = set(counts)
        self.log.info(
            "Audited {pods} Pods in {workloads} workloads ({calls} endpoint calls): {summary}",
            pods=sum(counts.values()),
            workloads=len(found.workloads),
            calls=found.endpoint_calls,
            summary=", ".join(f"{n} {s}" for s, n in sorted(_by_state(counts).items())) or "none",
        )

    # ------------------------------------------------------------ the Lease

    def _elected(self) -> None:
        self.leader = True
        self._schedule(self._earliest())

    def _deposed(self) -> None:
        self.leader = False
        self._running = None
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        for key in self._series:
            self._metrics.audit_pods.remove(*key)
        self._series = set()


def _by_state(counts: dict[tuple[str, str], int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for (_, state), n in counts.items():
        out[state] = out.get(state, 0) + n
    return out


class AuditService(Service):
    """
    The continuous audit as a child of amp's service: its own Kubernetes
    client (for its Lease and its lists), started and stopped with amp.

    @param namespaces: the namespace source; its C{on_namespace_changed}
        is pointed at L{ContinuousAudit.poke}.
    """

    log = Logger()

    def __init__(
        self,
        config: Config,
        reactor: IAmpReactor,
        metrics: Metrics,
        namespaces: INamespaceSource,
        identity: Optional[str] = None,
    ) -> None:
        super().__init__()
        self._config = config
        self._reactor = reactor
        self._metrics = metrics
        self._namespaces = namespaces
        self._identity = identity or f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"
        self._client: Optional[KubeClient] = None
        self.audit: Optional[ContinuousAudit] = None

    def startService(self) -> None:
        Service.startService(self)
        from amp.kube import KubeClient, LeaseElector
        from amp.kube._client import service_account_namespace

        kube = self._config.kubernetes
        lease_namespace = kube.bypass.lease_namespace or kube.own_namespace or service_account_namespace()
        if not lease_namespace:
            self.log.error(
                "The continuous audit is off: set kubernetes.bypass.lease_namespace (or "
                "kubernetes.own_namespace) when amp does not run in a cluster"
            )
            return
        try:
            self._client = client = KubeClient.from_config(kube)
        except Exception as e:
            self.log.error("The continuous audit is off: {error}", error=str(e) or type(e).__name__)
            return

        def elector(on_elected: Callable[[], None], on_deposed: Callable[[], None]) -> Elector:
            return LeaseElector(
                client=client,
                reactor=self._reactor,
                clock=self._reactor,
                namespace=lease_namespace,
                name=self._config.audit.lease_name,
                identity=self._identity,
                duration=kube.bypass.lease_duration,
                request_timeout=kube.request_timeout,
                on_elected=on_elected,
                on_deposed=on_deposed,
            )

        self.audit = ContinuousAudit(
            clock=self._reactor,
            config=self._config,
            metrics=self._metrics,
            run_audit=cluster_audit(self._reactor, client),
            elector_factory=elector,
        )
        if hasattr(self._namespaces, "on_namespace_changed"):
            audit = self.audit
            self._namespaces.on_namespace_changed = lambda name: audit.poke(f"namespace {name} changed")
        self.audit.start()

    def apply(self, config: Config) -> None:
        """A reloaded config."""
        self._config = config
        if self.audit is not None:
            self.audit.set_config(config)

    def stopService(self) -> Optional[Deferred[None]]:
        Service.stopService(self)
        client = self._client
        if self.audit is None or client is None:  # an audit has its client
            return None

        def closed(result: object) -> object:
            client.close()
            return result

        return self.audit.stop().addBoth(closed)
