"""
One endpoint call over a loopback server (amp.endpoint): what goes on the
wire (the Pod and amp's headers; a URL that is not ASCII gets a named
failure, never an exception) and shadow mode through the Admitter, where the
endpoint is called and the Pod admitted unchanged.  The call's timer,
cancellation, bulkhead, breaker and retries on a Clock or a
MemoryReactorClock are in tests/unit/endpoint/test_endpoint_call.py.
"""

from __future__ import annotations

import json
from typing import Any, Optional

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.trial.unittest import TestCase
from twisted.web.server import Site

from amp.admission import Admitter
from amp.admission_review import parse_review
from amp.breaker import BreakerRegistry
from amp.config import BreakerConfig, EndpointSettings, parse_config
from amp.deadline import Deadline
from amp.endpoint import USER_AGENT, EndpointClient, EndpointFailure, EndpointRequest, deferred_call
from amp.metrics import Metrics
from amp.namespaces import StaticNamespaceSource
from amp.urls import EndpointURL
from tests.support.endpoint_harness import (
    Endpoint,
    FailureAssertions,
    LoopbackServer,
    RealHarness,
    requests_total,
    review_body,
)


class WireTests(TestCase, FailureAssertions):
    timeout = 15

    def setUp(self) -> None:
        self.resource = Endpoint()
        self.server = LoopbackServer.start(self, Site(self.resource))

    @inlineCallbacks
    def test_post_carries_the_pod_and_the_amp_headers(self) -> Any:
        h = RealHarness(self)
        yield h.call(self.server.url("/ok?x=1"), body=b'{"kind":"Pod"}')
        path, headers, body = self.resource.seen[0]
        self.assertEqual(path, b"/ok")
        self.assertEqual(body, b'{"kind":"Pod"}')
        self.assertEqual(headers.getRawHeaders(b"content-type"), [b"application/json"])
        self.assertEqual(headers.getRawHeaders(b"user-agent"), [USER_AGENT])
        self.assertEqual(headers.getRawHeaders(b"x-amp-namespace"), [b"team"])
        self.assertEqual(headers.getRawHeaders(b"x-amp-uid"), [b"u-1"])
        self.assertEqual(headers.getRawHeaders(b"host"), [f"127.0.0.1:{self.server.port.getHost().port}".encode()])

    @inlineCallbacks
    def test_non_ascii_url_never_escapes_as_an_exception(self) -> Any:
        # parse_endpoint_url refuses non-ASCII; a URL built some other way
        # still gets a named failure or a percent-encoded path, never an
        # exception that would strand its breaker ticket.
        h = RealHarness(self, EndpointSettings(breaker=BreakerConfig(half_open_requests=1)))
        port = self.server.port.getHost().port
        path = EndpointURL(f"http://127.0.0.1:{port}/caf\u00e9", "http", "127.0.0.1", port, "/caf\u00e9")
        host = EndpointURL(f"http://caf\u00e9:{port}/ok", "http", "caf\u00e9", port, "/ok")
        with self.assertRaises(EndpointFailure) as e:
            yield deferred_call(
                h.client, EndpointRequest(path, h.settings, b"{}", {}, Deadline.after(reactor.seconds(), 5.0))
            )
        self.assertEqual(e.exception.reason, "http-4xx")
        self.assertEqual(self.resource.seen[0][0], b"/caf%C3%A9")
        with self.assertRaises(EndpointFailure) as e:
            yield deferred_call(
                h.client, EndpointRequest(host, h.settings, b"{}", {}, Deadline.after(reactor.seconds(), 5.0))
            )
        self.assertEqual(e.exception.reason, "connection-failed")
        self.assertEqual(h.client.in_flight(path.origin), 0)
        self.assertEqual(h.client.in_flight(host.origin), 0)


class ShadowModeTests(TestCase):
    timeout = 15

    def setUp(self) -> None:
        self.resource = Endpoint()
        self.server = LoopbackServer.start(self, Site(self.resource))

    def admitter(self, path: str, mode: Optional[str] = "shadow") -> tuple[Admitter, Metrics]:
        annotations = {"amp.txn2.com/ep": self.server.url(path), "amp.txn2.com/failure-policy": "Fail"}
        if mode:
            annotations["amp.txn2.com/mode"] = mode
        config = parse_config(
            {
                "failure_policy": "Fail",
                "kubernetes": {
                    "source": "static",
                    "namespaces": {"team": {"labels": {"amp.txn2.com/enabled": "true"}, "annotations": annotations}},
                },
                "endpoints": {"allow": ["http://127.0.0.1:*/*"], "timeout": "2s"},
            }
        )
        metrics = Metrics()
        client = EndpointClient(reactor, metrics, BreakerRegistry(reactor))
        self.addCleanup(client.close)
        return Admitter(config, StaticNamespaceSource(config.kubernetes), client, reactor, metrics), metrics

    @inlineCallbacks
    def review(self, admitter: Admitter) -> Any:
        answer, outcome = yield admitter.review(parse_review(review_body()), Deadline.after(reactor.seconds(), 5.0))
        return json.loads(answer)["response"], outcome

    @inlineCallbacks
    def test_shadow_calls_the_endpoint_and_admits_unchanged(self) -> Any:
        admitter, metrics = self.admitter("/ok")
        response, outcome = yield self.review(admitter)
        self.assertEqual(self.resource.hits[b"/ok"], 1)
        self.assertTrue(response["allowed"])
        self.assertNotIn("patch", response)
        self.assertEqual(outcome.result, "shadow")
        self.assertGreater(outcome.shadow_patch_size, 0)
        self.assertEqual(
            metrics.registry.get_sample_value(
                "amp_shadow_patches_total", {"endpoint": self.server.url("").rstrip("/")}
            ),
            1,
        )

    @inlineCallbacks
    def test_the_same_namespace_without_shadow_gets_the_patch(self) -> Any:
        admitter, _ = self.admitter("/ok", mode=None)
        response, outcome = yield self.review(admitter)
        self.assertTrue(response["allowed"])
        self.assertIn("patch", response)
        self.assertEqual(outcome.result, "patched")

    @inlineCallbacks
    def test_failing_endpoint_in_shadow_mode_never_denies(self) -> Any:
        admitter, metrics = self.admitter("/status/500")
        response, outcome = yield self.review(admitter)
        self.assertTrue(response["allowed"])
        self.assertNotIn("patch", response)
        self.assertEqual(outcome.reason, "http-5xx")
        self.assertEqual(requests_total(metrics, self.server.url("").rstrip("/"), "http-5xx"), 1)

    @inlineCallbacks
    def test_failing_endpoint_outside_shadow_mode_denies(self) -> Any:
        admitter, _ = self.admitter("/status/500", mode=None)
        response, _ = yield self.review(admitter)
        self.assertFalse(response["allowed"])
        self.assertIn("http-5xx", response["status"]["message"])
