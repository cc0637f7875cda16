"""
Spans out of amp (L{Pipeline}): the OpenTelemetry SDK's
C{BatchSpanProcessor} over an OTLP exporter (gRPC or HTTP/protobuf), which
exports in a thread of its own, never on the reactor's.

The queue is bounded twice: amp admits a span only while fewer than
C{tracing.queue} are waiting or being exported (counted on the reactor
thread: spans handed over, less spans whose export the exporter's thread
reported through C{callFromThread}), so the processor's own queue, of the
same size, never overflows unseen.  A span that finds the queue full, or
whose export fails (a collector that is down, slow past the export
timeout, or refusing), is dropped and counted
(C{amp_trace_spans_dropped_total}, by reason), and logged once per change:
when dropping begins, and when exports succeed again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from twisted.internet.defer import Deferred
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger
from twisted.python.threadpool import ThreadPool

from amp import __version__
from amp.tracing._settings import Exporting

if TYPE_CHECKING:
    from amp.reactors import IAmpReactor

log = Logger()

#: Why a span was dropped (the C{reason} label of amp_trace_spans_dropped_total).
QUEUE_FULL = "queue_full"
EXPORT_FAILED = "export_failed"


def make_exporter(exporting: Exporting) -> SpanExporter:
    """The SDK's OTLP exporter for C{exporting} (imported only when tracing is on)."""
    headers = dict(exporting.headers) if exporting.headers is not None else None
    timeout = exporting.export_timeout
    if exporting.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GRPCExporter

        return GRPCExporter(endpoint=exporting.endpoint, headers=headers, timeout=timeout)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HTTPExporter

    return HTTPExporter(endpoint=exporting.endpoint, headers=headers, timeout=timeout)


def make_resource(exporting: Exporting) -> Resource:
    """The resource of amp's spans: C{OTEL_RESOURCE_ATTRIBUTES} and C{OTEL_SERVICE_NAME} under the config's."""
    attributes: dict[str, Any] = {"service.version": __version__}
    if exporting.service_name is not None:
        attributes["service.name"] = exporting.service_name
    return Resource.create(attributes)


class _Reporting(SpanExporter):
    """
    The exporter, telling the reactor (through C{callFromThread}) how many
    spans each export took and whether it succeeded.  Runs in the
    processor's thread.
    """

    def __init__(
        self, inner: SpanExporter, report: Callable[[int, bool], None], call_from_thread: Callable[..., object]
    ) -> None:
        self._inner = inner
        self._report = report
        self._call = call_from_thread

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self._inner.export(spans)
        except Exception:
            result = SpanExportResult.FAILURE
        self._call(self._report, len(spans), result is SpanExportResult.SUCCESS)
        return result

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._inner.force_flush(timeout_millis)


class Pipeline:
    """
    One exporter and its processor, for one L{Exporting}.  Its methods run
    on the reactor thread but L{Pipeline.shutdown}'s wait.

    @param dropped: told C{(count, reason)} for spans dropped.
    @param exporter: the exporter (by default L{make_exporter}'s; tests).
    """

    def __init__(
        self,
        exporting: Exporting,
        reactor: IAmpReactor,
        dropped: Callable[[int, str], None],
        exporter: Optional[SpanExporter] = None,
    ) -> None:
        self.exporting = exporting
        self.resource = make_resource(exporting)
        self._reactor = reactor
        self._dropped = dropped
        #: Spans handed to the processor and not yet reported exported or failed.
        self.in_flight = 0
        #: The drop state last logged: None (exporting), or a reason.
        self._dropping: Optional[str] = None
        self._dropped_since = 0
        self._closed = False
        inner = exporter if exporter is not None else make_exporter(exporting)
        self._processor = BatchSpanProcessor(
            _Reporting(inner, self._exported, reactor.callFromThread),
            max_queue_size=exporting.queue,
            schedule_delay_millis=exporting.interval * 1000,
            max_export_batch_size=exporting.batch,
            export_timeout_millis=exporting.export_timeout * 1000,
        )

    def submit(self, spans: list[ReadableSpan]) -> None:
        """Hand C{spans} to the exporter's thread, or drop them (the queue is full, or the pipeline closed)."""
        count = len(spans)
        if self._closed or self.in_flight + count > self.exporting.queue:
            self._drop(count, QUEUE_FULL)
            return
        self.in_flight += count
        on_end = self._processor.on_end
        for span in spans:
            on_end(span)

    def _exported(self, count: int, ok: bool) -> None:
        """An export ended (told on the reactor thread)."""
        self.in_flight = max(0, self.in_flight - count)
        if not ok:
            self._drop(count, EXPORT_FAILED)
        elif self._dropping is not None:
            log.info("Exporting spans again ({count} dropped meanwhile)", count=self._dropped_since)
            self._dropping = None
            self._dropped_since = 0

    def _drop(self, count: int, reason: str) -> None:
        self._dropped(count, reason)
        self._dropped_since += count
        if self._dropping != reason:
            self._dropping = reason
            if reason == QUEUE_FULL:
                log.warn(
                    "Dropping spans: {queue} are waiting for the exporter already (tracing.queue); the "
                    "collector at {endpoint} is slow or down",
                    queue=self.exporting.queue,
                    endpoint=self.exporting.endpoint or "(OTEL_EXPORTER_OTLP_*ENDPOINT)",
                )
            else:
                log.warn(
                    "Dropping spans: an export to {endpoint} failed (counted in amp_trace_spans_dropped_total)",
                    endpoint=self.exporting.endpoint or "(OTEL_EXPORTER_OTLP_*ENDPOINT)",
                )

    def shutdown(self, threadpool: ThreadPool) -> Deferred[None]:
        """
        Stop taking spans; export what waits (within the export timeout)
        and stop the exporter, in C{threadpool}: never on the reactor thread.
        """
        self._closed = True
        return deferToThreadPool(self._reactor, threadpool, self._processor.shutdown)
