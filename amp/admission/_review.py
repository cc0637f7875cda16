"""
One review in progress (L{Review}): its steps, waited on the one way
(L{amp.waiting.Waiting}: the review's deadline and the step in progress,
one timer), and cancellation.

A review waits on one step at a time (the namespace lookup when the cache
does not know the namespace, then each endpoint call of the chain), gives
each step what is left of the deadline, and waits on it through its
L{amp.waiting.Waiting}, whose one timer enforces the deadline: when the
deadline passes, or the client goes away (L{Review.cancel}), the step in
progress is cancelled (its own C{cancel}, the one way) and the review is
answered at once.  The lookup is a step over the namespace cache's
Deferred (L{amp.waiting.DeferredStep}), its result told to the review; an
endpoint call is the shared L{amp.steps.CallStep}'s, which judges the
reply's patch, settles the call with the verdict and tells the review,
which goes on; how it ends is L{amp.admission._answering}'s.  Beside a
step, the namespace's canary (L{amp.canary}) may call a candidate endpoint
through the same step code, told how the live step ended; an answered
review is offered for recording (L{amp.record}).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from twisted.internet.defer import CancelledError
from twisted.logger import Logger
from twisted.python.failure import Failure

from amp import answers
from amp.admission import _observing
from amp.admission._answering import Answering, patch_bytes, told
from amp.admission._attributes import route_attributes
from amp.admission._chain import Chain
from amp.admission._failing import CANCELLED, deadline_passed, failure_named
from amp.admission._parts import EPHEMERAL_CONTAINERS, Parts
from amp.admission._state import ENDING, REVIEW_NEXT, IllegalReviewTransition, ReviewState, check_review
from amp.admission_review import AdmissionRequest, clean_audit_annotations, dumps
from amp.answers import Answer
from amp.deadline import Deadline
from amp.endpoint import OK, Call, EndpointFailure, EndpointRequest
from amp.namespaces import UNKNOWN, NamespaceInfo
from amp.patch import PatchError, unchanged
from amp.policy import FAIL, SHADOW, Route
from amp.reasons import Reason, Status
from amp.reply import EndpointDecision
from amp.steps import CallStep, Judged
from amp.trace import IReviewTrace, Refused, Skipped
from amp.tracing import ReviewSpans
from amp.waiting import DeferredStep, Waiting

_WORKING, _LOOKING_UP, _CALLING, _TIMED_OUT, _CANCELLED_STATE, _ANSWERED = ReviewState


class Review:
    """
    One review in progress: its state (a L{ReviewState}; the transitions
    are L{amp.admission._state}'s), its L{Waiting} (the deadline, the step
    it waits on, the one timer), the route once known, the chain once
    routed.  It is the namespace lookup's receiver and the owner of its
    endpoint steps (L{amp.steps.IStepOwner}).

    @param answered: called once with the review's L{Answer} (a review
        never fails); L{cancel} ends the review at once, as C{cancelled}.
    """

    __slots__ = (
        "_parts",
        "_req",
        "_deadline",
        "_validation",
        "_route",
        "_waiting",
        "_step",
        "_state",
        "_answered",
        "_chain",
        "_trace",
        "_call_started",
        "_answering",
        "_namespace",
        "_canary_plan",
        "_canary_run",
        "_spans",
        "_lookup_started",
        "_judge_began",
    )

    log = Logger()

    def __init__(
        self,
        parts: Parts,
        req: AdmissionRequest,
        deadline: Deadline,
        validation: bool,
        trace: IReviewTrace,
        answered: Callable[[Answer], None],
        spans: Optional[ReviewSpans] = None,
    ) -> None:
        #: The review's spans (L{amp.tracing}) when it is traced, else None.
        self._spans = spans
        self._parts = parts
        self._trace = trace
        self._answering = Answering(parts, req, validation, trace)
        #: When the endpoint call in progress started (for the trace).
        self._call_started = 0.0
        self._req = req
        self._deadline = deadline
        self._validation = validation
        self._route: Optional[Route] = None
        #: The namespace as the review found it, once routed.
        self._namespace: Optional[NamespaceInfo] = None
        #: The namespace's canary (L{amp.canary.CanaryPlan}) and its run in progress.
        self._canary_plan: Any = None
        self._canary_run: Any = None
        self._state = _WORKING
        #: The deadline and the step waited on: the namespace lookup
        #: (LOOKING_UP; its end told to L{replied}, L{failed}), or an endpoint
        #: call (CALLING; its end told through L{_step}).
        self._waiting = Waiting(parts.clock, deadline, self._deadline_passed)
        #: The chain's endpoint calls, once routed (L{amp.steps.CallStep}).
        self._step: Optional[CallStep] = None
        #: The endpoint chain in progress, once routed.
        self._chain: Optional[Chain] = None
        self._answered = answered

    # ------------------------------------------------------------ steps

    @property
    def done(self) -> bool:
        """The review has been answered."""
        return self._state is _ANSWERED

    @property
    def state(self) -> ReviewState:
        """Where the review is (L{amp.admission._state})."""
        return self._state

    def _become(self, state: ReviewState) -> None:
        """Go to C{state}; one L{amp.admission._state.REVIEW_NEXT} does not allow is logged as amp's bug."""
        if state in REVIEW_NEXT[self._state]:
            self._state = state
            return
        try:
            check_review(self._state, state)
        except IllegalReviewTransition:
            self.log.failure("amp internal error: review {uid}", Failure(), uid=self._req.uid)
            self._state = state

    @property
    def waiting(self) -> Waiting:
        """What the review waits on: its deadline, the step in progress, the one timer."""
        return self._waiting

    def start(self) -> None:
        namespaces = self._parts.namespaces
        name = self._req.namespace
        try:
            ns = namespaces.cached(name)
            if ns is UNKNOWN:
                now = self._parts.clock.seconds()
                if self._spans is not None and self._spans.sampled:
                    self._lookup_started = now
                fetched = namespaces.fetch(name, self._deadline.remaining(now))
                self._become(_LOOKING_UP)
                lookup = DeferredStep(fetched, self)
                if not lookup.told:
                    self._waiting.wait(lookup)
            else:
                self._routed(ns)
        except Exception:
            # A bug, a broken source or client: still an answer.
            self._step_failed(Failure())

    def replied(self, ns: Optional[NamespaceInfo]) -> None:
        """The namespace lookup's result (its step's receiver, L{amp.waiting.IReceiver})."""
        if self._looked():
            try:
                spans = self._spans
                if spans is not None and spans.sampled:
                    # A traced review's span of it.
                    _observing.lookup_span(spans, self._lookup_started, self._parts.clock, self._req.namespace, ns)
                self._routed(ns)
            except Exception:
                self._step_failed(Failure())

    def failed(self, failure: Failure) -> None:
        """The namespace lookup failed, or was cancelled (its step's receiver)."""
        if self._looked():
            try:
                self._step_failed(failure)
            except Exception:
                self._step_failed(Failure())

    def _looked(self) -> bool:
        """The lookup ended: whether the review still wants its result (not when answered without it)."""
        state = self._state
        if state is _LOOKING_UP:
            self._waiting.step = None
            self._become(_WORKING)
        return state is not _ANSWERED

    def _routed(self, ns: Optional[NamespaceInfo]) -> None:
        parts = self._parts
        req = self._req
        trace = self._trace
        self._namespace = ns
        spans = self._spans
        if spans is not None and spans.sampled:
            began = parts.clock.seconds()
            r = self._route = parts.route(ns, validation=self._validation, explain=trace.recording)
            spans.step("route", began, parts.clock.seconds(), route_attributes(r))
        else:
            r = self._route = parts.route(ns, validation=self._validation, explain=trace.recording)
        if r.enabled:
            parts.note_problem(req.namespace, r.policy_problem)
        if trace.recording:
            trace.extend(r.explanation)
        if not r.enabled:
            return self._answer(answers.skipped(req))
        if r.error is not None:
            return self._answer(self._answering.failed(r, None, *r.error))
        if not r.steps:
            if self._validation:
                return self._answer(answers.skipped(req))
            if parts.has_validation_endpoint(ns):
                # Nothing to mutate, but the Pod was reviewed: stamped, so
                # it is not taken for one that bypassed amp.
                stamped = self._answering.stamper.stamp(None, [(r.where, Status.UNCHANGED, "")])
                return self._answer(answers.skipped(req, patch=patch_bytes(stamped)))
            return self._answer(
                self._answering.failed(
                    r, None, Reason.NO_ENDPOINT, "namespace is enabled but has no endpoint annotation"
                )
            )
        if parts.canary is not None and r.mode != SHADOW and not self._validation and not req.is_ephemeral_update:
            self._canary_plan = parts.canary_plan(ns, r)
        self._chain = Chain(r, unchanged(req.object))
        self._call_next()

    def _call_next(self) -> None:
        """
        Call the chain's next endpoint with the Pod as the steps before it
        left it, within what is left of the review's one deadline; or, when
        every step is done, answer.
        """
        chain = self._chain
        assert chain is not None
        if chain.done:
            return self._answer(self._answering.chain_done(chain))
        step = chain.route.steps[chain.index]
        req = self._req
        headers = {
            b"x-amp-namespace": req.namespace.encode("utf-8"),
            b"x-amp-operation": req.operation.encode("ascii", "replace"),
            b"x-amp-uid": req.uid.encode("ascii", "replace"),
            b"x-amp-dry-run": b"true" if req.dry_run else b"false",
        }
        if req.sub_resource:
            headers[b"x-amp-subresource"] = req.sub_resource.encode("ascii", "replace")
        if chain.pod.pod is req.object:
            pod_json = req.object_json if req.object_json is not None else dumps(req.object)
        else:
            pod_json = dumps(chain.pod.pod)
        if self._trace.recording:
            # Facts only a kept event needs (a review's hot path gathers none).
            now = self._call_started = self._parts.clock.seconds()
            _observing.record_budget(self._trace, self._deadline.remaining(now), step, chain)
        plan = self._canary_plan
        if plan is not None and plan.index == chain.index:
            self._canary_run = _observing.start_canary(
                self._parts, plan, req, step, chain, pod_json, headers, self._deadline, self._spans
            )
        spans = self._spans
        if spans is not None:
            _observing.trace_call(spans, self._parts.clock, step, headers, chain.index)
        calls = self._step
        if calls is None:
            parts = self._parts
            calls = self._step = CallStep(
                self,
                self._waiting,
                parts.endpoints,
                parts.check_options,
                judges=not self._validation,
                confined=EPHEMERAL_CONTAINERS if req.is_ephemeral_update else None,
                trace=self._trace,
            )
        request = EndpointRequest(step.url, step.settings, pod_json, headers, self._deadline, step.breaker)
        if calls.start(request, chain.pod.pod):
            # Waited on (a refusal is told before start returns, and the
            # chain may have gone on from it).
            self._become(_CALLING)

    # ------------------------------------------------------------ the endpoint step's end (IStepOwner)

    def step_replied(self, call: Optional[Call], decision: EndpointDecision) -> bool:
        """The endpoint call in progress answered; whether its reply is still wanted (judged)."""
        spans = self._spans
        if spans is not None and spans.sampled:
            _observing.call_ended(spans, self._parts.clock, self._parts.endpoints, self._chain, call, None)
        state = self._state
        if state is _CALLING:
            self._become(_WORKING)
        elif state is _ANSWERED:
            # The review was answered without this step; its reply is
            # settled as it is: nobody judges it.
            return False
        if self._trace.recording:
            self._record_call(OK, "")
            _observing.record_replied(self._trace, decision)
        if spans is not None and spans.sampled and decision.patch:
            self._judge_began = self._parts.clock.seconds()
        return True

    def step_judged(self, decision: EndpointDecision, judged: Judged) -> None:
        """The endpoint's reply judged and its call settled with the verdict: go on."""
        try:
            spans = self._spans
            if spans is not None and spans.sampled and decision.patch:
                _observing.patch_span(spans, self._judge_began, self._parts.clock, decision, judged)
            self._decided(decision, judged)
        except Exception:
            self._step_failed(Failure())

    def step_failed(self, call: Optional[Call], failure: Failure) -> None:
        """The endpoint call in progress failed (or amp could not judge its reply)."""
        spans = self._spans
        if spans is not None and spans.sampled:
            _observing.call_failed(spans, self._parts.clock, self._parts.endpoints, self._chain, call, failure)
        state = self._state
        if state is _CALLING:
            self._become(_WORKING)
        elif state is _ANSWERED:
            return
        try:
            self._step_failed(failure)
        except Exception:
            self._step_failed(Failure())

    def _tell_canary(self, pod_after: Optional[dict[str, Any]] = None, skipped: bool = False) -> None:
        """Tell the canary in progress how the live step it stands beside ended."""
        run, self._canary_run = self._canary_run, None
        if run is not None:
            run.live_done(pod_after, skipped)

    def _decided(self, decision: EndpointDecision, judged: Judged) -> None:
        """
        Go on from the endpoint's C{decision} and amp's C{judged} verdict on
        its patch (L{amp.steps.judge}).
        """
        req = self._req
        chain = self._chain
        assert chain is not None
        origin = chain.route.steps[chain.index].name
        audit, problems = clean_audit_annotations(decision.audit)
        chain.told(origin, decision.warnings, problems, audit)
        if not decision.allowed:
            self._tell_canary(None)
            if chain.route.mode == SHADOW:
                return self._answer(self._answering.shadow(chain, origin, denied=True))
            return self._answer(
                answers.denied(req, origin, decision.code, decision.message, warnings=chain.warnings, audit=chain.audit)
            )
        if isinstance(judged, PatchError):
            self._trace.record(Refused, reason=judged.reason, message=str(judged))
            return self._step_ended(judged.reason, str(judged))
        self._tell_canary(judged.pod if judged is not None else chain.pod.pod)
        if judged is not None and judged.operations:
            chain.applied(judged)
            chain.ok(origin, True)
        else:
            chain.ok(origin, False)
        self._call_next()

    def _step_ended(self, reason: Reason, message: str) -> None:
        """
        The chain's current endpoint failed with C{reason}: under C{Ignore}
        (not in shadow mode) its step is skipped and the chain goes on with
        the Pod as it was; else the failure policy answers, naming it.
        """
        self._tell_canary(skipped=True)
        chain = self._chain
        assert chain is not None
        r = chain.route
        step = r.steps[chain.index]
        if r.failure_policy == FAIL or r.mode == SHADOW:
            return self._answer(self._answering.failed(r, chain, reason, message, step.name))
        self._trace.record(Skipped, endpoint=step.name, reason=reason, message=message)
        chain.skip(step.name, reason, message)
        self._call_next()

    def _record_call(self, outcome: str, message: str) -> None:
        chain = self._chain
        assert chain is not None
        _observing.record_called(self._trace, chain, self._parts.clock.seconds() - self._call_started, outcome, message)

    # ------------------------------------------------------------ ending

    def _answer(self, answer: Answer) -> None:
        if self._state is _ANSWERED:
            return
        told(self._trace, answer)
        spans = self._spans
        if spans is not None and spans.sampled:
            spans.stamp = self._answering.stamper.value
        self._become(_ANSWERED)
        self._waiting.close()
        self._tell_canary(skipped=True)
        recorder = self._parts.recorder
        if recorder is not None and recorder.recording and self._route is not None and not self._validation:
            _observing.offer(
                recorder, self._parts.clock, self._namespace, self._route, self._req, answer, self._spans, self.log
            )
        self._answered(answer)

    def _deadline_passed(self) -> None:
        """The deadline passed (the L{Waiting}'s timer): end the review now."""
        self._end(Reason.DEADLINE)

    def cancel(self) -> None:
        """The client went away: end the review now, as C{cancelled}."""
        self._end(Reason.CANCELLED)

    def _end(self, why: Reason) -> None:
        """
        End the review now (its deadline passed, or the client went away):
        the step in progress is cancelled (the one way, L{Waiting.cancel}),
        and tells its end (a timeout when the deadline passed, else a
        cancellation), which answers the review.
        """
        if self._state is _ANSWERED:
            return
        self._become(_TIMED_OUT if why is Reason.DEADLINE else _CANCELLED_STATE)
        self._waiting.cancel()
        if self._state is not _ANSWERED:
            # The step did not end when cancelled: answer without it.
            self._step_failed(Failure(CancelledError()))

    def _step_failed(self, failure: Failure) -> None:
        """
        A step failed, was cancelled, or raised: name the reason; a failed
        endpoint of the chain ends in L{_step_ended} (or, once the
        deadline has passed, the rest of the chain is skipped); anything
        else is answered under the failure policy.
        """
        chain = self._chain
        calling = chain is not None and not chain.done
        state = self._state
        if state is _CANCELLED_STATE:
            # The API server hung up (see amp.web): nobody reads this
            # answer, and it is not an error of amp's.
            reason, message = Reason.CANCELLED, CANCELLED
        elif isinstance(failure.value, EndpointFailure):
            # Including the call cut off by the review's deadline: C{timeout}.
            e = failure.value
            reason, message = e.reason, e.message
            if calling and self._trace.recording:
                self._record_call(reason, message)
            if calling and state not in ENDING:
                return self._step_ended(reason, message)
        else:
            reason, message = failure_named(failure, state is _TIMED_OUT, self._deadline.budget, self._req, self.log)
        if calling and state is _TIMED_OUT:
            assert chain is not None
            return self._answer(deadline_passed(self._answering, chain, reason, message, self._deadline.budget))
        self._answer(self._answering.failed(self._route, chain, reason, message))
