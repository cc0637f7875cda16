"""
Tests for amp's webhook listener (amp.http) in memory, the way Twisted tests
its own (C{twisted/web/test/test_http.py}): amp's assembled listener on a
L{Clock}, each connection over a L{StringTransport}.  The read deadline
(408), the idle timeout, the request-line and header limits (414, 431), the
body cap (413), the connection cap, the bounded close after a refusal and the
graceful drain at shutdown, each to the exact second of the clock; and no
input whatever (bytes, JSON, nesting, sizes) gets a 500 or logs a
traceback.

The same limits over real loopback TLS are in test_web.py and
test_hostile_clients.py.
"""

from __future__ import annotations

import json
import re
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from twisted.internet.address import IPv4Address
from twisted.internet.defer import Deferred, succeed
from twisted.internet.endpoints import serverFromString
from twisted.internet.error import ConnectionDone
from twisted.internet.interfaces import IListeningPort, IStreamServerEndpoint
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.logger import LogLevel, formatEvent, globalLogPublisher
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer

from amp import http
from amp.logs import RepeatLimiter
from amp.metrics import Metrics
from amp.namespaces import UNKNOWN, INamespaceSource, StaticNamespaceSource
from amp.service import AmpService, serving_certificate
from tests.support.helpers import (
    UID,
    decode_answer,
    make_config,
    namespace,
    parse_raw_response,
    pod,
    review,
    review_bytes,
)

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

    def __init__(self, channel: http.HTTPServerProtocol, transport: Transport) -> None:
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
    def site(self, **listen: Any) -> http.HTTPServerFactory:
        """
        amp's webhook site as L{AmpService} assembles it, on
        C{self.clock}; C{team-a} is not enabled, so a review is answered
        at once without an endpoint call.
        """
        self.clock = MemoryReactorClock()
        config = make_config({"team-a": namespace(enabled=False)}, listen=listen)
        metrics = Metrics()
        service = AmpService(
            config,
            self.clock,
            certificate=serving_certificate(config.tls, self.clock, metrics),
            webhook_endpoint=serverFromString(self.clock, "tcp:0"),
            metrics_endpoint=None,
            namespaces=StaticNamespaceSource(config.kubernetes),
            metrics=metrics,
            install_sighup=False,
        )
        self.metrics = metrics
        return service.webhook_server

    def held(self, drain_timeout: str = "5s") -> AmpService:
        """
        amp, started, whose every review waits on a namespace lookup the
        test answers (C{self.source}, a L{HeldSource}); C{self.events}
        records when it listens, stops listening and stops the source.
        """
        self.clock = MemoryReactorClock()
        self.events: list[str] = []
        config = make_config(listen={"drain_timeout": drain_timeout})
        self.metrics = Metrics()
        self.source = HeldSource(self.events)
        service = AmpService(
            config,
            self.clock,
            certificate=serving_certificate(config.tls, self.clock, self.metrics),
            webhook_endpoint=ListeningAtOnce(self.events),
            metrics_endpoint=None,
            namespaces=self.source,
            metrics=self.metrics,
            install_sighup=False,
        )
        service.startService()
        return service

    def connect(self, site: http.HTTPServerFactory) -> Connection:
        transport = Transport(peerAddress=IPv4Address("TCP", "127.0.0.1", 40000))
        channel = site.buildProtocol(transport.getPeer())
        channel.makeConnection(transport)
        return Connection(channel, transport)

    def timers(self) -> list[Any]:
        """The clock's pending calls, but for the log limiter's interval timers."""
        return [
            call
            for call in self.clock.getDelayedCalls()
            if not isinstance(getattr(call.func, "__self__", None), RepeatLimiter)
        ]

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
        self.assertEqual(self.timers(), [])

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
        self.clock.advance(http.CLOSE_GRACE)
        self.assertEqual(c.transport.aborted_times, 1)


class HeaderLimitTests(ChannelTestCase):
    """
    Oversized request lines and headers are refused as soon as what has
    arrived says so: the client never finishes the oversized part here.
    """

    def test_a_request_line_over_the_limit_is_414(self) -> None:
        site = self.site()
        c = self.connect(site)
        c.send(b"POST /" + b"a" * (http.MAX_LINE + 100))
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
        c.send(HEAD + b"".join(b"X-H%d: v\r\n" % i for i in range(http.MAX_HEADERS + 1)))
        self.assertRefused(c, 431, b"more than %d header fields" % http.MAX_HEADERS)

    def test_headers_over_the_total_size_is_431(self) -> None:
        site = self.site()
        c = self.connect(site)
        line = b"X-Pad: " + b"p" * 1000 + b"\r\n"
        count = http.MAX_HEAD_BYTES // len(line) + 1
        self.assertLess(count, http.MAX_HEADERS)
        c.send(HEAD + line * count)
        self.assertRefused(c, 431, b"request headers are over %d bytes" % http.MAX_HEAD_BYTES)

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
        self.clock.advance(http.CLOSE_GRACE - 0.01)
        self.assertEqual(c.transport.aborted_times, 0)
        self.clock.advance(0.01)
        self.assertEqual(c.transport.aborted_times, 1)

    def test_a_refused_connection_is_aborted_once_too_much_was_dropped(self) -> None:
        site = self.site(max_body=1024)
        c = self.connect(site)
        c.send(post_head(10 * 1024 * 1024))
        c.send(b"z" * http.LINGER_BYTES)
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
        self.assertEqual(self.timers(), [])


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
class ListeningAtOnce:
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
        return self.held(drain_timeout)

    def review(self, site: http.HTTPServerFactory, uid: str) -> Connection:
        c = self.connect(site)
        body = review_bytes(uid=uid)
        c.send(post_head(len(body)) + body)
        return c

    def answer_of(self, c: Connection) -> tuple[int, dict, bytes]:
        return parse_raw_response(c.received())

    def test_reviews_in_flight_are_answered_then_every_connection_closes_then_amp_stops(self) -> None:
        service = self.start()
        site = service.webhook_server
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
        busy = self.review(service.webhook_server, "hung")
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
        self.assertEqual(self.timers(), [])

    def test_a_connection_yet_to_send_its_first_request_is_answered_then_closed(self) -> None:
        service = self.start()
        fresh = self.connect(service.webhook_server)
        stopped = service.stopService()
        self.assertFalse(fresh.transport.disconnecting)
        body = review_bytes(uid="first")
        fresh.send(post_head(len(body)) + body)
        self.source.answer()
        status, headers, content = self.answer_of(fresh)
        self.assertEqual(status, 200)
        self.assertEqual(decode_answer(content)["response"]["uid"], "first")
        self.assertEqual(headers[b"connection"], b"close")
        self.assertTrue(fresh.transport.disconnecting)
        self.assertNoResult(stopped)
        fresh.lose()
        self.successResultOf(stopped)

    def test_a_request_line_half_received_is_answered(self) -> None:
        service = self.start()
        half = self.connect(service.webhook_server)
        body = review_bytes(uid="half-line")
        head = post_head(len(body))
        half.send(head[:8])
        stopped = service.stopService()
        half.send(head[8:] + body)
        self.source.answer()
        status, headers, content = self.answer_of(half)
        self.assertEqual(status, 200)
        self.assertEqual(decode_answer(content)["response"]["uid"], "half-line")
        self.assertEqual(headers[b"connection"], b"close")
        half.lose()
        self.successResultOf(stopped)

    def test_a_connection_that_never_sends_a_request_is_aborted_at_its_read_deadline(self) -> None:
        service = self.start(drain_timeout="30s")
        silent = self.connect(service.webhook_server)
        stopped = service.stopService()
        self.clock.advance(service.config.listen.request_timeout - 0.01)
        self.assertEqual(silent.transport.aborted_times, 0)
        self.clock.advance(0.01)
        self.assertEqual(silent.transport.aborted_times, 1)
        self.assertEqual(silent.received(), b"")
        silent.lose()
        self.successResultOf(stopped)

    def test_no_connection_at_all_stops_at_once(self) -> None:
        service = self.start()
        self.successResultOf(service.stopService())
        self.assertEqual(self.events, ["listening", "stopped listening", "namespaces stopped"])


class FloodTests(ChannelTestCase):
    """
    A flood of one kind of hostile client writes a few log lines and then
    one summary per interval, while the metrics count every one.
    """

    def setUp(self) -> None:
        self.events: list[dict[str, Any]] = []
        globalLogPublisher.addObserver(self.events.append)
        self.addCleanup(globalLogPublisher.removeObserver, self.events.append)

    def lines(self, text: str) -> list[str]:
        return [m for m in (formatEvent(e) for e in self.events) if text in m]

    def dropped(self, reason: str) -> float:
        return self.metrics.registry.get_sample_value("amp_connections_dropped_total", {"reason": reason}) or 0.0

    def test_connections_over_the_cap(self) -> None:
        site = self.site(max_connections=2)
        held = [self.connect(site), self.connect(site)]
        for _ in range(1500):
            self.connect(site).lose()
        self.assertEqual(self.dropped("max-connections"), 1500)
        self.assertEqual(len(self.lines("Connection refused")), http.WARNING_BURST)
        self.clock.advance(http.WARNING_INTERVAL)
        self.assertEqual(
            self.lines("more connections refused"),
            [
                f"{1500 - http.WARNING_BURST} more connections refused over listen.max_connections in the last "
                f"{http.WARNING_INTERVAL:g}s (only the first {http.WARNING_BURST} of a burst are logged)"
            ],
        )
        self.assertEqual(site.open_connections, len(held))

    def test_oversized_requests(self) -> None:
        site = self.site(max_body=1024)
        for _ in range(300):
            c = self.connect(site)
            c.send(post_head(10 * 1024 * 1024))
            c.lose()
        self.assertEqual(self.bad_requests(413), 300)
        self.assertEqual(len(self.lines("Refused a request: 413")), http.WARNING_BURST)
        self.clock.advance(http.WARNING_INTERVAL)
        [summary] = self.lines("more requests refused before review")
        self.assertTrue(summary.startswith(f"{300 - http.WARNING_BURST} more"), summary)

    def test_timed_out_clients(self) -> None:
        site = self.site(request_timeout="1s")
        silent = [self.connect(site) for _ in range(200)]
        slow = []
        for _ in range(100):
            c = self.connect(site)
            c.send(post_head(10))
            slow.append(c)
        self.clock.advance(1)
        self.assertEqual(self.dropped("no-request"), 200)
        self.assertEqual(self.bad_requests(408), 100)
        self.assertEqual(
            len(self.lines("sent no request")) + len(self.lines("Refused a request: 408")), http.WARNING_BURST
        )
        for c in silent + slow:
            c.lose()
        self.clock.advance(http.WARNING_INTERVAL)
        [summary] = self.lines("more clients timed out")
        self.assertTrue(summary.startswith(f"{300 - http.WARNING_BURST} more"), summary)

    def test_a_stopping_listener_writes_what_it_counted(self) -> None:
        site = self.site(max_connections=1)
        self.connect(site)
        for _ in range(20):
            self.connect(site).lose()
        site.doStart()
        site.doStop()
        [summary] = self.lines("more connections refused")
        self.assertTrue(summary.startswith(f"{20 - http.WARNING_BURST} more"), summary)
        # The limiter's own timer is gone with the listener.
        self.assertEqual(len(self.timers()), len(self.clock.getDelayedCalls()))


# ---------------------------------------------------------------- no 500 for any input

#: What amp's listener may answer: its own refusals and 200 reviews.
ALLOWED_STATUSES = {100, 200, 400, 404, 405, 408, 413, 414, 415, 431}

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=10**300, max_value=10**400)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)

#: Where in an AdmissionReview a generated value goes.
PLACES = [
    (),
    ("request",),
    ("request", "object"),
    ("request", "uid"),
    ("request", "object", "metadata"),
    ("request", "object", "metadata", "annotations"),
    ("request", "object", "spec", "containers"),
    ("apiVersion",),
    ("kind",),
    ("request", "kind"),
    ("request", "namespace"),
    ("request", "operation"),
    ("request", "dryRun"),
    ("request", "object", "metadata", "name"),
]


def placed(doc: Any, place: tuple[str, ...], value: Any) -> Any:
    if not place:
        return value
    target = doc
    for key in place[:-1]:
        if not isinstance(target, dict):
            return doc
        target = target.setdefault(key, {})
    if isinstance(target, dict):
        target[place[-1]] = value
    return doc


def nested(depth: int, opener: str, closed: bool) -> str:
    closer = {"[": "]", '{"a":': "}"}[opener]
    return opener * depth + "1" + (closer * depth if closed else "")


class NoServerErrorTests(ChannelTestCase):
    """
    Whatever a client sends, amp's listener answers with one of its own
    refusals or a 200 review, never Twisted's "500 Processing Failed" page,
    and logs no traceback.
    """

    def setUp(self) -> None:
        self.events: list[dict[str, Any]] = []
        globalLogPublisher.addObserver(self.events.append)
        self.addCleanup(globalLogPublisher.removeObserver, self.events.append)
        self.fuzzed = self.site(max_body="64KiB", request_timeout="2s")
        # team-a is not enabled; "on" is enabled with an endpoint the
        # allow-list refuses, so its reviews end in the failure policy.
        self.on = make_config({"on": namespace("https://not-allowed.example/x")})

    def exchange(self, *chunks: bytes) -> bytes:
        c = self.connect(self.fuzzed)
        for chunk in chunks:
            if c.transport.disconnecting:
                break
            c.send(chunk)
        self.clock.advance(2)
        self.clock.advance(http.CLOSE_GRACE)
        self.clock.advance(0)
        self.clock.advance(0)
        c.lose()
        return c.received()

    def check(self, data: bytes) -> list[int]:
        statuses = []
        for m in re.finditer(rb"(?:^|\r\n)HTTP/1\.1 (\d{3}) [^\r]*\r\n(.*?)\r\n\r\n", data, re.S):
            status = int(m.group(1))
            statuses.append(status)
            self.assertIn(status, ALLOWED_STATUSES, data[:500])
            if status != 100:
                headers = dict(line.split(b": ", 1) for line in m.group(2).split(b"\r\n"))
                # amp's own answers: plain text, or an AdmissionReview; never an HTML error page.
                self.assertIn(
                    headers.get(b"Content-Type", headers.get(b"content-type")),
                    (b"text/plain; charset=utf-8", b"application/json"),
                    data[:500],
                )
        self.assertNotIn(b"Processing Failed", data)
        failures = [
            e for e in self.events if "log_failure" in e or e.get("log_level") in (LogLevel.error, LogLevel.critical)
        ]
        self.assertEqual(failures, [], [formatEvent(e) for e in failures])
        self.events.clear()
        return statuses

    def post(
        self,
        body: bytes,
        query: bytes = b"timeout=10s",
        content_type: bytes = b"application/json",
        path: bytes = b"/mutate",
    ) -> list[int]:
        head = (
            b"POST "
            + path
            + b"?"
            + query
            + b" HTTP/1.1\r\nHost: amp\r\nContent-Type: "
            + content_type
            + b"\r\nContent-Length: %d\r\n\r\n" % len(body)
        )
        return self.check(self.exchange(head + body))

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.lists(st.binary(min_size=1, max_size=2048), min_size=1, max_size=4))
    def test_arbitrary_bytes(self, chunks: list[bytes]) -> None:
        self.check(self.exchange(*chunks))

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.lists(st.binary(min_size=1, max_size=512), min_size=1, max_size=3))
    def test_arbitrary_bytes_after_a_valid_request_head(self, chunks: list[bytes]) -> None:
        self.check(self.exchange(b"POST /mutate HTTP/1.1\r\nHost: amp\r\n", *chunks))

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        json_values,
        st.sampled_from(PLACES),
        st.sampled_from(["team-a", "on", "missing", ""]),
        st.sampled_from([b"/mutate", b"/validate"]),
    )
    def test_arbitrary_json_anywhere_in_a_review(
        self, value: Any, place: tuple[str, ...], ns: str, path: bytes
    ) -> None:
        doc = placed(review(namespace=ns), place, value)
        body = json.dumps(doc, allow_nan=True).encode()
        self.assertIn(self.post(body, path=path), ([200], [400]))

    @settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        st.integers(min_value=1, max_value=100_000),
        st.sampled_from(["[", '{"a":']),
        st.booleans(),
        st.sampled_from(["body", "object", "uid", "annotation"]),
        st.sampled_from(["team-a", "on"]),
    )
    def test_deep_nesting(self, depth: int, opener: str, closed: bool, where: str, ns: str) -> None:
        deep = nested(depth, opener, closed)
        if where == "body":
            body = deep
        else:
            marker = "\u0000deep\u0000"
            place = {
                "object": ("request", "object"),
                "uid": ("request", "uid"),
                "annotation": ("request", "object", "metadata", "annotations"),
            }[where]
            body = json.dumps(placed(review(namespace=ns), place, marker)).replace(json.dumps(marker), deep)
        statuses = self.post(body.encode())
        self.assertIn(statuses, ([200], [400], [413]))

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.integers(min_value=0, max_value=100 * 1024), st.sampled_from(["team-a", "on"]))
    def test_sizes(self, padding: int, ns: str) -> None:
        doc = review(pod(annotations={"pad": "x" * padding}), namespace=ns)
        body = json.dumps(doc).encode()
        statuses = self.post(body)
        self.assertEqual(statuses, [413] if len(body) > 64 * 1024 else [200])

    @settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.binary(max_size=64), st.binary(max_size=40), st.sampled_from(["team-a", "on"]))
    def test_arbitrary_query_and_content_type(self, query: bytes, content_type: bytes, ns: str) -> None:
        query = bytes(b for b in query if b not in b" \r\n#")
        content_type = bytes(b for b in content_type if b not in b"\r\n")
        self.post(review_bytes(namespace=ns), query=query, content_type=content_type)

    def test_non_finite_numbers_and_huge_integers(self) -> None:
        for token in (b"NaN", b"Infinity", b"-Infinity", b"1e999", b"9" * 5000):
            body = review_bytes(namespace="on").replace(b'"nginx:1.25"', token)
            self.assertIn(self.post(body), ([200], [400]))

    def test_a_bug_while_rendering_is_amps_own_plain_500(self) -> None:
        """No input leads here; a bug of amp's still gets no HTML page."""

        def broken(request: Any) -> None:
            raise RuntimeError("a bug")

        self.fuzzed.routes[b"/broken"] = broken
        c = self.connect(self.fuzzed)
        c.send(b"GET /broken HTTP/1.1\r\nHost: amp\r\n\r\n")
        status, headers, body = parse_raw_response(c.received())
        self.assertEqual((status, body), (500, b"amp internal error\n"))
        self.assertEqual(headers[b"content-type"], b"text/plain; charset=utf-8")
        self.assertEqual(headers[b"connection"], b"close")
        self.assertTrue(c.transport.disconnecting)
        [failure] = [e for e in self.events if "log_failure" in e]
        self.assertIn("a bug", str(failure["log_failure"].value))
        self.flushLoggedErrors(RuntimeError)
        self.events.clear()
