"""
Hostile clients against an in-process amp over real loopback TLS, the real
thing behind the in-memory channel tests of test_channel.py: a trickled
body and a trickled TLS handshake are cut off by C{listen.request_timeout}
(not reset by each byte), connections over C{listen.max_connections} are
closed at once while the others keep working, an oversized request line or
header is refused before it has arrived whole, a refused client that is
still sending gets its answer, and a client that never reads does not hold
up anyone else.

Time is real here (sockets); every wait is short and bounded: request
timeouts of a few hundred milliseconds, and every test has a hard timeout.
"""

from __future__ import annotations

from typing import Any, Optional

from OpenSSL import SSL
from twisted.internet import reactor
from twisted.internet.defer import Deferred, inlineCallbacks
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol, wrapClientTLS
from twisted.internet.protocol import Protocol
from twisted.internet.ssl import Certificate, optionsForClientTLS
from twisted.trial.unittest import TestCase

from amp import http
from tests.support.helpers import (
    UID,
    ca_pem,
    decode_answer,
    make_config,
    namespace,
    parse_raw_response,
    review_bytes,
    start_amp,
)
from tests.support.waiting import wait_until

HEAD = b"POST /mutate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"


def post_head(length: int, extra: bytes = b"") -> bytes:
    return HEAD + extra + b"Content-Length: %d\r\n\r\n" % length


class RawClient(Protocol):
    """
    A TLS client that writes what the test says, when it says, and records
    what comes back and when the connection closed.
    """

    def __init__(self) -> None:
        self.received = b""
        self.sent = 0
        self.lost: Deferred = Deferred()
        self.closed_at: Optional[float] = None
        self._trickle: Any = None
        self._got: list[tuple[bytes, Deferred]] = []

    def connectionMade(self) -> None:
        self.connected_at = reactor.seconds()

    def send(self, data: bytes) -> None:
        self.sent += len(data)
        self.transport.write(data)

    def trickle(self, data: bytes, interval: float) -> None:
        """Write C{data} one byte every C{interval} seconds until it is all sent or the connection closes."""
        rest = list(data)

        def step() -> None:
            self._trickle = None
            if self.closed_at is not None or not rest:
                return
            self.send(bytes([rest.pop(0)]))
            self._trickle = reactor.callLater(interval, step)

        step()

    def until(self, marker: bytes) -> Deferred:
        """Fires once C{marker} has been received."""
        d: Deferred = Deferred()
        if marker in self.received:
            d.callback(self.received)
        else:
            self._got.append((marker, d))
        return d.addTimeout(5, reactor)

    def dataReceived(self, data: bytes) -> None:
        self.received += data
        for marker, d in list(self._got):
            if marker in self.received:
                self._got.remove((marker, d))
                d.callback(self.received)

    def connectionLost(self, reason: Any) -> None:
        self.closed_at = reactor.seconds()
        if self._trickle is not None and self._trickle.active():
            self._trickle.cancel()
        self.lost.callback(self.received)

    def elapsed(self) -> float:
        assert self.closed_at is not None
        return self.closed_at - self.connected_at


def connect(port: int) -> Deferred:
    """A L{RawClient} connected over TLS (development CA, IP checked) to amp."""
    endpoint = wrapClientTLS(
        optionsForClientTLS("127.0.0.1", trustRoot=Certificate.loadPEM(ca_pem())),
        TCP4ClientEndpoint(reactor, "127.0.0.1", port, timeout=5),
    )
    return connectProtocol(endpoint, RawClient())


class HostileTestCase(TestCase):
    timeout = 20

    @inlineCallbacks
    def start(self, **listen: Any) -> Any:
        config = make_config({"team-a": namespace(enabled=False)}, listen=listen)
        amp = yield start_amp(config, reactor)
        self.addCleanup(amp.stop)
        return amp

    @inlineCallbacks
    def client(self, amp: Any) -> Any:
        c = yield connect(amp.port)
        self.addCleanup(lambda: c.transport.abortConnection() if c.closed_at is None else None)
        return c

    @inlineCallbacks
    def closed(self, client: RawClient, within: float = 5.0) -> Any:
        """Wait for amp to close C{client}'s connection; fail if it has not within C{within} seconds."""
        try:
            yield client.lost.addTimeout(within, reactor)
        except Exception:
            self.fail(f"amp did not close the connection within {within}s; received {client.received[:200]!r}")
        return client.received

    def assertRefused(self, data: bytes, code: int, text: bytes) -> None:
        self.assertTrue(data.startswith(b"HTTP/1.1 "), f"no answer, got {data[:100]!r}")
        status, headers, body = parse_raw_response(data)
        self.assertEqual(status, code, data[:300])
        self.assertIn(text, body)
        self.assertEqual(headers[b"connection"], b"close")


# ---------------------------------------------------------------- slow clients


class SlowClientTests(HostileTestCase):
    @inlineCallbacks
    def test_body_sent_byte_by_byte_is_cut_off_at_the_request_timeout(self) -> Any:
        amp = yield self.start(request_timeout="300ms")
        c = yield self.client(amp)
        body = review_bytes()
        c.send(post_head(len(body)))
        c.trickle(body, 0.05)  # the whole body would take about 20s
        data = yield self.closed(c, within=10.0)
        self.assertRefused(data, 408, b"(listen.request_timeout)")
        self.assertLess(c.sent, len(body))
        self.assertGreaterEqual(c.elapsed(), 0.28)
        self.assertEqual(amp.metrics.bad_requests.labels("408")._value.get(), 1)

    @inlineCallbacks
    def test_tls_handshake_sent_byte_by_byte_is_cut_off(self) -> Any:
        """A ClientHello dribbled in over TCP never becomes a request: closed at the request timeout."""
        amp = yield self.start(request_timeout="300ms")
        hello = client_hello()
        c = RawClient()
        yield connectProtocol(TCP4ClientEndpoint(reactor, "127.0.0.1", amp.port), c)
        self.addCleanup(lambda: c.transport.abortConnection() if c.closed_at is None else None)
        c.trickle(hello, 0.05)
        yield self.closed(c, within=10.0)
        self.assertLess(c.sent, len(hello))
        self.assertGreaterEqual(c.elapsed(), 0.28)
        yield amp.connections.wait_idle()
        self.assertEqual(amp.service.webhook_server.open_connections, 0)


def client_hello() -> bytes:
    """The first flight of a TLS client, as bytes to send by hand."""
    ctx = SSL.Context(SSL.TLS_CLIENT_METHOD)
    conn = SSL.Connection(ctx, None)
    conn.set_connect_state()
    try:
        conn.do_handshake()
    except SSL.WantReadError:
        pass
    return conn.bio_read(65536)


# ---------------------------------------------------------------- connection cap


class ConnectionCapTests(HostileTestCase):
    @inlineCallbacks
    def test_connections_over_the_cap_are_closed_at_once_and_the_others_keep_working(self) -> Any:
        amp = yield self.start(max_connections=2, request_timeout="60s")
        held = []
        for _ in range(2):
            c = yield self.client(amp)
            c.send(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            yield c.until(b"ok\n")
            held.append(c)
        self.assertEqual(amp.service.webhook_server.open_connections, 2)

        # Several more at once: each is closed without waiting for any
        # timeout (the request timeout is a minute).
        extra = []
        for _ in range(3):
            c = RawClient()
            yield connectProtocol(TCP4ClientEndpoint(reactor, "127.0.0.1", amp.port), c)
            extra.append(c)
        for c in extra:
            yield self.closed(c, within=10.0)
            self.assertEqual(c.received, b"")
        self.assertEqual(amp.service.webhook_server.open_connections, 2)

        # The held connections still serve reviews.
        body = review_bytes()
        for c in held:
            before = len(c.received)
            c.send(post_head(len(body)) + body)
            data = yield c.until(b'"uid"')
            status, _, content = parse_raw_response(data[before:])
            self.assertEqual(status, 200)
            self.assertEqual(decode_answer(content)["response"]["uid"], UID)

        # A freed slot takes a new connection.
        held[0].transport.loseConnection()
        yield held[0].lost
        yield wait_until(lambda: amp.service.webhook_server.open_connections == 1)
        c = yield self.client(amp)
        c.send(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        yield c.until(b"ok\n")
        self.assertEqual(amp.service.webhook_server.open_connections, 2)


# ---------------------------------------------------------------- oversized requests


class OversizedTests(HostileTestCase):
    """
    Every refusal here comes while the client is still in the middle of the
    oversized part (it never finishes it): amp answers from what it has,
    without waiting for the rest or for the request timeout.
    """

    @inlineCallbacks
    def refused_midway(self, *chunks: bytes, **listen: Any) -> Any:
        # Closed long before the request timeout: refused from what arrived.
        amp = yield self.start(request_timeout="60s", **listen)
        c = yield self.client(amp)
        for chunk in chunks:
            c.send(chunk)
        data = yield self.closed(c, within=10.0)
        return amp, data

    @inlineCallbacks
    def test_huge_request_line(self) -> Any:
        amp, data = yield self.refused_midway(b"POST /" + b"a" * 20000)
        self.assertRefused(data, 414, b"request line is over 8192 bytes")
        self.assertEqual(amp.metrics.bad_requests.labels("414")._value.get(), 1)

    @inlineCallbacks
    def test_one_huge_header(self) -> Any:
        amp, data = yield self.refused_midway(HEAD + b"X-Big: " + b"b" * 20000)
        self.assertRefused(data, 431, b"a header line is over 8192 bytes")
        self.assertEqual(amp.metrics.bad_requests.labels("431")._value.get(), 1)

    @inlineCallbacks
    def test_client_still_sending_after_413_gets_the_answer(self) -> Any:
        """
        A client that writes its whole body before reading (most do) is
        still sending when amp refuses; amp reads and drops what follows
        (within its bounds) instead of resetting the connection under it,
        so the 413 is there when the client reads.
        """
        amp = yield self.start(request_timeout="5s", max_body=4096)
        c = yield self.client(amp)
        c.transport.pauseProducing()  # not reading while it writes
        size = 3 * 1024 * 1024
        c.send(post_head(size))
        block = b"y" * 65536

        def pump() -> None:
            if c.closed_at is None and c.sent < size:
                c.send(block)
                reactor.callLater(0.002, pump)

        pump()
        yield wait_until(lambda: c.sent >= size or c.closed_at is not None, timeout=4.0)
        c.transport.resumeProducing()
        data = yield self.closed(c, within=4.0)
        self.assertRefused(data, 413, b"(listen.max_body)")


# ---------------------------------------------------------------- clients that do not read


class NonReaderTests(HostileTestCase):
    @inlineCallbacks
    def test_client_that_never_reads_does_not_hold_up_others_and_is_closed(self) -> Any:
        amp = yield self.start(request_timeout="1s", idle_timeout="300ms")
        greedy = yield self.client(amp)
        # It stops reading, then pipelines far more requests than fit in
        # amp's read-ahead, and never reads an answer.
        greedy.transport.pauseProducing()
        body = review_bytes()
        greedy.send((post_head(len(body)) + body) * 200)
        # Meanwhile another client is served, repeatedly.
        other = yield self.client(amp)
        for n in range(1, 4):
            other.send(post_head(len(body)) + body)
            yield wait_until(lambda n=n: other.received.count(b"HTTP/1.1 200 OK") == n)
        self.assertEqual(other.received.count(b'"uid"'), 3)
        # amp closes the greedy one within idle_timeout plus the close grace
        # (a client that does not read does not see that until it reads).
        yield wait_until(
            lambda: amp.service.webhook_server.open_connections == 1, timeout=0.3 + http.CLOSE_GRACE + 10.0
        )
        self.assertIsNone(greedy.closed_at)
        greedy.transport.resumeProducing()
        yield self.closed(greedy)
