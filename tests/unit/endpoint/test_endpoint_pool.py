"""
Pooled connections (amp.endpoint._pool, amp.http._pool): a pool per origin
and settings profile, its limits (pool_size, idle_timeout), never reusing a
connection amp is closing, counting and closing every connection on
shutdown, and one connect endpoint per host.

Every test drives amp's client on a MemoryReactorClock (L{MemoryNet}); the
same over real sockets is in tests/integration/loopback/test_endpoint_pool.py.
"""

from __future__ import annotations

from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from amp.config import EndpointSettings
from amp.endpoint import _connect
from tests.support.endpoint_harness import (
    PATCH,
    PATCH_BYTES,
    FailureAssertions,
    Harness,
    MemoryNet,
    SlowCloseTransport,
    http_reply,
)

URL = "http://127.0.0.1:8090/mutate"


class MemoryPoolTests(SynchronousTestCase, FailureAssertions):
    def setUp(self) -> None:
        self.net = MemoryNet()

    def harness(self, **kw: Any) -> Harness:
        return Harness(self.net.reactor, EndpointSettings(**kw))

    def answer(self, h: Harness, body: bytes = b"[]") -> tuple[Any, Any]:
        """One call on a new connection, answered; returns its protocol and transport."""
        d = h.call(URL)
        proto, transport = self.net.accept()
        proto.dataReceived(http_reply(body))
        self.successResultOf(d)
        return proto, transport

    def test_a_second_call_rides_the_same_connection(self) -> None:
        h = self.harness()
        d = h.call(URL)
        proto, transport = self.net.accept()
        self.assertTrue(transport.value().startswith(b"POST /mutate HTTP/1.1\r\n"))
        proto.dataReceived(http_reply(PATCH_BYTES))
        self.assertEqual(self.successResultOf(d).patch, PATCH)
        transport.clear()
        d2 = h.call(URL)
        self.assertEqual(self.net.attempts, 1)
        self.assertTrue(transport.value().startswith(b"POST /mutate HTTP/1.1\r\n"))
        proto.dataReceived(http_reply(b"[]"))
        self.assertEqual(self.successResultOf(d2).patch, [])
        self.assertEqual(h.client.connections_opened, 1)

    def test_idle_connection_closes_after_idle_timeout(self) -> None:
        h = self.harness(idle_timeout=30.0)
        _, transport = self.answer(h)
        self.assertEqual(h.client.idle_connections(), 1)
        self.net.reactor.advance(29.999)
        self.assertTrue(transport.connected)
        self.net.reactor.advance(0.001)
        self.assertFalse(transport.connected)
        self.assertEqual((h.client.idle_connections(), h.client.open_connections()), (0, 0))

    def test_keeps_at_most_pool_size_idle_connections(self) -> None:
        h = self.harness(pool_size=2)
        calls = [h.call(URL) for _ in range(3)]
        connections = [self.net.accept(i) for i in range(3)]
        for proto, _ in connections:
            proto.dataReceived(http_reply(b"[]"))
        for d in calls:
            self.successResultOf(d)
        self.assertEqual(sorted(t.connected for _, t in connections), [False, True, True])
        self.assertEqual(h.client.idle_connections(), 2)

    def test_equal_settings_share_connections(self) -> None:
        # A fresh but equal settings object per call (as a config reload
        # would make) must not defeat pooling.
        h = self.harness()
        self.answer(h)
        d = h.call(URL, settings=EndpointSettings())
        self.assertEqual(self.net.attempts, 1)
        self.assertNoResult(d)

    def test_connections_are_kept_per_settings(self) -> None:
        # Same origin, another override's settings: never the same connection.
        h = self.harness()
        self.answer(h)
        h.call(URL, settings=EndpointSettings(timeout=2.0))
        self.assertEqual(self.net.attempts, 2)

    def test_pool_size_and_idle_timeout_are_per_settings(self) -> None:
        h = self.harness()
        small = EndpointSettings(pool_size=1, idle_timeout=1.0)
        calls = [h.call(URL, settings=small) for _ in range(2)]
        connections = [self.net.accept(i) for i in range(2)]
        for proto, _ in connections:
            proto.dataReceived(http_reply(b"[]"))
        for d in calls:
            self.successResultOf(d)
        self.assertEqual(sorted(t.connected for _, t in connections), [False, True])
        self.net.reactor.advance(1.0)
        self.assertEqual([t.connected for _, t in connections], [False, False])

    def test_idle_connection_closed_by_the_endpoint_leaves_the_pool(self) -> None:
        h = self.harness()
        _, transport = self.answer(h)
        transport.loseConnection()
        self.assertEqual(h.client.idle_connections(), 0)
        # The next call connects afresh instead of failing on the dead one.
        h.call(URL)
        self.assertEqual(self.net.attempts, 2)

    def test_a_connection_amp_is_closing_is_not_reused(self) -> None:
        # A 5xx reply whose connection amp closes, while the close is still
        # under way (its last bytes came in with the head): the next call
        # must not get it.
        h = self.harness()
        d = h.call(URL)
        proto, transport = self.net.accept(transport_class=SlowCloseTransport)
        proto.dataReceived(http_reply(b"error page", 503))
        self.assertReason(d, "http-5xx")
        self.assertTrue(transport.disconnecting)
        transport.clear()
        h.call(URL)
        self.assertEqual(self.net.attempts, 2)
        self.assertEqual(transport.value(), b"")
        transport.closed()
        self.assertEqual(h.client.open_connections(), 0)

    def test_a_body_amp_stopped_reading_does_not_leave_its_connection_reusable(self) -> None:
        # The body passes max_response in the same chunk that ends it.
        h = self.harness(max_response=10)
        d = h.call(URL)
        proto, transport = self.net.accept(transport_class=SlowCloseTransport)
        proto.dataReceived(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        proto.dataReceived(b"20\r\n" + b" " * 31 + b"[\r\n1\r\n]\r\n0\r\n\r\n")
        self.assertReason(d, "response-too-large")
        transport.clear()
        h.call(URL)
        self.assertEqual(self.net.attempts, 2)
        self.assertEqual(transport.value(), b"")

    def test_one_connect_endpoint_per_host(self) -> None:
        built = []
        real = _connect.TCP4ClientEndpoint

        def counting(*a: Any, **kw: Any) -> Any:
            built.append(a)
            return real(*a, **kw)

        self.patch(_connect, "TCP4ClientEndpoint", counting)
        h = self.harness(pool_size=1)
        calls = [h.call(URL) for _ in range(2)]
        connections = [self.net.accept(i) for i in range(2)]
        for proto, _ in connections:
            proto.dataReceived(http_reply(b"[]"))
        for d in calls:
            self.successResultOf(d)
        for _ in range(3):
            d = h.call(URL)
            [proto] = [p for p, t in connections if t.connected]
            proto.dataReceived(http_reply(b"[]"))
            self.successResultOf(d)
        self.assertEqual(self.net.attempts, 2)
        self.assertEqual(len(built), 1)

    # -------- shutdown

    def test_close_closes_idle_connections(self) -> None:
        h = self.harness()
        _, transport = self.answer(h)
        self.successResultOf(h.client.close())
        self.assertFalse(transport.connected)
        self.assertEqual(h.client.open_connections(), 0)
        self.assertEqual(self.net.reactor.getDelayedCalls(), [])

    def test_close_waits_for_calls_in_flight(self) -> None:
        h = self.harness()
        d = h.call(URL)
        proto, transport = self.net.accept()
        closed = h.client.close()
        self.assertNoResult(closed)
        proto.dataReceived(http_reply(b"[]"))
        self.assertEqual(self.successResultOf(d).patch, [])
        self.successResultOf(closed)
        self.assertFalse(transport.connected)

    def test_close_waits_for_a_call_still_connecting(self) -> None:
        h = self.harness()
        d = h.call(URL)
        closed = h.client.close()
        self.assertNoResult(closed)
        proto, transport = self.net.accept()
        proto.dataReceived(http_reply(b"[]"))
        self.successResultOf(d)
        self.successResultOf(closed)
        self.assertFalse(transport.connected)

    def test_close_waits_for_a_connection_still_closing(self) -> None:
        h = self.harness()
        d = h.call(URL)
        proto, transport = self.net.accept(transport_class=SlowCloseTransport)
        proto.dataReceived(http_reply(b"error page", 503))
        self.assertReason(d, "http-5xx")
        closed = h.client.close()
        self.assertNoResult(closed)
        transport.closed()
        self.successResultOf(closed)

    def test_calls_after_close_work_and_keep_nothing(self) -> None:
        h = self.harness()
        self.successResultOf(h.client.close())
        d = h.call(URL)
        proto, transport = self.net.accept()
        self.assertIn(b"Connection: close\r\n", transport.value())
        proto.dataReceived(http_reply(b"[]"))
        self.assertEqual(self.successResultOf(d).patch, [])
        self.assertFalse(transport.connected)
        self.assertEqual(h.client.open_connections(), 0)
