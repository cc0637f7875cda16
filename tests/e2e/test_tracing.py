"""One Pod's trace across the real API server, amp and an example endpoint.

The shared kube-apiserver exports its spans over OTLP gRPC to a receiver
in this process (``otlp_receiver``, on the official protocol definitions)
and traces the requests that come with a sampled ``traceparent`` from an
admin client; amp (``tracing`` on, OTLP gRPC) and an example endpoint
process (``amp_examples.tracing``, the SDK configured by ``OTEL_*``
variables) export to the same receiver.  For a Pod created with a sampled
``traceparent``, one trace holds the API server's webhook call, amp's
review span as its child, amp's endpoint call, and the endpoint's span as
that call's child; the trace id in amp's log line and ``/debug/reviews``
is that trace's.  With the receiver stopped, reviews are still answered
in time and amp counts the spans it drops.
"""

from __future__ import annotations

import json
import random
import time
import urllib.request
from pathlib import Path
from typing import Iterator, Optional

import pytest
from kubernetes import client

from ..support.otlp import GRPCReceiver, ReceivedSpan
from ..support.waiting import poll_until
from .amp_process import AmpInstance, ExampleEndpoints, free_port, pod_manifest, unique
from .cluster import ControlPlane
from .conftest import AmpFactory

pytestmark = pytest.mark.e2e

SERVER, CLIENT = 2, 3


@pytest.fixture(scope="module")
def traced_examples(
    otlp_receiver: GRPCReceiver, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ExampleEndpoints]:
    """The example endpoints in a process of their own that exports its spans to ``otlp_receiver``."""
    examples = ExampleEndpoints(tmp_path_factory.mktemp("traced-example"))
    examples.env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": otlp_receiver.endpoint,
        "OTEL_SERVICE_NAME": "amp-example",
        "OTEL_TRACES_SAMPLER": "parentbased_always_off",
    }
    try:
        examples.start_and_wait()
        yield examples
    finally:
        examples.stop()


@pytest.fixture(scope="module")
def amp(start_module_amp: AmpFactory, otlp_receiver: GRPCReceiver) -> AmpInstance:
    return start_module_amp(
        "tracing",
        overrides={
            "tracing": {
                "enabled": True,
                "endpoint": otlp_receiver.endpoint,
                "sampling_ratio": 0.0,
                "interval": "100ms",
                "export_timeout": "1s",
                "queue": 64,
                "batch": 32,
            },
            "metrics": {"port": free_port(), "debug_reviews": 64},
        },
    )


def traced_create(control_plane: ControlPlane, namespace: str, name: str) -> tuple[str, float]:
    """Create a Pod as an admin whose client sends a sampled ``traceparent``; its trace id and how long it took."""
    trace_id = "%032x" % random.getrandbits(128)
    header = f"00-{trace_id}-{'%016x' % random.getrandbits(64)}-01"
    core = client.CoreV1Api(control_plane.admin_client())
    started = time.monotonic()
    core.create_namespaced_pod(namespace, pod_manifest(name), _headers={"traceparent": header}, _preload_content=False)
    return trace_id, time.monotonic() - started


def tree(spans: list[ReceivedSpan]) -> dict[str, ReceivedSpan]:
    return {s.span_id: s for s in spans}


def ancestors(span: ReceivedSpan, by_id: dict[str, ReceivedSpan]) -> list[ReceivedSpan]:
    out = []
    while span.parent_span_id in by_id:
        span = by_id[span.parent_span_id]
        out.append(span)
    return out


def show(spans: list[ReceivedSpan]) -> str:
    """The trace as an indented tree (service: name, milliseconds), for failure messages and the docs."""
    by_id = tree(spans)
    lines = []

    def walk(parent: str, depth: int) -> None:
        for s in sorted((s for s in spans if s.parent_span_id == parent), key=lambda s: s.start):
            lines.append(f"{'  ' * depth}{s.service}: {s.name} ({(s.end - s.start) / 1e6:.1f} ms)")
            walk(s.span_id, depth + 1)

    for root in (s for s in spans if s.parent_span_id not in by_id):
        lines.append(f"{root.service}: {root.name} ({(root.end - root.start) / 1e6:.1f} ms)")
        walk(root.span_id, 1)
    return "\n".join(lines)


def test_one_trace_crosses_the_api_server_amp_and_the_endpoint(
    amp: AmpInstance,
    traced_examples: ExampleEndpoints,
    control_plane: ControlPlane,
    otlp_receiver: GRPCReceiver,
) -> None:
    ns = amp.namespace(unique("traced"), traced_examples.url("user-env"))
    trace_id, _ = traced_create(control_plane, ns, "traced")

    def complete() -> Optional[list[ReceivedSpan]]:
        spans = otlp_receiver.spans.of_trace(trace_id)
        services = {s.service for s in spans}
        return spans if {"amp", "amp-example", "apiserver"} <= services else None

    spans = poll_until(
        "the trace from all three programs",
        complete,
        20.0,
        details=lambda: show(otlp_receiver.spans.of_trace(trace_id)),
    )
    by_id = tree(spans)
    shown = show(spans)
    review = next(s for s in spans if s.service == "amp" and s.kind == SERVER)
    webhook_call = by_id.get(review.parent_span_id)
    assert webhook_call is not None and webhook_call.service == "apiserver", shown
    assert any(s.name == "Call mutating webhook" for s in [webhook_call, *ancestors(webhook_call, by_id)]), shown
    call = next(s for s in spans if s.service == "amp" and s.kind == CLIENT)
    assert call.parent_span_id == review.span_id, shown
    assert call.attributes["amp.endpoint"] == traced_examples.url("user-env"), shown
    endpoint = next(s for s in spans if s.service == "amp-example")
    assert endpoint.parent_span_id == call.span_id, shown
    assert review.attributes["k8s.namespace.name"] == ns
    assert review.attributes["amp.result"] == "patched"
    (Path(amp.workdir) / "trace.txt").write_text(shown + "\n")
    print(f"the trace of one Pod's creation:\n{shown}")

    # The trace id in amp's log line and /debug/reviews.
    poll_until("amp's log line naming the trace", lambda: f"trace={trace_id}" in amp.process.log_text(), 10.0)
    port = amp.process.config["metrics"]["port"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/debug/reviews?trace_id={trace_id}", timeout=5) as r:
        decisions = json.loads(r.read())
    assert [(d["namespace"], d["trace_id"]) for d in decisions] == [(ns, trace_id)]


def test_with_the_receiver_stopped_reviews_go_on_and_drops_are_counted(
    amp: AmpInstance,
    traced_examples: ExampleEndpoints,
    control_plane: ControlPlane,
    otlp_receiver: GRPCReceiver,
) -> None:
    ns = amp.namespace(unique("untraced"), traced_examples.url("user-env"))
    core = client.CoreV1Api(control_plane.admin_client())
    before = amp.process.metric("amp_trace_spans_dropped_total", reason="export_failed") or 0.0
    otlp_receiver.stop()
    try:
        for i in range(5):
            _, seconds = traced_create(control_plane, ns, f"pod-{i}")
            # Answered well within the webhook's timeout: no export is waited for.
            assert seconds < amp.webhook_timeout_seconds
            stored = json.loads(core.read_namespaced_pod(f"pod-{i}", ns, _preload_content=False).data)
            env = stored["spec"]["containers"][0].get("env") or []
            assert any(e.get("name") == "AMP_USER" for e in env), stored
        poll_until(
            "amp to count the spans it could not export",
            lambda: (amp.process.metric("amp_trace_spans_dropped_total", reason="export_failed") or 0) > before,
            15.0,
            details=amp.process.describe,
        )
        assert "Dropping spans" in amp.process.log_text()
    finally:
        otlp_receiver.start()
