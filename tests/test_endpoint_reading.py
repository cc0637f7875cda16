"""
Reading endpoint replies (amp.endpoint._reading and the reply side of
_call): body limits, status codes, redirects, what is not JSON or not the
protocol, connections cut short.

Most run against a loopback twisted.web server; the byte-exact cases on a
MemoryReactorClock (L{MemoryNet}).
"""

from __future__ import annotations

from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.internet.protocol import Factory, Protocol
from twisted.trial.unittest import SynchronousTestCase, TestCase
from twisted.web.server import Site

from amp.breaker import OPEN
from amp.config import BreakerConfig, EndpointSettings
from amp.urls import parse_endpoint_url
from tests.endpointhelpers import (
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
    Replies written byte by byte into Twisted's HTTP client.
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
