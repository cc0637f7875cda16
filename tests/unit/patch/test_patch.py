"""
Tests for amp.patch: validation, refused paths, dry-apply, repair and the
sanity check of the patched Pod.

Every patch that check_patch returns is applied to the original Pod with the
independent C{jsonpatch} implementation, because the API server rejects the
request outright when a patch does not apply.
"""

from __future__ import annotations

import copy
import json
import math
from typing import Any

import jsonpatch
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amp.patch import (
    DEFAULT_DENIED,
    CheckedPatch,
    PatchError,
    annotate,
    annotation_ops,
    check_patch,
    escape_pointer_token,
    parse_pointer,
    unchanged,
)

HYPOTHESIS = settings(derandomize=True, max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def make_pod(**spec_extra):
    """
    A Pod as the API server sends it in an AdmissionReview (no env, no volumes,
    no annotations unless given).
    """
    spec = {
        "containers": [
            {
                "name": "app",
                "image": "registry.example.com/app:1.0",
                "resources": {},
                "terminationMessagePath": "/dev/termination-log",
            }
        ],
        "restartPolicy": "Always",
        "serviceAccountName": "default",
    }
    spec.update(spec_extra)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web-1", "namespace": "team-a", "uid": "0f4b3c52", "labels": {"app": "web"}},
        "spec": spec,
        "status": {"phase": "Pending"},
    }


def applies(pod, result: CheckedPatch) -> None:
    """
    C{result.operations} applies to C{pod} with jsonpatch and gives C{result.pod}.
    """
    json.dumps(result.operations, allow_nan=False)
    assert jsonpatch.apply_patch(pod, result.operations) == result.pod


def error(pod, ops, **kw) -> PatchError:
    with pytest.raises(PatchError) as info:
        check_patch(pod, ops, **kw)
    return info.value


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "ops, message",
    [
        ({"op": "add"}, "the patch must be a JSON array of operations, not object"),
        (None, "the patch must be a JSON array of operations, not null"),
        ([{"op": "add", "path": "/spec/a", "value": 1}, "remove"], "operation 1: must be an object, not string"),
        ([{"path": "/spec/a"}], 'operation 0: "op" must be one of add, remove, replace, move, copy, test; missing'),
        (
            [{"op": "upsert", "path": "/spec/a"}],
            'operation 0: "op" must be one of add, remove, replace, move, copy, test; got "upsert"',
        ),
        ([{"op": "Add", "path": "/spec/a", "value": 1}], 'got "Add"'),
        ([{"op": ["add"], "path": "/spec/a", "value": 1}], 'got ["add"]'),
        ([{"op": "add", "value": 1}], 'operation 0 (add): "path" must be a string; it is missing'),
        ([{"op": "remove", "path": 3}], 'operation 0 (remove): "path" must be a string; it is a number'),
        ([{"op": "remove", "path": "spec/a"}], 'operation 0 (remove spec/a): "path" is not a JSON pointer'),
        (
            [{"op": "remove", "path": "/spec/a~2"}],
            'operation 0 (remove /spec/a~2): "path" is not a JSON pointer ("~" must be followed by 0 or 1)',
        ),
        ([{"op": "remove", "path": "/spec/a~"}], 'operation 0 (remove /spec/a~): "path" is not a JSON pointer'),
        ([{"op": "add", "path": "/spec/a"}], 'operation 0 (add /spec/a): "value" is missing'),
        ([{"op": "replace", "path": "/spec/a"}], 'operation 0 (replace /spec/a): "value" is missing'),
        ([{"op": "test", "path": "/spec/a"}], 'operation 0 (test /spec/a): "value" is missing'),
        ([{"op": "move", "path": "/spec/a"}], 'operation 0 (move /spec/a): "from" must be a string; it is missing'),
        (
            [{"op": "copy", "path": "/spec/a", "from": None}],
            'operation 0 (copy /spec/a): "from" must be a string; it is a null',
        ),
        (
            [{"op": "copy", "path": "/spec/a", "from": "spec"}],
            'operation 0 (copy /spec/a): "from" is not a JSON pointer',
        ),
        (
            [{"op": "add", "path": "/spec/a", "value": {"b": [1, float("nan")]}}],
            "operation 0 (add /spec/a): value/b/1 is nan, which JSON cannot represent",
        ),
        ([{"op": "add", "path": "/spec/a", "value": float("inf")}], "value is inf, which JSON cannot represent"),
        ([{"op": "add", "path": "/spec/a", "value": (1, 2)}], "value is a tuple, which is not a JSON value"),
        ([{"op": "add", "path": "/spec/a", "value": {1: "x"}}], "value has a int key 1; JSON object keys are strings"),
        ([{"op": "add", "path": "/spec/a\nb"}], 'operation 0 (add /spec/a\\nb): "value" is missing'),
    ],
)
def test_invalid_patches_name_the_operation_and_the_problem(ops, message):
    e = error(make_pod(), ops)
    assert e.reason == "invalid-patch"
    assert message in str(e)
    assert "\n" not in str(e)
    assert isinstance(e, ValueError)


def test_invalid_operation_index_is_its_place_in_the_endpoints_patch():
    ops = [
        {"op": "add", "path": "/spec/a", "value": 1},
        {"op": "add", "path": "/spec/b", "value": 2},
        {"op": "replace", "path": "/spec/c"},
    ]
    assert str(error(make_pod(), ops)).startswith('operation 2 (replace /spec/c): "value" is missing')


def test_unknown_members_are_left_out_of_the_returned_patch():
    pod = make_pod()
    ops = [
        {"op": "add", "path": "/spec/priority", "value": 5, "from": "/x", "comment": "why"},
        {"op": "remove", "path": "/spec/restartPolicy", "value": "ignored"},
        {"op": "copy", "from": "/spec/serviceAccountName", "path": "/spec/serviceAccount", "value": 1},
    ]
    result = check_patch(pod, ops)
    assert result.operations == [
        {"op": "add", "path": "/spec/priority", "value": 5},
        {"op": "remove", "path": "/spec/restartPolicy"},
        {"op": "copy", "path": "/spec/serviceAccount", "from": "/spec/serviceAccountName"},
    ]
    applies(pod, result)


def test_too_many_operations():
    ops = [{"op": "add", "path": f"/metadata/labels/l{i}", "value": "x"} for i in range(11)]
    e = error(make_pod(), ops, max_operations=10)
    assert e.reason == "too-many-operations"
    assert str(e) == "the patch has 11 operations, more than patch.max_operations (10)"
    assert len(check_patch(make_pod(), ops[:10], max_operations=10).operations) == 10


def test_empty_patch_changes_nothing():
    pod = make_pod()
    result = check_patch(pod, [])
    assert result == CheckedPatch([], 0, (), pod)


# ---------------------------------------------------------------- refused paths


@pytest.mark.parametrize(
    "op, message",
    [
        (
            {"op": "replace", "path": "/metadata/name", "value": "other"},
            "operation 0 (replace /metadata/name): path is refused by amp (patch.denied_paths)",
        ),
        ({"op": "remove", "path": "/metadata/namespace"}, "path is refused by amp"),
        ({"op": "add", "path": "/metadata/uid", "value": "u"}, "path is refused by amp"),
        (
            {"op": "add", "path": "/status/phase", "value": "Running"},
            "operation 0 (add /status/phase): path is under /status, which is refused by amp (patch.denied_paths)",
        ),
        (
            {"op": "replace", "path": "/metadata", "value": {"name": "other"}},
            "operation 0 (replace /metadata): path contains /metadata/name, which is refused by amp",
        ),
        ({"op": "remove", "path": "/metadata"}, "path contains /metadata/name"),
        ({"op": "replace", "path": "", "value": {}}, 'operation 0 (replace ""): path contains /metadata/name'),
        (
            {"op": "move", "from": "/status/phase", "path": "/metadata/labels/phase"},
            "operation 0 (move /metadata/labels/phase from /status/phase): from is under /status",
        ),
        ({"op": "move", "from": "/metadata/labels/app", "path": "/metadata/name"}, "path is refused by amp"),
        ({"op": "copy", "from": "/metadata/labels/app", "path": "/metadata/name"}, "path is refused by amp"),
    ],
)
def test_denied_paths_are_refused(op, message):
    e = error(make_pod(), [{"op": "add", "path": "/metadata/labels/ok", "value": "1"}, op])
    assert e.reason == "refused-path"
    assert message.replace("operation 0", "operation 1") in str(e)


def test_refusal_compares_tokens_not_strings():
    pod = make_pod()
    for path in ("/statusx", "/metadata/names", "/metadata/name2", "/metadata/uidx"):
        result = check_patch(pod, [{"op": "add", "path": path, "value": "v"}])
        assert result.operations == [{"op": "add", "path": path, "value": "v"}]


def test_refusal_unescapes_tokens():
    pod = make_pod()
    pod["metadata"]["annotations"] = {"amp.txn2.com/lock": "1"}
    denied = ("/metadata/annotations/amp.txn2.com~1lock",)
    e = error(pod, [{"op": "remove", "path": "/metadata/annotations/amp.txn2.com~1lock"}], denied=denied)
    assert e.reason == "refused-path"
    # the same characters with a real "/" are a different, deeper path
    check_patch(pod, [{"op": "add", "path": "/metadata/annotations/amp.txn2.com", "value": "x"}], denied=denied)
    # "~0" is "~": not the denied key
    check_patch(pod, [{"op": "add", "path": "/metadata/annotations/amp.txn2.com~0lock", "value": "x"}], denied=denied)
    # replacing the whole annotations object would remove the denied key
    e = error(pod, [{"op": "replace", "path": "/metadata/annotations", "value": {}}], denied=denied)
    assert "contains /metadata/annotations/amp.txn2.com~1lock" in str(e)


def test_test_operations_and_copy_sources_are_not_refused():
    pod = make_pod()
    ops = [
        {"op": "test", "path": "/metadata/name", "value": "web-1"},
        {"op": "test", "path": "/status/phase", "value": "Pending"},
        {"op": "copy", "from": "/metadata/name", "path": "/metadata/labels/pod"},
    ]
    result = check_patch(pod, ops)
    assert result.pod["metadata"]["labels"]["pod"] == "web-1"
    applies(pod, result)


def test_allowed_paths_override_denied_paths():
    pod = make_pod()
    op = {"op": "replace", "path": "/metadata/name", "value": "renamed"}
    assert error(pod, [op]).reason == "refused-path"
    result = check_patch(pod, [op], allowed=("/metadata/name",))
    assert result.pod["metadata"]["name"] == "renamed"
    # an allowed path does not open its ancestors
    e = error(pod, [{"op": "replace", "path": "/metadata", "value": {}}], allowed=("/metadata/name",))
    assert "contains /metadata/namespace" in str(e)
    # unless every denied path it contains is allowed
    check_patch(
        pod,
        [{"op": "replace", "path": "/metadata", "value": {"name": "n"}}],
        denied=("/metadata/name",),
        allowed=("/metadata/name",),
    )
    # an allowed path does not open its siblings
    assert (
        error(pod, [{"op": "replace", "path": "/status/phase", "value": "x"}], allowed=("/status/reason",)).reason
        == "refused-path"
    )
    check_patch(pod, [{"op": "add", "path": "/status/reason", "value": "x"}], allowed=("/status/reason",))


def test_custom_denied_paths_replace_the_defaults():
    pod = make_pod()
    check_patch(pod, [{"op": "replace", "path": "/metadata/name", "value": "x"}], denied=())
    e = error(
        pod,
        [{"op": "replace", "path": "/spec/serviceAccountName", "value": "admin"}],
        denied=("/spec/serviceAccountName",),
    )
    assert e.reason == "refused-path"


def test_denied_paths_must_be_pointers():
    with pytest.raises(ValueError, match="patch.denied_paths: 'metadata/name'"):
        check_patch(make_pod(), [], denied=("metadata/name",))
    with pytest.raises(ValueError, match="patch.allowed_paths"):
        check_patch(make_pod(), [], allowed=("~x",))


# ---------------------------------------------------------------- repair


@pytest.mark.parametrize(
    "path, value, created",
    [
        ("/spec/containers/0/env/-", {"name": "ADDED_VAR", "value": "x"}, "/spec/containers/0/env"),
        ("/spec/volumes/-", {"name": "data", "emptyDir": {}}, "/spec/volumes"),
        ("/spec/initContainers/-", {"name": "init", "image": "alpine:3.12.0"}, "/spec/initContainers"),
        ("/spec/tolerations/0", {"key": "k", "operator": "Exists"}, "/spec/tolerations"),
    ],
)
def test_repair_creates_a_missing_list(path, value, created):
    pod = make_pod()
    result = check_patch(pod, [{"op": "add", "path": path, "value": value}])
    assert result.operations == [
        {"op": "add", "path": created, "value": []},
        {"op": "add", "path": path, "value": value},
    ]
    assert result.repaired == 1
    assert jsonpatch.JsonPointer(created).resolve(result.pod) == [value]
    applies(pod, result)


def test_repair_creates_missing_annotations():
    pod = make_pod()
    result = check_patch(pod, [{"op": "add", "path": "/metadata/annotations/amp.txn2.com~1user", "value": "ann"}])
    assert result.operations[0] == {"op": "add", "path": "/metadata/annotations", "value": {}}
    assert result.repaired == 1
    assert result.pod["metadata"]["annotations"] == {"amp.txn2.com/user": "ann"}
    applies(pod, result)


def test_repair_replaces_a_null_parent():
    pod = make_pod()
    pod["metadata"]["annotations"] = None
    result = check_patch(pod, [{"op": "add", "path": "/metadata/annotations/a", "value": "1"}])
    assert result.repaired == 1
    assert result.pod["metadata"]["annotations"] == {"a": "1"}
    applies(pod, result)


def test_repair_creates_a_chain_of_objects():
    pod = make_pod()
    result = check_patch(
        pod, [{"op": "add", "path": "/spec/securityContext/seccompProfile/type", "value": "RuntimeDefault"}]
    )
    assert [op["path"] for op in result.operations] == [
        "/spec/securityContext",
        "/spec/securityContext/seccompProfile",
        "/spec/securityContext/seccompProfile/type",
    ]
    assert result.repaired == 2
    applies(pod, result)


def test_no_repair_when_the_parent_exists():
    pod = make_pod(volumes=[{"name": "cache", "emptyDir": {}}])
    pod["spec"]["containers"][0]["env"] = [{"name": "A", "value": "1"}]
    pod["metadata"]["annotations"] = {"a": "1"}
    ops = [
        {"op": "add", "path": "/spec/containers/0/env/-", "value": {"name": "B", "value": "2"}},
        {"op": "add", "path": "/spec/volumes/-", "value": {"name": "data", "emptyDir": {}}},
        {"op": "add", "path": "/metadata/annotations/b", "value": "2"},
    ]
    result = check_patch(pod, ops)
    assert result.operations == ops
    assert result.repaired == 0
    applies(pod, result)


def test_repair_happens_once_for_several_appends():
    pod = make_pod()
    ops = [
        {"op": "add", "path": "/spec/volumes/-", "value": {"name": "a", "emptyDir": {}}},
        {"op": "add", "path": "/spec/volumes/-", "value": {"name": "b", "emptyDir": {}}},
        {"op": "add", "path": "/spec/containers/0/volumeMounts/-", "value": {"name": "a", "mountPath": "/a"}},
    ]
    result = check_patch(pod, ops)
    assert result.repaired == 2
    assert [op["path"] for op in result.operations] == [
        "/spec/volumes",
        "/spec/volumes/-",
        "/spec/volumes/-",
        "/spec/containers/0/volumeMounts",
        "/spec/containers/0/volumeMounts/-",
    ]
    assert [v["name"] for v in result.pod["spec"]["volumes"]] == ["a", "b"]
    applies(pod, result)


@pytest.mark.parametrize(
    "path, message",
    [
        ("/spec/containers/3/env/-", "/spec/containers/3 does not exist (/spec/containers has 1 item)"),
        (
            "/spec/initContainers/0/env/-",
            "/spec/initContainers does not exist, and amp does not create list elements (/spec/initContainers/0)",
        ),
        (
            "/spec/tolerations/1",
            "/spec/tolerations does not exist, and amp does not create list elements (/spec/tolerations/1)",
        ),
        ("/spec/restartPolicy/x", "/spec/restartPolicy is a string, not an object or a list"),
    ],
)
def test_no_repair_that_would_create_list_elements_or_overwrite_values(path, message):
    e = error(make_pod(), [{"op": "add", "path": path, "value": {"name": "x"}}])
    assert e.reason == "apply-failed"
    assert str(e) == f"operation 0 (add {path}): {message}"


def test_repair_disabled_fails_the_patch():
    e = error(
        make_pod(), [{"op": "add", "path": "/spec/volumes/-", "value": {"name": "v", "emptyDir": {}}}], repair=False
    )
    assert e.reason == "apply-failed"
    assert str(e) == "operation 0 (add /spec/volumes/-): /spec/volumes does not exist (patch.repair is off)"


def test_repair_never_creates_a_refused_path():
    pod = make_pod()
    e = error(pod, [{"op": "add", "path": "/spec/extra/b/c", "value": 1}], denied=("/spec/extra/a",))
    assert e.reason == "refused-path"
    assert "creating it (/spec/extra) contains /spec/extra/a" in str(e)
    del pod["status"]
    assert error(pod, [{"op": "add", "path": "/status/phase", "value": "x"}]).reason == "refused-path"


def test_repair_applies_only_to_add():
    for op in (
        {"op": "replace", "path": "/spec/volumes/0", "value": {"name": "v"}},
        {"op": "remove", "path": "/metadata/annotations/a"},
        {"op": "copy", "from": "/spec/restartPolicy", "path": "/spec/x/y"},
        {"op": "move", "from": "/spec/restartPolicy", "path": "/spec/x/y"},
    ):
        assert error(make_pod(), [op]).reason == "apply-failed"


# ---------------------------------------------------------------- dry-apply


def test_add_replacing_an_existing_list_warns():
    pod = make_pod(volumes=[{"name": "a", "emptyDir": {}}, {"name": "b", "emptyDir": {}}])
    ops = [{"op": "add", "path": "/spec/volumes", "value": [{"name": "c", "emptyDir": {}}]}]
    result = check_patch(pod, ops)
    assert result.operations == ops
    assert result.warnings == ("operation 0 (add /spec/volumes) replaced an existing list of 2 items",)
    assert result.pod["spec"]["volumes"] == [{"name": "c", "emptyDir": {}}]
    applies(pod, result)


def test_no_warning_for_appends_empty_lists_or_non_lists():
    pod = make_pod(volumes=[], tolerations=[{"key": "a"}])
    result = check_patch(
        pod,
        [
            {"op": "add", "path": "/spec/volumes", "value": [{"name": "c", "emptyDir": {}}]},
            {"op": "add", "path": "/spec/tolerations/0", "value": {"key": "b"}},
            {"op": "add", "path": "/spec/restartPolicy", "value": "Never"},
            {"op": "replace", "path": "/spec/tolerations", "value": []},
        ],
    )
    assert result.warnings == ()


def test_warnings_are_short():
    key = "k" * 300
    pod = make_pod()
    pod["spec"][key] = [1, 2, 3]
    result = check_patch(pod, [{"op": "add", "path": "/spec/" + key, "value": []}])
    assert len(result.warnings) == 1
    assert len(result.warnings[0]) < 120


def test_operations_apply_in_order():
    pod = make_pod()
    ops = [
        {"op": "add", "path": "/spec/containers/-", "value": {"name": "sidecar", "image": "proxy:1"}},
        {"op": "add", "path": "/spec/containers/1/env", "value": [{"name": "A", "value": "1"}]},
        {"op": "add", "path": "/spec/containers/1/env/-", "value": {"name": "B", "value": "2"}},
        {"op": "move", "from": "/spec/containers/1", "path": "/spec/containers/0"},
        {"op": "copy", "from": "/spec/containers/0/env", "path": "/spec/containers/1/env"},
        {"op": "remove", "path": "/spec/containers/1/env/0"},
        {"op": "replace", "path": "/spec/containers/1/env/0/value", "value": "3"},
        {"op": "test", "path": "/spec/containers/0/env/1/value", "value": "2"},
    ]
    result = check_patch(pod, ops)
    assert [c["name"] for c in result.pod["spec"]["containers"]] == ["sidecar", "app"]
    assert result.pod["spec"]["containers"][0]["env"] == [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]
    assert result.pod["spec"]["containers"][1]["env"] == [{"name": "B", "value": "3"}]
    applies(pod, result)


def test_the_callers_pod_and_operation_values_are_not_changed():
    pod = make_pod(volumes=[{"name": "a", "emptyDir": {}}])
    pod["spec"]["containers"][0]["env"] = [{"name": "A", "value": "1"}]
    before = copy.deepcopy(pod)
    sidecar = {"name": "sidecar", "image": "proxy:1", "env": []}
    ops = [
        {"op": "add", "path": "/spec/containers/-", "value": sidecar},
        {"op": "add", "path": "/spec/containers/1/env/-", "value": {"name": "B", "value": "2"}},
        {"op": "replace", "path": "/spec/containers/0/env/0/value", "value": "changed"},
        {"op": "add", "path": "/spec/volumes/0/emptyDir/medium", "value": "Memory"},
        {"op": "remove", "path": "/metadata/labels/app"},
        {"op": "add", "path": "/metadata/annotations/x", "value": "y"},
    ]
    ops_before = copy.deepcopy(ops)
    result = check_patch(pod, ops)
    assert pod == before
    assert ops == ops_before
    assert sidecar == {"name": "sidecar", "image": "proxy:1", "env": []}
    assert result.pod["spec"]["containers"][1]["env"] == [{"name": "B", "value": "2"}]
    assert result.pod["spec"]["containers"][0]["env"][0]["value"] == "changed"
    assert result.pod["spec"]["volumes"][0]["emptyDir"] == {"medium": "Memory"}
    applies(pod, result)
    # the returned patch does not share changed containers with the result
    assert result.operations[2]["value"] == "changed"
    assert result.operations[0]["value"] == {"name": "sidecar", "image": "proxy:1", "env": []}


def test_copy_is_independent_of_its_source():
    pod = make_pod()
    ops = [
        {"op": "copy", "from": "/spec/containers/0", "path": "/spec/containers/-"},
        {"op": "replace", "path": "/spec/containers/1/name", "value": "copy"},
        {"op": "add", "path": "/spec/containers/1/resources/limits", "value": {"cpu": "1"}},
    ]
    result = check_patch(pod, ops)
    assert result.pod["spec"]["containers"][0] == pod["spec"]["containers"][0]
    assert result.pod["spec"]["containers"][1]["resources"] == {"limits": {"cpu": "1"}}
    applies(pod, result)


@pytest.mark.parametrize(
    "op, message",
    [
        (
            {"op": "test", "path": "/spec/restartPolicy", "value": "Never"},
            'operation 0 (test /spec/restartPolicy): test failed: the Pod has "Always" at /spec/restartPolicy',
        ),
        ({"op": "test", "path": "/spec/missing", "value": None}, "/spec/missing does not exist"),
        ({"op": "remove", "path": "/spec/missing"}, "operation 0 (remove /spec/missing): /spec/missing does not exist"),
        ({"op": "replace", "path": "/spec/missing", "value": 1}, "/spec/missing does not exist"),
        (
            {"op": "remove", "path": "/spec/containers/1"},
            "/spec/containers/1 does not exist (/spec/containers has 1 item)",
        ),
        ({"op": "remove", "path": "/spec/containers/-"}, '"-" (past the end of the list) names no element here'),
        ({"op": "add", "path": "/spec/containers/01", "value": {}}, "01 is not a list index"),
        ({"op": "add", "path": "/spec/containers/-1", "value": {}}, "-1 is not a list index"),
        ({"op": "add", "path": "/spec/containers/2", "value": {}}, "/spec/containers/2 does not exist"),
        ({"op": "move", "from": "/spec", "path": "/spec/inner"}, "cannot move a value into itself"),
        ({"op": "move", "from": "/spec/nothing", "path": "/spec/x"}, "/spec/nothing does not exist"),
        ({"op": "copy", "from": "/spec/restartPolicy/x", "path": "/spec/x"}, "/spec/restartPolicy is a string"),
    ],
)
def test_operations_that_do_not_apply(op, message):
    e = error(make_pod(), [op])
    assert e.reason == "apply-failed"
    assert message in str(e)
    with pytest.raises((jsonpatch.JsonPatchException, jsonpatch.JsonPointerException)):
        jsonpatch.apply_patch(make_pod(), [op])


def test_test_operations_compare_json_types_strictly():
    pod = make_pod(priority=1, enableServiceLinks=True)
    check_patch(pod, [{"op": "test", "path": "/spec/priority", "value": 1}])
    for path, value in (("/spec/priority", 1.0), ("/spec/priority", True), ("/spec/enableServiceLinks", 1)):
        assert error(pod, [{"op": "test", "path": path, "value": value}]).reason == "apply-failed"
    assert (
        error(pod, [{"op": "test", "path": "/metadata/labels", "value": {"app": "web", "x": "y"}}]).reason
        == "apply-failed"
    )


def test_test_values_the_api_server_might_encode_differently_are_refused():
    pod = make_pod()
    pod["metadata"]["labels"]["note"] = "a<b"
    e = error(pod, [{"op": "test", "path": "/metadata/labels/note", "value": "a<b"}])
    assert e.reason == "apply-failed"
    assert "may compare differently" in str(e)


def test_test_only_patches_change_nothing():
    pod = make_pod()
    result = check_patch(pod, [{"op": "test", "path": "/metadata/name", "value": "web-1"}])
    assert result.operations == []
    assert result.pod is pod


def test_whole_document_operations_are_refused_even_when_allowed():
    # the API server's JSON Patch implementation cannot address ""
    e = error(make_pod(), [{"op": "replace", "path": "", "value": make_pod()}], allowed=("",))
    assert e.reason == "apply-failed"
    assert "whole document" in str(e)


# ---------------------------------------------------------------- the patched Pod


@pytest.mark.parametrize(
    "ops, message",
    [
        (
            [{"op": "add", "path": "/spec/containers/-", "value": {"name": "app", "image": "other"}}],
            'container name "app" is used by both spec.containers[0] and spec.containers[1]',
        ),
        (
            [{"op": "add", "path": "/spec/initContainers", "value": [{"name": "app", "image": "init"}]}],
            'container name "app" is used by both spec.containers[0] and spec.initContainers[0]',
        ),
        (
            [{"op": "add", "path": "/spec/containers/0/volumeMounts", "value": [{"name": "data", "mountPath": "/d"}]}],
            'spec.containers[0].volumeMounts[0] mounts volume "data", which is not in spec.volumes',
        ),
        ([{"op": "remove", "path": "/spec/containers/0"}], "spec.containers must be a non-empty list"),
        ([{"op": "remove", "path": "/spec/containers"}], "spec.containers must be a non-empty list"),
        (
            [{"op": "add", "path": "/spec/volumes", "value": [{"name": "v"}, {"name": "v"}]}],
            'volume name "v" is used more than once in spec.volumes',
        ),
        (
            [{"op": "add", "path": "/spec/containers/-", "value": {"name": "sidecar"}}],
            "spec.containers[1].image must be a non-empty string",
        ),
        (
            [{"op": "add", "path": "/spec/containers/-", "value": {"image": "x"}}],
            "spec.containers[1].name must be a non-empty string",
        ),
        (
            [{"op": "add", "path": "/spec/containers/0/env/-", "value": {"value": "x"}}],
            "spec.containers[0].env[0] must be an object with a non-empty string name",
        ),
        (
            [{"op": "add", "path": "/spec/containers/0/env/-", "value": {"name": "PORT", "value": 8080}}],
            "spec.containers[0].env[0].value (PORT) must be a string, not number",
        ),
        (
            [{"op": "add", "path": "/metadata/annotations/enabled", "value": True}],
            'metadata.annotations["enabled"] must be a string, not boolean',
        ),
        ([{"op": "add", "path": "/metadata/labels/0", "value": 1}], 'metadata.labels["0"] must be a string'),
        (
            [{"op": "add", "path": "/spec/containers/0/args", "value": ["--port", 80]}],
            "spec.containers[0].args must be a list of strings",
        ),
        ([{"op": "replace", "path": "/spec", "value": []}], "spec must be an object"),
    ],
)
def test_patches_that_make_the_pod_invalid(ops, message):
    e = error(make_pod(), ops)
    assert e.reason == "invalid-pod"
    assert str(e).startswith("the patched Pod would be invalid: ")
    assert message in str(e)


def test_problems_the_pod_already_had_are_not_blamed_on_the_patch():
    pod = make_pod()
    pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "gone", "mountPath": "/g"}]
    pod["spec"]["containers"].append({"name": "app", "image": "dup"})
    result = check_patch(
        pod,
        [
            {
                "op": "add",
                "path": "/spec/containers/0/volumeMounts/-",
                "value": {"name": "also-gone", "mountPath": "/a"},
            },
            {"op": "add", "path": "/spec/containers/-", "value": {"name": "app", "image": "dup2"}},
        ],
    )
    applies(pod, result)
    # a different kind of problem is still blamed
    e = error(pod, [{"op": "add", "path": "/spec/containers/0/env", "value": [{"name": "A", "value": 1}]}])
    assert e.reason == "invalid-pod"


def test_volume_and_mount_added_together_are_valid():
    pod = make_pod()
    result = check_patch(
        pod,
        [
            {"op": "add", "path": "/spec/volumes/-", "value": {"name": "data", "emptyDir": {}}},
            {"op": "add", "path": "/spec/containers/0/volumeMounts/-", "value": {"name": "data", "mountPath": "/d"}},
        ],
    )
    assert result.repaired == 2
    applies(pod, result)


def test_several_problems_are_counted():
    e = error(make_pod(), [{"op": "add", "path": "/spec/containers/-", "value": {"name": "app"}}])
    assert str(e).endswith("(and 1 more)")


# ---------------------------------------------------------------- amp's own annotations and pointers

STATUS = "amp.txn2.com/status"
LEGACY = "amp.txn2.com/skipped"
STAMP = {LEGACY: None, STATUS: "mutated http://ep.team-a.svc:8080"}


def test_annotation_ops_create_annotations_when_missing():
    pod = make_pod()
    ops = annotation_ops(pod, STAMP)
    assert ops == [{"op": "add", "path": "/metadata/annotations", "value": {STATUS: STAMP[STATUS]}}]
    assert jsonpatch.apply_patch(pod, ops)["metadata"]["annotations"] == {STATUS: STAMP[STATUS]}


def test_annotation_ops_create_metadata_when_missing():
    pod = make_pod()
    del pod["metadata"]
    assert jsonpatch.apply_patch(pod, annotation_ops(pod, STAMP))["metadata"] == {
        "annotations": {STATUS: STAMP[STATUS]}
    }


def test_annotation_ops_set_and_remove_with_escaping():
    pod = make_pod()
    pod["metadata"]["annotations"] = {"keep": "me", LEGACY: "http-5xx: x", STATUS: "forged by the author"}
    ops = annotation_ops(pod, STAMP)
    assert ops == [
        {"op": "remove", "path": "/metadata/annotations/amp.txn2.com~1skipped"},
        {"op": "add", "path": "/metadata/annotations/amp.txn2.com~1status", "value": STAMP[STATUS]},
    ]
    assert jsonpatch.apply_patch(pod, ops)["metadata"]["annotations"] == {"keep": "me", STATUS: STAMP[STATUS]}
    ops = annotation_ops(pod, {"a~b/c": "v"})
    assert ops[0]["path"] == "/metadata/annotations/a~0b~1c"
    assert jsonpatch.apply_patch(pod, ops)["metadata"]["annotations"]["a~b/c"] == "v"


def test_removing_what_is_not_there_is_no_operation():
    pod = make_pod()
    pod["metadata"]["annotations"] = {"keep": "me"}
    assert annotation_ops(pod, {LEGACY: None}) == []
    assert annotate(unchanged(pod), {LEGACY: None}) == unchanged(pod)


@pytest.mark.parametrize(
    "endpoint_ops",
    [
        [],
        [{"op": "add", "path": "/metadata/annotations/a", "value": "1"}],
        [{"op": "add", "path": "/metadata/annotations", "value": {"x": "y"}}],
        [{"op": "replace", "path": "/metadata/annotations", "value": {}}],
        [{"op": "remove", "path": "/metadata/annotations"}],
        [{"op": "add", "path": "/metadata/annotations/amp.txn2.com~1status", "value": "forged by the endpoint"}],
        [{"op": "add", "path": "/metadata/annotations/amp.txn2.com~1skipped", "value": "forged"}],
        [{"op": "remove", "path": "/metadata/annotations/amp.txn2.com~1skipped"}],
    ],
    ids=[
        "nothing",
        "adds-one",
        "replaces-wholesale",
        "replace-empty",
        "removes-all",
        "sets-status",
        "sets-legacy",
        "removes-legacy",
    ],
)
def test_annotate_after_a_checked_patch_always_applies_and_wins(endpoint_ops):
    pod = make_pod()
    pod["metadata"]["annotations"] = {"keep": "me", LEGACY: "http-5xx: x", STATUS: "skipped old"}
    checked = annotate(check_patch(pod, endpoint_ops), STAMP)
    patched = jsonpatch.apply_patch(pod, checked.operations)
    assert patched == checked.pod
    assert patched["metadata"]["annotations"][STATUS] == STAMP[STATUS]
    assert LEGACY not in patched["metadata"]["annotations"]
    # The whole patch passes amp's own checks too, even where annotations are denied to endpoints.
    assert check_patch(pod, checked.operations).pod == patched


def test_annotations_are_amps_even_where_endpoints_may_not_write():
    pod = make_pod()
    checked = annotate(check_patch(pod, [], denied=("/metadata",)), STAMP)
    assert jsonpatch.apply_patch(pod, checked.operations)["metadata"]["annotations"] == {STATUS: STAMP[STATUS]}


def test_annotate_copies_on_write():
    pod = make_pod()
    pod["metadata"]["annotations"] = {"keep": "me"}
    before = json.dumps(pod, sort_keys=True)
    checked = annotate(unchanged(pod), STAMP)
    assert json.dumps(pod, sort_keys=True) == before
    assert checked.pod["metadata"]["annotations"] == {"keep": "me", STATUS: STAMP[STATUS]}


def test_pointer_tokens():
    assert escape_pointer_token("amp.txn2.com/skipped") == "amp.txn2.com~1skipped"
    assert escape_pointer_token("~/") == "~0~1"
    assert parse_pointer("/a~1b/c~0d/~01") == ("a/b", "c~d", "~1")
    assert parse_pointer("") == ()
    assert parse_pointer("/") == ("",)
    for bad in ("a", "/~2", "/x~"):
        with pytest.raises(ValueError):
            parse_pointer(bad)


# ---------------------------------------------------------------- properties

_names = st.sampled_from(["a", "b", "app", "data", "x~y", "p/q"])
_env = st.fixed_dictionaries({"name": _names, "value": st.sampled_from(["1", "two"])})
_volume = st.fixed_dictionaries({"name": _names, "emptyDir": st.just({})})


@st.composite
def pods(draw):
    pod = make_pod()
    containers = pod["spec"]["containers"]
    for i in range(draw(st.integers(0, 2))):
        containers.append({"name": f"c{i}", "image": "img"})
    for c in containers:
        if draw(st.booleans()):
            c["env"] = draw(st.lists(_env, max_size=3, unique_by=lambda e: e["name"]))
        if draw(st.booleans()):
            c["volumeMounts"] = []
    if draw(st.booleans()):
        pod["spec"]["volumes"] = draw(st.lists(_volume, max_size=3, unique_by=lambda v: v["name"]))
    if draw(st.booleans()):
        pod["spec"]["initContainers"] = [{"name": "init", "image": "img"}]
    if draw(st.booleans()):
        pod["metadata"]["annotations"] = draw(st.dictionaries(_names, st.just("v"), max_size=2))
    if draw(st.booleans()):
        del pod["status"]
    return pod


@st.composite
def append_ops(draw):
    kind = draw(
        st.sampled_from(["env"] * 3 + ["volume", "mount", "init", "annotation"] * 2 + ["deep", "denied", "indexed"])
    )
    c = draw(st.integers(0, 2))
    if kind == "env":
        return {"op": "add", "path": f"/spec/containers/{c}/env/-", "value": draw(_env)}
    if kind == "volume":
        return {"op": "add", "path": "/spec/volumes/-", "value": draw(_volume)}
    if kind == "mount":
        return {
            "op": "add",
            "path": f"/spec/containers/{c}/volumeMounts/-",
            "value": {"name": draw(_names), "mountPath": "/m"},
        }
    if kind == "init":
        return {"op": "add", "path": "/spec/initContainers/-", "value": {"name": draw(_names), "image": "i"}}
    if kind == "annotation":
        return {"op": "add", "path": "/metadata/annotations/" + escape_pointer_token(draw(_names)), "value": "v"}
    if kind == "deep":
        return {"op": "add", "path": "/spec/securityContext/seLinuxOptions/level", "value": "s0"}
    if kind == "indexed":
        return {"op": "add", "path": f"/spec/initContainers/{c}/env/-", "value": draw(_env)}
    return {
        "op": "add",
        "path": draw(st.sampled_from(["/status/phase", "/metadata/name", "/metadata"])),
        "value": draw(st.sampled_from(["v", {}])),
    }


def _touches_denied(path: str) -> bool:
    tokens = parse_pointer(path)
    for d in DEFAULT_DENIED:
        dt = parse_pointer(d)
        n = min(len(dt), len(tokens))
        if tokens[:n] == dt[:n]:
            return True
    return False


@HYPOTHESIS
@given(pods(), st.lists(append_ops(), max_size=6))
def test_checked_append_patches_always_apply(pod, ops):
    before = copy.deepcopy(pod)
    try:
        result = check_patch(pod, ops)
    except PatchError as e:
        assert e.reason in ("apply-failed", "refused-path", "invalid-pod")
        assert "\n" not in str(e)
        assert pod == before
        return
    assert pod == before
    applies(pod, result)
    assert result.repaired == len(result.operations) - len(ops)
    for op in result.operations:
        assert not _touches_denied(op["path"])
    for d in DEFAULT_DENIED:
        pointer = jsonpatch.JsonPointer(d)
        assert pointer.resolve(result.pod, None) == pointer.resolve(pod, None)


# Differential test of the RFC 6902 semantics against jsonpatch: random
# operations on a random document kept under /spec/extra, where the Pod checks
# do not look.

_scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from(["", "s", "t"]))
_keys = st.sampled_from(["a", "b", "c", "0", "1", "-", "~", "a/b", ""])
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(_keys, inner, max_size=3)),
    max_leaves=8,
)


def _pointers(value, prefix=""):
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _pointers(v, f"{prefix}/{escape_pointer_token(k)}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _pointers(v, f"{prefix}/{i}")


@st.composite
def doc_and_ops(draw):
    doc = draw(st.dictionaries(_keys, _values, min_size=1, max_size=4))
    existing = [p for p in _pointers(doc) if p]
    paths = st.one_of(
        st.sampled_from(existing),
        st.builds(
            lambda p, t: p + "/" + t,
            st.sampled_from(existing + [""]),
            st.sampled_from(["new", "-", "0", "1", "3", "01", "a~1b"]),
        ),
    )
    op = st.one_of(
        st.builds(lambda p, v: {"op": "add", "path": p, "value": v}, paths, _values),
        st.builds(lambda p: {"op": "remove", "path": p}, paths),
        st.builds(lambda p, v: {"op": "replace", "path": p, "value": v}, paths, _values),
        st.builds(lambda p, f: {"op": "move", "path": p, "from": f}, paths, paths),
        st.builds(lambda p, f: {"op": "copy", "path": p, "from": f}, paths, paths),
        st.builds(lambda p, v: {"op": "test", "path": p, "value": v}, paths, _scalars),
    )
    return doc, draw(st.lists(op, min_size=1, max_size=4))


def _under_extra(ops):
    out = []
    for op in ops:
        op = dict(op)
        for key in ("path", "from"):
            if key in op:
                op[key] = "/spec/extra" + op[key]
        out.append(op)
    return out


@HYPOTHESIS
@given(doc_and_ops())
def test_dry_apply_agrees_with_jsonpatch(case):
    doc, ops = case
    pod = make_pod(extra=doc)
    before = copy.deepcopy(pod)
    ops = _under_extra(ops)
    try:
        result = check_patch(pod, ops, repair=False)
    except PatchError as e:
        assert e.reason in ("apply-failed", "invalid-pod")
        assert pod == before
        return
    assert pod == before
    modifying = [op for op in ops if op["op"] != "test"]
    assert result.operations == (ops if modifying else [])
    assert result.repaired == 0
    assert jsonpatch.apply_patch(pod, ops) == result.pod


@HYPOTHESIS
@given(doc_and_ops())
def test_repaired_patches_apply_to_the_original(case):
    doc, ops = case
    pod = make_pod(extra=doc)
    ops = [dict(op, path=op["path"] + "/deeper/-") if op["op"] == "add" else op for op in _under_extra(ops)]
    try:
        result = check_patch(pod, ops)
    except PatchError:
        return
    if result.operations:
        applies(pod, result)


def test_nan_is_never_returned():
    # a value check runs on every value, not only the first level
    ops = [{"op": "add", "path": "/spec/extra", "value": [{"a": [math.inf]}]}]
    assert error(make_pod(), ops).reason == "invalid-patch"


# ---------------------------------------------------------------- only the changed parts are checked

_PART_OPS = [
    {"op": "add", "path": "/metadata/labels", "value": {"a": "b"}},
    {"op": "add", "path": "/metadata/labels", "value": {"a": 1}},
    {"op": "add", "path": "/metadata/annotations", "value": {"x": "y"}},
    {"op": "replace", "path": "/metadata", "value": []},
    {"op": "add", "path": "/metadata/name", "value": "n"},
    {"op": "add", "path": "/spec/volumes", "value": [{"name": "v"}]},
    {"op": "add", "path": "/spec/volumes", "value": [{"name": "v"}, {"name": "v"}]},
    {"op": "remove", "path": "/spec/volumes"},
    {"op": "add", "path": "/spec/containers/0/volumeMounts", "value": [{"name": "v", "mountPath": "/v"}]},
    {"op": "add", "path": "/spec/containers/-", "value": {"name": "app", "image": "i"}},
    {"op": "add", "path": "/spec/initContainers", "value": [{"name": "app", "image": "i"}]},
    {"op": "add", "path": "/spec/containers/0/env", "value": [{"name": "A", "value": 1}]},
    {"op": "move", "from": "/spec/volumes", "path": "/metadata/annotations/moved"},
    {"op": "copy", "from": "/spec/containers/0", "path": "/spec/containers/-"},
    {"op": "replace", "path": "/spec", "value": {"containers": []}},
    {"op": "add", "path": "/spec/nodeName", "value": "node-1"},
    {"op": "test", "path": "/metadata/labels", "value": {"a": "b"}},
]


def _broken_pods() -> list[dict]:
    dangling = make_pod()
    dangling["spec"]["containers"][0]["volumeMounts"] = [{"name": "gone", "mountPath": "/g"}]
    twins = make_pod()
    twins["spec"]["containers"].append({"name": "app", "image": "twin"})
    bad_label = make_pod()
    bad_label["metadata"]["labels"] = {"n": 1}
    with_volume = make_pod()
    with_volume["spec"]["volumes"] = [{"name": "v", "emptyDir": {}}]
    return [make_pod(), dangling, twins, bad_label, with_volume]


def _outcome(pod: dict, ops: list, everything: bool) -> tuple:
    """check_patch's verdict, checking the parts the patch changes or (everything) all of them."""
    from amp.patch import _check as checking

    parts_changed = checking.parts_changed
    if everything:
        checking.parts_changed = lambda ops: checking.ALL_PARTS
    try:
        return ("ok", check_patch(copy.deepcopy(pod), ops).operations)
    except PatchError as e:
        return (e.reason, str(e))
    finally:
        checking.parts_changed = parts_changed


@settings(max_examples=400, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pod=st.sampled_from(_broken_pods()), ops=st.lists(st.sampled_from(_PART_OPS), min_size=1, max_size=3))
def test_checking_only_the_changed_parts_gives_the_same_verdict(pod: dict, ops: list) -> None:
    """
    The patched Pod's sanity is checked only where the patch may have
    changed it (a problem elsewhere was there before, and is not blamed on
    the patch): the verdict, refusal and message alike, is the one a check
    of the whole Pod gives.
    """
    assert _outcome(pod, ops, everything=False) == _outcome(pod, ops, everything=True)


@settings(max_examples=200, derandomize=True, deadline=None)
@given(
    metadata=st.one_of(
        st.none(),
        st.just("text"),
        st.fixed_dictionaries(
            {},
            optional={
                "name": st.just("web"),
                "annotations": st.one_of(
                    st.none(),
                    st.just(["x"]),
                    st.dictionaries(
                        st.sampled_from(["keep", STATUS, LEGACY, "a/b~c"]), st.text(max_size=3), max_size=3
                    ),
                ),
            },
        ),
    ),
    changes=st.dictionaries(
        st.sampled_from([STATUS, LEGACY, "a/b~c", "new"]), st.one_of(st.none(), st.text(max_size=3)), max_size=3
    ),
)
def test_annotate_leaves_the_pod_its_operations_make(metadata: Any, changes: dict) -> None:
    """Whatever the metadata holds: annotate's Pod is its operations applied (jsonpatch, the oracle)."""
    pod = make_pod()
    if metadata is None:
        del pod["metadata"]
    else:
        pod["metadata"] = metadata
    before = json.dumps(pod, sort_keys=True)
    checked = annotate(unchanged(pod), changes)
    assert checked.pod == jsonpatch.apply_patch(pod, checked.operations)
    assert json.dumps(pod, sort_keys=True) == before
