"""
What start-up checks before the reactor runs, each problem as one line that
starts with the config key to fix.

C{twistd amp} calls these from L{amp.tap.makeService}: a taken port, an
unreadable certificate or a kubeconfig that cannot be loaded stops amp with
C{amp: config FILE: KEY: problem} and exit status 1, instead of a traceback
(a port) or a process that runs but is never ready (a kubeconfig).  They
block (a probe bind, small file reads), so they run only before the reactor
does.
"""

from __future__ import annotations

from typing import Callable, Optional

from amp.config import Config, KubernetesConfig
from amp.ports import listen_problem

__all__ = ["port_problem", "certificate_key", "kubernetes_problem"]


def port_problem(config: Config, worker: int = 0) -> Optional[str]:
    """
    The first of amp's listening ports that cannot be listened on, as
    C{listen.port: port 8443 (webhook) is in use by pid 12 (...)}, or None.

    Worker 0 checks the webhook port and every worker's metrics port
    (C{metrics.port} + i); a worker above 0 inherits the webhook socket
    and checks only its own metrics port.
    """
    listen, metrics = config.listen, config.metrics
    if worker == 0:
        problem = listen_problem(listen.interface, listen.port, "webhook")
        if problem is not None:
            return f"listen.port: {problem}"
    if metrics.port:
        workers = range(config.workers) if worker == 0 else (worker,)
        for i in workers:
            what = "metrics" if config.workers == 1 else f"metrics of worker {i}"
            problem = listen_problem(metrics.interface, metrics.port + i, what)
            if problem is not None:
                return f"metrics.port: {problem}"
    return None


#: How L{amp.tls.CertificateError}'s message starts -> the key naming that file.
_CERTIFICATE_KEYS = (("certificate file", "tls.cert"), ("key file", "tls.key"), ("client CA file", "tls.client_ca"))


def certificate_key(message: str) -> str:
    """
    The config key of the file an L{amp.tls.CertificateError} message is
    about (its messages start with the kind of file).
    """
    for prefix, key in _CERTIFICATE_KEYS:
        if message.startswith(prefix):
            return key
    return "tls"


def kubernetes_problem(
    config: KubernetesConfig, load: Optional[Callable[[KubernetesConfig], object]] = None
) -> Optional[str]:
    """
    Why the Kubernetes client configuration named by C{kubernetes.*}
    cannot be loaded (C{kubernetes.kubeconfig: cannot load ...}), or None
    (also for C{source: static}, which needs none).

    @param load: loads the client configuration or raises; by default
        L{amp.kube.load_client_configuration}, what the namespace source
        itself loads when it starts.
    """
    if config.source == "static":
        return None
    if load is None:
        from amp.kube import load_client_configuration

        load = load_client_configuration
    try:
        load(config)
    except Exception as e:
        detail = " ".join(f"{type(e).__name__}: {e}".split())
        if config.source == "cluster":
            return (
                f"kubernetes.source: cluster, but the in-cluster service account cannot be loaded ({detail}); "
                f"outside a cluster use source: kubeconfig or static"
            )
        context = f" (context {config.context})" if config.context else ""
        key = "kubernetes.context" if config.context and "context" in detail.lower() else "kubernetes.kubeconfig"
        return f"{key}: cannot load {config.kubeconfig}{context}: {detail}"
    return None
