"""A real, minimal Kubernetes control plane for the end-to-end tests.

This module owns running etcd and kube-apiserver as child processes on
loopback, the certificates they need, the admin and service-account
kubeconfigs, the API server's ``/metrics``, and stopping both processes
again. On its own there is no scheduler, no controller-manager and no
kubelet: Pods are admitted (through every admission plugin, mutating
webhooks included) and stored, and then stay Pending; ``controllers`` adds
them for the tests that need workloads. Because the ServiceAccount
controller never runs, a namespace's ``default`` ServiceAccount is not
created for it; ``create_namespace`` does that, as the controller would, so
that Pods can be created in it.

Usage::

    plane = ControlPlane(workdir)
    plane.start()
    try:
        api = plane.admin_client()          # kubernetes.client.ApiClient
        ...
    finally:
        plane.stop()

Everything the processes write lives in ``workdir``: ``pki/`` (keys and
certificates), ``etcd-data/``, ``etcd.log``, ``kube-apiserver.log`` and
``admin.kubeconfig``.
"""

from __future__ import annotations

import atexit
import base64
import http.client
import ipaddress
import json
import os
import signal
import socket
import ssl
import subprocess
from pathlib import Path
from typing import Any

import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from amp_dev.devcert import issue_cert, make_ca, pem_cert, pem_key

from ..support.waiting import WaitTimeout, poll_until
from .build import Binaries, build

LOOPBACK = "127.0.0.1"
SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
_LOG_TAIL_LINES = 40


class ControlPlaneError(RuntimeError):
    """The control plane could not be started; the message holds the log tails."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return sock.getsockname()[1]


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


class _Authority:
    """A certificate authority that issues leaf certificates (amp_dev.devcert's)."""

    def __init__(self, common_name: str) -> None:
        self.cert, self.key = make_ca(common_name, days=2)

    def issue(
        self,
        common_name: str,
        *,
        organizations: tuple[str, ...] = (),
        hosts: tuple[str, ...] = (),
        server: bool = False,
        client: bool = False,
    ) -> tuple[bytes, bytes]:
        """A leaf certificate and its key, both PEM."""
        cert, key = issue_cert(
            self.cert, self.key, common_name, hosts, client=client, server=server, organizations=organizations, days=2
        )
        return pem_cert(cert), pem_key(key)


def spawn_logged(
    args: list[str], cwd: Path, log_path: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start ``args`` in its own session with stdout and stderr appended to ``log_path``."""
    log = open(log_path, "ab")
    try:
        return subprocess.Popen(
            args,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    finally:
        log.close()


def _write(path: Path, data: bytes, mode: int = 0o600) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    return path


def _tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


def kubeconfig(server: str, ca_pem: bytes, user: dict[str, str], name: str) -> dict[str, Any]:
    """A kubeconfig document (as a dict) for one cluster, one user, one context."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "amp-e2e",
                "cluster": {
                    "server": server,
                    "certificate-authority-data": base64.b64encode(ca_pem).decode(),
                },
            }
        ],
        "users": [{"name": name, "user": user}],
        "contexts": [{"name": name, "context": {"cluster": "amp-e2e", "user": name}}],
        "current-context": name,
    }


class ControlPlane:
    """etcd plus kube-apiserver on loopback, with an admin identity.

    Attributes valid after ``start()``:

    - ``api_url``: ``https://127.0.0.1:<port>`` of kube-apiserver
    - ``kubeconfig_path``: admin kubeconfig (user ``admin``, group ``system:masters``)
    - ``ca_pem`` / ``ca_path``: the CA that signed the API server's serving
      certificate (and any ``issue_serving_certificate`` result)
    - ``etcd_url``: plain-HTTP loopback URL of etcd
    - ``workdir``: where certificates, data and logs live
    - ``binaries``: the ``build.Binaries`` used
    - ``pids``: ``{"etcd": pid, "kube-apiserver": pid}`` while running

    Ports are chosen by binding port 0 on 127.0.0.1 and releasing it just
    before the child binds it.
    """

    def __init__(
        self,
        workdir: Path | str,
        binaries: Binaries | None = None,
        *,
        start_timeout: float = 90.0,
        apiserver_args: tuple[str, ...] = (),
        tracing_endpoint: str | None = None,
    ) -> None:
        self.workdir = Path(workdir).resolve()
        self.apiserver_args = tuple(apiserver_args)
        #: ``host:port`` of an OTLP gRPC receiver the API server exports its
        #: spans to (``--tracing-config-file``), or None: no tracing.
        self.tracing_endpoint = tracing_endpoint
        self.binaries = binaries
        self.start_timeout = start_timeout
        self.pki = self.workdir / "pki"
        self.etcd_log = self.workdir / "etcd.log"
        self.apiserver_log = self.workdir / "kube-apiserver.log"
        self.kubeconfig_path = self.workdir / "admin.kubeconfig"
        self.ca_path = self.pki / "ca.crt"
        self.ca_pem = b""
        self.api_url = ""
        self.etcd_url = ""
        self._ca: _Authority | None = None
        self._client_ca: _Authority | None = None
        self._admin_cert = self.pki / "admin.crt"
        self._admin_key = self.pki / "admin.key"
        self._etcd: subprocess.Popen[bytes] | None = None
        self._apiserver: subprocess.Popen[bytes] | None = None
        self._admin_client: Any = None

    # -- lifecycle ---------------------------------------------------------

    def start(self) -> None:
        """Start etcd and kube-apiserver and wait until the API server is ready."""
        if self.binaries is None:
            self.binaries = build()
        self.workdir.mkdir(parents=True, exist_ok=True)
        atexit.register(self.stop)
        try:
            self._write_pki()
            self._start_etcd()
            self._start_apiserver()
            self._write_admin_kubeconfig()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop kube-apiserver, then etcd; kill each whole process group."""
        if self._admin_client is not None:
            self._admin_client.close()
            self._admin_client = None
        for attr in ("_apiserver", "_etcd"):
            proc = getattr(self, attr)
            if proc is not None:
                _stop_process_group(proc)
                setattr(self, attr, None)
        atexit.unregister(self.stop)

    @property
    def pids(self) -> dict[str, int]:
        """Process ids of the running children (empty once stopped)."""
        return {
            name: proc.pid
            for name, proc in (("etcd", self._etcd), ("kube-apiserver", self._apiserver))
            if proc is not None
        }

    def __enter__(self) -> "ControlPlane":
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- certificates ------------------------------------------------------

    def _write_pki(self) -> None:
        self._ca = _Authority("amp-e2e-ca")
        self._client_ca = _Authority("amp-e2e-client-ca")
        self.ca_pem = pem_cert(self._ca.cert)
        _write(self.ca_path, self.ca_pem, 0o644)
        _write(self.pki / "client-ca.crt", pem_cert(self._client_ca.cert), 0o644)

        first_service_ip = str(next(ipaddress.ip_network(SERVICE_CLUSTER_IP_RANGE).hosts()))
        cert, key = self._ca.issue(
            "kube-apiserver",
            hosts=(
                LOOPBACK,
                first_service_ip,
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ),
            server=True,
        )
        _write(self.pki / "apiserver.crt", cert, 0o644)
        _write(self.pki / "apiserver.key", key)

        cert, key = self._client_ca.issue("admin", organizations=("system:masters",), client=True)
        _write(self._admin_cert, cert, 0o644)
        _write(self._admin_key, key)

        sa_key = _new_key()
        _write(self.pki / "sa.key", _key_pem(sa_key))
        _write(
            self.pki / "sa.pub",
            sa_key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            ),
            0o644,
        )

    def issue_serving_certificate(
        self, name: str, hosts: tuple[str, ...] = (LOOPBACK, "localhost")
    ) -> tuple[Path, Path]:
        """A serving certificate signed by ``ca_pem``, for a webhook on loopback.

        Returns ``(cert_path, key_path)`` under ``workdir/pki``. Put ``ca_pem``
        in the webhook's ``caBundle`` and the API server will trust it.
        """
        if self._ca is None:
            raise ControlPlaneError("issue_serving_certificate() needs start() first")
        cert, key = self._ca.issue(name, hosts=hosts, server=True)
        return (
            _write(self.pki / f"{name}.crt", cert, 0o644),
            _write(self.pki / f"{name}.key", key),
        )

    # -- processes ---------------------------------------------------------

    def _spawn(self, args: list[str], log_path: Path) -> subprocess.Popen[bytes]:
        return spawn_logged(args, self.workdir, log_path)

    def _failure(self, what: str) -> ControlPlaneError:
        return ControlPlaneError(
            f"{what}\n--- {self.etcd_log} (tail) ---\n{_tail(self.etcd_log)}"
            f"\n--- {self.apiserver_log} (tail) ---\n{_tail(self.apiserver_log)}"
        )

    def _start_etcd(self) -> None:
        assert self.binaries is not None
        client_port, peer_port = _free_port(), _free_port()
        while peer_port == client_port:
            peer_port = _free_port()
        self.etcd_url = f"http://{LOOPBACK}:{client_port}"
        peer_url = f"http://{LOOPBACK}:{peer_port}"
        data_dir = self.workdir / "etcd-data"
        data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._etcd = self._spawn(
            [
                str(self.binaries.etcd),
                "--name=amp-e2e",
                f"--data-dir={data_dir}",
                f"--listen-client-urls={self.etcd_url}",
                f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=amp-e2e={peer_url}",
                "--initial-cluster-state=new",
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ],
            self.etcd_log,
        )

        def healthy() -> bool:
            if self._etcd.poll() is not None:
                raise self._failure(f"etcd exited with status {self._etcd.returncode}")
            status, body = _http_get(f"{self.etcd_url}/health", None)
            return status == 200 and json.loads(body or b"{}").get("health") == "true"

        try:
            poll_until("etcd to be healthy", healthy, self.start_timeout, interval=0.1)
        except WaitTimeout:
            raise self._failure(f"etcd was not healthy within {self.start_timeout:.0f}s") from None

    def _start_apiserver(self) -> None:
        assert self.binaries is not None
        port = _free_port()
        self.api_url = f"https://{LOOPBACK}:{port}"
        pki = self.pki
        self._apiserver = self._spawn(
            [
                str(self.binaries.kube_apiserver),
                f"--etcd-servers={self.etcd_url}",
                f"--bind-address={LOOPBACK}",
                f"--advertise-address={LOOPBACK}",
                f"--secure-port={port}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={pki / 'client-ca.crt'}",
                "--authorization-mode=Node,RBAC",
                f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
                # A loopback advertise address cannot be published in the
                # kubernetes Endpoints object; nothing here needs it.
                "--endpoint-reconciler-type=none",
                "--allow-privileged=true",
                "--profiling=false",
                f"--cert-dir={pki / 'apiserver-generated'}",
                "--v=1",
                *self.apiserver_args,
                *self._tracing_flags(),
            ],
            self.apiserver_log,
        )
        context = ssl.create_default_context(cadata=self.ca_pem.decode())
        context.load_cert_chain(self._admin_cert, self._admin_key)
        last = ""

        def ready() -> bool:
            nonlocal last
            if self._apiserver.poll() is not None:
                raise self._failure(f"kube-apiserver exited with status {self._apiserver.returncode}")
            status, body = _http_get(f"{self.api_url}/readyz", context)
            last = f"last /readyz answer: {status} {body[-2000:].decode(errors='replace')}"
            return status == 200

        try:
            poll_until("kube-apiserver to be ready", ready, self.start_timeout, interval=0.25)
        except WaitTimeout:
            raise self._failure(f"kube-apiserver was not ready within {self.start_timeout:.0f}s; {last}") from None

    def _tracing_flags(self) -> list[str]:
        """
        The API server's tracing (``APIServerTracing``): OTLP gRPC to
        ``tracing_endpoint``, sampling nothing of its own (0 per million).
        Its sampler is parent-based, so a request whose client (in
        ``system:masters``, whose trace context it trusts) sends a sampled
        ``traceparent`` is traced, with its webhook calls, and no other:
        the shared plane does no tracing work for the tests that do not ask.
        """
        if self.tracing_endpoint is None:
            return []
        path = _write(
            self.workdir / "tracing.yaml",
            yaml.safe_dump(
                {
                    "apiVersion": "apiserver.config.k8s.io/v1",
                    "kind": "TracingConfiguration",
                    "endpoint": self.tracing_endpoint,
                    "samplingRatePerMillion": 0,
                }
            ).encode(),
        )
        return [f"--tracing-config-file={path}"]

    # -- clients and kubeconfigs -------------------------------------------

    def get(self, path: str) -> bytes:
        """``GET path`` on the API server as admin (e.g. ``/metrics``); raises
        ControlPlaneError unless it answers 200."""
        context = ssl.create_default_context(cadata=self.ca_pem.decode())
        context.load_cert_chain(self._admin_cert, self._admin_key)
        status, body = _http_get(f"{self.api_url}{path}", context, timeout=30)
        if status != 200:
            raise ControlPlaneError(f"GET {path} answered {status}: {body[:500]!r}")
        return body

    def metrics(self) -> Any:
        """The API server's ``/metrics`` now, parsed (``tests.support.prometheus.Scrape``)."""
        from ..support.prometheus import Scrape

        return Scrape(self.get("/metrics").decode())

    def _write_admin_kubeconfig(self) -> None:
        doc = kubeconfig(
            self.api_url,
            self.ca_pem,
            {
                "client-certificate-data": base64.b64encode(self._admin_cert.read_bytes()).decode(),
                "client-key-data": base64.b64encode(self._admin_key.read_bytes()).decode(),
            },
            "admin",
        )
        _write(self.kubeconfig_path, yaml.safe_dump(doc).encode())

    def admin_client(self) -> Any:
        """A ``kubernetes.client.ApiClient`` authenticated as cluster admin.

        The same client is returned on every call and closed by ``stop()``.
        """
        if self._admin_client is None:
            from kubernetes import config

            self._admin_client = config.new_client_from_config(config_file=str(self.kubeconfig_path))
        return self._admin_client

    def create_namespace(
        self,
        name: str,
        labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
    ) -> Any:
        """Create a namespace and its ``default`` ServiceAccount; return the Namespace.

        The ServiceAccount is what kube-controller-manager would create; Pods
        cannot be admitted in a namespace without it.
        """
        from kubernetes import client

        core = client.CoreV1Api(self.admin_client())
        namespace = core.create_namespace(
            client.V1Namespace(
                metadata=client.V1ObjectMeta(name=name, labels=labels or None, annotations=annotations or None)
            )
        )
        self._ensure_service_account(core, name, "default")
        return namespace

    @staticmethod
    def _ensure_service_account(core: Any, namespace: str, name: str) -> None:
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        try:
            core.create_namespaced_service_account(
                namespace,
                client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=name)),
            )
        except ApiException as exc:
            if exc.status != 409:
                raise

    def service_account_kubeconfig(self, namespace: str, name: str, *, expiration_seconds: int = 3600) -> Path:
        """Create ServiceAccount ``namespace/name`` and a kubeconfig that uses it.

        The namespace is created (with its default ServiceAccount) if missing.
        The token comes from the TokenRequest API. Grant the account what it
        needs with RBAC objects; it starts with no permissions.
        """
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        core = client.CoreV1Api(self.admin_client())
        try:
            core.read_namespace(namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            self.create_namespace(namespace)
        self._ensure_service_account(core, namespace, name)
        token = core.create_namespaced_service_account_token(
            name,
            namespace,
            client.AuthenticationV1TokenRequest(
                spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=expiration_seconds)
            ),
        ).status.token
        user = f"system:serviceaccount:{namespace}:{name}"
        path = self.workdir / f"sa-{namespace}-{name}.kubeconfig"
        _write(path, yaml.safe_dump(kubeconfig(self.api_url, self.ca_pem, {"token": token}, user)).encode())
        return path


def _http_get(url: str, context: ssl.SSLContext | None, timeout: float = 2) -> tuple[int, bytes]:
    """One bounded GET; (0, reason) when nothing answered."""
    scheme, _, rest = url.partition("://")
    hostport, _, path = rest.partition("/")
    host, _, port = hostport.rpartition(":")
    connection: http.client.HTTPConnection
    if scheme == "https":
        connection = http.client.HTTPSConnection(host, int(port), timeout=timeout, context=context)
    else:
        connection = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        connection.request("GET", "/" + path)
        response = connection.getresponse()
        return response.status, response.read()
    except (OSError, http.client.HTTPException) as exc:
        return 0, str(exc).encode()
    finally:
        connection.close()


def _stop_process_group(proc: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    """SIGTERM the process group, then SIGKILL it if it outlives ``grace``."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
