"""
An origin's bulkhead queue and latency budget through the endpoint client
(amp.endpoint) and through whole reviews (amp.admission): reviews that
wait for a slot in arrival order, leave the queue when they give up, are
refused with their own reasons, and are shed while the origin is over its
latency budget; the metrics and the status stamp that tell it.

Time is a Clock; endpoints are twisted.web resources in memory.
"""

from __future__ import annotations

import json
from typing import Any, Optional

from twisted.internet import defer
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET

from amp.admission import Admitter
from amp.admission_review import parse_review
from amp.breaker import OPEN, BreakerRegistry
from amp.config import BreakerConfig, EndpointSettings, parse_config
from amp.deadline import Deadline
from amp.endpoint import EndpointClient
from amp.metrics import Metrics
from amp.namespaces import StaticNamespaceSource
from tests.support.endpoint_harness import (
    FailureAssertions,
    Harness,
    Hung,
    ResourceConnector,
    requests_total,
    review_body,
)
from tests.support.helpers import decode_answer

URL = "http://127.0.0.1:8090/mutate"
ORIGIN = "http://127.0.0.1:8090"


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


class Ordered(Hung):
    """Never answers on its own; remembers each request's body, in arrival order."""

    def render_POST(self, request: Any) -> Any:
        request.body = request.content.read()
        return super().render_POST(request)

    def bodies(self) -> list[bytes]:
        return [r.body for r in self.held]


def body(n: int) -> bytes:
    return json.dumps({"kind": "Pod", "n": n}).encode()


# ---------------------------------------------------------------- the client


class QueueTests(SynchronousTestCase, FailureAssertions):
    def setUp(self) -> None:
        self.clock = Clock()
        self.endpoint = Ordered()
        self.connector = ResourceConnector(self.endpoint)

    def harness(self, **settings: Any) -> Harness:
        return Harness(self.clock, EndpointSettings(**settings), connector=self.connector)

    def answer(self) -> None:
        self.endpoint.answer()
        self.connector.flush()

    def test_calls_over_max_concurrent_wait_and_go_out_in_arrival_order(self) -> None:
        h = self.harness(max_concurrent=2)
        calls = [h.call(URL, body=body(n)) for n in range(5)]
        self.assertEqual(self.endpoint.bodies(), [body(0), body(1)])
        self.assertEqual(sample(h.metrics, "amp_endpoint_queued", endpoint=ORIGIN), 3)
        for d in calls:
            self.assertNoResult(d)
        self.answer()
        self.assertEqual(self.successResultOf(calls[0]).patch, [])
        self.assertEqual(self.endpoint.bodies(), [body(1), body(2)])
        self.answer()
        self.answer()
        self.assertEqual(self.endpoint.bodies(), [body(3), body(4)])
        self.answer()
        self.answer()
        for d in calls[1:]:
            self.assertEqual(self.successResultOf(d).patch, [])
        self.assertEqual(h.count(URL, "ok"), 5)
        self.assertEqual(sample(h.metrics, "amp_endpoint_queued", endpoint=ORIGIN), 0)
        self.assertEqual(h.client.in_flight(ORIGIN), 0)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_a_new_call_does_not_pass_the_waiters(self) -> None:
        h = self.harness(max_concurrent=1)
        first, second = h.call(URL, body=body(1)), h.call(URL, body=body(2))
        self.answer()
        # The slot went to the waiter; a call arriving now waits behind it.
        third = h.call(URL, body=body(3))
        self.assertEqual(self.endpoint.bodies(), [body(2)])
        self.answer()
        self.assertEqual(self.endpoint.bodies(), [body(3)])
        self.successResultOf(first)
        self.successResultOf(second)
        self.assertNoResult(third)

    def test_calls_over_max_concurrent_and_max_queued_fail_fast(self) -> None:
        h = self.harness(max_concurrent=2, max_queued=1)
        h.call(URL), h.call(URL)
        waiting = h.call(URL)
        e = self.assertReason(h.call(URL), "queue-full")
        self.assertIn("2 calls in flight", e.message)
        self.assertIn("max_queued", e.message)
        self.assertEqual(len(self.endpoint.held), 2)
        self.assertEqual(h.count(URL, "queue-full"), 1)
        self.assertEqual(sample(h.metrics, "amp_endpoint_queue_refused_total", endpoint=ORIGIN, reason="queue-full"), 1)
        self.assertNoResult(waiting)

    def test_no_queue_fails_at_once(self) -> None:
        h = self.harness(max_concurrent=1, max_queued=0)
        h.call(URL)
        self.assertReason(h.call(URL), "queue-full")

    def test_a_waiter_fails_when_its_deadline_leaves_too_little_for_the_call(self) -> None:
        h = self.harness(max_concurrent=1, min_call_time=0.5)
        h.call(URL, budget=10.0)
        d = h.call(URL, budget=2.0)
        self.clock.advance(1.499)
        self.assertNoResult(d)
        self.clock.advance(0.001)
        e = self.assertReason(d, "queue-timeout")
        self.assertIn("waited 1.5s", e.message)
        self.assertEqual(
            sample(h.metrics, "amp_endpoint_queue_refused_total", endpoint=ORIGIN, reason="queue-timeout"), 1
        )
        self.assertEqual(sample(h.metrics, "amp_endpoint_queued", endpoint=ORIGIN), 0)
        # Refused calls have no latency: only calls that went out do.
        self.assertEqual(sample(h.metrics, "amp_endpoint_duration_seconds_count", endpoint=ORIGIN), 0)
        self.assertEqual(h.client.in_flight(ORIGIN), 1)
        # Its timer went with it: only the first call's one timer is left
        # (its own timeout, which ends before its deadline).
        self.assertEqual(sorted(c.getTime() for c in self.clock.getDelayedCalls()), [5.0])

    def test_a_call_arriving_with_too_little_time_to_wait_fails_at_once(self) -> None:
        h = self.harness(max_concurrent=1, min_call_time=0.5)
        h.call(URL)
        self.assertReason(h.call(URL, budget=0.4), "queue-timeout")
        self.assertEqual(sample(h.metrics, "amp_endpoint_queued", endpoint=ORIGIN), 0)

    def test_a_cancelled_waiter_leaves_the_queue_at_once(self) -> None:
        h = self.harness(max_concurrent=1)
        h.call(URL, body=body(1))
        gone = h.call(URL, body=body(2))
        last = h.call(URL, body=body(3))
        self.assertEqual(sample(h.metrics, "amp_endpoint_queued", endpoint=ORIGIN), 2)
        gone.cancel()
        self.failureResultOf(gone, defer.CancelledError)
        self.assertEqual(sample(h.metrics, "amp_endpoint_queued", endpoint=ORIGIN), 1)
        self.assertEqual(h.count(URL, "cancelled"), 1)
        self.answer()
        self.assertEqual(self.endpoint.bodies(), [body(3)])
        self.assertNoResult(last)

    def test_waiters_are_refused_when_the_breaker_opens_before_their_turn(self) -> None:
        h = self.harness(max_concurrent=2, timeout=1.0, breaker=BreakerConfig(consecutive_failures=2))
        first = [h.call(URL, body=body(0)), h.call(URL, body=body(1))]
        waiters = [h.call(URL, body=body(n)) for n in range(2, 5)]
        # Both calls time out; the second failure opens the breaker.  The
        # first freed slot went to a waiter before that, the second finds
        # the breaker open, and so do the others: no call to an endpoint
        # known to be failing.
        self.clock.advance(1.0)
        self.assertEqual(h.breaker(URL).state, OPEN)
        self.assertEqual(self.endpoint.bodies()[-1], body(2))
        for d in first:
            self.assertReason(d, "timeout")
        self.assertNoResult(waiters[0])
        for d in waiters[1:]:
            self.assertReason(d, "breaker-open")
        self.assertEqual(sample(h.metrics, "amp_endpoint_queued", endpoint=ORIGIN), 0)
        self.assertEqual(h.client.in_flight(ORIGIN), 1)
        # The breaker's refusals are the breaker's: not the queue's.
        self.assertEqual(h.count(URL, "breaker-open"), 2)
        self.assertEqual(
            sample(h.metrics, "amp_endpoint_queue_refused_total", endpoint=ORIGIN, reason="breaker-open"), 0
        )


# ---------------------------------------------------------------- the latency budget (client)


PATCH = b'[{"op": "add", "path": "/metadata/labels/mutated", "value": "yes"}]'


class Slow(Resource):
    """Answers L{PATCH} after C{delay} seconds on C{clock}."""

    isLeaf = True

    def __init__(self, clock: Clock, delay: float) -> None:
        super().__init__()
        self.clock = clock
        self.delay = delay
        self.hits = 0

    def render_POST(self, request: Any) -> Any:
        self.hits += 1

        def answer() -> None:
            request.setHeader(b"content-type", b"application/json")
            request.write(PATCH)
            request.finish()

        self.clock.callLater(self.delay, answer)
        return NOT_DONE_YET


class LatencyBudgetTests(SynchronousTestCase, FailureAssertions):
    def setUp(self) -> None:
        self.clock = Clock()
        self.endpoint = Slow(self.clock, 0.5)
        self.connector = ResourceConnector(self.endpoint)
        self.h = Harness(self.clock, EndpointSettings(latency_budget=0.2, latency_window=5), connector=self.connector)

    def run_call(self, budget: float = 10.0) -> defer.Deferred:
        d = self.h.call(URL, budget=budget)
        self.connector.flush()
        self.clock.advance(self.endpoint.delay)
        self.connector.flush()
        return d

    def test_an_origin_over_its_budget_is_shed_then_probed_back(self) -> None:
        h = self.h
        for _ in range(5):
            self.assertEqual(self.successResultOf(self.run_call()).patch[0]["value"], "yes")
        self.assertEqual(sample(h.metrics, "amp_endpoint_shedding", endpoint=ORIGIN), 1)
        # Shedding: one probe goes out, the others are refused at once.
        probe = h.call(URL)
        self.connector.flush()
        e = self.assertReason(h.call(URL), "latency-budget")
        self.assertIn("latency budget of 0.2s", e.message)
        self.assertReason(h.call(URL), "latency-budget")
        self.assertEqual(self.endpoint.hits, 6)
        self.assertEqual(sample(h.metrics, "amp_endpoint_shed_total", endpoint=ORIGIN), 2)
        self.assertEqual(h.count(URL, "latency-budget"), 2)
        # The probe comes back over the budget: still shedding.
        self.clock.advance(0.5)
        self.connector.flush()
        self.successResultOf(probe)
        self.assertEqual(sample(h.metrics, "amp_endpoint_shedding", endpoint=ORIGIN), 1)
        # The endpoint recovers; the next probe is within the budget.
        self.endpoint.delay = 0.05
        self.successResultOf(self.run_call())
        self.assertEqual(sample(h.metrics, "amp_endpoint_shedding", endpoint=ORIGIN), 0)
        d1, d2 = h.call(URL), h.call(URL)
        self.connector.flush()
        self.clock.advance(0.05)
        self.connector.flush()
        self.successResultOf(d1)
        self.successResultOf(d2)

    def test_a_fast_origin_is_never_shed(self) -> None:
        self.endpoint.delay = 0.1
        for _ in range(20):
            self.successResultOf(self.run_call())
        self.assertEqual(self.h.count(URL, "ok"), 20)
        self.assertEqual(sample(self.h.metrics, "amp_endpoint_shed_total", endpoint=ORIGIN), 0)

    def test_off_by_default(self) -> None:
        h = Harness(self.clock, EndpointSettings(), connector=self.connector)
        for _ in range(30):
            d = h.call(URL)
            self.connector.flush()
            self.clock.advance(0.5)
            self.connector.flush()
            self.successResultOf(d)
        self.assertEqual(h.count(URL, "ok"), 30)


# ---------------------------------------------------------------- whole reviews


def admitter(clock: Clock, resource: Resource, **endpoints: Any) -> tuple[Admitter, Metrics, ResourceConnector]:
    config = parse_config(
        {
            "failure_policy": "Ignore",
            "kubernetes": {
                "source": "static",
                "namespaces": {
                    "team": {"labels": {"amp.txn2.com/enabled": "true"}, "annotations": {"amp.txn2.com/ep": URL}}
                },
            },
            "endpoints": {"allow": ["http://127.0.0.1:*/*"], **endpoints},
        }
    )
    metrics = Metrics()
    connector = ResourceConnector(resource)
    client = EndpointClient(clock, metrics, BreakerRegistry(clock), connector=connector)
    return Admitter(config, StaticNamespaceSource(config.kubernetes), client, clock, metrics), metrics, connector


def stamp(answer: bytes) -> Optional[str]:
    patch = decode_answer(answer)["response"]["_patch"] or []
    for op in patch:
        if op["path"] == "/metadata/annotations":
            return op["value"].get("amp.txn2.com/status")
        if op["path"] == "/metadata/annotations/amp.txn2.com~1status":
            return op["value"]
    return None


class MutatingOnce(Ordered):
    """Holds requests; answers each with a patch adding a label."""

    def answer(self, body: bytes = PATCH) -> None:
        super().answer(body)


class ReviewQueueTests(SynchronousTestCase):
    def review(self, a: Admitter, clock: Clock, budget: float = 9.5) -> defer.Deferred:
        return a.review(parse_review(review_body()), Deadline.after(clock.seconds(), budget))

    def test_a_busy_endpoint_costs_no_review_its_mutation(self) -> None:
        clock = Clock()
        endpoint = MutatingOnce()
        a, metrics, connector = admitter(clock, endpoint, max_concurrent=2)
        reviews = [self.review(a, clock) for _ in range(6)]
        self.assertEqual(len(endpoint.held), 2)
        # Each review has one timer: for the endpoint's timeout (5 s) or, waiting, its latest start.
        self.assertEqual(sorted(c.getTime() for c in clock.getDelayedCalls()), [5.0] * 2 + [9.25] * 4)
        for _ in range(6):
            clock.advance(1.0)
            endpoint.answer()
            connector.flush()
        for d in reviews:
            answer, outcome = self.successResultOf(d)
            self.assertEqual(str(outcome.result), "patched")
            self.assertTrue(stamp(answer).startswith("mutated"), stamp(answer))
        self.assertEqual(clock.getDelayedCalls(), [])

    def test_a_review_that_waits_too_long_is_stamped_skipped_before_its_deadline(self) -> None:
        clock = Clock()
        endpoint = MutatingOnce()
        a, metrics, connector = admitter(clock, endpoint, max_concurrent=1, min_call_time="500ms")
        first = self.review(a, clock)
        waiting = self.review(a, clock, budget=3.0)
        clock.advance(2.5)
        answer, outcome = self.successResultOf(waiting)
        self.assertEqual(str(outcome.reason), "queue-timeout")
        response = decode_answer(answer)["response"]
        self.assertTrue(response["allowed"])
        self.assertEqual(stamp(answer).split(" ")[:2], ["skipped", "queue-timeout"])
        self.assertIn("queue-timeout", response["warnings"][0])
        # The first review is unaffected, and the queue is empty.
        endpoint.answer()
        connector.flush()
        self.assertEqual(str(self.successResultOf(first)[1].result), "patched")
        self.assertEqual(sample(metrics, "amp_endpoint_queued", endpoint=ORIGIN), 0)
        self.assertEqual(clock.getDelayedCalls(), [])

    def test_a_review_given_a_slot_gets_the_rest_of_its_deadline(self) -> None:
        # The timer set for its latest start is moved to its deadline once
        # it has a slot: the call is not cut at the latest start.
        clock = Clock()
        endpoint = MutatingOnce()
        a, metrics, connector = admitter(clock, endpoint, max_concurrent=1, timeout="30s")
        first = self.review(a, clock)
        second = self.review(a, clock)
        clock.advance(5.0)
        endpoint.answer()
        connector.flush()
        self.successResultOf(first)
        self.assertEqual(len(endpoint.held), 1)
        clock.advance(4.4)  # past its latest start (9.25)
        self.assertNoResult(second)
        endpoint.answer()
        connector.flush()
        self.assertEqual(str(self.successResultOf(second)[1].result), "patched")
        self.assertEqual(clock.getDelayedCalls(), [])

    def test_a_review_given_a_slot_is_answered_at_its_calls_own_timeout(self) -> None:
        # An endpoint that holds its calls: the review that waited for a slot
        # gets the failure policy when its call's own timeout passes, not at
        # its latest start (4.25 s here), which an API server that saw the
        # review late may not wait for.
        clock = Clock()
        endpoint = MutatingOnce()
        a, metrics, connector = admitter(clock, endpoint, max_concurrent=1, timeout="2s")
        first = self.review(a, clock, budget=4.5)
        waiting = self.review(a, clock, budget=4.5)
        clock.advance(0.5)
        endpoint.answer()
        connector.flush()
        self.assertEqual(str(self.successResultOf(first)[1].result), "patched")
        # The waiting review's call went out at 0.5 s, with 2 s of its own.
        self.assertEqual(len(endpoint.held), 1)
        self.assertEqual([c.getTime() for c in clock.getDelayedCalls() if c.active()], [2.5])
        clock.advance(1.999)
        self.assertNoResult(waiting)
        clock.advance(0.001)
        answer, outcome = self.successResultOf(waiting)
        self.assertEqual(str(outcome.reason), "timeout")
        self.assertEqual(stamp(answer).split(" ")[:2], ["skipped", "timeout"])
        self.assertEqual(requests_total(metrics, ORIGIN, "timeout"), 1)
        self.assertEqual(clock.getDelayedCalls(), [])

    def test_a_cancelled_review_leaves_the_queue(self) -> None:
        clock = Clock()
        endpoint = MutatingOnce()
        a, metrics, connector = admitter(clock, endpoint, max_concurrent=1)
        self.review(a, clock)
        gone = self.review(a, clock)
        gone.cancel()
        self.assertEqual(sample(metrics, "amp_endpoint_queued", endpoint=ORIGIN), 0)
        self.assertEqual(requests_total(metrics, ORIGIN, "cancelled"), 1)
        self.assertEqual(len(clock.getDelayedCalls()), 1)

    def test_a_shed_review_is_stamped_with_its_reason(self) -> None:
        clock = Clock()
        endpoint = Slow(clock, 1.0)
        a, metrics, connector = admitter(clock, endpoint, latency_budget="100ms", latency_window=2)
        for _ in range(2):
            d = self.review(a, clock)
            connector.flush()
            clock.advance(1.0)
            connector.flush()
            self.assertEqual(str(self.successResultOf(d)[1].result), "patched")
        probe = self.review(a, clock)
        answer, outcome = self.successResultOf(self.review(a, clock))
        self.assertEqual(str(outcome.reason), "latency-budget")
        self.assertEqual(stamp(answer).split(" ")[:2], ["skipped", "latency-budget"])
        self.assertTrue(decode_answer(answer)["response"]["allowed"])
        connector.flush()
        clock.advance(1.0)
        connector.flush()
        self.assertEqual(str(self.successResultOf(probe)[1].result), "patched")
