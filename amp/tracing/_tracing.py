"""
Tracing as amp runs it (L{Tracing}): on or off, reloaded with the config;
each review's sampling decision (L{Tracing.begin}) and, after the answer,
its spans made and handed to the exporter (L{Tracing.finish}).

Off (the default), the webhook's only cost is one attribute read per
review (L{Tracing.enabled}, or L{NO_TRACING}'s): no span, no record, no
allocation.  The OpenTelemetry SDK is imported only once tracing is first
turned on.
"""

from __future__ import annotations

import os
from functools import partial
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Protocol

from twisted.application.service import Service
from twisted.internet.defer import Deferred, DeferredList, succeed
from twisted.logger import Logger

from amp.config import TracingConfig
from amp.tracing._context import Ids, Sampler, parse_traceparent
from amp.tracing._settings import Settings, resolve
from amp.tracing._spans import ReviewSpans

if TYPE_CHECKING:
    from twisted.python.threadpool import ThreadPool

    from amp.reactors import IAmpReactor
    from amp.tracing._export import Pipeline


class ReviewTracer(Protocol):
    """What the webhook reads of tracing for each review: a L{Tracing}, or L{NO_TRACING}."""

    #: Reviews are traced: read once per review.
    enabled: bool

    def begin(self, traceparent: Optional[bytes], tracestate: Optional[bytes], now: float) -> Optional[ReviewSpans]:
        """A traced review's spans, begun at C{now} under the caller's context (or None: not sampled)."""

    def finish(self, spans: ReviewSpans, end: float, attributes: dict[str, Any], error: Optional[str]) -> None:
        """The review's spans ended at C{end}, with its attributes and error, and exported."""


class _Off:
    """Tracing that is off: what the webhook holds when amp has no L{Tracing}."""

    enabled = False

    def begin(self, traceparent: Optional[bytes], tracestate: Optional[bytes], now: float) -> None:
        return None

    def finish(self, spans: ReviewSpans, end: float, attributes: dict[str, Any], error: Optional[str]) -> None:
        return None


#: Tracing off: the webhook's default.
NO_TRACING = _Off()


class Tracing(Service):
    """
    OpenTelemetry tracing of reviews under the C{tracing} config section.

    @param dropped: told C{(count, reason)} for each span dropped (the
        metric C{amp_trace_spans_dropped_total}).
    @param environ: the environment (its C{OTEL_*} variables).
    @param exporter: makes the SDK exporter for an L{amp.tracing._settings.Exporting}
        (by default the OTLP exporter it names; tests give one of memory).
    @param threadpool: where the exporter is shut down (by default the reactor's).
    """

    log = Logger()

    def __init__(
        self,
        config: TracingConfig,
        reactor: IAmpReactor,
        dropped: Callable[[int, str], None],
        environ: Optional[Mapping[str, str]] = None,
        ids: Optional[Ids] = None,
        exporter: Optional[Callable[[Any], Any]] = None,
        threadpool: Optional[ThreadPool] = None,
    ) -> None:
        self._reactor = reactor
        self._dropped = dropped
        self._environ = environ if environ is not None else os.environ
        self._ids = ids if ids is not None else Ids()
        self._exporter = exporter
        self._threadpool = threadpool
        #: Reviews are traced (read once per review by the webhook).
        self.enabled = False
        self._sampler = Sampler(1.0)
        #: The exporter pipeline while on (L{amp.tracing._export.Pipeline}).
        self.pipeline: Optional[Pipeline] = None
        self._closing: list[Deferred[None]] = []
        self.settings: Optional[Settings] = None
        self.apply(config)

    def apply(self, config: TracingConfig) -> None:
        """
        Put C{config} in force: on or off, the sampler, and a new exporter
        when how spans are exported changed (the old one is shut down in a
        thread, exporting what it holds).
        """
        settings = resolve(config, self._environ)
        old = self.settings
        self.settings = settings
        if old is None or settings.problems != old.problems:
            for problem in settings.problems:
                self.log.warn("Tracing: {problem}", problem=problem)
        self._sampler = settings.sampler
        pipeline = self.pipeline
        if not settings.enabled:
            if pipeline is not None:
                self._retire(pipeline)
                self.pipeline = None
            if self.enabled:
                self.log.info("Tracing off")
            self.enabled = False
            return
        if pipeline is None or pipeline.exporting != settings.exporting:
            from amp.tracing._export import Pipeline

            exporter = self._exporter(settings.exporting) if self._exporter is not None else None
            self.pipeline = Pipeline(settings.exporting, self._reactor, self._dropped, exporter)
            if pipeline is not None:
                self._retire(pipeline)
        if not self.enabled or old is None or old.sampler != settings.sampler or pipeline is not self.pipeline:
            exporting = settings.exporting
            self.log.info(
                "Tracing on: OTLP {protocol} to {endpoint}, sampling {ratio:g} of the reviews amp starts{parent}",
                protocol=exporting.protocol,
                endpoint=exporting.endpoint or "(OTEL_EXPORTER_OTLP_*ENDPOINT or the SDK's default)",
                ratio=settings.sampler.ratio,
                parent=" (and as the caller's traceparent says)" if settings.sampler.parent_based else "",
            )
        self.enabled = True

    def _retire(self, pipeline: Pipeline) -> None:
        d = pipeline.shutdown(self._threadpool if self._threadpool is not None else self._reactor.getThreadPool())
        self._closing.append(d)

        def done(result: Any) -> None:
            self._closing.remove(d)
            if hasattr(result, "getTraceback"):
                self.log.failure("Tracing: the exporter did not shut down cleanly", result)

        d.addBoth(done)

    def begin(self, traceparent: Optional[bytes], tracestate: Optional[bytes], now: float) -> Optional[ReviewSpans]:
        """
        A review arrives at C{now} with these headers: its L{ReviewSpans}
        when it is sampled, a not-sampled one when its caller's context is
        to be passed on, or None.
        """
        parent = parse_traceparent(traceparent, tracestate) if traceparent else None
        trace_id = parent.trace_id if parent is not None else self._ids.trace_id()
        if self._sampler.decide(parent, trace_id):
            return ReviewSpans(self._ids, parent, trace_id, now)
        if parent is not None:
            return ReviewSpans(self._ids, parent, trace_id, now, sampled=False)
        return None

    def finish(self, spans: ReviewSpans, end: float, attributes: dict[str, Any], error: Optional[str]) -> None:
        """
        The review of C{spans} ended at C{end}: its spans made and handed to
        the exporter (after the answer, off the review's path).
        """
        pipeline = self.pipeline
        if pipeline is None or not spans.sampled:
            return
        from amp.tracing._emit import review_spans

        try:
            made = review_spans(spans, pipeline.resource, end, attributes, error)
        except Exception:
            self.log.failure("Tracing: could not make the spans of a review")
            return
        pipeline.submit(made)
        spans.late = partial(self._late, spans)

    def _late(self, spans: ReviewSpans, record: Any) -> None:
        """A linked span of a review whose spans were exported (the canary's candidate) ended."""
        pipeline = self.pipeline
        if pipeline is None:
            return
        from amp.tracing._emit import linked_span

        try:
            pipeline.submit([linked_span(spans, record, pipeline.resource)])
        except Exception:
            self.log.failure("Tracing: could not make a linked span")

    def stopService(self) -> Deferred[None]:
        """Shut the exporter down, exporting what it holds (within its export timeout)."""
        Service.stopService(self)
        if self.pipeline is not None:
            self._retire(self.pipeline)
            self.pipeline = None
        self.enabled = False
        if not self._closing:
            return succeed(None)
        return DeferredList(list(self._closing), consumeErrors=True).addCallback(lambda _: None)
