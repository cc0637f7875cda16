"""
Integration tests of bursts: the real amp service on a loopback TLS port,
an endpoint on another loopback port that is only busy, slow or slow past
its latency budget, and many reviews at once, as a controller's Pod storm
sends them.

What is asserted is each Pod's outcome, as the API server would store it:
mutated and stamped, or admitted under Ignore and stamped C{skipped
<reason>}, with amp's metrics accounting for each; every review is
answered.  No test asserts how fast (the deadline itself is asserted on a
Clock in tests/unit/endpoint/test_bulkhead_queue.py).
"""

from __future__ import annotations

import json
from typing import Any, Optional

from twisted.internet import reactor
from twisted.internet.defer import Deferred, inlineCallbacks
from twisted.internet.endpoints import TCP4ServerEndpoint
from twisted.trial.unittest import TestCase
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Site

from amp.admission import STATUS_ANNOTATION
from tests.support.helpers import (
    WebhookClient,
    apply_patch,
    decode_answer,
    make_config,
    namespace,
    pod,
    review_bytes,
    start_amp,
    wait_all,
)
from tests.support.waiting import wait_until

#: The endpoint's patch: one label.
PATCH = json.dumps([{"op": "add", "path": "/metadata/labels/mutated", "value": "yes"}]).encode()


class StormEndpoint(Resource):
    """
    Answers L{PATCH} after C{delay} seconds, or, with C{hold}, when the
    test releases the calls; counts calls and the most it had at once.
    """

    isLeaf = True

    def __init__(self, delay: float = 0.0) -> None:
        super().__init__()
        self.delay = delay
        self.hold = False
        self.held: list[Any] = []
        self.calls = 0
        self.open = 0
        self.most = 0
        self._timers: set[Any] = set()

    def render_POST(self, request: Any) -> Any:
        self.calls += 1
        self.open += 1
        self.most = max(self.most, self.open)
        if self.hold:
            self.held.append(request)
        else:
            timer = reactor.callLater(self.delay, lambda: self._answer(request, timer))
            self._timers.add(timer)
        return NOT_DONE_YET

    def _answer(self, request: Any, timer: Any = None) -> None:
        self._timers.discard(timer)
        self.open -= 1
        if request.channel is None:
            return
        request.setHeader(b"content-type", b"application/json")
        request.write(PATCH)
        request.finish()

    def stop(self) -> None:
        """Drop the answers still to come (calls amp gave up on)."""
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()

    def release(self) -> None:
        held, self.held = self.held, []
        for request in held:
            self._answer(request)


class BurstTestCase(TestCase):
    #: A burst opens a TLS connection per review to an amp that shares this
    #: process with its clients: on a machine running the rest of the suite
    #: beside it, one review has been seen to take over 10 s from send to
    #: answer.  These tests count stamps, not time, so they wait longer.
    timeout = 120
    client_wait = 60.0

    @inlineCallbacks
    def start(self, endpoint: StormEndpoint, **endpoints: Any) -> Any:
        port = yield TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(Site(endpoint))
        self.addCleanup(port.stopListening)
        self.addCleanup(endpoint.stop)
        self.endpoint_origin = f"http://127.0.0.1:{port.getHost().port}"
        config = make_config(
            {"storm": namespace(f"{self.endpoint_origin}/mutate")},
            endpoints={"timeout": "5s", **endpoints},
            deadline={"margin": "1s"},
        )
        amp = yield start_amp(config, reactor)
        self.addCleanup(amp.stop)
        self.client = WebhookClient(reactor, wait=self.client_wait)
        self.addCleanup(self.client.close)
        return amp

    @inlineCallbacks
    def review(self, amp: Any, n: int, timeout: float = 3.0) -> Any:
        """
        One Pod's review as the API server sends it (C{?timeout=}).  That no
        answer comes after the deadline is a timing, asserted on a Clock in
        tests/unit/endpoint/test_bulkhead_queue.py, not here where load moves it.  Resolves to
        C{(stamp, outcome)}: the Pod's status stamp and whether it was
        mutated.
        """
        uid = f"uid-{n}"
        the_pod = pod(name=f"web-{n}")
        d = self.client.post(
            amp.url("/mutate", f"timeout={timeout:g}s"), review_bytes(the_pod, namespace="storm", uid=uid)
        )
        response, content = yield d
        self.assertEqual(response.code, 200)
        answer = decode_answer(content)["response"]
        self.assertEqual(answer["uid"], uid)
        self.assertTrue(answer["allowed"], answer)
        admitted = apply_patch(the_pod, answer["_patch"])
        stamp = admitted["metadata"].get("annotations", {}).get(STATUS_ANNOTATION)
        mutated = admitted["metadata"].get("labels", {}).get("mutated") == "yes"
        return stamp, mutated

    def burst(self, amp: Any, count: int, first: int = 0, timeout: float = 3.0) -> Deferred:
        return wait_all(self.review(amp, n, timeout) for n in range(first, first + count))

    def sample(self, amp: Any, name: str, **labels: str) -> float:
        return amp.metrics.registry.get_sample_value(name, labels) or 0.0

    def assertAccounted(self, results: list[tuple[Optional[str], bool]], reasons: set[str]) -> dict[str, int]:
        """
        Every Pod mutated and stamped C{mutated}, or not mutated and stamped
        C{skipped <reason>} for one of C{reasons}; the count of each.
        """
        counts: dict[str, int] = {}
        for stamp, mutated in results:
            self.assertIsNotNone(stamp, "a Pod without amp's stamp")
            assert stamp is not None
            words = stamp.split(" ")
            if mutated:
                self.assertEqual(words[0], "mutated", stamp)
                key = "mutated"
            else:
                self.assertEqual(words[0], "skipped", stamp)
                self.assertIn(words[1], reasons, stamp)
                key = words[1]
            counts[key] = counts.get(key, 0) + 1
        return counts


class BusyEndpointTests(BurstTestCase):
    @inlineCallbacks
    def test_a_busy_healthy_endpoint_mutates_every_pod_of_a_burst(self) -> Any:
        # Ten times the bulkhead at once: every Pod waits its turn and is
        # mutated; none is admitted without its mutation.
        endpoint = StormEndpoint(delay=0.01)
        amp = yield self.start(endpoint, max_concurrent=4)
        results = yield self.burst(amp, 40)
        self.assertEqual(self.assertAccounted(results, set()), {"mutated": 40})
        self.assertEqual(endpoint.calls, 40)
        self.assertLessEqual(endpoint.most, 4)
        self.assertEqual(self.sample(amp, "amp_endpoint_queued", endpoint=self.endpoint_origin), 0)
        self.assertEqual(
            self.sample(amp, "amp_endpoint_requests_total", endpoint=self.endpoint_origin, outcome="ok"), 40
        )

    @inlineCallbacks
    def test_a_slow_endpoint_costs_the_pods_it_cannot_serve_in_time_their_mutation_not_their_answer(self) -> Any:
        # Two calls at once, half a second each, and 2 s for each review
        # (?timeout=3s less the 1 s margin): the Pods the endpoint can serve
        # in time are mutated, the others are admitted under Ignore with the
        # reason, each answered within the API server's timeout.
        endpoint = StormEndpoint(delay=0.5)
        amp = yield self.start(endpoint, max_concurrent=2, min_call_time="250ms")
        results = yield self.burst(amp, 20)
        counts = self.assertAccounted(results, {"queue-timeout", "timeout"})
        self.assertGreater(counts.get("mutated", 0), 0)
        self.assertGreater(counts.get("queue-timeout", 0), 0)
        self.assertLessEqual(endpoint.most, 2)
        # The metrics tell the same story as the stamps.
        origin = self.endpoint_origin
        self.assertEqual(
            self.sample(amp, "amp_endpoint_queue_refused_total", endpoint=origin, reason="queue-timeout"),
            counts["queue-timeout"],
        )
        self.assertEqual(
            self.sample(amp, "amp_endpoint_requests_total", endpoint=origin, outcome="ok"), counts["mutated"]
        )
        self.assertEqual(self.sample(amp, "amp_endpoint_queued", endpoint=origin), 0)

    @inlineCallbacks
    def test_a_full_queue_refuses_at_once(self) -> Any:
        endpoint = StormEndpoint()
        endpoint.hold = True
        amp = yield self.start(endpoint, max_concurrent=2, max_queued=3)
        # The API server's longest budget: the waiters must not time out
        # while a busy machine runs this test.
        waiting = self.burst(amp, 5, timeout=30)
        refused = yield self.burst(amp, 4, first=5, timeout=30)
        self.assertEqual(self.assertAccounted(refused, {"queue-full"}), {"queue-full": 4})
        # The queue's three go out as slots free.
        while endpoint.calls < 5 or endpoint.held:
            endpoint.release()
            yield wait_until(lambda: endpoint.held or endpoint.calls == 5, what="the next calls")
        results = yield waiting
        self.assertEqual(self.assertAccounted(results, set()), {"mutated": 5})
        self.assertEqual(
            self.sample(amp, "amp_endpoint_queue_refused_total", endpoint=self.endpoint_origin, reason="queue-full"), 4
        )


class LatencyBudgetTests(BurstTestCase):
    @inlineCallbacks
    def test_an_endpoint_over_its_budget_is_shed_then_probed_back(self) -> Any:
        endpoint = StormEndpoint(delay=0.6)
        amp = yield self.start(endpoint, latency_budget="500ms", latency_window=3)
        origin = self.endpoint_origin
        # Three slow calls: the window's p90 is over the budget.
        slow = yield self.burst(amp, 3)
        self.assertEqual(self.assertAccounted(slow, set()), {"mutated": 3})
        self.assertEqual(self.sample(amp, "amp_endpoint_shedding", endpoint=origin), 1)
        # Shedding: one probe goes out (held here), every other Pod is
        # admitted at once, stamped with the reason.
        endpoint.hold = True
        probe = self.review(amp, 100)
        yield wait_until(lambda: endpoint.calls == 4, what="the probe call")
        storm = yield self.burst(amp, 9, first=10)
        self.assertEqual(self.assertAccounted(storm, {"latency-budget"}), {"latency-budget": 9})
        self.assertEqual(endpoint.calls, 4)
        self.assertEqual(self.sample(amp, "amp_endpoint_shed_total", endpoint=origin), 9)
        # The probe comes back over the budget (the endpoint is still
        # slow): it mutates its Pod, and the origin still sheds.
        endpoint.hold = False
        reactor.callLater(0.6, endpoint.release)
        stamp, mutated = yield probe
        self.assertTrue(mutated, stamp)
        self.assertEqual(self.sample(amp, "amp_endpoint_shedding", endpoint=origin), 1)
        # The endpoint recovers: the next Pod's call is the probe, back
        # within the budget; the Pods after it are mutated again.
        endpoint.delay = 0.0
        stamp, mutated = yield self.review(amp, 101)
        self.assertTrue(mutated, stamp)
        self.assertEqual(self.sample(amp, "amp_endpoint_shedding", endpoint=origin), 0)
        after = yield self.burst(amp, 5, first=20)
        self.assertEqual(self.assertAccounted(after, set()), {"mutated": 5})
        self.assertEqual(self.sample(amp, "amp_endpoint_shed_total", endpoint=origin), 9)
