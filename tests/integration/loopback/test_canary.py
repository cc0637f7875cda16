"""
The canary (amp.canary): a candidate endpoint compared with the live one on
live traffic.  The plan is pure; the rest runs a real amp, the example
sidecar injector as the live endpoint and a candidate version on loopback.
"""

from __future__ import annotations

from typing import Any

import pytest
from twisted.internet import reactor
from twisted.internet.defer import CancelledError, inlineCallbacks
from twisted.internet.task import Clock
from twisted.python.failure import Failure
from twisted.trial.unittest import TestCase

from amp.canary import Canary, CanaryResult, LiveStep, canary_plan
from amp.deadline import Deadline
from amp.endpoint import CallReply
from amp.metrics import Metrics
from amp.namespaces import NamespaceInfo
from amp.policy import route
from amp.reply import EndpointDecision
from tests.support.candidates import CANDIDATE_IMAGE, start_live_and_candidate
from tests.support.helpers import (
    WAIT,
    WebhookClient,
    closed_port,
    decode_answer,
    make_config,
    namespace,
    pod,
    review_bytes,
    start_amp,
)
from tests.support.prometheus import Scrape
from tests.support.waiting import wait_until


def _ns(**annotations: str) -> NamespaceInfo:
    base = {"amp.txn2.com/ep": "http://127.0.0.1:1/a http://127.0.0.1:1/b"}
    return NamespaceInfo("mesh", {"amp.txn2.com/enabled": "true"}, {**base, **annotations})


@pytest.mark.parametrize(
    "annotations, expected",
    [
        ({}, None),
        ({"amp.txn2.com/canary": "http://127.0.0.1:2/c"}, (0, 100.0, "")),
        (
            {
                "amp.txn2.com/canary": "http://127.0.0.1:2/c",
                "amp.txn2.com/canary-percent": "12.5",
                "amp.txn2.com/canary-step": "2",
            },
            (1, 12.5, ""),
        ),
        (
            {"amp.txn2.com/canary": "http://127.0.0.1:2/c", "amp.txn2.com/canary-step": "3"},
            (None, None, "canary-step '3' is not a step of the chain (1 to 2)"),
        ),
        (
            {"amp.txn2.com/canary": "http://127.0.0.1:2/c", "amp.txn2.com/canary-percent": "150"},
            (None, None, "canary-percent '150' is not a number from 0 to 100"),
        ),
        ({"amp.txn2.com/canary": "http://10.0.0.1/c"}, (None, None, "is not in endpoints.allow")),
        ({"amp.txn2.com/canary": "http://127.0.0.1:2/c http://127.0.0.1:2/d"}, (None, None, "name one URL")),
    ],
)
def test_the_plan_names_the_step_the_share_or_the_problem(annotations: dict, expected: Any) -> None:
    config = make_config()
    ns = _ns(**annotations)
    plan = canary_plan(ns, route(ns, config, None), config)
    if expected is None:
        assert plan is None
        return
    index, percent, problem = expected
    assert plan is not None
    if problem:
        assert plan.candidate is None and problem in plan.problem
    else:
        assert plan.candidate is not None and plan.candidate.url.url == "http://127.0.0.1:2/c"
        assert (plan.index, plan.percent) == (index, percent)


class CanaryTests(TestCase):
    timeout = 30

    @inlineCallbacks
    def setUp(self) -> Any:
        self.example, self.candidate = yield start_live_and_candidate(self, reactor)
        refused = yield closed_port(reactor)
        live = self.example.url("/sidecar")
        self.amp = yield start_amp(
            make_config(
                {
                    "control": namespace(live),
                    "mesh": namespace(live, annotations={"amp.txn2.com/canary": self.candidate.url("/sidecar")}),
                    "down": namespace(live, annotations={"amp.txn2.com/canary": f"http://127.0.0.1:{refused}/sidecar"}),
                    "slow": namespace(live, annotations={"amp.txn2.com/canary": self.example.url("/hang")}),
                }
            ),
            reactor,
            metrics_listener=True,
        )
        self.addCleanup(self.amp.stop)
        self.client = WebhookClient(reactor)
        self.addCleanup(self.client.close)

    @inlineCallbacks
    def review(self, ns: str, the_pod: dict, uid: str) -> Any:
        _, body = yield self.client.post(
            self.amp.url("/mutate", "timeout=10s"), review_bytes(the_pod, namespace=ns, uid=uid)
        )
        return decode_answer(body)["response"]

    @inlineCallbacks
    def scrape(self) -> Any:
        _, body = yield self.client.get(self.amp.metrics_url())
        return Scrape(body.decode())

    @inlineCallbacks
    def settled(self, namespace: str, count: int) -> Any:
        """The canary counts of C{namespace} once C{count} comparisons ended."""
        metrics = self.amp.service.metrics

        def counted() -> float:
            return Scrape(metrics.render().decode()).total("amp_canary_reviews_total", namespace=namespace)

        yield wait_until(lambda: counted() >= count, WAIT, f"{count} canary comparisons in {namespace}")
        scrape = yield self.scrape()
        return {k: v for k, v in scrape.by("amp_canary_reviews_total", "result", namespace=namespace).items() if v}

    @inlineCallbacks
    def test_the_live_answer_is_unchanged_and_differences_are_counted_by_path(self) -> Any:
        pods = [pod(f"web-{i}", labels={"track": "canary" if i % 3 == 0 else "stable"}) for i in range(9)]
        for i, p in enumerate(pods):
            live = yield self.review("mesh", p, f"m{i}")
            control = yield self.review("control", p, f"c{i}")
            self.assertEqual(live["_patch"], control["_patch"])
            self.assertNotIn(CANDIDATE_IMAGE, str(live["_patch"]))
        counts = yield self.settled("mesh", 9)
        self.assertEqual(counts, {"same": 6, "differs": 3})
        _, body = yield self.client.get(
            f"http://127.0.0.1:{self.amp.metrics_port}/debug/reviews?namespace=mesh".encode()
        )
        import json

        decisions = {d["pod"]: d for d in json.loads(body)}
        self.assertEqual(decisions["web-0"]["canary"], "differs")
        self.assertEqual(decisions["web-0"]["canary_paths"], ["/spec/containers/1/image"])
        self.assertEqual(decisions["web-1"]["canary"], "same")
        self.assertEqual(decisions["web-1"]["canary_paths"], [])

    @inlineCallbacks
    def test_a_failing_candidate_never_opens_the_live_breaker(self) -> Any:
        for i in range(12):
            response = yield self.review("down", pod(f"p{i}"), f"d{i}")
            self.assertTrue(response["allowed"])
            self.assertIn("amp-proxy", str(response["_patch"]))
        counts = yield self.settled("down", 12)
        self.assertEqual(counts, {"failed": 12})
        scrape = yield self.scrape()
        # Every live call succeeded although the candidate failed 12 times
        # in a row (its own breaker opened after 5).
        self.assertEqual(scrape.total("amp_endpoint_requests_total", outcome="ok"), 12)
        self.assertEqual(scrape.total("amp_endpoint_requests_total"), 12, "candidate calls are not live calls")

    @inlineCallbacks
    def test_the_live_answer_never_waits_for_the_candidate(self) -> Any:
        hang = self.example.root.children[b"hang"].handler
        response = yield self.review("slow", pod("p"), "s1")
        self.assertIn("amp-proxy", str(response["_patch"]))
        # The candidate (which never answers) is called after the live
        # answer, and is still waited on: the answer did not wait for it.
        yield wait_until(lambda: len(hang.pending) == 1, WAIT, "the candidate's call")
        self.assertEqual(
            Scrape(self.amp.service.metrics.render().decode()).total("amp_canary_reviews_total", namespace="slow"), 0
        )


def test_canary_results_are_the_documented_vocabulary() -> None:
    assert [str(r) for r in CanaryResult] == ["same", "differs", "failed", "skipped"]


# ---------------------------------------------------------------- one run, on a Clock


class _Held:
    """A call held until the test answers it (a step: no time of its own)."""

    expires = None

    def __init__(self, request: Any, receiver: Any) -> None:
        self.request = request
        self.receiver = receiver
        self.told = False

    def callback(self, decision: EndpointDecision) -> None:
        self.told = True
        self.receiver.replied(CallReply(decision, lambda outcome: None))

    def time_out(self) -> None:
        raise AssertionError("a held call has no time of its own")

    def cancel(self) -> None:
        if not self.told:
            self.told = True
            self.receiver.failed(Failure(CancelledError()))


class _HeldCalls:
    """An endpoint client whose calls wait until the test answers them."""

    def __init__(self) -> None:
        self.calls: list[_Held] = []

    def call(self, request: Any, receiver: Any) -> _Held:
        held = _Held(request, receiver)
        self.calls.append(held)
        return held


def _run(annotate: Any = None) -> tuple[Any, Clock, Metrics, _HeldCalls, dict]:
    clock, metrics, client = Clock(), Metrics(), _HeldCalls()
    config = make_config()
    ns = _ns(**{"amp.txn2.com/canary": "http://127.0.0.1:2/c"})
    r = route(ns, config, None)
    plan = canary_plan(ns, r, config)
    canary = Canary(client, clock, metrics, annotate=annotate)
    the_pod = pod("web")
    options = dict(
        denied=config.patch.denied_paths,
        allowed=config.patch.allowed_paths,
        repair=config.patch.repair,
        max_operations=config.patch.max_operations,
    )
    live = LiveStep("mesh", "u1", "web", r.steps[0], the_pod, b"{}", {}, Deadline.after(0, 10), options)
    run = canary.start(plan, live)
    return run, clock, metrics, client, the_pod


def _counted(metrics: Metrics, result: str) -> float:
    return Scrape(metrics.render().decode()).total("amp_canary_reviews_total", namespace="mesh", result=result)


def test_a_candidate_past_the_deadline_is_counted_failed_and_leaves_no_timer() -> None:
    run, clock, metrics, client, the_pod = _run()
    run.live_done(the_pod)
    clock.advance(10)
    assert _counted(metrics, "failed") == 1
    assert clock.getDelayedCalls() == []


def test_a_candidate_answering_after_the_live_answer_is_compared() -> None:
    run, clock, metrics, client, the_pod = _run()
    assert client.calls == [], "nothing of the candidate's runs before the live step answers"
    run.live_done(the_pod)
    assert client.calls == [], "the candidate is called in the next turn, after the live answer is written"
    clock.advance(0)
    client.calls[0].callback(EndpointDecision(patch=[{"op": "add", "path": "/metadata/labels/x", "value": "y"}]))
    assert _counted(metrics, "differs") == 1
    assert clock.getDelayedCalls() == []


def test_a_comparison_that_fails_never_reaches_the_live_review() -> None:
    def broken(uid: str, result: str, paths: tuple[str, ...]) -> None:
        raise RuntimeError("broken")

    run, clock, metrics, client, the_pod = _run(annotate=broken)
    run.live_done(the_pod)  # the live review's path: must not raise
    clock.advance(0)
    client.calls[0].callback(EndpointDecision())  # the comparison fails inside: caught
    assert _counted(metrics, "same") == 1
    assert clock.getDelayedCalls() == []


def test_a_live_step_that_failed_never_calls_the_candidate() -> None:
    run, clock, metrics, client, the_pod = _run()
    run.live_done(None, skipped=True)
    clock.advance(0)
    assert client.calls == [] and _counted(metrics, "skipped") == 1
    assert clock.getDelayedCalls() == []


def test_a_review_that_never_tells_its_live_step_ends_at_the_deadline() -> None:
    run, clock, metrics, client, the_pod = _run()
    clock.advance(10)
    assert client.calls == [] and _counted(metrics, "skipped") == 1
    assert clock.getDelayedCalls() == []
