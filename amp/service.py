"""
Wiring: builds the C{MultiService} that is a running amp.

One service per concern: the namespace source, the serving certificate's
reload loop, the endpoint client (whose stop closes pooled connections), the
TLS webhook listener and the plain-HTTP metrics listener.
"""

from __future__ import annotations

import gc
import random
from typing import Any, Callable, Optional

from twisted.application.internet import StreamServerEndpointService
from twisted.application.service import MultiService, Service
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import TCP4ServerEndpoint, TCP6ServerEndpoint
from twisted.logger import ILogObserver, Logger
from twisted.web.iweb import IAgent
from twisted.web.resource import Resource
from twisted.web.server import Site

from amp.admission import Admitter
from amp.breaker import BreakerRegistry
from amp.config import Config
from amp.endpoint import EndpointClient
from amp.metrics import BREAKER_STATE_VALUES, Metrics, MetricsResource
from amp.namespaces import INamespaceSource, StaticNamespaceSource
from amp.tls import CertificateReloadService, ReloadingCertificate, tls_endpoint
from amp.urls import parse_endpoint_url
from amp.web import WebhookSite, webhook_root


class EndpointClientService(Service):
    """
    Owns the L{EndpointClient}; stopping closes its cached connections.
    """

    def __init__(self, client: EndpointClient) -> None:
        self.client = client

    def stopService(self) -> Optional[Deferred]:
        super().stopService()
        return self.client.close()


def _tcp(reactor: Any, port: int, interface: str) -> Any:
    cls = TCP6ServerEndpoint if ":" in interface else TCP4ServerEndpoint
    return cls(reactor, port, interface=interface)


def namespace_source(
    config: Config, reactor: Any, metrics: Metrics, on_first_list: Optional[Callable[[], None]] = None
) -> INamespaceSource:
    """
    The namespace source named by C{kubernetes.source}.
    """
    if config.kubernetes.source == "static":
        static = StaticNamespaceSource(config.kubernetes)
        metrics.namespace_cache_size.set(static.count)
        return static
    from amp.kube import KubernetesNamespaceSource

    return KubernetesNamespaceSource(config.kubernetes, reactor=reactor, metrics=metrics,
                                     on_first_list=on_first_list)


class AmpService(MultiService):
    """
    A running amp.  Attributes expose the parts for tests and tooling.
    """

    log = Logger()

    def __init__(
        self,
        config: Config,
        reactor: Any,
        *,
        certificate: ReloadingCertificate,
        metrics: Optional[Metrics] = None,
        namespaces: Optional[INamespaceSource] = None,
        agent: Optional[IAgent] = None,
        install_sighup: bool = True,
        log_observer: Optional[ILogObserver] = None,
        freeze_gc: bool = False,
        worker: int = 0,
    ) -> None:
        """
        @param worker: which of C{config.workers} processes this is (0 for
            the first).  With more than one worker every process listens on
            the webhook port with C{SO_REUSEPORT}, and worker C{i} serves
            metrics on C{metrics.port + i}; see L{amp.workers}.
        @param freeze_gc: move the objects alive once amp has started (and
            again once the first namespace list has landed) out of the
            garbage collector's view: they live as long as the process, and
            scanning them in every full collection is what made p99 latency
            (20-35 ms pauses at ~1000 reviews/s).  For the daemon; tests
            leave it off.
        """
        super().__init__()
        self.freeze_gc = freeze_gc
        self.log_observer = log_observer
        self.config = config
        self.reactor = reactor
        self.metrics = metrics = metrics if metrics is not None else Metrics()
        self.certificate = certificate
        self.namespaces = namespaces if namespaces is not None else namespace_source(
            config, reactor, metrics, on_first_list=self._freeze if freeze_gc else None)
        self.namespaces.setServiceParent(self)  # type: ignore[attr-defined]

        def breaker_changed(origin: str, state: str) -> None:
            metrics.breaker_state.labels(origin).set(BREAKER_STATE_VALUES[state])
            # Opening is the news; half-open and closed follow on their own.
            emit = self.log.warn if state == "open" else self.log.info
            emit("Circuit breaker for {endpoint} is now {state}", endpoint=origin, state=state)

        self.breakers = BreakerRegistry(reactor, breaker_changed, random=random.random)
        endpoints = config.endpoints

        def settings_for_origin(origin: str) -> Any:
            return endpoints.settings_for(parse_endpoint_url(origin + "/"))

        self.endpoint_client = EndpointClient(reactor, metrics, self.breakers, settings_for_origin, agent=agent)
        EndpointClientService(self.endpoint_client).setServiceParent(self)
        CertificateReloadService(
            certificate, reactor=reactor, interval=config.tls.reload_interval, install_sighup=install_sighup
        ).setServiceParent(self)
        self.admitter = Admitter(config, self.namespaces, self.endpoint_client, reactor, metrics)
        root = webhook_root(self.admitter, reactor, metrics, {
            "certificate": certificate.readiness,
            "namespaces": self.namespaces.readiness,
        })
        listen = config.listen
        self.site = WebhookSite(
            root, reactor=reactor, metrics=metrics, max_body=listen.max_body,
            max_connections=listen.max_connections, request_timeout=listen.request_timeout,
            idle_timeout=listen.idle_timeout)
        self.worker = worker
        self.webhook = StreamServerEndpointService(
            tls_endpoint(reactor, listen.port, listen.interface, certificate, reuse_port=config.workers > 1),
            self.site)
        # A port that cannot be bound must stop start-up, not leave a
        # process that looks alive and serves nothing.
        self.webhook._raiseSynchronously = True
        self.webhook.setServiceParent(self)
        self.metrics_listener: Optional[StreamServerEndpointService] = None
        if config.metrics.port:
            metrics_root = Resource()
            metrics_root.putChild(b"metrics", MetricsResource(metrics))
            metrics_site = Site(metrics_root, reactor=reactor)
            metrics_site.log = lambda request: None  # type: ignore[method-assign]
            self.metrics_listener = StreamServerEndpointService(
                _tcp(reactor, config.metrics.port + worker, config.metrics.interface), metrics_site)
            self.metrics_listener._raiseSynchronously = True
            self.metrics_listener.setServiceParent(self)


    def startService(self) -> None:
        super().startService()
        if self.freeze_gc:
            self.reactor.callWhenRunning(self._freeze)

    def _freeze(self) -> None:
        gc.collect()
        gc.freeze()

    def setServiceParent(self, parent: Any) -> None:
        """
        Under twistd the parent is the application: offer it our log
        observer (twistd uses it unless C{--logger} names another), so
        C{log.format} and C{log.level} apply to every line twistd writes.
        """
        if self.log_observer is not None and hasattr(parent, "setComponent"):
            if parent.getComponent(ILogObserver, None) is None:
                parent.setComponent(ILogObserver, self.log_observer)
        super().setServiceParent(parent)


def make_amp_service(config: Config, reactor: Any, **kwargs: Any) -> AmpService:
    """
    Load the serving certificate (raising L{amp.tls.CertificateError} with
    a clear message if it cannot be used) and build the service.
    """
    metrics = kwargs.setdefault("metrics", Metrics())
    certificate = ReloadingCertificate(
        config.tls.cert, config.tls.key, clock=reactor, client_ca=config.tls.client_ca,
        min_version=config.tls.min_version, metrics=metrics)
    certificate.load()
    return AmpService(config, reactor, certificate=certificate, **kwargs)
