"""
Harnesses for the endpoint client's tests (C{test_endpoint_*.py},
C{test_ssrf.py}).

Three kinds:

  - L{MemoryNet}: amp's real HTTP client on a L{MemoryReactorClock}, so
    connects, bytes on the wire and time are all in the test's hands
    (connect timeouts, retries, pooling, a hung endpoint measured on the
    clock).
  - L{ResourceConnector} with a L{Clock} as the client's reactor: a
    twisted.web resource answers in memory (L{Hung}, L{Switchable}) on
    connections wired to amp's own by C{twisted.test.iosim}.
  - Real loopback servers on 127.0.0.1 (L{LoopbackServer}: twisted.web or
    raw protocols, plain or TLS) whose factory counts accepted connections,
    for integration.
"""

from __future__ import annotations

import json
from typing import Any, Optional

from cryptography import x509
from OpenSSL import crypto
from twisted.internet import reactor
from twisted.internet.address import IPv4Address
from twisted.internet.defer import Deferred, inlineCallbacks, succeed
from twisted.internet.interfaces import IStreamClientEndpoint
from twisted.internet.ssl import Certificate, CertificateOptions, trustRootFromCertificates
from twisted.internet.testing import MemoryReactorClock, StringTransportWithDisconnection
from twisted.protocols.policies import ProtocolWrapper, WrappingFactory
from twisted.python.failure import Failure
from twisted.test import iosim
from twisted.trial.unittest import TestCase
from twisted.web.http import HTTPChannel
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Site
from zope.interface import implementer

from amp.breaker import BreakerRegistry
from amp.config import EndpointSettings
from amp.deadline import Deadline
from amp.endpoint import EndpointClient, EndpointFailure, EndpointRequest, deferred_call
from amp.metrics import Metrics
from amp.urls import parse_endpoint_url

PATCH = [{"op": "add", "path": "/metadata/labels", "value": {"team": "a"}}]
PATCH_BYTES = json.dumps(PATCH).encode()
HEADERS = {b"x-amp-namespace": b"team", b"x-amp-uid": b"u-1"}


def requests_total(metrics: Metrics, origin: str, outcome: str) -> float:
    value = metrics.registry.get_sample_value("amp_endpoint_requests_total", {"endpoint": origin, "outcome": outcome})
    return 0.0 if value is None else value


class Harness:
    """
    An L{EndpointClient} with its metrics and breakers, and the breaker
    transitions it reported.
    """

    def __init__(
        self,
        reactor_: Any,
        settings: Optional[EndpointSettings] = None,
        *,
        connector: Any = None,
        origin_settings: Optional[EndpointSettings] = None,
        **client: Any,
    ) -> None:
        self.reactor = reactor_
        self.settings = settings if settings is not None else EndpointSettings()
        self.metrics = Metrics()
        self.transitions: list[tuple[str, str]] = []
        self.breakers = BreakerRegistry(reactor_, lambda origin, state: self.transitions.append((origin, state)))
        self.root = origin_settings if origin_settings is not None else self.settings
        self.connector = connector
        self.client = EndpointClient(reactor_, self.metrics, self.breakers, connector=connector, **client)

    def call(
        self,
        url: str,
        settings: Optional[EndpointSettings] = None,
        budget: float = 10.0,
        body: bytes = b'{"kind":"Pod"}',
    ) -> Deferred:
        """
        Call C{url} with a deadline C{budget} seconds away through
        L{deferred_call}, which times the call as a review would: one timer
        for the call's own timeout and the deadline, the call cancelled
        when the deadline passes.
        """
        return deferred_call(self.client, self.request(url, settings, budget, body))

    def request(
        self,
        url: str,
        settings: Optional[EndpointSettings] = None,
        budget: float = 10.0,
        body: bytes = b'{"kind":"Pod"}',
    ) -> EndpointRequest:
        """The request L{call} makes."""
        return EndpointRequest(
            parse_endpoint_url(url),
            settings or self.settings,
            body,
            HEADERS,
            Deadline.after(self.reactor.seconds(), budget),
            self.root.breaker,
        )

    def start(self, url: str, settings: Optional[EndpointSettings] = None, budget: float = 10.0) -> tuple[Any, "Told"]:
        """
        Call C{url} through L{EndpointClient.call} with nobody waiting on
        it (no timer); returns the call and what it told.
        """
        told = Told()
        return self.client.call(self.request(url, settings, budget), told), told

    def count(self, url: str, outcome: str) -> float:
        return requests_total(self.metrics, parse_endpoint_url(url).origin, outcome)

    def breaker(self, url: str) -> Any:
        origin = parse_endpoint_url(url).origin
        return self.breakers.get(origin, self.settings.breaker)


class Told:
    """An L{amp.endpoint.ICallReceiver} that keeps what it was told."""

    def __init__(self) -> None:
        self.replies: list[Any] = []
        self.failures: list[Failure] = []
        self.starts = 0

    def replied(self, reply: Any) -> None:
        self.replies.append(reply)

    def failed(self, failure: Failure) -> None:
        self.failures.append(failure)

    def started(self) -> None:
        self.starts += 1


class FailureAssertions:
    """
    Mixin: assert that a Deferred failed with a named reason.
    """

    def assertReason(self, d: Deferred, reason: str) -> EndpointFailure:
        failure = self.failureResultOf(d, EndpointFailure)  # type: ignore[attr-defined]
        self.assertEqual(failure.value.reason, reason, failure.value.message)  # type: ignore[attr-defined]
        return failure.value

    @inlineCallbacks
    def assertFailsWith(self, d: Deferred, reason: str) -> Any:
        try:
            yield d
        except EndpointFailure as e:
            self.assertEqual(e.reason, reason, e.message)  # type: ignore[attr-defined]
            return e
        self.fail(f"call succeeded, expected {reason}")  # type: ignore[attr-defined]


# ---------------------------------------------------------------- in-memory network on a MemoryReactorClock


class NoAddresses:
    """
    A resolver that finds no address (a name that does not resolve).
    """

    class _Resolution:
        def __init__(self, name: str) -> None:
            self.name = name

        def cancel(self) -> None:
            pass

    def resolveHostName(
        self,
        receiver: Any,
        hostName: str,
        portNumber: int = 0,
        addressTypes: Any = None,
        transportSemantics: str = "TCP",
    ) -> Any:
        resolution = self._Resolution(hostName)
        receiver.resolutionBegan(resolution)
        receiver.resolutionComplete()
        return resolution


class ClientTransport(StringTransportWithDisconnection):
    """
    A connection's transport that reports the loss at once and remembers
    whether it was aborted.
    """

    aborted = False

    def abortConnection(self) -> None:
        self.aborted = True
        self.loseConnection()


class SlowCloseTransport(StringTransportWithDisconnection):
    """
    Closing takes a while, as on a real socket: C{loseConnection} only marks
    the transport as disconnecting; C{closed()} reports the loss.
    """

    def loseConnection(self) -> None:
        self.disconnecting = True

    def abortConnection(self) -> None:
        self.disconnecting = True

    def resumeProducing(self) -> None:
        # A closing socket ignores this; StringTransport would raise.
        if not self.disconnecting:
            super().resumeProducing()

    def closed(self) -> None:
        StringTransportWithDisconnection.loseConnection(self)


class MemoryNet:
    """
    amp's HTTP client on a L{MemoryReactorClock}: every connect attempt
    lands in C{reactor.tcpClients}; the test refuses it, times it out, or
    accepts it and writes the server's bytes.
    """

    def __init__(self) -> None:
        self.reactor = MemoryReactorClock()

    @property
    def attempts(self) -> int:
        return len(self.reactor.tcpClients)

    def connect_timeout(self, i: int = -1) -> float:
        return self.reactor.tcpClients[i][3]

    def fail(self, exc: Exception, i: int = -1) -> None:
        factory = self.reactor.tcpClients[i][2]
        factory.clientConnectionFailed(self.reactor.connectors[i], Failure(exc))

    def accept(self, i: int = -1, transport_class: type = ClientTransport) -> tuple[Any, Any]:
        """
        Complete connect attempt C{i}; returns the client's protocol (as the
        transport sees it) and the transport, whose C{value()} is what the
        client wrote.
        """
        host, port, factory = self.reactor.tcpClients[i][:3]
        proto = factory.buildProtocol(IPv4Address("TCP", host, port))
        transport = transport_class(
            hostAddress=IPv4Address("TCP", "127.0.0.1", 40000), peerAddress=IPv4Address("TCP", host, port)
        )
        transport.protocol = proto
        proto.makeConnection(transport)
        return proto, transport


def answered_once(
    reply: bytes, settings: Optional[EndpointSettings] = None, url: str = "http://127.0.0.1:8090/mutate"
) -> tuple[Harness, Deferred, Any, Any]:
    """
    One call through a new client on a new L{MemoryNet}, its connection
    accepted and C{reply} written into it; returns the harness, the call,
    and the connection's protocol and transport.
    """
    net = MemoryNet()
    h = Harness(net.reactor, settings)
    d = h.call(url)
    proto, transport = net.accept()
    proto.dataReceived(reply)
    return h, d, proto, transport


def http_reply(body: bytes, code: int = 200, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s" % (
        code,
        len(body),
        extra,
        body,
    )


# ---------------------------------------------------------------- in-memory resources


class _PumpedTransport(iosim.FakeTransport):
    """
    The client's end of an in-memory connection: what the client writes or
    closes reaches the server at once (and the server's answer comes back
    within), as over a socket with no latency.
    """

    pump: Any = None
    _pumping = False

    def _flush(self) -> None:
        if self._pumping or self.pump is None:
            return
        self._pumping = True
        try:
            self.pump.flush()
        finally:
            self._pumping = False

    def write(self, data: bytes) -> None:
        super().write(data)
        self._flush()

    def loseConnection(self) -> None:
        super().loseConnection()
        self._flush()

    def abortConnection(self) -> None:
        super().abortConnection()
        self._flush()


@implementer(IStreamClientEndpoint)
class _MemoryEndpoint:
    def __init__(self, connector: "ResourceConnector") -> None:
        self._connector = connector

    def connect(self, factory: Any) -> Deferred:
        c = self._connector
        server_address = IPv4Address("TCP", "127.0.0.1", 8090)
        client_address = IPv4Address("TCP", "127.0.0.1", 31337)
        client = factory.buildProtocol(server_address)
        server = c.site.buildProtocol(client_address)
        client_io = _PumpedTransport(client, isServer=False, hostAddress=client_address, peerAddress=server_address)
        server_io = iosim.FakeTransport(server, isServer=True, hostAddress=server_address, peerAddress=client_address)
        pump = iosim.connect(server, server_io, client, client_io, greet=False, clock=c.clock)
        client_io.pump = pump
        c.pumps.append(pump)
        return succeed(client)


class _OneRequestChannel(HTTPChannel):
    """
    A channel that answers one request and closes.
    """

    def checkPersistence(self, request: Any, version: bytes) -> bool:
        request.responseHeaders.setRawHeaders(b"connection", [b"close"])
        return False


class ResourceConnector:
    """
    The client's connector for a twisted.web C{resource} served in memory:
    every connection is a L{Site} channel wired to the client's own.  A
    resource that answers later (C{NOT_DONE_YET}) needs L{flush} to move its
    bytes.

    @param persistent: the server keeps connections open after a reply;
        by default it closes each after one, so that no pooled connection
        (nor its idle timer) outlives a test's call.
    """

    def __init__(self, resource: Resource, persistent: bool = False) -> None:
        self.clock = MemoryReactorClock()
        self.site = Site(resource, reactor=self.clock)
        if not persistent:
            self.site.protocol = _OneRequestChannel
        self.pumps: list[Any] = []

    def __call__(self, scheme: bytes, host: str, port: int) -> IStreamClientEndpoint:
        return _MemoryEndpoint(self)

    def flush(self) -> None:
        """
        Move what the servers wrote since; forget closed connections.
        """
        for pump in list(self.pumps):
            pump.flush()
            if pump.clientIO.disconnected and pump.serverIO.disconnected:
                self.pumps.remove(pump)


class Hung(Resource):
    """
    Never answers; remembers the requests it holds.
    """

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.held: list[Any] = []

    def render_POST(self, request: Any) -> Any:
        self.held.append(request)
        return NOT_DONE_YET

    def answer(self, body: bytes = b"[]") -> None:
        request = self.held.pop(0)
        request.setHeader(b"content-type", b"application/json")
        request.write(body)
        request.finish()


class Switchable(Resource):
    """
    Answers C{status} with C{body}; counts requests.
    """

    isLeaf = True

    def __init__(self, status: int = 200, body: bytes = b"[]") -> None:
        super().__init__()
        self.status = status
        self.body = body
        self.hits = 0

    def render_POST(self, request: Any) -> bytes:
        self.hits += 1
        request.setResponseCode(self.status)
        return self.body


# ---------------------------------------------------------------- loopback servers


class _Tracked(ProtocolWrapper):
    def connectionLost(self, reason: Any) -> None:
        super().connectionLost(reason)
        self.factory.gone(self)


class ConnectionCounter(WrappingFactory):
    """
    Wraps a server factory: counts accepted connections, knows which are
    open, and can wait until at most C{n} are.
    """

    protocol = _Tracked

    def __init__(self, wrapped: Any) -> None:
        super().__init__(wrapped)
        self.accepted = 0
        self.open: set[_Tracked] = set()
        self._waiters: list[tuple[int, Deferred]] = []

    def buildProtocol(self, addr: Any) -> Any:
        p = super().buildProtocol(addr)
        self.accepted += 1
        self.open.add(p)
        return p

    def gone(self, p: Any) -> None:
        self.open.discard(p)
        for n, d in list(self._waiters):
            if len(self.open) <= n:
                self._waiters.remove((n, d))
                d.callback(None)

    def until_open_at_most(self, n: int) -> Deferred:
        d: Deferred = Deferred()
        if len(self.open) <= n:
            d.callback(None)
        else:
            self._waiters.append((n, d))
        return d

    def close_all(self) -> Deferred:
        waiting = self.until_open_at_most(0)
        for p in list(self.open):
            p.transport.abortConnection()
        return waiting


class Endpoint(Resource):
    """
    A loopback endpoint server's resource: behaviour by path.
    """

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.hits: dict[bytes, int] = {}
        self.seen: list[tuple[bytes, Any, bytes]] = []
        self.held: list[Any] = []
        self.hold_until = 0
        self.stream_sent = 0
        self.stream_lost: Deferred = Deferred()

    def render_POST(self, request: Any) -> Any:
        path = request.path
        self.hits[path] = self.hits.get(path, 0) + 1
        self.seen.append((path, request.requestHeaders, request.content.read()))
        if path == b"/ok":
            return PATCH_BYTES
        if path == b"/empty-patch":
            return b"[]"
        if path == b"/hold":
            # Hold requests until hold_until of them are waiting, then answer all.
            self.held.append(request)
            if len(self.held) >= self.hold_until:
                held, self.held = self.held, []
                for r in held:
                    r.write(b"[]")
                    r.finish()
            return NOT_DONE_YET
        if path == b"/hang":
            self.held.append(request)
            return NOT_DONE_YET
        if path == b"/redirect":
            request.setResponseCode(302)
            request.setHeader(b"location", b"/ok")
            return b""
        if path.startswith(b"/status/"):
            request.setResponseCode(int(path.rsplit(b"/", 1)[1]))
            return b"error page"
        if path == b"/text":
            return b"<html>not json</html>"
        if path == b"/object":
            return b'{"patches": []}'
        if path == b"/huge-length":
            request.setHeader(b"content-length", b"10485760")
            request.write(b"[")
            self.held.append(request)
            return NOT_DONE_YET
        if path == b"/stream":
            self._stream(request)
            return NOT_DONE_YET
        request.setResponseCode(404)
        return b"no such path"

    def _stream(self, request: Any) -> None:
        finished = []
        request.notifyFinish().addBoth(lambda r: (finished.append(r), self.stream_lost.callback(r)))
        chunk = b" " * 4096

        def more() -> None:
            if finished or self.stream_sent >= 64 * 1024 * 1024:
                return
            request.write(chunk)
            self.stream_sent += len(chunk)
            reactor.callLater(0, more)

        request.write(b"[")
        more()

    def answer_held(self, body: bytes = b"[]") -> None:
        request = self.held.pop()
        request.write(body)
        request.finish()


class LoopbackServer:
    """
    A twisted.web site (or any factory) on 127.0.0.1 with connection counting.
    """

    def __init__(self, factory: Any, port: Any, scheme: str = "http") -> None:
        self.counter: ConnectionCounter = factory
        self.port = port
        self.scheme = scheme

    @classmethod
    def start(cls, testcase: TestCase, wrapped: Any, tls: Any = None) -> "LoopbackServer":
        counter = ConnectionCounter(wrapped)
        if tls is None:
            port = reactor.listenTCP(0, counter, interface="127.0.0.1")
        else:
            port = reactor.listenSSL(0, counter, tls, interface="127.0.0.1")
        server = cls(counter, port, "http" if tls is None else "https")
        testcase.addCleanup(server.stop)
        return server

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"{self.scheme}://{host}:{self.port.getHost().port}{path}"

    @property
    def accepted(self) -> int:
        return self.counter.accepted

    @inlineCallbacks
    def stop(self) -> Any:
        yield self.port.stopListening()
        yield self.counter.close_all()


class RealHarness(Harness):
    """
    A harness on the global reactor whose client is closed at cleanup.
    """

    def __init__(self, testcase: TestCase, settings: Optional[EndpointSettings] = None, **kw: Any) -> None:
        super().__init__(reactor, settings, **kw)
        testcase.addCleanup(self.client.close)


def tls_server_options(cert: x509.Certificate, key: Any, client_ca: Optional[x509.Certificate] = None) -> Any:
    """
    Server TLS options for a loopback endpoint, from C{cryptography} objects
    (pyOpenSSL's own objects are deprecated there); with C{client_ca}, a
    client certificate signed by it is required.
    """
    if client_ca is None:
        return CertificateOptions(privateKey=key, certificate=cert)
    trust = trustRootFromCertificates([Certificate(crypto.X509.from_cryptography(client_ca))])
    return CertificateOptions(privateKey=key, certificate=cert, trustRoot=trust)


def review_body(namespace: str = "team") -> bytes:
    return json.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "0df28fbd-5f5f-11e8-bc74-36e6bb280816",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "operation": "CREATE",
                "namespace": namespace,
                "name": "web",
                "object": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": "web", "labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "c", "image": "nginx"}]},
                },
            },
        }
    ).encode()
