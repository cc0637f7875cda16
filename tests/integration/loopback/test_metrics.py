"""
Tests for amp's Prometheus metrics: an in-process amp on loopback answers
real AdmissionReviews over TLS from the example endpoints, and ``/metrics``
is scraped over plain HTTP from amp's own metrics listener, so what is
checked is what Prometheus would see.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.trial.unittest import TestCase

from amp import __version__
from amp.config import parse_config
from amp.metrics import BREAKER_STATE_VALUES, KIND_LIMIT, Metrics
from amp.service import namespace_source
from amp_dev.devcert import write_dev_tls
from tests.support.helpers import (
    WebhookClient,
    closed_port,
    decode_answer,
    make_config,
    namespace,
    pod,
    raw_config,
    review_bytes,
    start_amp,
    start_example,
)
from tests.support.prometheus import Scrape
from tests.support.waiting import wait_until

#: The metrics the operator documentation and alerts rely on, with their
#: Prometheus type and label names.
REQUIRED = {
    "amp_admission_requests": ("counter", {"kind", "operation", "result", "reason"}),
    "amp_admission_duration_seconds": ("histogram", set()),
    "amp_endpoint_requests": ("counter", {"endpoint", "outcome"}),
    "amp_endpoint_duration_seconds": ("histogram", {"endpoint"}),
    "amp_circuit_breaker_state": ("gauge", {"endpoint"}),
    "amp_namespace_cache_namespaces": ("gauge", set()),
    "amp_namespace_watch_restarts": ("counter", {"reason"}),
    "amp_tls_certificate_not_after_timestamp_seconds": ("gauge", set()),
    "amp_tls_reloads": ("counter", {"result"}),
}


POD = {"kind": "Pod", "operation": "CREATE"}


# ---------------------------------------------------------------- tests


class ScrapeTests(TestCase):
    """
    Real reviews in, ``/metrics`` out.
    """

    timeout = 30

    @inlineCallbacks
    def setUp(self) -> Any:
        self.example = yield start_example(reactor)
        self.addCleanup(self.example.stop)
        refused = yield closed_port(reactor)
        self.refused_origin = f"http://127.0.0.1:{refused}"
        self.origin = f"http://127.0.0.1:{self.example.port}"
        ex = self.example.url
        self.tls_dir = Path(tempfile.mkdtemp(prefix="amp-test-metrics-"))
        self.addCleanup(shutil.rmtree, self.tls_dir, True)
        self.tls = write_dev_tls(self.tls_dir, ["127.0.0.1"])
        raw = raw_config(
            {
                "patched": namespace(ex("/user-env")),
                "ignored": namespace(ex("/error")),
                "denied": namespace(ex("/deny")),
                "fail-closed": namespace(ex("/garbage"), failure_policy="Fail"),
                "opted-out": namespace(ex("/user-env"), enabled=False),
                "not-allowed": namespace("https://127.0.0.1:1/mutate"),
                "down": namespace(f"{self.refused_origin}/mutate"),
            },
            tls={"cert": str(self.tls["cert"]), "key": str(self.tls["key"])},
            endpoints={
                "overrides": [
                    {
                        "match": f"{self.refused_origin}/*",
                        "breaker": {"consecutive_failures": 1, "cooldown": "1m", "max_cooldown": "1m"},
                    }
                ]
            },
        )
        self.amp = yield start_amp(parse_config(raw), reactor, metrics_listener=True)
        self.addCleanup(self.amp.stop)
        self.client = WebhookClient(reactor, ca=self.tls["ca_cert"].read_bytes())
        self.addCleanup(self.client.close)

    @inlineCallbacks
    def admit(self, ns: str, obj: Any = None, **kwargs: Any) -> Any:
        response, body = yield self.client.post(
            self.amp.url(query="timeout=10s"), review_bytes(obj, namespace=ns, **kwargs)
        )
        self.assertEqual(response.code, 200, body)
        return decode_answer(body)["response"]

    @inlineCallbacks
    def scrape(self) -> Any:
        response, body = yield self.client.get(self.amp.metrics_url())
        self.assertEqual(response.code, 200)
        self.assertTrue(response.headers.getRawHeaders(b"content-type")[0].startswith(b"text/plain"))
        return Scrape(body.decode("utf-8"))

    @inlineCallbacks
    def test_every_documented_metric_is_exposed(self) -> Any:
        """
        The metrics the operator docs and alerts name are all on
        ``/metrics`` with their type, before any review.
        """
        found = (yield self.scrape()).families
        for name, (kind, _) in REQUIRED.items():
            self.assertIn(name, found, f"{name} is not exposed")
            self.assertEqual(found[name].type, kind, name)

    @inlineCallbacks
    def test_review_counters_move_by_result(self) -> Any:
        """
        Each review is counted once, under the result the API server got:
        patched, ignored (Ignore policy), denied (by the endpoint), failed
        (the Fail policy), skipped (namespace not enabled).
        """
        patched = yield self.admit("patched")
        self.assertIsNotNone(patched.get("_patch"))
        ignored = yield self.admit("ignored")
        self.assertTrue(ignored["allowed"])
        denied = yield self.admit("denied")
        self.assertFalse(denied["allowed"])
        fail_closed = yield self.admit("fail-closed")
        self.assertFalse(fail_closed["allowed"])
        yield self.admit("opted-out")
        yield self.admit("not-allowed")

        scrape = yield self.scrape()
        total = "amp_admission_requests_total"
        self.assertEqual(scrape.value(total, result="patched", reason="", **POD), 1)
        self.assertEqual(scrape.total(total, result="ignored", **POD), 2)
        self.assertEqual(scrape.value(total, result="denied", reason="endpoint-denied", **POD), 1)
        self.assertEqual(scrape.total(total, result="failed", **POD), 1)
        self.assertEqual(scrape.value(total, result="skipped", reason="", **POD), 1)
        self.assertEqual(scrape.total(total, result="allowed", **POD), 0)
        # The reason tells an operator which failure it was.
        self.assertNotIn("", scrape.by(total, "reason", result="ignored", **POD))
        self.assertIn("not-allowed", scrape.by(total, "reason", result="ignored", **POD))
        self.assertEqual(scrape.value("amp_admission_duration_seconds_count"), 6)
        self.assertEqual(scrape.value("amp_admission_duration_seconds_bucket", le="+Inf"), 6)
        self.assertGreater(scrape.value("amp_admission_duration_seconds_sum"), 0)

    @inlineCallbacks
    def debug_reviews(self, query: str = "") -> Any:
        url = f"http://127.0.0.1:{self.amp.metrics_port}/debug/reviews" + (f"?{query}" if query else "")
        response, body = yield self.client.get(url.encode("ascii"))
        return response, body

    @inlineCallbacks
    def test_debug_reviews_lists_recent_decisions(self) -> Any:
        """
        ``/debug/reviews`` on the metrics port lists each review's decision
        (recorded just after its answer is written) with the message the
        API server was told, filterable; never the Pod, its annotation
        values or its env.
        """
        secret_pod = pod(
            "web-1",
            annotations={"team.example/token": "s3cr3t-annotation"},
            containers=[{"name": "app", "image": "nginx", "env": [{"name": "PW", "value": "s3cr3t-env"}]}],
        )
        yield self.admit("patched", secret_pod, uid="uid-patched")
        ignored = yield self.admit("ignored", pod("web-2"), uid="uid-ignored")
        denied = yield self.admit("fail-closed", pod("web-3"), uid="uid-fail")
        yield wait_until(lambda: len(self.amp.service.recent) == 3, what="three decisions recorded")

        response, body = yield self.debug_reviews()
        self.assertEqual(response.code, 200)
        decisions = json.loads(body)
        self.assertEqual([d["uid"] for d in decisions], ["uid-patched", "uid-ignored", "uid-fail"])
        patched, ignored_d, failed = decisions
        self.assertEqual(
            set(patched), {"uid", "time", "namespace", "pod", "endpoint", "result", "reason", "message", "duration_ms"}
        )
        self.assertEqual(
            (patched["namespace"], patched["pod"], patched["endpoint"], patched["result"]),
            ("patched", "web-1", self.origin, "patched"),
        )
        self.assertRegex(patched["time"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
        self.assertGreater(patched["duration_ms"], 0)
        self.assertEqual(ignored_d["result"], "ignored")
        self.assertEqual(ignored_d["reason"], "http-5xx")
        # The message is the failure's full text, as in the audit annotation.
        self.assertEqual(ignored_d["message"], ignored["auditAnnotations"]["error"])
        self.assertEqual((failed["result"], failed["message"]), ("failed", denied["status"]["message"]))
        for leak in (b"s3cr3t", b"nginx", b"team.example/token", b"containers"):
            self.assertNotIn(leak, body)

        response, body = yield self.debug_reviews("namespace=ignored&format=jsonl")
        self.assertEqual([json.loads(line)["uid"] for line in body.splitlines()], ["uid-ignored"])
        response, body = yield self.debug_reviews("pod=web-3")
        self.assertEqual([d["uid"] for d in json.loads(body)], ["uid-fail"])
        response, body = yield self.debug_reviews("uid=uid-patched")
        self.assertEqual([d["uid"] for d in json.loads(body)], ["uid-patched"])

    @inlineCallbacks
    def test_debug_reviews_off_is_404_and_follows_a_reload(self) -> Any:
        """
        ``metrics.debug_reviews: 0`` turns the endpoint off (404); the size
        is reloadable.
        """
        config = self.amp.service.config
        self.amp.service.apply(
            dataclasses.replace(config, metrics=dataclasses.replace(config.metrics, debug_reviews=0))
        )
        yield self.admit("patched")
        response, body = yield self.debug_reviews()
        self.assertEqual(response.code, 404)
        self.assertIn(b"metrics.debug_reviews: 0", body)
        self.amp.service.apply(config)
        yield self.admit("patched", uid="after")
        yield wait_until(lambda: len(self.amp.service.recent) == 1, what="the decision recorded")
        response, body = yield self.debug_reviews()
        self.assertEqual([d["uid"] for d in json.loads(body)], ["after"])

    @inlineCallbacks
    def test_endpoint_counters_by_origin_and_outcome(self) -> Any:
        """
        Endpoint calls are counted by origin and outcome; a deny is an
        ``ok`` call (the endpoint answered), a 500 and a non-JSON body are
        named failures, and namespaces that never reach an endpoint (not
        enabled, not allowed) count no call.
        """
        for ns in ("patched", "denied", "ignored", "fail-closed", "opted-out", "not-allowed"):
            yield self.admit(ns)
        scrape = yield self.scrape()
        calls = "amp_endpoint_requests_total"
        self.assertEqual(scrape.value(calls, endpoint=self.origin, outcome="ok"), 2)
        self.assertEqual(scrape.value(calls, endpoint=self.origin, outcome="http-5xx"), 1)
        self.assertEqual(scrape.value(calls, endpoint=self.origin, outcome="invalid-json"), 1)
        self.assertEqual(scrape.value("amp_endpoint_duration_seconds_count", endpoint=self.origin), 4)
        endpoints = {
            dict(labels).get("endpoint") for (name, labels) in scrape.samples if name.startswith("amp_endpoint_")
        }
        self.assertEqual(endpoints, {self.origin}, "the endpoint label is the origin, never a path")

    @inlineCallbacks
    def test_breaker_opens_and_is_exposed(self) -> Any:
        """
        A refused connection trips a breaker set to open after one failure:
        the state gauge says open (2) and the next review does not call the
        endpoint at all (outcome breaker-open, no new latency sample).
        """
        first = yield self.admit("down")
        self.assertTrue(first["allowed"])
        second = yield self.admit("down")
        self.assertTrue(second["allowed"])
        self.assertIn("breaker-open", " ".join(second.get("warnings", [])))
        scrape = yield self.scrape()
        origin = self.refused_origin
        self.assertEqual(scrape.value("amp_circuit_breaker_state", endpoint=origin), BREAKER_STATE_VALUES["open"])
        calls = "amp_endpoint_requests_total"
        self.assertEqual(scrape.value(calls, endpoint=origin, outcome="connection-refused"), 1)
        self.assertEqual(scrape.value(calls, endpoint=origin, outcome="breaker-open"), 1)
        self.assertEqual(scrape.value("amp_endpoint_duration_seconds_count", endpoint=origin), 1)

    @inlineCallbacks
    def test_build_info_names_the_running_version(self) -> Any:
        """
        ``amp_build_info{version}`` is 1 for amp's version, and only it.
        """
        scrape = yield self.scrape()
        self.assertEqual(scrape.value("amp_build_info", version=__version__), 1)
        self.assertEqual(
            [dict(labels) for name, labels in scrape.samples if name == "amp_build_info"], [{"version": __version__}]
        )

    @inlineCallbacks
    def test_tls_expiry_and_reloads(self) -> Any:
        """
        The expiry gauge is the serving certificate's notAfter; a reload of
        a new certificate counts a success and moves the gauge, a broken key
        counts an error and leaves the gauge on the certificate in service.
        """

        def not_after(path: Path) -> float:
            return x509.load_pem_x509_certificate(path.read_bytes()).not_valid_after_utc.timestamp()

        scrape = yield self.scrape()
        expiry = "amp_tls_certificate_not_after_timestamp_seconds"
        self.assertEqual(scrape.value(expiry), not_after(self.tls["cert"]))
        self.assertEqual(scrape.value("amp_tls_reloads_total", result="success"), 0)
        self.assertEqual(scrape.value("amp_tls_reloads_total", result="error"), 0)

        write_dev_tls(self.tls_dir, ["127.0.0.1"], days=30)
        self.assertTrue(self.amp.service.certificate.reload())
        scrape = yield self.scrape()
        renewed = not_after(self.tls["cert"])
        self.assertLess(renewed, datetime.datetime.now(datetime.timezone.utc).timestamp() + 31 * 86400)
        self.assertEqual(scrape.value(expiry), renewed)
        self.assertEqual(scrape.value("amp_tls_reloads_total", result="success"), 1)

        self.tls["key"].write_bytes(b"-----BEGIN PRIVATE KEY-----\ntruncated\n")
        self.assertFalse(self.amp.service.certificate.reload())
        scrape = yield self.scrape()
        self.assertEqual(scrape.value("amp_tls_reloads_total", result="error"), 1)
        self.assertEqual(scrape.value(expiry), renewed)
        answer = yield self.admit("patched")
        self.assertTrue(answer["allowed"], "amp keeps serving with the certificate in service")


def test_metric_names_types_and_labels() -> None:
    """
    The registry defines every required metric with its type and exactly
    its label names (C{labels()} refuses any other set).
    """
    metrics = Metrics()
    collectors = {}
    for attr in vars(metrics).values():
        if hasattr(attr, "describe"):
            for family in attr.describe():
                collectors[family.name] = (family.type, attr)
    for name, (kind, labels) in REQUIRED.items():
        assert name in collectors, name
        found_kind, collector = collectors[name]
        assert found_kind == kind, name
        if labels:
            collector.labels(**{label: "x" for label in labels})
        else:
            with pytest.raises(ValueError):
                collector.labels("x")


def test_tls_reload_results_start_at_zero() -> None:
    metrics = Metrics()
    for result in ("success", "error"):
        assert metrics.registry.get_sample_value("amp_tls_reloads_total", {"result": result}) == 0


def test_static_namespace_count_is_exposed() -> None:
    """
    With C{kubernetes.source: static} the cache gauge is the number of
    configured namespaces.
    """
    config = make_config({"a": namespace("http://127.0.0.1:1/x"), "b": namespace(enabled=False), "c": namespace()})
    metrics = Metrics()
    namespace_source(config, reactor, metrics)
    assert metrics.registry.get_sample_value("amp_namespace_cache_namespaces") == 3


def test_review_kinds_and_operations_from_clients_cannot_grow_the_registry() -> None:
    """
    The request's kind and operation label amp_admission_requests_total; a
    client that sends a new kind with every review gets the first
    KIND_LIMIT kinds named and the rest counted as "other", and an
    operation outside the four Kubernetes has as "other": every review is
    still counted.
    """
    metrics = Metrics()
    for i in range(KIND_LIMIT + 50):
        metrics.count_review(f"Kind{i}", f"VERB{i % 3}" if i % 2 else "CREATE", "skipped", "", 0.001)
    metrics.count_review("Pod", "CREATE", "patched", "", 0.001)
    samples = [
        s
        for family in metrics.registry.collect()
        if family.name == "amp_admission_requests"
        for s in family.samples
        if s.name == "amp_admission_requests_total"
    ]
    kinds = {s.labels["kind"] for s in samples}
    assert len(kinds) <= KIND_LIMIT + 1 and "other" in kinds
    assert {s.labels["operation"] for s in samples} <= {"CREATE", "other"}
    assert sum(s.value for s in samples) == KIND_LIMIT + 51
    # Reviews of a kind named before the limit keep their own series.
    assert (
        metrics.registry.get_sample_value(
            "amp_admission_requests_total", {"kind": "Kind0", "operation": "CREATE", "result": "skipped", "reason": ""}
        )
        == 1
    )


@given(
    st.lists(
        st.sampled_from([0.0, 0.0005, 0.0007, 0.001, 0.003, 0.5, 1.0, 7.5, 30.0, 31.0, 1e6])
        | st.floats(min_value=0, max_value=100, allow_nan=False),
        max_size=30,
    ),
    st.sampled_from([(), ("https://a.example:443",)]),
)
@settings(max_examples=60, deadline=None)
def test_hot_metrics_expose_what_prometheus_client_would(observations: list[float], labels: tuple) -> None:
    """
    The review path's own counter and histogram (no lock, reactor thread
    only) scrape exactly as C{prometheus_client}'s would after the same
    counts and observations: buckets count values up to and including
    their bound, cumulatively, with the sum and the count.
    """
    from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

    from amp.metrics import LATENCY_BUCKETS, HotCounter, HotHistogram

    names = ["endpoint"] if labels else []
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    their_histogram = Histogram("x_seconds", "doc", names, buckets=LATENCY_BUCKETS, registry=theirs)
    our_histogram = HotHistogram("x_seconds", "doc", names, buckets=LATENCY_BUCKETS, registry=ours)
    their_counter = Counter("y", "doc", ["outcome"], registry=theirs)
    our_counter = HotCounter("y", "doc", ["outcome"], registry=ours)
    for value in observations:
        (their_histogram.labels(*labels) if labels else their_histogram).observe(value)
        (our_histogram.labels(*labels) if labels else our_histogram).observe(value)
        their_counter.labels(outcome="ok" if value < 1 else "timeout").inc()
        our_counter.labels("ok" if value < 1 else "timeout").inc()
    with_created = [line for line in generate_latest(theirs).decode().splitlines() if "_created" not in line]
    assert generate_latest(ours).decode().splitlines() == with_created
