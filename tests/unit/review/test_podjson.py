"""
The Pod as the webhook's hot path holds it (amp.podjson): its metadata
decoded, every other member kept as raw JSON until read.  Whatever a
review or a patch holds, the lazy Pod decides as the decoded one: the same
400, the same fields, the same checked patch or the same refusal, the
same Pod after it; and a member nothing reads is never decoded.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amp.admission_review import ReviewError, parse_review
from amp.patch import PatchError, check_patch
from amp.poddiff import pod_differences
from amp.podjson import RAW, MemberError, member, whole
from tests.support.helpers import pod, review

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=20,
)


def _decided(body: bytes, lazy: bool) -> Any:
    try:
        req = parse_review(body, lazy=lazy)
    except ReviewError as e:
        return (e.code, e.message)
    return req


def test_only_the_metadata_is_decoded_and_the_rest_forwarded_as_it_came() -> None:
    body = json.dumps(review(pod(labels={"app": "web"}))).encode()
    req = parse_review(body, lazy=True)
    assert req.object["metadata"] == {"name": "web", "labels": {"app": "web"}}
    assert req.object["kind"] == "Pod"
    assert type(req.object["spec"]) is RAW
    assert req.pod_name == "web"
    assert req.is_pod_create
    assert json.loads(req.object_json) == pod(labels={"app": "web"})
    assert whole(req.object) == parse_review(body).object


#: What an API server puts in a controller's Pod before admission (over
#: a kilobyte, as a real one is: smaller metadata is decoded whole).
MANAGED_FIELDS = [
    {
        "manager": "kube-controller-manager",
        "operation": "Update",
        "apiVersion": "v1",
        "time": "2026-11-27T10:00:00Z",
        "fieldsType": "FieldsV1",
        "fieldsV1": {
            "f:metadata": {"f:generateName": {}, "f:labels": {".": {}, "f:app": {}}},
            "f:spec": {
                "f:containers": {
                    'k:{"name":"app"}': {
                        ".": {},
                        "f:image": {},
                        "f:name": {},
                        "f:env": {
                            ".": {},
                            **{
                                f'k:{{"name":"SETTING_{i:02d}"}}': {".": {}, "f:name": {}, "f:value": {}}
                                for i in range(16)
                            },
                        },
                    }
                }
            },
        },
    }
]


def test_the_metadata_is_decoded_but_its_managed_fields() -> None:
    """
    A Pod as an API server sends it carries managedFields: the rest of the
    metadata is decoded, they stay raw until read, and the Pod is forwarded
    and compared as it came.
    """
    the_pod = pod(labels={"app": "web"})
    the_pod["metadata"]["managedFields"] = MANAGED_FIELDS
    body = json.dumps(review(the_pod)).encode()
    req = parse_review(body, lazy=True)
    metadata = req.object["metadata"]
    assert metadata["labels"] == {"app": "web"} and metadata["name"] == "web"
    assert type(metadata["managedFields"]) is RAW
    assert json.loads(req.object_json) == the_pod
    assert req.object_json == parse_review(body).object_json
    eager = parse_review(body).object
    assert pod_differences(req.object, eager) == ()
    assert whole(req.object) == eager and type(metadata["managedFields"]) is list
    # A managedFields member that is not JSON an API server sends is refused
    # when it is read, naming it.
    bad = parse_review(body.replace(b'"v1", "time"', b'"v1", "n": 1e999, "time"'), lazy=True)
    with pytest.raises(MemberError, match="metadata.managedFields"):
        whole(bad.object)
    # A patch that reads inside it, or takes the metadata whole, fails there.
    for ops in (
        [{"op": "test", "path": "/metadata/managedFields/0/manager", "value": "x"}],
        [{"op": "copy", "from": "/metadata", "path": "/spec/copied"}],
    ):
        with pytest.raises(PatchError) as caught:
            check_patch(bad.object, ops)
        assert caught.value.reason == "apply-failed" and "metadata.managedFields cannot be read" in str(caught.value)


def _managed_body() -> bytes:
    the_pod = pod()
    the_pod["metadata"]["managedFields"] = MANAGED_FIELDS
    return json.dumps(review(the_pod)).encode()


def test_a_patch_never_changes_the_lazy_pod_it_checks() -> None:
    """
    A container the patch threw away leaves its id to the next object made:
    the managedFields decoded into the caller's Pod must not be taken for
    the patch's own copy and changed in place (twice over, checked twice).
    """
    ops = [
        {"op": "add", "path": "/spec/containers/-", "value": {"name": "s", "image": "e"}},
        {"op": "replace", "path": "/spec/containers", "value": [{"name": "app", "image": "nginx:1.25"}]},
        {"op": "test", "path": "/metadata/managedFields/0/manager", "value": "kube-controller-manager"},
        {"op": "add", "path": "/metadata/managedFields/-", "value": {"manager": "x"}},
    ]
    body = _managed_body()
    lazy = parse_review(body, lazy=True).object
    before = json.loads(msgspec.json.encode(lazy))
    for _ in range(3):
        assert _checked(lazy, ops) == _checked(parse_review(body).object, ops)
        assert json.loads(msgspec.json.encode(lazy)) == before


def test_replacing_a_raw_list_warns_as_replacing_a_decoded_one() -> None:
    ops = [{"op": "add", "path": "/metadata/managedFields", "value": []}]
    body = _managed_body()
    lazy = _checked(parse_review(body, lazy=True).object, ops)
    assert lazy == _checked(parse_review(body).object, ops)
    assert "replaced an existing list of 1 item" in lazy[2][0]


def test_metadata_that_is_not_an_object_is_forwarded_as_it_came() -> None:
    the_pod = pod()
    the_pod["metadata"] = ["managedFields", "x" * 1100]
    body = json.dumps(review(the_pod)).encode()
    assert parse_review(body, lazy=True).object_json == parse_review(body).object_json is not None


@settings(max_examples=300, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    extra=JSON,
    where=st.sampled_from(["spec", "status", "metadata", "managedFields", "request", "new member"]),
    indent=st.sampled_from([None, 2]),
    ascii=st.booleans(),
)
def test_the_lazy_pod_decides_as_the_decoded_one(extra: Any, where: str, indent: Any, ascii: bool) -> None:
    """
    Any review decides as when all of it is decoded, but for one thing: a
    number out of range (which an API server never sends) in a part amp
    does not read (userInfo) or has not read yet (a raw member) is not
    refused; a raw member holding one is refused, naming it, when read.
    """
    the_pod = pod()
    if where == "spec":
        the_pod["spec"]["extra"] = extra
    elif where == "status":
        the_pod["status"] = {"extra": extra}
    elif where == "metadata":
        the_pod["metadata"]["extra"] = extra
    elif where == "managedFields":
        the_pod["metadata"]["managedFields"] = [{"manager": "kube-controller-manager", "fieldsV1": extra}]
    elif where == "new member":
        the_pod["extra"] = extra
    doc = review(the_pod)
    if where == "request":
        doc["request"]["userInfo"] = {"extra": extra}
    body = json.dumps(doc, indent=indent, ensure_ascii=ascii).encode()
    eager, lazy = _decided(body, False), _decided(body, True)
    # The metadata's managedFields is raw too, but a long integer anywhere in
    # the metadata sends the review down the careful path, as before.
    unread = where in ("spec", "status", "new member", "request")
    if isinstance(eager, tuple):
        if not (unread and "out of range" in eager[1]):
            assert lazy == eager
            return
        assert not isinstance(lazy, tuple)
        if where == "request":
            whole(lazy.object)
        else:
            with pytest.raises(MemberError, match="out of range"):
                whole(lazy.object)
        return
    assert not isinstance(lazy, tuple)
    assert (lazy.uid, lazy.kind, lazy.operation, lazy.namespace, lazy.pod_name) == (
        eager.uid,
        eager.kind,
        eager.operation,
        eager.namespace,
        eager.pod_name,
    )
    if eager.object_json is not None:
        assert lazy.object_json == eager.object_json
    if lazy.object_json is not None:
        # (None when a long number sent the review down the careful path.)
        assert json.loads(lazy.object_json) == eager.object
    assert whole(lazy.object) == eager.object


@pytest.mark.parametrize("bad", [b'"\xff\xfe"', b'"caf\xc3"', b"[" * 101 + b"]" * 101])
def test_what_the_lazy_pod_leaves_raw_is_still_checked(bad: bytes) -> None:
    """
    Invalid UTF-8 and nesting too deep in a member left raw are refused
    as they are when everything is decoded.
    """
    body = json.dumps(review(pod())).encode().replace(b'"nginx:1.25"', bad)
    eager, lazy = _decided(body, False), _decided(body, True)
    assert isinstance(eager, tuple) and eager[0] == 400
    assert lazy == eager


@pytest.mark.parametrize("number", [b"1e999", b"123456789012345678901234", b"-9223372036854775809"])
def test_a_number_out_of_range_in_a_raw_member_fails_where_it_is_read(number: bytes) -> None:
    """
    A number out of range (which an API server never sends) in a member
    left raw is not seen by skipping over it: the review is read, a patch
    that stays out of that member applies, and one that reads it fails to
    apply, naming the member and the number.  In the metadata, read at
    once, it is refused at once.
    """
    body = json.dumps(review(pod(priority=1))).encode().replace(b'"priority": 1', b'"priority": ' + number)
    with pytest.raises(ReviewError, match="out of range"):
        parse_review(body)
    req = parse_review(body, lazy=True)
    assert number in req.object_json
    labelled = check_patch(req.object, [{"op": "add", "path": "/metadata/labels", "value": {"a": "b"}}])
    assert labelled.pod["metadata"]["labels"] == {"a": "b"}
    with pytest.raises(PatchError) as caught:
        check_patch(req.object, [{"op": "add", "path": "/spec/containers/-", "value": {"name": "s", "image": "i"}}])
    assert caught.value.reason == "apply-failed"
    assert "spec cannot be read" in str(caught.value) and "out of range" in str(caught.value)
    with pytest.raises(MemberError):
        whole(req.object)
    in_metadata = (
        json.dumps(review(pod(labels={"a": "b"}))).encode().replace(b'"labels"', b'"n": %s, "labels"' % number)
    )
    assert _decided(in_metadata, True) == _decided(in_metadata, False)
    assert _decided(in_metadata, True)[0] == 400


def test_integers_in_range_however_long_are_read_from_a_raw_member() -> None:
    """Twenty digits may still fit (unsigned 64 bits): read exactly as the API server would."""
    body = json.dumps(review(pod(priority=18446744073709551615))).encode()
    req = parse_review(body, lazy=True)
    assert member(req.object, "spec")["priority"] == 18446744073709551615
    assert whole(req.object) == parse_review(body).object


PATHS = [
    "/metadata/labels/x",
    "/metadata/annotations",
    "/metadata/name",
    "/metadata",
    "/metadata/managedFields",
    "/metadata/managedFields/0/manager",
    "/metadata/managedFields/-",
    "/spec/containers/-",
    "/spec/containers/0/image",
    "/spec/containers/0",
    "/spec/volumes/-",
    "/spec/volumes",
    "/spec",
    "/status",
    "/status/phase",
    "/extra",
    "/extra/a",
    "/spec/nodeName",
    "/kind",
    "/nope/x",
]
OPS = st.lists(
    st.fixed_dictionaries(
        {
            "op": st.sampled_from(["add", "replace", "remove", "move", "copy", "test"]),
            "path": st.sampled_from(PATHS),
            "from": st.sampled_from(PATHS),
            "value": st.sampled_from(
                [
                    {"name": "side", "image": "envoy"},
                    "x",
                    [],
                    {},
                    {"a": "b"},
                    1,
                    [{"name": "app", "image": "nginx:1.25"}],
                ]
            ),
        }
    ),
    min_size=1,
    max_size=4,
)


def _checked(the_pod: dict, ops: list) -> Any:
    try:
        checked = check_patch(the_pod, ops, denied=(), repair=True)
    except PatchError as e:
        return (e.reason, str(e))
    return checked.operations, checked.repaired, checked.warnings, json.loads(msgspec.json.encode(checked.pod))


@settings(max_examples=400, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS, status=st.booleans(), extra=st.booleans(), managed=st.booleans())
def test_a_patch_on_the_lazy_pod_is_checked_as_on_the_decoded_one(
    ops: list, status: bool, extra: bool, managed: bool
) -> None:
    """
    Any patch: the same operations, repairs and warnings, the same Pod
    after it (as JSON), or the same refusal; the lazy Pod itself is the
    same document afterwards, and a member the patch did not read stays raw
    (the metadata's managedFields too).
    """
    the_pod = pod(volumes=[{"name": "v", "emptyDir": {}}])
    if status:
        the_pod["status"] = {"phase": "Pending"}
    if extra:
        the_pod["extra"] = {"a": [1, 2]}
    if managed:
        the_pod["metadata"]["managedFields"] = MANAGED_FIELDS
    body = json.dumps(review(the_pod)).encode()
    lazy = parse_review(body, lazy=True).object
    before = json.loads(msgspec.json.encode(lazy))
    eager = _checked(parse_review(body).object, ops)
    assert _checked(lazy, ops) == eager
    assert json.loads(msgspec.json.encode(lazy)) == before
    # Checked again, now with what the first check decoded: the same.
    assert _checked(lazy, ops) == eager
    assert json.loads(msgspec.json.encode(lazy)) == before
    touched = {op["path"].split("/")[1] for op in ops} | {
        op["from"].split("/")[1] for op in ops if op["op"] in ("move", "copy")
    }
    if any(
        op["op"] != "test"
        and (op["path"] in ("/metadata", "/spec") or (op["op"] == "move" and op["from"] in ("/metadata", "/spec")))
        for op in ops
    ):
        # A whole metadata or spec changed: the patched Pod is checked all
        # through (amp.patch parts_changed), its spec included.
        touched.add("spec")
    for key in ("spec", "status", "extra"):
        if key in lazy and key not in touched:
            assert type(lazy[key]) is RAW
    read = [op["path"] for op in ops] + [op["from"] for op in ops if op["op"] in ("move", "copy")]
    if managed and not any(p == "/metadata" or p.startswith("/metadata/managedFields") for p in read):
        assert type(lazy["metadata"]["managedFields"]) is RAW


def test_pods_compare_alike_whichever_members_are_still_raw() -> None:
    """
    The canary and replay compare two admitted Pods: one whose spec a
    patch read (and so decoded) and one whose spec is still raw are the
    same Pod when their JSON is.
    """
    body = json.dumps(review(pod())).encode()
    a = parse_review(body, lazy=True).object
    b = parse_review(body, lazy=True).object
    member(b, "spec")
    assert type(a["spec"]) is RAW and type(b["spec"]) is dict
    assert pod_differences(a, b) == ()
    changed = check_patch(b, [{"op": "replace", "path": "/spec/containers/0/image", "value": "nginx:1.26"}]).pod
    assert [d.path for d in pod_differences(a, changed)] == ["/spec/containers/0/image"]
    assert type(a["spec"]) is RAW


@pytest.mark.parametrize("policy, allowed", [("Ignore", True), ("Fail", False)])
def test_a_patch_that_reads_an_unreadable_member_ends_in_the_failure_policy(policy: str, allowed: bool) -> None:
    """
    Through the admission, as the webhook reads reviews: an endpoint's patch
    that reads a raw member holding a number out of range fails to apply,
    and the failure policy answers, naming the reason and the number.
    """
    from tests.unit.admission.test_properties import Reply, _admitter, _answer

    reply = Reply()
    reply.body = json.dumps(
        [{"op": "add", "path": "/spec/containers/-", "value": {"name": "s", "image": "i"}}]
    ).encode()
    admitter, clock = _admitter(reply, policy)
    body = (
        json.dumps(review(pod(priority=1), namespace="team-a")).encode().replace(b'"priority": 1', b'"priority": 1e999')
    )
    response = _answer(admitter, clock, body)
    assert response["allowed"] is allowed
    said = json.dumps(response)
    assert "apply-failed" in said and "out of range" in said
