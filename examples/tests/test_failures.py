"""Tests for amp_examples.failures: the endpoints that misbehave on purpose."""

from __future__ import annotations

import jsonpatch
import pytest
from podfixtures import apply, bare_pod, jupyter_pod

from amp_examples import failures


def test_deny_reply():
    assert failures.deny_reply() == {"allowed": False, "status": {"code": 403, "message": "denied by example policy"}}


def test_bad_patch_is_valid_json_patch_that_does_not_apply():
    ops = failures.bad_patch()
    jsonpatch.JsonPatch(ops)  # well-formed
    with pytest.raises(jsonpatch.JsonPatchConflict):
        apply(jupyter_pod(), ops)


def test_validate_labels():
    assert failures.validate_labels_reply(jupyter_pod()) == {"patch": [], "allowed": True}
    reply = failures.validate_labels_reply(bare_pod({"name": "a"}, labels={"tier": "web"}))
    assert reply == {"allowed": False, "status": {"code": 403, "message": "pod has no app label"}}
    assert failures.validate_labels_reply(bare_pod({"name": "a"}))["allowed"] is False
