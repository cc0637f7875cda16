"""
One review in progress (L{Review}): its steps, the one timer of its
deadline, and cancellation.

A review waits on one step at a time (the namespace lookup when the cache
does not know the namespace, then each endpoint call of the chain), gives
each step what is left of the deadline, and owns the one timer that
enforces it: when the deadline passes, or the client goes away (the
review's Deferred is cancelled), the step in progress is cancelled and the
review is answered at once.  An endpoint call resolves to the reply and its
settle handle (L{amp.endpoint.CallReply}): the review judges the reply's patch,
settles the call with the verdict, and goes on; how it ends is
L{amp.admission._answering}'s.  Beside a step, the namespace's canary
(L{amp.canary}) may call a candidate endpoint, told how the live step
ended; an answered review is offered for recording (L{amp.record}).
"""

from __future__ import annotations

from typing import Any, Callable, Optional, TypeVar, Union

from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import IDelayedCall
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
from amp.endpoint import OK, Call, CallReply, EndpointFailure
from amp.namespaces import UNKNOWN, NamespaceInfo
from amp.patch import PatchError, check_patch, unchanged
from amp.policy import FAIL, SHADOW, Route
from amp.reasons import Reason, Status
from amp.reply import EndpointDecision
from amp.trace import IReviewTrace, Refused, Skipped
from amp.tracing import ReviewSpans

_T = TypeVar("_T")

_WORKING, _LOOKING_UP, _CALLING, _TIMED_OUT, _CANCELLED_STATE, _ANSWERED = ReviewState
#: A timer may fire this much before the time it was set for (floats).
_EARLY = 1e-6


class Review:
    """
    One review in progress: its state (a L{ReviewState}; the transitions
    are L{amp.admission._state}'s), the step it waits on, the deadline's
    timer, the route once known, the chain once routed.

    @param answered: called once with the review's L{Answer} (a review
        never fails); L{cancel} ends the review at once, as C{cancelled}.
    """

    __slots__ = (
        "_parts",
        "_req",
        "_deadline",
        "_validation",
        "_route",
        "_pending",
        "_call",
        "_timer",
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
        #: The step waited on: a namespace lookup (LOOKING_UP), or an endpoint
        #: call (CALLING; its end is told, L{replied}, L{failed}).
        self._pending: Optional[Deferred[Any]] = None
        self._call: Optional[Call] = None
        self._timer: Optional[IDelayedCall] = None
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

    def start(self) -> None:
        namespaces = self._parts.namespaces
        name = self._req.namespace
        try:
            ns = namespaces.cached(name)
            if ns is UNKNOWN:
                now = self._parts.clock.seconds()
                if self._spans is not None and self._spans.sampled:
                    self._lookup_started = now
                    self._wait(namespaces.fetch(name, self._deadline.remaining(now)), self._looked_up)
                else:
                    self._wait(namespaces.fetch(name, self._deadline.remaining(now)), self._routed)
            else:
                self._routed(ns)
        except Exception:
            # A bug, a broken source or client: still an answer.
            self._step_failed(Failure())

    def _wait(self, d: Deferred[_T], then: Callable[[_T], None]) -> None:
        """
        Wait for C{d}, then pass its result to C{then}; arm the deadline's
        timer if it is not armed yet and C{d} has not fired already.
        """
        self._pending = d
        self._become(_LOOKING_UP)
        d.addBoth(self._resume, d, then)
        if self._pending is d:
            self._arm()

    def _arm(self) -> None:
        """
        The review waits: its one timer set for the deadline, or for the
        endpoint call's own timeout when that ends first (the call is told
        then, L{_expired}; it arms no timer of its own), or, while the call
        waits for a slot of its origin's bulkhead, for its latest start.
        """
        when = self._call_expires()
        if when is None:
            when = self._deadline.at
        clock = self._parts.clock
        timer = self._timer
        if timer is None:
            self._timer = clock.callLater(max(0.0, when - clock.seconds()), self._expired)
        elif timer.getTime() != when:
            timer.reset(max(0.0, when - clock.seconds()))

    def _call_expires(self) -> Optional[float]:
        """
        When the endpoint call in progress times out, if it does before the
        review's deadline (else None: the deadline ends it).
        """
        call = self._call
        if call is not None and call.expires is not None and call.expires < self._deadline.at:
            return call.expires
        return None

    def _resume(self, result: Union[_T, Failure], d: Deferred[_T], then: Callable[[_T], None]) -> None:
        if self._pending is not d:
            # The review was answered without this step; its result is
            # dropped (a reply is settled as it is: nobody judges it).
            if isinstance(result, CallReply):
                result.settle(OK)
            return None
        self._pending = None
        if self._state is _LOOKING_UP:
            self._become(_WORKING)
        try:
            if isinstance(result, Failure):
                self._step_failed(result)
            else:
                then(result)
        except Exception:
            self._step_failed(Failure())
        return None

    def _looked_up(self, ns: Optional[NamespaceInfo]) -> None:
        """The namespace the cache did not know, fetched (a traced review's span of it)."""
        spans = self._spans
        assert spans is not None
        _observing.lookup_span(spans, self._lookup_started, self._parts.clock, self._req.namespace, ns)
        self._routed(ns)

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
        call = self._parts.endpoints.ask_into(
            self, step.url, step.settings, pod_json, headers, self._deadline, step.breaker, caller_times=True
        )
        if call is not None and not call.told:
            # Not ended at once (a refusal is told before ask_into returns,
            # and the chain may have gone on from it).
            self._call = call
            self._become(_CALLING)
            self._arm()

    def replied(self, reply: CallReply) -> None:
        """The endpoint call in progress answered (L{amp.endpoint.ICallReceiver})."""
        spans = self._spans
        if spans is not None and spans.sampled:
            _observing.call_ended(spans, self._parts.clock, self._parts.endpoints, self._chain, self._call, None)
        self._call = None
        if self._state is _CALLING:
            self._become(_WORKING)
        elif self._state is _ANSWERED:
            # The review was answered without this step; its reply is
            # settled as it is: nobody judges it.
            reply.settle(OK)
            return
        try:
            self._take_reply(reply)
        except Exception:
            self._step_failed(Failure())

    def failed(self, failure: Failure) -> None:
        """The endpoint call in progress failed (L{amp.endpoint.ICallReceiver})."""
        spans = self._spans
        if spans is not None and spans.sampled:
            _observing.call_failed(spans, self._parts.clock, self._parts.endpoints, self._chain, self._call, failure)
        self._call = None
        if self._state is _CALLING:
            self._become(_WORKING)
        elif self._state is _ANSWERED:
            return
        try:
            self._step_failed(failure)
        except Exception:
            self._step_failed(Failure())

    def started(self) -> None:
        """
        The endpoint call in progress waited for a slot and goes out now
        (L{amp.endpoint.ICallReceiver}): the one timer, set for its latest
        start, is set for its own timeout (or the deadline) instead.
        """
        if self._state is _CALLING and self._call is not None:
            self._arm()

    def _tell_canary(self, pod_after: Optional[dict[str, Any]] = None, skipped: bool = False) -> None:
        """Tell the canary in progress how the live step it stands beside ended."""
        run, self._canary_run = self._canary_run, None
        if run is not None:
            run.live_done(pod_after, skipped)

    def _take_reply(self, reply: CallReply) -> None:
        """
        The endpoint answered: judge its reply, settle the call with the
        verdict (L{OK} or the reason amp refuses the reply), then go on.
        """
        decision = reply.decision
        judged = None
        try:
            if self._trace.recording:
                self._record_call(OK, "")
                _observing.record_replied(self._trace, decision)
            spans = self._spans
            if spans is not None and spans.sampled and decision.patch:
                began = self._parts.clock.seconds()
                judged = self._judge(decision)
                _observing.patch_span(spans, began, self._parts.clock, decision, judged)
            else:
                judged = self._judge(decision)
        finally:
            reply.settle(judged.reason if isinstance(judged, PatchError) else OK)
        self._decided(decision, judged)

    def _judge(self, decision: EndpointDecision) -> Any:
        """
        The current step's patch checked and dry-applied to the Pod as the
        steps before left it; the L{PatchError} when amp refuses it; None
        when there is nothing to check (a deny, a validation, no patch).
        """
        chain = self._chain
        assert chain is not None
        if not decision.allowed or self._validation or not decision.patch:
            return None
        try:
            return check_patch(
                chain.pod.pod,
                decision.patch,
                **self._parts.check_options,
                trace=self._trace,
                confined=EPHEMERAL_CONTAINERS if self._req.is_ephemeral_update else None,
            )
        except PatchError as e:
            return e

    def _decided(self, decision: EndpointDecision, judged: Any) -> None:
        """
        Go on from the endpoint's C{decision} and amp's C{judged} verdict on
        its patch (see L{_judge}).
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
        changed = judged is not None and bool(judged.operations)
        if changed:
            chain.applied(judged)
        chain.ok(origin, changed)
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
        self._pending = self._call = None
        timer, self._timer = self._timer, None
        if timer is not None and timer.active():
            timer.cancel()
        self._tell_canary(skipped=True)
        recorder = self._parts.recorder
        if recorder is not None and recorder.recording and self._route is not None and not self._validation:
            _observing.offer(
                recorder, self._parts.clock, self._namespace, self._route, self._req, answer, self._spans, self.log
            )
        self._answered(answer)

    def _expired(self) -> None:
        self._timer = None
        call = self._call
        when = self._call_expires()
        now = self._parts.clock.seconds()
        if call is not None and when is not None and when <= now + _EARLY:
            # The endpoint call's own timeout, not the review's deadline:
            # the call fails with timeout (told at once, failed), and
            # the chain goes on or the failure policy answers.
            self._call = None
            try:
                call.time_out()
            finally:
                if self._timer is None and self._state is not _ANSWERED:
                    # Not answered, and no next step armed the timer (or
                    # a bug of amp's raised while the call ended): the
                    # deadline still holds.
                    self._arm()
            return
        if not self._deadline.passed(now):
            # Early (floats), or a call that got its slot without the
            # review being told: the timer waits for the call's own
            # timeout, or the deadline, instead.
            self._arm()
            return
        self._end(Reason.DEADLINE)

    def cancel(self) -> None:
        """The client went away: end the review now, as C{cancelled}."""
        self._end(Reason.CANCELLED)

    def _end(self, why: Reason) -> None:
        """
        End the review now (its deadline passed, or the client went away):
        cancel the step in progress, which then ends through L{_resume}.
        """
        if self._state is _ANSWERED:
            return
        self._become(_TIMED_OUT if why is Reason.DEADLINE else _CANCELLED_STATE)
        pending = self._pending
        if pending is not None:
            pending.cancel()
        call, self._call = self._call, None
        if call is not None:
            # Tells failed: a timeout when the deadline passed, else
            # CancelledError.
            call.cancel()
        if self._state is not _ANSWERED:
            # The step did not end when cancelled: answer without it.
            self._pending = None
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
