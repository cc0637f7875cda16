"""
Property tests for hostile input: whatever arrives as an AdmissionReview, and
whatever an endpoint answers, amp produces a well-formed answer or a clear
4xx; and every malformed config value is refused with a message that names
its key.

Runs without a reactor: the Admitter is driven on a L{Clock} and talks to an
in-memory endpoint through a L{ResourceConnector}.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import jsonpatch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from twisted.internet.task import Clock
from twisted.web.resource import Resource

from amp.admission import Admitter
from amp.admission_review import ReviewError, parse_review
from amp.breaker import BreakerRegistry
from amp.config import ConfigError, parse_config
from amp.deadline import Deadline
from amp.endpoint import EndpointClient
from amp.metrics import Metrics
from amp.namespaces import StaticNamespaceSource
from tests.support.endpoint_harness import ResourceConnector
from tests.support.helpers import make_config, namespace, pod, review

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5),
    max_leaves=30,
)

DENIED = ("/metadata/name", "/metadata/namespace", "/metadata/uid", "/status")


class Reply(Resource):
    """
    Answers every POST with whatever the test put in C{body}.
    """

    isLeaf = True
    body = b"[]"
    code = 200

    def render_POST(self, request: Any) -> bytes:
        request.setResponseCode(self.code)
        return self.body


def _admitter(reply: Reply, policy: str) -> tuple[Admitter, Clock]:
    clock = Clock()
    config = make_config(
        {
            "team-a": namespace("http://127.0.0.1:8090/ep", failure_policy=policy),
        }
    )
    metrics = Metrics()
    client = EndpointClient(clock, metrics, BreakerRegistry(clock), connector=ResourceConnector(reply))
    source = StaticNamespaceSource(config.kubernetes)
    return Admitter(config, source, client, clock, metrics), clock


def _answer(admitter: Admitter, clock: Clock, body: bytes) -> dict[str, Any]:
    # As the webhook reads it: the Pod's spec left raw until a patch reads it.
    req = parse_review(body, lazy=True)
    results: list = []
    admitter.review(req, Deadline.after(clock.seconds(), 9.5)).addBoth(results.append)
    clock.advance(10)
    assert len(results) == 1, "the review did not finish by its deadline"
    answer_bytes, _ = results[0]
    answer = json.loads(answer_bytes)
    assert answer["kind"] == "AdmissionReview"
    assert answer["apiVersion"] == req.api_version
    response = answer["response"]
    assert response["uid"] == req.uid
    assert isinstance(response["allowed"], bool)
    if "patch" in response:
        assert response["patchType"] == "JSONPatch"
    for w in response.get("warnings", []):
        assert len(w) < 120
    return response


@settings(max_examples=300, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=JSON)
def test_arbitrary_json_is_a_clear_400_or_a_wellformed_answer(doc: Any) -> None:
    reply = Reply()
    admitter, clock = _admitter(reply, "Ignore")
    body = json.dumps(doc).encode()
    try:
        parse_review(body, lazy=True)
    except ReviewError as e:
        assert e.code == 400
        assert e.message
        return
    _answer(admitter, clock, body)


@settings(max_examples=200, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    request_part=st.dictionaries(
        st.sampled_from(["uid", "kind", "operation", "namespace", "object", "dryRun", "subResource", "name"]),
        JSON,
        max_size=8,
    )
)
def test_review_with_arbitrary_request_fields(request_part: dict) -> None:
    """
    Valid envelope, garbage inside: still a 400 naming the field, or an
    answer echoing the uid.
    """
    doc = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request_part}
    reply = Reply()
    admitter, clock = _admitter(reply, "Fail")
    body = json.dumps(doc).encode()
    try:
        parse_review(body, lazy=True)
    except ReviewError as e:
        assert e.code == 400 and "request" in e.message
        return
    _answer(admitter, clock, body)


@settings(max_examples=300, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    reply_doc=JSON,
    code=st.sampled_from([200, 200, 200, 201, 204, 302, 400, 500]),
    policy=st.sampled_from(["Ignore", "Fail"]),
)
def test_arbitrary_endpoint_replies_never_yield_a_patch_that_fails(reply_doc: Any, code: int, policy: str) -> None:
    """
    Whatever the endpoint answers, a returned patch applies to the Pod and
    never touches a refused path.
    """
    reply = Reply()
    reply.body = json.dumps(reply_doc).encode()
    reply.code = code
    admitter, clock = _admitter(reply, policy)
    the_pod = pod()
    response = _answer(admitter, clock, json.dumps(review(the_pod, namespace="team-a")).encode())
    if "patch" in response:
        ops = json.loads(base64.b64decode(response["patch"]))
        jsonpatch.apply_patch(the_pod, ops)
        for op in ops:
            for path in (op.get("path", ""), op.get("from", "")):
                assert not any(path == d or path.startswith(d + "/") for d in DENIED), op


@settings(max_examples=200, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=st.lists(
        st.fixed_dictionaries(
            {
                "op": st.sampled_from(["add", "replace", "remove", "move", "copy", "test", "bogus"]),
                "path": st.sampled_from(
                    [
                        "/spec/containers/0/env/-",
                        "/spec/volumes/-",
                        "/metadata/labels/x",
                        "/metadata/name",
                        "/status",
                        "/spec/containers/5",
                        "",
                        "/spec",
                        "bad",
                    ]
                ),
                "value": JSON,
            }
        ),
        max_size=6,
    )
)
def test_patch_shaped_replies(ops: list) -> None:
    reply = Reply()
    reply.body = json.dumps(ops).encode()
    admitter, clock = _admitter(reply, "Ignore")
    the_pod = pod()
    response = _answer(admitter, clock, json.dumps(review(the_pod, namespace="team-a")).encode())
    assert response["allowed"] is True
    if "patch" in response:
        jsonpatch.apply_patch(the_pod, json.loads(base64.b64decode(response["patch"])))


CONFIG_KEYS = [
    ("listen", "port"),
    ("listen", "max_body"),
    ("listen", "request_timeout"),
    ("listen", "max_connections"),
    ("tls", "min_version"),
    ("tls", "reload_interval"),
    ("tls", "cert"),
    ("metrics", "port"),
    ("kubernetes", "source"),
    ("kubernetes", "watch_timeout"),
    ("kubernetes", "endpoint_annotations"),
    ("endpoints", "timeout"),
    ("endpoints", "allow"),
    ("endpoints", "pool_size"),
    ("endpoints", "retry"),
    ("deadline", "margin"),
    ("patch", "repair"),
    ("patch", "max_size"),
    ("patch", "denied_paths"),
    ("log", "format"),
]


@settings(max_examples=400, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(key=st.sampled_from(CONFIG_KEYS), value=JSON)
def test_config_errors_name_the_key(key: tuple[str, str], value: Any) -> None:
    section, name = key
    try:
        parse_config({section: {name: value}})
    except ConfigError as e:
        assert str(e).startswith(f"{section}.{name}:"), str(e)


@settings(max_examples=200, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=JSON)
def test_config_documents_of_any_shape(doc: Any) -> None:
    try:
        parse_config(doc)
    except ConfigError as e:
        assert str(e).split(":", 1)[0], str(e)
