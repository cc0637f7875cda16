"""
Waiting for a step, the one way (amp.waiting.Waiting): one timer for the
earlier of the step's own expiry and the review's deadline, moved when the
step says its expiry moved, and one way to cut a step off (its cancel);
the namespace lookup as a step of the same shape; and the endpoint step
the review and the canary share (amp.steps.CallStep), judged the same way.

Time is a Clock throughout; endpoints are twisted.web resources in memory.
"""

from __future__ import annotations

import json
from typing import Any, Optional

from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.task import Clock
from twisted.logger import capturedLogs
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.resource import Resource

from amp.admission import Admitter
from amp.admission._state import ReviewState
from amp.admission_review import parse_review
from amp.breaker import CLOSED, OPEN, BreakerRegistry
from amp.canary import Canary
from amp.config import BreakerConfig, EndpointSettings
from amp.deadline import Deadline
from amp.endpoint import EndpointClient
from amp.metrics import Metrics
from amp.namespaces import StaticNamespaceSource
from amp.waiting import DeferredStep, Waiting
from tests.support.endpoint_harness import FailureAssertions, Harness, Hung, ResourceConnector, Switchable
from tests.support.helpers import FakeSource, decode_answer, make_config, namespace, review_bytes
from tests.support.prometheus import Scrape

URL = "http://127.0.0.1:8090/mutate"


class _Step:
    """A step whose expiry the test sets; remembers how it was ended."""

    def __init__(self, expires: Optional[float] = None) -> None:
        self.expires = expires
        self.ended: list[str] = []

    def time_out(self) -> None:
        self.ended.append("time_out")

    def cancel(self) -> None:
        self.ended.append("cancel")


class _Receiver:
    def __init__(self) -> None:
        self.results: list[Any] = []

    def replied(self, result: Any) -> None:
        self.results.append(result)

    def failed(self, failure: Failure) -> None:
        self.results.append(failure)


def _timers(clock: Clock) -> list[float]:
    return sorted(c.getTime() for c in clock.getDelayedCalls())


class WaitingTests(SynchronousTestCase):
    """The one timer and the one way a step is cut off, with a step of the test's."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.passed: list[float] = []

    def waiting(self, budget: float = 10.0) -> Waiting:
        return Waiting(self.clock, Deadline.after(self.clock.seconds(), budget), lambda: self.passed.append(1.0))

    def test_the_steps_own_time_first(self) -> None:
        w = self.waiting()
        step = _Step(expires=2.0)
        w.wait(step)
        self.assertEqual(_timers(self.clock), [2.0])
        self.clock.advance(1.999)
        self.assertEqual(step.ended, [])
        self.clock.advance(0.001)
        # The step fails on its own account; the deadline still holds.
        self.assertEqual(step.ended, ["time_out"])
        self.assertEqual(self.passed, [])
        self.assertIsNone(w.step)
        self.assertEqual(_timers(self.clock), [10.0])

    def test_the_deadline_first(self) -> None:
        w = self.waiting()
        step = _Step(expires=12.0)
        w.wait(step)
        self.assertEqual(_timers(self.clock), [10.0])
        self.clock.advance(10.0)
        # The owner is told; the step is not timed out on its own account.
        self.assertEqual(self.passed, [1.0])
        self.assertEqual(step.ended, [])
        w.cancel()
        self.assertEqual(step.ended, ["cancel"])
        self.assertIsNone(w.step)

    def test_a_step_with_no_time_of_its_own_waits_for_the_deadline(self) -> None:
        w = self.waiting(budget=3.0)
        w.wait(_Step())
        self.assertEqual(_timers(self.clock), [3.0])

    def test_an_expiry_that_moved_moves_the_one_timer(self) -> None:
        w = self.waiting()
        step = _Step(expires=4.0)
        w.wait(step)
        self.clock.advance(1.0)
        step.expires = 7.0
        w.arm()
        self.assertEqual(_timers(self.clock), [7.0])
        self.clock.advance(5.999)
        self.assertEqual(step.ended, [])
        self.clock.advance(0.001)
        self.assertEqual(step.ended, ["time_out"])

    def test_a_timer_that_finds_the_expiry_moved_later_waits_for_it(self) -> None:
        w = self.waiting()
        step = _Step(expires=2.0)
        w.wait(step)
        step.expires = 5.0  # moved without the owner re-arming
        self.clock.advance(2.0)
        self.assertEqual(step.ended, [])
        self.assertEqual(_timers(self.clock), [5.0])

    def test_cancel_ends_the_step_through_its_cancel_once(self) -> None:
        w = self.waiting()
        step = _Step(expires=2.0)
        w.wait(step)
        w.cancel()
        w.cancel()
        self.assertEqual(step.ended, ["cancel"])

    def test_closed_it_arms_nothing(self) -> None:
        w = self.waiting()
        w.wait(_Step(expires=2.0))
        w.close()
        self.assertEqual(self.clock.getDelayedCalls(), [])
        w.arm()
        w.wait(_Step(expires=3.0))
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_the_deadline_holds_with_no_step(self) -> None:
        w = self.waiting(budget=2.0)
        w.arm()
        self.clock.advance(2.0)
        self.assertEqual(self.passed, [1.0])


class DeferredStepTests(SynchronousTestCase):
    def test_told_its_result_once_and_cancelled_through_the_deferred(self) -> None:
        d: Deferred[str] = Deferred()
        receiver = _Receiver()
        step = DeferredStep(d, receiver)
        self.assertIsNone(step.expires)
        self.assertFalse(step.told)
        step.cancel()
        self.assertTrue(step.told)
        [failure] = receiver.results
        self.assertTrue(failure.check(CancelledError))

    def test_a_deferred_that_fired_is_told_at_once(self) -> None:
        d: Deferred[str] = Deferred()
        d.callback("ns")
        receiver = _Receiver()
        self.assertTrue(DeferredStep(d, receiver).told)
        self.assertEqual(receiver.results, ["ns"])


class EndpointCallTests(SynchronousTestCase, FailureAssertions):
    """
    A real endpoint call waited on through a L{Waiting} (the Deferred
    adapter, L{amp.endpoint.deferred_call}): one timer whichever ends it.
    """

    def setUp(self) -> None:
        self.clock = Clock()
        self.hung = Hung()

    def harness(self, **settings: Any) -> Harness:
        settings.setdefault("breaker", BreakerConfig(consecutive_failures=1))
        return Harness(self.clock, EndpointSettings(**settings), connector=ResourceConnector(self.hung))

    def test_the_calls_own_timeout_first_is_a_verdict(self) -> None:
        h = self.harness(timeout=1.0)
        d = h.call(URL, budget=5.0)
        self.assertEqual(_timers(self.clock), [1.0])
        self.clock.advance(1.0)
        self.assertReason(d, "timeout")
        self.assertEqual(h.breaker(URL).state, OPEN)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_the_deadline_first_is_no_verdict(self) -> None:
        h = self.harness(timeout=5.0)
        d = h.call(URL, budget=1.0)
        self.assertEqual(_timers(self.clock), [1.0])
        self.clock.advance(1.0)
        e = self.assertReason(d, "timeout")
        self.assertEqual(e.message, "no reply within 1s")
        self.assertEqual(h.breaker(URL).state, CLOSED)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_a_queued_call_that_goes_out_moves_the_timer_to_its_own_timeout(self) -> None:
        h = self.harness(timeout=2.0, max_concurrent=1, min_call_time=0.5)
        first = h.call(URL, budget=10.0)
        second = h.call(URL, budget=10.0)
        # Each call's one timer: the first's own timeout, the second's latest start.
        self.assertEqual(_timers(self.clock), [2.0, 9.5])
        self.clock.advance(1.0)
        self.hung.answer()
        h.connector.flush()
        self.successResultOf(first)
        # The second went out at 1.0 (started): its timer is its own timeout now.
        self.assertEqual(_timers(self.clock), [3.0])
        self.clock.advance(2.0)
        self.assertReason(second, "timeout")
        self.assertEqual(h.count(URL, "timeout"), 1)

    def test_cancelled_before_the_deadline_is_cancelled(self) -> None:
        h = self.harness(timeout=5.0)
        d = h.call(URL, budget=2.0)
        self.clock.advance(1.0)
        d.cancel()
        self.failureResultOf(d, CancelledError)
        self.assertEqual(h.count(URL, "cancelled"), 1)
        self.assertEqual(h.count(URL, "timeout"), 0)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_cancelled_at_the_deadline_is_a_timeout(self) -> None:
        h = self.harness(timeout=5.0)
        d = h.call(URL, budget=2.0)
        self.clock.advance(2.0)
        self.assertReason(d, "timeout")
        self.assertEqual(h.count(URL, "cancelled"), 0)
        self.assertEqual(h.count(URL, "timeout"), 1)
        self.assertEqual(h.breaker(URL).state, CLOSED)


class ReviewWaitingTests(SynchronousTestCase):
    """A review's steps through its one L{Waiting}."""

    def admitter(self, source: Any, client: Optional[EndpointClient] = None, **config: Any) -> tuple[Admitter, Clock]:
        clock = Clock()
        metrics = Metrics()
        if client is None:
            client = EndpointClient(clock, metrics, BreakerRegistry(clock), connector=ResourceConnector(Hung()))
        return Admitter(make_config(**config), source, client, clock, metrics), clock

    def test_the_namespace_lookup_is_cancelled_by_the_deadline_through_the_same_path(self) -> None:
        source = FakeSource()
        admitter, clock = self.admitter(source)
        answers: list[Any] = []
        review = admitter.review_into(answers.append, parse_review(review_bytes()), Deadline.after(0.0, 2.0))
        self.assertIs(review.state, ReviewState.LOOKING_UP)
        self.assertIsInstance(review.waiting.step, DeferredStep)
        self.assertEqual(_timers(clock), [2.0])
        fetch = source.fetches[0][2]
        clock.advance(2.0)
        # The lookup's Deferred was cancelled (the step's cancel), and the
        # review answered by the deadline.
        self.assertTrue(fetch.called)
        [answer] = answers
        self.assertEqual(answer.outcome.reason, "deadline")
        self.assertIs(review.state, ReviewState.ANSWERED)
        self.assertEqual(clock.getDelayedCalls(), [])

    def test_the_namespace_lookup_is_cut_off_by_the_client_going_away_the_same_way(self) -> None:
        source = FakeSource()
        admitter, clock = self.admitter(source)
        answers: list[Any] = []
        review = admitter.review_into(answers.append, parse_review(review_bytes()), Deadline.after(0.0, 2.0))
        fetch = source.fetches[0][2]
        review.cancel()
        self.assertTrue(fetch.called)
        self.assertEqual([a.outcome.reason for a in answers], ["cancelled"])
        self.assertEqual(clock.getDelayedCalls(), [])

    def test_the_endpoint_call_is_the_step_and_its_own_timeout_the_one_timer(self) -> None:
        clock = Clock()
        metrics = Metrics()
        client = EndpointClient(clock, metrics, BreakerRegistry(clock), connector=ResourceConnector(Hung()))
        config = make_config({"team-a": namespace(URL)}, endpoints={"timeout": "1s"})
        admitter = Admitter(config, StaticNamespaceSource(config.kubernetes), client, clock, metrics)
        answers: list[Any] = []
        review = admitter.review_into(answers.append, parse_review(review_bytes()), Deadline.after(0.0, 5.0))
        self.assertIs(review.state, ReviewState.CALLING)
        self.assertEqual(review.waiting.step.expires, 1.0)
        self.assertEqual(_timers(clock), [1.0])
        clock.advance(1.0)
        # The call timed out on its own account (Ignore: the step skipped).
        [answer] = answers
        self.assertEqual(answer.outcome.reason, "timeout")
        self.assertEqual(
            metrics.registry.get_sample_value(
                "amp_endpoint_requests_total", {"endpoint": "http://127.0.0.1:8090", "outcome": "timeout"}
            ),
            1.0,
        )
        self.assertEqual(clock.getDelayedCalls(), [])

    def test_a_reply_whose_settling_fails_is_answered_at_once(self) -> None:
        """
        amp's own bug while settling a reply (the breaker, the metrics,
        starting a queued call) answers the review then, as an internal
        error: not at its deadline, and never not at all.
        """
        clock = Clock()
        metrics = Metrics()
        hung = Hung()
        connector = ResourceConnector(hung)
        client = EndpointClient(clock, metrics, BreakerRegistry(clock), connector=connector)
        settled = client._settled

        def broken(*args: Any) -> None:
            settled(*args)
            raise RuntimeError("settling broke")

        client._settled = broken  # type: ignore[method-assign]  # the failure under test
        config = make_config({"team-a": namespace(URL)}, endpoints={"timeout": "3s"})
        admitter = Admitter(config, StaticNamespaceSource(config.kubernetes), client, clock, metrics)
        answers: list[Any] = []
        review = admitter.review_into(answers.append, parse_review(review_bytes()), Deadline.after(0.0, 5.0))
        connector.flush()
        self.assertIs(review.state, ReviewState.CALLING)
        clock.advance(1.0)
        hung.answer()
        connector.flush()
        [answer] = answers
        self.assertEqual(answer.outcome.reason, "internal-error")
        self.assertIs(review.state, ReviewState.ANSWERED)
        self.assertEqual(clock.getDelayedCalls(), [])
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)

    def test_a_lookup_that_cannot_start_is_answered_without_waiting(self) -> None:
        class Broken(FakeSource):
            def fetch(self, name: str, timeout: float) -> Deferred:
                raise RuntimeError("broken source")

        admitter, clock = self.admitter(Broken())
        answers: list[Any] = []
        review = admitter.review_into(answers.append, parse_review(review_bytes()), Deadline.after(0.0, 2.0))
        self.assertIsNone(review)
        [answer] = answers
        self.assertEqual(answer.outcome.reason, "internal-error")
        # The one failure logged is the source's, not a review transition of amp's.
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)
        self.assertEqual(self.flushLoggedErrors(), [])
        self.assertEqual(clock.getDelayedCalls(), [])


# ---------------------------------------------------------------- the shared judge

#: A patch amp refuses whoever sent it: it changes the Pod's name.
_REFUSED = json.dumps([{"op": "replace", "path": "/metadata/name", "value": "other"}]).encode()


class SharedJudgeTests(SynchronousTestCase):
    def test_a_refused_candidate_fails_with_the_reason_the_live_step_gets(self) -> None:
        clock = Clock()
        metrics = Metrics()
        root = Resource()
        root.putChild(b"ok", Switchable(body=b"[]"))
        root.putChild(b"refused", Switchable(body=_REFUSED))
        connector = ResourceConnector(root)
        ok, refused = "http://127.0.0.1:8090/ok", "http://127.0.0.1:8090/refused"
        config = make_config(
            {
                "live": namespace(refused, failure_policy="Fail"),
                "mesh": namespace(ok, annotations={"amp.txn2.com/canary": refused}),
            }
        )
        client = EndpointClient(clock, metrics, BreakerRegistry(clock), connector=connector)
        candidate_metrics = Metrics()
        candidates = EndpointClient(clock, candidate_metrics, BreakerRegistry(clock), connector=connector)
        canary = Canary(candidates, clock, metrics)
        admitter = Admitter(config, StaticNamespaceSource(config.kubernetes), client, clock, metrics, canary=canary)

        # The live step given the patch: refused, under Fail.
        body, outcome = self.successResultOf(
            admitter.review(parse_review(review_bytes(namespace="live")), Deadline.after(0.0, 5.0))
        )
        live_reason = outcome.reason
        live_message = decode_answer(body)["response"]["status"]["message"]
        self.assertEqual(live_reason, "refused-path")

        # The candidate given the same patch beside a live step that answered.
        with capturedLogs() as events:
            self.successResultOf(
                admitter.review(parse_review(review_bytes(namespace="mesh")), Deadline.after(0.0, 5.0))
            )
            clock.advance(0)
        [failed] = [e for e in events if e.get("result") == "failed"]
        reason, _, message = failed["problem"].partition(": ")
        self.assertEqual(reason, live_reason)
        self.assertIn(message, live_message)
        scrape = Scrape(metrics.render().decode())
        self.assertEqual(scrape.total("amp_canary_reviews_total", namespace="mesh", result="failed"), 1)
        # The candidate's call is settled under the reason amp refused its
        # reply, as the live step's is.
        for counted in (metrics, candidate_metrics):
            self.assertEqual(
                Scrape(counted.render().decode()).total(
                    "amp_endpoint_requests_total", endpoint="http://127.0.0.1:8090", outcome=live_reason
                ),
                1,
            )
        self.assertEqual(clock.getDelayedCalls(), [])
