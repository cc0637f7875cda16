"""
Ephemeral containers (C{kubectl debug}): with C{ephemeral_containers: true},
amp reviews Pod UPDATEs through the C{pods/ephemeralcontainers}
subresource; the endpoint is told so in its headers, and amp refuses any
operation outside C{/spec/ephemeralContainers}.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from twisted.trial.unittest import SynchronousTestCase

from amp.patch import PatchError, check_patch
from tests.support.helpers import apply_patch, make_config, namespace, pod, review_bytes
from tests.unit.admission.test_admission import EP, Canned, Harness, answered

DEBUG = {"name": "debugger", "image": "busybox:1.36", "targetContainerName": "app"}


def debugged_pod(**kwargs: Any) -> dict:
    the_pod = pod(**kwargs)
    the_pod["metadata"]["annotations"] = {"amp.txn2.com/status": "mutated http://127.0.0.1:8090"}
    the_pod["spec"]["ephemeralContainers"] = [dict(DEBUG)]
    return the_pod


def ephemeral_review(the_pod: dict) -> bytes:
    return review_bytes(the_pod, operation="UPDATE", sub_resource="ephemeralcontainers")


def config(path: str, enabled: bool = True, **sections: Any) -> Any:
    return make_config({"team-a": namespace(EP + path)}, ephemeral_containers=enabled, **sections)


class EphemeralTests(SynchronousTestCase):
    def test_off_by_default_answered_unchanged_without_a_call(self) -> None:
        called = Canned([])
        h = Harness(make_config({"team-a": namespace(EP + "/test/called")}), called=called)
        response, outcome = answered(self, h.review(ephemeral_review(debugged_pod())))
        self.assertEqual((response["allowed"], response["_patch"], outcome.result), (True, None, "skipped"))
        self.assertEqual(called.requests, [])

    def test_the_registry_example_rewrites_the_debug_image_and_amp_does_not_stamp(self) -> None:
        h = Harness(config("/registry"))
        the_pod = debugged_pod()
        response, outcome = answered(self, h.review(ephemeral_review(the_pod)))
        self.assertEqual(outcome.result, "patched")
        self.assertTrue(all(op["path"].startswith("/spec/ephemeralContainers/") for op in response["_patch"]))
        after = apply_patch(the_pod, response["_patch"])
        self.assertEqual(after["spec"]["ephemeralContainers"][0]["image"], "mirror.local/library/busybox:1.36")
        self.assertEqual(after["metadata"], the_pod["metadata"])

    def test_the_endpoint_is_told_update_and_the_subresource(self) -> None:
        called = Canned([])
        h = Harness(config("/test/called"), called=called)
        response, outcome = answered(self, h.review(ephemeral_review(debugged_pod())))
        self.assertEqual(outcome.result, "allowed")
        self.assertIsNone(response["_patch"])
        [(headers, body)] = called.requests
        self.assertEqual(headers[b"x-amp-operation"], b"UPDATE")
        self.assertEqual(headers[b"x-amp-subresource"], b"ephemeralcontainers")
        self.assertEqual(json.loads(body)["spec"]["ephemeralContainers"], [DEBUG])

    def test_a_change_outside_ephemeral_containers_is_refused(self) -> None:
        label = [{"op": "add", "path": "/metadata/labels", "value": {"x": "y"}}]
        for policy, allowed in (("Ignore", True), ("Fail", False)):
            h = Harness(config("/test/bad", failure_policy=policy), bad=Canned(label))
            response, outcome = answered(self, h.review(ephemeral_review(debugged_pod())))
            self.assertEqual(response["allowed"], allowed)
            self.assertEqual(outcome.reason, "refused-path")
            # No stamp either: nothing outside spec.ephemeralContainers.
            self.assertIsNone(response.get("_patch"))

    def test_other_updates_and_subresources_are_still_skipped(self) -> None:
        called = Canned([])
        h = Harness(config("/test/called"), called=called)
        for body in (
            review_bytes(debugged_pod(), operation="UPDATE"),
            review_bytes(debugged_pod(), operation="UPDATE", sub_resource="status"),
            review_bytes(debugged_pod(), operation="CREATE", sub_resource="ephemeralcontainers"),
        ):
            _, outcome = answered(self, h.review(body))
            self.assertEqual(outcome.result, "skipped")
        self.assertEqual(called.requests, [])

    def test_an_opted_out_pod_is_left_alone_here_too(self) -> None:
        called = Canned([])
        h = Harness(config("/test/called"), called=called)
        _, outcome = answered(self, h.review(ephemeral_review(debugged_pod(labels={"amp.txn2.com/enabled": "false"}))))
        self.assertEqual((outcome.result, outcome.reason), ("skipped", "opted-out"))
        self.assertEqual(called.requests, [])


@pytest.mark.parametrize(
    "op",
    [
        {"op": "replace", "path": "/spec/containers/0/image", "value": "x"},
        {"op": "move", "from": "/spec/containers/0/image", "path": "/spec/ephemeralContainers/0/image"},
        {"op": "add", "path": "/spec/ephemeralContainersX", "value": []},
    ],
)
def test_confined_refuses_paths_outside(op: dict) -> None:
    with pytest.raises(PatchError) as caught:
        check_patch(debugged_pod(), [op], confined="/spec/ephemeralContainers")
    assert caught.value.reason == "refused-path"
    assert "/spec/ephemeralContainers" in str(caught.value)


def test_confined_allows_paths_inside() -> None:
    ops = [{"op": "replace", "path": "/spec/ephemeralContainers/0/image", "value": "mirror/busybox"}]
    checked = check_patch(debugged_pod(), ops, confined="/spec/ephemeralContainers")
    assert checked.pod["spec"]["ephemeralContainers"][0]["image"] == "mirror/busybox"
