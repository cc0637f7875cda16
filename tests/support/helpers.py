"""
Shared helpers for amp's tests: configs, AdmissionReview builders, an
in-process amp on a loopback TLS port, an in-process example endpoint server,
and a TLS client that verifies amp's certificate.

Typical use in a C{twisted.trial.unittest.TestCase}::

    from twisted.internet import reactor
    from tests.support.helpers import (WebhookClient, make_config, namespace, review_bytes,
                            start_amp, start_example, decode_answer)

    @inlineCallbacks
    def test_patched(self):
        example = yield start_example(reactor)
        self.addCleanup(example.stop)
        config = make_config({"team-a": namespace(example.url("/user-env"))})
        amp = yield start_amp(config, reactor)
        self.addCleanup(amp.stop)
        client = WebhookClient(reactor)
        self.addCleanup(client.close)
        response, body = yield client.post(amp.url("/mutate"), review_bytes())
        answer = decode_answer(body)

Cleanup order matters for trial's dirty-reactor check: add the cleanups in
the order shown (cleanups run last-in first-out, so the client's pooled
connections close first, then amp and its open server-side connections,
then the example server).  Every C{stop}/C{close} returns a Deferred that
fires only when every socket it owns is closed.

Everything listens on 127.0.0.1 port 0 (a free port chosen by the kernel).
The development CA and serving certificate (L{amp_dev.devcert}) are made once
per process in a temporary directory, see L{dev_tls}.
"""

from __future__ import annotations

import atexit
import base64
import copy
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional

import jsonpatch
import treq
from twisted.internet.defer import Deferred, DeferredList, inlineCallbacks, succeed
from twisted.internet.endpoints import (
    TCP4ClientEndpoint,
    TCP4ServerEndpoint,
    connectProtocol,
    wrapClientTLS,
)
from twisted.internet.interfaces import IListeningPort, IProtocolFactory, IStreamServerEndpoint
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.ssl import Certificate, optionsForClientTLS
from twisted.protocols.policies import ProtocolWrapper, WrappingFactory
from twisted.python.failure import Failure
from twisted.web.client import Agent, HTTPConnectionPool
from twisted.web.iweb import IPolicyForHTTPS
from zope.interface import implementer

from amp.config import Config, parse_config
from amp.metrics import Metrics
from amp.namespaces import UNKNOWN, INamespaceSource, NamespaceInfo
from amp.service import AmpService, namespace_source, serving_certificate
from amp.tls import tls_endpoint
from amp_dev.devcert import write_dev_tls
from amp_examples.server import build_site

#: The uid every review built here carries unless told otherwise.
UID = "705ab4f5-6393-11e8-b7cc-42010a800002"
V1 = "admission.k8s.io/v1"
V1BETA1 = "admission.k8s.io/v1beta1"
ENABLED_LABEL = "amp.txn2.com/enabled"
EP_ANNOTATION = "amp.txn2.com/ep"

#: Upper bound for anything a helper waits on over real sockets.
WAIT = 10.0

# ---------------------------------------------------------------- certificates

_tls_paths: Optional[dict[str, Path]] = None


def dev_tls() -> dict[str, Path]:
    """
    The development CA and certificates (L{amp_dev.devcert.write_dev_tls}), made
    once per process in a temporary directory removed at exit.  Keys:
    C{ca_cert}, C{ca_key}, C{cert}, C{key}, C{client_cert}, C{client_key}.
    The serving certificate covers C{localhost} and C{127.0.0.1}.
    """
    global _tls_paths
    if _tls_paths is None:
        directory = tempfile.mkdtemp(prefix="amp-test-tls-")
        atexit.register(shutil.rmtree, directory, True)
        _tls_paths = write_dev_tls(directory)
    return _tls_paths


def ca_pem() -> bytes:
    """The development CA certificate, PEM."""
    return dev_tls()["ca_cert"].read_bytes()


class SecretVolume:
    """
    A directory laid out like a Kubernetes Secret volume, as the kubelet
    writes it::

        tls.crt -> ..data/tls.crt
        tls.key -> ..data/tls.key
        ..data  -> ..gen-00001
        ..gen-00001/tls.crt, tls.key

    L{swap} writes a new generation directory and renames a new C{..data}
    link over the old one (atomic).  The C{keep} generations before the
    current one stay until later swaps (a reader that resolved the old link
    a moment before still finds its files); older ones are removed.

    A name may have directories (C{tls/tls.crt}, as a projected volume's
    item path): the top-level link is then C{tls -> ..data/tls}.  C{mode}
    and C{gid} are the volume's C{defaultMode} and the Pod's C{fsGroup}
    (default: 0600 for C{*.key}, 0644 otherwise, and the writer's group).
    """

    def __init__(
        self,
        directory: Path,
        files: Mapping[str, bytes],
        keep: int = 0,
        mode: Optional[int] = None,
        gid: Optional[int] = None,
    ) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.keep = keep
        self.mode = mode
        self.gid = gid
        self.generation = 0
        self._generations: list[str] = []
        self.current = self._write_generation(files)
        os.symlink(self.current, self.dir / "..data")
        for name in dict.fromkeys(name.split("/")[0] for name in files):
            os.symlink(f"..data/{name}", self.dir / name)

    def path(self, name: str) -> str:
        """The path of C{name} as a reader sees it (through C{..data})."""
        return str(self.dir / name)

    def _write_generation(self, files: Mapping[str, bytes]) -> str:
        self.generation += 1
        name = f"..gen-{self.generation:05d}"
        (self.dir / name).mkdir(mode=0o755)
        for file_name, data in files.items():
            path = self.dir / name / file_name
            path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            mode = self.mode if self.mode is not None else (0o600 if file_name.endswith(".key") else 0o644)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.chmod(path, mode)  # not narrowed by the umask
            if self.gid is not None:
                os.chown(path, -1, self.gid)
        self._generations.append(name)
        return name

    def swap(self, files: Mapping[str, bytes]) -> None:
        """Put C{files} in place of the current generation, atomically."""
        self.current = self._write_generation(files)
        os.symlink(self.current, self.dir / "..data_tmp")
        os.replace(self.dir / "..data_tmp", self.dir / "..data")
        while len(self._generations) > self.keep + 1:
            shutil.rmtree(self.dir / self._generations.pop(0))


# ---------------------------------------------------------------- config


def namespace(
    endpoint: Optional[str] = None,
    *,
    enabled: bool = True,
    failure_policy: Optional[str] = None,
    mode: Optional[str] = None,
    validation: Optional[str] = None,
    labels: Optional[Mapping[str, str]] = None,
    annotations: Optional[Mapping[str, str]] = None,
) -> dict[str, Any]:
    """
    One entry of C{kubernetes.namespaces} for L{make_config}: labelled
    enabled (unless C{enabled=False}) and with its failure class
    (C{failure_policy}, the label C{amp.txn2.com/failure-class}), with the
    mutation endpoint annotation, the mode annotation and the validation
    endpoint annotation when given.
    """
    ls = dict(labels or {})
    if enabled:
        ls[ENABLED_LABEL] = "true"
    ann = dict(annotations or {})
    if endpoint is not None:
        ann[EP_ANNOTATION] = endpoint
    if failure_policy is not None:
        ls["amp.txn2.com/failure-class"] = failure_policy
    if mode is not None:
        ann["amp.txn2.com/mode"] = mode
    if validation is not None:
        ann["validation.amp.txn2.com/ep"] = validation
    return {"labels": ls, "annotations": ann}


def _merge(base: dict, extra: Mapping) -> dict:
    out = dict(base)
    for k, v in extra.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def raw_config(namespaces: Optional[Mapping[str, Any]] = None, **sections: Any) -> dict[str, Any]:
    """
    The YAML-shaped dict L{make_config} parses: amp on 127.0.0.1 port 0 with
    the development certificate, metrics off, static namespaces, loopback
    endpoints allowed, failure policy Ignore.  C{sections} are merged in
    (mappings key by key, anything else replaced), e.g.
    C{listen={"max_body": 1024}} or C{failure_policy="Fail"}.
    """
    tls = dev_tls()
    raw: dict[str, Any] = {
        "listen": {"port": 0, "interface": "127.0.0.1"},
        "tls": {"cert": str(tls["cert"]), "key": str(tls["key"])},
        "metrics": {"port": 0},
        "kubernetes": {"source": "static", "namespaces": dict(namespaces or {})},
        "endpoints": {"allow": ["http://127.0.0.1:*/*"], "timeout": "2s"},
        "failure_policy": "Ignore",
    }
    return _merge(raw, sections)


def make_config(namespaces: Optional[Mapping[str, Any]] = None, **sections: Any) -> Config:
    """A L{Config} from L{raw_config} (same arguments)."""
    return parse_config(raw_config(namespaces, **sections))


# ---------------------------------------------------------------- reviews


def pod(
    name: str = "web",
    *,
    labels: Optional[Mapping[str, str]] = None,
    annotations: Optional[Mapping[str, str]] = None,
    containers: Optional[list[dict[str, Any]]] = None,
    **spec: Any,
) -> dict[str, Any]:
    """
    A Pod as the API server sends it at CREATE: no namespace in its
    metadata, one C{app} container unless C{containers} is given, extra
    C{spec} fields as keyword arguments.
    """
    metadata: dict[str, Any] = {"name": name} if name else {"generateName": "web-"}
    if labels is not None:
        metadata["labels"] = dict(labels)
    if annotations is not None:
        metadata["annotations"] = dict(annotations)
    if containers is None:
        containers = [{"name": "app", "image": "nginx:1.25"}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {"containers": copy.deepcopy(containers), **spec},
    }


def review(
    obj: Any = None,
    *,
    namespace: str = "team-a",
    uid: str = UID,
    api_version: str = V1,
    operation: str = "CREATE",
    kind: Optional[Mapping[str, str]] = None,
    dry_run: bool = False,
    sub_resource: Optional[str] = None,
) -> dict[str, Any]:
    """
    An AdmissionReview request (as a dict) for C{obj} (default: L{pod}()).
    """
    if obj is None:
        obj = pod()
    request: dict[str, Any] = {
        "uid": uid,
        "kind": dict(kind or {"group": "", "version": "v1", "kind": "Pod"}),
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": namespace,
        "operation": operation,
        "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
        "object": obj,
        "oldObject": None,
        "dryRun": dry_run,
    }
    if sub_resource:
        request["subResource"] = sub_resource
    return {"apiVersion": api_version, "kind": "AdmissionReview", "request": request}


def review_bytes(obj: Any = None, **kwargs: Any) -> bytes:
    """L{review} serialised as the API server sends it."""
    return json.dumps(review(obj, **kwargs)).encode("utf-8")


def decode_answer(body: bytes) -> dict[str, Any]:
    """
    Parse amp's AdmissionReview answer and check its envelope; returns the
    whole document.  A decoded C{patch} (or None) is added to the response
    as C{_patch} for convenience.
    """
    doc = json.loads(body)
    assert doc["kind"] == "AdmissionReview", doc
    response = doc["response"]
    assert ("patch" in response) == ("patchType" in response), response
    if "patch" in response:
        assert response["patchType"] == "JSONPatch", response
        response["_patch"] = json.loads(base64.b64decode(response["patch"], validate=True))
    else:
        response["_patch"] = None
    return doc


def apply_patch(obj: dict[str, Any], patch: Optional[list]) -> dict[str, Any]:
    """C{obj} with C{patch} applied by C{jsonpatch} (as the API server would)."""
    if not patch:
        return copy.deepcopy(obj)
    return jsonpatch.JsonPatch(patch).apply(copy.deepcopy(obj))


# ---------------------------------------------------------------- connection tracking


class _TrackedProtocol(ProtocolWrapper):
    def connectionLost(self, reason: Failure) -> None:
        try:
            super().connectionLost(reason)
        finally:
            self.factory.closed(self)


class ConnectionTracker(WrappingFactory):
    """
    A protocol factory around C{factory} that knows every connection it
    built, so a test can close them all and wait until they are gone.
    """

    protocol = _TrackedProtocol

    def __init__(self, factory: IProtocolFactory, reactor: Any) -> None:
        super().__init__(factory)
        self.reactor = reactor
        self._waiting: list[Deferred] = []
        #: How many connections were accepted in all.
        self.accepted = 0

    def registerProtocol(self, p: ProtocolWrapper) -> None:
        super().registerProtocol(p)
        self.accepted += 1

    def closed(self, p: ProtocolWrapper) -> None:
        if not self.protocols:
            waiting, self._waiting = self._waiting, []
            for d in waiting:
                d.callback(None)

    def wait_idle(self) -> Deferred:
        """Fires when no connection is open (at once if none is)."""
        if not self.protocols:
            return succeed(None)
        d: Deferred = Deferred()
        self._waiting.append(d)
        return d.addTimeout(WAIT, self.reactor)

    def close_all(self) -> Deferred:
        """Abort every open connection; fires when all are closed."""
        if not self.protocols:
            return succeed(None)
        d: Deferred = Deferred()
        self._waiting.append(d)
        for p in list(self.protocols):
            p.transport.abortConnection()
        return d.addTimeout(WAIT, self.reactor)

    def open_count(self) -> int:
        """How many connections are open now."""
        return len(self.protocols)


@implementer(IStreamServerEndpoint)
class RecordingEndpoint:
    """
    Listens through C{inner} with the factory wrapped in a
    L{ConnectionTracker}, and remembers the port.
    """

    def __init__(self, inner: IStreamServerEndpoint, reactor: Any) -> None:
        self.inner = inner
        self.reactor = reactor
        #: Fires with the listening port, or fails as the listen did.
        self.listening: Deferred = Deferred()
        #: The tracker of the connections accepted, once listening.
        self.tracker: Optional[ConnectionTracker] = None

    def listen(self, factory: IProtocolFactory) -> Deferred:
        self.tracker = ConnectionTracker(factory, self.reactor)

        def got(port: IListeningPort) -> IListeningPort:
            self.listening.callback(port)
            return port

        def failed(failure: Failure) -> Failure:
            self.listening.errback(failure)
            return failure

        return self.inner.listen(self.tracker).addCallbacks(got, failed)


# ---------------------------------------------------------------- amp


class RunningAmp:
    """
    An amp listening on 127.0.0.1.

    @ivar service: the L{AmpService} (C{service.admitter},
        C{service.metrics}, C{service.webhook_server}, ...).
    @ivar port: the TCP port of the TLS webhook listener.
    @ivar connections: the L{ConnectionTracker} of the listener.
    @ivar metrics_port: the port of the plain-HTTP metrics listener, or
        None when amp was started without it.
    """

    def __init__(
        self,
        service: AmpService,
        port: int,
        connections: ConnectionTracker,
        metrics_port: Optional[int] = None,
        trackers: Iterable[ConnectionTracker] = (),
    ) -> None:
        self.service = service
        self.port = port
        self.connections = connections
        self.metrics_port = metrics_port
        self._trackers = [connections, *trackers]

    @property
    def metrics(self) -> Metrics:
        return self.service.metrics

    def url(self, path: str = "/mutate", query: str = "") -> bytes:
        """C{https://127.0.0.1:<port><path>[?query]}, as bytes for treq."""
        text = f"https://127.0.0.1:{self.port}{path}"
        if query:
            text += "?" + query
        return text.encode("ascii")

    def metrics_url(self) -> bytes:
        """C{http://127.0.0.1:<metrics port>/metrics}, as bytes for treq."""
        assert self.metrics_port is not None, "amp was started without its metrics listener"
        return f"http://127.0.0.1:{self.metrics_port}/metrics".encode("ascii")

    @inlineCallbacks
    def stop(self) -> Any:
        """Stop every service of amp and close every connection to it."""
        yield self.service.stopService()
        for tracker in self._trackers:
            yield tracker.close_all()


@inlineCallbacks
def start_amp(
    config: Config,
    reactor: Any,
    *,
    namespaces: Optional[INamespaceSource] = None,
    metrics: Optional[Metrics] = None,
    metrics_listener: bool = False,
) -> Any:
    """
    Build amp (certificate loaded from C{config.tls}, no SIGHUP handler)
    with its webhook on 127.0.0.1 port 0 and, with C{metrics_listener}, its
    metrics listener on another free loopback port (see
    L{RunningAmp.metrics_url}); start it and wait until it listens.
    Resolves to a L{RunningAmp}; add its C{stop} as a cleanup.
    """
    metrics = metrics if metrics is not None else Metrics()
    certificate = serving_certificate(config.tls, reactor, metrics)
    webhook = RecordingEndpoint(tls_endpoint(reactor, 0, "127.0.0.1", certificate), reactor)
    metrics_endpoint = (
        RecordingEndpoint(TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1"), reactor) if metrics_listener else None
    )
    service = AmpService(
        config,
        reactor,
        certificate=certificate,
        webhook_endpoint=webhook,
        metrics_endpoint=metrics_endpoint,
        namespaces=namespaces if namespaces is not None else namespace_source(config, reactor, metrics),
        metrics=metrics,
        install_sighup=False,
    )
    service.startService()
    try:
        port = yield webhook.listening.addTimeout(WAIT, reactor)
        metrics_port = None
        if metrics_endpoint is not None:
            metrics_port = (yield metrics_endpoint.listening.addTimeout(WAIT, reactor)).getHost().port
    except Exception:
        yield service.stopService()
        raise
    assert webhook.tracker is not None
    extra = [metrics_endpoint.tracker] if metrics_endpoint is not None and metrics_endpoint.tracker else []
    return RunningAmp(service, port.getHost().port, webhook.tracker, metrics_port, extra)


# ---------------------------------------------------------------- example endpoints


class RunningExample:
    """
    The example endpoint server (L{amp_examples.server.build_site}) on
    127.0.0.1, plain HTTP.

    @ivar root: its resource tree; C{root.children[b"hang"].handler.pending}
        holds the calls C{/hang} is sitting on.
    """

    def __init__(self, port: IListeningPort, tracker: ConnectionTracker, root: Any) -> None:
        self._port = port
        self.port = port.getHost().port
        self.connections = tracker
        self.root = root

    def url(self, path: str) -> str:
        """C{http://127.0.0.1:<port><path>}, the form a namespace annotation holds."""
        return f"http://127.0.0.1:{self.port}{path}"

    @inlineCallbacks
    def stop(self) -> Any:
        """Stop listening and close every connection."""
        yield self._port.stopListening()
        yield self.connections.close_all()


@inlineCallbacks
def start_example(reactor: Any) -> Any:
    """
    Listen with the example endpoints on 127.0.0.1 port 0; resolves to a
    L{RunningExample}.
    """
    site = build_site(reactor=reactor)
    site.log = lambda request: None  # type: ignore[method-assign]
    tracker = ConnectionTracker(site, reactor)
    port = yield TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(tracker)
    return RunningExample(port, tracker, site.resource)


def closed_port(reactor: Any) -> Deferred:
    """
    A loopback TCP port nothing listens on (bound, then released), for
    "connection refused" tests; resolves to the port number.
    """

    def release(port: IListeningPort) -> Deferred:
        number = port.getHost().port
        return port.stopListening().addCallback(lambda _: number)

    return (
        TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(Factory.forProtocol(Protocol)).addCallback(release)
    )


# ---------------------------------------------------------------- TLS client


@implementer(IPolicyForHTTPS)
class TrustCA:
    """
    An C{IPolicyForHTTPS} that trusts only the given CA (default: the
    development CA) and verifies the server's host name or IP address.
    """

    def __init__(self, ca: Optional[bytes] = None) -> None:
        self._root = Certificate.loadPEM(ca if ca is not None else ca_pem())

    def creatorForNetloc(self, hostname: bytes, port: int) -> Any:
        return optionsForClientTLS(hostname.decode("ascii"), trustRoot=self._root)


class WebhookClient:
    """
    treq over a persistent pool, trusting the development CA; what the API
    server does to amp.  C{close} closes the pooled connections.
    """

    def __init__(
        self, reactor: Any, *, ca: Optional[bytes] = None, persistent: bool = True, wait: float = WAIT
    ) -> None:
        self.reactor = reactor
        #: How long a request may take before the client gives up on it.
        self.wait = wait
        self.pool = HTTPConnectionPool(reactor, persistent=persistent)
        self.pool.retryAutomatically = False
        agent = Agent(reactor, contextFactory=TrustCA(ca), pool=self.pool)
        self.http = treq.client.HTTPClient(agent)

    @inlineCallbacks
    def post(
        self,
        url: bytes,
        body: bytes,
        *,
        content_type: Optional[bytes] = b"application/json",
        headers: Optional[Mapping[bytes, Iterable[bytes]]] = None,
    ) -> Any:
        """POST C{body}; resolves to C{(response, body bytes)}."""
        h: dict[bytes, list[bytes]] = {k: list(v) for k, v in (headers or {}).items()}
        if content_type is not None:
            h[b"content-type"] = [content_type]
        response = yield self.http.post(url, data=body, headers=h).addTimeout(self.wait, self.reactor)
        content = yield treq.content(response).addTimeout(self.wait, self.reactor)
        return response, content

    @inlineCallbacks
    def get(self, url: bytes) -> Any:
        """GET; resolves to C{(response, body bytes)}."""
        response = yield self.http.get(url).addTimeout(self.wait, self.reactor)
        content = yield treq.content(response).addTimeout(self.wait, self.reactor)
        return response, content

    def close(self) -> Deferred:
        """Close every pooled connection; fires when they are closed."""
        return self.pool.closeCachedConnections()


class _Collect(Protocol):
    def __init__(self, send: Iterable[bytes]) -> None:
        self._send = list(send)
        self.received = b""
        self.done: Deferred = Deferred()

    def connectionMade(self) -> None:
        for chunk in self._send:
            self.transport.write(chunk)

    def dataReceived(self, data: bytes) -> None:
        self.received += data

    def connectionLost(self, reason: Failure) -> None:
        self.done.callback(self.received)


@inlineCallbacks
def tls_exchange(reactor: Any, port: int, *chunks: bytes, timeout: float = WAIT) -> Any:
    """
    Connect to 127.0.0.1:C{port} over TLS (verifying the development CA and
    the IP address), write C{chunks}, then read until the server closes the
    connection.  Resolves to everything received.  For requests no HTTP
    client would send: a body that never comes, an oversized chunked body.
    Fails with L{TimeoutError} (the builtin) if the server has not closed
    within C{timeout} seconds.
    """
    endpoint = wrapClientTLS(
        optionsForClientTLS("127.0.0.1", trustRoot=Certificate.loadPEM(ca_pem())),
        TCP4ClientEndpoint(reactor, "127.0.0.1", port, timeout=timeout),
    )
    protocol = _Collect(chunks)
    yield connectProtocol(endpoint, protocol)
    timer = reactor.callLater(timeout, protocol.transport.abortConnection)
    received = yield protocol.done
    if not timer.active():
        raise TimeoutError(f"the server did not close the connection within {timeout}s; got {received[:200]!r}")
    timer.cancel()
    return received


def parse_raw_response(data: bytes) -> tuple[int, dict[bytes, bytes], bytes]:
    """
    Split a raw HTTP/1.1 response into C{(status, headers, body)}; header
    names are lower-cased.
    """
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, body


def wait_all(deferreds: Iterable[Deferred]) -> Deferred:
    """Fire when every Deferred has fired, with their results (or fail with the first failure)."""
    return DeferredList(list(deferreds), fireOnOneErrback=True, consumeErrors=True).addCallback(
        lambda results: [r for _, r in results]
    )


# ---------------------------------------------------------------- namespace sources


class FakeSource:
    """
    A namespace source whose cache knows only what a test puts in C{known};
    each fetch is a Deferred the test fires (in C{fetches}, with the name and
    timeout asked for).
    """

    count = 0

    def __init__(self, policy: Optional[str] = None) -> None:
        self.fetches: list[tuple[str, float, Deferred]] = []
        self.known: dict[str, NamespaceInfo] = {}
        self.policy = policy

    def cached(self, name: str) -> Any:
        return self.known.get(name, UNKNOWN)

    def fetch(self, name: str, timeout: float) -> Deferred:
        d: Deferred = Deferred()
        self.fetches.append((name, timeout, d))
        return d

    def readiness(self) -> tuple[bool, str]:
        return True, "fake"

    def cluster_failure_policy(self) -> Optional[str]:
        return self.policy
