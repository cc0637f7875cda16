"""
Tests for amp's traces over loopback: amp in-process with tracing on,
exporting over OTLP HTTP/protobuf (the real SDK exporter) to a receiver of
the tests' on the official protocol definitions (L{tests.support.otlp}), an
endpoint that records the headers amp sends.  A review that comes with a
C{traceparent} continues its trace; the endpoint is sent the call span's;
the trace id is in the log line, C{/debug/reviews} and the latency
histogram's exemplar (OpenMetrics); failures set the error status; reload
turns tracing on and off; and with tracing off nothing is sent or made.
"""

from __future__ import annotations

import json
from typing import Any

from prometheus_client.openmetrics.parser import text_string_to_metric_families
from twisted.application.service import Service
from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.internet.endpoints import TCP4ServerEndpoint
from twisted.logger import globalLogPublisher
from twisted.trial.unittest import TestCase
from twisted.web.resource import Resource
from twisted.web.server import Site

from amp.config import parse_config
from amp.namespaces import NamespaceInfo
from tests.support.helpers import (
    ENABLED_LABEL,
    EP_ANNOTATION,
    UID,
    FakeSource,
    WebhookClient,
    closed_port,
    decode_answer,
    namespace,
    raw_config,
    review_bytes,
    start_amp,
)
from tests.support.otlp import HTTPReceiver
from tests.support.waiting import wait_until

TRACE = "0af7651916cd43dd8448eb211c80319c"
SPAN = "b7ad6b7169203331"
SERVER, CLIENT = 2, 3
ERROR = 2


class HeaderEndpoint(Resource):
    """An endpoint that annotates the Pod and keeps the headers of every call."""

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[dict[str, str]] = []

    def render_POST(self, request: Any) -> bytes:
        self.calls.append({k.decode().lower(): v[0].decode() for k, v in request.requestHeaders.getAllRawHeaders()})
        request.setHeader(b"content-type", b"application/json")
        return b'[{"op":"add","path":"/metadata/annotations/traced","value":"yes"}]'


class ServiceSource(FakeSource, Service):
    """L{FakeSource} as amp's service holds its namespace source: a child service."""


class TracingTests(TestCase):
    timeout = 20

    @inlineCallbacks
    def setUp(self) -> Any:
        root = Resource()
        self.collector = HTTPReceiver()
        self.endpoint = HeaderEndpoint()
        root.putChild(b"v1", Resource())
        root.children[b"v1"].putChild(b"traces", self.collector)
        root.putChild(b"mutate", self.endpoint)
        self.candidate = HeaderEndpoint()
        root.putChild(b"candidate", self.candidate)
        site = Site(root)
        site.log = lambda request: None  # type: ignore[method-assign]
        port = yield TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(site)
        self.addCleanup(port.stopListening)
        self.port = port.getHost().port
        self.refused = yield closed_port(reactor)
        self.events: list[dict] = []
        globalLogPublisher.addObserver(self.events.append)
        self.addCleanup(globalLogPublisher.removeObserver, self.events.append)

    def raw(self, **tracing: Any) -> dict[str, Any]:
        settings = {
            "enabled": True,
            "protocol": "http/protobuf",
            "interval": "20ms",
            "endpoint": f"http://127.0.0.1:{self.port}/v1/traces",
            **tracing,
        }
        return raw_config(
            {
                "team-a": namespace(f"http://127.0.0.1:{self.port}/mutate?token=s3cret"),
                "refused": namespace(f"http://127.0.0.1:{self.refused}/mutate"),
                "canaried": namespace(
                    f"http://127.0.0.1:{self.port}/mutate",
                    annotations={"amp.txn2.com/canary": f"http://127.0.0.1:{self.port}/candidate"},
                ),
            },
            tracing=settings,
            metrics={"debug_reviews": 16},
        )

    @inlineCallbacks
    def start(self, **tracing: Any) -> Any:
        amp = yield start_amp(parse_config(self.raw(**tracing)), reactor, metrics_listener=True)
        self.addCleanup(amp.stop)
        self.client = WebhookClient(reactor)
        self.addCleanup(self.client.close)
        return amp

    @inlineCallbacks
    def post(self, amp: Any, namespace: str = "team-a", traceparent: str = "", tracestate: str = "") -> Any:
        headers = {}
        if traceparent:
            headers[b"traceparent"] = [traceparent.encode()]
        if tracestate:
            headers[b"tracestate"] = [tracestate.encode()]
        response, body = yield self.client.post(
            amp.url("/mutate", "timeout=10s"), review_bytes(namespace=namespace), headers=headers
        )
        self.assertEqual(response.code, 200)
        return decode_answer(body)

    def trace_of(self, trace_id: str, names: int) -> Any:
        return wait_until(
            lambda: len(self.collector.spans.of_trace(trace_id)) >= names and self.collector.spans.of_trace(trace_id),
            timeout=10,
            what=f"{names} spans of {trace_id}",
            details=lambda: (
                f"received: {self.collector.spans.all()}, requests "
                f"{self.collector.spans.requests}; log: "
                f"{[e.get('log_format') for e in self.events][-8:]}"
            ),
        )

    @inlineCallbacks
    def test_a_review_continues_its_callers_trace_and_passes_it_to_the_endpoint(self) -> Any:
        amp = yield self.start()
        yield self.post(amp, traceparent=f"00-{TRACE}-{SPAN}-01", tracestate="vendor=x")
        spans = yield self.trace_of(TRACE, 5)
        by_name = {s.name: s for s in spans}
        review = by_name["POST /mutate"]
        self.assertEqual((review.kind, review.parent_span_id, review.service), (SERVER, SPAN, "amp"))
        self.assertEqual(review.attributes["k8s.namespace.name"], "team-a")
        self.assertEqual(review.attributes["k8s.pod.name"], "web")
        self.assertEqual(review.attributes["amp.result"], "patched")
        self.assertEqual(review.attributes["amp.review.uid"], UID)
        self.assertTrue(review.attributes["amp.stamp"].startswith("mutated"), review.attributes)
        self.assertEqual(review.attributes["http.response.status_code"], 200)
        call = by_name["POST"]
        self.assertEqual((call.kind, call.parent_span_id), (CLIENT, review.span_id))
        shown = f"http://127.0.0.1:{self.port}/mutate"
        # amp shows URLs its one way: never the query, where tokens travel.
        self.assertEqual((call.attributes["url.full"], call.attributes["amp.endpoint"]), (shown, shown))
        self.assertEqual(call.attributes["amp.connection"], "new")
        self.assertEqual(call.attributes["amp.breaker.state"], "closed")
        self.assertNotIn("s3cret", json.dumps([s.attributes for s in spans]))
        for name in ("route", "patch check", "answer write"):
            self.assertEqual(by_name[name].parent_span_id, review.span_id, name)
        self.assertLessEqual(review.start, call.start)
        self.assertLessEqual(call.end, review.end)
        # The endpoint got the call span as its parent, and the caller's tracestate.
        sent = self.endpoint.calls[-1]
        self.assertEqual(sent["traceparent"], f"00-{TRACE}-{call.span_id}-01")
        self.assertEqual(sent["tracestate"], "vendor=x")
        # The trace id everywhere a person looks.
        yield wait_until(lambda: any(e.get("trace_id") == TRACE for e in self.events), what="the log line")
        line = next(e for e in self.events if e.get("trace_id") == TRACE)
        self.assertIn(f"trace={TRACE}", line["log_format"].format(**line))
        response, body = yield self.client.get(
            f"http://127.0.0.1:{amp.metrics_port}/debug/reviews?trace_id={TRACE}".encode()
        )
        self.assertEqual([d["uid"] for d in json.loads(body)], [UID])

    @inlineCallbacks
    def test_the_latency_histogram_has_the_trace_as_exemplar_in_openmetrics(self) -> Any:
        amp = yield self.start()
        yield self.post(amp, traceparent=f"00-{TRACE}-{SPAN}-01")
        yield self.trace_of(TRACE, 1)
        response = yield self.client.http.get(
            amp.metrics_url(), headers={b"accept": [b"application/openmetrics-text; version=1.0.0"]}
        )
        import treq

        text = (yield treq.content(response)).decode()
        self.assertTrue(response.headers.getRawHeaders(b"content-type")[0].startswith(b"application/openmetrics-text"))
        families = {f.name: f for f in text_string_to_metric_families(text)}
        exemplars = [s.exemplar for s in families["amp_admission_duration_seconds"].samples if s.exemplar]
        self.assertEqual([e.labels for e in exemplars], [{"trace_id": TRACE}])
        # The plain text format still parses for scrapers that do not ask for OpenMetrics.
        response, plain = yield self.client.get(amp.metrics_url())
        self.assertIn(b"amp_admission_duration_seconds_bucket", plain)
        self.assertNotIn(TRACE.encode(), plain)

    @inlineCallbacks
    def test_the_canarys_candidate_is_a_span_of_its_own_trace_linked_to_the_review(self) -> Any:
        amp = yield self.start()
        yield self.post(amp, "canaried", traceparent=f"00-{TRACE}-{SPAN}-01")
        spans = yield self.trace_of(TRACE, 4)
        review = next(s for s in spans if s.kind == SERVER)
        yield wait_until(lambda: any(s.name == "canary" for s in self.collector.spans.all()), what="the canary span")
        canary = next(s for s in self.collector.spans.all() if s.name == "canary")
        self.assertNotEqual(canary.trace_id, TRACE)
        self.assertEqual(canary.links, ((TRACE, review.span_id),))
        self.assertEqual(canary.attributes["amp.endpoint"], f"http://127.0.0.1:{self.port}/candidate")
        # The candidate was sent the canary span's context, not the live call's.
        self.assertEqual(self.candidate.calls[-1]["traceparent"], f"00-{canary.trace_id}-{canary.span_id}-01")

    @inlineCallbacks
    def test_a_namespace_the_cache_does_not_know_is_a_lookup_span(self) -> Any:
        source = ServiceSource()
        amp = yield start_amp(parse_config(self.raw()), reactor, namespaces=source)
        self.addCleanup(amp.stop)
        self.client = WebhookClient(reactor)
        self.addCleanup(self.client.close)
        answered = self.post(amp, "fresh", traceparent=f"00-{TRACE}-{SPAN}-01")
        yield wait_until(lambda: source.fetches, what="the namespace's GET")
        name, _, fetched = source.fetches[0]
        fetched.callback(
            NamespaceInfo(name, {ENABLED_LABEL: "true"}, {EP_ANNOTATION: f"http://127.0.0.1:{self.port}/mutate"})
        )
        yield answered
        spans = yield self.trace_of(TRACE, 6)
        review = next(s for s in spans if s.kind == SERVER)
        lookup = next(s for s in spans if s.name == "namespace lookup")
        self.assertEqual(lookup.parent_span_id, review.span_id)
        self.assertEqual(lookup.attributes, {"k8s.namespace.name": "fresh", "amp.namespace.found": True})
        self.assertLessEqual(lookup.end, next(s for s in spans if s.name == "route").start)

    @inlineCallbacks
    def test_a_review_without_traceparent_starts_a_trace_at_the_ratio(self) -> Any:
        amp = yield self.start(sampling_ratio=1.0)
        yield self.post(amp)
        sent = self.endpoint.calls[-1]["traceparent"]
        trace_id = sent.split("-")[1]
        spans = yield self.trace_of(trace_id, 3)
        review = next(s for s in spans if s.kind == SERVER)
        self.assertEqual(review.parent_span_id, "")

    @inlineCallbacks
    def test_an_unsampled_caller_is_passed_on_unsampled_and_nothing_is_exported(self) -> Any:
        amp = yield self.start(sampling_ratio=1.0)
        yield self.post(amp, traceparent=f"00-{TRACE}-{SPAN}-00")
        self.assertEqual(self.endpoint.calls[-1]["traceparent"], f"00-{TRACE}-{SPAN}-00")
        # A sampled review after it is exported; the unsampled one never is.
        other = "1" * 32
        yield self.post(amp, traceparent=f"00-{other}-{SPAN}-01")
        yield self.trace_of(other, 3)
        self.assertEqual(self.collector.spans.of_trace(TRACE), [])

    @inlineCallbacks
    def test_a_failed_call_sets_the_error_status_with_the_reason(self) -> Any:
        amp = yield self.start()
        yield self.post(amp, "refused", traceparent=f"00-{TRACE}-{SPAN}-01")
        spans = yield self.trace_of(TRACE, 2)
        call = next(s for s in spans if s.kind == CLIENT)
        self.assertEqual(call.status_code, ERROR)
        self.assertTrue(call.status_message.startswith("connection-refused"), call.status_message)
        self.assertEqual(call.attributes["error.type"], "connection-refused")
        review = next(s for s in spans if s.kind == SERVER)
        self.assertEqual(
            (review.attributes["amp.result"], review.attributes["amp.reason"]), ("ignored", "connection-refused")
        )
        self.assertEqual(review.status_code, ERROR)

    @inlineCallbacks
    def test_reload_turns_tracing_on_and_off(self) -> Any:
        amp = yield self.start(enabled=False)
        yield self.post(amp, traceparent=f"00-{TRACE}-{SPAN}-01")
        # Off: no traceparent to the endpoint, no span.
        self.assertNotIn("traceparent", self.endpoint.calls[-1])
        self.assertIsNone(amp.service.tracing.pipeline)
        amp.service.apply(parse_config(self.raw(enabled=True)))
        yield self.post(amp, traceparent=f"00-{TRACE}-{SPAN}-01")
        self.assertIn("traceparent", self.endpoint.calls[-1])
        yield self.trace_of(TRACE, 3)
        amp.service.apply(parse_config(self.raw(enabled=False)))
        self.assertFalse(amp.service.tracing.enabled)
        yield self.post(amp, traceparent=f"00-{'2' * 32}-{SPAN}-01")
        self.assertNotIn("traceparent", self.endpoint.calls[-1])

    @inlineCallbacks
    def test_off_a_review_never_asks_tracing_anything(self) -> Any:
        """Off, the webhook reads one attribute: no sampling decision, no record, no span."""
        amp = yield self.start(enabled=False)
        tracing = amp.service.tracing

        def asked(*args: Any) -> None:
            raise AssertionError("tracing was asked about a review while off")

        tracing.begin = tracing.finish = asked
        answer = yield self.post(amp, traceparent=f"00-{TRACE}-{SPAN}-01")
        self.assertTrue(answer["response"]["allowed"])
        self.assertNotIn("traceparent", self.endpoint.calls[-1])
        yield wait_until(lambda: any(e.get("uid") == UID for e in self.events), what="the log line")
        self.assertFalse(any("trace_id" in e for e in self.events))

    @inlineCallbacks
    def test_reload_changes_the_ratio_without_a_new_exporter(self) -> Any:
        amp = yield self.start(sampling_ratio=1.0)
        pipeline = amp.service.tracing.pipeline
        amp.service.apply(parse_config(self.raw(sampling_ratio=0.0)))
        self.assertIs(amp.service.tracing.pipeline, pipeline)
        yield self.post(amp)
        self.assertNotIn("traceparent", self.endpoint.calls[-1])
