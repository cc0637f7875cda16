"""
amp's HTTP/1.1 client (amp.http._client, _pool) under the endpoint client:
what else ends a connection (bytes out of turn), how reply bodies are
framed, what is not HTTP, and what a refused reply leaves behind.  Which
replies keep their connection and the one resend are in
C{test_endpoint_closing.py}.

Byte-exact, on a MemoryReactorClock (L{MemoryNet}): the test writes the
endpoint's bytes and closes its connections.
"""

from __future__ import annotations

from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from amp.config import BreakerConfig, EndpointSettings
from amp.endpoint import USER_AGENT
from tests.support.endpoint_harness import (
    PATCH,
    PATCH_BYTES,
    FailureAssertions,
    Harness,
    MemoryNet,
    SlowCloseTransport,
    answered_once,
    http_reply,
)

URL = "http://127.0.0.1:8090/mutate"


class _Base(SynchronousTestCase, FailureAssertions):
    def setUp(self) -> None:
        self.net = MemoryNet()
        self.h = Harness(self.net.reactor, EndpointSettings(breaker=BreakerConfig(consecutive_failures=100)))

    def first(self, reply: bytes) -> tuple[Any, Any]:
        """One call on a new connection, answered with C{reply}."""
        d = self.h.call(URL)
        proto, transport = self.net.accept(len(self.net.reactor.tcpClients) - 1)
        proto.dataReceived(reply)
        self.assertEqual(self.successResultOf(d).patch, PATCH)
        return proto, transport

    def assertReusedAfter(self, reply: bytes) -> None:
        proto, transport = self.first(reply)
        self.assertTrue(transport.connected)
        self.assertEqual(self.h.client.idle_connections(), 1)
        transport.clear()
        d = self.h.call(URL)
        self.assertEqual(self.net.attempts, 1)
        self.assertTrue(transport.value().startswith(b"POST /mutate HTTP/1.1\r\n"))
        proto.dataReceived(http_reply(PATCH_BYTES))
        self.assertEqual(self.successResultOf(d).patch, PATCH)

    def assertNotReusedAfter(self, reply: bytes) -> None:
        _, transport = self.first(reply)
        self.assertFalse(transport.connected)
        self.assertEqual(self.h.client.idle_connections(), 0)
        self.h.call(URL)
        self.assertEqual(self.net.attempts, 2)


class KeepAliveTests(_Base):
    """
    A connection goes back to the pool only after a whole reply that allows
    it, and never after bytes out of turn.
    """

    def test_a_chunked_reply_is_reused(self) -> None:
        self.assertReusedAfter(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n"
            % (len(PATCH_BYTES), PATCH_BYTES)
        )

    def test_bytes_after_the_reply_close_the_connection(self) -> None:
        # Two replies to one request, or bytes that are not HTTP: the peer
        # is out of step.
        self.assertNotReusedAfter(http_reply(PATCH_BYTES) + http_reply(b"[]"))
        self.setUp()
        self.assertNotReusedAfter(http_reply(PATCH_BYTES) + b"\x00garbage\r\n")

    def test_bytes_on_an_idle_connection_close_it(self) -> None:
        proto, transport = self.first(http_reply(PATCH_BYTES))
        proto.dataReceived(http_reply(b"[]"))
        self.assertFalse(transport.connected)
        self.h.call(URL)
        self.assertEqual(self.net.attempts, 2)

    def test_a_reply_after_an_abort_never_puts_its_connection_back(self) -> None:
        # Twisted's transports deliver nothing after abortConnection; a
        # transport that did (a connector's, in memory) must not hand the
        # next call a connection that is going away.  What stops it: the
        # cancelled call's reply budget is closed, and refuses even an
        # empty body.
        d = self.h.call(URL)
        proto, transport = self.net.accept(transport_class=SlowCloseTransport)
        d.cancel()
        self.failureResultOf(d)
        self.assertTrue(transport.disconnecting)
        # An empty body: a reply that takes no bytes from the budget.
        proto.dataReceived(http_reply(b""))
        self.assertEqual(self.h.client.idle_connections(), 0)
        self.h.call(URL)
        self.assertEqual(self.net.attempts, 2)
        transport.closed()

    def test_a_gzipped_body_is_not_decoded(self) -> None:
        d = self.h.call(URL)
        proto, _ = self.net.accept()
        gzipped = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03\x8b\x8e\x05\x00)\xbb L\x02\x00\x00\x00"
        proto.dataReceived(http_reply(gzipped, extra=b"Content-Encoding: gzip\r\n"))
        self.assertReason(d, "invalid-json")


class NotHTTPTests(_Base):
    """
    What llhttp refuses is an invalid reply, named with llhttp's reason,
    and its connection is closed.
    """

    def test_refused_framings(self) -> None:
        for reply, fragment in (
            (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n[]", "Content-Length"),
            (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n[]", "Transfer-Encoding"),
            (b"HTTP/1.1 200 OK\r\nContent-Length: -2\r\n\r\n[]", "Content-Length"),
            (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n2\r\n[]\r\n0\r\n\r\n", "'gzip'"),
            (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n[]", "Transfer-Encoding"),
            (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n[]\r\n0\r\n\r\n", "chunk size"),
            (b"SMTP ready\r\n", "HTTP/1.1"),
        ):
            _, d, _, transport = answered_once(reply)
            e = self.assertReason(d, "invalid-reply")
            self.assertIn(fragment, e.message, reply)
            self.assertFalse(transport.connected)

    def test_the_request_is_written_as_docs_endpoints_shows_it(self) -> None:
        self.h.call(URL, body=b'{"kind":"Pod"}')
        _, transport = self.net.accept()
        head, _, body = transport.value().partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        self.assertEqual(
            lines[:5],
            [
                b"POST /mutate HTTP/1.1",
                b"Host: 127.0.0.1:8090",
                b"Content-Type: application/json",
                b"Accept: application/json",
                b"User-Agent: " + USER_AGENT,
            ],
        )
        self.assertIn(b"X-Amp-Namespace: team", lines)
        self.assertIn(b"X-Amp-Uid: u-1", lines)
        self.assertIn(b"Content-Length: 14", lines)
        self.assertEqual(body, b'{"kind":"Pod"}')

    def test_a_header_value_with_a_line_break_is_never_sent(self) -> None:
        from amp.deadline import Deadline
        from amp.endpoint import EndpointRequest, deferred_call
        from amp.urls import parse_endpoint_url

        d = deferred_call(
            self.h.client,
            EndpointRequest(
                parse_endpoint_url(URL),
                self.h.settings,
                b"{}",
                {b"x-amp-namespace": b"a\r\nX-Injected: 1"},
                Deadline.after(0, 5.0),
            ),
        )
        e = self.assertReason(d, "connection-failed")
        self.assertIn("line break", e.message)
        self.assertEqual(self.net.attempts, 0)


class FramingTests(_Base):
    """
    What RFC 9112 asks of a client that llhttp leaves to amp: obs-fold
    unfolded wherever the reads split it (section 5.2), and trailers
    counted against the head's limits while they arrive.
    """

    FOLDED = (
        b"HTTP/1.1 200 OK\r\nConnection: keep-alive,\r\n \t close\r\nX-Note: a\r\n\tb\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(PATCH_BYTES), PATCH_BYTES)
    )

    def test_obs_fold_is_unfolded_wherever_the_reads_split_it(self) -> None:
        # Unfolded, Connection is "keep-alive, close": the connection is
        # closed after the reply, at every split into two reads.
        for cut in range(1, len(self.FOLDED)):
            self.setUp()
            d = self.h.call(URL)
            proto, transport = self.net.accept()
            proto.dataReceived(self.FOLDED[:cut])
            proto.dataReceived(self.FOLDED[cut:])
            self.assertEqual(self.successResultOf(d).patch, PATCH, cut)
            self.assertFalse(transport.connected, cut)
            self.assertEqual(self.h.client.budget.held, 0)

    def test_obs_fold_one_byte_a_read(self) -> None:
        d = self.h.call(URL)
        proto, transport = self.net.accept()
        for i in range(len(self.FOLDED)):
            proto.dataReceived(self.FOLDED[i : i + 1])
        self.assertEqual(self.successResultOf(d).patch, PATCH)
        self.assertFalse(transport.connected)

    def test_a_fold_in_the_body_is_body(self) -> None:
        body = b'[{"op":"add","path":"/metadata/labels/a","value":"x\\r\\n y"}]'
        reply = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        _, d, _, _ = answered_once(reply)
        self.assertEqual(self.successResultOf(d).patch[0]["value"], "x\r\n y")

    def test_trailer_lines_count_with_the_head_lines(self) -> None:
        settings = EndpointSettings(max_response_headers=5)
        head = b"HTTP/1.1 200 OK\r\nA: 1\r\nB: 2\r\nTransfer-Encoding: chunked\r\n\r\n"
        body = b"%x\r\n%s\r\n0\r\n" % (len(PATCH_BYTES), PATCH_BYTES)
        # 3 head lines and 2 trailers: within; a third trailer: one too many.
        _, d, _, transport = answered_once(head + body + b"T1: a\r\nT2: b\r\n\r\n", settings)
        self.assertEqual(self.successResultOf(d).patch, PATCH)
        self.assertTrue(transport.connected)
        _, d, _, transport = answered_once(head + body + b"T1: a\r\nT2: b\r\nT3: c\r\n\r\n", settings)
        e = self.assertReason(d, "response-headers-too-large")
        self.assertIn("max_response_headers", e.message)
        self.assertFalse(transport.connected)

    def test_trailer_bytes_count_with_the_head_bytes_as_they_arrive(self) -> None:
        settings = EndpointSettings(max_response_header_size=1024)
        head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        h, d, proto, transport = answered_once(
            head + b"%x\r\n%s\r\n0\r\nX-Big: " % (len(PATCH_BYTES), PATCH_BYTES), settings
        )
        self.assertNoResult(d)
        # The field never ends: refused at the read that passes the limit.
        for _ in range(3):
            proto.dataReceived(b"v" * 300)
        self.assertNoResult(d)
        proto.dataReceived(b"v" * 300)
        e = self.assertReason(d, "response-headers-too-large")
        self.assertIn("trailers are larger than the 1024 byte limit", e.message)
        self.assertFalse(transport.connected)
        self.assertEqual(h.client.budget.held, 0)


class MemoryTests(_Base):
    def test_a_refused_reply_leaves_nothing_behind(self) -> None:
        """
        Once a refused reply's connection has closed, nothing holds its
        connection or its bytes: a hostile endpoint refused again and again
        cannot grow amp's memory.
        """
        import gc
        import weakref

        for reply in (
            b"HTTP/1.1 200 OK\r\nContent-Length: 2000000\r\n\r\n[",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1000\r\n" + b" " * 4096,
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n[]",
        ):
            h, d, proto, transport = answered_once(reply, EndpointSettings(max_response=1000))
            self.failureResultOf(d)
            self.assertFalse(transport.connected)
            gone = weakref.ref(proto)
            del proto, transport, d, h
            gc.collect()
            self.assertIsNone(gone(), reply[:60])
