"""
twistd glue: C{twistd amp --config etc/amp.yaml}.

Options are checked before the reactor starts: a broken config, an
unusable certificate, a taken port (and the process holding it) or a
kubeconfig that cannot be loaded stops start-up with one line that names
the key and the problem (no traceback, no usage text) and exit status 1
(L{amp.startup}).
"""

from __future__ import annotations

import dataclasses
import os
import socket
import sys
from typing import TYPE_CHECKING, Any, Optional, cast

from twisted.python import usage

from amp.config import Config, ConfigError, load_config
from amp.logs import ConfigurableObserver
from amp.reasons import NamespaceSource

if TYPE_CHECKING:
    from amp.reactors import IAmpReactor
    from amp.service import AmpService


class Options(usage.Options):
    synopsis = "[--config FILE]"
    longdesc = "Run amp, the admission mutation proxy for Kubernetes."
    optParameters = [
        ["config", "c", "etc/amp.yaml", "Path to amp's YAML configuration."],
        ["worker", None, 0, "Which worker this process is (0 to workers-1); set by worker 0 for its children.", int],
        [
            "listen-fd",
            None,
            None,
            "Workers above 0: the descriptor of the webhook socket worker 0 shares; set by worker 0.",
            int,
        ],
        [
            "load-table-fd",
            None,
            None,
            "Workers above 0: the descriptor of the workers' load table; set by worker 0.",
            int,
        ],
    ]
    optFlags = [
        [
            "check",
            None,
            "Check the configuration and certificate, print the effective configuration "
            "(defaults filled in, as YAML), then exit.",
        ],
    ]

    config: Config

    def opt_version(self) -> None:
        """
        Print amp's version (and Twisted's) and exit.
        """
        import twisted
        from amp import __version__

        print(f"amp {__version__} (Twisted {twisted.__version__})")
        raise SystemExit(0)

    def postOptions(self) -> None:
        """
        Load and check the configuration.  A wrong configuration stops
        twistd with one line on standard error that names the file, the key
        and the problem, and exit status 1: not twistd's usage text, which
        says nothing about it.
        """
        path = self["config"]
        try:
            self.config = load_config(path)
        except ConfigError as e:
            raise SystemExit(f"amp: config {path}: {e}") from None
        workers = self.config.workers
        if workers > 1 and self.config.listen.port == 0:
            raise SystemExit(
                f"amp: config {path}: listen.port: workers share the webhook port, so it cannot be 0 "
                f"(workers: {workers})"
            )
        metrics_port = self.config.metrics.port
        if metrics_port and metrics_port + workers - 1 > 65535:
            raise SystemExit(
                f"amp: config {path}: metrics.port: {metrics_port} + one port per worker ({workers}) goes past 65535"
            )
        if not 0 <= self["worker"] < workers:
            raise usage.UsageError(f"--worker: expected 0 to {workers - 1} (workers: {workers}), got {self['worker']}")
        inherited = self["listen-fd"] is not None, self["load-table-fd"] is not None
        if self["worker"] > 0 and not all(inherited):
            raise usage.UsageError(
                f"--worker {self['worker']}: needs --listen-fd and --load-table-fd (worker 0 starts the other "
                f"workers with the webhook socket and load table they share)"
            )
        if self["worker"] == 0 and any(inherited):
            raise usage.UsageError("--listen-fd and --load-table-fd: only for workers above 0")


#: Where a Pod's service account mount says which namespace it runs in.
SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def with_own_namespace(config: Config, path: str = SERVICE_ACCOUNT_NAMESPACE) -> Config:
    """
    C{config} with C{kubernetes.own_namespace} set: as configured, else the
    namespace amp's Pod runs in (its service account mount), else unset.
    """
    if config.kubernetes.own_namespace:
        return config
    try:
        with open(path) as f:
            own = f.read().strip()
    except OSError:
        return config
    if not own:
        return config
    return dataclasses.replace(config, kubernetes=dataclasses.replace(config.kubernetes, own_namespace=own))


def print_effective_config(config: Config, out: Any = None) -> None:
    """
    Write C{config} as YAML (L{amp.config.effective_config}), after a
    comment line with amp's version and the configuration's hash.
    """
    import yaml

    from amp import __version__
    from amp.config import config_digest, effective_config

    out = out if out is not None else sys.stdout
    try:
        out.write(f"# amp {__version__}: effective configuration {config_digest(config)}\n")
        out.write(yaml.safe_dump(effective_config(config), sort_keys=False, default_flow_style=False))
        out.flush()
    except BrokenPipeError:
        # The reader stopped reading (`--check | head -1`): what it read is
        # all it wanted.  Standard output goes to /dev/null, so that the
        # interpreter's own flush at exit does not fail on the pipe again.
        if out is sys.stdout:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def makeService(options: Options, reactor: Optional[IAmpReactor] = None) -> AmpService:
    """
    Build amp's service from parsed options: the one place that reaches for
    the global reactor (when none is given) and builds the real listening
    endpoints, the serving certificate and the namespace source.

    With C{workers} above one, worker 0 (the default C{--worker}) binds
    the webhook socket all workers share (L{amp.balance}), and starts and
    supervises the other workers (L{amp.workers}), which take the socket
    over from the descriptors they are given and stop when worker 0 exits.
    """
    if reactor is None:
        from twisted.internet import reactor as global_reactor

        # Twisted types the global one as the parts every reactor has; amp's run on epoll/poll/select have all.
        reactor = cast("IAmpReactor", global_reactor)
    from twisted.internet.endpoints import serverFromString

    from amp.balance import WorkerListener
    from amp.metrics import Metrics
    from amp.service import AmpService, adopt, freeze_startup_objects, namespace_source, serving_certificate
    from amp.startup import certificate_key, kubernetes_problem, port_problem
    from amp.tls import CertificateError, tcp_description, tls_endpoint
    from amp.workers import ParentWatch, supervise

    config = with_own_namespace(options.config)
    worker = options["worker"]
    stop = f"amp: config {options['config']}: "
    # --check checks a configuration (and its certificate), not whether this
    # host could run it now: a config for a cluster is checked on a laptop.
    problem = None if options["check"] else kubernetes_problem(config.kubernetes) or port_problem(config, worker)
    if problem is not None:
        raise SystemExit(stop + problem)
    observer = ConfigurableObserver(config.log.format, config.log.level, sys.stdout)
    metrics = Metrics()
    try:
        own_secret = config.registration.secret if config.registration.managed else None
        certificate = serving_certificate(config.tls, reactor, metrics, secret=own_secret)
    except CertificateError as e:
        raise SystemExit(f"{stop}{certificate_key(str(e))}: {e}") from None
    listen = config.listen
    # With workers, one listening socket shared by all, each accepting while
    # it has the fewest connections (amp.balance); worker 0 binds it.
    shared: Optional[WorkerListener] = None
    if config.workers > 1 and worker == 0:
        shared = WorkerListener.bind(reactor, listen.interface, listen.port, config.workers)
    elif worker > 0:
        try:
            shared = WorkerListener.inherit(reactor, worker, options["listen-fd"], options["load-table-fd"])
        except ValueError as e:
            raise SystemExit(f"amp: worker {worker}: {e}") from None
    # Worker i serves its own metrics on metrics.port + i (amp.workers).
    metrics_endpoint = None
    if config.metrics.port:
        metrics_endpoint = serverFromString(
            reactor, tcp_description(config.metrics.port + worker, config.metrics.interface)
        )

    def first_list() -> None:
        freeze_startup_objects()
        service.admitter.own_pods_warning()

    # amp's registration checked at start and at every change of it (or of
    # the serving certificate), when amp watches it.
    registration = None
    if config.kubernetes.source != NamespaceSource.STATIC and config.kubernetes.webhook_configuration:
        from amp.registration import RegistrationReport, needs

        registration = RegistrationReport(needs(config), metrics, reactor, chain=lambda: certificate.chain)
        certificate.on_install.append(registration.certificate_changed)
    # With registration.managed, the Lease holder also applies it (and
    # repairs it when the watch sees it drift).
    keeper = None
    own_certificates = None
    if registration is not None and config.registration.managed:
        from amp.kube._client import service_account_namespace
        from amp.registration import RegistrationKeeper

        own = config.kubernetes.own_namespace or service_account_namespace()
        # With registration.secret, amp's own CA and serving certificate:
        # every replica serves the Secret's pair; the Lease holder rotates it.
        if own_secret is not None and not own:
            raise SystemExit(
                f"{stop}registration.secret: amp's own namespace (the Secret's) is unknown: set "
                "kubernetes.own_namespace"
            )
        if own_secret is not None and own:
            from amp.kube._client import KubeClient
            from amp.registration import SecretCertificates

            own_certificates = SecretCertificates(
                config,
                reactor=reactor,
                clock=reactor,
                certificate=certificate,
                client=KubeClient.from_config(config.kubernetes),
                namespace=own,
                identity=f"{socket.gethostname()}-{os.getpid()}",
                metrics=metrics,
            )
        keeper = RegistrationKeeper(
            config,
            reactor=reactor,
            clock=reactor,
            metrics=metrics,
            own_namespace=own,
            bundle=(lambda: own_certificates.bundle) if own_certificates is not None else None,
        )
        certificate.on_install.append(keeper.refresh)
        if own_certificates is not None:
            own_certificates.on_bundle.append(keeper.refresh)
    told = [
        f
        for f in (
            registration.seen if registration is not None else None,
            keeper.seen if keeper is not None else None,
            own_certificates.seen if own_certificates is not None else None,
        )
        if f is not None
    ]

    def on_webhook(obj: Any) -> None:
        for tell in told:
            tell(obj)

    service = AmpService(
        config,
        reactor,
        certificate=certificate,
        webhook_endpoint=tls_endpoint(reactor, listen.port, listen.interface, certificate, inner=shared),
        metrics_endpoint=metrics_endpoint,
        namespaces=namespace_source(
            config,
            reactor,
            metrics,
            on_first_list=first_list,
            on_webhook=on_webhook if told else None,
            terms=tuple(t for t in (keeper, own_certificates) if t is not None),
        ),
        metrics=metrics,
        log_observer=observer,
        freeze_gc=True,
        config_path=options["config"],
        on_connections=shared.connections_changed if shared is not None else None,
    )
    if registration is not None:
        service.on_apply.append(registration.config_changed)
    if keeper is not None:
        service.on_apply.append(keeper.config_changed)
    if own_certificates is not None:
        adopt(own_certificates, service)
    if options["check"]:
        print_effective_config(config)
        raise SystemExit(0)
    if worker == 0 and shared is not None:
        monitor = supervise(
            options["config"],
            config.workers,
            reactor,
            listen.drain_timeout,
            shared=shared.descriptors,
            on_exit=shared.worker_exited,
        )
        service.drain_with(monitor)
        service.sighup.add("the workers", monitor.signal_workers)
    elif worker > 0:
        adopt(ParentWatch(reactor), service)
    return service
