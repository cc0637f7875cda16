"""
Reading endpoint replies (amp.http._client, _replyhead and the reply side of
_call): body limits, status codes, redirects, what is not JSON or not the
protocol, connections cut short.

Most run against a loopback twisted.web server; the byte-exact cases on a
MemoryReactorClock (L{MemoryNet}).
"""

from __future__ import annotations

from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import Deferred, inlineCallbacks
from twisted.internet.protocol import Factory, Protocol
from twisted.trial.unittest import SynchronousTestCase, TestCase
from twisted.web.server import Site

from amp.breaker import CLOSED, OPEN
from amp.config import BreakerConfig, EndpointSettings
from amp.urls import parse_endpoint_url
from tests.support.endpoint_harness import (
    PATCH,
    Endpoint,
    FailureAssertions,
    Harness,
    LoopbackServer,
    MemoryNet,
    RealHarness,
    http_reply,
)

URL = "http://127.0.0.1:8090/mutate"


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


class LoopbackReplyTests(TestCase, FailureAssertions):
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
        self.assertEqual(h.client.idle_connections(), 0)

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
        self.assertEqual(h.client.idle_connections(), 0)
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
        yield self.assertFailsWith(h.call(url), "timeout")
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
        yield self.assertFailsWith(h.call(url), "breaker-open")
        self.assertEqual((self.server.accepted, self.resource.hits[b"/status/500"]), (accepted, hits))
        self.assertEqual(h.transitions, [(parse_endpoint_url(url).origin, OPEN)])


class MemoryReplyTests(SynchronousTestCase, FailureAssertions):
    """
    Replies written byte by byte into amp's HTTP client.
    """

    def setUp(self) -> None:
        self.net = MemoryNet()

    def call(self, **settings: Any) -> tuple[Harness, Any, Any, Any]:
        h = Harness(self.net.reactor, EndpointSettings(**settings))
        d = h.call(URL)
        proto, transport = self.net.accept()
        return h, d, proto, transport

    def test_body_at_the_limit_is_read(self) -> None:
        _, d, proto, _ = self.call(max_response=2)
        proto.dataReceived(http_reply(b"[]"))
        self.assertEqual(self.successResultOf(d).patch, [])

    def test_body_over_the_limit_without_a_length_fails_as_it_passes_it(self) -> None:
        _, d, proto, transport = self.call(max_response=10)
        proto.dataReceived(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        proto.dataReceived(b"8\r\n[       \r\n")
        self.assertNoResult(d)
        proto.dataReceived(b"8\r\n        \r\n")
        e = self.assertReason(d, "response-too-large")
        self.assertIn("10 byte limit", e.message)
        self.assertFalse(transport.connected)

    def test_content_length_over_the_limit_fails_on_the_head(self) -> None:
        _, d, proto, transport = self.call(max_response=10)
        proto.dataReceived(b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n")
        e = self.assertReason(d, "response-too-large")
        self.assertIn("reply of 11 bytes", e.message)
        self.assertFalse(transport.connected)

    def test_a_status_that_is_not_a_reply(self) -> None:
        _, d, proto, _ = self.call()
        proto.dataReceived(http_reply(b"", code=600))
        e = self.assertReason(d, "invalid-reply")
        self.assertIn("600", e.message)

    def test_the_connection_closing_before_the_head_is_a_reset(self) -> None:
        _, d, proto, transport = self.call()
        proto.dataReceived(b"HTTP/1.1 200 OK\r\nContent-")
        transport.loseConnection()
        self.assertReason(d, "connection-reset")


# ---------------------------------------------------------------- reply heads


class HeadLimitTests(SynchronousTestCase, FailureAssertions):
    """
    A reply's head (status line and headers) is bounded in lines and bytes
    while it streams in: llhttp bounds neither.
    """

    def setUp(self) -> None:
        self.net = MemoryNet()

    def call(self, **settings: Any) -> tuple[Harness, Any, Any, Any]:
        settings.setdefault("breaker", BreakerConfig(consecutive_failures=1))
        h = Harness(self.net.reactor, EndpointSettings(**settings))
        d = h.call(URL)
        proto, transport = self.net.accept()
        return h, d, proto, transport

    def assertRefused(self, h: Harness, d: Any, transport: Any, fragment: str) -> None:
        e = self.assertReason(d, "response-headers-too-large")
        self.assertIn(fragment, e.message)
        # Aborted at once, not closed gracefully or left to the timeout.
        self.assertTrue(transport.aborted)
        self.assertFalse(transport.connected)
        self.assertEqual(h.count(URL, "response-headers-too-large"), 1)
        # The endpoint's fault, like an oversized body: the breaker counts it.
        self.assertEqual(h.breaker(URL).state, OPEN)
        self.assertEqual(h.client.budget.held, 0)

    def test_many_short_header_lines_are_refused_as_they_arrive(self) -> None:
        h, d, proto, transport = self.call(max_response_headers=100)
        proto.dataReceived(b"HTTP/1.1 200 OK\r\n")
        for i in range(100):
            proto.dataReceived(b"X-H%d: v\r\n" % i)
        self.assertNoResult(d)
        proto.dataReceived(b"X-H100: v\r\n")
        self.assertRefused(h, d, transport, "more than 100 header lines (endpoints.max_response_headers)")

    def test_the_default_bounds_a_flood_of_short_lines_in_one_read(self) -> None:
        h, d, proto, transport = self.call()
        proto.dataReceived(b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-H%d: v\r\n" % i for i in range(10_000)))
        self.assertRefused(h, d, transport, "more than 100 header lines")

    def test_header_bytes_over_the_size_are_refused(self) -> None:
        h, d, proto, transport = self.call(max_response_header_size=1024)
        proto.dataReceived(b"HTTP/1.1 200 OK\r\n")
        line = b"X-Padding: " + b"p" * 87 + b"\r\n"
        for _ in range(10):
            proto.dataReceived(line)
        self.assertNoResult(d)
        proto.dataReceived(line)
        self.assertRefused(h, d, transport, "larger than the 1024 byte limit (endpoints.max_response_header_size)")

    def test_a_huge_single_header_is_refused_before_it_ends(self) -> None:
        h, d, proto, transport = self.call()
        proto.dataReceived(b"HTTP/1.1 200 OK\r\nX-Big: ")
        for _ in range(4):
            proto.dataReceived(b"b" * 4000)
        self.assertNoResult(d)
        proto.dataReceived(b"b" * 4000)
        self.assertRefused(h, d, transport, "larger than the 16384 byte limit")

    def test_a_line_longer_than_twisted_reads_is_named_too(self) -> None:
        # With a larger head allowed, one line is still bounded: the parser
        # holds a header whole before amp sees it.
        h, d, proto, transport = self.call(max_response_header_size=1024 * 1024)
        proto.dataReceived(b"HTTP/1.1 200 OK\r\nX-Big: " + b"b" * 20000)
        self.assertRefused(h, d, transport, "a reply header line is longer than 16384 bytes")

    def test_interim_heads_count_towards_the_limit(self) -> None:
        # A 1xx head is skipped and the next read: they cannot be a way
        # around the limit.
        h, d, proto, transport = self.call(max_response_header_size=1024)
        for _ in range(40):
            proto.dataReceived(b"HTTP/1.1 100 Continue\r\n\r\n")
        self.assertNoResult(d)
        proto.dataReceived(b"HTTP/1.1 100 Continue\r\n\r\n" * 10)
        self.assertRefused(h, d, transport, "larger than the 1024 byte limit")

    def test_every_status_line_twisted_takes_for_interim_counts_as_one(self) -> None:
        # However a 1xx code is written (Twisted's parser read these as 1xx;
        # llhttp refuses all but three digits), the count goes on through it.
        for status in (
            b"HTTP/1.1 100",
            b"HTTP/1.1 +100 Continue",
            b"HTTP/1.1 " + b"0" * 40 + b"100 Continue",
            b"HTTP/1.1 199 Anything",
        ):
            net = MemoryNet()
            h = Harness(net.reactor, EndpointSettings(max_response_headers=100))
            d = h.call(URL)
            proto, transport = net.accept()
            proto.dataReceived(status + b"\r\n\r\nHTTP/1.1 200 OK\r\n" + b"X-H: v\r\n" * 101)
            e = self.assertReason(d, "response-headers-too-large")
            self.assertIn("more than 100 header lines", e.message, status)

    def test_a_whole_head_in_one_read_is_held_to_the_same_limits(self) -> None:
        for head, fragment in (
            (b"HTTP/1.1 200 OK\r\n" + b"X-H: v\r\n" * 101 + b"Content-Length: 2\r\n\r\n[]", "header lines"),
            (b"HTTP/1.1 200 OK\r\nX-Big: " + b"b" * 17000 + b"\r\nContent-Length: 2\r\n\r\n[]", "byte limit"),
            # Bare line feeds end a head too: the CRLFs in the body are not its end.
            (b"HTTP/1.1 200 OK\n" + b"X-H: v\n" * 101 + b"\n" + b"\r\n\r\n", "header lines"),
        ):
            net = MemoryNet()
            h = Harness(net.reactor)
            d = h.call(URL)
            proto, _ = net.accept()
            proto.dataReceived(head)
            e = self.assertReason(d, "response-headers-too-large")
            self.assertIn(fragment, e.message)

    def test_a_head_with_bare_line_feeds_is_read(self) -> None:
        h, d, proto, _ = self.call()
        proto.dataReceived(b"HTTP/1.1 200 OK\nContent-Length: 6\n\n[]\r\n\r\n")
        self.assertEqual(self.successResultOf(d).patch, [])

    def test_an_interim_head_then_the_reply_is_read(self) -> None:
        h, d, proto, _ = self.call()
        proto.dataReceived(b"HTTP/1.1 100 Continue\r\n\r\n" + http_reply(b"[]"))
        self.assertEqual(self.successResultOf(d).patch, [])

    def test_a_body_after_a_small_head_is_not_a_head(self) -> None:
        body = b'[{"op": "add", "path": "/metadata/labels", "value": {"a": "' + b"x" * 20_000 + b'"}}]'
        h, d, proto, _ = self.call(max_response_header_size=256, max_response_headers=3)
        proto.dataReceived(http_reply(body))
        self.assertEqual(len(self.successResultOf(d).patch), 1)

    def test_each_reply_on_a_connection_has_its_own_limit(self) -> None:
        h, d, proto, transport = self.call(max_response_headers=10)
        head = b"".join(b"X-H%d: v\r\n" % i for i in range(8))
        proto.dataReceived(http_reply(b"[]", extra=head))
        self.successResultOf(d)
        d = h.call(URL)
        self.assertEqual(self.net.attempts, 1)
        proto.dataReceived(http_reply(b"[]", extra=head))
        self.successResultOf(d)

    def test_a_head_is_held_from_the_budget_until_its_reply_is_over(self) -> None:
        h, d, proto, _ = self.call()
        head = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n"
        proto.dataReceived(head + b"[")
        # The head, and the body's announced length, are held.
        self.assertEqual(h.client.budget.held, len(head) + 2)
        proto.dataReceived(b"]")
        self.successResultOf(d)
        self.assertEqual(h.client.budget.held, 0)


class LoopbackHeadTests(TestCase, FailureAssertions):
    timeout = 15

    @inlineCallbacks
    def test_an_endpoint_streaming_header_lines_is_refused_long_before_its_timeout(self) -> Any:
        flood = HeaderFlood()
        server = LoopbackServer.start(self, Factory.forProtocol(lambda: flood))
        h = RealHarness(self, EndpointSettings(timeout=30.0))
        url = server.url("/mutate")
        e = yield self.assertFailsWith(h.call(url, budget=60.0), "response-headers-too-large")
        self.assertIn("header lines", e.message)
        # The endpoint sees its connection closed.
        yield flood.lost
        self.assertLess(flood.sent, 1000)


class HeaderFlood(Protocol):
    """
    Answers a request with a status line and then short header lines, one
    more every reactor turn, until the connection is gone.
    """

    def __init__(self) -> None:
        self.sent = 0
        self.lost: Deferred = Deferred()

    def dataReceived(self, data: bytes) -> None:
        if self.sent == 0:
            self.transport.write(b"HTTP/1.1 200 OK\r\n")
            self._more()

    def _more(self) -> None:
        if self.lost.called:
            return
        self.sent += 1
        self.transport.write(b"X-H%d: v\r\n" % self.sent)
        reactor.callLater(0, self._more)

    def connectionLost(self, reason: Any) -> None:
        self.lost.callback(None)


# ---------------------------------------------------------------- the reply budget over every call


class ReplyBudgetTests(SynchronousTestCase, FailureAssertions):
    """
    C{endpoints.max_buffered} bounds the bytes of replies held at once, over
    every call and origin.
    """

    def setUp(self) -> None:
        self.net = MemoryNet()

    def test_concurrent_bodies_stay_within_the_budget(self) -> None:
        limit = 10_000
        settings = EndpointSettings(max_buffered=limit, breaker=BreakerConfig(consecutive_failures=1))
        h = Harness(self.net.reactor, settings)
        budget = h.client.budget
        calls = [h.call(URL) for _ in range(4)]
        connections = [self.net.accept(i)[0] for i in range(4)]
        for proto in connections:
            proto.dataReceived(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        chunk = b"bb8\r\n" + b" " * 3000 + b"\r\n"
        for proto in connections[:3]:
            proto.dataReceived(chunk)
        self.assertLessEqual(budget.held, limit)
        # The fourth reply's 3000 bytes would put amp over the limit.
        connections[3].dataReceived(chunk)
        e = self.assertReason(calls[3], "reply-buffer-full")
        self.assertIn("endpoints.max_buffered: 10000", e.message)
        self.assertLessEqual(budget.peak, limit)
        # amp's own limit, reached by all calls together: not this endpoint's fault.
        self.assertEqual(h.breaker(URL).state, CLOSED)
        self.assertEqual(h.count(URL, "reply-buffer-full"), 1)
        for proto in connections[:3]:
            proto.dataReceived(b"2\r\n[]\r\n0\r\n\r\n")
        for d in calls[:3]:
            self.assertEqual(self.successResultOf(d).patch, [])
        self.assertEqual(budget.held, 0)

    def test_a_known_length_amp_cannot_hold_is_refused_at_once(self) -> None:
        h = Harness(self.net.reactor, EndpointSettings(max_buffered=5_000))
        first = h.call(URL)
        proto, _ = self.net.accept()
        proto.dataReceived(b"HTTP/1.1 200 OK\r\nContent-Length: 4000\r\n\r\n[")
        second = h.call(URL)
        proto2, transport2 = self.net.accept()
        proto2.dataReceived(b"HTTP/1.1 200 OK\r\nContent-Length: 2000\r\n\r\n")
        self.assertReason(second, "reply-buffer-full")
        self.assertFalse(transport2.connected)
        self.assertNoResult(first)

    def test_heads_are_held_from_the_budget_too(self) -> None:
        h = Harness(self.net.reactor, EndpointSettings(max_buffered=100))
        d = h.call(URL)
        proto, transport = self.net.accept()
        proto.dataReceived(b"HTTP/1.1 200 OK\r\n" + b"X-Padding: " + b"p" * 100 + b"\r\n")
        self.assertReason(d, "reply-buffer-full")
        self.assertFalse(transport.connected)
        self.assertEqual(h.client.budget.held, 0)

    def test_hostile_calls_on_every_origin_stay_under_the_cap(self) -> None:
        """
        C{max_concurrent} calls on each of several origins, every reply a
        hostile one (header floods, a huge header, bodies that never end):
        what amp holds never passes C{max_buffered}, and every byte is
        handed back when the calls end.
        """
        limit = 256 * 1024
        settings = EndpointSettings(
            max_buffered=limit,
            max_concurrent=16,
            max_response=64 * 1024,
            breaker=BreakerConfig(consecutive_failures=1_000),
        )
        h = Harness(self.net.reactor, settings)
        budget = h.client.budget
        origins = [f"http://127.0.0.{i}:8090/mutate" for i in range(1, 9)]
        calls = [h.call(url) for url in origins for _ in range(16)]
        self.assertEqual(self.net.attempts, len(calls))
        connections = [self.net.accept(i) for i in range(len(calls))]
        kinds = [
            lambda: b"X-H: v\r\n" * 64,
            lambda: b"b" * 1024,
            lambda: b"1000\r\n" + b" " * 4096 + b"\r\n",
        ]
        for i, (proto, _) in enumerate(connections):
            kind = i % 3
            proto.dataReceived(
                b"HTTP/1.1 200 OK\r\n"
                + (b"X-Big: " if kind == 1 else b"")
                + (b"Transfer-Encoding: chunked\r\n\r\n" if kind == 2 else b"")
            )
        for _ in range(40):
            for i, (proto, transport) in enumerate(connections):
                if transport.connected:
                    proto.dataReceived(kinds[i % 3]())
                    self.assertLessEqual(budget.held, limit)
        reasons = {self.failureResultOf(d).value.reason for d in calls}
        self.assertLessEqual(reasons, {"response-headers-too-large", "response-too-large", "reply-buffer-full"})
        self.assertIn("reply-buffer-full", reasons)
        self.assertLessEqual(budget.peak, limit)
        self.assertEqual(budget.held, 0)


# ---------------------------------------------------------------- what is not JSON


class NotJSONTests(SynchronousTestCase, FailureAssertions):
    def test_a_deeply_nested_reply_is_invalid_json_without_a_traceback(self) -> None:
        net = MemoryNet()
        h = Harness(net.reactor, EndpointSettings(breaker=BreakerConfig(consecutive_failures=1)))
        d = h.call(URL)
        proto, _ = net.accept()
        proto.dataReceived(http_reply(b"[" * 100_000 + b"]" * 100_000))
        e = self.assertReason(d, "invalid-json")
        self.assertIn("nested deeper than 100 levels", e.message)
        self.assertEqual(self.flushLoggedErrors(), [])
        self.assertEqual(h.count(URL, "invalid-json"), 1)
        self.assertEqual(h.count(URL, "connection-failed"), 0)
