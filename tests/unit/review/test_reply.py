"""
Tests for amp.reply: the endpoint protocol's two reply forms and every way
a reply can be invalid (reason C{invalid-json} or C{invalid-reply}).
"""

from __future__ import annotations

import json

import pytest

from amp.admission_review import nesting_exceeds
from amp.reply import MAX_DEPTH, EndpointDecision, ReplyError, parse_reply

OPS = [{"op": "add", "path": "/metadata/labels", "value": {"a": "b"}}]


def test_array_form_is_the_patch() -> None:
    assert parse_reply(json.dumps(OPS).encode()) == EndpointDecision(patch=OPS)


def test_empty_array_means_no_change() -> None:
    decision = parse_reply(b"[]")
    assert decision.patch == [] and decision.allowed


def test_object_form_with_every_field() -> None:
    body = json.dumps(
        {
            "patch": OPS,
            "allowed": True,
            "status": {"code": 200, "message": "fine"},
            "warnings": ["w1", "w2"],
            "auditAnnotations": {"k": "v"},
        }
    ).encode()
    decision = parse_reply(body)
    assert decision.patch == OPS
    assert decision.allowed is True
    assert decision.message == "fine"
    assert decision.warnings == ("w1", "w2")
    assert decision.audit == {"k": "v"}


def test_object_form_denial() -> None:
    decision = parse_reply(b'{"allowed": false, "status": {"code": 422, "message": "no app label"}}')
    assert (decision.allowed, decision.code, decision.message, decision.patch) == (False, 422, "no app label", [])


@pytest.mark.parametrize("code", [200, 399, 600, "403", True, None, 1.5])
def test_status_code_outside_4xx_5xx_becomes_403(code: object) -> None:
    decision = parse_reply(json.dumps({"allowed": False, "status": {"code": code}}).encode())
    assert decision.code == 403


@pytest.mark.parametrize("body", [b"{}", b'{"patch": null, "warnings": null, "status": null}'])
def test_object_form_defaults(body: bytes) -> None:
    assert parse_reply(body) == EndpointDecision()


@pytest.mark.parametrize("body", [b"", b"  \n", b"not json", b"<html></html>", b"[", b"\xff\xfe\xfd", b'{"patch": [}'])
def test_invalid_json(body: bytes) -> None:
    with pytest.raises(ReplyError) as e:
        parse_reply(body)
    assert e.value.reason == "invalid-json"
    assert str(e.value).startswith("endpoint repl")


def test_empty_body_says_to_send_an_empty_array() -> None:
    with pytest.raises(ReplyError, match=r"send \[\] for no change"):
        parse_reply(b"")


@pytest.mark.parametrize(
    "body, fragment",
    [
        (b"5", "is a JSON number"),
        (b'"patch"', "is a JSON string"),
        (b"null", "is a JSON null"),
        (b"true", "is a JSON boolean"),
        (b'{"patches": []}', "unknown key 'patches'"),
        (b'{"patch": {"op": "add"}}', "'patch' is not an array"),
        (b'{"patch": "[]"}', "'patch' is not an array"),
        (b'{"allowed": "false"}', "'allowed' is not true or false"),
        (b'{"allowed": 0}', "'allowed' is not true or false"),
        (b'{"status": "denied"}', "'status' is not an object"),
        (b'{"status": {"message": 5}}', "'status.message' is not a string"),
        (b'{"warnings": "careful"}', "'warnings' is not an array of strings"),
        (b'{"warnings": ["ok", 5]}', "'warnings' is not an array of strings"),
        (b'{"auditAnnotations": ["k=v"]}', "'auditAnnotations' is not an object"),
    ],
)
def test_invalid_reply(body: bytes, fragment: str) -> None:
    with pytest.raises(ReplyError) as e:
        parse_reply(body)
    assert e.value.reason == "invalid-reply"
    assert fragment in str(e.value)


# ---------------------------------------------------------------- what Python's json would let through


@pytest.mark.parametrize("body", [b"[NaN]", b"[Infinity]", b"[-Infinity]", b'{"patch": [1e999]}', b"[-1e400]"])
def test_not_a_number_and_out_of_range_numbers_are_not_json(body: bytes) -> None:
    with pytest.raises(ReplyError) as e:
        parse_reply(body)
    assert e.value.reason == "invalid-json"


def test_numbers_in_range_are_kept() -> None:
    assert parse_reply(b'[{"op": "add", "path": "/x", "value": [1.5, 1e300, -2]}]').patch[0]["value"] == [
        1.5,
        1e300,
        -2,
    ]


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 100_000,
        b"[" * 100_000 + b"]" * 100_000,
        b'{"a":' * 5000 + b"1" + b"}" * 5000,
        b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1),
        b'{"patch": ' + b"[" * MAX_DEPTH + b"]" * MAX_DEPTH + b"}",
    ],
)
def test_nesting_over_the_bound_is_invalid_json_not_a_crash(body: bytes) -> None:
    with pytest.raises(ReplyError) as e:
        parse_reply(body)
    assert e.value.reason == "invalid-json"
    assert str(e.value) == f"endpoint reply is nested deeper than {MAX_DEPTH} levels"


def test_nesting_at_the_bound_is_parsed() -> None:
    value: object = "leaf"
    for _ in range(MAX_DEPTH - 2):
        value = {"k": value}
    body = json.dumps([{"op": "add", "path": "/metadata/annotations", "value": value}]).encode()
    assert body.count(b"{") + body.count(b"[") == MAX_DEPTH
    assert parse_reply(body).patch[0]["value"] == value


DEEP = b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1)


@pytest.mark.parametrize(
    "body, deeper",
    [
        # Brackets in strings are not structure, whatever escapes come before them.
        (b'["' + b"[" * 500 + b'"]', False),
        (b'["\\"' + b"[" * 500 + b'"]', False),
        (b'["\\\\", ' + b"[" * 500 + b"]" * 500 + b"]", True),
        (b'["a", "", "b", ' + b'"]", ' * 300 + DEEP + b"]", True),
        (b'["a", "", "b", ' + b'"]", ' * 300 + DEEP[2:-2] + b"]", False),
        # Wide is not deep; depth counts arrays and objects alike.
        (b"[" + b"[[1, {}], [2]], " * 1000 + b"[]]", False),
        (
            b'{"a": ' * (MAX_DEPTH // 2)
            + b"[" * (MAX_DEPTH // 2 + 1)
            + b"]" * (MAX_DEPTH // 2 + 1)
            + b"}" * (MAX_DEPTH // 2),
            True,
        ),
        (b"[" + b"[1, " * MAX_DEPTH + b"]" * MAX_DEPTH + b"]", True),
    ],
)
def test_depth_is_found_without_parsing(body: bytes, deeper: bool) -> None:
    assert nesting_exceeds(body, MAX_DEPTH) is deeper
    # The same as parsing it and measuring, for what is JSON.
    try:
        doc = json.loads(body)
    except ValueError:
        return
    assert (_depth(doc) > MAX_DEPTH) is deeper


def _depth(value: object) -> int:
    """Nesting depth of a parsed JSON value (iterative)."""
    deepest = 0
    todo = [(value, 1)]
    while todo:
        v, d = todo.pop()
        if isinstance(v, (list, dict)):
            deepest = max(deepest, d)
            todo.extend((c, d + 1) for c in (v.values() if isinstance(v, dict) else v))
    return deepest
