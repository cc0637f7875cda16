"""
Strings that are not valid Unicode in a review (lone surrogate escapes such
as C{"\\udc80"}, which Python's C{json} reads but no UTF-8 encoder writes):
the one rule (L{amp.text}, applied in L{amp.admission_review.parse_review}) is a 400
that names the field, since an API server never sends one.

The property: any review the parser accepts can be encoded for the
endpoint and answered, the endpoint called with the Pod; any review it
refuses holds a lone surrogate, at the path its message names.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from amp.admission_review import ReviewError, parse_review
from amp.text import lone_surrogate, may_hold_surrogate
from tests.support.helpers import pod, review
from tests.unit.admission.test_properties import Reply, _admitter, _answer

PATCH = [{"op": "add", "path": "/metadata/labels/checked", "value": "yes"}]

#: Text of any character, lone surrogates (and valid pairs, as their two
#: halves in a row) included.
TEXT = st.text(st.one_of(st.characters(), st.characters(categories=["Cs"])), max_size=6)


class Recording(Reply):
    """An endpoint that adds a label and keeps the Pods it was sent."""

    def __init__(self) -> None:
        super().__init__()
        self.body = json.dumps(PATCH).encode()
        self.pods: list[Any] = []

    def render_POST(self, request: Any) -> bytes:
        self.pods.append(json.loads(request.content.read()))
        return super().render_POST(request)


def reviewed_pod(name: str, labels: dict, annotations: dict, env: str) -> dict[str, Any]:
    containers = [{"name": "app", "image": "nginx:1.25", "env": [{"name": "E", "value": env}]}]
    return pod(name or "web", labels=labels, annotations=annotations, containers=containers)


def surrogate_paths(doc: Any) -> bool:
    return lone_surrogate(doc) is not None


@settings(max_examples=300, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=TEXT,
    labels=st.dictionaries(TEXT, TEXT, max_size=3),
    annotations=st.dictionaries(TEXT, TEXT, max_size=3),
    env=TEXT,
    lazy=st.booleans(),
)
def test_a_review_the_parser_accepts_is_encoded_for_the_endpoint_and_answered(
    name: str, labels: dict, annotations: dict, env: str, lazy: bool
) -> None:
    doc = review(reviewed_pod(name, labels, annotations, env))
    # As JSON can carry them: lone surrogates only as escapes.
    body = json.dumps(doc, ensure_ascii=True).encode()
    try:
        parse_review(body, lazy=lazy)
    except ReviewError as e:
        assert e.code == 400
        path = lone_surrogate(doc)
        assert path is not None, e.message
        assert f"at {path}" in e.message
        assert "not valid Unicode" in e.message
        return
    assert lone_surrogate(doc) is None
    endpoint = Recording()
    admitter, clock = _admitter(endpoint, "Fail")
    response = _answer(admitter, clock, body)
    assert response["allowed"] is True, response
    assert "patch" in response, response
    assert len(endpoint.pods) == 1
    assert endpoint.pods[0]["metadata"]["annotations"] == annotations


class LoneSurrogateTests(SynchronousTestCase):
    def refused(self, doc: Any) -> str:
        body = json.dumps(doc, ensure_ascii=True).encode()
        for lazy in (False, True):
            e = self.assertRaises(ReviewError, parse_review, body, lazy=lazy)
            self.assertEqual(e.code, 400)
        return e.message

    def test_an_annotation_value_is_named_by_its_path(self) -> None:
        message = self.refused(review(pod(annotations={"team.example/owner": "a\udc80"})))
        self.assertIn('at request.object.metadata.annotations["team.example/owner"]', message)
        self.assertIn("an API server never sends one", message)

    def test_an_annotation_key_is_named_as_a_name(self) -> None:
        message = self.refused(review(pod(annotations={"k\ud800": "v"})))
        self.assertIn('at request.object.metadata.annotations["k\\ud800"] (its name)', message)

    def test_in_the_spec_which_the_hot_path_keeps_raw(self) -> None:
        # msgspec checks escapes in what it skips too: the hot path refuses
        # it at once, named by the careful path.
        containers = [{"name": "app", "image": "nginx", "args": ["ok", "\udfff"]}]
        message = self.refused(review(pod(containers=containers)))
        self.assertIn("at request.object.spec.containers[0].args[1]", message)

    def test_anywhere_in_the_review(self) -> None:
        doc = review(pod())
        doc["request"]["userInfo"]["username"] = "\udc80"
        self.assertIn("at request.userInfo.username", self.refused(doc))

    def test_valid_pairs_and_escaped_backslashes_are_not_refused(self) -> None:
        # An emoji written as a surrogate pair, and a backslash before
        # "ud800" (text, not an escape).
        doc = review(pod(annotations={"a": "\U0001f600", "b": "\\ud800"}))
        body = json.dumps(doc, ensure_ascii=True).encode()
        self.assertTrue(may_hold_surrogate(body))
        req = parse_review(body)
        self.assertEqual(req.object["metadata"]["annotations"], {"a": "\U0001f600", "b": "\\ud800"})

    def test_most_bodies_are_not_searched_further(self) -> None:
        body = json.dumps(review(pod(annotations={"a": "caf\u00e9 <b>"})), ensure_ascii=True).encode()
        self.assertIn(b"\\u00e9", body)
        self.assertFalse(may_hold_surrogate(body))


class EndpointReplyTests(SynchronousTestCase):
    def test_a_reply_with_a_lone_surrogate_is_invalid_json_naming_where(self) -> None:
        from amp.reply import ReplyError, parse_reply

        e = self.assertRaises(ReplyError, parse_reply, b'[{"op":"add","path":"/metadata/labels/a","value":"x\\udc80"}]')
        self.assertEqual(e.reason, "invalid-json")
        self.assertIn("[0].value", str(e))

    def test_the_review_goes_to_the_failure_policy_not_an_internal_error(self) -> None:
        endpoint = Reply()
        endpoint.body = b'[{"op":"add","path":"/metadata/labels/a","value":"\\udc80"}]'
        admitter, clock = _admitter(endpoint, "Fail")
        response = _answer(admitter, clock, json.dumps(review(pod())).encode())
        self.assertFalse(response["allowed"])
        self.assertIn("invalid-json", response["status"]["message"])
