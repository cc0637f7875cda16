"""
Tests for L{amp.recent}: the ring buffer of recent decisions and the
C{/debug/reviews} resource, without a reactor (the resource is rendered
with Twisted's L{DummyRequest}).  The end-to-end path (real reviews in,
C{/debug/reviews} out on the metrics port) is in tests/integration/loopback/test_metrics.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from twisted.web.test.requesthelper import DummyRequest

from amp.recent import FIELD_LIMIT, MESSAGE_LIMIT, Decision, RecentDecisions, RecentDecisionsResource, rfc3339


def decision(uid: str = "u1", namespace: str = "team-a", pod: str = "web-1", **kw: Any) -> Decision:
    fields: dict[str, Any] = dict(
        uid=uid,
        time=1_795_000_000.25,
        namespace=namespace,
        pod=pod,
        endpoint="http://ep.svc:8080",
        result="ignored",
        reason="apply-failed",
        message="endpoint http://ep.svc:8080 failed (apply-failed): no",
        duration_ms=12.345,
    )
    fields.update(kw)
    return Decision(**fields)


def get(resource: RecentDecisionsResource, **args: str) -> DummyRequest:
    request = DummyRequest([b""])
    request.method = b"GET"
    for name, value in args.items():
        request.addArg(name.encode(), value.encode())
    body = resource.render(request)
    request.written.append(body)
    return request


def body(request: DummyRequest) -> str:
    return b"".join(request.written).decode("utf-8")


def test_keeps_only_the_last_n_oldest_first() -> None:
    recent = RecentDecisions(3)
    for i in range(5):
        recent.record(decision(uid=f"u{i}"))
    assert [d.uid for d in recent.select()] == ["u2", "u3", "u4"]
    assert len(recent) == 3


def test_size_zero_keeps_nothing() -> None:
    recent = RecentDecisions(0)
    recent.record(decision())
    assert recent.select() == []
    assert recent.size == 0


def test_long_fields_are_clipped_so_memory_stays_bounded() -> None:
    recent = RecentDecisions(2)
    recent.record(decision(uid="u" * 100_000, pod="p" * 100_000, message="m" * 100_000))
    (kept,) = recent.select()
    assert len(kept.uid) == FIELD_LIMIT and kept.uid.endswith("...")
    assert len(kept.pod) == FIELD_LIMIT
    assert len(kept.message) == MESSAGE_LIMIT
    assert kept.namespace == "team-a"
    short = decision()
    recent.record(short)
    assert recent.select()[-1] is short


def test_filters_match_exactly_and_together() -> None:
    recent = RecentDecisions(10)
    recent.record(decision(uid="a", namespace="team-a", pod="web-1"))
    recent.record(decision(uid="b", namespace="team-a", pod="web-2"))
    recent.record(decision(uid="c", namespace="team-b", pod="web-1"))
    assert [d.uid for d in recent.select(namespace="team-a")] == ["a", "b"]
    assert [d.uid for d in recent.select(pod="web-1")] == ["a", "c"]
    assert [d.uid for d in recent.select(namespace="team-b", pod="web-1")] == ["c"]
    assert [d.uid for d in recent.select(uid="b")] == ["b"]
    assert recent.select(namespace="team") == []


def test_resize_keeps_the_newest() -> None:
    recent = RecentDecisions(4)
    for i in range(4):
        recent.record(decision(uid=f"u{i}"))
    recent.resize(2)
    assert [d.uid for d in recent.select()] == ["u2", "u3"]
    recent.resize(5)
    for i in range(4, 7):
        recent.record(decision(uid=f"u{i}"))
    assert [d.uid for d in recent.select()] == ["u2", "u3", "u4", "u5", "u6"]
    recent.resize(0)
    recent.record(decision(uid="later"))
    assert recent.select() == []


def test_json_form_has_rfc3339_time_and_rounded_duration() -> None:
    out = decision().as_json()
    assert out == {
        "uid": "u1",
        "time": "2026-11-18T11:06:40.250Z",
        "namespace": "team-a",
        "pod": "web-1",
        "endpoint": "http://ep.svc:8080",
        "result": "ignored",
        "reason": "apply-failed",
        "message": "endpoint http://ep.svc:8080 failed (apply-failed): no",
        "duration_ms": 12.3,
    }


def test_rfc3339_is_utc_with_milliseconds() -> None:
    assert rfc3339(0) == "1970-01-01T00:00:00.000Z"
    assert rfc3339(1.9999) == "1970-01-01T00:00:01.999Z"


def test_resource_serves_a_json_list_oldest_first() -> None:
    recent = RecentDecisions(10)
    recent.record(decision(uid="a"))
    recent.record(decision(uid="b", result="patched", reason="", message=""))
    request = get(RecentDecisionsResource(recent))
    assert request.responseCode in (None, 200)
    assert request.responseHeaders.getRawHeaders(b"content-type") == [b"application/json"]
    listed = json.loads(body(request))
    assert [d["uid"] for d in listed] == ["a", "b"]
    assert listed[1]["result"] == "patched"


def test_resource_serves_json_lines_and_filters() -> None:
    recent = RecentDecisions(10)
    recent.record(decision(uid="a", namespace="team-a"))
    recent.record(decision(uid="b", namespace="team-b"))
    recent.record(decision(uid="c", namespace="team-a", pod="other"))
    request = get(RecentDecisionsResource(recent), format="jsonl", namespace="team-a", pod="web-1")
    assert request.responseHeaders.getRawHeaders(b"content-type") == [b"application/x-ndjson"]
    lines = body(request).splitlines()
    assert [json.loads(line)["uid"] for line in lines] == ["a"]


def test_resource_with_nothing_matching_is_an_empty_list() -> None:
    recent = RecentDecisions(10)
    recent.record(decision(uid="a"))
    assert json.loads(body(get(RecentDecisionsResource(recent), uid="nope"))) == []
    assert body(get(RecentDecisionsResource(recent), uid="nope", format="jsonl")) == ""


def test_resource_is_404_when_off() -> None:
    request = get(RecentDecisionsResource(RecentDecisions(0)))
    assert request.responseCode == 404
    assert "metrics.debug_reviews: 0" in body(request)


def test_resource_turns_off_and_on_with_a_resize() -> None:
    recent = RecentDecisions(5)
    resource = RecentDecisionsResource(recent)
    recent.resize(0)
    assert get(resource).responseCode == 404
    recent.resize(5)
    recent.record(decision())
    assert len(json.loads(body(get(resource)))) == 1


@pytest.mark.parametrize("fmt", ["yaml", "JSON"])
def test_resource_refuses_an_unknown_format(fmt: str) -> None:
    request = get(RecentDecisionsResource(RecentDecisions(5)), format=fmt)
    assert request.responseCode == 400
    assert "format" in body(request) and fmt in body(request)


def test_resource_refuses_an_unknown_parameter_naming_the_known_ones() -> None:
    """A misspelt filter (namspace=) must not answer with every review."""
    recent = RecentDecisions(5)
    recent.record(decision(namespace="team-a"))
    request = get(RecentDecisionsResource(recent), namspace="x")
    assert request.responseCode == 400
    assert (
        body(request)
        == "'namspace': unknown parameter (did you mean namespace?) (known: format, namespace, pod, uid, trace_id)\n"
    )
