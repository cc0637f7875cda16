"""
Tests for amp.tracing's exporter side (L{amp.tracing._export.Pipeline})
with the SDK's real C{BatchSpanProcessor} and exporters of the tests' own:
spans beyond C{tracing.queue} are dropped and counted, never waited for;
an export that fails is counted; each change is logged once; and the
spans made of a review's records carry its ids, times and status.

The exporter's thread reports through C{callFromThread}; here that is a
list the test runs on its own thread, so what the reactor would do is
checked without one.
"""

from __future__ import annotations

import random
import threading
from typing import Any, Callable, Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import SpanKind, StatusCode
from twisted.logger import globalLogPublisher
from twisted.trial.unittest import SynchronousTestCase

from amp.tracing import Exporting, Ids, ReviewSpans, parse_traceparent
from amp.tracing._emit import review_spans
from amp.tracing._export import Pipeline, make_resource

HEADER = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


class Threads:
    """callFromThread: calls kept until the test runs them (what the reactor thread would)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[tuple[Callable[..., Any], tuple]] = []

    def callFromThread(self, f: Callable[..., Any], *args: Any) -> None:  # noqa: N802 (the reactor's name)
        with self.lock:
            self.calls.append((f, args))

    def run(self) -> None:
        with self.lock:
            calls, self.calls = self.calls, []
        for f, args in calls:
            f(*args)


class Exporter(SpanExporter):
    def __init__(self, result: SpanExportResult = SpanExportResult.SUCCESS) -> None:
        self.result = result
        self.exported: list[ReadableSpan] = []
        #: Set to hold exports (a collector that is slow).
        self.gate = threading.Event()
        self.gate.set()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.gate.wait(10)
        self.exported.extend(spans)
        return self.result

    def shutdown(self) -> None:
        self.gate.set()


def made(count: int) -> list[ReadableSpan]:
    ids = Ids(random.Random(count))
    spans = ReviewSpans(ids, None, ids.trace_id(), 1.0)
    for i in range(count - 1):
        spans.step(f"step {i}", 1.0, 1.5)
    return review_spans(spans, make_resource(Exporting()), 2.0, {}, None)


class PipelineTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.threads = Threads()
        self.dropped: list[tuple[int, str]] = []
        self.events: list[dict] = []
        globalLogPublisher.addObserver(self.events.append)
        self.addCleanup(globalLogPublisher.removeObserver, self.events.append)

    def pipeline(self, exporter: Exporter, queue: int = 4) -> Pipeline:
        p = Pipeline(
            Exporting(queue=queue, batch=queue, interval=0.01, export_timeout=1.0),
            self.threads,
            lambda n, reason: self.dropped.append((n, reason)),
            exporter,
        )
        self.addCleanup(p._processor.shutdown)
        return p

    def warnings(self) -> list[str]:
        return [e["log_format"] for e in self.events if e.get("log_format", "").startswith(("Dropping", "Exporting"))]

    def test_spans_reach_the_exporter(self) -> None:
        exporter = Exporter()
        p = self.pipeline(exporter)
        p.submit(made(3))
        self.assertTrue(p._processor.force_flush(5000))
        self.threads.run()
        self.assertEqual(len(exporter.exported), 3)
        self.assertEqual((p.in_flight, self.dropped), (0, []))

    def test_beyond_the_queue_spans_are_dropped_and_counted_never_waited_for(self) -> None:
        exporter = Exporter()
        exporter.gate.clear()
        p = self.pipeline(exporter, queue=4)
        p.submit(made(3))
        p.submit(made(3))  # 6 > 4: dropped at once, whole
        p.submit(made(1))
        self.assertEqual(self.dropped, [(3, "queue_full")])
        self.assertEqual(p.in_flight, 4)
        p.submit(made(2))
        self.assertEqual(self.dropped, [(3, "queue_full"), (2, "queue_full")])
        # Logged once for the change, not per drop.
        self.assertEqual(len([w for w in self.warnings() if "tracing.queue" in w]), 1)
        exporter.gate.set()
        self.assertTrue(p._processor.force_flush(5000))
        self.threads.run()
        self.assertEqual(p.in_flight, 0)
        self.assertEqual(len(exporter.exported), 4)
        self.assertIn("Exporting spans again ({count} dropped meanwhile)", self.warnings())

    def test_a_failed_export_is_counted_and_logged_once(self) -> None:
        exporter = Exporter(SpanExportResult.FAILURE)
        p = self.pipeline(exporter, queue=16)
        for _ in range(3):
            p.submit(made(2))
            self.assertTrue(p._processor.force_flush(5000))
            self.threads.run()
        self.assertEqual(sum(n for n, reason in self.dropped if reason == "export_failed"), 6)
        self.assertEqual(len([w for w in self.warnings() if "export" in w and w.startswith("Dropping")]), 1)
        self.assertEqual(p.in_flight, 0)

    def test_after_shutdown_spans_are_dropped(self) -> None:
        p = self.pipeline(Exporter())
        p._closed = True
        p.submit(made(1))
        self.assertEqual(self.dropped, [(1, "queue_full")])


class EmitTests(SynchronousTestCase):
    def test_the_review_span_is_the_callers_child_and_the_parent_of_its_steps(self) -> None:
        parent = parse_traceparent(HEADER, b"k=v")
        spans = ReviewSpans(Ids(random.Random(2)), parent, parent.trace_id, 10.0)  # type: ignore[union-attr]
        spans.step("route", 10.001, 10.002)
        spans.call_started(10.002, {"url.full": "http://e:1/x"})
        spans.call_ended(10.010, "timeout: slow")
        spans.linked("record", 10.011, 10.012)
        spans.answer_write = (10.011, 10.0115)
        out = review_spans(spans, make_resource(Exporting()), 10.012, {"amp.result": "ignored"}, "timeout: slow")
        review = out[-1]
        self.assertEqual(review.kind, SpanKind.SERVER)
        self.assertEqual(review.parent.span_id, parent.span_id)  # type: ignore[union-attr]
        self.assertTrue(review.parent.is_remote)  # type: ignore[union-attr]
        self.assertEqual((review.start_time, review.end_time), (10_000_000_000, 10_012_000_000))
        self.assertEqual((review.status.status_code, review.status.description), (StatusCode.ERROR, "timeout: slow"))
        self.assertEqual(review.context.trace_state.to_header(), "k=v")
        route, call, record, write = out[:4]
        for child in (route, call, write):
            self.assertEqual(child.parent.span_id, review.context.span_id)  # type: ignore[union-attr]
            self.assertEqual(child.context.trace_id, parent.trace_id)  # type: ignore[union-attr]
        self.assertEqual(call.kind, SpanKind.CLIENT)
        self.assertEqual(call.status.status_code, StatusCode.ERROR)
        # The recording: a trace of its own, linked to the review.
        self.assertIsNone(record.parent)
        self.assertNotEqual(record.context.trace_id, parent.trace_id)  # type: ignore[union-attr]
        self.assertEqual([link.context.span_id for link in record.links], [review.context.span_id])

    def test_the_resource_names_amp_unless_the_environment_does(self) -> None:
        self.assertEqual(make_resource(Exporting(service_name="amp")).attributes["service.name"], "amp")
