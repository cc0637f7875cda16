"""
A review's recorded spans (L{amp.tracing._spans.ReviewSpans}) made into
the OpenTelemetry SDK's finished spans (C{ReadableSpan}), after the answer
is written: the review span (C{SERVER}, the caller's span its parent), its
children, and the spans beside it linked to it; with the semantic
conventions' attributes and amp's own (C{amp.result}, C{amp.reason},
C{amp.endpoint}, C{amp.stamp}); a failure sets the span's status to error
with the reason.
"""

from __future__ import annotations

from typing import Any, Optional

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

from amp import __version__
from amp.tracing._spans import CLIENT, SERVER, ReviewSpans, SpanRecord

#: The instrumentation scope of every span amp makes.
SCOPE = InstrumentationScope("amp", __version__)
_KINDS = {CLIENT: SpanKind.CLIENT, SERVER: SpanKind.SERVER}
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


def _trace_state(raw: bytes) -> TraceState:
    if not raw:
        return TraceState()
    try:
        return TraceState.from_header([raw.decode("ascii")])
    except Exception:
        return TraceState()


def review_spans(
    spans: ReviewSpans,
    resource: Resource,
    end: float,
    attributes: dict[str, Any],
    error: Optional[str],
) -> list[ReadableSpan]:
    """
    The finished spans of one review that ended at C{end} with the review
    span's C{attributes}, failed with C{error} (its reason and message)
    or not.
    """
    state = _trace_state(spans.tracestate)
    trace_id = spans.trace_id
    review_context = SpanContext(trace_id, spans.span_id, False, _SAMPLED, state)
    parent = spans.parent
    parent_context = (
        SpanContext(parent.trace_id, parent.span_id, True, _SAMPLED if parent.sampled else TraceFlags(0), state)
        if parent is not None
        else None
    )
    write = spans.answer_write
    out: list[ReadableSpan] = []
    for record in spans.children:
        out.append(_child(record, trace_id, state, review_context, resource))
    if write is not None:
        out.append(
            ReadableSpan(
                "answer write",
                SpanContext(trace_id, spans.new_span_id(), False, _SAMPLED, state),
                parent=review_context,
                resource=resource,
                kind=SpanKind.INTERNAL,
                start_time=_ns(write[0]),
                end_time=_ns(write[1]),
                instrumentation_scope=SCOPE,
                status=Status(StatusCode.UNSET),
            )
        )
    out.append(
        ReadableSpan(
            "POST " + str(attributes.get("http.route", "/mutate")),
            review_context,
            parent=parent_context,
            resource=resource,
            attributes=attributes,
            kind=SpanKind.SERVER,
            start_time=_ns(spans.start),
            end_time=_ns(end),
            instrumentation_scope=SCOPE,
            status=Status(StatusCode.ERROR, error) if error else Status(StatusCode.UNSET),
        )
    )
    return out


def linked_span(spans: ReviewSpans, record: SpanRecord, resource: Resource) -> ReadableSpan:
    """A linked span that ended after the review's spans were made."""
    review = SpanContext(spans.trace_id, spans.span_id, False, _SAMPLED, _trace_state(spans.tracestate))
    return _child(record, spans.trace_id, review.trace_state, review, resource)


def _child(
    record: SpanRecord, trace_id: int, state: TraceState, review: SpanContext, resource: Resource
) -> ReadableSpan:
    status = Status(StatusCode.ERROR, record.error) if record.error else Status(StatusCode.UNSET)
    if record.linked:
        # A trace of its own, linked to the review's span: it never delayed the answer.
        context = SpanContext(record.trace_id, record.span_id, False, _SAMPLED)
        return ReadableSpan(
            record.name,
            context,
            parent=None,
            resource=resource,
            attributes=record.attributes,
            links=(Link(review),),
            kind=_KINDS.get(record.kind, SpanKind.INTERNAL),
            start_time=_ns(record.start),
            end_time=_ns(record.end),
            instrumentation_scope=SCOPE,
            status=status,
        )
    return ReadableSpan(
        record.name,
        SpanContext(trace_id, record.span_id, False, _SAMPLED, state),
        parent=review,
        resource=resource,
        attributes=record.attributes,
        kind=_KINDS.get(record.kind, SpanKind.INTERNAL),
        start_time=_ns(record.start),
        end_time=_ns(record.end),
        instrumentation_scope=SCOPE,
        status=status,
    )
