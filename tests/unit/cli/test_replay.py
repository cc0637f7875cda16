"""
C{amp replay} without endpoints: a recording replayed through amp's own
review core on a L{MemoryReactorClock}, against the recorded answers or an
in-memory candidate: the chain step a candidate stands in for, the
failure policy as it was answered, bad usage, bounded memory and recorded
traces.  Recording real reviews over loopback and replaying them against a
live candidate is in tests/integration/loopback/test_replay.py.
"""

from __future__ import annotations

import dataclasses
import io
import json
from typing import Any

import pytest
from twisted.internet.testing import MemoryReactorClock

from amp.cli import dispatch
from amp.cli.replay_run import ReplayOptions, replay
from amp.metrics import Metrics
from amp.record import decode_line, encode_line
from tests.support.helpers import make_config, pod, review_bytes


def _recording(count: int, *, uid: str = "r", **capture: Any) -> list[bytes]:
    from tests.unit.record.test_record import _capture

    skipped = json.dumps(
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": {"uid": "u", "allowed": True}}
    ).encode()
    values: dict[str, Any] = dict(labels={}, annotations={}, endpoints=(), answer=skipped, result="skipped")
    values.update(capture)
    return [encode_line(_capture(uid=f"{uid}{i}", **values)) for i in range(count)]


class _TrackedReview(dict):  # type: ignore[type-arg]
    """A recorded review a weak reference can follow."""


def test_a_replay_holds_no_recorded_review_once_compared() -> None:
    import gc
    import weakref

    refs: list[Any] = []

    def recordings() -> Any:
        for i, line in enumerate(_recording(50)):
            recorded = decode_line(line.rstrip(b"\n"), f"rec:{i + 1}")
            review = _TrackedReview(recorded.review)
            refs.append(weakref.ref(review))
            yield dataclasses.replace(recorded, review=review)

    done = replay(MemoryReactorClock(), ReplayOptions(config=make_config()), recordings(), None, Metrics())
    report = done.result
    gc.collect()
    assert report.counts() == {"reviews": 50, "same": 50, "different": 0, "failed": 0, "unreadable": 0}
    assert report.exit_status == 0
    assert [r for r in refs if r() is not None] == []


def test_replay_resolves_failure_policy_auto_as_the_recording_was_answered() -> None:
    # An enabled namespace without an endpoint: amp denied it under Fail
    # (the cluster's policy, config auto); replayed, it is denied again.
    denied = json.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "response": {"uid": "u", "allowed": False, "status": {"code": 500, "message": "x"}},
        }
    ).encode()
    lines = _recording(
        1,
        labels={"amp.txn2.com/enabled": "true"},
        failure_policy="Fail",
        answer=denied,
        result="failed",
        reason="no-endpoint",
    )
    recorded = [decode_line(lines[0].rstrip(b"\n"), "rec:1")]
    report = replay(
        MemoryReactorClock(), ReplayOptions(config=make_config(failure_policy="auto")), recorded, None, Metrics()
    ).result
    assert report.counts()["same"] == 1, [r.as_json() for r in report.reviews]


def test_stdin_and_a_missing_file_is_bad_usage_in_one_line() -> None:
    out, err = io.StringIO(), io.StringIO()
    stdin = io.BytesIO(b"".join(_recording(2)))
    done = dispatch(["replay", "-", "no-such-file.jsonl"], MemoryReactorClock(), stdin=stdin, stdout=out, stderr=err)
    assert done.result == 2
    assert err.getvalue() == "amp replay: cannot read no-such-file.jsonl: No such file or directory\n"


class _Answers:
    """An endpoint client that answers at once, with the patch of the URL's path."""

    def __init__(self, patches: dict[str, list]) -> None:
        self.patches = patches
        self.called: list[str] = []

    def call(self, request: Any, receiver: Any) -> None:
        """Answer C{request} at once (told to C{receiver} before returning, as a refusal is)."""
        from amp.endpoint import CallReply
        from amp.reply import EndpointDecision

        self.called.append(request.url.path)
        receiver.replied(CallReply(EndpointDecision(patch=self.patches[request.url.path]), lambda outcome: None))


def _note(path: str, value: str) -> list:
    return [{"op": "add", "path": f"/metadata/annotations/{path}", "value": value}]


CHAIN = {"/a": _note("a", "1"), "/b": _note("b", "1"), "/c": _note("a", "2"), "/d": _note("b", "2")}


def _chain_recording(**annotations: str) -> list[bytes]:
    return _recording(
        1,
        labels={"amp.txn2.com/enabled": "true"},
        annotations={"amp.txn2.com/ep": "http://127.0.0.1:1/a http://127.0.0.1:1/b", **annotations},
    )


@pytest.mark.parametrize(
    "annotations, against, expected",
    [
        ({}, "/c", ["/metadata/annotations/a"]),
        ({"amp.txn2.com/canary-step": "2"}, "/d", ["/metadata/annotations/b"]),
    ],
)
def test_against_replaces_the_chain_step_a_canary_stands_in_for(
    annotations: dict, against: str, expected: list
) -> None:
    client = _Answers(CHAIN)
    recorded = [decode_line(_chain_recording(**annotations)[0].rstrip(b"\n"), "rec:1")]
    options = ReplayOptions(config=make_config(), against=f"http://127.0.0.1:1{against}")
    report = replay(MemoryReactorClock(), options, recorded, client, Metrics()).result
    [review] = report.reviews
    assert [d.path for d in review.differences] == expected
    chain = ["/a", "/b"]
    chain[int(annotations.get("amp.txn2.com/canary-step", "1")) - 1] = against
    assert client.called == ["/a", "/b", *chain]


def test_endpoint_takes_a_chain_in_the_annotations_form(tmp_path: Any) -> None:
    from amp.cli.replay import run

    config = tmp_path / "amp.yaml"
    config.write_text('endpoints:\n  allow: ["http://127.0.0.1:*/*"]\n')
    client = _Answers(CHAIN)
    out, err = io.StringIO(), io.StringIO()
    stdin = io.BytesIO(_chain_recording()[0])
    done = run(
        ["-", "--endpoint", "http://127.0.0.1:1/c http://127.0.0.1:1/d", "--config", str(config)],
        MemoryReactorClock(),
        stdin=stdin,
        stdout=out,
        stderr=err,
        endpoint_client=client,
    )
    assert err.getvalue() == ""
    assert done.result == 1
    assert client.called == ["/c", "/d"]


def test_a_traced_reviews_difference_names_its_recorded_trace() -> None:
    """amp replay's differences name the trace the recorded review had: where its time went then."""
    from amp.cli.replay import render_json, render_text
    from amp.cli.replay_run import ReplayedReview, ReplayReport, Side
    from amp.poddiff import Difference

    trace = "0af7651916cd43dd8448eb211c80319c"
    line = json.loads(encode_line(_traced_capture(trace)))
    recorded = decode_line(json.dumps(line).encode(), "rec.jsonl:7")
    side = Side("patched", "", None)
    report = ReplayReport(reviews=[ReplayedReview(recorded, "different", side, side, (Difference("/spec/x", 1, 2),))])
    text = render_text(report, None)
    assert "different  team-a/web (rec.jsonl:7) trace=0af7651916cd43dd8448eb211c80319c\n" in text
    assert json.loads(render_json(report))["reviews"][0]["trace_id"] == trace


def _traced_capture(trace_id: str) -> Any:
    from base64 import b64encode

    from amp.record import Capture

    answer = json.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "response": {"uid": "u1", "allowed": True, "patchType": "JSONPatch", "patch": b64encode(b"[]").decode()},
        }
    ).encode()
    return Capture(
        time=0.0,
        uid="u1",
        namespace="team-a",
        labels={},
        annotations={},
        endpoints=("http://e:1/x",),
        failure_policy="Ignore",
        mode="normal",
        request_body=review_bytes(pod("web")),
        answer_body=answer,
        result="patched",
        reason="",
        trace_id=trace_id,
    )
