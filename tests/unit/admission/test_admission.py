"""
Tests for amp.admission: one review end to end, without a reactor.

The Admitter runs on a L{Clock}; its EndpointClient talks to the example
endpoints (L{amp_examples.server.build_root}) in memory, through a
L{ResourceConnector} (amp's own connections, wired to twisted.web), plus a few tiny resources under
C{/test/...} that answer exactly what a test needs.  Every failure is checked
under both failure policies, with the C{amp.txn2.com/status} stamp, whose
patch must apply to the Pod whatever the endpoint did.
"""

from __future__ import annotations

import json
from typing import Any, Optional

from twisted.internet.defer import CancelledError, Deferred, fail
from twisted.internet.task import Clock
from twisted.logger import LogLevel, capturedLogs, formatEvent
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET
from zope.interface import implementer

from amp.admission import LEGACY_SKIPPED_ANNOTATION, STATUS_ANNOTATION, Admitter, Outcome
from amp.admission_review import parse_review
from amp.breaker import BreakerRegistry
from amp.config import Config
from amp.deadline import Deadline
from amp.endpoint import EndpointClient
from amp.metrics import Metrics
from amp.namespaces import INamespaceSource, NamespaceInfo, NamespaceLookupError, StaticNamespaceSource
from amp_examples.server import build_root
from tests.support.endpoint_harness import ResourceConnector
from tests.support.helpers import (
    UID,
    V1BETA1,
    FakeSource,
    apply_patch,
    decode_answer,
    make_config,
    namespace,
    pod,
    review_bytes,
)

EP = "http://127.0.0.1:8090"
ORIGIN = "http://127.0.0.1:8090"


class Canned(Resource):
    """
    Answers every POST with C{code} and C{body}; records each request's
    headers and body.  C{hang=True} never answers.
    """

    isLeaf = True

    def __init__(self, body: Any = b"[]", code: int = 200, hang: bool = False) -> None:
        super().__init__()
        self.body = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.code = code
        self.hang = hang
        self.requests: list[tuple[dict[bytes, bytes], bytes]] = []

    def render_POST(self, request: Any) -> Any:
        headers = {k.lower(): v[0] for k, v in request.requestHeaders.getAllRawHeaders()}
        self.requests.append((headers, request.content.read()))
        if self.hang:
            return NOT_DONE_YET
        request.setResponseCode(self.code)
        request.setHeader(b"content-type", b"application/json")
        return self.body


def ns_map(**entries: dict) -> dict:
    return {name.replace("_", "-"): spec for name, spec in entries.items()}


class Harness:
    """An Admitter over the example endpoints (plus /test/<name> resources) on a Clock."""

    def __init__(self, config: Config, source: Optional[INamespaceSource] = None, **canned: Canned) -> None:
        self.clock = Clock()
        self.metrics = Metrics()
        root = build_root()
        test = Resource()
        root.putChild(b"test", test)
        for name, resource in canned.items():
            test.putChild(name.encode(), resource)
        self.root = root
        self.connector = ResourceConnector(root)
        self.config = config
        self.client = EndpointClient(self.clock, self.metrics, BreakerRegistry(self.clock), connector=self.connector)
        self.source = source if source is not None else StaticNamespaceSource(config.kubernetes)
        self.admitter = Admitter(config, self.source, self.client, self.clock, self.metrics)

    def review(self, body: bytes, budget: float = 9.5, validation: bool = False) -> Deferred:
        return self.admitter.review(
            parse_review(body), Deadline.after(self.clock.seconds(), budget), validation=validation
        )


def requests_total(h: Harness, outcome: str, origin: str = ORIGIN) -> float:
    value = h.metrics.registry.get_sample_value("amp_endpoint_requests_total", {"endpoint": origin, "outcome": outcome})
    return value or 0.0


def stamp(the_pod: dict, response: dict) -> Optional[str]:
    """The status stamp of C{the_pod} once C{response}'s patch is applied, or None."""
    annotations = apply_patch(the_pod, response["_patch"]).get("metadata", {}).get("annotations") or {}
    return annotations.get(STATUS_ANNOTATION)


def answered(case: SynchronousTestCase, d: Deferred) -> tuple[dict, Outcome]:
    body, outcome = case.successResultOf(d)
    doc = decode_answer(body)
    return doc["response"], outcome


def config_for(path: str = "/user-env", **kwargs: Any) -> Config:
    """team-a -> EP + path; kwargs are passed on to make_config."""
    return make_config({"team-a": namespace(EP + path)}, **kwargs)


# ---------------------------------------------------------------- success paths


class PatchedTests(SynchronousTestCase):
    def test_endpoint_patch_is_returned_and_applies(self) -> None:
        h = Harness(config_for("/user-env"))
        the_pod = pod(annotations={"hub.jupyter.org/username": "alice"})
        response, outcome = answered(self, h.review(review_bytes(the_pod)))
        self.assertTrue(response["allowed"])
        self.assertEqual(response["uid"], UID)
        patched = apply_patch(the_pod, response["_patch"])
        env = {e["name"]: e["value"] for e in patched["spec"]["containers"][0]["env"]}
        self.assertEqual(env["AMP_USER"], "alice")
        self.assertIn({"name": "user-home", "emptyDir": {}}, patched["spec"]["volumes"])
        self.assertEqual(outcome.result, "patched")
        self.assertEqual(outcome.endpoint, ORIGIN)
        self.assertGreater(outcome.patch_size, 0)
        self.assertEqual(patched["metadata"]["annotations"][STATUS_ANNOTATION], f"mutated {ORIGIN}")

    def test_v1beta1_review_gets_a_v1beta1_answer(self) -> None:
        h = Harness(config_for("/user-env"))
        body, _ = self.successResultOf(h.review(review_bytes(api_version=V1BETA1)))
        doc = decode_answer(body)
        self.assertEqual(doc["apiVersion"], V1BETA1)
        self.assertIsNotNone(doc["response"]["_patch"])

    def test_endpoint_gets_the_pod_and_amp_headers(self) -> None:
        canned = Canned([])
        h = Harness(config_for("/test/canned"), canned=canned)
        the_pod = pod("x")
        self.successResultOf(h.review(review_bytes(the_pod, dry_run=True)))
        [(headers, body)] = canned.requests
        self.assertEqual(json.loads(body), the_pod)
        self.assertEqual(headers[b"x-amp-namespace"], b"team-a")
        self.assertEqual(headers[b"x-amp-operation"], b"CREATE")
        self.assertEqual(headers[b"x-amp-uid"], UID.encode())
        self.assertEqual(headers[b"x-amp-dry-run"], b"true")
        self.assertEqual(headers[b"content-type"], b"application/json")
        self.assertTrue(headers[b"user-agent"].startswith(b"amp/"))

    def test_namespace_comes_from_the_request_not_the_object(self) -> None:
        canned = Canned([])
        h = Harness(
            make_config({"team-a": namespace(EP + "/test/canned"), "other": namespace(enabled=False)}), canned=canned
        )
        forged = pod()
        forged["metadata"]["namespace"] = "team-a"
        response, outcome = answered(self, h.review(review_bytes(forged, namespace="other")))
        self.assertEqual(canned.requests, [])
        self.assertEqual(outcome.result, "skipped")
        self.assertNotIn("patch", response)

    def test_mutation_annotation_of_the_go_amp_is_accepted(self) -> None:
        config = make_config({"team-a": namespace(annotations={"mutation.amp.txn2.com/ep": EP + "/user-env"})})
        response, outcome = answered(self, Harness(config).review(review_bytes()))
        self.assertEqual(outcome.result, "patched")
        self.assertIsNotNone(response["_patch"])

    def test_object_form_warnings_and_audit_annotations_pass_through(self) -> None:
        config = make_config({"team-a": namespace(EP + "/registry"), "mesh": namespace(EP + "/sidecar")})
        h = Harness(config)
        the_pod = pod(containers=[{"name": "app", "image": "gcr.io/x/y:1", "ports": [{"containerPort": 80}]}])
        response, _ = answered(self, h.review(review_bytes(the_pod)))
        self.assertEqual(len(response["warnings"]), 1)
        self.assertTrue(response["warnings"][0].startswith("amp: registry rewritten"))
        self.assertEqual(
            apply_patch(the_pod, response["_patch"])["spec"]["containers"][0]["image"], "asia.gcr.io/x/y:1"
        )
        response, _ = answered(self, h.review(review_bytes(the_pod, namespace="mesh")))
        self.assertEqual(response["auditAnnotations"], {"sidecar-injected": "true"})

    def test_bad_audit_keys_are_dropped_with_a_warning(self) -> None:
        canned = Canned({"patch": [], "auditAnnotations": {"ok-key": "v", "bad/key": "v"}})
        response, _ = answered(self, Harness(config_for("/test/canned"), canned=canned).review(review_bytes()))
        self.assertEqual(response["auditAnnotations"], {"ok-key": "v"})
        self.assertTrue(any("bad/key" in w for w in response["warnings"]))

    def test_repair_creates_the_missing_parent(self) -> None:
        canned = Canned([{"op": "add", "path": "/spec/containers/0/env/-", "value": {"name": "A", "value": "1"}}])
        h = Harness(config_for("/test/canned"), canned=canned)
        the_pod = pod()
        response, outcome = answered(self, h.review(review_bytes(the_pod)))
        self.assertEqual(outcome.result, "patched")
        self.assertEqual(response["_patch"][0]["path"], "/spec/containers/0/env")
        patched = apply_patch(the_pod, response["_patch"])
        self.assertEqual(patched["spec"]["containers"][0]["env"], [{"name": "A", "value": "1"}])
        self.assertEqual(h.metrics.patch_repairs._value.get(), 1)


class UnchangedTests(SynchronousTestCase):
    def assertUnchanged(self, response: dict) -> None:
        self.assertTrue(response["allowed"])
        self.assertNotIn("patch", response)
        self.assertNotIn("patchType", response)
        self.assertNotIn("warnings", response)

    def assertOnlyStamped(self, response: dict, value: str) -> None:
        """Allowed, no warning, and the patch changes nothing but the stamp."""
        self.assertTrue(response["allowed"])
        self.assertNotIn("warnings", response)
        the_pod = pod()
        patched = apply_patch(the_pod, response["_patch"])
        self.assertEqual(patched["metadata"].pop("annotations"), {STATUS_ANNOTATION: value})
        self.assertEqual(patched, the_pod)

    def test_namespace_not_enabled(self) -> None:
        canned = Canned([{"op": "add", "path": "/metadata/labels", "value": {}}])
        config = make_config({"team-a": namespace(EP + "/test/canned", enabled=False)})
        response, outcome = answered(self, Harness(config, canned=canned).review(review_bytes()))
        self.assertUnchanged(response)
        self.assertEqual(outcome.result, "skipped")
        self.assertEqual(canned.requests, [])

    def test_namespace_label_with_another_value(self) -> None:
        config = make_config(
            {"team-a": namespace(EP + "/user-env", enabled=False, labels={"amp.txn2.com/enabled": "false"})}
        )
        response, outcome = answered(self, Harness(config).review(review_bytes()))
        self.assertUnchanged(response)

    def test_unknown_namespace(self) -> None:
        response, outcome = answered(self, Harness(config_for()).review(review_bytes(namespace="nowhere")))
        self.assertUnchanged(response)
        self.assertEqual(outcome.result, "skipped")

    def test_not_a_pod_create(self) -> None:
        canned = Canned([{"op": "add", "path": "/metadata/labels", "value": {}}])
        h = Harness(config_for("/test/canned"), canned=canned)
        cases = [
            review_bytes(operation="UPDATE"),
            review_bytes(operation="DELETE"),
            review_bytes(
                {"kind": "ConfigMap", "metadata": {"name": "c"}},
                kind={"group": "", "version": "v1", "kind": "ConfigMap"},
            ),
            review_bytes(kind={"group": "apps", "version": "v1", "kind": "Pod"}),
            review_bytes(sub_resource="ephemeralcontainers"),
        ]
        for body in cases:
            response, outcome = answered(self, h.review(body))
            self.assertUnchanged(response)
            self.assertEqual(outcome.result, "skipped")
        self.assertEqual(canned.requests, [])

    def test_empty_patch(self) -> None:
        response, outcome = answered(self, Harness(config_for("/noop")).review(review_bytes()))
        self.assertOnlyStamped(response, f"unchanged {ORIGIN}")
        self.assertEqual(outcome.result, "allowed")
        self.assertEqual(outcome.patch_size, len(json.dumps(response["_patch"], separators=(",", ":"))))

    def test_patch_that_only_tests(self) -> None:
        canned = Canned([{"op": "test", "path": "/kind", "value": "Pod"}])
        response, outcome = answered(self, Harness(config_for("/test/canned"), canned=canned).review(review_bytes()))
        self.assertOnlyStamped(response, f"unchanged {ORIGIN}")
        self.assertEqual(outcome.result, "allowed")

    def test_mutation_is_skipped_where_only_validation_is_configured(self) -> None:
        """Reviewed all the same: stamped, so it is not taken for a Pod that bypassed amp."""
        config = make_config({"team-a": namespace(validation=EP + "/validate-labels")})
        response, outcome = answered(self, Harness(config).review(review_bytes()))
        self.assertOnlyStamped(response, "unchanged (none)")
        self.assertEqual(outcome.result, "skipped")


class DeniedTests(SynchronousTestCase):
    def test_endpoint_denial(self) -> None:
        response, outcome = answered(self, Harness(config_for("/deny")).review(review_bytes()))
        self.assertFalse(response["allowed"])
        self.assertEqual(response["status"]["code"], 403)
        self.assertIn(ORIGIN, response["status"]["message"])
        self.assertIn("denied by example policy", response["status"]["message"])
        self.assertNotIn("patch", response)
        self.assertEqual(outcome.result, "denied")
        self.assertEqual(outcome.reason, "endpoint-denied")

    def test_endpoint_denial_code_passes_through(self) -> None:
        canned = Canned({"allowed": False, "status": {"code": 422, "message": "no"}})
        response, _ = answered(self, Harness(config_for("/test/canned"), canned=canned).review(review_bytes()))
        self.assertEqual(response["status"]["code"], 422)


# ---------------------------------------------------------------- failures

#: (namespace annotations, canned resource or None, reason, where)
FAILURES: dict[str, tuple[dict, Optional[Canned], str, str]] = {
    "http-5xx": ({"amp.txn2.com/ep": EP + "/error"}, None, "http-5xx", ORIGIN),
    "http-4xx": ({"amp.txn2.com/ep": EP + "/no-such-path"}, None, "http-4xx", ORIGIN),
    "invalid-json": ({"amp.txn2.com/ep": EP + "/garbage"}, None, "invalid-json", ORIGIN),
    "invalid-reply": ({"amp.txn2.com/ep": EP + "/test/canned"}, Canned({"patches": []}), "invalid-reply", ORIGIN),
    "apply-failed": ({"amp.txn2.com/ep": EP + "/bad-patch"}, None, "apply-failed", ORIGIN),
    "refused-path": (
        {"amp.txn2.com/ep": EP + "/test/canned"},
        Canned([{"op": "replace", "path": "/metadata/name", "value": "evil"}]),
        "refused-path",
        ORIGIN,
    ),
    "invalid-patch": (
        {"amp.txn2.com/ep": EP + "/test/canned"},
        Canned([{"op": "frobnicate", "path": "/x"}]),
        "invalid-patch",
        ORIGIN,
    ),
    "not-allowed": ({"amp.txn2.com/ep": "http://10.0.0.1:8080/mutate"}, None, "not-allowed", "http://10.0.0.1:8080"),
    "bad-url": ({"amp.txn2.com/ep": "ftp://127.0.0.1/x"}, None, "bad-url", "ftp://127.0.0.1/x"),
    "no-endpoint": ({}, None, "no-endpoint", "(none)"),
}


class FailurePolicyTests(SynchronousTestCase):
    def harness(self, case: str, policy: str, **config: Any) -> Harness:
        annotations, canned, _, _ = FAILURES[case]
        ann = dict(annotations)
        ann["amp.txn2.com/failure-policy"] = policy
        cfg = make_config({"team-a": namespace(annotations=ann)}, **config)
        return Harness(cfg, **({"canned": canned} if canned is not None else {}))

    def test_every_failure_under_ignore(self) -> None:
        for case, (_, _, reason, where) in FAILURES.items():
            with self.subTest(case=case):
                h = self.harness(case, "Ignore")
                the_pod = pod()
                response, outcome = answered(self, h.review(review_bytes(the_pod)))
                self.assertTrue(response["allowed"])
                self.assertEqual(outcome.result, "ignored")
                self.assertEqual(outcome.reason, reason)
                [warning] = response["warnings"]
                self.assertIn(where, warning)
                self.assertIn(reason, warning)
                self.assertLess(len(warning), 120)
                error = response["auditAnnotations"]["error"]
                self.assertIn(where, error)
                self.assertIn(f"({reason})", error)
                self.assertEqual(warning, f"amp: {where} {reason}; admitted without the endpoint's patch")
                patched = apply_patch(the_pod, response["_patch"])
                self.assertEqual(patched["metadata"]["annotations"], {STATUS_ANNOTATION: f"skipped {reason} {where}"})
                self.assertEqual(patched["spec"], the_pod["spec"])

    def test_every_failure_under_fail(self) -> None:
        for case, (_, _, reason, where) in FAILURES.items():
            with self.subTest(case=case):
                response, outcome = answered(self, self.harness(case, "Fail").review(review_bytes()))
                self.assertFalse(response["allowed"])
                self.assertEqual(response["status"]["code"], 500)
                message = response["status"]["message"]
                self.assertIn(where, message)
                self.assertIn(f"({reason})", message)
                self.assertIn("failure policy Fail", message)
                self.assertNotIn("patch", response)
                self.assertEqual(outcome.result, "failed")
                self.assertEqual(outcome.reason, reason)

    def test_config_default_applies_without_an_annotation(self) -> None:
        for policy, allowed in (("Ignore", True), ("Fail", False)):
            h = Harness(config_for("/error", failure_policy=policy))
            response, _ = answered(self, h.review(review_bytes()))
            self.assertEqual(response["allowed"], allowed)

    def test_auto_without_a_cluster_policy_fails_closed(self) -> None:
        h = Harness(config_for("/error", failure_policy="auto"))
        response, _ = answered(self, h.review(review_bytes()))
        self.assertFalse(response["allowed"])

    def test_skipped_stamp_joins_existing_annotations(self) -> None:
        h = Harness(config_for("/error"))
        the_pod = pod(annotations={"keep": "me"})
        response, _ = answered(self, h.review(review_bytes(the_pod)))
        patched = apply_patch(the_pod, response["_patch"])
        self.assertEqual(
            patched["metadata"]["annotations"], {"keep": "me", STATUS_ANNOTATION: "skipped http-5xx " + ORIGIN}
        )

    def test_skipped_stamp_on_a_pod_without_metadata(self) -> None:
        h = Harness(config_for("/error"))
        the_pod = {"apiVersion": "v1", "kind": "Pod", "spec": {"containers": [{"name": "a", "image": "b"}]}}
        response, _ = answered(self, h.review(review_bytes(the_pod)))
        patched = apply_patch(the_pod, response["_patch"])
        self.assertEqual(patched["metadata"]["annotations"], {STATUS_ANNOTATION: "skipped http-5xx " + ORIGIN})

    def test_annotate_status_off(self) -> None:
        for path, result in (("/error", "ignored"), ("/noop", "allowed"), ("/user-env", "patched")):
            h = Harness(config_for(path, annotate_status=False))
            the_pod = pod(annotations={LEGACY_SKIPPED_ANNOTATION: "left alone"})
            response, outcome = answered(self, h.review(review_bytes(the_pod)))
            self.assertTrue(response["allowed"])
            self.assertEqual(outcome.result, result)
            self.assertEqual(
                apply_patch(the_pod, response["_patch"])["metadata"]["annotations"],
                {LEGACY_SKIPPED_ANNOTATION: "left alone"},
            )
            if result == "ignored":
                self.assertIn("error", response["auditAnnotations"])
                self.assertNotIn("patch", response)

    def test_patch_over_max_size(self) -> None:
        h = Harness(config_for("/user-env", patch={"max_size": 64}))
        response, outcome = answered(self, h.review(review_bytes()))
        self.assertEqual(outcome.reason, "patch-too-large")
        self.assertEqual(
            apply_patch(pod(), response["_patch"])["metadata"]["annotations"],
            {STATUS_ANNOTATION: "skipped patch-too-large " + ORIGIN},
        )

    def test_repair_off_makes_a_missing_parent_a_failure(self) -> None:
        canned = Canned([{"op": "add", "path": "/spec/containers/0/env/-", "value": {"name": "A", "value": "1"}}])
        h = Harness(config_for("/test/canned", patch={"repair": False}), canned=canned)
        response, outcome = answered(self, h.review(review_bytes()))
        self.assertEqual(outcome.reason, "apply-failed")
        self.assertIn("patch.repair is off", response["auditAnnotations"]["error"])

    def test_allowed_paths_let_a_denied_path_through(self) -> None:
        canned = Canned([{"op": "add", "path": "/metadata/name", "value": "renamed"}])
        h = Harness(config_for("/test/canned", patch={"allowed_paths": ["/metadata/name"]}), canned=canned)
        response, outcome = answered(self, h.review(review_bytes()))
        self.assertEqual(outcome.result, "patched")
        self.assertEqual(apply_patch(pod(), response["_patch"])["metadata"]["name"], "renamed")


class StatusStampTests(SynchronousTestCase):
    """
    The stamp tells what the rounds of the admission did (tests/unit/admission/test_stamp.py
    has every sequence of two): the stamp the Pod came with is read as an
    earlier round's; whatever the endpoint's patch did to the annotations,
    amp's own value is set.
    """

    FORGED = {
        STATUS_ANNOTATION: "mutated http://forged",
        LEGACY_SKIPPED_ANNOTATION: "http-5xx: http://old",
        "keep": "me",
    }

    def test_a_stamp_the_pod_came_with_is_read_as_an_earlier_rounds(self) -> None:
        """
        amp cannot tell a stamp in the manifest from an earlier round's:
        what it says of other endpoints is kept; this round's outcome is
        always told.
        """
        for path, value in (
            ("/user-env", f"mutated {ORIGIN} http://forged"),
            ("/noop", f"mutated http://forged; unchanged {ORIGIN}"),
            ("/error", f"skipped http-5xx {ORIGIN}; mutated http://forged"),
        ):
            with self.subTest(path=path):
                the_pod = pod(annotations=dict(self.FORGED, **{"hub.jupyter.org/username": "alice"}))
                response, _ = answered(self, Harness(config_for(path)).review(review_bytes(the_pod)))
                annotations = apply_patch(the_pod, response["_patch"])["metadata"]["annotations"]
                self.assertEqual(annotations[STATUS_ANNOTATION], value)
                self.assertNotIn(LEGACY_SKIPPED_ANNOTATION, annotations)
                self.assertEqual(annotations["keep"], "me")

    def test_the_stamp_applies_whatever_the_endpoint_did_to_the_annotations(self) -> None:
        replies = {
            "replaced": [{"op": "add", "path": "/metadata/annotations", "value": {"x": "y"}}],
            "removed": [{"op": "remove", "path": "/metadata/annotations"}],
            "forged": [{"op": "add", "path": "/metadata/annotations/amp.txn2.com~1status", "value": "mutated by me"}],
            "legacy": [{"op": "add", "path": "/metadata/annotations/amp.txn2.com~1skipped", "value": "x"}],
        }
        for name, reply in replies.items():
            with self.subTest(reply=name):
                the_pod = pod(annotations=self.FORGED)
                h = Harness(config_for("/test/canned"), canned=Canned(reply))
                response, outcome = answered(self, h.review(review_bytes(the_pod)))
                self.assertEqual(outcome.result, "patched")
                annotations = apply_patch(the_pod, response["_patch"])["metadata"]["annotations"]
                self.assertEqual(annotations[STATUS_ANNOTATION], f"mutated {ORIGIN} http://forged")
                self.assertNotIn(LEGACY_SKIPPED_ANNOTATION, annotations)

    def test_denied_paths_do_not_stop_amps_own_stamp(self) -> None:
        h = Harness(config_for("/noop", patch={"denied_paths": ["/metadata"]}))
        response, _ = answered(self, h.review(review_bytes()))
        self.assertEqual(stamp(pod(), response), f"unchanged {ORIGIN}")

    def test_reinvocation_after_a_failed_round_is_stamped_mutated(self) -> None:
        """
        The API server reinvokes amp with the Pod as the first round left
        it: a failure stamped C{skipped}; the second round's success
        replaces it with C{mutated}, and its answer carries no warning.
        """
        flaky = Canned(code=500)
        h = Harness(config_for("/test/flaky"), flaky=flaky)
        first = pod(annotations={"hub.jupyter.org/username": "alice"})
        response, outcome = answered(self, h.review(review_bytes(first)))
        self.assertEqual(outcome.result, "ignored")
        second = apply_patch(first, response["_patch"])
        self.assertEqual(second["metadata"]["annotations"][STATUS_ANNOTATION], f"skipped http-5xx {ORIGIN}")
        flaky.code = 200
        flaky.body = json.dumps([{"op": "add", "path": "/metadata/labels", "value": {"injected": "1"}}]).encode()
        response, outcome = answered(self, h.review(review_bytes(second)))
        self.assertEqual(outcome.result, "patched")
        self.assertNotIn("warnings", response)
        stored = apply_patch(second, response["_patch"])
        self.assertEqual(stored["metadata"]["labels"], {"injected": "1"})
        self.assertEqual(
            stored["metadata"]["annotations"],
            {"hub.jupyter.org/username": "alice", STATUS_ANNOTATION: f"mutated {ORIGIN}"},
        )

    def test_shadow_and_disabled_namespaces_are_not_stamped(self) -> None:
        config = make_config(
            {"team-a": namespace(EP + "/user-env", mode="shadow"), "off": namespace(EP + "/user-env", enabled=False)}
        )
        h = Harness(config)
        for ns in ("team-a", "off", "nowhere"):
            response, _ = answered(self, h.review(review_bytes(namespace=ns)))
            self.assertNotIn("patch", response)

    def test_an_unusable_annotation_is_stamped_masked(self) -> None:
        raw = "http://admin:hunter2@10.0.0.1/x"
        h = Harness(make_config({"team-a": namespace(raw, failure_policy="Ignore")}))
        response, _ = answered(self, h.review(review_bytes()))
        self.assertEqual(stamp(pod(), response), "skipped bad-url http://***@10.0.0.1/x")


class FailureLogTests(SynchronousTestCase):
    """
    A review that ends in the failure policy says so in amp's log, at
    warning, with everything needed to find out why.
    """

    def review_logged(self, h: Harness, body: bytes) -> tuple[dict, list[dict]]:
        with capturedLogs() as events:
            response, _ = answered(self, h.review(body))
        return response, [e for e in events if e.get("log_namespace", "").startswith("amp.admission")]

    def test_a_refused_patch_is_logged_with_its_whole_message(self) -> None:
        canned = Canned([{"op": "add", "path": "/spec/containers/5/env/-", "value": {"name": "A", "value": "1"}}])
        for policy, effect in (("Ignore", "admits it without the endpoint's patch"), ("Fail", "denies the Pod")):
            h = Harness(config_for("/test/canned", failure_policy=policy), canned=canned)
            response, events = self.review_logged(h, review_bytes(pod("web")))
            [event] = events
            self.assertEqual(event["log_level"], LogLevel.warn)
            self.assertEqual(
                (event["uid"], event["namespace"], event["pod"], event["endpoint"], event["reason"]),
                (UID, "team-a", "web", ORIGIN, "apply-failed"),
            )
            line = formatEvent(event)
            self.assertIn("operation 0 (add /spec/containers/5/env/-): /spec/containers/5 does not exist", line)
            self.assertTrue(line.endswith(f"failure policy {policy} {effect}"), line)
            if policy == "Fail":
                self.assertIn(event["text"], response["status"]["message"])

    def test_an_unusable_annotation_is_logged_masked(self) -> None:
        h = Harness(make_config({"team-a": namespace("http://admin:hunter2@10.0.0.1/x", failure_policy="Ignore")}))
        _, events = self.review_logged(h, review_bytes())
        [event] = events
        self.assertNotIn("hunter2", formatEvent(event))
        self.assertEqual(event["endpoint"], "http://***@10.0.0.1/x")

    def test_a_cancelled_review_is_not_a_warning(self) -> None:
        h = Harness(config_for("/hang"))
        with capturedLogs() as events:
            d = h.review(review_bytes())
            d.cancel()
        [event] = [e for e in events if e.get("log_namespace", "").startswith("amp.admission")]
        self.assertEqual((event["log_level"], event["reason"]), (LogLevel.info, "cancelled"))

    def test_success_logs_nothing_here(self) -> None:
        _, events = self.review_logged(Harness(config_for("/user-env")), review_bytes())
        self.assertEqual(events, [])


class RefusedReplyTests(SynchronousTestCase):
    """
    A reply amp refuses is not an ``ok`` call of the endpoint, though the
    endpoint answered (its breaker sees a success).
    """

    def test_a_refused_patch_counts_under_its_reason(self) -> None:
        cases = {
            "apply-failed": [{"op": "remove", "path": "/spec/nothing"}],
            "refused-path": [{"op": "replace", "path": "/metadata/name", "value": "evil"}],
            "invalid-patch": [{"op": "frobnicate", "path": "/x"}],
        }
        for reason, reply in cases.items():
            with self.subTest(reason=reason):
                h = Harness(
                    config_for("/test/canned", endpoints={"breaker": {"consecutive_failures": 1}}), canned=Canned(reply)
                )
                for _ in range(3):
                    _, outcome = answered(self, h.review(review_bytes()))
                    self.assertEqual((outcome.result, outcome.reason), ("ignored", reason))
                self.assertEqual(requests_total(h, reason), 3)
                self.assertEqual(requests_total(h, "ok"), 0)

    def test_usable_replies_and_denies_are_ok(self) -> None:
        for path in ("/user-env", "/noop", "/deny"):
            h = Harness(config_for(path))
            answered(self, h.review(review_bytes()))
            self.assertEqual(requests_total(h, "ok"), 1, path)

    def test_shadow_mode_counts_what_amp_would_refuse(self) -> None:
        h = Harness(make_config({"team-a": namespace(EP + "/bad-patch", mode="shadow")}))
        _, outcome = answered(self, h.review(review_bytes()))
        self.assertEqual((outcome.result, outcome.reason), ("shadow", "apply-failed"))
        self.assertEqual(requests_total(h, "apply-failed"), 1)


class NamespaceProblemTests(SynchronousTestCase):
    """
    An unknown failure-policy value is not silently defaulted: it is
    logged at warning and counted, once per change of the namespace.
    """

    def problems(self, h: Harness) -> float:
        value = h.metrics.registry.get_sample_value("amp_namespace_problems_total", {"problem": "failure-policy"})
        return value or 0.0

    def test_a_typo_is_reported_once_per_change(self) -> None:
        source = FakeSource()
        h = Harness(make_config(failure_policy="Ignore"), source=source)
        warnings: list[str] = []

        def review(value: Optional[str]) -> None:
            extra = {} if value is None else {"amp.txn2.com/failure-policy": value}
            source.known["team-a"] = team_a("/error", **extra)
            with capturedLogs() as events:
                answered(self, h.review(review_bytes()))
            warnings.extend(
                formatEvent(e)
                for e in events
                if e.get("log_namespace", "").startswith("amp.admission") and e.get("problem")
            )

        review("fail")
        review("fail")
        self.assertEqual(
            warnings,
            [
                "Namespace team-a: annotation amp.txn2.com/failure-policy: 'fail' is not "
                "Ignore or Fail; failure policy Ignore (from failure_policy) applies; fix: "
                "kubectl label namespace team-a amp.txn2.com/failure-class=Fail (or =Ignore) "
                "&& kubectl annotate namespace team-a amp.txn2.com/failure-policy-"
            ],
        )
        self.assertEqual(self.problems(h), 1)
        review("FAIL")
        review("FAIL")
        self.assertEqual(len(warnings), 2)
        # a usable annotation, but the deprecated one alone: a problem of its own
        review("Fail")
        review("fail")
        self.assertEqual(len(warnings), 4)
        self.assertEqual(self.problems(h), 3)
        self.assertEqual(
            h.metrics.registry.get_sample_value(
                "amp_namespace_problems_total", {"problem": "failure-class-annotation"}
            ),
            1,
        )

    def test_the_failure_class_label_moves_the_problem_away(self) -> None:
        """
        Labelled, the namespace has no problem; labelled and annotated
        differently, the disagreement is named with the fix, once.
        """
        source = FakeSource()
        h = Harness(make_config(failure_policy="Ignore"), source=source)
        lines: list[str] = []

        def review(label: str, annotation: Optional[str] = None) -> dict[str, Any]:
            info = team_a("/error", **({} if annotation is None else {"amp.txn2.com/failure-policy": annotation}))
            source.known["team-a"] = NamespaceInfo(
                info.name, {**info.labels, "amp.txn2.com/failure-class": label}, info.annotations
            )
            with capturedLogs() as events:
                response, _ = answered(self, h.review(review_bytes()))
            lines.extend(formatEvent(e) for e in events if e.get("problem"))
            return response

        self.assertFalse(review("Fail")["allowed"])
        self.assertEqual(lines, [])
        self.assertFalse(review("Fail", "Ignore")["allowed"])
        self.assertFalse(review("Fail", "Ignore")["allowed"])
        self.assertEqual(
            lines,
            [
                "Namespace team-a: the label amp.txn2.com/failure-class=Fail and the deprecated "
                "annotation amp.txn2.com/failure-policy='Ignore' disagree; amp and the API server "
                "follow the label (Fail); fix: kubectl annotate namespace team-a "
                "amp.txn2.com/failure-policy-"
            ],
        )
        self.assertEqual(
            h.metrics.registry.get_sample_value("amp_namespace_problems_total", {"problem": "failure-class-disagrees"}),
            1,
        )

    def test_the_policy_that_applies_is_named(self) -> None:
        source = FakeSource(policy="Fail")
        source.known["team-a"] = team_a("/error", **{"amp.txn2.com/failure-policy": "ignore"})
        h = Harness(make_config(failure_policy="auto"), source=source)
        with capturedLogs() as events:
            response, _ = answered(self, h.review(review_bytes()))
        self.assertFalse(response["allowed"])
        [line] = [formatEvent(e) for e in events if e.get("problem")]
        self.assertIn("failure policy Fail (from the webhook's failurePolicy) applies; fix: ", line)


class BreakerTests(SynchronousTestCase):
    def test_the_origins_breaker_settings_apply_to_every_path(self) -> None:
        """
        The path override of C{/error} keeps the default breaker, but the
        origin's breaker opens after one failure, as its root's settings say.
        """
        config = make_config(
            {"team-a": namespace(EP + "/error"), "team-b": namespace(EP + "/user-env")},
            endpoints={
                "overrides": [
                    {"match": "http://127.0.0.1:*/error", "timeout": "1s"},
                    {"match": "http://127.0.0.1:*/*", "breaker": {"consecutive_failures": 1}},
                ]
            },
        )
        h = Harness(config)
        _, outcome = answered(self, h.review(review_bytes()))
        self.assertEqual(outcome.reason, "http-5xx")
        _, outcome = answered(self, h.review(review_bytes(namespace="team-b")))
        self.assertEqual(outcome.reason, "breaker-open")


class ShadowTests(SynchronousTestCase):
    def config(self, path: str) -> Config:
        return make_config({"team-a": namespace(EP + path, mode="shadow", failure_policy="Fail")})

    def test_shadow_admits_unchanged_and_records(self) -> None:
        h = Harness(self.config("/user-env"))
        response, outcome = answered(self, h.review(review_bytes()))
        self.assertTrue(response["allowed"])
        self.assertNotIn("patch", response)
        self.assertEqual(outcome.result, "shadow")
        self.assertGreater(outcome.shadow_patch_size, 0)
        self.assertEqual(h.metrics.shadow_patches.labels(ORIGIN)._value.get(), 1)

    def test_shadow_does_not_enforce_a_denial(self) -> None:
        response, outcome = answered(self, Harness(self.config("/deny")).review(review_bytes()))
        self.assertTrue(response["allowed"])
        self.assertEqual(outcome.result, "shadow")

    def test_shadow_failure_admits_unchanged_without_annotation(self) -> None:
        for path, reason in (("/error", "http-5xx"), ("/bad-patch", "apply-failed")):
            response, outcome = answered(self, Harness(self.config(path)).review(review_bytes()))
            self.assertTrue(response["allowed"])
            self.assertNotIn("patch", response)
            self.assertEqual(outcome.result, "shadow")
            self.assertEqual(outcome.reason, reason)


# ---------------------------------------------------------------- validation


class ValidationTests(SynchronousTestCase):
    def harness(self, path: str, policy: str = "Ignore", **canned: Canned) -> Harness:
        return Harness(make_config({"team-a": namespace(validation=EP + path, failure_policy=policy)}), **canned)

    def test_validate_allows_and_denies(self) -> None:
        h = self.harness("/validate-labels")
        response, outcome = answered(self, h.review(review_bytes(pod(labels={"app": "x"})), validation=True))
        self.assertTrue(response["allowed"])
        self.assertNotIn("patch", response)
        response, outcome = answered(self, h.review(review_bytes(pod()), validation=True))
        self.assertFalse(response["allowed"])
        self.assertEqual(response["status"]["code"], 403)
        self.assertIn("pod has no app label", response["status"]["message"])

    def test_validate_never_returns_a_patch(self) -> None:
        canned = Canned([{"op": "add", "path": "/metadata/labels", "value": {"a": "b"}}])
        response, _ = answered(
            self, self.harness("/test/canned", canned=canned).review(review_bytes(), validation=True)
        )
        self.assertTrue(response["allowed"])
        self.assertNotIn("patch", response)

    def test_validate_failure_under_ignore_has_no_patch(self) -> None:
        """
        The API server refuses any patch from a validating webhook, so the
        skipped annotation must not be sent on /validate.
        """
        response, outcome = answered(self, self.harness("/error").review(review_bytes(), validation=True))
        self.assertTrue(response["allowed"])
        self.assertNotIn("patch", response)
        self.assertEqual(outcome.reason, "http-5xx")
        self.assertIn("http-5xx", response["auditAnnotations"]["error"])

    def test_validate_failure_under_fail(self) -> None:
        response, _ = answered(self, self.harness("/error", "Fail").review(review_bytes(), validation=True))
        self.assertFalse(response["allowed"])
        self.assertIn(ORIGIN, response["status"]["message"])

    def test_validate_without_validation_endpoint_is_skipped(self) -> None:
        h = Harness(config_for("/user-env"))
        response, outcome = answered(self, h.review(review_bytes(), validation=True))
        self.assertTrue(response["allowed"])
        self.assertNotIn("patch", response)
        self.assertEqual(outcome.result, "skipped")


# ---------------------------------------------------------------- namespace source and deadline


@implementer(INamespaceSource)
def team_a(path: str = "/user-env", **annotations: str) -> NamespaceInfo:
    return NamespaceInfo("team-a", {"amp.txn2.com/enabled": "true"}, {"amp.txn2.com/ep": EP + path, **annotations})


class NamespaceFetchTests(SynchronousTestCase):
    def test_cache_miss_fetches_then_calls_the_endpoint(self) -> None:
        source = FakeSource()
        h = Harness(make_config(), source=source)
        d = h.review(review_bytes(), budget=3.0)
        self.assertNoResult(d)
        [(name, timeout, fetch)] = source.fetches
        self.assertEqual((name, timeout), ("team-a", 3.0))
        fetch.callback(team_a())
        response, outcome = answered(self, d)
        self.assertEqual(outcome.result, "patched")

    def test_cache_miss_for_a_missing_namespace_admits(self) -> None:
        source = FakeSource()
        h = Harness(make_config(), source=source)
        d = h.review(review_bytes())
        source.fetches[0][2].callback(None)
        response, outcome = answered(self, d)
        self.assertTrue(response["allowed"])
        self.assertEqual(outcome.result, "skipped")

    def test_cluster_policy_is_followed_under_auto(self) -> None:
        for cluster, allowed in (("Ignore", True), ("Fail", False), (None, False)):
            source = FakeSource(policy=cluster)
            source.known["team-a"] = team_a("/error")
            h = Harness(make_config(failure_policy="auto"), source=source)
            response, _ = answered(self, h.review(review_bytes()))
            self.assertEqual(response["allowed"], allowed, cluster)

    def test_failed_fetch_is_answered_by_the_policy(self) -> None:
        source = FakeSource()
        h = Harness(make_config(failure_policy="Ignore"), source=source)
        d = h.review(review_bytes())
        source.fetches[0][2].errback(RuntimeError("apiserver unreachable"))
        response, outcome = answered(self, d)
        self.assertTrue(response["allowed"])
        self.assertEqual(outcome.reason, "internal-error")
        self.assertIn("apiserver unreachable", response["auditAnnotations"]["error"])
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)


class DeadlineTests(SynchronousTestCase):
    def assertOneTimerAnswers(self, h: Harness, d: Deferred, at: float, reason: str) -> None:
        """
        The review's one timer is set for C{at}; when it fires, the review
        is answered with C{reason} and no timer is left.
        """
        [timer] = h.clock.getDelayedCalls()
        self.assertEqual(timer.getTime(), at)
        h.clock.advance(at - h.clock.seconds())
        _, outcome = answered(self, d)
        self.assertEqual(outcome.reason, reason)
        self.assertEqual(h.clock.getDelayedCalls(), [])

    def test_hung_endpoint_is_answered_exactly_at_the_budget(self) -> None:
        for policy, allowed in (("Ignore", True), ("Fail", False)):
            h = Harness(config_for("/hang", failure_policy=policy))
            d = h.review(review_bytes(), budget=1.5)
            h.clock.advance(1.499)
            self.assertNoResult(d)
            h.clock.advance(0.001)
            response, outcome = answered(self, d)
            self.assertEqual(response["allowed"], allowed)
            self.assertEqual(outcome.reason, "timeout")
            self.assertEqual(h.clock.getDelayedCalls(), [])

    def test_endpoint_timeout_shorter_than_the_budget_wins(self) -> None:
        h = Harness(config_for("/hang", endpoints={"timeout": "250ms"}))
        d = h.review(review_bytes(), budget=9.5)
        h.clock.advance(0.249)
        self.assertNoResult(d)
        h.clock.advance(0.001)
        response, outcome = answered(self, d)
        self.assertEqual(outcome.reason, "timeout")
        self.assertIn("0.25s", response["auditAnnotations"]["error"])

    def test_time_spent_fetching_the_namespace_is_taken_from_the_endpoint_call(self) -> None:
        source = FakeSource()
        h = Harness(make_config(), source=source)
        d = h.review(review_bytes(), budget=2.0)
        h.clock.advance(1.5)
        source.fetches[0][2].callback(team_a("/hang"))
        h.clock.advance(0.499)
        self.assertNoResult(d)
        h.clock.advance(0.001)
        response, outcome = answered(self, d)
        self.assertTrue(response["allowed"])
        # The endpoint had what was left: it timed out, the review did not.
        self.assertEqual(outcome.reason, "timeout")
        self.assertIn("no reply within 0.5s", response["auditAnnotations"]["error"])
        self.assertEqual(requests_total(h, "timeout"), 1)
        self.assertEqual(h.clock.getDelayedCalls(), [])

    def test_one_timer_owns_the_deadline(self) -> None:
        """
        While a review waits on an endpoint, the review's one timer is the
        only one: set for the deadline when the endpoint's own timeout is
        longer than what is left, for the endpoint's timeout when that ends
        first (the call is then failed with timeout, a verdict its breaker
        counts, and the review goes on under its deadline).
        """
        h = Harness(config_for("/hang", endpoints={"timeout": "30s"}))
        self.assertOneTimerAnswers(h, h.review(review_bytes(), budget=1.5), 1.5, "timeout")

        h = Harness(config_for("/hang", endpoints={"timeout": "250ms"}))
        self.assertOneTimerAnswers(h, h.review(review_bytes(), budget=1.5), 0.25, "timeout")
        self.assertEqual(requests_total(h, "timeout"), 1)

    def test_a_bug_ending_a_timed_out_call_still_answers_by_the_deadline(self) -> None:
        """
        The review's one timer stands for the deadline too: when ending an
        endpoint call at its own timeout raises (a bug of amp's, here
        injected), the timer is set again and the review is still answered
        when its deadline passes, never left waiting.
        """
        import amp.endpoint._call as call_module

        settle = call_module.Call._settle
        raised: list[str] = []

        def faulty(call: Any, outcome: str, *args: Any, **kwargs: Any) -> Any:
            if outcome == "timeout" and not raised:
                raised.append(outcome)
                raise RuntimeError("a bug while the call ends")
            return settle(call, outcome, *args, **kwargs)

        self.patch(call_module.Call, "_settle", faulty)
        h = Harness(config_for("/hang", endpoints={"timeout": "250ms"}))
        d = h.review(review_bytes(), budget=1.5)
        with self.assertRaises(RuntimeError):
            h.clock.advance(0.25)
        self.assertEqual(raised, ["timeout"])
        self.assertNoResult(d)
        self.assertOneTimerAnswers(h, d, 1.5, "deadline")

    def test_a_chain_after_a_step_timed_out_keeps_the_deadline(self) -> None:
        """
        A chain whose first step's endpoint times out (its own timeout,
        under Ignore) goes on with the next step, and the review's one timer
        is set again: for that step's timeout, then the deadline.
        """
        h = Harness(
            make_config(
                {"team-a": namespace(f"{EP}/test/a {EP}/test/b", failure_policy="Ignore")},
                endpoints={"timeout": "250ms"},
            ),
            a=Canned(hang=True),
            b=Canned(hang=True),
        )
        d = h.review(review_bytes(), budget=0.4)
        [timer] = h.clock.getDelayedCalls()
        self.assertEqual(timer.getTime(), 0.25)
        h.clock.advance(0.25)
        self.assertNoResult(d)
        [timer] = h.clock.getDelayedCalls()
        self.assertAlmostEqual(timer.getTime(), 0.4)
        self.assertEqual(len(h.root.children[b"test"].children[b"b"].requests), 1)
        h.clock.advance(0.15)
        _, outcome = answered(self, d)
        self.assertEqual(outcome.reason, "timeout")
        self.assertEqual(h.clock.getDelayedCalls(), [])
        # Both calls ended as timeout: the first by its own timeout, the
        # second cut off by the review's deadline.
        self.assertEqual(requests_total(h, "timeout"), 2)

    def test_the_namespace_lookup_gets_what_is_left(self) -> None:
        source = FakeSource()
        h = Harness(make_config(), source=source)
        h.clock.advance(100.0)
        deadline = Deadline.after(99.0, 3.0)  # the review arrived a second ago
        d = h.admitter.review(parse_review(review_bytes()), deadline)
        [(_, timeout, fetch)] = source.fetches
        self.assertEqual(timeout, 2.0)
        [timer] = h.clock.getDelayedCalls()
        self.assertEqual(timer.getTime(), 102.0)
        fetch.callback(team_a())
        _, outcome = answered(self, d)
        self.assertEqual(outcome.result, "patched")
        self.assertEqual(h.clock.getDelayedCalls(), [])

    def test_the_failure_path_keeps_the_route_the_review_was_on(self) -> None:
        """
        The namespace changed its failure policy while the endpoint hung:
        the review ends under the policy it was routed with.
        """
        source = FakeSource()
        source.known["team-a"] = team_a("/hang", **{"amp.txn2.com/failure-policy": "Fail"})
        h = Harness(make_config(failure_policy="Ignore"), source=source)
        d = h.review(review_bytes(), budget=1.0)
        source.known["team-a"] = team_a("/hang", **{"amp.txn2.com/failure-policy": "Ignore"})
        h.clock.advance(1.0)
        response, outcome = answered(self, d)
        self.assertFalse(response["allowed"])
        self.assertEqual((outcome.result, outcome.reason, outcome.endpoint), ("failed", "timeout", ORIGIN))

    def test_hung_namespace_fetch_is_answered_at_the_budget_by_the_config_policy(self) -> None:
        for policy, allowed in (("Ignore", True), ("Fail", False)):
            source = FakeSource()
            h = Harness(make_config(failure_policy=policy), source=source)
            d = h.review(review_bytes(), budget=2.0)
            h.clock.advance(1.999)
            self.assertNoResult(d)
            h.clock.advance(0.001)
            response, outcome = answered(self, d)
            self.assertEqual(response["allowed"], allowed, policy)
            self.assertEqual(outcome.reason, "deadline")
            text = response["auditAnnotations"]["error"] if allowed else response["status"]["message"]
            self.assertIn("deadline", text)
            self.assertEqual(self.flushLoggedErrors(), [])

    def test_cancelled_review_answers_quietly(self) -> None:
        """The API server hung up: the review is cancelled, nothing is logged as an error."""
        source = FakeSource()
        h = Harness(make_config(), source=source)
        d = h.review(review_bytes(), budget=2.0)
        d.cancel()
        body, outcome = self.successResultOf(d)
        self.assertTrue(decode_answer(body)["response"]["allowed"])
        self.assertEqual(outcome.reason, "cancelled")
        self.assertEqual(self.flushLoggedErrors(), [])
        self.assertEqual(h.clock.getDelayedCalls(), [])

    def test_cancelled_during_the_endpoint_call_is_cancelled(self) -> None:
        h = Harness(config_for("/hang"))
        d = h.review(review_bytes(), budget=2.0)
        h.clock.advance(1.0)
        d.cancel()
        _, outcome = self.successResultOf(d)
        self.assertEqual(outcome.reason, "cancelled")
        self.assertEqual(requests_total(h, "cancelled"), 1)
        self.assertEqual(requests_total(h, "timeout"), 0)
        self.assertEqual(h.clock.getDelayedCalls(), [])

    def test_cancelled_during_a_lookup_that_fails_when_cancelled_is_cancelled(self) -> None:
        """
        A namespace source whose lookup, cancelled, fails as a lookup
        failure: the review was still cancelled, not a lookup failure.
        """
        source = FakeSource()
        h = Harness(make_config(), source=source)
        d = h.review(review_bytes(), budget=2.0)
        fetch = source.fetches[0][2]
        fetch.addErrback(lambda f: f.trap(CancelledError) and fail(NamespaceLookupError("namespace team-a: ")))
        d.cancel()
        _, outcome = self.successResultOf(d)
        self.assertEqual(outcome.reason, "cancelled")

    def test_a_failure_without_a_message_is_still_explained(self) -> None:
        for error, reason, text in (
            (NamespaceLookupError(), "namespace-lookup", "namespace team-a: the lookup failed"),
            (KeyError(), "internal-error", "amp internal error: KeyError"),
        ):
            source = FakeSource()
            h = Harness(make_config(failure_policy="Ignore"), source=source)
            d = h.review(review_bytes(), budget=2.0)
            source.fetches[0][2].errback(error)
            response, outcome = answered(self, d)
            self.assertEqual(outcome.reason, reason)
            self.assertEqual(response["auditAnnotations"]["error"], f"endpoint (none) failed ({reason}): {text}")
        self.assertEqual(len(self.flushLoggedErrors(KeyError)), 1)

    def test_a_step_that_does_not_end_when_cancelled_does_not_hold_the_answer(self) -> None:
        """A lookup that stays paused when cancelled: answered at the deadline; its late end changes nothing."""
        source = FakeSource()
        h = Harness(make_config(failure_policy="Ignore"), source=source)
        d = h.review(review_bytes(), budget=2.0)
        fetch = source.fetches[0][2]
        fetch.pause()
        h.clock.advance(2.0)
        _, outcome = answered(self, d)
        fetch.unpause()
        self.assertEqual(outcome.reason, "deadline")


class RobustnessTests(SynchronousTestCase):
    def test_endpoint_client_raising_still_answers(self) -> None:
        class Broken:
            def call(self, request: Any, receiver: Any) -> Any:
                raise RuntimeError("bug in the client")

        config = config_for("/user-env")
        admitter = Admitter(
            config,
            StaticNamespaceSource(config.kubernetes),
            Broken(),  # type: ignore[arg-type]
            Clock(),
            Metrics(),
        )
        body, outcome = self.successResultOf(admitter.review(parse_review(review_bytes()), Deadline(2.0, 2.0)))
        response = decode_answer(body)["response"]
        self.assertTrue(response["allowed"])
        self.assertEqual(outcome.reason, "internal-error")
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)

    def test_endpoint_client_failing_unexpectedly_still_answers(self) -> None:
        class Broken:
            def call(self, request: Any, receiver: Any) -> Any:
                receiver.failed(Failure(ValueError("unexpected")))

        config = config_for("/user-env", failure_policy="Fail")
        admitter = Admitter(
            config,
            StaticNamespaceSource(config.kubernetes),
            Broken(),  # type: ignore[arg-type]
            Clock(),
            Metrics(),
        )
        body, outcome = self.successResultOf(admitter.review(parse_review(review_bytes()), Deadline(2.0, 2.0)))
        response = decode_answer(body)["response"]
        self.assertFalse(response["allowed"])
        self.assertIn(ORIGIN, response["status"]["message"])
        self.assertEqual(len(self.flushLoggedErrors(ValueError)), 1)


class UnusableAnnotationTests(SynchronousTestCase):
    def test_credentials_and_control_characters_are_not_repeated(self) -> None:
        """
        An annotation amp will not call may hold a password or CR/LF; the
        warning, audit annotation and skipped annotation show it masked.
        """
        raw = "http://admin:hunter2@10.0.0.1/\r\nX-Evil: 1"
        h = Harness(make_config({"team-a": namespace(raw, failure_policy="Ignore")}))
        the_pod = pod()
        response, outcome = answered(self, h.review(review_bytes(the_pod)))
        self.assertEqual(outcome.reason, "bad-url")
        patched = apply_patch(the_pod, response["_patch"])
        shown = json.dumps([response["warnings"], response["auditAnnotations"], patched["metadata"]])
        self.assertNotIn("hunter2", shown)
        self.assertNotIn("\r", shown.encode().decode("unicode_escape"))
        self.assertIn("***@10.0.0.1", shown)


# ---------------------------------------------------------------- opt-out and self-protection


class LeftAloneTests(SynchronousTestCase):
    """
    A Pod that opts out, or one in amp's own or a protected namespace, is
    answered unchanged without a namespace lookup or a call, under either
    failure policy.
    """

    def test_an_opted_out_pod_is_answered_unchanged_without_a_call(self) -> None:
        for policy in ("Ignore", "Fail"):
            called = Canned([{"op": "add", "path": "/metadata/labels/x", "value": "y"}])
            h = Harness(config_for("/test/called", failure_policy=policy), called=called)
            the_pod = pod(labels={"amp.txn2.com/enabled": "false", "app": "web"})
            response, outcome = answered(self, h.review(review_bytes(the_pod)))
            self.assertTrue(response["allowed"])
            self.assertIsNone(response["_patch"])
            self.assertNotIn("warnings", response)
            self.assertEqual((outcome.result, outcome.reason), ("skipped", "opted-out"))
            self.assertEqual(called.requests, [])

    def test_only_false_opts_out(self) -> None:
        called = Canned([])
        h = Harness(config_for("/test/called"), called=called)
        response, outcome = answered(self, h.review(review_bytes(pod(labels={"amp.txn2.com/enabled": "no"}))))
        self.assertEqual(outcome.result, "allowed")
        self.assertEqual(len(called.requests), 1)

    def test_protected_namespaces_are_never_changed_and_said_once(self) -> None:
        called = Canned([{"op": "add", "path": "/metadata/labels", "value": {"x": "y"}}])
        config = make_config(
            {"kube-system": namespace(EP + "/test/called"), "amp-system": namespace(EP + "/test/called")},
            kubernetes={"own_namespace": "amp-system"},
            failure_policy="Fail",
        )
        h = Harness(config, called=called)
        logged: list[dict] = []
        from twisted.logger import globalLogPublisher

        globalLogPublisher.addObserver(logged.append)
        self.addCleanup(globalLogPublisher.removeObserver, logged.append)
        for ns in ("kube-system", "amp-system", "kube-system", "amp-system"):
            response, outcome = answered(self, h.review(review_bytes(namespace=ns)))
            self.assertTrue(response["allowed"])
            self.assertIsNone(response["_patch"])
            self.assertEqual((outcome.result, outcome.reason), ("skipped", "protected-namespace"))
        self.assertEqual(called.requests, [])
        told = sorted(e["namespace"] for e in logged if "protected namespace" in e.get("log_format", ""))
        self.assertEqual(told, ["amp-system", "kube-system"])

    def test_the_config_can_allow_protected_namespaces(self) -> None:
        config = make_config(
            {"kube-system": namespace(EP + "/test/called")}, kubernetes={"allow_protected_namespaces": True}
        )
        called = Canned([])
        h = Harness(config, called=called)
        _, outcome = answered(self, h.review(review_bytes(namespace="kube-system")))
        self.assertEqual(outcome.result, "allowed")
        self.assertEqual(len(called.requests), 1)

    def test_own_pods_warning_at_start_up(self) -> None:
        enabled = make_config({"amp-system": namespace(EP + "/user-env")}, kubernetes={"own_namespace": "amp-system"})
        warning = Harness(enabled).admitter.own_pods_warning()
        self.assertIsNotNone(warning)
        self.assertIn("amp-system", warning)
        quiet = make_config({"amp-system": namespace(enabled=False)}, kubernetes={"own_namespace": "amp-system"})
        self.assertIsNone(Harness(quiet).admitter.own_pods_warning())
        self.assertIsNone(Harness(make_config()).admitter.own_pods_warning())
