"""
Wiring: the C{MultiService} that is a running amp, assembled from the parts
it is given.

L{AmpService} receives its listening endpoints (the webhook's TLS endpoint
and the metrics listener's, or None when metrics are off), its namespace
source and, for tests, the connector its endpoint calls go through; it never
builds a listener or reaches for the global reactor.  L{amp.tap.makeService}
is the one place that builds the real ones from the config.

One service per concern: the namespace source, the serving certificate's
reload loop, the endpoint client (whose stop closes pooled connections), the
TLS webhook listener, the plain-HTTP metrics listener and the config file's
reload loop (L{AmpService.apply} swaps a reloaded config in).

Stopping (C{SIGTERM} under twistd) is a graceful drain, bounded by
C{listen.drain_timeout}: C{/readyz} fails at once, the webhook listener
closes, every review already received is answered and every connection
closed (L{amp.http.HTTPServerFactory.drain}), and only then do the other parts stop
(the endpoint client's connections, the namespace source, the metrics
listener), so that the reviews in flight still have what they need.
Services added with L{AmpService.drain_with} (worker 0's monitor of the
other workers) stop when the drain begins.
"""

from __future__ import annotations

import gc
import random
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence, cast

from twisted.application.service import IService, IServiceCollection, MultiService, Service
from twisted.internet.defer import Deferred, DeferredList, maybeDeferred
from twisted.internet.interfaces import IListeningPort, IProtocolFactory, IReactorTime, IStreamServerEndpoint
from twisted.logger import ILogObserver, Logger
from twisted.python.failure import Failure
from twisted.web.resource import Resource
from twisted.web.server import Site

from amp import __version__
from amp.admission import Admitter
from amp.breaker import BreakerRegistry
from amp.canary import Canary
from amp.config import Config, TLSConfig, config_summary
from amp.endpoint import Connector, EndpointClient
from amp.hints import NEAR_MISS_PROBLEM
from amp.http import HTTPServerFactory
from amp.logs import ConfigurableObserver
from amp.metrics import BREAKER_STATE_VALUES, Metrics, MetricsResource
from amp.namespaces import INamespaceSource, NamespaceInfo, StaticNamespaceSource
from amp.reasons import BreakerState, NamespaceSource
from amp.recent import RecentDecisions, RecentDecisionsResource
from amp.record import KeptAnnotations, Recorder
from amp.reload import ConfigFile, ConfigReloadService, InThread, SighupService, in_thread_pool
from amp.tls import CertificateReloadService, ReloadingCertificate
from amp.tracing import Tracing
from amp.web import ReviewHandler, not_found, webhook_routes

if TYPE_CHECKING:
    from amp.audit_loop import AuditService
    from amp.kube._report import LeaseTerm
    from amp.reactors import IAmpReactor

#: The log of what this module reports itself (the services have their own).
_log = Logger()


def adopt(child: IService, parent: IServiceCollection) -> None:
    """
    Make C{child} a child service of C{parent} (C{child.setServiceParent}),
    called through L{IService}, which declares it.
    """
    child.setServiceParent(parent)


class EndpointClientService(Service):
    """
    Owns the L{EndpointClient}; stopping closes its cached connections.
    """

    def __init__(self, client: EndpointClient) -> None:
        self.client = client

    def stopService(self) -> Deferred[None]:
        Service.stopService(self)
        return self.client.close()


class ListenerService(Service):
    """
    Listens on C{endpoint} with C{factory} while running.

    A listen that fails at once (the port is taken, the address is not
    local) raises from C{privilegedStartService}, so that twistd stops
    instead of leaving a process that looks alive and serves nothing.

    @ivar port: the listening port, once listening.
    """

    log = Logger()

    def __init__(self, endpoint: IStreamServerEndpoint, factory: IProtocolFactory) -> None:
        self.endpoint = endpoint
        self.factory = factory
        self.port: Optional[IListeningPort] = None
        self._listening: Optional[Deferred[Any]] = None

    def privilegedStartService(self) -> None:
        Service.privilegedStartService(self)
        outcome: list[Any] = []
        d = self.endpoint.listen(self.factory)
        d.addBoth(outcome.append)
        if outcome:
            self._listened(outcome[0])
            self._listening = d
            return
        # An endpoint that listens later: report a failure when it comes.
        self._listening = d.addCallback(self._listened).addErrback(
            lambda f: self.log.failure("Could not listen on {endpoint!r}", f, endpoint=self.endpoint)
        )

    def _listened(self, result: Any) -> None:
        if isinstance(result, Failure):
            result.raiseException()
        self.port = result

    def startService(self) -> None:
        Service.startService(self)
        if self._listening is None:
            self.privilegedStartService()

    def stopService(self) -> Optional[Deferred[None]]:
        Service.stopService(self)
        self._listening = None
        port, self.port = self.port, None
        if port is not None:
            stopped: Optional[Deferred[None]] = port.stopListening()
            return stopped
        return None


def serving_certificate(
    config: TLSConfig, clock: IReactorTime, metrics: Optional[Metrics] = None, secret: Optional[str] = None
) -> ReloadingCertificate:
    """
    The serving certificate named by C{tls.*}, loaded; with C{secret} (amp's
    own certificates, C{registration.secret}: that Secret's name, shown), in
    memory mode and not loaded yet (L{amp.registration.SecretCertificates}
    gives it the pair).

    @raises amp.tls.CertificateError: naming the file and the problem.
    """
    if secret is not None:
        return ReloadingCertificate(
            f"Secret {secret} tls.crt",
            f"Secret {secret} tls.key",
            clock=clock,
            client_ca=config.client_ca,
            min_version=config.min_version,
            metrics=metrics,
            memory=True,
        )
    certificate = ReloadingCertificate(
        config.cert,
        config.key,
        clock=clock,
        client_ca=config.client_ca,
        min_version=config.min_version,
        metrics=metrics,
    )
    certificate.load()
    return certificate


def namespace_source(
    config: Config,
    reactor: IAmpReactor,
    metrics: Metrics,
    on_first_list: Optional[Callable[[], None]] = None,
    on_webhook: Optional[Callable[[Any], None]] = None,
    terms: Sequence[LeaseTerm] = (),
) -> INamespaceSource:
    """
    The namespace source named by C{kubernetes.source}; C{on_webhook} is
    told each version of amp's own webhook configuration it sees (the
    registration check), C{terms} each term of the Lease (the managed
    registration).
    """
    if config.kubernetes.source == NamespaceSource.STATIC:
        static = StaticNamespaceSource(config.kubernetes)
        metrics.namespace_cache_size.set(static.count)
        for name in config.kubernetes.namespaces:
            info = static.cached(name)
            if isinstance(info, NamespaceInfo) and info.near_misses:
                _log.warn("Namespace {namespace}: {hints}", namespace=name, hints="; ".join(info.near_misses))
                metrics.namespace_problems.labels(NEAR_MISS_PROBLEM).inc()
        return static
    from amp.kube import KubernetesNamespaceSource

    return KubernetesNamespaceSource(
        config.kubernetes,
        reactor=reactor,
        metrics=metrics,
        on_first_list=on_first_list,
        on_webhook=on_webhook,
        terms=terms,
    )


def _amp_annotation(config: Config) -> KeptAnnotations:
    """Annotation keys that are amp's own (recording's redaction keeps their values)."""
    kube = config.kubernetes
    own = {*kube.endpoint_annotations, kube.validation_annotation, kube.failure_policy_annotation, kube.mode_annotation}
    return KeptAnnotations(("amp.txn2.com/",), frozenset(own))


def freeze_startup_objects() -> None:
    """
    Collect, then move every object alive now out of the garbage
    collector's view: objects made at start-up (and by the first namespace
    list) live as long as the process, and scanning them in every full
    collection is what paused reviews for tens of milliseconds, the p99
    latency under load (bench/README.md, "Figures behind the code").  For the daemon; tests leave it off.

    The youngest generation is then collected every L{YOUNG_COLLECTION}
    allocations instead of Python's 700: a new TLS connection and its
    review allocate a few thousand objects, nearly all freed by reference
    counting, and collecting every 700 of them was 5% of amp's instructions
    per review on new connections (bench/README.md); it holds at most that
    many more objects, a few megabytes at worst.
    """
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION, middle, old)


#: Allocations between two collections of the youngest generation (see
#: L{freeze_startup_objects}).
YOUNG_COLLECTION = 10_000


def metrics_site(metrics: Metrics, reactor: IAmpReactor, recent: Optional[RecentDecisions] = None) -> Site:
    """
    The plain-HTTP site serving C{/metrics} and, given C{recent},
    C{/debug/reviews} (L{amp.recent}), without an access log.
    """
    root = Resource()
    root.putChild(b"metrics", MetricsResource(metrics))
    if recent is not None:
        debug = Resource()
        debug.putChild(b"reviews", RecentDecisionsResource(recent))
        root.putChild(b"debug", debug)
    site = Site(root, reactor=reactor)
    site.log = lambda request: None  # type: ignore[method-assign]  # no access log: a line per scrape
    return site


class AmpService(MultiService):
    """
    A running amp, assembled from its parts.  Attributes expose the parts
    for tests and tooling.

    @ivar webhook: the L{ListenerService} of the TLS webhook listener.
    @ivar metrics_listener: the L{ListenerService} of the metrics listener,
        or None when metrics are off.
    """

    log = Logger()

    def __init__(
        self,
        config: Config,
        reactor: IAmpReactor,
        *,
        certificate: ReloadingCertificate,
        webhook_endpoint: IStreamServerEndpoint,
        metrics_endpoint: Optional[IStreamServerEndpoint],
        namespaces: INamespaceSource,
        metrics: Metrics,
        connector: Optional[Connector] = None,
        install_sighup: bool = True,
        log_observer: Optional[ILogObserver] = None,
        freeze_gc: bool = False,
        config_path: Optional[str] = None,
        on_connections: Optional[Callable[[int], None]] = None,
        in_thread: Optional[InThread] = None,
        environ: Optional[Mapping[str, str]] = None,
    ) -> None:
        """
        @param certificate: the loaded serving certificate the webhook
            endpoint serves (L{serving_certificate}); kept current by a
            L{CertificateReloadService} and reported by C{/readyz}.
        @param webhook_endpoint: where the webhook listens, e.g.
            L{amp.tls.tls_endpoint} on C{listen.port}.
        @param metrics_endpoint: where C{/metrics} is served over plain
            HTTP, e.g. C{serverFromString(reactor, "tcp:9090")}; None: no
            metrics listener.
        @param namespaces: the namespace source (L{namespace_source}); a
            child service of this one.
        @param connector: the connect endpoints every endpoint call goes
            through instead of amp's own (L{amp.endpoint.Connector}; tests).
        @param install_sighup: install the one C{SIGHUP} handler
            (L{SighupService}, C{self.sighup}) while running.
        @param freeze_gc: once the reactor runs, move the objects alive
            then out of the garbage collector's view (L{freeze_startup_objects}).
        @param config_path: the file C{config} was loaded from: watched, and
            reloaded when it changes or on C{SIGHUP} (L{apply}); None: no
            reload.
        @param log_observer: the observer twistd writes with; a
            L{ConfigurableObserver} follows C{log.*} on a reload.
        @param on_connections: called with the webhook listener's open
            connection count whenever it changes (with workers,
            L{amp.balance.WorkerListener.connections_changed}).
        @param in_thread: where the config file is read and parsed on a
            reload (L{amp.reload.ConfigFile}); None: C{reactor}'s thread pool.
        @param environ: the environment whose C{OTEL_*} variables tracing
            reads (L{amp.tracing}); None: the process's.
        """
        MultiService.__init__(self)
        self._drain_with: list[IService] = []
        #: Set when the drain begins: C{/readyz} fails from then on.
        self.draining = False
        self.freeze_gc = freeze_gc
        self.log_observer = log_observer
        self.config = config
        self.reactor = reactor
        self.metrics = metrics
        self.certificate = certificate
        self.namespaces = namespaces
        adopt(cast(IService, self.namespaces), self)  # every namespace source is a service

        def breaker_changed(origin: str, state: BreakerState) -> None:
            metrics.breaker_state.labels(origin).set(BREAKER_STATE_VALUES[state])
            # Opening is the news; half-open and closed follow on their own.
            emit = self.log.warn if state == "open" else self.log.info
            emit("Circuit breaker for {endpoint} is now {state}", endpoint=origin, state=state)

        self.breakers = BreakerRegistry(reactor, breaker_changed, random=random.random)
        self.endpoint_client = EndpointClient(reactor, metrics, self.breakers, connector=connector)
        adopt(EndpointClientService(self.endpoint_client), self)
        #: The one SIGHUP handler: it asks the certificate, the config and
        #: (with workers) the workers to reload, in that order.
        self.sighup = SighupService(reactor)
        if install_sighup:
            adopt(self.sighup, self)
        certificate_reload = CertificateReloadService(certificate, reactor=reactor, interval=config.tls.reload_interval)
        adopt(certificate_reload, self)
        self.sighup.add(certificate_reload.what, certificate_reload.reload_now)
        #: Records chosen reviews when C{record.enabled} (L{amp.record}).
        self.recorder = Recorder(config.record, reactor, metrics, keep_annotation=_amp_annotation(config))
        adopt(self.recorder, self)
        #: The last decisions, served on the metrics port (C{metrics.debug_reviews}).
        self.recent = RecentDecisions(config.metrics.debug_reviews)
        # Candidates have an endpoint client of their own: their own pools,
        # bulkheads and breakers, and metrics apart from the live endpoints'.
        self.canary_client = EndpointClient(
            reactor, Metrics(), BreakerRegistry(reactor, random=random.random), connector=connector
        )
        adopt(EndpointClientService(self.canary_client), self)
        self.canary = Canary(
            self.canary_client,
            reactor,
            metrics,
            annotate=lambda uid, result, paths: self.recent.annotate(uid, result, paths),
        )
        self.admitter = self._admitter(config, self.namespaces)
        routes = webhook_routes(
            self.admitter,
            reactor,
            metrics,
            {
                "listener": self._listener_readiness,
                "certificate": certificate.readiness,
                "namespaces": lambda: self.namespaces.readiness(),
            },
            recent=self.recent,
        )
        self._admission = [h for h in routes.values() if isinstance(h, ReviewHandler)]
        #: OpenTelemetry tracing of reviews (C{tracing}; off by default).
        self.tracing = Tracing(
            config.tracing,
            reactor,
            lambda count, reason: metrics.trace_spans_dropped.labels(reason=reason).inc(count),
            environ=environ,
        )
        adopt(self.tracing, self)
        for handler in self._admission:
            handler.tracing = self.tracing
        listen = config.listen
        #: The webhook listener's factory: its connections, limits and drain.
        self.webhook_server = HTTPServerFactory(
            routes,
            reactor=reactor,
            metrics=metrics,
            max_body=listen.max_body,
            max_connections=listen.max_connections,
            request_timeout=listen.request_timeout,
            idle_timeout=listen.idle_timeout,
            not_found=not_found,
            on_connections=on_connections,
        )
        self.webhook = ListenerService(webhook_endpoint, self.webhook_server)
        adopt(self.webhook, self)
        self.metrics_listener: Optional[ListenerService] = None
        if metrics_endpoint is not None:
            self.metrics_listener = ListenerService(metrics_endpoint, metrics_site(metrics, reactor, self.recent))
            adopt(self.metrics_listener, self)
        #: Told each config put in force by L{apply} (the registration check).
        self.on_apply: list[Callable[[Config], object]] = []
        #: The continuous audit (C{audit.continuous}), or None.
        self.audit: Optional[AuditService] = None
        if config.audit.continuous and config.kubernetes.source != NamespaceSource.STATIC:
            from amp.audit_loop import AuditService

            self.audit = AuditService(config, reactor, metrics, self.namespaces)
            adopt(self.audit, self)
            self.on_apply.append(self.audit.apply)
        self.config_file: Optional[ConfigFile] = None
        self.config_reload: Optional[ConfigReloadService] = None
        if config_path is not None:
            self.config_file = ConfigFile(
                config_path,
                config,
                self.apply,
                metrics,
                in_thread=in_thread if in_thread is not None else in_thread_pool(reactor),
            )
            self.config_reload = ConfigReloadService(self.config_file, reactor=reactor, interval=config.reload_interval)
            adopt(self.config_reload, self)
            self.sighup.add(self.config_reload.what, self.config_reload.reload_now)

    def apply(self, config: Config) -> None:
        """
        Put C{config} in force, between reviews: every review from now on
        runs under it, and a review in flight finishes under the config it
        started with (it holds the L{Admitter} it started with).  What
        changes is swapped as whole objects: the admitter (routes, policy,
        endpoints and their overrides, allow and deny lists, timeouts, the
        breaker and pool settings the routes carry, patch rules), the static
        namespace source, the listener's limits, how many recent decisions
        are kept (C{metrics.debug_reviews}), the log format and level.
        C{config}'s restart-only keys must be the running ones
        (L{amp.config.for_reload}).
        """
        namespaces = self.namespaces
        if config.kubernetes != self.config.kubernetes and config.kubernetes.source == NamespaceSource.STATIC:
            namespaces = namespace_source(config, self.reactor, self.metrics)
        admitter = self._admitter(config, namespaces)
        # Everything is built: swap.
        if namespaces is not self.namespaces:
            old, self.namespaces = self.namespaces, namespaces
            adopt(cast(IService, namespaces), self)  # every namespace source is a service
            cast(IService, old).disownServiceParent()
        self.admitter = admitter
        for handler in self._admission:
            handler.admitter = admitter
        self.webhook_server.apply(config.listen)
        self.recent.resize(config.metrics.debug_reviews)
        self.recorder.apply(config.record)
        self.tracing.apply(config.tracing)
        # As an object: mypy-zope cannot narrow an interface to a class that implements it.
        observer: object = self.log_observer
        if isinstance(observer, ConfigurableObserver):
            observer.configure(config.log.format, config.log.level)
        if self.config_reload is not None:
            self.config_reload.set_interval(config.reload_interval)
        self.config = config
        for applied in self.on_apply:
            applied(config)

    def _admitter(self, config: Config, namespaces: INamespaceSource) -> Admitter:
        return Admitter(
            config, namespaces, self.endpoint_client, self.reactor, self.metrics, self.recorder, self.canary
        )

    def _listener_readiness(self) -> tuple[bool, str]:
        if self.draining:
            return False, "shutting down: answering the reviews in flight"
        return True, "accepting connections"

    def drain_with(self, service: IService) -> None:
        """
        Add C{service} as a child that stops when the drain begins, beside
        the listener's drain, rather than after it (worker 0's monitor: its
        workers drain themselves at the same time).
        """
        adopt(service, self)
        self._drain_with.append(service)

    def stopService(self) -> Deferred[None]:
        """
        The graceful drain (see the module docstring), then every other
        part.  Fires when all have stopped.
        """
        Service.stopService(self)
        self.draining = True
        timeout = self.config.listen.drain_timeout
        started = self.reactor.seconds()
        self.log.info(
            "Shutting down: not ready, not accepting connections; answering the reviews in flight on "
            "{count} open connections within {timeout:g}s (listen.drain_timeout)",
            count=self.webhook_server.open_connections,
            timeout=timeout,
        )
        drained: Deferred[int] = maybeDeferred(self.webhook.stopService).addCallback(
            lambda _: self.webhook_server.drain(timeout)
        )

        def report(aborted: int) -> None:
            if not aborted:
                self.log.info("Drained in {seconds:.3f}s", seconds=self.reactor.seconds() - started)

        drained.addCallback(report)
        first = [drained] + [maybeDeferred(s.stopService) for s in reversed(self._drain_with)]
        done = DeferredList(first, consumeErrors=True)
        done.addCallback(self._log_stop_errors)

        def stop_the_rest(_: object) -> Deferred[None]:
            rest = [s for s in reversed(list(self)) if s is not self.webhook and s not in self._drain_with]
            return DeferredList([maybeDeferred(s.stopService) for s in rest], consumeErrors=True).addCallback(
                self._log_stop_errors
            )

        done.addCallback(stop_the_rest)
        return done.addCallback(lambda _: None)

    def _log_stop_errors(self, results: list[tuple[bool, Any]]) -> None:
        for ok, result in results:
            if not ok:
                self.log.failure("A part of amp failed to stop", result)

    def startService(self) -> None:
        self.log.info("amp {version} starting: {summary}", version=__version__, summary=config_summary(self.config))
        MultiService.startService(self)
        try:
            ready = self.namespaces.readiness()[0]
        except Exception:
            # /readyz reports a source whose check fails; start-up goes on.
            ready = False
        if ready:
            # A source that has its namespaces already (the static one);
            # the cluster source's first list calls this (amp.tap).
            self.admitter.own_pods_warning()
        if self.freeze_gc:
            self.reactor.callWhenRunning(freeze_startup_objects)

    def setServiceParent(self, parent: Any) -> None:
        """
        Under twistd the parent is the application: offer it our log
        observer (twistd uses it unless C{--logger} names another), so
        C{log.format} and C{log.level} apply to every line twistd writes.
        """
        if self.log_observer is not None and hasattr(parent, "setComponent"):
            if parent.getComponent(ILogObserver, None) is None:
                parent.setComponent(ILogObserver, self.log_observer)
        MultiService.setServiceParent(self, parent)
