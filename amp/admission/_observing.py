"""
What one review (L{amp.admission._review.Review}) tells those who watch
it, off its hot path: the trace's events of an endpoint call (the budget it
was given, how it was called, what it replied), a traced call's spans
(L{amp.tracing}), the capture offered for recording (L{amp.record}), and
the spans of its namespace lookup and of a reply's patch check; and the
namespace's canary (L{amp.canary}), started to watch a live step.
"""

from __future__ import annotations

from typing import Any, Optional

from twisted.logger import Logger
from twisted.python.failure import Failure

from amp.admission._attributes import call_attributes, call_ended_attributes
from amp.admission._chain import Chain
from amp.admission._parts import IRecorder, Parts
from amp.admission_review import AdmissionRequest
from amp.answers import Answer
from amp.canary import LiveStep
from amp.deadline import Deadline
from amp.endpoint import Call, EndpointFailure
from amp.namespaces import NamespaceInfo
from amp.patch import PatchError
from amp.policy import Route
from amp.record._entry import Capture
from amp.reply import EndpointDecision
from amp.trace import BudgetGiven, Called, IReviewTrace, Replied
from amp.tracing import ReviewSpans
from amp.urls import shown_url


def record_budget(trace: IReviewTrace, left: float, step: Any, chain: Chain) -> None:
    """The budget the chain's current endpoint call is given (C{left} of the deadline), for the trace."""
    settings = step.settings
    trace.record(
        BudgetGiven,
        seconds=round(left, 4),
        timeout=round(min(settings.timeout, left), 4),
        position=chain.index + 1,
        chain_length=len(chain.route.steps),
        max_concurrent=settings.max_concurrent,
        min_call_time=settings.min_call_time,
        latency_budget=settings.latency_budget,
    )


def record_called(trace: IReviewTrace, chain: Chain, seconds: float, outcome: str, message: str) -> None:
    """How the chain's current endpoint call went, taking C{seconds}, for the trace."""
    step = chain.route.steps[chain.index]
    trace.record(
        Called, endpoint=step.name, url=shown_url(step.url), outcome=outcome, seconds=round(seconds, 6), message=message
    )


def record_replied(trace: IReviewTrace, decision: EndpointDecision) -> None:
    """What the endpoint replied, for the trace."""
    trace.record(
        Replied,
        allowed=decision.allowed,
        operations=len(decision.patch),
        warnings=list(decision.warnings),
        code=None if decision.allowed else decision.code,
        message=decision.message,
    )


def trace_call(spans: ReviewSpans, clock: Any, step: Any, headers: dict[bytes, bytes], index: int) -> None:
    """The trace context an endpoint call carries, and (sampled) its span begun."""
    attributes = call_attributes(step, index) if spans.sampled else {}
    headers[b"traceparent"] = spans.call_started(clock.seconds(), attributes)
    state = spans.tracestate
    if state:
        headers[b"tracestate"] = state


def call_ended(
    spans: ReviewSpans, clock: Any, endpoints: Any, chain: Optional[Chain], call: Optional[Call], error: Optional[str]
) -> None:
    """A traced endpoint call ended: its span's end, connection and resends, breaker state."""
    attributes = call_ended_attributes(call)
    if chain is not None and not chain.done:
        state = endpoints.breaker_state(chain.route.steps[chain.index].url)
        if state is not None:
            attributes["amp.breaker.state"] = state
    if error is not None:
        attributes["error.type"] = error.split(":", 1)[0]
    spans.call_ended(clock.seconds(), error, **attributes)


def offer(
    recorder: IRecorder,
    clock: Any,
    ns: Optional[NamespaceInfo],
    r: Route,
    req: AdmissionRequest,
    answer: Answer,
    spans: Optional[ReviewSpans],
    log: Logger,
) -> None:
    """Offer the answered review for recording (never blocks or raises); a traced review's span of it, linked."""
    if spans is not None and spans.sampled:
        began = clock.seconds()
        _offer(recorder, clock, ns, r, req, answer, spans, log)
        spans.linked("record", began, clock.seconds(), {"amp.review.uid": req.uid})
    else:
        _offer(recorder, clock, ns, r, req, answer, spans, log)


def _offer(
    recorder: IRecorder,
    clock: Any,
    ns: Optional[NamespaceInfo],
    r: Route,
    req: AdmissionRequest,
    answer: Answer,
    spans: Optional[ReviewSpans],
    log: Logger,
) -> None:
    try:
        offered = capture(clock, ns, r, req, answer, spans)
        if offered is not None:
            recorder.offer(offered)
    except Exception:
        log.failure("Could not offer a review for recording")


def lookup_span(spans: ReviewSpans, began: float, clock: Any, namespace: str, ns: Optional[NamespaceInfo]) -> None:
    """A traced review's span of the namespace lookup the cache could not answer."""
    spans.step(
        "namespace lookup",
        began,
        clock.seconds(),
        {"k8s.namespace.name": namespace, "amp.namespace.found": ns is not None},
    )


def patch_span(spans: ReviewSpans, began: float, clock: Any, decision: EndpointDecision, judged: Any) -> None:
    """A traced review's span of a reply's patch checked (L{amp.patch.PatchError} when amp refused it)."""
    spans.step(
        "patch check",
        began,
        clock.seconds(),
        {"amp.patch.operations": len(decision.patch)},
        f"{judged.reason}: {judged}" if isinstance(judged, PatchError) else None,
    )


def call_failed(
    spans: ReviewSpans, clock: Any, endpoints: Any, chain: Optional[Chain], call: Optional[Call], failure: Failure
) -> None:
    """A traced endpoint call failed: its span's end (L{call_ended}), naming the failure."""
    e = failure.value
    call_ended(
        spans,
        clock,
        endpoints,
        chain,
        call,
        f"{e.reason}: {e.message}" if isinstance(e, EndpointFailure) else failure.getErrorMessage() or "cancelled",
    )


def start_canary(
    parts: Parts,
    plan: Any,
    req: AdmissionRequest,
    step: Any,
    chain: Chain,
    pod_json: bytes,
    headers: dict[bytes, bytes],
    deadline: Deadline,
    spans: Optional[ReviewSpans],
) -> Any:
    """The namespace's canary started beside the live step about to be called (L{amp.canary}): its run."""
    return parts.canary.start(  # type: ignore[union-attr]  # a plan implies a canary
        plan,
        LiveStep(
            req.namespace, req.uid, req.pod_name, step, chain.pod.pod, pod_json, headers, deadline, parts.check_options
        ),
        spans,
    )


def capture(
    clock: Any,
    ns: Optional[NamespaceInfo],
    r: Route,
    req: AdmissionRequest,
    answer: Answer,
    spans: Optional[ReviewSpans],
) -> Optional[Capture]:
    """The answered review as the recorder is offered it; None when the request's body is not kept."""
    outcome = answer.outcome
    if req.body is None:
        return None
    return Capture(
        clock.seconds(),
        req.uid,
        req.namespace,
        ns.labels if ns is not None else {},
        ns.annotations if ns is not None else {},
        tuple(step.name for step in r.steps),
        str(r.failure_policy),
        str(r.mode),
        req.body,
        answer.body,
        str(outcome.result),
        str(outcome.reason),
        spans.trace_hex if spans is not None and spans.sampled else "",
    )
