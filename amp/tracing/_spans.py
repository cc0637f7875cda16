"""
The spans of one sampled review, as the review goes (L{ReviewSpans}): ids,
times from the review's clock and a few facts each, kept as plain records.
Nothing of the OpenTelemetry SDK is made while the review runs: the spans
are built from these records after the answer is written
(L{amp.tracing._emit}), off the review's path.

A review that is not sampled has no L{ReviewSpans} at all; its endpoint
calls carry the caller's C{traceparent} on, with its C{sampled} flag
cleared, so that an endpoint's SDK makes the same decision.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from amp.tracing._context import Ids, Parent, format_traceparent, trace_id_hex

#: The kinds of span (OpenTelemetry's C{SpanKind} names).
INTERNAL, SERVER, CLIENT = "internal", "server", "client"


class SpanRecord:
    """
    One child span of a review, recorded: name, kind, id, start and end
    (the review clock's seconds), attributes, and the error that ended it
    (its span status), if any.  C{linked}: a span of its own trace linked
    to the review's rather than its child (the canary's candidate).
    """

    __slots__ = ("name", "kind", "span_id", "start", "end", "attributes", "error", "linked", "trace_id")

    def __init__(
        self,
        name: str,
        kind: str,
        span_id: int,
        start: float,
        end: float,
        attributes: Optional[dict[str, Any]] = None,
        error: Optional[str] = None,
        linked: bool = False,
    ) -> None:
        self.name = name
        self.kind = kind
        self.span_id = span_id
        self.start = start
        self.end = end
        self.attributes = attributes if attributes is not None else {}
        self.error = error
        self.linked = linked
        #: A linked span's own trace (0: the review's).
        self.trace_id = 0


class ReviewSpans:
    """
    The review span and its children of one sampled review.

    @ivar trace_id: the trace (the caller's, or a new one).
    @ivar span_id: the review span's id.
    @ivar parent: the caller's span, when the review came with one.
    @ivar start: when the review arrived (the review clock's seconds).
    @ivar children: the child spans recorded so far, in order of their start.
    """

    __slots__ = (
        "trace_id",
        "span_id",
        "parent",
        "start",
        "children",
        "_ids",
        "_call",
        "answer_write",
        "trace_hex",
        "sampled",
        "stamp",
        "late",
    )

    def __init__(self, ids: Ids, parent: Optional[Parent], trace_id: int, start: float, sampled: bool = True) -> None:
        #: False: a review that is not sampled but whose caller sent a
        #: C{traceparent}: nothing is recorded, the context is passed on.
        self.sampled = sampled
        self._ids = ids
        self.parent = parent
        self.trace_id = trace_id
        self.trace_hex = trace_id_hex(trace_id)
        self.span_id = ids.span_id()
        self.start = start
        self.children: list[SpanRecord] = []
        #: The endpoint call in progress.
        self._call: Optional[SpanRecord] = None
        #: When the answer's write began and ended (set by the listener's handler).
        self.answer_write: Optional[tuple[float, float]] = None
        #: amp's status stamp for the Pod (C{""}: none).
        self.stamp = ""
        #: Once the review's spans are exported (L{amp.tracing.Tracing.finish}):
        #: where a linked span that ends later goes, on its own.
        self.late: Optional[Callable[[SpanRecord], None]] = None

    def step(
        self,
        name: str,
        start: float,
        end: float,
        attributes: Optional[dict[str, Any]] = None,
        error: Optional[str] = None,
    ) -> None:
        """A step of the review that began at C{start} and ended at C{end}."""
        self.children.append(SpanRecord(name, INTERNAL, self._ids.span_id(), start, end, attributes, error))

    def call_started(self, now: float, attributes: dict[str, Any]) -> bytes:
        """
        An endpoint call begins: its span is recorded, and the
        C{traceparent} header the call sends, naming it, is returned (not
        sampled: the caller's, its C{sampled} flag cleared).
        """
        if not self.sampled:
            parent = self.parent
            assert parent is not None
            return format_traceparent(parent.trace_id, parent.span_id, False)
        record = self._call = SpanRecord("POST", CLIENT, self._ids.span_id(), now, now, attributes)
        self.children.append(record)
        return format_traceparent(self.trace_id, record.span_id, True)

    def call_ended(self, now: float, error: Optional[str] = None, **attributes: Any) -> None:
        """The endpoint call in progress ended (C{error}: why it failed)."""
        record, self._call = self._call, None
        if record is None:
            return
        record.end = now
        record.error = error
        record.attributes.update(attributes)

    @property
    def tracestate(self) -> bytes:
        """The caller's C{tracestate}, passed on as it came."""
        return self.parent.tracestate if self.parent is not None else b""

    def linked(
        self,
        name: str,
        start: float,
        end: float,
        attributes: Optional[dict[str, Any]] = None,
        error: Optional[str] = None,
    ) -> None:
        """A span beside the review that never delayed it (the canary's candidate), linked to it."""
        record = self.begin_linked(name, start)
        self.end_linked(record, end, attributes, error)

    def begin_linked(self, name: str, start: float) -> SpanRecord:
        """
        A span beside the review, of a trace of its own, begun (its ids
        known: a call it makes can send them); L{end_linked} ends it.
        """
        record = SpanRecord(name, INTERNAL, self._ids.span_id(), start, start, linked=True)
        record.trace_id = self._ids.trace_id()
        return record

    def end_linked(
        self, record: SpanRecord, end: float, attributes: Optional[dict[str, Any]] = None, error: Optional[str] = None
    ) -> None:
        """The linked span C{record} ended: kept with the review's, or, once those left, exported alone."""
        record.end = end
        record.error = error
        if attributes:
            record.attributes.update(attributes)
        if self.late is not None:
            self.late(record)
        else:
            self.children.append(record)

    def new_span_id(self) -> int:
        """A span id for a span made from these records later (the answer's write)."""
        return self._ids.span_id()
