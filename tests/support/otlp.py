"""
OTLP trace receivers for the tests, on the official protocol definitions
(C{opentelemetry-proto}): over gRPC (L{GRPCReceiver}, grpcio's server in
its own threads: what the API server and amp's gRPC exporter send to) and
over HTTP/protobuf (L{http_receiver}, a twisted.web resource on the
reactor).  Both keep every span they receive as a L{ReceivedSpan}.
"""

from __future__ import annotations

import threading
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from twisted.web.resource import Resource


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind)


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as a collector received it (ids in hex, as they are written everywhere)."""

    service: str
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    attributes: dict[str, Any] = field(default_factory=dict)
    status_code: int = 0
    status_message: str = ""
    links: tuple[tuple[str, str], ...] = ()
    start: int = 0
    end: int = 0


def spans_of(request: Any) -> list[ReceivedSpan]:
    """The spans of one C{ExportTraceServiceRequest}."""
    out = []
    for rs in request.resource_spans:
        resource = {a.key: _value(a.value) for a in rs.resource.attributes}
        service = str(resource.get("service.name", ""))
        for ss in rs.scope_spans:
            for s in ss.spans:
                out.append(
                    ReceivedSpan(
                        service,
                        s.name,
                        s.trace_id.hex(),
                        s.span_id.hex(),
                        s.parent_span_id.hex(),
                        s.kind,
                        {a.key: _value(a.value) for a in s.attributes},
                        s.status.code,
                        s.status.message,
                        tuple((link.trace_id.hex(), link.span_id.hex()) for link in s.links),
                        s.start_time_unix_nano,
                        s.end_time_unix_nano,
                    )
                )
    return out


class Spans:
    """What a receiver has received (safe to read from any thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: list[ReceivedSpan] = []
        self.requests = 0

    def add(self, spans: Iterable[ReceivedSpan]) -> None:
        with self._lock:
            self._spans.extend(spans)
            self.requests += 1

    def all(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self._spans)

    def of_trace(self, trace_id: str) -> list[ReceivedSpan]:
        return [s for s in self.all() if s.trace_id == trace_id]

    def clear(self) -> None:
        with self._lock:
            self._spans.clear()


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, spans: Spans) -> None:
        self.spans = spans

    def Export(self, request: Any, context: Any) -> Any:  # noqa: N802 (the service's name)
        self.spans.add(spans_of(request))
        return trace_service_pb2.ExportTraceServiceResponse()


class GRPCReceiver:
    """
    An OTLP/gRPC trace receiver on C{127.0.0.1:port} (0: any free port).
    C{stop} stops it; C{start} again listens on the same port.
    """

    def __init__(self, port: int = 0) -> None:
        self.spans = Spans()
        self.port = port
        self._server: Optional[Any] = None

    def start(self) -> "GRPCReceiver":
        import grpc

        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceService(self.spans), server)
        self.port = server.add_insecure_port(f"127.0.0.1:{self.port}")
        server.start()
        self._server = server
        return self

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.stop(grace=None).wait(5)


class HTTPReceiver(Resource):
    """An OTLP/HTTP (protobuf) trace receiver: C{POST /v1/traces} under a twisted.web Site."""

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.spans = Spans()
        #: Answer every export with this status (500: a collector refusing).
        self.status = 200

    def render_POST(self, request: Any) -> bytes:
        if self.status != 200:
            request.setResponseCode(self.status)
            return b""
        message = trace_service_pb2.ExportTraceServiceRequest()
        message.ParseFromString(request.content.read())
        self.spans.add(spans_of(message))
        request.setHeader(b"content-type", b"application/x-protobuf")
        return trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
