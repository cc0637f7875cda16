"""
OpenTelemetry traces of reviews: the caller's W3C trace context in
(C{traceparent}, C{tracestate}), passed on to every endpoint call, one span
per review with its steps as children, exported over OTLP (gRPC or
HTTP/protobuf) through the OpenTelemetry SDK in a thread of its own,
bounded, with dropped spans counted.  Off by default (C{tracing.enabled}).

The public names are here; the machinery is beside it: C{_context} (the
headers and the sampling decision, pure), C{_spans} (what a sampled review
records as it goes), C{_settings} (the config and the C{OTEL_*} variables,
pure), C{_emit} (records -> the SDK's spans, after the answer), C{_export}
(the exporter's thread and its bounded queue), C{_tracing} (the service:
on, off, reload).
"""

from amp.tracing._context import (
    MAX_TRACESTATE,
    Ids,
    Parent,
    Sampler,
    clean_tracestate,
    format_traceparent,
    parse_traceparent,
    sampled_by_ratio,
    trace_id_hex,
)
from amp.tracing._settings import Exporting, Settings, resolve
from amp.tracing._spans import CLIENT, INTERNAL, SERVER, ReviewSpans, SpanRecord
from amp.tracing._tracing import NO_TRACING, ReviewTracer, Tracing

__all__ = [
    "CLIENT",
    "INTERNAL",
    "MAX_TRACESTATE",
    "NO_TRACING",
    "SERVER",
    "Exporting",
    "Ids",
    "Parent",
    "ReviewSpans",
    "ReviewTracer",
    "Sampler",
    "Settings",
    "SpanRecord",
    "Tracing",
    "clean_tracestate",
    "format_traceparent",
    "parse_traceparent",
    "resolve",
    "sampled_by_ratio",
    "trace_id_hex",
]
