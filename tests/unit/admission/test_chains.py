"""
Ordered endpoint chains: the namespace's endpoint annotation names several
URLs, called in order within one review and its one deadline; amp composes
one checked patch (L{amp.patch.compose}) that equals applying each step in
turn.  Unit tests on a Clock, endpoints in memory (see tests/unit/admission/test_admission.py).
"""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonpatch
import pytest
from twisted.trial.unittest import SynchronousTestCase

from amp.patch import PatchError, check_patch, compose
from amp_examples.registry import registry_reply
from amp_examples.sidecar import sidecar_reply
from tests.support.endpoint_harness import Hung
from tests.support.helpers import apply_patch, make_config, namespace, pod, review_bytes
from tests.unit.admission.test_admission import Canned, Harness, answered, stamp

A = "http://127.0.0.1:8091"
B = "http://127.0.0.1:8092"
C = "http://127.0.0.1:8093"


def label(key: str, value: str) -> list[dict]:
    return [{"op": "add", "path": f"/metadata/labels/{key}", "value": value}]


def chain_config(*urls: str, **sections: Any) -> Any:
    return make_config({"team-a": namespace("\n".join(urls) + "\n")}, **sections)


class ChainTests(SynchronousTestCase):
    def test_each_endpoint_gets_the_pod_as_the_previous_left_it_and_one_patch_is_composed(self) -> None:
        a = Canned(label("a", "1"))
        b = Canned({"patch": label("b", "2"), "warnings": ["b was here"], "auditAnnotations": {"note": "b"}})
        h = Harness(chain_config(A + "/test/a", B + "/test/b"), a=a, b=b)
        the_pod = pod(labels={"app": "web"})
        response, outcome = answered(self, h.review(review_bytes(the_pod)))
        # Called in order: b saw a's change.
        self.assertEqual(json.loads(a.requests[0][1])["metadata"]["labels"], {"app": "web"})
        self.assertEqual(json.loads(b.requests[0][1])["metadata"]["labels"], {"app": "web", "a": "1"})
        patched = apply_patch(the_pod, response["_patch"])
        self.assertEqual(patched["metadata"]["labels"], {"app": "web", "a": "1", "b": "2"})
        self.assertEqual(stamp(the_pod, response), f"mutated {A} {B}")
        self.assertEqual((outcome.result, outcome.endpoint), ("patched", f"{A},{B}"))
        # What an endpoint says names it.
        self.assertIn(f"amp: {B}: b was here", response["warnings"])
        self.assertEqual(response["auditAnnotations"], {"note": f"{B}: b"})

    def test_a_single_url_behaves_as_before(self) -> None:
        a = Canned({"patch": label("a", "1"), "warnings": ["w"]})
        h = Harness(chain_config(A + "/test/a"), a=a)
        response, _ = answered(self, h.review(review_bytes()))
        self.assertEqual(response["warnings"], ["amp: w"])
        self.assertEqual(stamp(pod(), response), f"mutated {A}")

    def test_a_failing_middle_step_under_ignore_is_skipped_and_the_chain_goes_on(self) -> None:
        a, b, c = Canned(label("a", "1")), Canned(b"boom", code=500), Canned(label("c", "3"))
        h = Harness(chain_config(A + "/test/a", B + "/test/b", C + "/test/c", failure_policy="Ignore"), a=a, b=b, c=c)
        the_pod = pod(labels={"app": "web"})
        response, outcome = answered(self, h.review(review_bytes(the_pod)))
        self.assertTrue(response["allowed"])
        # c got the Pod as it was before b: a's change only.
        self.assertEqual(json.loads(c.requests[0][1])["metadata"]["labels"], {"app": "web", "a": "1"})
        patched = apply_patch(the_pod, response["_patch"])
        self.assertEqual(patched["metadata"]["labels"], {"app": "web", "a": "1", "c": "3"})
        self.assertEqual(stamp(the_pod, response), f"skipped http-5xx {B}; mutated {A} {C}")
        self.assertEqual((outcome.result, outcome.reason), ("patched", "http-5xx"))
        self.assertIn(f"amp: {B} http-5xx; the chain went on without its patch", response["warnings"])
        self.assertIn(B, response["auditAnnotations"]["error"])

    def test_every_step_failing_under_ignore_admits_with_a_stamp_listing_each(self) -> None:
        a, b = Canned(b"boom", code=500), Canned(b"nope", code=404)
        h = Harness(chain_config(A + "/test/a", B + "/test/b"), a=a, b=b)
        response, outcome = answered(self, h.review(review_bytes()))
        self.assertEqual((outcome.result, outcome.reason), ("ignored", "http-5xx"))
        self.assertEqual(stamp(pod(), response), f"skipped http-5xx {A}; skipped http-4xx {B}")

    def test_a_failing_middle_step_under_fail_denies_naming_it(self) -> None:
        a, b, c = Canned(label("a", "1")), Canned(b"boom", code=500), Canned(label("c", "3"))
        h = Harness(chain_config(A + "/test/a", B + "/test/b", C + "/test/c", failure_policy="Fail"), a=a, b=b, c=c)
        response, outcome = answered(self, h.review(review_bytes()))
        self.assertFalse(response["allowed"])
        self.assertIn(f"endpoint {B} failed (http-5xx)", response["status"]["message"])
        self.assertEqual((outcome.result, outcome.reason, outcome.endpoint), ("failed", "http-5xx", B))
        self.assertEqual(c.requests, [])

    def test_a_bad_patch_in_the_middle_is_a_failure_of_that_step(self) -> None:
        a = Canned(label("a", "1"))
        b = Canned([{"op": "remove", "path": "/metadata/labels/missing"}])
        h = Harness(chain_config(A + "/test/a", B + "/test/b"), a=a, b=b)
        the_pod = pod(labels={"app": "web"})
        response, outcome = answered(self, h.review(review_bytes(the_pod)))
        self.assertEqual(outcome.reason, "apply-failed")
        self.assertEqual(stamp(the_pod, response), f"skipped apply-failed {B}; mutated {A}")

    def test_a_deny_from_any_endpoint_denies_the_pod(self) -> None:
        for policy in ("Ignore", "Fail"):
            a = Canned(label("a", "1"))
            b = Canned({"allowed": False, "status": {"code": 403, "message": "no"}})
            c = Canned([])
            h = Harness(chain_config(A + "/test/a", B + "/test/b", C + "/test/c", failure_policy=policy), a=a, b=b, c=c)
            response, outcome = answered(self, h.review(review_bytes()))
            self.assertFalse(response["allowed"])
            self.assertEqual(response["status"]["code"], 403)
            self.assertIn(f"endpoint {B} denied the Pod: no", response["status"]["message"])
            self.assertEqual((outcome.result, outcome.reason), ("denied", "endpoint-denied"))
            self.assertEqual(c.requests, [])

    def test_the_chain_length_is_limited_before_any_call(self) -> None:
        a = Canned([])
        urls = [f"http://127.0.0.1:{8091 + i}/test/a" for i in range(5)]
        for policy, allowed in (("Ignore", True), ("Fail", False)):
            h = Harness(chain_config(*urls, failure_policy=policy), a=a)
            response, outcome = answered(self, h.review(review_bytes()))
            self.assertEqual(response["allowed"], allowed)
            self.assertEqual(outcome.reason, "chain-too-long")
        self.assertEqual(a.requests, [])
        h = Harness(chain_config(*urls, endpoints={"chain_limit": 5}), a=a)
        _, outcome = answered(self, h.review(review_bytes()))
        self.assertEqual(outcome.result, "allowed")
        self.assertEqual(len(a.requests), 5)

    def test_every_url_is_checked_before_any_call(self) -> None:
        a = Canned(label("a", "1"))
        for second in ("http://10.0.0.1:8080/x", "ftp://127.0.0.1/x"):
            h = Harness(chain_config(A + "/test/a", second, failure_policy="Fail"), a=a)
            response, outcome = answered(self, h.review(review_bytes()))
            self.assertFalse(response["allowed"])
            self.assertIn(outcome.reason, ("not-allowed", "bad-url"))
        self.assertEqual(a.requests, [])

    def test_shadow_mode_applies_to_the_whole_chain(self) -> None:
        a, b = Canned(label("a", "1")), Canned(label("b", "2"))
        config = make_config({"team-a": namespace(f"{A}/test/a {B}/test/b", mode="shadow")})
        h = Harness(config, a=a, b=b)
        response, outcome = answered(self, h.review(review_bytes()))
        self.assertTrue(response["allowed"])
        self.assertIsNone(response["_patch"])
        self.assertEqual(outcome.result, "shadow")
        self.assertGreater(outcome.shadow_patch_size, 0)
        self.assertEqual((len(a.requests), len(b.requests)), (1, 1))


class SharedBudgetTests(SynchronousTestCase):
    def test_a_slow_first_endpoint_leaves_the_rest_of_the_budget_to_the_next(self) -> None:
        for policy in ("Ignore", "Fail"):
            first, second = Hung(), Hung()
            h = Harness(
                chain_config(A + "/test/first", B + "/test/second", failure_policy=policy, endpoints={"timeout": "5s"}),
                first=first,
                second=second,
            )
            the_pod = pod(labels={"app": "web"})
            d = h.review(review_bytes(the_pod), budget=2.0)
            h.clock.advance(1.5)
            first.answer(json.dumps(label("a", "1")).encode())
            h.connector.flush()
            self.assertEqual(len(second.held), 1)
            h.clock.advance(0.499)
            self.assertNoResult(d)
            h.clock.advance(0.001)
            response, outcome = answered(self, d)
            self.assertEqual(outcome.reason, "timeout")
            if policy == "Ignore":
                self.assertEqual(outcome.result, "patched")
                self.assertEqual(
                    apply_patch(the_pod, response["_patch"])["metadata"]["labels"], {"app": "web", "a": "1"}
                )
                self.assertEqual(stamp(the_pod, response), f"skipped timeout {B}; mutated {A}")
            else:
                self.assertFalse(response["allowed"])
                self.assertIn(B, response["status"]["message"])
            self.assertEqual(h.clock.getDelayedCalls(), [])

    def test_steps_after_the_deadline_are_skipped_without_a_call(self) -> None:
        first, third = Hung(), Canned([])
        h = Harness(
            chain_config(A + "/test/first", B + "/test/first", C + "/test/third", endpoints={"timeout": "5s"}),
            first=first,
            third=third,
        )
        d = h.review(review_bytes(), budget=1.0)
        h.clock.advance(1.0)
        response, outcome = answered(self, d)
        self.assertEqual((outcome.result, outcome.reason), ("ignored", "timeout"))
        self.assertEqual(stamp(pod(), response), f"skipped timeout {A}; skipped deadline {B} {C}")
        self.assertEqual(third.requests, [])


# ---------------------------------------------------------------- composition (pure)


def stepwise(the_pod: dict, patches: list[list[dict]]) -> tuple[dict, list]:
    """Each patch checked against the Pod the one before left, and the Pod after all, by jsonpatch."""
    checked, current, result = [], the_pod, copy.deepcopy(the_pod)
    for ops in patches:
        step = check_patch(current, ops)
        checked.append(step)
        current = step.pod
        result = jsonpatch.apply_patch(result, step.operations)
    return result, checked


CASES = {
    "labels": [label("a", "1"), label("b", "2")],
    "repair then use": [
        [{"op": "add", "path": "/spec/volumes/-", "value": {"name": "v", "emptyDir": {}}}],
        [
            {"op": "add", "path": "/spec/volumes/-", "value": {"name": "w", "emptyDir": {}}},
            {"op": "add", "path": "/spec/containers/0/volumeMounts/-", "value": {"name": "w", "mountPath": "/w"}},
        ],
    ],
    "second undoes first": [label("a", "1"), [{"op": "remove", "path": "/metadata/labels/a"}]],
    "empty steps": [[], label("a", "1"), []],
    "move and test": [
        label("a", "1"),
        [
            {"op": "test", "path": "/metadata/labels/a", "value": "1"},
            {"op": "move", "from": "/metadata/labels/a", "path": "/metadata/labels/b"},
        ],
    ],
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_composition_equals_stepwise_application(name: str) -> None:
    the_pod = pod(labels={"app": "web"})
    expected, checked = stepwise(the_pod, CASES[name])
    whole = compose(the_pod, checked)
    assert jsonpatch.apply_patch(copy.deepcopy(the_pod), whole.operations) == expected
    assert whole.pod == expected
    assert the_pod == pod(labels={"app": "web"}), "the Pod is never mutated"


def test_registry_then_sidecar_composes_and_the_sidecar_image_is_never_rewritten_twice() -> None:
    """
    The realistic chain, registry rewrite then sidecar injection: the app's
    image goes to the mirror, the sidecar (added after the rewrite) keeps
    its image; when the Pod passes the registry again (the API server
    reinvokes the webhook, or a later chain step), the sidecar's image is
    rewritten once, and never again.
    """
    mirrors = {"gcr.io": "asia.gcr.io", "docker.io": "mirror.local"}
    the_pod = pod(containers=[{"name": "app", "image": "gcr.io/app:1", "ports": [{"containerPort": 8080}]}])
    registry = registry_reply(the_pod, mirrors)["patch"]
    after_registry = jsonpatch.apply_patch(copy.deepcopy(the_pod), registry)
    sidecar = sidecar_reply(after_registry)["patch"]
    result, checked = stepwise(the_pod, [registry, sidecar])
    assert compose(the_pod, checked).pod == result
    images = {c["name"]: c["image"] for c in result["spec"]["containers"]}
    assert images == {"app": "asia.gcr.io/app:1", "amp-proxy": "envoyproxy/envoy:v1.27.0"}
    again, _ = stepwise(result, [registry_reply(result, mirrors)["patch"]])
    assert {c["name"]: c["image"] for c in again["spec"]["containers"]} == {
        "app": "asia.gcr.io/app:1",
        "amp-proxy": "mirror.local/envoyproxy/envoy:v1.27.0",
    }
    assert registry_reply(again, mirrors)["patch"] == []
    assert sidecar_reply(again)["patch"] == []


def test_composition_is_checked_as_a_whole() -> None:
    the_pod = pod()
    one = check_patch(the_pod, label("a", "1"))
    # A step that was not checked against the Pod its predecessor left.
    stray = check_patch(the_pod, [{"op": "add", "path": "/metadata/labels", "value": {"b": "2"}}])
    with pytest.raises(PatchError):
        compose(the_pod, [one, stray, check_patch(the_pod, [{"op": "remove", "path": "/metadata/labels/a"}])])
    with pytest.raises(PatchError, match="max_operations"):
        compose(the_pod, [one, check_patch(one.pod, label("b", "2"))], max_operations=1)


class NamingTests(SynchronousTestCase):
    def test_steps_on_one_origin_are_named_by_their_paths(self) -> None:
        """The example endpoints share one origin: the chain names each by its path too."""
        h = Harness(
            make_config({"team-a": namespace("http://127.0.0.1:8090/registry\nhttp://127.0.0.1:8090/sidecar\n")})
        )
        the_pod = pod(containers=[{"name": "app", "image": "gcr.io/app:1", "ports": [{"containerPort": 8080}]}])
        response, outcome = answered(self, h.review(review_bytes(the_pod)))
        registry, sidecar = "http://127.0.0.1:8090/registry", "http://127.0.0.1:8090/sidecar"
        self.assertEqual(stamp(the_pod, response), f"mutated {registry} {sidecar}")
        self.assertEqual(outcome.endpoint, f"{registry},{sidecar}")
        self.assertTrue(any(w.startswith(f"amp: {registry}: registry rewritten") for w in response["warnings"]))
        self.assertEqual(response["auditAnnotations"], {"sidecar-injected": f"{sidecar}: true"})
        images = {c["name"]: c["image"] for c in apply_patch(the_pod, response["_patch"])["spec"]["containers"]}
        self.assertEqual(images, {"app": "asia.gcr.io/app:1", "amp-proxy": "envoyproxy/envoy:v1.27.0"})
