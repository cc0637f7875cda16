"""
An endpoint continuing amp's trace: each request is a span whose parent is
amp's endpoint-call span, read from the ``traceparent`` (and
``tracestate``) header amp sends, exported over OTLP by the OpenTelemetry
SDK.

On only when the OpenTelemetry SDK and an OTLP exporter are installed
(``pip install ./examples[tracing]``) and ``OTEL_EXPORTER_OTLP_ENDPOINT``
(or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) is set; otherwise every
function here does nothing. ``OTEL_EXPORTER_OTLP_PROTOCOL`` chooses
``grpc`` (the default) or ``http/protobuf``; ``OTEL_SERVICE_NAME``,
``OTEL_RESOURCE_ATTRIBUTES`` and ``OTEL_TRACES_SAMPLER`` work as in any
SDK. What it takes, in short, is the three lines of ``start_span``.
"""

from __future__ import annotations

import os
from typing import Any, Optional

_tracer: Any = None
_tried = False


def tracer() -> Any:
    """The endpoint's tracer, set up once; None when tracing is not configured."""
    global _tracer, _tried
    if _tried:
        return _tracer
    _tried = True
    if not (os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")):
        return None
    if os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return None
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        protocol = os.environ.get(
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        )
        if protocol == "http/protobuf":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        else:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter  # type: ignore
    except ImportError:
        return None
    attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": "amp-example"}
    provider = TracerProvider(resource=Resource.create(attributes))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(), schedule_delay_millis=200))
    trace.set_tracer_provider(provider)
    _tracer = trace.get_tracer("amp_examples")
    return _tracer


def start_span(request: Any) -> Optional[Any]:
    """
    A span for this request (twisted.web), the child of the caller's span
    its ``traceparent`` names; None when tracing is off.
    """
    t = tracer()
    if t is None:
        return None
    from opentelemetry import propagate
    from opentelemetry.trace import SpanKind

    carrier = {
        name.decode("latin-1").lower(): values[0].decode("latin-1")
        for name, values in request.requestHeaders.getAllRawHeaders()
        if values
    }
    path = request.path.decode("latin-1")
    return t.start_span(
        f"POST {path}",
        context=propagate.extract(carrier),
        kind=SpanKind.SERVER,
        attributes={
            "http.request.method": "POST",
            "url.path": path,
            "http.route": path,
            "k8s.namespace.name": carrier.get("x-amp-namespace", ""),
        },
    )


def end_span(span: Optional[Any], status: int, result: str) -> None:
    """End the request's span with its status code and the endpoint's result."""
    if span is None:
        return
    span.set_attribute("http.response.status_code", status)
    span.set_attribute("amp.example.result", result)
    if status >= 500:
        from opentelemetry.trace import Status, StatusCode

        span.set_status(Status(StatusCode.ERROR, result))
    span.end()
