"""
The canary: a candidate endpoint version compared with the live one on live
traffic, without ever delaying or changing the live answer.

A namespace annotated C{amp.txn2.com/canary: URL} (optionally
C{amp.txn2.com/canary-percent: N}, default 100, and, for a chain,
C{amp.txn2.com/canary-step: K}, the 1-based step the candidate stands in
for, default 1) has a share of its reviews also sent to the candidate.  The
candidate is called once the live step it stands in for has answered, in
the reactor's next turn (after the live answer of a one-step chain is
written), with the same Pod (as the chain's earlier steps left it) and the
same headers; it runs as the live step does, through the review's own step
code (L{amp.steps.CallStep}: one L{amp.waiting.Waiting} for the call's own
timeout and the review's deadline, the reply judged with the same
L{amp.patch.check_patch} options, the call settled with the verdict); and when
both are known, the Pod after the live step is compared by JSON path with
the Pod after the candidate (later steps of a chain are not run again: that
would call live endpoints twice).

The live review never waits for the candidate: the comparison happens
whenever the later of the two arrives, and the candidate's call is bounded
by the review's deadline all the same.  The candidate is called through an
endpoint client of its own (its own pools, bulkhead and breakers, metrics
apart from the live endpoints'), after the same allow-list and address
checks, so a failing candidate never opens a live endpoint's breaker or
takes its connections.

Outcomes, in C{amp_canary_reviews_total{namespace,result}}: C{same},
C{differs} (a log line names the differing paths), C{failed} (the
candidate failed or its patch was refused), C{skipped} (no comparison: the
live step failed or was not reached, or the canary annotations are
unusable).  Each outcome is also set on the review's entry in
C{/debug/reviews}.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional

from twisted.internet.defer import CancelledError
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from amp.config import Config
from amp.deadline import Deadline
from amp.endpoint import Call, EndpointClient, EndpointRequest
from amp.memo import Memo
from amp.namespaces import NamespaceInfo
from amp.patch import PatchError
from amp.poddiff import pod_differences
from amp.policy import EndpointStep, Route, resolve_chain
from amp.reply import EndpointDecision
from amp.rules import CANARY_ANNOTATION, CANARY_PERCENT_ANNOTATION, CANARY_STEP_ANNOTATION
from amp.steps import CallStep, Judged
from amp.urls import shown_url
from amp.waiting import Waiting

if TYPE_CHECKING:
    from amp.metrics import Metrics
    from amp.tracing import ReviewSpans, SpanRecord

__all__ = [
    "CANARY_ANNOTATION",
    "CANARY_PERCENT_ANNOTATION",
    "CANARY_STEP_ANNOTATION",
    "Canary",
    "CanaryPlan",
    "CanaryResult",
    "canary_plan",
]


class CanaryResult(StrEnum):
    """Values of C{amp_canary_reviews_total{result}}."""

    SAME = "same"
    DIFFERS = "differs"
    FAILED = "failed"
    SKIPPED = "skipped"


@dataclass(frozen=True, slots=True)
class CanaryPlan:
    """
    A namespace's canary: the candidate step, which live step it stands in
    for (0-based), the share of reviews, or why it cannot be used.
    """

    candidate: Optional[EndpointStep]
    index: int = 0
    percent: float = 100.0
    problem: str = ""


def canary_plan(ns: Optional[NamespaceInfo], route: Route, config: Config) -> Optional[CanaryPlan]:
    """
    The canary of a review routed by C{route} in C{ns} (pure); None when
    the namespace has none or the route calls no endpoint.
    """
    if ns is None or not route.steps:
        return None
    raw = ns.annotations.get(CANARY_ANNOTATION)
    if not raw:
        return None
    percent_text = ns.annotations.get(CANARY_PERCENT_ANNOTATION, "100")
    try:
        percent = float(percent_text)
        if not 0 <= percent <= 100:
            raise ValueError
    except ValueError:
        return CanaryPlan(None, problem=f"{CANARY_PERCENT_ANNOTATION} {percent_text!r} is not a number from 0 to 100")
    step_text = ns.annotations.get(CANARY_STEP_ANNOTATION, "1")
    if not step_text.isdigit() or not 1 <= int(step_text) <= len(route.steps):
        return CanaryPlan(
            None, problem=f"{CANARY_STEP_ANNOTATION} {step_text!r} is not a step of the chain (1 to {len(route.steps)})"
        )
    steps, _, _, error = resolve_chain(raw, config)
    if error is not None or len(steps) != 1:
        why = error[1] if error is not None else "name one URL"
        return CanaryPlan(None, problem=f"{CANARY_ANNOTATION}: {why}")
    return CanaryPlan(steps[0], int(step_text) - 1, percent)


@dataclass(frozen=True, slots=True)
class LiveStep:
    """
    The live step a candidate stands beside, as the review is about to call
    it: whose review, the endpoint, the Pod as the steps before left it and
    its JSON, the call's headers (copied by the run), the review's one
    deadline, and L{amp.patch.check_patch}'s options.
    """

    namespace: str
    uid: str
    pod_name: str
    live: EndpointStep
    pod: dict[str, Any]
    body: bytes
    headers: Mapping[bytes, bytes]
    deadline: Deadline
    patch_options: Mapping[str, Any]


class Canary:
    """
    Runs candidates beside live steps and reports the comparison.

    @param client: the candidates' own L{amp.endpoint.EndpointClient}.
    @param clock: for each run's one timer (L{amp.waiting.Waiting}).
    @param metrics: L{amp.metrics.Metrics} (C{canary_reviews}).
    @param annotate: told C{(uid, result, paths)} when a comparison ends
        (L{amp.recent.RecentDecisions.annotate}), or None.
    """

    log = Logger()

    def __init__(
        self,
        client: EndpointClient,
        clock: IReactorTime,
        metrics: Metrics,
        *,
        annotate: Optional[Callable[[str, str, tuple[str, ...]], None]] = None,
        draw: Callable[[], float] = random.random,
    ) -> None:
        self._client = client
        self._clock = clock
        self._counter = metrics.canary_reviews
        self._annotate = annotate
        self._draw = draw
        #: The problem last reported for each namespace (at most
        #: L{_PROBLEMS_KEPT}: one forgotten is reported again).
        self._problems: Memo[str, str] = Memo(_PROBLEMS_KEPT)

    def start(self, plan: CanaryPlan, step: LiveStep, spans: Optional[ReviewSpans] = None) -> Optional["CanaryRun"]:
        """
        Start the candidate beside the live C{step} about to be called, if
        this review is sampled; the L{CanaryRun} to tell the live step's
        outcome, or None.  C{spans}:
        the live review's (L{amp.tracing.ReviewSpans}) when it is traced:
        the candidate's call is a span linked to it.
        """
        namespace = step.namespace
        if plan.candidate is None:
            self._note_problem(namespace, plan.problem)
            self._count(namespace, CanaryResult.SKIPPED)
            return None
        self._problems.pop(namespace, None)
        if plan.percent < 100 and self._draw() * 100 >= plan.percent:
            return None
        run = CanaryRun(self, plan.candidate, step)
        if spans is not None and spans.sampled:
            run.spans = spans
        return run

    def _count(self, namespace: str, result: CanaryResult) -> None:
        self._counter.labels(namespace, str(result)).inc()

    def _note_problem(self, namespace: str, problem: str) -> None:
        if self._problems.get(namespace) != problem:
            self._problems[namespace] = problem
            self.log.warn("Namespace {namespace}: canary not used: {problem}", namespace=namespace, problem=problem)

    def _finished(self, run: "CanaryRun", result: CanaryResult, paths: tuple[str, ...], detail: str) -> None:
        self._count(run.namespace, result)
        if result is CanaryResult.DIFFERS:
            self.log.info(
                "Canary {candidate} differs from {endpoint} for Pod {namespace}/{pod} ({uid}): {paths}",
                candidate=run.candidate.name,
                endpoint=run.live.name,
                namespace=run.namespace,
                pod=run.pod_name,
                uid=run.uid,
                paths=" ".join(paths),
                result=str(result),
            )
        elif result is CanaryResult.FAILED:
            self.log.info(
                "Canary {candidate} failed for Pod {namespace}/{pod} ({uid}): {problem}",
                candidate=run.candidate.name,
                namespace=run.namespace,
                pod=run.pod_name,
                uid=run.uid,
                problem=detail,
                result=str(result),
            )
        if self._annotate is not None:
            self._annotate(run.uid, str(result), paths)


#: One side of a comparison once known: C{("pod", the Pod after the step,
#: None when it denied)}, C{("failed", why)} or C{("skipped", None)}.
_Side = tuple[str, Any]
#: Namespaces whose last canary problem is remembered, so it is reported once.
_PROBLEMS_KEPT = 4096


class CanaryRun:
    """
    One review's candidate call and its comparison with the live step.

    The candidate is called only once the live step has answered, and in
    the reactor's next turn: by then the live answer of a one-step chain
    is written, so the candidate's request and reply never take CPU ahead
    of it on the one reactor thread.  A live step that failed or was not
    run needs no comparison, and the candidate is not called.  The call
    is the review's own step code (L{CallStep}, whose owner the run is:
    L{amp.steps.IStepOwner}), waited on through the run's L{Waiting} with
    the review's deadline.  Always ends: the deadline cancels a call still
    in flight, or ends a run whose call never started.
    """

    def __init__(self, canary: Canary, candidate: EndpointStep, step: LiveStep) -> None:
        self._canary = canary
        self.candidate = candidate
        self.namespace = step.namespace
        self.uid = step.uid
        self.pod_name = step.pod_name
        self.live = step.live
        self._pod = step.pod
        self._body = step.body
        self._headers = dict(step.headers)
        self._deadline = step.deadline
        #: The live step's side and the candidate's, None until known.
        self._live: Optional[_Side] = None
        self._candidate: Optional[_Side] = None
        self._done = False
        clock = canary._clock
        self._starter: Optional[IDelayedCall] = None
        #: The live review's spans when it is traced (the candidate's call a linked span).
        self.spans: Optional[ReviewSpans] = None
        self._span: Optional[SpanRecord] = None
        waiting = self._waiting = Waiting(clock, step.deadline, self._expired)
        self._calls = CallStep(self, waiting, canary._client, step.patch_options)
        # The deadline holds from now, whether or not the call starts.
        waiting.arm()

    def live_done(self, pod_after: Optional[dict[str, Any]], skipped: bool = False) -> None:
        """
        The live step's outcome: the Pod after it (its checked patch applied;
        None when it denied), or C{skipped} when it failed or was not run.
        """
        if self._live is not None:
            return
        if skipped:
            self._live = ("skipped", None)
            self._candidate = ("failed", "not called: the live step did not answer")
            return self._compare()
        self._live = ("pod", pod_after)
        self._starter = self._canary._clock.callLater(0, self._send)

    def _send(self) -> None:
        self._starter = None
        if self._done:
            return
        candidate = self.candidate
        if self.spans is not None:
            self._span = self.spans.begin_linked("canary", self._canary._clock.seconds())
            self._headers[b"traceparent"] = b"00-%032x-%016x-01" % (self._span.trace_id, self._span.span_id)
        self._calls.start(
            EndpointRequest(
                candidate.url, candidate.settings, self._body, self._headers, self._deadline, candidate.breaker
            ),
            self._pod,
        )

    def _expired(self) -> None:
        """The review's deadline passed: the call in flight is cut off, or the run ends without it."""
        if self._calls.call is not None:
            # Tells step_failed: a timeout.
            self._waiting.cancel()
            return
        if self._starter is not None and self._starter.active():
            self._starter.cancel()
        if self._live is None:
            self._live = ("skipped", None)
        self._candidate = ("failed", "timeout: the review's deadline passed")
        self._compare()

    # ------------------------------------------------------------ the candidate's step (IStepOwner)

    def step_replied(self, call: Optional[Call], decision: EndpointDecision) -> bool:
        """The candidate answered: judged unless the run has ended."""
        return not self._done

    def step_judged(self, decision: EndpointDecision, judged: Judged) -> None:
        """The candidate's reply judged as the live step's is: the Pod after it, or why amp refused it."""
        if not decision.allowed:
            self._candidate = ("pod", None)
        elif isinstance(judged, PatchError):
            self._candidate = ("failed", f"{judged.reason}: {judged}")
        else:
            self._candidate = ("pod", judged.pod if judged is not None else self._pod)
        self._compare()

    def step_failed(self, call: Optional[Call], failure: Failure) -> None:
        """The candidate's call failed, or was cut off by the deadline."""
        if failure.check(CancelledError):
            self._candidate = ("failed", "timeout: the review's deadline passed")
        else:
            error = failure.value
            self._candidate = (
                "failed",
                f"{getattr(error, 'reason', type(error).__name__)}: {getattr(error, 'message', error)}",
            )
        self._compare()

    def _compare(self) -> None:
        if self._done or self._live is None or self._candidate is None:
            return
        self._done = True
        self._waiting.close()
        live_kind, live_pod = self._live
        kind, value = self._candidate
        canary = self._canary
        span, self._span = self._span, None
        try:
            if span is not None and self.spans is not None:
                self.spans.end_linked(
                    span,
                    canary._clock.seconds(),
                    {"amp.endpoint": shown_url(self.candidate.url), "amp.canary.live": shown_url(self.live.url)},
                    value if kind == "failed" else None,
                )
            if live_kind == "skipped":
                canary._finished(self, CanaryResult.SKIPPED, (), "")
            elif kind == "failed":
                canary._finished(self, CanaryResult.FAILED, (), value)
            else:
                paths = tuple(d.path or "/" for d in pod_differences(live_pod, value))
                canary._finished(self, CanaryResult.DIFFERS if paths else CanaryResult.SAME, paths, "")
        except Exception:
            # Called from the live review's own steps: nothing of the
            # canary's may fail or delay the live answer.
            canary.log.failure(
                "Canary comparison for Pod {namespace}/{pod} ({uid}) failed",
                namespace=self.namespace,
                pod=self.pod_name,
                uid=self.uid,
            )
