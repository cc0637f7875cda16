"""
Pooled connections (amp.endpoint._pool, amp.http._pool) over real loopback
sockets: what the endpoint sees of the pool's reuse, its size and its close.
The same rules on a MemoryReactorClock are in
tests/unit/endpoint/test_endpoint_pool.py.
"""

from __future__ import annotations

from typing import Any

from twisted.internet import defer
from twisted.internet.defer import inlineCallbacks
from twisted.trial.unittest import TestCase
from twisted.web.server import Site

from amp.config import EndpointSettings
from tests.support.endpoint_harness import PATCH, Endpoint, LoopbackServer, RealHarness


class LoopbackPoolTests(TestCase):
    """
    The same over real sockets: what the endpoint sees.
    """

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
        self.assertEqual(h.count(url, "ok"), 5)

    @inlineCallbacks
    def test_concurrent_calls_keep_pool_size_connections(self) -> Any:
        h = RealHarness(self, EndpointSettings(pool_size=2))
        self.resource.hold_until = 4
        url = self.server.url("/hold")
        yield defer.gatherResults([h.call(url) for _ in range(4)])
        self.assertEqual(self.server.accepted, 4)
        # The two it did not keep are closed ...
        yield self.server.counter.until_open_at_most(2)
        self.assertEqual(h.client.open_connections(), 2)
        # ... and the kept ones serve the next calls.
        self.resource.hold_until = 1
        yield h.call(url)
        yield h.call(url)
        self.assertEqual(self.server.accepted, 4)

    @inlineCallbacks
    def test_close_closes_every_connection(self) -> Any:
        h = RealHarness(self, EndpointSettings(pool_size=3))
        self.resource.hold_until = 3
        yield defer.gatherResults([h.call(self.server.url("/hold")) for _ in range(3)])
        self.assertEqual(len(self.server.counter.open), 3)
        yield h.client.close()
        self.assertEqual(h.client.open_connections(), 0)
        yield self.server.counter.until_open_at_most(0)
