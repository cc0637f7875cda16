"""
Tests for amp.endpoints: the pooled endpoint client, its limits, failure
names, breaker integration, retries, mTLS, shutdown, and shadow mode through
the Admitter.

Three kinds of harness:

  - L{MemoryNet}: Twisted's real HTTP client on a L{MemoryReactorClock}, so
    connects, bytes on the wire and time are all in the test's hands
    (connect timeouts, retries, a hung endpoint measured on the clock).
  - L{RequestTraversalAgent} (treq.testing) with a L{Clock} as the client's
    reactor: a twisted.web resource answers in memory.
  - Real loopback servers on 127.0.0.1 (twisted.web or raw protocols, plain
    or TLS with a test CA) whose factory counts accepted connections, for
    pooling, limits, resets, TLS and shutdown.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from typing import Any, Callable, Optional

from twisted.internet import defer, reactor
from twisted.internet import error as ierror
from twisted.internet.address import IPv4Address
from twisted.internet.defer import Deferred, inlineCallbacks
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.ssl import Certificate, PrivateCertificate
from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactorClock, StringTransportWithDisconnection
from twisted.protocols.policies import ProtocolWrapper, WrappingFactory
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase, TestCase
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Site
from treq.testing import RequestTraversalAgent

from amp import endpoints as endpoints_module
from amp.admission import Admitter
from amp.breaker import CLOSED, HALF_OPEN, OPEN, BreakerRegistry
from amp.config import BreakerConfig, EndpointSettings, parse_config
from amp.deadline import Deadline
from amp_dev.devcert import issue_cert, make_ca, pem_cert, pem_key
from amp.endpoints import OUTCOMES, REASONS, USER_AGENT, EndpointClient, EndpointFailure, OriginPool, classify
from amp.metrics import Metrics
from amp.namespaces import StaticNamespaceSource
from amp.reply import EndpointDecision
from amp.review import parse_review
from amp.urls import EndpointURL, parse_endpoint_url

PATCH = [{"op": "add", "path": "/metadata/labels", "value": {"team": "a"}}]
PATCH_BYTES = json.dumps(PATCH).encode()
HEADERS = {b"x-amp-namespace": b"team", b"x-amp-uid": b"u-1"}


# ---------------------------------------------------------------- helpers


def requests_total(metrics: Metrics, origin: str, outcome: str) -> float:
    value = metrics.registry.get_sample_value(
        "amp_endpoint_requests_total", {"endpoint": origin, "outcome": outcome})
    return 0.0 if value is None else value


class Harness:
    """
    An L{EndpointClient} with its metrics and breakers, and the breaker
    transitions it reported.
    """

    def __init__(
        self, reactor_: Any, settings: Optional[EndpointSettings] = None, *, agent: Any = None,
        origin_settings: Optional[EndpointSettings] = None,
    ) -> None:
        self.settings = settings if settings is not None else EndpointSettings()
        self.metrics = Metrics()
        self.transitions: list[tuple[str, str]] = []
        self.breakers = BreakerRegistry(reactor_, lambda origin, state: self.transitions.append((origin, state)))
        self.root = origin_settings if origin_settings is not None else self.settings
        self.reactor = reactor_
        self.client = EndpointClient(reactor_, self.metrics, self.breakers, agent=agent)

    def call(self, url: str, settings: Optional[EndpointSettings] = None, budget: float = 10.0,
             body: bytes = b'{"kind":"Pod"}') -> Deferred:
        """
        Call C{url} with a deadline C{budget} seconds away, which this
        harness enforces as a review would: by cancelling the call.
        """
        deadline = Deadline.after(self.reactor.seconds(), budget)
        d = self.client.call(parse_endpoint_url(url), settings or self.settings, body, HEADERS, deadline,
                             self.root.breaker)
        return d.addTimeout(budget, self.reactor)

    def count(self, url: str, outcome: str) -> float:
        return requests_total(self.metrics, parse_endpoint_url(url).origin, outcome)

    def breaker(self, url: str) -> Any:
        origin = parse_endpoint_url(url).origin
        return self.breakers.get(origin, self.settings.breaker)


class FailureAssertions:
    """
    Mixin: assert that a Deferred failed with a named reason, and that the
    metric for that reason moved.
    """

    def assertReason(self, d: Deferred, reason: str) -> EndpointFailure:
        failure = self.failureResultOf(d, EndpointFailure)  # type: ignore[attr-defined]
        self.assertEqual(failure.value.reason, reason)  # type: ignore[attr-defined]
        return failure.value

    @inlineCallbacks
    def assertFailsWith(self, d: Deferred, reason: str) -> Any:
        try:
            yield d
        except EndpointFailure as e:
            self.assertEqual(e.reason, reason, e.message)  # type: ignore[attr-defined]
            return e
        self.fail(f"call succeeded, expected {reason}")  # type: ignore[attr-defined]


# -------- in-memory network on a MemoryReactorClock


class NoAddresses:
    """
    A resolver that finds no address (a name that does not resolve).
    """

    class _Resolution:
        def __init__(self, name: str) -> None:
            self.name = name

        def cancel(self) -> None:
            pass

    def resolveHostName(self, receiver: Any, hostName: str, portNumber: int = 0,
                        addressTypes: Any = None, transportSemantics: str = "TCP") -> Any:
        resolution = self._Resolution(hostName)
        receiver.resolutionBegan(resolution)
        receiver.resolutionComplete()
        return resolution


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
    Twisted's HTTP client on a L{MemoryReactorClock}: every connect attempt
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

    def accept(self, i: int = -1, transport_class: type = StringTransportWithDisconnection) -> tuple[Any, Any]:
        host, port, factory = self.reactor.tcpClients[i][:3]
        proto = factory.buildProtocol(IPv4Address("TCP", host, port))
        transport = transport_class(
            hostAddress=IPv4Address("TCP", "127.0.0.1", 40000), peerAddress=IPv4Address("TCP", host, port))
        transport.protocol = proto
        proto.makeConnection(transport)
        return proto, transport


def http_reply(body: bytes, code: int = 200, extra: bytes = b"") -> bytes:
    return (b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s"
            % (code, len(body), extra, body))


# -------- in-memory resources


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


# -------- loopback servers


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


# ---------------------------------------------------------------- every reason is tested


class ReasonCoverageTests(SynchronousTestCase):
    #: reason -> the test that provokes it (through EndpointClient.call and
    #: the metric).
    TESTS = {
        "timeout": "ClockTimeoutTests.test_hung_endpoint_times_out_exactly_at_the_budget",
        "connection-refused": "LoopbackFailureTests.test_refused",
        "connection-reset": "LoopbackFailureTests.test_reset_mid_reply",
        "connection-failed": "MemoryNetTests.test_name_that_does_not_resolve",
        "denied-address": "MemoryNetTests.test_name_resolving_into_deny_networks",
        "tls-error": "MutualTLSTests.test_wrong_ca_is_a_tls_error",
        "redirect": "LoopbackFailureTests.test_redirect_is_not_followed",
        "http-4xx": "LoopbackFailureTests.test_http_4xx",
        "http-5xx": "LoopbackFailureTests.test_http_5xx",
        "response-too-large": "LoopbackFailureTests.test_content_length_over_the_limit_fails_fast",
        "invalid-json": "LoopbackFailureTests.test_non_json",
        "invalid-reply": "LoopbackFailureTests.test_json_of_the_wrong_shape",
        "breaker-open": "LoopbackFailureTests.test_breaker_open_makes_no_network_call",
        "concurrency-limit": "BulkheadTests.test_calls_over_max_concurrent_fail_fast",
    }

    def test_every_reason_has_a_test(self) -> None:
        self.assertEqual(set(self.TESTS), set(REASONS))
        for reason, name in self.TESTS.items():
            cls, method = name.split(".")
            self.assertTrue(callable(getattr(globals()[cls], method, None)), f"{reason}: {name} is missing")

    def test_outcomes_are_ok_reasons_and_cancelled(self) -> None:
        self.assertEqual(OUTCOMES, ("ok",) + REASONS + ("cancelled",))


# ---------------------------------------------------------------- pool (unit, Clock)


class _FakeConnection:
    def __init__(self) -> None:
        self.state = "QUIESCENT"
        self.closed = False
        self.transport = self

    def loseConnection(self) -> None:
        self.closed = True


class _Profile:
    def __init__(self, settings: EndpointSettings) -> None:
        self.settings = settings


class OriginPoolTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.pool = OriginPool(self.clock)
        self.key = (b"http", b"127.0.0.1", 8080, _Profile(EndpointSettings(pool_size=2, idle_timeout=30.0)))

    def test_idle_connection_closes_after_idle_timeout(self) -> None:
        c = _FakeConnection()
        self.pool._putConnection(self.key, c)
        self.clock.advance(29.999)
        self.assertFalse(c.closed)
        self.assertEqual(self.pool.idle_connections(), 1)
        self.clock.advance(0.001)
        self.assertTrue(c.closed)
        self.assertEqual(self.pool.idle_connections(), 0)

    def test_keeps_at_most_pool_size_idle_connections(self) -> None:
        conns = [_FakeConnection() for _ in range(3)]
        for c in conns:
            self.pool._putConnection(self.key, c)
        self.assertEqual([c.closed for c in conns], [True, False, False])
        self.assertEqual(self.pool.idle_connections(), 2)

    def test_reuses_the_most_recently_used_connection_first(self) -> None:
        a, b = _FakeConnection(), _FakeConnection()
        self.pool._putConnection(self.key, a)
        self.clock.advance(10)
        self.pool._putConnection(self.key, b)
        got = self.successResultOf(self.pool.getConnection(self.key, None))
        self.assertIs(got, b)
        # The older one still times out on its own schedule.
        self.clock.advance(20)
        self.assertTrue(a.closed)

    def test_dead_idle_connections_do_not_take_slots(self) -> None:
        a, b, c = _FakeConnection(), _FakeConnection(), _FakeConnection()
        self.pool._putConnection(self.key, a)
        self.pool._putConnection(self.key, b)
        a.state = "CONNECTION_LOST"
        self.pool._putConnection(self.key, c)
        self.assertFalse(b.closed)
        self.assertEqual(self.pool.idle_connections(), 2)

    def test_limits_are_per_settings(self) -> None:
        other = (b"http", b"127.0.0.1", 8080, _Profile(EndpointSettings(pool_size=1, idle_timeout=1.0)))
        a, b = _FakeConnection(), _FakeConnection()
        self.pool._putConnection(other, a)
        self.pool._putConnection(other, b)
        self.assertTrue(a.closed)
        self.clock.advance(1.0)
        self.assertTrue(b.closed)

    def test_closing_pool_keeps_nothing(self) -> None:
        self.pool.closing = True
        c = _FakeConnection()
        self.pool._putConnection(self.key, c)
        self.assertTrue(c.closed)
        self.assertEqual(self.pool.idle_connections(), 0)


# ---------------------------------------------------------------- pool over loopback


class PoolTests(TestCase):
    timeout = 15

    def setUp(self) -> None:
        self.resource = Endpoint()
        self.server = LoopbackServer.start(self, Site(self.resource))

    @inlineCallbacks
    def test_sequential_calls_reuse_one_connection(self) -> Any:
        h = RealHarness(self)
        url = self.server.url("/ok")
        for _ in range(5):
            decision = yield h.call(url)
            self.assertEqual(decision.patch, PATCH)
        self.assertEqual(self.server.accepted, 1)
        self.assertEqual(h.client.pool.connections_opened, 1)
        self.assertEqual(h.count(url, "ok"), 5)

    @inlineCallbacks
    def test_equal_settings_share_connections(self) -> Any:
        # A fresh but equal settings object per call (as a config reload
        # would make) must not defeat pooling.
        h = RealHarness(self)
        for _ in range(3):
            yield h.call(self.server.url("/ok"), settings=EndpointSettings())
        self.assertEqual(self.server.accepted, 1)

    @inlineCallbacks
    def test_concurrent_calls_keep_pool_size_connections(self) -> Any:
        h = RealHarness(self, EndpointSettings(pool_size=2))
        self.resource.hold_until = 4
        url = self.server.url("/hold")
        yield defer.gatherResults([h.call(url) for _ in range(4)])
        self.assertEqual(self.server.accepted, 4)
        self.assertEqual(h.client.pool.idle_connections(), 2)
        # The two it did not keep are closed.
        yield self.server.counter.until_open_at_most(2)
        self.assertEqual(h.client.pool.open_connections(), 2)
        # And the kept ones serve the next calls.
        self.resource.hold_until = 1
        yield h.call(url)
        yield h.call(url)
        self.assertEqual(self.server.accepted, 4)

    @inlineCallbacks
    def test_idle_connection_closes_after_idle_timeout(self) -> Any:
        h = RealHarness(self, EndpointSettings(idle_timeout=0.05))
        started = reactor.seconds()
        yield h.call(self.server.url("/ok"))
        self.assertEqual(len(self.server.counter.open), 1)
        yield self.server.counter.until_open_at_most(0)
        self.assertGreaterEqual(reactor.seconds() - started, 0.05)
        self.assertEqual(h.client.pool.open_connections(), 0)

    @inlineCallbacks
    def test_close_closes_cached_connections(self) -> Any:
        h = RealHarness(self, EndpointSettings(pool_size=3))
        self.resource.hold_until = 3
        yield defer.gatherResults([h.call(self.server.url("/hold")) for _ in range(3)])
        self.assertEqual(len(self.server.counter.open), 3)
        yield h.client.close()
        self.assertEqual(h.client.pool.open_connections(), 0)
        yield self.server.counter.until_open_at_most(0)

    @inlineCallbacks
    def test_close_waits_for_calls_in_flight(self) -> Any:
        h = RealHarness(self)
        yield h.call(self.server.url("/ok"))
        call = h.call(self.server.url("/hang"))
        yield self._until(lambda: self.resource.held)
        closed = h.client.close()
        self.assertNoResult(closed)
        request = self.resource.held.pop()
        request.write(b"[]")
        request.finish()
        decision = yield call
        self.assertEqual(decision.patch, [])
        yield closed
        self.assertEqual(h.client.pool.open_connections(), 0)
        yield self.server.counter.until_open_at_most(0)

    @inlineCallbacks
    def test_calls_after_close_work_and_keep_nothing(self) -> Any:
        h = RealHarness(self)
        yield h.client.close()
        decision = yield h.call(self.server.url("/ok"))
        self.assertEqual(decision.patch, PATCH)
        yield self.server.counter.until_open_at_most(0)
        self.assertEqual(h.client.pool.idle_connections(), 0)

    @inlineCallbacks
    def test_one_connect_endpoint_per_host(self) -> Any:
        built = []
        real = endpoints_module.TCP4ClientEndpoint

        def counting(*a: Any, **kw: Any) -> Any:
            built.append(a)
            return real(*a, **kw)

        self.patch(endpoints_module, "TCP4ClientEndpoint", counting)
        h = RealHarness(self, EndpointSettings(pool_size=1))
        self.resource.hold_until = 2
        # Two concurrent calls open two connections through one endpoint.
        yield defer.gatherResults([h.call(self.server.url("/hold")) for _ in range(2)])
        self.resource.hold_until = 1
        for _ in range(3):
            yield h.call(self.server.url("/hold"))
        self.assertEqual(self.server.accepted, 2)
        self.assertEqual(len(built), 1)

    def _until(self, predicate: Callable[[], Any]) -> Deferred:
        """
        Fire once C{predicate()} is true (checked every reactor turn; the
        test's timeout bounds it).
        """
        d: Deferred = Deferred()

        def check() -> None:
            if predicate():
                d.callback(None)
            else:
                reactor.callLater(0.001, check)

        check()
        return d


# ---------------------------------------------------------------- what goes on the wire


class WireTests(TestCase, FailureAssertions):
    timeout = 15

    def setUp(self) -> None:
        self.resource = Endpoint()
        self.server = LoopbackServer.start(self, Site(self.resource))

    @inlineCallbacks
    def test_post_carries_the_pod_and_the_amp_headers(self) -> Any:
        h = RealHarness(self)
        yield h.call(self.server.url("/ok?x=1"), body=b'{"kind":"Pod"}')
        path, headers, body = self.resource.seen[0]
        self.assertEqual(path, b"/ok")
        self.assertEqual(body, b'{"kind":"Pod"}')
        self.assertEqual(headers.getRawHeaders(b"content-type"), [b"application/json"])
        self.assertEqual(headers.getRawHeaders(b"user-agent"), [USER_AGENT])
        self.assertEqual(headers.getRawHeaders(b"x-amp-namespace"), [b"team"])
        self.assertEqual(headers.getRawHeaders(b"x-amp-uid"), [b"u-1"])
        self.assertEqual(headers.getRawHeaders(b"host"), [f"127.0.0.1:{self.server.port.getHost().port}".encode()])

    @inlineCallbacks
    def test_non_ascii_url_never_escapes_as_an_exception(self) -> Any:
        # parse_endpoint_url refuses non-ASCII; a URL built some other way
        # still gets a named failure or a percent-encoded path, never an
        # exception that would strand its breaker ticket.
        h = RealHarness(self, EndpointSettings(breaker=BreakerConfig(half_open_requests=1)))
        port = self.server.port.getHost().port
        path = EndpointURL(f"http://127.0.0.1:{port}/caf\u00e9", "http", "127.0.0.1", port, "/caf\u00e9")
        host = EndpointURL(f"http://caf\u00e9:{port}/ok", "http", "caf\u00e9", port, "/ok")
        with self.assertRaises(EndpointFailure) as e:
            yield h.client.call(path, h.settings, b"{}", {}, Deadline.after(h.reactor.seconds(), 5.0))
        self.assertEqual(e.exception.reason, "http-4xx")
        self.assertEqual(self.resource.seen[0][0], b"/caf%C3%A9")
        with self.assertRaises(EndpointFailure) as e:
            yield h.client.call(host, h.settings, b"{}", {}, Deadline.after(h.reactor.seconds(), 5.0))
        self.assertEqual(e.exception.reason, "connection-failed")
        self.assertEqual(h.client.in_flight(path.origin), 0)
        self.assertEqual(h.client.in_flight(host.origin), 0)


# ---------------------------------------------------------------- named failures over loopback


class HalfReply(Protocol):
    """
    Writes half a response, then resets the connection.
    """

    def dataReceived(self, data: bytes) -> None:
        if getattr(self, "_answered", False):
            return
        self._answered = True
        self.transport.write(b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n[{"op"')
        reactor.callLater(0, self.transport.abortConnection)


class LoopbackFailureTests(TestCase, FailureAssertions):
    timeout = 15

    def setUp(self) -> None:
        self.resource = Endpoint()
        self.server = LoopbackServer.start(self, Site(self.resource))

    @inlineCallbacks
    def test_content_length_over_the_limit_fails_fast(self) -> Any:
        h = RealHarness(self, EndpointSettings(max_response=1024))
        url = self.server.url("/huge-length")
        e = yield self.assertFailsWith(h.call(url), "response-too-large")
        self.assertIn("10485760", e.message)
        # Failed on the headers: the server is still holding the body.
        self.assertEqual(len(self.resource.held), 1)
        self.assertEqual(h.count(url, "response-too-large"), 1)
        # The connection is closed, not kept with a body in flight.
        yield self.server.counter.until_open_at_most(0)
        self.assertEqual(h.client.pool.idle_connections(), 0)

    @inlineCallbacks
    def test_chunked_body_over_the_limit_aborts_mid_stream(self) -> Any:
        h = RealHarness(self, EndpointSettings(max_response=64 * 1024))
        url = self.server.url("/stream")
        yield self.assertFailsWith(h.call(url), "response-too-large")
        self.assertEqual(h.count(url, "response-too-large"), 1)
        # The server learns the connection is gone well before its 64 MiB cap.
        yield self.assertFailure(self.resource.stream_lost, Exception)
        self.assertLess(self.resource.stream_sent, 16 * 1024 * 1024)

    @inlineCallbacks
    def test_redirect_is_not_followed(self) -> Any:
        h = RealHarness(self)
        url = self.server.url("/redirect")
        e = yield self.assertFailsWith(h.call(url), "redirect")
        self.assertIn("302", e.message)
        self.assertIn("/ok", e.message)
        self.assertEqual(self.resource.hits.get(b"/ok", 0), 0)
        self.assertEqual(h.count(url, "redirect"), 1)

    @inlineCallbacks
    def test_http_4xx(self) -> Any:
        h = RealHarness(self)
        url = self.server.url("/status/404")
        e = yield self.assertFailsWith(h.call(url), "http-4xx")
        self.assertIn("404", e.message)
        self.assertEqual(h.count(url, "http-4xx"), 1)

    @inlineCallbacks
    def test_http_5xx(self) -> Any:
        h = RealHarness(self)
        url = self.server.url("/status/503")
        e = yield self.assertFailsWith(h.call(url), "http-5xx")
        self.assertIn("503", e.message)
        self.assertEqual(h.count(url, "http-5xx"), 1)

    @inlineCallbacks
    def test_error_reply_is_not_read_and_its_connection_is_closed(self) -> Any:
        h = RealHarness(self)
        yield self.assertFailsWith(h.call(self.server.url("/status/503")), "http-5xx")
        yield self.server.counter.until_open_at_most(0)
        self.assertEqual(h.client.pool.idle_connections(), 0)
        decision = yield h.call(self.server.url("/ok"))
        self.assertEqual(decision.patch, PATCH)
        self.assertEqual(self.server.accepted, 2)

    @inlineCallbacks
    def test_non_json(self) -> Any:
        h = RealHarness(self)
        url = self.server.url("/text")
        yield self.assertFailsWith(h.call(url), "invalid-json")
        self.assertEqual(h.count(url, "invalid-json"), 1)

    @inlineCallbacks
    def test_json_of_the_wrong_shape(self) -> Any:
        h = RealHarness(self)
        url = self.server.url("/object")
        e = yield self.assertFailsWith(h.call(url), "invalid-reply")
        self.assertIn("patches", e.message)
        self.assertEqual(h.count(url, "invalid-reply"), 1)

    @inlineCallbacks
    def test_refused(self) -> Any:
        port = reactor.listenTCP(0, Factory.forProtocol(Protocol), interface="127.0.0.1")
        number = port.getHost().port
        yield port.stopListening()
        h = RealHarness(self)
        url = f"http://127.0.0.1:{number}/mutate"
        yield self.assertFailsWith(h.call(url), "connection-refused")
        self.assertEqual(h.count(url, "connection-refused"), 1)

    @inlineCallbacks
    def test_reset_mid_reply(self) -> Any:
        server = LoopbackServer.start(self, Factory.forProtocol(HalfReply))
        h = RealHarness(self)
        url = server.url("/mutate")
        yield self.assertFailsWith(h.call(url), "connection-reset")
        self.assertEqual(h.count(url, "connection-reset"), 1)

    @inlineCallbacks
    def test_hung_endpoint_times_out_and_its_connection_is_closed(self) -> Any:
        h = RealHarness(self, EndpointSettings(timeout=0.05))
        url = self.server.url("/hang")
        started = reactor.seconds()
        yield self.assertFailsWith(h.call(url), "timeout")
        self.assertGreaterEqual(reactor.seconds() - started, 0.05)
        self.assertEqual(h.count(url, "timeout"), 1)
        yield self.server.counter.until_open_at_most(0)
        self.assertEqual(h.client.in_flight(parse_endpoint_url(url).origin), 0)

    @inlineCallbacks
    def test_breaker_open_makes_no_network_call(self) -> Any:
        settings = EndpointSettings(breaker=BreakerConfig(consecutive_failures=3))
        h = RealHarness(self, settings)
        url = self.server.url("/status/500")
        for _ in range(3):
            yield self.assertFailsWith(h.call(url), "http-5xx")
        accepted, hits = self.server.accepted, self.resource.hits[b"/status/500"]
        e = yield self.assertFailsWith(h.call(url), "breaker-open")
        self.assertIn("breaker open", e.message)
        self.assertEqual((self.server.accepted, self.resource.hits[b"/status/500"]), (accepted, hits))
        self.assertEqual(h.count(url, "breaker-open"), 1)
        self.assertEqual(h.transitions, [(parse_endpoint_url(url).origin, OPEN)])


# ---------------------------------------------------------------- MemoryNet: connects, retries, timing


class MemoryNetTests(SynchronousTestCase, FailureAssertions):
    URL = "http://127.0.0.1:8090/mutate"

    def setUp(self) -> None:
        self.net = MemoryNet()

    def harness(self, **kw: Any) -> Harness:
        return Harness(self.net.reactor, EndpointSettings(**kw))

    def test_connect_timeout_reaches_the_connect(self) -> None:
        h = self.harness(connect_timeout=0.25)
        d = h.call(self.URL)
        self.assertEqual(self.net.connect_timeout(), 0.25)
        self.net.fail(ierror.TimeoutError())
        e = self.assertReason(d, "timeout")
        self.assertIn("connect", e.message)
        self.assertEqual(h.count(self.URL, "timeout"), 1)

    def test_refused_is_reported_at_once(self) -> None:
        # No waiting on HostnameEndpoint's 0.3s attempt beat: an IP literal
        # fails as soon as the connect does ...
        h = self.harness()
        d = h.call(self.URL)
        self.net.fail(ierror.ConnectionRefusedError())
        self.assertReason(d, "connection-refused")
        # ... and a host name within amp's 50ms beat.
        d = h.call("http://endpoint.test:8090/mutate")
        self.net.fail(ierror.ConnectionRefusedError())
        self.assertNoResult(d)
        self.net.reactor.advance(0.05)
        self.assertReason(d, "connection-refused")

    def test_name_that_does_not_resolve(self) -> None:
        self.net.reactor.nameResolver = NoAddresses()
        h = self.harness()
        url = "http://amp-test.invalid:8090/mutate"
        d = h.call(url)
        self.assertEqual(self.net.attempts, 0)
        e = self.assertReason(d, "connection-failed")
        self.assertIn("resolve", e.message)
        self.assertEqual(h.count(url, "connection-failed"), 1)

    def test_name_resolving_into_deny_networks(self) -> None:
        # The memory reactor resolves every name to 127.0.0.1.  More on
        # denied addresses in test_ssrf.py.
        settings = EndpointSettings(deny_networks=parse_config(
            {"endpoints": {"deny_networks": ["loopback"]}}).endpoints.deny_networks,
            breaker=BreakerConfig(consecutive_failures=1))
        h = Harness(self.net.reactor, settings)
        url = "http://endpoint.test:8090/mutate"
        e = self.assertReason(h.call(url), "denied-address")
        self.assertIn("127.0.0.1", e.message)
        self.assertEqual(self.net.attempts, 0)
        self.assertEqual(h.count(url, "denied-address"), 1)
        self.assertEqual(h.breaker(url).state, CLOSED)

    def test_other_connect_error_is_connection_failed(self) -> None:
        h = self.harness()
        d = h.call(self.URL)
        self.net.fail(ierror.NoRouteError())
        self.assertReason(d, "connection-failed")

    def test_answer_through_the_pool(self) -> None:
        h = self.harness()
        d = h.call(self.URL)
        proto, transport = self.net.accept()
        self.assertTrue(transport.value().startswith(b"POST /mutate HTTP/1.1\r\n"))
        proto.dataReceived(http_reply(PATCH_BYTES))
        self.assertEqual(self.successResultOf(d).patch, PATCH)
        # The second call rides the same connection: no new connect.
        transport.clear()
        d2 = h.call(self.URL)
        self.assertEqual(self.net.attempts, 1)
        proto.dataReceived(http_reply(b"[]"))
        self.assertEqual(self.successResultOf(d2).patch, [])

    def test_idle_connection_closes_after_idle_timeout(self) -> None:
        h = self.harness(idle_timeout=30.0)
        d = h.call(self.URL)
        proto, transport = self.net.accept()
        proto.dataReceived(http_reply(b"[]"))
        self.successResultOf(d)
        self.assertEqual(h.client.pool.idle_connections(), 1)
        self.net.reactor.advance(29.999)
        self.assertTrue(transport.connected)
        self.net.reactor.advance(0.001)
        self.assertFalse(transport.connected)
        self.assertEqual((h.client.pool.idle_connections(), h.client.pool.open_connections()), (0, 0))

    def test_close_closes_idle_connections(self) -> None:
        h = self.harness()
        d = h.call(self.URL)
        proto, transport = self.net.accept()
        proto.dataReceived(http_reply(b"[]"))
        self.successResultOf(d)
        self.successResultOf(h.client.close())
        self.assertFalse(transport.connected)
        self.assertEqual(h.client.pool.open_connections(), 0)
        self.assertEqual(self.net.reactor.getDelayedCalls(), [])

    def test_a_connection_amp_is_closing_is_not_reused(self) -> None:
        # A 5xx reply whose connection amp closes, while the close is still
        # under way: the next call must not be handed that connection.
        h = self.harness()
        d = h.call(self.URL)
        proto, transport = self.net.accept(transport_class=SlowCloseTransport)
        proto.dataReceived(http_reply(b"error page", 503))
        self.assertReason(d, "http-5xx")
        self.assertTrue(transport.disconnecting)
        transport.clear()
        h.call(self.URL)
        self.assertEqual(self.net.attempts, 2)
        self.assertEqual(transport.value(), b"")
        transport.closed()
        self.assertEqual(h.client.pool.open_connections(), 0)

    def test_close_waits_for_a_call_still_connecting(self) -> None:
        h = self.harness()
        d = h.call(self.URL)
        closed = h.client.close()
        self.assertNoResult(closed)
        proto, transport = self.net.accept()
        proto.dataReceived(http_reply(b"[]"))
        self.successResultOf(d)
        self.successResultOf(closed)
        self.assertFalse(transport.connected)

    def test_idle_connection_closed_by_the_endpoint_leaves_the_pool(self) -> None:
        h = self.harness()
        d = h.call(self.URL)
        proto, transport = self.net.accept()
        proto.dataReceived(http_reply(b"[]"))
        self.successResultOf(d)
        transport.loseConnection()
        self.assertEqual(h.client.pool.idle_connections(), 0)
        # The next call connects afresh instead of failing on the dead one.
        h.call(self.URL)
        self.assertEqual(self.net.attempts, 2)

    def test_a_request_that_cannot_be_built_hands_its_ticket_back(self) -> None:
        settings = EndpointSettings(breaker=BreakerConfig(consecutive_failures=1, half_open_requests=1))
        h = Harness(self.net.reactor, settings)
        d = h.call(self.URL)
        self.net.fail(ierror.ConnectionRefusedError())
        self.assertReason(d, "connection-refused")
        self.net.reactor.advance(settings.breaker.cooldown)
        not_bytes: Any = {b"x-bad": 5}
        bad = h.client.call(parse_endpoint_url(self.URL), settings, b"{}", not_bytes,
                            Deadline.after(h.reactor.seconds(), 5.0))
        self.assertReason(bad, "connection-failed")
        self.assertEqual(len(self.flushLoggedErrors()), 1)
        # The half-open trial slot is free again: the next call goes out.
        h.call(self.URL)
        self.assertEqual(self.net.attempts, 2)

    def test_hung_endpoint_times_out_exactly_at_the_budget(self) -> None:
        h = self.harness(timeout=5.0)
        d = h.call(self.URL, budget=2.0)
        proto, transport = self.net.accept()
        self.net.reactor.advance(1.999)
        self.assertNoResult(d)
        self.net.reactor.advance(0.001)
        e = self.assertReason(d, "timeout")
        self.assertIn("2s", e.message)
        self.assertFalse(transport.connected)
        self.assertEqual(h.client.pool.idle_connections(), 0)

    def test_endpoint_timeout_applies_when_shorter_than_the_budget(self) -> None:
        h = self.harness(timeout=1.0)
        d = h.call(self.URL, budget=9.5)
        self.net.accept()
        self.net.reactor.advance(0.999)
        self.assertNoResult(d)
        self.net.reactor.advance(0.001)
        self.assertReason(d, "timeout")

    def test_no_time_left_fails_without_a_connect(self) -> None:
        h = self.harness()
        self.assertReason(h.call(self.URL, budget=0.0), "timeout")
        self.assertEqual(self.net.attempts, 0)
        self.assertEqual(h.breaker(self.URL).state, CLOSED)

    # -------- retries

    def test_no_retry_by_default(self) -> None:
        h = self.harness()
        d = h.call(self.URL)
        self.net.fail(ierror.ConnectionRefusedError())
        self.assertReason(d, "connection-refused")
        self.assertEqual(self.net.attempts, 1)

    def test_retry_once_after_refused(self) -> None:
        h = self.harness(retry=True)
        d = h.call(self.URL)
        self.net.fail(ierror.ConnectionRefusedError())
        self.assertEqual(self.net.attempts, 2)
        proto, _ = self.net.accept()
        proto.dataReceived(http_reply(b"[]"))
        self.assertEqual(self.successResultOf(d).patch, [])
        self.assertEqual(h.count(self.URL, "ok"), 1)
        self.assertEqual(h.count(self.URL, "connection-refused"), 0)
        self.flushLoggedErrors()

    def test_retry_at_most_once(self) -> None:
        h = self.harness(retry=True)
        d = h.call(self.URL)
        self.net.fail(ierror.ConnectionRefusedError())
        self.net.fail(ierror.ConnectionRefusedError())
        self.assertReason(d, "connection-refused")
        self.assertEqual(self.net.attempts, 2)

    def test_no_retry_after_a_connect_timeout(self) -> None:
        h = self.harness(retry=True)
        d = h.call(self.URL)
        self.net.fail(ierror.TimeoutError())
        self.assertReason(d, "timeout")
        self.assertEqual(self.net.attempts, 1)

    def test_no_retry_after_the_call_timed_out(self) -> None:
        h = self.harness(retry=True, timeout=1.0)
        d = h.call(self.URL)
        self.net.reactor.advance(1.0)
        self.assertReason(d, "timeout")
        self.assertEqual(self.net.attempts, 1)

    def test_no_retry_once_the_reply_started(self) -> None:
        h = self.harness(retry=True)
        d = h.call(self.URL)
        proto, transport = self.net.accept()
        proto.dataReceived(b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n[")
        transport.loseConnection()
        self.assertReason(d, "connection-reset")
        self.assertEqual(self.net.attempts, 1)

    def test_no_retry_when_the_request_was_sent(self) -> None:
        h = self.harness(retry=True)
        d = h.call(self.URL)
        proto, transport = self.net.accept()
        self.assertIn(b"POST", transport.value())
        transport.loseConnection()
        self.assertReason(d, "connection-reset")
        self.assertEqual(self.net.attempts, 1)

    def test_no_retry_without_time_left(self) -> None:
        h = self.harness(retry=True, timeout=2.0)
        d = h.call(self.URL)
        self.net.reactor.advance(1.5)
        self.net.fail(ierror.ConnectionRefusedError())
        self.assertReason(d, "connection-refused")
        self.assertEqual(self.net.attempts, 1)


# ---------------------------------------------------------------- Clock + in-memory resources


class ClockTimeoutTests(SynchronousTestCase, FailureAssertions):
    def test_hung_endpoint_times_out_exactly_at_the_budget(self) -> None:
        clock = Clock()
        hung = Hung()
        h = Harness(clock, EndpointSettings(timeout=5.0), agent=RequestTraversalAgent(hung))
        url = "http://127.0.0.1:8090/hang"
        d = h.call(url, budget=1.5)
        self.assertEqual(len(hung.held), 1)
        clock.advance(1.499)
        self.assertNoResult(d)
        clock.advance(0.001)
        self.assertReason(d, "timeout")
        self.assertEqual(h.count(url, "timeout"), 1)
        self.assertEqual(
            h.metrics.registry.get_sample_value(
                "amp_endpoint_duration_seconds_sum", {"endpoint": "http://127.0.0.1:8090"}), 1.5)

    def test_issue_override_shape(self) -> None:
        config = parse_config({"endpoints": {
            "allow": ["http://127.0.0.1:*/*"],
            "timeout": "5s",
            "overrides": [
                {"match": "http://127.0.0.1:8090/hang*", "timeout": "1s"},
                {"match": "http://127.0.0.1:8090/*", "timeout": "3s"},
            ],
        }})
        endpoints = config.endpoints
        hang = parse_endpoint_url("http://127.0.0.1:8090/hang-forever")
        other = parse_endpoint_url("http://127.0.0.1:8090/slow")
        elsewhere = parse_endpoint_url("http://127.0.0.1:8091/hang")
        # First matching override wins.
        self.assertEqual(endpoints.settings_for(hang).timeout, 1.0)
        self.assertEqual(endpoints.settings_for(other).timeout, 3.0)
        self.assertEqual(endpoints.settings_for(elsewhere).timeout, 5.0)

        clock = Clock()
        hung = Hung()
        metrics = Metrics()
        client = EndpointClient(clock, metrics, BreakerRegistry(clock), agent=RequestTraversalAgent(hung))
        deadline = Deadline.after(clock.seconds(), 9.5)
        calls = {u: client.call(u, endpoints.settings_for(u), b"{}", {}, deadline) for u in (hang, other, elsewhere)}
        clock.advance(1.0)
        self.assertReason(calls[hang], "timeout")
        self.assertNoResult(calls[other])
        clock.advance(2.0)
        self.assertReason(calls[other], "timeout")
        self.assertNoResult(calls[elsewhere])
        clock.advance(2.0)
        self.assertReason(calls[elsewhere], "timeout")

    def test_caller_cancel_ends_the_call(self) -> None:
        clock = Clock()
        hung = Hung()
        h = Harness(clock, agent=RequestTraversalAgent(hung))
        url = "http://127.0.0.1:8090/hang"
        d = h.call(url)
        d.cancel()
        self.failureResultOf(d, defer.CancelledError)
        self.assertEqual(h.count(url, "cancelled"), 1)
        self.assertEqual(h.client.in_flight("http://127.0.0.1:8090"), 0)
        self.assertEqual(clock.getDelayedCalls(), [])


class BulkheadTests(SynchronousTestCase, FailureAssertions):
    def test_calls_over_max_concurrent_fail_fast(self) -> None:
        clock = Clock()
        hung = Hung()
        agent = RequestTraversalAgent(hung)
        h = Harness(clock, EndpointSettings(max_concurrent=2), agent=agent)
        url = "http://127.0.0.1:8090/hang"
        first, second = h.call(url), h.call(url)
        e = self.assertReason(h.call(url), "concurrency-limit")
        self.assertIn("2 calls", e.message)
        self.assertEqual(len(hung.held), 2)
        self.assertEqual(h.count(url, "concurrency-limit"), 1)
        self.assertEqual(h.breaker(url).state, CLOSED)
        # A slot frees when a call ends.
        hung.answer()
        agent.flush()
        self.assertEqual(self.successResultOf(first).patch, [])
        third = h.call(url)
        self.assertEqual(len(hung.held), 2)
        clock.advance(10)
        self.assertReason(second, "timeout")
        self.assertReason(third, "timeout")

    def test_failures_free_their_slot(self) -> None:
        clock = Clock()
        hung = Hung()
        h = Harness(clock, EndpointSettings(max_concurrent=1, timeout=1.0), agent=RequestTraversalAgent(hung))
        url = "http://127.0.0.1:8090/hang"
        d = h.call(url)
        clock.advance(1.0)
        self.assertReason(d, "timeout")
        self.assertNoResult(h.call(url))


# ---------------------------------------------------------------- breaker integration


class BreakerIntegrationTests(SynchronousTestCase, FailureAssertions):
    URL = "http://127.0.0.1:8090/mutate"
    ORIGIN = "http://127.0.0.1:8090"

    def setUp(self) -> None:
        self.clock = Clock()
        self.resource = Switchable(500)
        self.settings = EndpointSettings(timeout=2.0, breaker=BreakerConfig(
            consecutive_failures=2, cooldown=5.0, max_cooldown=60.0, half_open_requests=1))
        self.h = Harness(self.clock, self.settings, agent=RequestTraversalAgent(self.resource))

    def test_trip_refuse_trial_close(self) -> None:
        h = self.h
        self.assertReason(h.call(self.URL), "http-5xx")
        self.assertEqual(h.breaker(self.URL).state, CLOSED)
        self.assertReason(h.call(self.URL), "http-5xx")
        self.assertEqual(h.breaker(self.URL).state, OPEN)
        # Open: refused without reaching the endpoint.
        self.assertReason(h.call(self.URL), "breaker-open")
        self.assertEqual(self.resource.hits, 2)
        self.clock.advance(4.9)
        self.assertReason(h.call(self.URL), "breaker-open")
        self.assertEqual(self.resource.hits, 2)
        # Cool-down over: one trial goes through, and its success closes.
        self.clock.advance(0.1)
        self.resource.status = 200
        self.assertEqual(self.successResultOf(h.call(self.URL)).patch, [])
        self.assertEqual(self.resource.hits, 3)
        self.assertEqual(h.breaker(self.URL).state, CLOSED)
        self.assertEqual([s for _, s in h.transitions], [OPEN, HALF_OPEN, CLOSED])
        self.assertEqual(h.count(self.URL, "breaker-open"), 2)

    def test_half_open_allows_only_the_trial(self) -> None:
        h = Harness(self.clock, self.settings, agent=RequestTraversalAgent(Hung()))
        breaker = h.breaker(self.URL)
        for _ in range(2):
            d = h.call(self.URL)
            self.clock.advance(2.0)
            self.assertReason(d, "timeout")
        self.assertEqual(breaker.state, OPEN)
        self.clock.advance(5.0)
        trial = h.call(self.URL)
        self.assertReason(h.call(self.URL), "breaker-open")
        self.clock.advance(2.0)
        self.assertReason(trial, "timeout")
        # The failed trial re-opens it, for longer.
        self.assertEqual(breaker.state, OPEN)
        self.assertGreater(breaker.reopens_in(), 5.0)

    def test_endpoint_timeout_counts_as_failure(self) -> None:
        h = Harness(self.clock, self.settings, agent=RequestTraversalAgent(Hung()))
        for _ in range(2):
            d = h.call(self.URL, budget=9.5)
            self.clock.advance(2.0)
            self.assertReason(d, "timeout")
        self.assertEqual(h.breaker(self.URL).state, OPEN)

    def test_review_deadline_does_not_count(self) -> None:
        hung = Hung()
        h = Harness(self.clock, self.settings, agent=RequestTraversalAgent(hung))
        for _ in range(3):
            # The review's budget (1s) is shorter than the endpoint's own 2s.
            d = h.call(self.URL, budget=1.0)
            self.clock.advance(1.0)
            self.assertReason(d, "timeout")
        self.assertEqual(h.breaker(self.URL).state, CLOSED)

    def test_cancel_releases_the_half_open_trial(self) -> None:
        h = self.h
        for _ in range(2):
            self.assertReason(h.call(self.URL), "http-5xx")
        self.clock.advance(5.0)
        h2 = Harness(self.clock, self.settings, agent=RequestTraversalAgent(Hung()))
        h2.client._breakers = h.breakers
        trial = h2.call(self.URL)
        self.assertEqual(h.breaker(self.URL).state, HALF_OPEN)
        trial.cancel()
        self.failureResultOf(trial, defer.CancelledError)
        # Nothing learned, slot free: the next review runs a trial.
        self.assertEqual(h.breaker(self.URL).state, HALF_OPEN)
        self.resource.status = 200
        self.assertEqual(self.successResultOf(h.call(self.URL)).patch, [])
        self.assertEqual(h.breaker(self.URL).state, CLOSED)

    def test_breaker_settings_come_from_the_origin(self) -> None:
        # An override for one path with its own breaker block does not give
        # the origin a second, flip-flopping breaker.
        strict = EndpointSettings(timeout=2.0, breaker=BreakerConfig(consecutive_failures=1))
        h = Harness(self.clock, self.settings, agent=RequestTraversalAgent(self.resource))
        self.assertReason(h.call(self.URL, settings=strict), "http-5xx")
        self.assertEqual(h.breaker(self.URL).state, CLOSED)
        self.assertReason(h.call(self.URL), "http-5xx")
        self.assertEqual(h.breaker(self.URL).state, OPEN)
        self.assertEqual(len([s for _, s in h.transitions if s == OPEN]), 1)

    def test_breaker_state_gauge_follows_transitions(self) -> None:
        # The wiring service.py does: on_change -> amp_circuit_breaker_state.
        from amp.metrics import BREAKER_STATE_VALUES

        metrics = Metrics()
        breakers = BreakerRegistry(
            self.clock, lambda origin, state: metrics.breaker_state.labels(origin).set(BREAKER_STATE_VALUES[state]))
        client = EndpointClient(self.clock, metrics, breakers, agent=RequestTraversalAgent(self.resource))
        gauge = lambda: metrics.registry.get_sample_value(  # noqa: E731
            "amp_circuit_breaker_state", {"endpoint": self.ORIGIN})
        url = parse_endpoint_url(self.URL)
        for _ in range(2):
            self.assertReason(client.call(url, self.settings, b"{}", {}, Deadline.after(self.clock.seconds(), 9.5)),
                              "http-5xx")
        self.assertEqual(gauge(), 2)
        self.clock.advance(5.0)
        self.resource.status = 200
        self.successResultOf(client.call(url, self.settings, b"{}", {}, Deadline.after(self.clock.seconds(), 9.5)))
        self.assertEqual(gauge(), 0)


# ---------------------------------------------------------------- classify (unit)


class ClassifyTests(SynchronousTestCase):
    def reason(self, exc: Exception) -> str:
        return classify(Failure(exc)).reason

    def test_names(self) -> None:
        from OpenSSL import SSL
        from service_identity import VerificationError
        from twisted.web.client import ResponseFailed, ResponseNeverReceived

        self.assertEqual(self.reason(ierror.ConnectionRefusedError()), "connection-refused")
        self.assertEqual(self.reason(ierror.TimeoutError()), "timeout")
        self.assertEqual(self.reason(ierror.DNSLookupError("x")), "connection-failed")
        self.assertEqual(self.reason(ResponseNeverReceived([Failure(SSL.Error([("SSL routines", "", "bad")]))])),
                         "tls-error")
        self.assertEqual(self.reason(ResponseNeverReceived([Failure(VerificationError(errors=[]))])), "tls-error")
        self.assertEqual(self.reason(VerificationError(errors=[])), "tls-error")
        self.assertEqual(self.reason(SSL.Error([("SSL routines", "", "bad")])), "tls-error")
        self.assertEqual(self.reason(ResponseFailed([Failure(ierror.ConnectionLost())])), "connection-reset")
        self.assertEqual(self.reason(ResponseNeverReceived([Failure(defer.CancelledError())])), "timeout")
        self.assertEqual(self.reason(EndpointFailure("http-5xx", "HTTP 500")), "http-5xx")


# ---------------------------------------------------------------- mTLS to an https endpoint


class MutualTLSTests(TestCase, FailureAssertions):
    timeout = 15

    def setUp(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="amp-endpoints-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.ca, self.ca_key = make_ca("endpoint test CA")
        self.other_ca, other_key = make_ca("another CA")
        server, server_key = issue_cert(self.ca, self.ca_key, "endpoint", ["127.0.0.1", "localhost"])
        client, client_key = issue_cert(self.ca, self.ca_key, "amp", ["amp"], client=True)
        self.ca_path = self.write("ca.crt", pem_cert(self.ca))
        self.other_ca_path = self.write("other.crt", pem_cert(self.other_ca))
        self.both_path = self.write("both.crt", pem_cert(self.other_ca) + pem_cert(self.ca))
        self.client_cert = self.write("client.crt", pem_cert(client))
        self.client_key = self.write("client.key", pem_key(client_key))
        self.resource = Endpoint()
        identity = PrivateCertificate.loadPEM(pem_cert(server) + pem_key(server_key))
        self.server = LoopbackServer.start(
            self, Site(self.resource), tls=identity.options(Certificate.loadPEM(pem_cert(self.ca))))

    def write(self, name: str, data: bytes) -> str:
        path = os.path.join(self.dir, name)
        with open(path, "wb") as f:
            f.write(data)
        return path

    def mtls(self, **kw: Any) -> EndpointSettings:
        values = dict(ca_bundle=self.ca_path, client_cert=self.client_cert, client_key=self.client_key)
        values.update(kw)
        return EndpointSettings(**values)  # type: ignore[arg-type]

    @inlineCallbacks
    def test_ca_bundle_and_client_certificate(self) -> Any:
        h = RealHarness(self, self.mtls())
        url = self.server.url("/ok")
        for _ in range(2):
            decision = yield h.call(url)
            self.assertEqual(decision.patch, PATCH)
        self.assertEqual(self.server.accepted, 1)
        self.assertEqual(h.count(url, "ok"), 2)

    @inlineCallbacks
    def test_host_name_in_the_url(self) -> Any:
        h = RealHarness(self, self.mtls())
        decision = yield h.call(self.server.url("/ok", host="localhost"))
        self.assertEqual(decision.patch, PATCH)

    @inlineCallbacks
    def test_bundle_with_several_cas(self) -> Any:
        h = RealHarness(self, self.mtls(ca_bundle=self.both_path))
        decision = yield h.call(self.server.url("/ok"))
        self.assertEqual(decision.patch, PATCH)

    @inlineCallbacks
    def test_without_client_certificate_is_a_tls_error(self) -> Any:
        h = RealHarness(self, EndpointSettings(ca_bundle=self.ca_path))
        url = self.server.url("/ok")
        yield self.assertFailsWith(h.call(url), "tls-error")
        self.assertEqual(self.resource.hits, {})
        self.assertEqual(h.count(url, "tls-error"), 1)

    @inlineCallbacks
    def test_wrong_ca_is_a_tls_error(self) -> Any:
        h = RealHarness(self, self.mtls(ca_bundle=self.other_ca_path))
        url = self.server.url("/ok")
        e = yield self.assertFailsWith(h.call(url), "tls-error")
        self.assertIn("certificate verify failed", e.message)
        self.assertEqual(self.resource.hits, {})
        self.assertEqual(h.count(url, "tls-error"), 1)

    @inlineCallbacks
    def test_certificate_for_another_name_is_a_tls_error(self) -> Any:
        wrong, wrong_key = issue_cert(self.ca, self.ca_key, "endpoint", ["other.example"])
        identity = PrivateCertificate.loadPEM(pem_cert(wrong) + pem_key(wrong_key))
        server = LoopbackServer.start(self, Site(self.resource), tls=identity.options())
        h = RealHarness(self, self.mtls())
        e = yield self.assertFailsWith(h.call(server.url("/ok")), "tls-error")
        self.assertIn("does not match", e.message)
        self.assertEqual(self.resource.hits, {})

    @inlineCallbacks
    def test_connections_are_not_shared_across_tls_settings(self) -> Any:
        # Same origin, two overrides: a connection opened with the client
        # certificate must not carry a call whose settings have none.
        h = RealHarness(self, self.mtls())
        yield h.call(self.server.url("/ok"))
        without = EndpointSettings(ca_bundle=self.ca_path)
        yield self.assertFailsWith(h.call(self.server.url("/ok"), settings=without), "tls-error")

    @inlineCallbacks
    def test_missing_ca_bundle_is_a_tls_error_that_does_not_count(self) -> Any:
        settings = self.mtls(ca_bundle=os.path.join(self.dir, "missing.crt"),
                             breaker=BreakerConfig(consecutive_failures=1))
        h = RealHarness(self, settings)
        url = self.server.url("/ok")
        e = yield self.assertFailsWith(h.call(url), "tls-error")
        self.assertIn("missing.crt", e.message)
        self.assertEqual(self.server.accepted, 0)
        # amp's own configuration problem says nothing about the endpoint.
        self.assertEqual(h.breaker(url).state, CLOSED)

    def replace(self, path: str, data: bytes) -> None:
        """
        Swap a file for a new one, as a Secret volume update does.
        """
        with open(path + ".new", "wb") as f:
            f.write(data)
        os.replace(path + ".new", path)

    @inlineCallbacks
    def test_changed_tls_files_are_loaded_without_a_restart(self) -> Any:
        self.patch(endpoints_module, "_TLS_RECHECK", 3600.0)
        bundle = self.write("rotating-ca.crt", pem_cert(self.other_ca))
        h = RealHarness(self, self.mtls(ca_bundle=bundle))
        url = self.server.url("/ok")
        yield self.assertFailsWith(h.call(url), "tls-error")
        self.replace(bundle, pem_cert(self.ca))
        # Looked at no more often than every _TLS_RECHECK seconds ...
        yield self.assertFailsWith(h.call(url), "tls-error")
        # ... and once it is time, the new CA is in use.
        self.patch(endpoints_module, "_TLS_RECHECK", 0.0)
        decision = yield h.call(url)
        self.assertEqual(decision.patch, PATCH)

    @inlineCallbacks
    def test_a_broken_rotation_keeps_the_files_in_use(self) -> Any:
        self.patch(endpoints_module, "_TLS_RECHECK", 0.0)
        h = RealHarness(self, self.mtls(pool_size=1))
        self.resource.hold_until = 2
        yield defer.gatherResults([h.call(self.server.url("/hold")) for _ in range(2)])
        self.replace(self.client_key, b"half a key")
        self.resource.hold_until = 2
        # Two at once: one rides the pooled connection, one needs a new one.
        yield defer.gatherResults([h.call(self.server.url("/hold")) for _ in range(2)])
        self.assertEqual(self.server.accepted, 3)

    @inlineCallbacks
    def test_client_key_of_another_certificate(self) -> Any:
        _, stray = issue_cert(self.ca, self.ca_key, "amp", ["amp"], client=True)
        h = RealHarness(self, self.mtls(client_key=self.write("stray.key", pem_key(stray))))
        e = yield self.assertFailsWith(h.call(self.server.url("/ok")), "tls-error")
        self.assertIn("does not belong", e.message)


# ---------------------------------------------------------------- shadow mode through the Admitter


def review_body(namespace: str = "team") -> bytes:
    return json.dumps({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "0df28fbd-5f5f-11e8-bc74-36e6bb280816",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "operation": "CREATE", "namespace": namespace, "name": "web",
            "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "labels": {"app": "web"}},
                       "spec": {"containers": [{"name": "c", "image": "nginx"}]}},
        },
    }).encode()


class ShadowModeTests(TestCase):
    timeout = 15

    def setUp(self) -> None:
        self.resource = Endpoint()
        self.server = LoopbackServer.start(self, Site(self.resource))

    def admitter(self, path: str, mode: Optional[str] = "shadow") -> tuple[Admitter, Metrics]:
        annotations = {"amp.txn2.com/ep": self.server.url(path), "amp.txn2.com/failure-policy": "Fail"}
        if mode:
            annotations["amp.txn2.com/mode"] = mode
        config = parse_config({
            "failure_policy": "Fail",
            "kubernetes": {"source": "static", "namespaces": {"team": {
                "labels": {"amp.txn2.com/enabled": "true"}, "annotations": annotations}}},
            "endpoints": {"allow": ["http://127.0.0.1:*/*"], "timeout": "2s"},
        })
        metrics = Metrics()
        client = EndpointClient(reactor, metrics, BreakerRegistry(reactor))
        self.addCleanup(client.close)
        return Admitter(config, StaticNamespaceSource(config.kubernetes), client, reactor, metrics), metrics

    @inlineCallbacks
    def review(self, admitter: Admitter) -> Any:
        answer, outcome = yield admitter.review(parse_review(review_body()), Deadline.after(reactor.seconds(), 5.0))
        return json.loads(answer)["response"], outcome

    @inlineCallbacks
    def test_shadow_calls_the_endpoint_and_admits_unchanged(self) -> Any:
        admitter, metrics = self.admitter("/ok")
        response, outcome = yield self.review(admitter)
        self.assertEqual(self.resource.hits[b"/ok"], 1)
        self.assertTrue(response["allowed"])
        self.assertNotIn("patch", response)
        self.assertEqual(outcome.result, "shadow")
        self.assertGreater(outcome.shadow_patch_size, 0)
        self.assertEqual(metrics.registry.get_sample_value(
            "amp_shadow_patches_total", {"endpoint": self.server.url("").rstrip("/")}), 1)

    @inlineCallbacks
    def test_the_same_namespace_without_shadow_gets_the_patch(self) -> Any:
        admitter, _ = self.admitter("/ok", mode=None)
        response, outcome = yield self.review(admitter)
        self.assertTrue(response["allowed"])
        self.assertIn("patch", response)
        self.assertEqual(outcome.result, "patched")

    @inlineCallbacks
    def test_failing_endpoint_in_shadow_mode_never_denies(self) -> Any:
        admitter, metrics = self.admitter("/status/500")
        response, outcome = yield self.review(admitter)
        self.assertTrue(response["allowed"])
        self.assertNotIn("patch", response)
        self.assertEqual(outcome.reason, "http-5xx")
        self.assertEqual(requests_total(metrics, self.server.url("").rstrip("/"), "http-5xx"), 1)

    @inlineCallbacks
    def test_failing_endpoint_outside_shadow_mode_denies(self) -> Any:
        admitter, _ = self.admitter("/status/500", mode=None)
        response, _ = yield self.review(admitter)
        self.assertFalse(response["allowed"])
        self.assertIn("http-5xx", response["status"]["message"])


class AdmitterDeadlineTests(SynchronousTestCase):
    def test_hung_endpoint_answers_at_the_deadline(self) -> None:
        clock = Clock()
        hung = Hung()
        config = parse_config({
            "failure_policy": "Ignore",
            "kubernetes": {"source": "static", "namespaces": {"team": {
                "labels": {"amp.txn2.com/enabled": "true"},
                "annotations": {"amp.txn2.com/ep": "http://127.0.0.1:8090/hang"}}}},
            "endpoints": {"allow": ["http://127.0.0.1:*/*"], "timeout": "30s"},
        })
        metrics = Metrics()
        breakers = BreakerRegistry(clock)
        client = EndpointClient(clock, metrics, breakers, agent=RequestTraversalAgent(hung))
        admitter = Admitter(config, StaticNamespaceSource(config.kubernetes), client, clock, metrics)
        d = admitter.review(parse_review(review_body()), Deadline.after(clock.seconds(), 9.5))
        clock.advance(9.499)
        self.assertNoResult(d)
        clock.advance(0.001)
        answer, outcome = self.successResultOf(d)
        response = json.loads(answer)["response"]
        self.assertTrue(response["allowed"])
        self.assertEqual(outcome.reason, "timeout")
        self.assertIn("timeout", response["warnings"][0])
        # The review's deadline, not the endpoint's: the breaker learned nothing.
        self.assertEqual(breakers.get("http://127.0.0.1:8090", config.endpoints.defaults.breaker).state, CLOSED)
        self.assertEqual(clock.getDelayedCalls(), [])


class DecisionTypeTests(SynchronousTestCase):
    def test_object_reply_is_a_decision(self) -> None:
        clock = Clock()
        resource = Switchable(200, b'{"allowed": false, "status": {"code": 403, "message": "no"}}')
        h = Harness(clock, agent=RequestTraversalAgent(resource))
        decision = self.successResultOf(h.call("http://127.0.0.1:8090/m"))
        self.assertIsInstance(decision, EndpointDecision)
        self.assertFalse(decision.allowed)
        self.assertEqual(decision.message, "no")
