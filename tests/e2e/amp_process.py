"""Run amp and the example endpoints as real ``twistd`` processes for the
end-to-end tests, plus a small header-recording endpoint.

This module owns: starting ``twistd -n --pidfile= amp --config FILE`` and
``twistd -n --pidfile= amp-example --port N`` with this checkout on
``PYTHONPATH`` and the test's own interpreter, capturing each process's
output to a log file, waiting until it answers its health URL, and stopping
it again (SIGTERM, then SIGKILL of its process group after a grace period).

Waiting on another process is polling by nature: every wait here is a loop
with a deadline that fails with the process's log tail, never an unbounded
or fixed sleep.
"""

from __future__ import annotations

import http.client
import http.server
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import uuid
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Callable, Optional

import yaml

from ..support.prometheus import Scrape
from ..support.waiting import poll_until
from .cluster import spawn_logged

REPO_ROOT = Path(__file__).resolve().parents[2]
LOOPBACK = "127.0.0.1"
_TAIL_LINES = 60


#: ``twistd`` with the test's own interpreter (``python -m twisted`` is ``twist``).
TWISTD = [sys.executable, "-c", "from twisted.scripts.twistd import run; run()"]


class ProcessError(AssertionError):
    """A child process did not start, answer or stop as expected; the
    message holds its log tail."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return sock.getsockname()[1]


def closed_port() -> int:
    """A loopback port that refuses connections (bound, never listened on,
    released): an endpoint that is down."""
    return free_port()


def tail(path: Path, lines: int = _TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


def _get(url_host: str, port: int, path: str, context: Optional[ssl.SSLContext]) -> tuple[int, bytes]:
    connection: http.client.HTTPConnection
    if context is not None:
        connection = http.client.HTTPSConnection(url_host, port, timeout=2, context=context)
    else:
        connection = http.client.HTTPConnection(url_host, port, timeout=2)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read()
    except (OSError, http.client.HTTPException) as exc:
        return 0, str(exc).encode()
    finally:
        connection.close()


class TwistdProcess:
    """One ``twistd -n --pidfile= <plugin> <args>`` child with its log file."""

    def __init__(self, name: str, plugin_args: list[str], workdir: Path) -> None:
        self.name = name
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.workdir / f"{name}.log"
        self.args = [*TWISTD, "-n", "--pidfile=", *plugin_args]
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self.returncode: Optional[int] = None
        #: Environment variables set for the child besides this process's own.
        self.env: dict[str, str] = {}

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        env["PYTHONUNBUFFERED"] = "1"
        env.update(self.env)
        self.proc = spawn_logged(self.args, self.workdir, self.log_path, env)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def describe(self) -> str:
        state = "running" if self.running() else f"exited with {self.proc.returncode if self.proc else None}"
        return f"--- {self.name} ({state}), {self.log_path} (tail) ---\n{tail(self.log_path)}"

    def wait_healthy(self, port: int, path: str, context: Optional[ssl.SSLContext], timeout: float) -> None:
        """Poll ``GET path`` on ``port`` until it answers 200."""
        last: list[str] = [""]

        def probe() -> Optional[bool]:
            if not self.running():
                raise ProcessError(f"{self.name} exited during start-up\n{self.describe()}")
            status, body = _get(LOOPBACK, port, path, context)
            if status == 200:
                return True
            last[0] = f"last answer: {status} {body[-500:].decode(errors='replace')}"
            return None

        poll_until(
            f"{self.name} {path} on port {port}", probe, timeout, details=lambda: f"{last[0]}\n{self.describe()}"
        )

    def stop(self, grace: float = 10.0) -> Optional[int]:
        """SIGTERM the child and wait; SIGKILL its group if it outlives
        ``grace``.  Returns the exit status (``-SIGTERM`` after a clean
        shutdown: twistd re-raises the signal that stopped it), or None when
        it had to be killed."""
        proc = self.proc
        if proc is None:
            return self.returncode
        self.proc = None
        if proc.poll() is None:
            try:
                os.kill(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        try:
            self.returncode = proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.returncode = None
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
        return self.returncode

    def stopped_cleanly(self) -> bool:
        """After ``stop()``: it shut down on SIGTERM within the grace period
        and said so in its log."""
        return self.returncode in (0, -signal.SIGTERM) and "Server Shut Down." in self.log_text()


class ExampleEndpoints(TwistdProcess):
    """``twistd amp-example`` on a free loopback port (plain HTTP)."""

    def __init__(self, workdir: Path, port: Optional[int] = None) -> None:
        self.port = port or free_port()
        super().__init__("amp-example", ["amp-example", "--port", str(self.port), "--interface", LOOPBACK], workdir)

    def url(self, path: str) -> str:
        return f"http://{LOOPBACK}:{self.port}/{path.lstrip('/')}"

    def start_and_wait(self, timeout: float = 30.0) -> "ExampleEndpoints":
        self.start()
        self.wait_healthy(self.port, "/healthz", None, timeout)
        return self


def amp_config(
    *,
    port: int,
    cert: Path,
    key: Path,
    kubeconfig: Path,
    failure_policy: str = "Ignore",
    webhook_configuration: Optional[str] = None,
    overrides: Optional[dict[str, Any]] = None,
) -> dict[str, Any]:
    """amp's YAML configuration (as a dict) for the end-to-end tests:
    a kubeconfig namespace source, loopback endpoints allowed, no metrics
    listener.  ``overrides`` maps a section to the keys to set in it
    (``{"tls": {"reload_interval": "500ms"}}``) or a top-level key to its
    value."""
    kubernetes: dict[str, Any] = {"source": "kubeconfig", "kubeconfig": str(kubeconfig)}
    if webhook_configuration:
        kubernetes["webhook_configuration"] = webhook_configuration
    config: dict[str, Any] = {
        "listen": {"port": port, "interface": LOOPBACK},
        "tls": {"cert": str(cert), "key": str(key)},
        "metrics": {"port": 0},
        "kubernetes": kubernetes,
        "endpoints": {"allow": [f"http://{LOOPBACK}:*/*"], "timeout": "2s"},
        "failure_policy": failure_policy,
    }
    for key, value in (overrides or {}).items():
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            config[key].update(value)
        else:
            config[key] = value
    return config


class AmpProcess(TwistdProcess):
    """``twistd amp --config <file>`` with the given configuration."""

    def __init__(self, name: str, workdir: Path, config: dict[str, Any], ca_pem: bytes) -> None:
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        self.config = config
        self.port = int(config["listen"]["port"])
        self.config_path = workdir / f"{name}.yaml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.ca_pem = ca_pem
        super().__init__(name, ["amp", "--config", str(self.config_path)], workdir)

    @property
    def mutate_url(self) -> str:
        return f"https://{LOOPBACK}:{self.port}/mutate"

    def client_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cadata=self.ca_pem.decode())

    def start_and_wait(self, timeout: float = 30.0) -> "AmpProcess":
        self.start()
        self.wait_healthy(self.port, "/readyz", self.client_context(), timeout)
        return self

    def metric(self, name: str, **labels: str) -> Optional[float]:
        """The value of one sample from amp's ``/metrics`` (needs
        ``metrics.port``) whose labels include ``labels``, or None when amp
        does not report it."""
        try:
            scrape = Scrape.get(int(self.config["metrics"]["port"]), LOOPBACK, timeout=2)
        except RuntimeError as e:
            raise ProcessError(f"{e}\n{self.describe()}") from None
        found = [v for (n, ls), v in scrape.samples.items() if n == name and labels.items() <= ls]
        return float(found[0]) if found else None

    def served_certificate(self) -> bytes:
        """The DER certificate amp presents to a new TLS connection."""
        with socket.create_connection((LOOPBACK, self.port), timeout=2) as raw:
            with self.client_context().wrap_socket(raw, server_hostname=LOOPBACK) as tls:
                der = tls.getpeercert(binary_form=True)
        assert der is not None
        return der


class _ThreadingServer(http.server.ThreadingHTTPServer):
    #: The listen backlog.  socketserver's default of 5 drops the SYNs of a
    #: burst of new connections beyond it (amp opens up to
    #: endpoints.max_concurrent at once in a storm): they are retried a
    #: second later, and amp's calls time out connecting.
    request_queue_size = 1024


class LoopbackServer(ABC):
    """A threaded HTTP/1.1 server on 127.0.0.1 (TLS when given a context)
    whose ``answer(path, headers, body)`` returns ``(status, body)``."""

    def __init__(self, name: str, context: Optional[ssl.SSLContext] = None) -> None:
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 (http.server naming)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status, reply = owner.answer(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = _ThreadingServer((LOOPBACK, 0), Handler)
        self._server.daemon_threads = True
        if context is not None:
            # The handshake happens in the request's thread, not the accepting one.
            self._server.socket = context.wrap_socket(
                self._server.socket, server_side=True, do_handshake_on_connect=False
            )
        self.port = self._server.server_address[1]
        self._scheme = "https" if context is not None else "http"
        self._thread = threading.Thread(target=self._server.serve_forever, name=name, daemon=True)
        self._lock = threading.Lock()

    def url(self, path: str) -> str:
        return f"{self._scheme}://{LOOPBACK}:{self.port}/{path}"

    @abstractmethod
    def answer(self, path: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
        """The status and body to answer a POST to C{path} with."""

    def __enter__(self) -> "LoopbackServer":
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


class RecordingEndpoint(LoopbackServer):
    """An endpoint in the test process that records every request's
    headers (and its path and body) and answers with a fixed JSON patch."""

    def __init__(self, reply: Any) -> None:
        super().__init__("recording-endpoint")
        self.reply = json.dumps(reply).encode()
        self.requests: list[dict[str, str]] = []

    def answer(self, path: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
        record = dict(headers)
        record["(path)"] = path
        record["(body)"] = body.decode("utf-8", "replace")
        with self._lock:
            self.requests.append(record)
        return 200, self.reply

    def url(self, path: str = "record") -> str:
        return super().url(path)

    def recorded(self) -> list[dict[str, str]]:
        with self._lock:
            return list(self.requests)


# ---- in the cluster

ENABLED_LABEL = "amp.txn2.com/enabled"
ENDPOINT_ANNOTATION = "amp.txn2.com/ep"
FAILURE_POLICY_ANNOTATION = "amp.txn2.com/failure-policy"
STATUS_ANNOTATION = "amp.txn2.com/status"
#: Each amp instance's MutatingWebhookConfiguration also selects on this
#: label, so that several instances can be registered at once without all
#: of them mutating every labelled namespace.
INSTANCE_LABEL = "e2e.amp.txn2.com/instance"


def webhook_configuration(
    name: str,
    url: str,
    ca_pem: bytes,
    instance: str,
    failure_policy: str = "Fail",
    *,
    webhook_name: str = "pods.amp.txn2.com",
    timeout_seconds: int = 5,
    review_versions: tuple[str, ...] = ("v1", "v1beta1"),
    reinvocation_policy: Optional[str] = None,
) -> dict[str, Any]:
    """A MutatingWebhookConfiguration registering amp by URL for Pod CREATE
    in namespaces labelled ``amp.txn2.com/enabled: "true"`` (and this
    instance's label).  ``reinvocation_policy`` (``Never`` or ``IfNeeded``)
    is left to the API server's default, ``Never``, unless given."""
    import base64

    configuration: dict[str, Any] = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [
            {
                "name": webhook_name,
                "clientConfig": {"url": url, "caBundle": base64.b64encode(ca_pem).decode()},
                "rules": [
                    {
                        "operations": ["CREATE"],
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "resources": ["pods"],
                    }
                ],
                "namespaceSelector": {"matchLabels": {ENABLED_LABEL: "true", INSTANCE_LABEL: instance}},
                "sideEffects": "None",
                "admissionReviewVersions": list(review_versions),
                "timeoutSeconds": timeout_seconds,
                "failurePolicy": failure_policy,
            }
        ],
    }
    if reinvocation_policy is not None:
        configuration["webhooks"][0]["reinvocationPolicy"] = reinvocation_policy
    return configuration


def parse_warning(header: str) -> str:
    """The text of one RFC 7234 ``Warning: 299 - "text"`` header value."""
    code, _, rest = header.partition(" ")
    _agent, _, quoted = rest.partition(" ")
    quoted = quoted.strip()
    if code.isdigit() and len(quoted) >= 2 and quoted[0] == quoted[-1] == '"':
        return quoted[1:-1].replace('\\"', '"').replace("\\\\", "\\")
    return header


def pod_manifest(
    name: str,
    *,
    containers: Optional[list[dict[str, Any]]] = None,
    init_containers: Optional[list[dict[str, Any]]] = None,
    labels: Optional[dict[str, str]] = None,
    annotations: Optional[dict[str, str]] = None,
) -> dict[str, Any]:
    """A minimal Pod; one container ``app`` unless told otherwise."""
    metadata: dict[str, Any] = {"name": name}
    if labels:
        metadata["labels"] = labels
    if annotations:
        metadata["annotations"] = annotations
    spec: dict[str, Any] = {"containers": containers or [{"name": "app", "image": "registry.invalid/app:1"}]}
    if init_containers:
        spec["initContainers"] = init_containers
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


class AmpInstance:
    """amp running as a ``twistd`` process against the control plane and
    registered with it by a MutatingWebhookConfiguration of its own.

    ``start()`` issues a serving certificate from the control plane's CA
    (copied into the instance's directory, where rotation may overwrite
    it), writes the config, creates the webhook configuration, starts amp,
    waits for ``/readyz`` and then until the API server calls it (a dry-run
    Pod in a probe namespace comes back mutated by ``/user-env``).
    ``close()`` deletes the webhook configuration and stops amp, returning
    its exit status (None if it had to be killed).
    """

    def __init__(
        self,
        control_plane: Any,
        kubeconfig: Path,
        examples: ExampleEndpoints,
        workdir: Path,
        instance: str,
        *,
        failure_policy: str = "Ignore",
        webhook_failure_policy: str = "Fail",
        webhook_configuration_name: Optional[str] = None,
        webhook_name: str = "pods.amp.txn2.com",
        watch_webhook_configuration: bool = False,
        webhook_timeout_seconds: int = 5,
        webhook_reinvocation_policy: Optional[str] = None,
        overrides: Optional[dict[str, Any]] = None,
        registration: Optional[Callable[[dict[str, Any]], dict[str, Any]]] = None,
    ) -> None:
        self.control_plane = control_plane
        self.examples = examples
        # Unique in the session: it names the instance's label value,
        # webhook configuration and probe namespace.
        self.instance = f"{instance}-{uuid.uuid4().hex[:6]}"
        self.workdir = Path(workdir) / self.instance
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.webhook_configuration_name = webhook_configuration_name or f"amp-e2e-{self.instance}"
        self.webhook_name = webhook_name
        self.webhook_failure_policy = webhook_failure_policy
        self.webhook_timeout_seconds = webhook_timeout_seconds
        self.webhook_reinvocation_policy = webhook_reinvocation_policy
        #: Turns the one-entry registration into the one registered
        #: (e.g. the shipped one, an entry per failure class).
        self.registration = registration
        issued_cert, issued_key = control_plane.issue_serving_certificate(f"amp-{self.instance}")
        self.cert_path = self.workdir / "tls.crt"
        self.key_path = self.workdir / "tls.key"
        self.cert_path.write_bytes(issued_cert.read_bytes())
        self.key_path.write_bytes(issued_key.read_bytes())
        os.chmod(self.key_path, 0o600)
        config = amp_config(
            port=self.port,
            cert=self.cert_path,
            key=self.key_path,
            kubeconfig=kubeconfig,
            failure_policy=failure_policy,
            webhook_configuration=self.webhook_configuration_name if watch_webhook_configuration else None,
            overrides=overrides,
        )
        if watch_webhook_configuration:
            config["kubernetes"]["webhook_name"] = webhook_name
        self.process = AmpProcess(f"amp-{self.instance}", self.workdir, config, control_plane.ca_pem)
        self._registered = False

    @property
    def admin(self) -> Any:
        return self.control_plane.admin_client()

    def start(self, timeout: float = 30.0) -> "AmpInstance":
        from kubernetes import client

        configuration = webhook_configuration(
            self.webhook_configuration_name,
            self.process.mutate_url,
            self.control_plane.ca_pem,
            self.instance,
            self.webhook_failure_policy,
            webhook_name=self.webhook_name,
            timeout_seconds=self.webhook_timeout_seconds,
            reinvocation_policy=self.webhook_reinvocation_policy,
        )
        if self.registration is not None:
            configuration = self.registration(configuration)
        client.AdmissionregistrationV1Api(self.admin).create_mutating_webhook_configuration(configuration)
        self._registered = True
        self.process.start_and_wait(timeout)
        self._wait_called(timeout)
        return self

    def namespace(
        self,
        name: str,
        endpoint: Optional[str] = None,
        *,
        enabled: bool = True,
        failure_policy: Optional[str] = None,
        annotations: Optional[dict[str, str]] = None,
    ) -> str:
        """Create a namespace served by this instance (unless ``enabled`` is
        false) with ``endpoint`` as its ``amp.txn2.com/ep`` and any other
        ``annotations``."""
        labels = {INSTANCE_LABEL: self.instance}
        if enabled:
            labels[ENABLED_LABEL] = "true"
        annotations = dict(annotations or {})
        if endpoint is not None:
            annotations[ENDPOINT_ANNOTATION] = endpoint
        if failure_policy is not None:
            annotations[FAILURE_POLICY_ANNOTATION] = failure_policy
        self.control_plane.create_namespace(name, labels=labels, annotations=annotations)
        return name

    def _wait_called(self, timeout: float) -> None:
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        core = client.CoreV1Api(self.admin)
        probe_ns = self.namespace(f"{self.instance}-probe", self.examples.url("user-env"), failure_policy="Fail")
        last: list[str] = [""]

        def mutated() -> Optional[bool]:
            try:
                response = core.create_namespaced_pod(
                    probe_ns, pod_manifest("probe"), dry_run="All", _preload_content=False
                )
            except ApiException as exc:
                last[0] = f"probe Pod refused: {exc.status} {exc.body}"
                return None
            env = json.loads(response.data)["spec"]["containers"][0].get("env") or []
            if any(e.get("name") == "AMP_USER" for e in env):
                return True
            last[0] = "probe Pod admitted without amp's mutation"
            return None

        poll_until(
            f"the API server to call amp {self.instance}",
            mutated,
            timeout,
            details=lambda: f"{last[0]}\n{self.process.describe()}",
        )

    def close(self) -> Optional[int]:
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        if self._registered:
            self._registered = False
            try:
                client.AdmissionregistrationV1Api(self.admin).delete_mutating_webhook_configuration(
                    self.webhook_configuration_name
                )
            except ApiException as exc:
                if exc.status != 404:
                    raise
        return self.process.stop()


def unique(prefix: str) -> str:
    """A name (a namespace's, a Pod's) of one test's own."""
    return f"{prefix}-{uuid.uuid4().hex[:6]}"
