"""
Endpoints that end their connections: a connection goes back to the pool
only when the reply allows it (RFC 9112 section 9.3: never after an HTTP/1.0
reply without C{Connection: keep-alive}, after C{Connection: close}, or after
a body that ended with the close), and a call that finds a kept-alive
connection closed by the endpoint before any byte of its reply is sent once
more on a new connection, within the same time and counted once.

The client runs on a L{MemoryReactorClock} (L{MemoryNet}), where every
connection and byte is the test's.  C{http.server} endpoints on loopback, the
smallest endpoint an author can write, through the client, a running amp and
C{amp explain}: tests/integration/loopback/test_endpoint_closing.py.
"""

from __future__ import annotations

from typing import Any

from twisted.internet import error
from twisted.internet.defer import CancelledError
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from amp.config import BreakerConfig, EndpointSettings
from tests.support.endpoint_harness import PATCH, PATCH_BYTES, FailureAssertions, Harness, MemoryNet

URL = "http://127.0.0.1:8090/mutate"


def reply(head: bytes, body: bytes = PATCH_BYTES) -> bytes:
    """A 200 reply: C{head} is its status line and headers, without the blank line."""
    return head + b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body


class ReuseTests(SynchronousTestCase, FailureAssertions):
    """
    Which replies leave their connection to the next call.
    """

    def setUp(self) -> None:
        self.net = MemoryNet()
        self.h = Harness(self.net.reactor, EndpointSettings())

    def call_on_new_connection(self, answer: bytes) -> Any:
        d = self.h.call(URL)
        proto, transport = self.net.accept()
        proto.dataReceived(answer)
        self.assertEqual(self.successResultOf(d).patch, PATCH)
        return transport

    def assertReused(self, answer: bytes) -> None:
        transport = self.call_on_new_connection(answer)
        transport.clear()
        d = self.h.call(URL)
        self.assertEqual(self.net.attempts, 1)
        self.assertIn(b"POST /mutate", transport.value())
        self.assertNoResult(d)

    def assertNotReused(self, answer: bytes) -> None:
        transport = self.call_on_new_connection(answer)
        # amp closes it as soon as the reply is read ...
        self.assertFalse(transport.connected)
        self.assertEqual(self.h.client.open_connections(), 0)
        # ... and the next call goes out on a new one.
        transport.clear()
        self.h.call(URL)
        self.assertEqual(self.net.attempts, 2)
        self.assertEqual(transport.value(), b"")

    def test_http11_is_kept(self) -> None:
        self.assertReused(reply(b"HTTP/1.1 200 OK"))

    def test_http10_is_not_kept(self) -> None:
        self.assertNotReused(reply(b"HTTP/1.0 200 OK\r\nServer: BaseHTTP/0.6 Python/3.11"))

    def test_http10_with_keep_alive_is_kept(self) -> None:
        self.assertReused(reply(b"HTTP/1.0 200 OK\r\nConnection: Keep-Alive"))

    def test_connection_close_is_not_kept(self) -> None:
        self.assertNotReused(reply(b"HTTP/1.1 200 OK\r\nConnection: close"))

    def test_connection_close_in_any_case_or_list_is_not_kept(self) -> None:
        for header in (
            b"Connection: Close",
            b"CONNECTION: CLOSE",
            b"connection: keep-alive, close",
            b"Connection: upgrade\r\nConnection:close",
        ):
            with self.subTest(header=header):
                self.setUp()
                self.assertNotReused(reply(b"HTTP/1.1 200 OK\r\n" + header))

    def test_http10_keep_alive_with_close_is_not_kept(self) -> None:
        self.assertNotReused(reply(b"HTTP/1.0 200 OK\r\nConnection: keep-alive, close"))

    def test_a_head_in_pieces_is_read_the_same(self) -> None:
        # The head arrives a few bytes at a time.
        d = self.h.call(URL)
        proto, transport = self.net.accept()
        answer = reply(b"HTTP/1.0 200 OK\r\nX-Padding: " + b"p" * 40)
        for i in range(0, len(answer), 7):
            proto.dataReceived(answer[i : i + 7])
        self.assertEqual(self.successResultOf(d).patch, PATCH)
        self.assertFalse(transport.connected)
        self.h.call(URL)
        self.assertEqual(self.net.attempts, 2)

    def test_interim_reply_does_not_decide(self) -> None:
        # A 100 Continue head with Connection: close is not the reply.
        self.assertReused(b"HTTP/1.1 100 Continue\r\nConnection: close\r\n\r\n" + reply(b"HTTP/1.1 200 OK"))

    def test_body_until_the_close(self) -> None:
        d = self.h.call(URL)
        proto, transport = self.net.accept()
        proto.dataReceived(b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n" + PATCH_BYTES)
        self.assertNoResult(d)
        transport.loseConnection()
        self.assertEqual(self.successResultOf(d).patch, PATCH)
        self.h.call(URL)
        self.assertEqual(self.net.attempts, 2)

    def test_a_call_started_as_the_reply_ends_gets_a_new_connection(self) -> None:
        # The second call starts from the first one's result, before the
        # reply's last bytes have finished being handled.
        second = []
        d = self.h.call(URL)
        d.addCallback(lambda _: second.append(self.h.call(URL)))
        proto, transport = self.net.accept()
        transport.clear()
        proto.dataReceived(reply(b"HTTP/1.0 200 OK"))
        self.assertEqual(len(second), 1)
        self.assertEqual(self.net.attempts, 2)
        self.assertEqual(transport.value(), b"")
        self.assertFalse(transport.connected)


class ClosedWhileIdleTests(SynchronousTestCase, FailureAssertions):
    """
    A kept-alive connection the endpoint closed while it sat in the pool.
    """

    def setUp(self) -> None:
        self.net = MemoryNet()

    def kept(self, h: Harness) -> Any:
        """One call answered on a new connection, which stays in the pool."""
        d = h.call(URL)
        proto, transport = self.net.accept()
        proto.dataReceived(reply(b"HTTP/1.1 200 OK"))
        self.successResultOf(d)
        transport.clear()
        return proto, transport

    def test_sent_again_on_a_new_connection(self) -> None:
        # Closed (FIN) or reset (RST).
        for reset in (False, True):
            with self.subTest(reset=reset):
                self.setUp()
                h = Harness(self.net.reactor, EndpointSettings(breaker=BreakerConfig(consecutive_failures=1)))
                old_proto, old = self.kept(h)
                d = h.call(URL)
                self.assertIn(b"POST /mutate", old.value())
                if reset:
                    old_proto.connectionLost(Failure(error.ConnectionLost("Connection reset by peer")))
                else:
                    old.loseConnection()
                self.assertEqual(self.net.attempts, 2)
                proto, transport = self.net.accept()
                self.assertIn(b"POST /mutate", transport.value())
                proto.dataReceived(reply(b"HTTP/1.1 200 OK"))
                self.assertEqual(self.successResultOf(d).patch, PATCH)
                # Counted once, as a success: no failure reached the metric
                # or the breaker (which opens on one failure here).
                self.assertEqual(h.count(URL, "ok"), 2)
                self.assertEqual(h.count(URL, "connection-reset"), 0)
                self.assertEqual(h.transitions, [])

    def test_a_new_connection_even_with_others_idle(self) -> None:
        # Two kept connections; the one the call takes turns out closed: the
        # other may be closed as well, so the call goes out on a new one.
        h = Harness(self.net.reactor)
        calls = [h.call(URL) for _ in range(2)]
        connections = [self.net.accept(i) for i in range(2)]
        for proto, transport in connections:
            proto.dataReceived(reply(b"HTTP/1.1 200 OK"))
            transport.clear()
        for d in calls:
            self.successResultOf(d)
        d = h.call(URL)
        [(_, taken)] = [(p, t) for p, t in connections if t.value()]
        taken.loseConnection()
        self.assertEqual(self.net.attempts, 3)
        [(_, other)] = [(p, t) for p, t in connections if t is not taken]
        self.assertEqual(other.value(), b"")
        proto, _ = self.net.accept()
        proto.dataReceived(reply(b"HTTP/1.1 200 OK"))
        self.successResultOf(d)

    def test_only_once(self) -> None:
        h = Harness(self.net.reactor, EndpointSettings(breaker=BreakerConfig(consecutive_failures=2)))
        _, old = self.kept(h)
        d = h.call(URL)
        old.loseConnection()
        _, transport = self.net.accept()
        transport.loseConnection()
        self.assertReason(d, "connection-reset")
        self.assertEqual(self.net.attempts, 2)
        # One call, one failure.
        self.assertEqual(h.count(URL, "connection-reset"), 1)
        self.assertEqual(h.transitions, [])

    def test_never_once_the_reply_started(self) -> None:
        h = Harness(self.net.reactor)
        proto, old = self.kept(h)
        d = h.call(URL)
        proto.dataReceived(b"HTTP/1.1 2")
        old.loseConnection()
        self.assertReason(d, "connection-reset")
        self.assertEqual(self.net.attempts, 1)

    def test_within_the_same_time(self) -> None:
        h = Harness(self.net.reactor, EndpointSettings(timeout=1.0))
        _, old = self.kept(h)
        d = h.call(URL)
        self.net.reactor.advance(0.75)
        old.loseConnection()
        self.assertEqual(self.net.attempts, 2)
        self.net.accept()
        self.net.reactor.advance(0.249)
        self.assertNoResult(d)
        self.net.reactor.advance(0.001)
        self.assertReason(d, "timeout")
        self.assertEqual(h.count(URL, "timeout"), 1)
        self.assertEqual(h.count(URL, "connection-reset"), 0)

    def test_not_after_amp_ended_the_call(self) -> None:
        h = Harness(self.net.reactor)
        self.kept(h)
        d = h.call(URL, budget=2.0)
        d.cancel()
        self.failureResultOf(d, CancelledError)
        self.assertEqual(self.net.attempts, 1)
        self.assertEqual(h.count(URL, "cancelled"), 1)
