"""
The bypassed-Pod report's terms (reactor side): one Lease loop
(L{amp.kube._lease}) per start of the namespace source, and, while this
replica holds the Lease, a Pod watch (metadata only) in a thread of its own,
with a client of its own so that stepping down can cut its sockets, feeding
the reporter (L{amp.kube._bypass}).

A term begins when this replica wins the Lease and ends when it loses it or
stops.  Nothing passes from one term to the next, nor from one replica to
the next, but the Events the reporters created: each term lists every Pod
again, and the Events' names answer for the Pods already reported.

Others may hold terms of the same Lease (C{terms}: the managed
registration, L{amp.registration.RegistrationKeeper}); with C{pods} false
the Lease picks the replica for them alone and no Pod is watched.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol, Sequence

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.internet.threads import deferToThreadPool

from amp.config import KubernetesConfig
from amp.kube._bridge import Bridge
from amp.kube._bypass import BypassReporter
from amp.kube._client import KubeClient
from amp.kube._keep import PodKeep
from amp.kube._lease import LeaseElector
from amp.kube._verdict import EnableRevisions
from amp.metrics import Metrics
from amp.namespaces import INamespaceSource

if TYPE_CHECKING:
    from amp.reactors import IAmpReactor

#: Pods per page of the Pod list.
POD_PAGE = 500


class LeaseTerm(Protocol):
    """Another user of the Lease's terms (the managed registration's L{amp.registration.RegistrationKeeper})."""

    def start_term(self, client: KubeClient) -> None:
        """This replica holds the Lease from now on; C{client} is the Lease loop's."""

    def end_term(self) -> None:
        """This replica no longer holds it (or amp stops)."""


@dataclass(eq=False)
class _PodWatch:
    """The Pod watch of one term."""

    stop: threading.Event
    bridge: Bridge
    client: KubeClient


class BypassReport:
    """
    The report of one start of the namespace source.

    @param client: the source's client for bounded calls (the Lease, the
        Events); forked for each term's Pod watch.
    @param namespaces: the namespace cache (C{cached(name)}).
    @param enables: the enablings the namespace watch saw.
    @param watch: starts a list/watch thread (the source's C{_watch}):
        C{watch(name, thread_name, lister, parse=, handler=, stop=,
        on_finished=, **options)} returns its L{Bridge}.
    @param wall: the wall clock the Pod watch thread checks the horizon
        against.
    """

    def __init__(
        self,
        *,
        config: KubernetesConfig,
        client: KubeClient,
        reactor: IAmpReactor,
        clock: IReactorTime,
        metrics: Metrics,
        identity: str,
        namespaces: INamespaceSource,
        enables: EnableRevisions,
        own_namespace: str,
        lease_namespace: str,
        watch: Callable[..., Bridge],
        wall: Callable[[], float],
        terms: Sequence[LeaseTerm] = (),
        pods: bool = True,
    ) -> None:
        self._config = config
        self._terms = tuple(terms)
        self._report_pods = pods
        self._client = client
        self._watch = watch
        self._wall = wall
        self._stopped = False
        self._pods: Optional[_PodWatch] = None

        def post_event(namespace: str, body: dict[str, Any]) -> Deferred[bool]:
            return deferToThreadPool(
                reactor, reactor.getThreadPool(), client.create_event, namespace, body, config.request_timeout
            )

        self.reporter = BypassReporter(
            config=config,
            namespaces=namespaces,
            clock=clock,
            metrics=metrics,
            post_event=post_event,
            own_namespace=own_namespace,
            identity=identity,
            enables=enables.get,
        )
        self.elector = LeaseElector(
            client=client,
            reactor=reactor,
            clock=clock,
            namespace=lease_namespace,
            name=config.bypass.lease_name,
            identity=identity,
            duration=config.bypass.lease_duration,
            request_timeout=config.request_timeout,
            on_elected=self._elected,
            on_deposed=self._deposed,
        )

    def start(self) -> None:
        self.elector.start()

    def stop(self) -> Deferred[None]:
        """Step down and release the Lease; fires once it is released (or failed)."""
        self._stopped = True
        return self.elector.stop()

    def _elected(self) -> None:
        """This replica reports now: watch Pods until it steps down."""
        if self._stopped:
            return
        for term in self._terms:
            term.start_term(self._client)
        if not self._report_pods:
            return
        self.reporter.start_term()
        horizon = self._config.bypass.horizon
        client = self._client.fork()
        keep = PodKeep(self._config, cutoff=lambda: self._wall() - horizon)
        stop = threading.Event()
        bridge = self._watch(
            "pods",
            "amp-pod-watch",
            client.pod_metadata(),
            parse=keep.pod,
            handler=self.reporter.news,
            stop=stop,
            on_finished=client.close,
            kinds=("ADDED", "DELETED"),
            page_size=POD_PAGE,
        )
        self._pods = _PodWatch(stop, bridge, client)

    def _deposed(self) -> None:
        """Another replica reports now, or amp stops: end the Pod watch."""
        for term in self._terms:
            term.end_term()
        pods, self._pods = self._pods, None
        if pods is not None:
            pods.stop.set()
            pods.bridge.close()
            pods.client.cut()
        self.reporter.end_term()
