"""
Tests for amp.web's channel in memory, the way Twisted tests its own
(C{twisted/web/test/test_http.py}): amp's assembled webhook site on a
L{Clock}, each connection over a L{StringTransport}.  The read deadline
(408), the idle timeout, the request-line and header limits (414, 431), the
body cap (413), the connection cap, the bounded close after a refusal and the
graceful drain at shutdown, each to the exact second of the clock.

The same limits over real loopback TLS are in test_web.py and
test_hostile_clients.py.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.address import IPv4Address
from twisted.internet.defer import Deferred, succeed
from twisted.internet.endpoints import serverFromString
from twisted.internet.error import ConnectionDone
from twisted.internet.interfaces import IListeningPort, IStreamServerEndpoint
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer

from amp import web
from amp.metrics import Metrics
from amp.namespaces import UNKNOWN, INamespaceSource, StaticNamespaceSource
from amp.service import AmpService, serving_certificate
from tests.helpers import UID, decode_answer, make_config, namespace, parse_raw_response, review_bytes

HEAD = b"POST /mutate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


def post_head(length: int, extra: bytes = b"") -> bytes:
    return HEAD + extra + b"Content-Length: %d\r\n\r\n" % length


class Transport(StringTransport):
    """A StringTransport that counts aborts."""

    aborted_times = 0

    def abortConnection(self) -> None:
        self.aborted_times += 1
        super().abortConnection()


class Connection:
    """One client connection to the site: what it sent, what it got."""

    def __init__(self, channel: web.WebhookChannel, transport: Transport) -> None:
        self.channel = channel
        self.transport = transport

    def send(self, data: bytes) -> None:
        self.channel.dataReceived(data)

    def received(self) -> bytes:
        return self.transport.value()

    def lose(self) -> None:
        """The connection closes (as the transport reports once closed)."""
        self.channel.connectionLost(Failure(ConnectionDone()))


class ChannelTestCase(SynchronousTestCase):
    def site(self, **listen: Any) -> web.WebhookSite:
        """
        amp's webhook site as L{AmpService} assembles it, on
        C{self.clock}; C{team-a} is not enabled, so a review is answered
        at once without an endpoint call.
        """
        self.clock = MemoryReactorClock()
        config = make_config({"team-a": namespace(enabled=False)}, listen=listen)
        metrics = Metrics()
        service = AmpService(
            config, self.clock, certificate=serving_certificate(config.tls, self.clock, metrics),
            webhook_endpoint=serverFromString(self.clock, "tcp:0"), metrics_endpoint=None,
            namespaces=StaticNamespaceSource(config.kubernetes), metrics=metrics, install_sighup=False)
        self.metrics = metrics
        return service.site

    def connect(self, site: web.WebhookSite) -> Connection:
        transport = Transport(peerAddress=IPv4Address("TCP", "127.0.0.1", 40000))
        channel = site.buildProtocol(transport.getPeer())
        channel.makeConnection(transport)
        return Connection(channel, transport)

    def bad_requests(self, code: int) -> float:
        return self.metrics.registry.get_sample_value("amp_bad_requests_total", {"code": str(code)}) or 0.0

    def assertRefused(self, connection: Connection, code: int, text: bytes) -> None:
        data = connection.received()
        self.assertTrue(data.startswith(b"HTTP/1.1 "), f"no answer, got {data[:100]!r}")
        status, headers, body = parse_raw_response(data)
        self.assertEqual(status, code, data[:300])
        self.assertIn(text, body)
        self.assertEqual(headers[b"connection"], b"close")
        self.assertNotIn(b"retry-after", headers)
        self.assertTrue(connection.transport.disconnecting)
        self.assertEqual(self.bad_requests(code), 1)

    def trickle(self, connection: Connection, data: bytes, interval: float) -> int:
        """
        Send C{data} one byte every C{interval} seconds of the clock until
        it is all sent or amp has answered; returns how many bytes went.
        """
        for sent, byte in enumerate(data):
            if connection.received():
                return sent
            connection.send(bytes([byte]))
            self.clock.advance(interval)
        return len(data)


class ReadDeadlineTests(ChannelTestCase):
    """
    C{listen.request_timeout} runs from a request's first byte (or, for the
    first request, from the accept) to its last, whatever the pace of the
    bytes in between: twisted.web's own idle timer restarts on every byte.
    """

    def test_headers_then_nothing_is_408_at_the_request_timeout(self) -> None:
        site = self.site(request_timeout="2s")
        c = self.connect(site)
        c.send(post_head(100))
        self.clock.advance(1.99)
        self.assertEqual(c.received(), b"")
        self.clock.advance(0.01)
        self.assertRefused(c, 408, b"request not received within 2s (listen.request_timeout)")

    def test_body_trickled_byte_by_byte_is_408_at_the_request_timeout(self) -> None:
        site = self.site(request_timeout="2s", idle_timeout="1s")
        c = self.connect(site)
        body = review_bytes()
        c.send(post_head(len(body)))
        sent = self.trickle(c, body, 0.5)  # each byte well inside the idle timeout
        self.assertEqual(sent, 4)
        self.assertRefused(c, 408, b"(listen.request_timeout)")

    def test_head_trickled_byte_by_byte_is_408_at_the_request_timeout(self) -> None:
        site = self.site(request_timeout="2s")
        c = self.connect(site)
        head = post_head(10)
        sent = self.trickle(c, head, 0.1)
        self.assertEqual(sent, 20)
        self.assertRefused(c, 408, b"(listen.request_timeout)")

    def test_the_deadline_restarts_with_each_request_on_a_kept_alive_connection(self) -> None:
        site = self.site(request_timeout="2s", idle_timeout="60s")
        c = self.connect(site)
        self.clock.advance(1.5)
        c.send(HEALTHZ)
        self.assertTrue(c.received().startswith(b"HTTP/1.1 200 OK"))
        # Idle for far longer than the request timeout: still open.
        self.clock.advance(30)
        self.assertFalse(c.transport.disconnecting)
        answered = len(c.received())
        c.send(post_head(10))
        self.clock.advance(1.99)
        self.assertEqual(len(c.received()), answered)
        self.clock.advance(0.01)
        status, headers, body = parse_raw_response(c.received()[answered:])
        self.assertEqual(status, 408)
        self.assertTrue(c.transport.disconnecting)

    def test_a_connection_that_sends_nothing_is_aborted_at_the_request_timeout(self) -> None:
        """
        Not even a finished TLS handshake: there is nothing to answer, so
        the connection is just closed, and its slot is free.
        """
        site = self.site(request_timeout="2s")
        c = self.connect(site)
        self.assertEqual(site.open_connections, 1)
        self.clock.advance(1.99)
        self.assertEqual(c.transport.aborted_times, 0)
        self.clock.advance(0.01)
        self.assertEqual(c.transport.aborted_times, 1)
        self.assertEqual(c.received(), b"")
        c.lose()
        self.assertEqual(site.open_connections, 0)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_a_review_received_in_time_is_answered_and_never_timed_out(self) -> None:
        site = self.site(request_timeout="2s", idle_timeout="60s")
        c = self.connect(site)
        body = review_bytes()
        c.send(post_head(len(body)))
        self.clock.advance(1.9)
        c.send(body)
        status, headers, content = parse_raw_response(c.received())
        self.assertEqual(status, 200)
        self.assertEqual(decode_answer(content)["response"]["uid"], UID)
        self.clock.advance(10)
        self.assertNotIn(b"408", c.received())
        self.assertFalse(c.transport.disconnecting)


class IdleTimeoutTests(ChannelTestCase):
    def test_an_idle_kept_alive_connection_is_closed_then_aborted_after_the_grace(self) -> None:
        site = self.site(request_timeout="2s", idle_timeout="30s")
        c = self.connect(site)
        c.send(HEALTHZ)
        self.clock.advance(29.9)
        self.assertFalse(c.transport.disconnecting)
        self.clock.advance(0.1)
        self.assertTrue(c.transport.disconnecting)
        self.assertEqual(c.transport.aborted_times, 0)
        # A client that does not take the close is aborted after the grace.
        self.clock.advance(web.CLOSE_GRACE)
        self.assertEqual(c.transport.aborted_times, 1)


class HeaderLimitTests(ChannelTestCase):
    """
    Oversized request lines and headers are refused as soon as what has
    arrived says so: the client never finishes the oversized part here.
    """

    def test_a_request_line_over_the_limit_is_414(self) -> None:
        site = self.site()
        c = self.connect(site)
        c.send(b"POST /" + b"a" * (web.WebhookChannel.MAX_LENGTH + 100))
        self.assertRefused(c, 414, b"request line is over 8192 bytes")

    def test_the_next_request_line_on_a_kept_alive_connection_is_a_request_line_again(self) -> None:
        site = self.site()
        c = self.connect(site)
        c.send(HEALTHZ)
        answered = len(c.received())
        c.send(b"GET /" + b"a" * 20000)
        status, headers, body = parse_raw_response(c.received()[answered:])
        self.assertEqual((status, body), (414, b"request line is over 8192 bytes\n"))

    def test_a_header_line_over_the_limit_is_431(self) -> None:
        site = self.site()
        c = self.connect(site)
        c.send(HEAD + b"X-Big: " + b"b" * 20000)
        self.assertRefused(c, 431, b"a header line is over 8192 bytes")

    def test_too_many_header_fields_is_431(self) -> None:
        site = self.site()
        c = self.connect(site)
        c.send(HEAD + b"".join(b"X-H%d: v\r\n" % i for i in range(web.WebhookChannel.maxHeaders + 1)))
        self.assertRefused(c, 431, b"more than %d header fields" % web.WebhookChannel.maxHeaders)

    def test_headers_over_the_total_size_is_431(self) -> None:
        site = self.site()
        c = self.connect(site)
        line = b"X-Pad: " + b"p" * 1000 + b"\r\n"
        count = web.WebhookChannel.totalHeadersSize // len(line) + 1
        self.assertLess(count, web.WebhookChannel.maxHeaders)
        c.send(HEAD + line * count)
        self.assertRefused(c, 431, b"request headers are over %d bytes" % web.WebhookChannel.totalHeadersSize)

    def test_malformed_request_is_400_with_a_reason(self) -> None:
        site = self.site()
        c = self.connect(site)
        c.send(b"NOT HTTP\r\n")
        self.assertRefused(c, 400, b"request is not valid HTTP/1.1")

    def test_headers_just_under_the_limits_are_served(self) -> None:
        """The limits leave room for real requests: 50 headers of 200 bytes go through."""
        site = self.site()
        c = self.connect(site)
        body = review_bytes()
        c.send(post_head(len(body), extra=b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 200) for i in range(50))) + body)
        status, headers, content = parse_raw_response(c.received())
        self.assertEqual(status, 200)
        self.assertEqual(decode_answer(content)["response"]["uid"], UID)


class BodyLimitTests(ChannelTestCase):
    def test_a_body_over_the_limit_by_content_length_is_413_before_any_body(self) -> None:
        site = self.site(max_body=4096)
        c = self.connect(site)
        c.send(post_head(10 * 1024 * 1024))
        self.assertRefused(c, 413, b"request body of 10485760 bytes is over the 4096 byte limit (listen.max_body)")

    def test_a_chunked_body_is_413_once_the_running_count_passes_the_limit(self) -> None:
        site = self.site(max_body=4096)
        c = self.connect(site)
        c.send(HEAD + b"Transfer-Encoding: chunked\r\n\r\n")
        chunk = b"x" * 1000
        for _ in range(4):
            c.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        self.assertEqual(c.received(), b"")
        c.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        self.assertRefused(c, 413, b"request body is over the 4096 byte limit (listen.max_body)")

    def test_expect_continue_over_the_limit_gets_413_and_no_100(self) -> None:
        """curl sends Expect: 100-continue for large bodies: it must get the 413, not a 100 to go ahead."""
        site = self.site(max_body=4096)
        c = self.connect(site)
        c.send(post_head(10 * 1024 * 1024, extra=b"Expect: 100-continue\r\n"))
        self.assertTrue(c.received().startswith(b"HTTP/1.1 413 "), c.received()[:100])
        self.assertNotIn(b"100 Continue", c.received())

    def test_a_body_at_the_limit_is_reviewed(self) -> None:
        body = review_bytes()
        site = self.site(max_body=len(body))
        c = self.connect(site)
        c.send(post_head(len(body)) + body)
        self.assertEqual(parse_raw_response(c.received())[0], 200)


class ConnectionCapTests(ChannelTestCase):
    def test_connections_over_the_cap_are_aborted_at_once_and_a_freed_slot_is_reused(self) -> None:
        site = self.site(max_connections=2)
        held = [self.connect(site), self.connect(site)]
        extra = self.connect(site)
        self.assertEqual(extra.transport.aborted_times, 1)
        self.assertEqual(extra.received(), b"")
        self.assertEqual(site.open_connections, 2)
        extra.lose()
        self.assertEqual(site.open_connections, 2)
        for c in held:
            c.send(HEALTHZ)
            self.assertTrue(c.received().startswith(b"HTTP/1.1 200 OK"))
        held[0].lose()
        self.assertEqual(site.open_connections, 1)
        again = self.connect(site)
        self.assertEqual(again.transport.aborted_times, 0)
        self.assertEqual(site.open_connections, 2)


class LingerTests(ChannelTestCase):
    """
    After a refusal amp keeps reading (and dropping) for a short, bounded
    while, then aborts: a client that writes its whole body before reading
    gets its answer instead of a reset, and a client cannot hold the
    connection by never finishing its side of the close.
    """

    def test_a_refused_connection_is_aborted_after_the_grace_period(self) -> None:
        site = self.site(max_body=1024)
        c = self.connect(site)
        c.send(post_head(10 * 1024 * 1024))
        self.assertTrue(c.received().startswith(b"HTTP/1.1 413 "))
        self.assertTrue(c.transport.disconnecting)
        self.assertEqual(c.transport.aborted_times, 0)
        c.send(b"z" * 1000)
        self.clock.advance(web.CLOSE_GRACE - 0.01)
        self.assertEqual(c.transport.aborted_times, 0)
        self.clock.advance(0.01)
        self.assertEqual(c.transport.aborted_times, 1)

    def test_a_refused_connection_is_aborted_once_too_much_was_dropped(self) -> None:
        site = self.site(max_body=1024)
        c = self.connect(site)
        c.send(post_head(10 * 1024 * 1024))
        c.send(b"z" * web.LINGER_BYTES)
        self.assertEqual(c.transport.aborted_times, 0)
        c.send(b"z")
        self.assertEqual(c.transport.aborted_times, 1)
        written = c.received()
        c.send(b"z" * 100)
        self.assertEqual(c.received(), written)

    def test_a_closed_connection_leaves_no_timer(self) -> None:
        site = self.site(max_body=1024)
        c = self.connect(site)
        c.send(post_head(10 * 1024 * 1024))
        c.lose()
        self.assertEqual(self.clock.getDelayedCalls(), [])


# ---------------------------------------------------------------- graceful drain


@implementer(IListeningPort)
class _Port:
    def __init__(self, events: list[str]) -> None:
        self.events = events

    def stopListening(self) -> None:
        self.events.append("stopped listening")

    def startListening(self) -> None:
        pass

    def getHost(self) -> Any:
        return IPv4Address("TCP", "127.0.0.1", 8443)


@implementer(IStreamServerEndpoint)
class _Endpoint:
    """Listens at once; records when the port stops listening."""

    def __init__(self, events: list[str]) -> None:
        self.events = events

    def listen(self, factory: Any) -> Deferred:
        self.events.append("listening")
        return succeed(_Port(self.events))


@implementer(INamespaceSource)
class HeldSource(StaticNamespaceSource):
    """
    Knows no namespace from memory: every review waits on a lookup the
    test answers (C{answer}); records when it is stopped.
    """

    def __init__(self, events: list[str]) -> None:
        super().__init__(make_config().kubernetes)
        self.events = events
        self.lookups: list[Deferred] = []

    def cached(self, name: str) -> Any:
        return UNKNOWN

    def fetch(self, name: str, timeout: float) -> Deferred:
        d: Deferred = Deferred()
        self.lookups.append(d)
        return d

    def answer(self) -> None:
        """The lookups answer: no such namespace (the review is answered, allowed)."""
        lookups, self.lookups = self.lookups, []
        for d in lookups:
            d.callback(None)

    def stopService(self) -> Any:
        self.events.append("namespaces stopped")
        return super().stopService()


class DrainTests(ChannelTestCase):
    """
    L{AmpService.stopService}: not ready, not listening, every review
    already received answered and its connection closed after the answer,
    idle connections closed at once, the rest of amp stopped only then; all
    within C{listen.drain_timeout}.
    """

    def start(self, drain_timeout: str = "5s") -> AmpService:
        self.clock = MemoryReactorClock()
        self.events: list[str] = []
        config = make_config(listen={"drain_timeout": drain_timeout})
        self.metrics = Metrics()
        self.source = HeldSource(self.events)
        service = AmpService(
            config, self.clock, certificate=serving_certificate(config.tls, self.clock, self.metrics),
            webhook_endpoint=_Endpoint(self.events), metrics_endpoint=None, namespaces=self.source,
            metrics=self.metrics, install_sighup=False)
        service.startService()
        return service

    def review(self, site: web.WebhookSite, uid: str) -> Connection:
        c = self.connect(site)
        body = review_bytes(uid=uid)
        c.send(post_head(len(body)) + body)
        return c

    def answer_of(self, c: Connection) -> tuple[int, dict, bytes]:
        return parse_raw_response(c.received())

    def test_reviews_in_flight_are_answered_then_every_connection_closes_then_amp_stops(self) -> None:
        service = self.start()
        site = service.site
        idle = self.connect(site)
        idle.send(HEALTHZ)
        busy = self.review(site, "in-flight")
        readyz = self.connect(site)
        readyz.send(b"GET /readyz HTTP/1.1\r\n")  # a request half received
        partial = self.connect(site)
        body = review_bytes(uid="half-sent")
        partial.send(post_head(len(body)) + body[:20])

        stopped = service.stopService()
        self.assertEqual(self.events, ["listening", "stopped listening"])
        self.assertTrue(idle.transport.disconnecting)
        for c in (busy, readyz, partial):
            self.assertFalse(c.transport.disconnecting)
        late = self.connect(site)
        self.assertEqual(late.transport.aborted_times, 1)
        self.assertEqual(late.received(), b"")

        # The half-received requests are received and answered.
        readyz.send(b"Host: 127.0.0.1\r\n\r\n")
        status, headers, text = self.answer_of(readyz)
        self.assertEqual(status, 503)
        self.assertIn(b"[-] listener: shutting down", text)
        self.assertEqual(headers[b"connection"], b"close")
        self.assertTrue(readyz.transport.disconnecting)
        partial.send(body[20:])
        self.assertEqual(busy.received(), b"")
        self.assertEqual(partial.received(), b"")

        self.source.answer()
        for c, uid in ((busy, "in-flight"), (partial, "half-sent")):
            status, headers, content = self.answer_of(c)
            self.assertEqual(status, 200)
            self.assertEqual(decode_answer(content)["response"]["uid"], uid)
            self.assertEqual(headers[b"connection"], b"close")
            self.assertTrue(c.transport.disconnecting)

        # amp's other parts stop only once every connection has closed.
        self.assertNotIn("namespaces stopped", self.events)
        for c in (idle, busy, readyz):
            c.lose()
        self.assertNoResult(stopped)
        partial.lose()
        self.successResultOf(stopped)
        self.assertEqual(self.events[-1], "namespaces stopped")
        self.assertEqual(site.open_connections, 0)

    def test_what_is_still_open_at_the_drain_timeout_is_aborted(self) -> None:
        service = self.start(drain_timeout="5s")
        busy = self.review(service.site, "hung")
        [lookup] = self.source.lookups
        stopped = service.stopService()
        self.clock.advance(4.99)
        self.assertEqual(busy.transport.aborted_times, 0)
        self.assertNoResult(stopped)
        self.clock.advance(0.01)
        self.assertEqual(busy.transport.aborted_times, 1)
        self.successResultOf(stopped)
        self.assertIn("namespaces stopped", self.events)
        # The aborted connection cancels its review: nothing of it is left.
        busy.lose()
        self.clock.advance(0)
        self.clock.advance(0)
        self.assertTrue(lookup.called)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_no_connection_at_all_stops_at_once(self) -> None:
        service = self.start()
        self.successResultOf(service.stopService())
        self.assertEqual(self.events, ["listening", "stopped listening", "namespaces stopped"])
