"""
Tests for amp.admission_review: AdmissionReview parsing (v1 and v1beta1, every 400,
nesting, NaN and out-of-range numbers, and a fuzzer that finds no other
outcome), the answer's envelope and patch encoding, warning clipping and
audit keys.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import amp.admission_review as review_module
from amp.admission_review import (
    MAX_DEPTH,
    WARNINGS_TOTAL,
    AdmissionRequest,
    ReviewError,
    clean_audit_annotations,
    clip,
    clip_warnings,
    encode_response,
    nesting_exceeds,
    parse_review,
)
from tests.support.helpers import UID, V1, V1BETA1, pod, review, review_bytes


@pytest.mark.parametrize("api_version", [V1, V1BETA1])
def test_parse_both_versions(api_version: str) -> None:
    the_pod = pod("web")
    req = parse_review(review_bytes(the_pod, api_version=api_version, dry_run=True))
    assert req.api_version == api_version
    assert req.uid == UID
    assert (req.group, req.version, req.kind) == ("", "v1", "Pod")
    assert req.operation == "CREATE"
    assert req.namespace == "team-a"
    assert req.dry_run is True
    assert req.object == the_pod
    assert req.is_pod_create
    assert req.pod_name == "web"


def test_namespace_is_the_requests_not_the_objects() -> None:
    forged = pod()
    forged["metadata"]["namespace"] = "kube-system"
    assert parse_review(review_bytes(forged, namespace="team-a")).namespace == "team-a"
    empty = review(pod())
    empty["request"]["namespace"] = None
    assert parse_review(json.dumps(empty).encode()).namespace == ""


def test_seed_v1beta1_request_without_optional_fields() -> None:
    body = json.dumps(
        {
            "apiVersion": V1BETA1,
            "kind": "AdmissionReview",
            "request": {
                "uid": "u1",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "namespace": "ns",
                "operation": "CREATE",
                "object": pod(""),
            },
        }
    ).encode()
    req = parse_review(body)
    assert req.dry_run is False
    assert req.is_pod_create
    assert req.pod_name == "web-*"


@pytest.mark.parametrize(
    "changes, expected",
    [
        ({}, True),
        ({"operation": "UPDATE"}, False),
        ({"kind": {"group": "", "version": "v1", "kind": "Service"}}, False),
        ({"kind": {"group": "example.com", "version": "v1", "kind": "Pod"}}, False),
        ({"subResource": "ephemeralcontainers"}, False),
        ({"object": None}, False),
        ({"object": ["not", "a", "pod"]}, False),
    ],
)
def test_is_pod_create(changes: dict, expected: bool) -> None:
    doc = review()
    doc["request"].update(changes)
    assert parse_review(json.dumps(doc).encode()).is_pod_create is expected


def _with(path: str, value: Any, delete: bool = False) -> bytes:
    doc = review()
    target = doc
    keys = path.split(".")
    for k in keys[:-1]:
        target = target[k]
    if delete:
        del target[keys[-1]]
    else:
        target[keys[-1]] = value
    return json.dumps(doc).encode()


BAD = [
    (b"{", "request body is not valid JSON"),
    (b"", "request body is not valid JSON"),
    (b"\xff\xfe\x00garbage", "request body is not valid JSON"),
    (b"[1, 2]", "request body is not a JSON object"),
    (b'"review"', "request body is not a JSON object"),
    (_with("apiVersion", "admission.k8s.io/v2"), "apiVersion 'admission.k8s.io/v2' is not one of"),
    (_with("apiVersion", None, delete=True), "apiVersion None is not one of admission.k8s.io/v1, "),
    (_with("kind", "AdmissionRequest"), "kind 'AdmissionRequest' is not AdmissionReview"),
    (_with("request", None, delete=True), "AdmissionReview has no request object"),
    (_with("request", "x"), "AdmissionReview has no request object"),
    (_with("request.uid", None, delete=True), "request.uid is missing or not a string"),
    (_with("request.uid", ""), "request.uid is missing or not a string"),
    (_with("request.uid", 42), "request.uid is missing or not a string"),
    (_with("request.kind", None, delete=True), "request.kind is missing or not an object"),
    (_with("request.kind", "Pod"), "request.kind is missing or not an object"),
    (_with("request.operation", None, delete=True), "request.operation is missing or not a string"),
    (_with("request.namespace", 7), "request.namespace is not a string"),
    (_with("request.dryRun", "true"), "request.dryRun is not a boolean"),
]


@pytest.mark.parametrize("body, fragment", BAD, ids=[f"{i}" for i in range(len(BAD))])
def test_bad_reviews_are_400_with_a_message(body: bytes, fragment: str) -> None:
    with pytest.raises(ReviewError) as e:
        parse_review(body)
    assert e.value.code == 400
    assert fragment in e.value.message
    assert str(e.value) == e.value.message


# ---------------------------------------------------------------- nesting and numbers


def nested(depth: int, leaf: Any = 1) -> Any:
    """A value C{depth} arrays and objects deep (one level: the leaf in a list)."""
    value = leaf
    for i in range(depth):
        value = [value] if i % 2 == 0 else {"k": value}
    return value


def review_around(value: Any) -> bytes:
    """A review whose Pod holds C{value}: the review, request, object and metadata add 4 levels."""
    the_pod = pod()
    the_pod["metadata"]["x"] = value
    return json.dumps(review(the_pod)).encode()


def test_a_review_at_the_nesting_bound_is_parsed() -> None:
    req = parse_review(review_around(nested(MAX_DEPTH - 4)))
    assert req.object["metadata"]["x"] == nested(MAX_DEPTH - 4)


def test_a_review_over_the_nesting_bound_is_a_400_naming_it() -> None:
    with pytest.raises(ReviewError) as e:
        parse_review(review_around(nested(MAX_DEPTH - 3)))
    assert e.value.code == 400
    assert f"more than {MAX_DEPTH} deep" in e.value.message


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 100_000,
        b'{"a":' * 100_000,
        b"[" * 100_000 + b"]" * 100_000,
        b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"object": ' + b"[" * 100_000,
    ],
    ids=["open-arrays", "open-objects", "closed", "in-the-object"],
)
def test_deep_nesting_is_a_400_not_a_recursion_error(body: bytes) -> None:
    with pytest.raises(ReviewError) as e:
        parse_review(body)
    assert e.value.code == 400
    assert "nests arrays and objects" in e.value.message


def test_brackets_in_strings_are_not_nesting() -> None:
    deep_text = "[" * 500 + '\\"{' * 200
    req = parse_review(review_around({"command": deep_text, "args": ["]" * 300, '"[[[', "\\"]}))
    assert req.object["metadata"]["x"]["command"] == deep_text


@pytest.mark.parametrize(
    "literal, fragment",
    [
        ("NaN", "NaN is not a JSON number"),
        ("Infinity", "Infinity is not a JSON number"),
        ("-Infinity", "-Infinity is not a JSON number"),
        ("1e400", "number 1e400 is out of range"),
        ("-1e999", "number -1e999 is out of range"),
        ("18446744073709551616", "number 18446744073709551616 is out of range"),
        ("-9223372036854775809", "number -9223372036854775809 is out of range"),
        ("1" * 5000, "is out of range"),
    ],
)
def test_numbers_json_cannot_carry_are_a_400(literal: str, fragment: str) -> None:
    body = json.dumps(review(pod())).replace('"name": "web"', f'"name": "web", "n": {literal}').encode()
    assert literal.encode() in body
    with pytest.raises(ReviewError) as e:
        parse_review(body)
    assert e.value.code == 400
    assert fragment in e.value.message


@pytest.mark.parametrize(
    "literal, value",
    [
        ("9223372036854775807", 2**63 - 1),
        ("-9223372036854775808", -(2**63)),
        ("18446744073709551615", 2**64 - 1),
        ("1.5e300", 1.5e300),
        ("-0.0", -0.0),
        ("0", 0),
    ],
)
def test_numbers_in_range_are_kept(literal: str, value: Any) -> None:
    body = json.dumps(review(pod())).replace('"name": "web"', f'"name": "web", "n": {literal}').encode()
    assert parse_review(body).object["metadata"]["n"] == value


def depth_of(value: Any) -> int:
    """The nesting depth of a parsed JSON value, without recursion."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (list, dict)):
            deepest = max(deepest, d)
            stack.extend((child, d + 1) for child in (v.values() if isinstance(v, dict) else v))
    return deepest


TRICKY_TEXT = st.text(alphabet='[]{}"\\ab\n\u2028', max_size=12)
NESTED_JSON = st.recursive(
    st.none() | st.integers(-(2**63), 2**64 - 1) | TRICKY_TEXT,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(TRICKY_TEXT, children, max_size=3),
    max_leaves=40,
)


@settings(max_examples=200, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=NESTED_JSON, depth=st.integers(0, 30), indent=st.sampled_from([None, 0, 2]), ascii=st.booleans())
def test_nesting_is_measured_exactly(value: Any, depth: int, indent: Any, ascii: bool) -> None:
    doc = nested(depth, value)
    body = json.dumps(doc, indent=indent, ensure_ascii=ascii).encode()
    actual = depth_of(doc)
    for limit in (actual - 1, actual, max(0, actual - 5), actual + 3):
        if limit >= 0:
            assert nesting_exceeds(body, limit) == (actual > limit), (limit, actual)


def _fuzz_bodies() -> st.SearchStrategy[bytes]:
    brackets = st.lists(
        st.sampled_from([b"[", b"]", b"{", b"}", b'"', b"\\", b",", b":", b"1", b'"a"']), max_size=400
    ).map(b"".join)
    deep = st.tuples(
        st.sampled_from([b"[", b'{"a":', b'["', b"[\\"]), st.integers(0, 5000), st.sampled_from([b"", b"]", b"}", b"1"])
    ).map(lambda t: t[0] * t[1] + t[2] * (t[1] // 2))
    reviews = st.tuples(NESTED_JSON, st.integers(0, 150)).map(lambda t: review_around(nested(t[1], t[0])))
    mangled = st.tuples(reviews, st.integers(0, 400), st.binary(max_size=8)).map(
        lambda t: t[0][: t[1]] + t[2] + t[0][t[1] :]
    )
    constants = st.sampled_from([b"NaN", b"Infinity", b"-Infinity", b"1e999", b"99999999999999999999999"]).map(
        lambda c: json.dumps(review(pod())).encode().replace(b'"name": "web"', b'"name": ' + c)
    )
    return st.one_of(st.binary(max_size=300), brackets, deep, reviews, mangled, constants)


@settings(
    max_examples=300,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(body=_fuzz_bodies())
def test_any_bytes_are_a_review_or_a_400(body: bytes) -> None:
    """
    Whatever arrives, the parser gives a review or a 400 with a message:
    never another exception (which the listener would turn into a 500 and
    a traceback).
    """
    try:
        req = parse_review(body)
    except ReviewError as e:
        assert e.code == 400 and e.message
        return
    assert isinstance(req, AdmissionRequest)


def test_invalid_utf8_inside_a_string_is_a_400() -> None:
    """msgspec raises UnicodeDecodeError (not its DecodeError) for it."""
    body = b'{"apiVersion":"admission.k8s.io/v1\x80","kind":"AdmissionReview","request":{"uid":"u"}}'
    with pytest.raises(ReviewError) as e:
        parse_review(body)
    assert e.value.code == 400 and "utf-8" in e.value.message.lower()


# ---------------------------------------------------------------- answers


def answer(body: bytes) -> dict:
    doc = json.loads(body)
    assert doc["kind"] == "AdmissionReview"
    return doc


@pytest.mark.parametrize("api_version", [V1, V1BETA1])
def test_answer_echoes_uid_and_api_version(api_version: str) -> None:
    doc = answer(encode_response(api_version, "the-uid"))
    assert doc["apiVersion"] == api_version
    assert doc["response"] == {"uid": "the-uid", "allowed": True}


@pytest.mark.parametrize("kwargs", [{}, {"patch": []}, {"patch": None}, {"patch_bytes": b""}, {"patch_bytes": b"[]"}])
def test_no_patch_type_without_a_change(kwargs: dict) -> None:
    response = answer(encode_response(V1, UID, **kwargs))["response"]
    assert "patch" not in response
    assert "patchType" not in response


def test_patch_is_base64_of_the_operations() -> None:
    ops = [{"op": "add", "path": "/metadata/labels", "value": {"\u00e9": "\u2713"}}]
    response = answer(encode_response(V1, UID, patch=ops))["response"]
    assert response["patchType"] == "JSONPatch"
    assert json.loads(base64.b64decode(response["patch"], validate=True)) == ops


def test_patch_bytes_are_sent_as_given() -> None:
    raw = b'[{"op":"remove","path":"/spec/x"}]'
    response = answer(encode_response(V1, UID, patch_bytes=raw))["response"]
    assert base64.b64decode(response["patch"]) == raw


def test_denial_has_a_status_and_never_a_patch() -> None:
    response = answer(
        encode_response(
            V1,
            UID,
            allowed=False,
            patch=[{"op": "add", "path": "/x", "value": 1}],
            code=500,
            message="amp: no",
            reason="InternalError",
        )
    )["response"]
    assert response["allowed"] is False
    assert response["status"] == {"status": "Failure", "code": 500, "message": "amp: no", "reason": "InternalError"}
    assert "patch" not in response and "patchType" not in response


def test_denial_defaults_to_403_without_a_reason() -> None:
    status = answer(encode_response(V1, UID, allowed=False, message="m"))["response"]["status"]
    assert status == {"status": "Failure", "code": 403, "message": "m"}


def test_warnings_and_audit_are_included() -> None:
    response = answer(encode_response(V1, UID, warnings=["one", "two"], audit={"error": "x"}))["response"]
    assert response["warnings"] == ["one", "two"]
    assert response["auditAnnotations"] == {"error": "x"}


def test_each_warning_is_clipped_under_120_characters() -> None:
    response = answer(encode_response(V1, UID, warnings=["x" * 500, "y" * 119, "z" * 120]))["response"]
    assert [len(w) for w in response["warnings"]] == [119, 119, 119]
    assert response["warnings"][0].endswith("...")
    assert response["warnings"][1] == "y" * 119


def test_warnings_stay_under_4kib_in_total() -> None:
    warnings = clip_warnings([f"{i:03d} " + "w" * 300 for i in range(100)])
    assert sum(len(w) for w in warnings) <= WARNINGS_TOTAL < 4096
    assert all(len(w) < 120 for w in warnings)
    assert warnings[0].startswith("000 ")
    assert len(warnings) == WARNINGS_TOTAL // 119


def test_warnings_are_one_line_and_never_empty() -> None:
    assert clip_warnings(["a\nb\r\n  c\td", "", "   "]) == ["a b c d"]


def test_clip() -> None:
    assert clip("short") == "short"
    assert clip("a" * 10, limit=8) == "aaaaa..."
    assert len(clip("word " * 100)) < 120


# ---------------------------------------------------------------- audit annotations


def test_audit_keys_must_be_a_bare_name() -> None:
    good, problems = clean_audit_annotations(
        {
            "error": "e",
            "sidecar-injected": "true",
            "a.b_c-d": "1",
            "x" * 63: "long",
            "x" * 64: "too long",
            "amp.txn2.com/error": "slash",
            "": "empty",
            "-lead": "dash",
            "trail-": "dash",
            "sp ace": "space",
        }
    )
    assert good == {"error": "e", "sidecar-injected": "true", "a.b_c-d": "1", "x" * 63: "long"}
    assert len(problems) == 6
    assert any("'amp.txn2.com/error'" in p for p in problems)
    assert all("dropped" in p for p in problems)


def test_audit_values_are_strings_and_clipped() -> None:
    good, problems = clean_audit_annotations({"n": 5, "long": "v" * 5000, "multi": "a\nb"})
    assert problems == []
    assert good["n"] == "5"
    assert len(good["long"]) == 1024
    assert good["multi"] == "a b"


def test_non_ascii_is_sent_as_utf8() -> None:
    body = encode_response(V1, UID, warnings=["caf\u00e9"])
    assert "caf\u00e9".encode("utf-8") in body


# ---------------------------------------------------------------- the object's own bytes


def _forwarded(body: bytes):
    req = parse_review(body)
    assert req.object_json is not None
    assert json.loads(req.object_json) == req.object
    for value in msgspec.json.decode(req.object_json, type=dict[str, msgspec.Raw]).values():
        assert bytes(value) in body
    return req


def test_object_bytes_are_cut_from_the_body_as_sent() -> None:
    """
    The Pod is forwarded to the endpoint as the API server sent it, not
    serialised again: each top-level member's bytes as they came (spaces
    and all), the members joined compactly.
    """
    body = (
        b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u",'
        b'"kind":{"group":"","version":"v1","kind":"Pod"},"operation":"CREATE","namespace":"n",'
        b'"object":{"metadata":{"name":"p"},  "spec":{"containers":[{"name":"c", "image":"i"}]}},'
        b'"oldObject":null,"dryRun":false}}'
    )
    for lazy in (False, True):
        _forwarded(body)
        assert parse_review(body, lazy=lazy).object_json == (
            b'{"metadata":{"name":"p"},"spec":{"containers":[{"name":"c", "image":"i"}]}}'
        )


def test_an_earlier_key_named_object_is_not_taken_for_the_pod() -> None:
    doc = review(pod())
    doc["request"] = {"userInfo": {"username": "u", "extra": {"object": ["decoy"]}}, **doc["request"]}
    doc = {"request": doc["request"], "apiVersion": doc["apiVersion"], "kind": doc["kind"]}
    req = _forwarded(json.dumps(doc, indent=2).encode())
    assert req.object == pod()


def test_non_ascii_and_pretty_printed_bodies() -> None:
    the_pod = pod()
    the_pod["metadata"]["annotations"] = {"note": "grüße \u2028 ☃"}
    body = json.dumps(review(the_pod), indent=3, ensure_ascii=False).encode("utf-8")
    req = _forwarded(body)
    assert req.object == the_pod


def test_no_object_bytes_without_an_object() -> None:
    doc = review(pod(), operation="DELETE")
    doc["request"]["object"] = None
    assert parse_review(json.dumps(doc).encode()).object_json is None


@settings(max_examples=200, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    extra=st.dictionaries(
        st.sampled_from(["object", "x", "oldObject", "options"]),
        st.recursive(
            st.none() | st.text(max_size=5) | st.integers(-(2**63), 2**64 - 1),
            lambda c: st.dictionaries(st.sampled_from(["object", "a"]), c, max_size=3),
            max_leaves=6,
        ),
        max_size=3,
    ),
    indent=st.sampled_from([None, 0, 2]),
)
def test_object_bytes_always_decode_to_the_parsed_object(extra: dict, indent: Any) -> None:
    doc = review(pod())
    doc["request"]["userInfo"] = {"username": "u", "extra": extra}
    body = json.dumps(doc, indent=indent).encode()
    req = parse_review(body)
    assert req.object == json.loads(body)["request"]["object"]
    if req.object_json is not None:
        assert json.loads(req.object_json) == req.object


# ---------------------------------------------------------------- the fast path and the careful one

ANY_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=25,
)


@settings(max_examples=300, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    extra=ANY_JSON,
    where=st.sampled_from(["object", "request", "review"]),
    indent=st.sampled_from([None, 2]),
    ascii=st.booleans(),
)
def test_the_fast_path_decides_as_the_careful_one(extra: Any, where: str, indent: Any, ascii: bool) -> None:
    """
    Reviews are decoded in C (msgspec) unless that decoder refuses them or
    they may hold an integer out of 64-bit range; the careful decoder
    (Python's json, with the API server's limits) decides then.  For any
    review, the answer is the careful decoder's: the same fields and Pod,
    or the same 400; and a Pod kept as raw bytes decodes to the Pod.
    """
    doc = review(pod())
    if where == "object":
        doc["request"]["object"]["metadata"]["extra"] = extra
    elif where == "request":
        doc["request"]["userInfo"] = {"extra": extra}
    else:
        doc["extra"] = extra
    body = json.dumps(doc, indent=indent, ensure_ascii=ascii).encode()
    try:
        careful: Any = review_module._parse_careful(body)
    except ReviewError as e:
        careful = (e.code, e.message)
    try:
        got: Any = parse_review(body)
    except ReviewError as e:
        got = (e.code, e.message)
    if isinstance(careful, tuple):
        assert got == careful
        return
    assert isinstance(got, AdmissionRequest)
    assert (got.uid, got.kind, got.operation, got.namespace, got.dry_run) == (
        careful.uid,
        careful.kind,
        careful.operation,
        careful.namespace,
        careful.dry_run,
    )
    assert got.object == careful.object
    if got.object_json is not None:
        assert json.loads(got.object_json) == got.object
