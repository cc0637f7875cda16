"""
C{amp replay} over loopback: amp records real reviews to files, and the
recording is replayed through amp's own review core against the recorded
answers and against a candidate endpoint.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import stat
from typing import Any

import pytest

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.trial.unittest import TestCase

from twisted.internet.testing import MemoryReactorClock

from amp.cli import dispatch
from amp.metrics import Metrics
from amp.record import decode_line, encode_line, recording_files
from amp.cli.replay_run import ReplayOptions, replay
from tests.candidates import CANDIDATE_IMAGE, start_live_and_candidate
from tests.helpers import WebhookClient, decode_answer, make_config, namespace, pod, review_bytes, start_amp


class ReplayTests(TestCase):
    timeout = 30

    @inlineCallbacks
    def setUp(self) -> Any:
        self.example, self.candidate = yield start_live_and_candidate(self, reactor)
        self.directory = self.mktemp()
        config = make_config({
            "mesh": namespace(self.example.url("/sidecar")),
            "hub": namespace(self.example.url("/user-env")),
            "quiet": namespace(self.example.url("/sidecar")),
        }, record={"enabled": True, "directory": self.directory, "namespaces": ["mesh", "hub"]})
        amp = yield start_amp(config, reactor)
        client = WebhookClient(reactor)
        pods = [
            ("mesh", pod("web-1", labels={"track": "stable"})),
            ("mesh", pod("web-2", labels={"track": "canary"})),
            ("mesh", pod("web-3", labels={"track": "canary"})),
            ("hub", pod("nb-1", annotations={"hub.jupyter.org/username": "alice"})),
            ("quiet", pod("not-recorded")),
        ]
        for i, (ns, p) in enumerate(pods):
            _, body = yield client.post(amp.url("/mutate", "timeout=10s"), review_bytes(p, namespace=ns, uid=f"u{i}"))
            assert decode_answer(body)["response"]["allowed"]
        yield client.close()
        yield amp.stop()  # the recorder finishes its queue as amp stops
        self.files = recording_files(self.directory)

    @inlineCallbacks
    def replay(self, *argv: str) -> Any:
        out, err = io.StringIO(), io.StringIO()
        status = yield dispatch(["replay", *argv], reactor, stdout=out, stderr=err)
        return status, out.getvalue(), err.getvalue()

    def test_the_recording_holds_the_chosen_reviews_privately(self) -> None:
        self.assertEqual(len(self.files), 1)
        self.assertEqual(stat.S_IMODE(os.stat(self.files[0]).st_mode), 0o600)
        with open(self.files[0], "rb") as f:
            lines = [json.loads(line) for line in f]
        self.assertEqual([(x["namespace"]["name"], x["uid"]) for x in lines],
                         [("mesh", "u0"), ("mesh", "u1"), ("mesh", "u2"), ("hub", "u3")])
        first = lines[0]
        self.assertEqual(first["review"]["request"]["object"]["metadata"]["name"], "web-1")
        [shown] = first["route"]["endpoints"]
        self.assertTrue(self.example.url("/sidecar").startswith(shown), shown)
        self.assertEqual(first["answer"]["result"], "patched")
        self.assertEqual(first["answer"]["stamp"], f"mutated {shown}")
        self.assertTrue(any(op["path"] == "/spec/containers/-" for op in first["answer"]["patch"]))

    @inlineCallbacks
    def test_replaying_against_the_recorded_answers_finds_them_the_same(self) -> Any:
        status, out, err = yield self.replay(*self.files, "--config", self._config())
        self.assertEqual((status, err), (0, ""), out)
        self.assertEqual(out.splitlines()[-1],
                         "replayed 4 reviews against the recorded answers: 4 same, 0 different, 0 failed, 0 unreadable")

    @inlineCallbacks
    def test_a_candidate_is_compared_with_the_live_endpoint(self) -> Any:
        status, out, err = yield self.replay(*self.files, "--config", self._config(),
                                             "--against", self.candidate.url("/sidecar"))
        self.assertEqual(status, 1, out + err)
        lines = out.splitlines()
        # The reviews as they come, the counts last.
        self.assertIn("4 reviews", lines[-1])
        self.assertIn(": 1 same, 3 different", lines[-1], "hub's Pod goes to the candidate's sidecar too")
        self.assertTrue(lines[0].startswith("different  mesh/web-2 "), lines)
        self.assertIn(f"different  mesh/web-2 ({self.files[0]}:2)", lines)
        self.assertIn(f'    /spec/containers/1/image: "envoyproxy/envoy:v1.27.0" -> "{CANDIDATE_IMAGE}"', lines)
        self.assertNotIn("web-1", out)

    @inlineCallbacks
    def test_json_output_and_a_malformed_line(self) -> Any:
        with open(self.files[0], "ab") as f:
            f.write(b"{not json\n")
        status, out, err = yield self.replay(*self.files, "--config", self._config(), "-o", "json",
                                             "--endpoint", self.example.url("/sidecar"))
        self.assertEqual(status, 2, err)
        report = json.loads(out)
        self.assertEqual(report["summary"], {"reviews": 5, "same": 3, "different": 1, "failed": 0, "unreadable": 1})
        self.assertEqual(report["unreadable"][0].split(": ")[0], f"{self.files[0]}:5")
        [hub] = report["reviews"]
        self.assertEqual((hub["namespace"], hub["pod"], hub["verdict"]), ("hub", "nb-1", "different"))

    @inlineCallbacks
    def test_bad_usage_exits_2_with_one_line(self) -> Any:
        for argv in (["no-such-file.jsonl"], [*self.files, "--against", "ftp://x/"], []):
            status, out, err = yield self.replay(*argv)
            self.assertEqual(status, 2, argv)
            self.assertEqual(len(err.strip().splitlines()), 1, err)

    def _config(self) -> str:
        path = self.mktemp()
        with open(path, "w") as f:
            f.write('endpoints:\n  allow: ["http://127.0.0.1:*/*"]\nkubernetes:\n  source: static\n')
        return path


# ---------------------------------------------------------------- without endpoints


def _recording(count: int, *, uid: str = "r", **capture: Any) -> list[bytes]:
    from tests.test_record import _capture

    skipped = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                          "response": {"uid": "u", "allowed": True}}).encode()
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
    denied = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                         "response": {"uid": "u", "allowed": False, "status": {"code": 500, "message": "x"}}}).encode()
    lines = _recording(1, labels={"amp.txn2.com/enabled": "true"}, failure_policy="Fail", answer=denied,
                       result="failed", reason="no-endpoint")
    recorded = [decode_line(lines[0].rstrip(b"\n"), "rec:1")]
    report = replay(MemoryReactorClock(), ReplayOptions(config=make_config(failure_policy="auto")), recorded, None,
                    Metrics()).result
    assert report.counts()["same"] == 1, [r.as_json() for r in report.reviews]


def test_stdin_and_a_missing_file_is_bad_usage_in_one_line() -> None:
    out, err = io.StringIO(), io.StringIO()
    stdin = io.BytesIO(b"".join(_recording(2)))
    done = dispatch(["replay", "-", "no-such-file.jsonl"], MemoryReactorClock(), stdin=stdin, stdout=out,
                    stderr=err)
    assert done.result == 2
    assert err.getvalue() == "amp replay: cannot read no-such-file.jsonl: No such file or directory\n"


class _Answers:
    """An endpoint client that answers at once, with the patch of the URL's path."""

    def __init__(self, patches: dict[str, list]) -> None:
        self.patches = patches
        self.called: list[str] = []

    def call(self, url: Any, settings: Any, body: bytes, headers: Any, deadline: Any, breaker: Any = None,
             check: Any = None) -> Any:
        from twisted.internet.defer import succeed

        from amp.reply import EndpointDecision

        self.called.append(url.path)
        return succeed(EndpointDecision(patch=self.patches[url.path]))

    def ask(self, url: Any, settings: Any, body: bytes, headers: Any, deadline: Any, breaker: Any = None) -> Any:
        """As L{call}, the reply with its settle handle (what a review asks for)."""
        from amp.endpoint import CallReply

        return self.call(url, settings, body, headers, deadline, breaker).addCallback(
            lambda decision: CallReply(decision, lambda outcome: None))

    def ask_into(self, receiver: Any, url: Any, settings: Any, body: bytes, headers: Any, deadline: Any,
                 breaker: Any = None, caller_times: bool = False) -> None:
        """As L{ask}, told to C{receiver} (how a review asks)."""
        self.ask(url, settings, body, headers, deadline, breaker).addCallbacks(
            receiver.replied, receiver.failed)


def _note(path: str, value: str) -> list:
    return [{"op": "add", "path": f"/metadata/annotations/{path}", "value": value}]


CHAIN = {"/a": _note("a", "1"), "/b": _note("b", "1"), "/c": _note("a", "2"), "/d": _note("b", "2")}


def _chain_recording(**annotations: str) -> list[bytes]:
    return _recording(1, labels={"amp.txn2.com/enabled": "true"}, annotations={
        "amp.txn2.com/ep": "http://127.0.0.1:1/a http://127.0.0.1:1/b", **annotations})


@pytest.mark.parametrize("annotations, against, expected", [
    ({}, "/c", ["/metadata/annotations/a"]),
    ({"amp.txn2.com/canary-step": "2"}, "/d", ["/metadata/annotations/b"]),
])
def test_against_replaces_the_chain_step_a_canary_stands_in_for(annotations: dict, against: str,
                                                                 expected: list) -> None:
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
    done = run(["-", "--endpoint", "http://127.0.0.1:1/c http://127.0.0.1:1/d", "--config", str(config)],
               MemoryReactorClock(), stdin=stdin, stdout=out, stderr=err, endpoint_client=client)
    assert err.getvalue() == ""
    assert done.result == 1
    assert client.called == ["/c", "/d"]


def test_a_traced_reviews_difference_names_its_recorded_trace() -> None:
    """amp replay's differences name the trace the recorded review had: where its time went then."""
    from amp.cli.replay import render_json, render_text
    from amp.poddiff import Difference
    from amp.cli.replay_run import ReplayedReview, ReplayReport, Side

    trace = "0af7651916cd43dd8448eb211c80319c"
    line = json.loads(encode_line(_traced_capture(trace)))
    recorded = decode_line(json.dumps(line).encode(), "rec.jsonl:7")
    side = Side("patched", "", None)
    report = ReplayReport(reviews=[ReplayedReview(recorded, "different", side, side,
                                                  (Difference("/spec/x", 1, 2),))])
    text = render_text(report, None)
    assert "different  team-a/web (rec.jsonl:7) trace=0af7651916cd43dd8448eb211c80319c\n" in text
    assert json.loads(render_json(report))["reviews"][0]["trace_id"] == trace


def _traced_capture(trace_id: str) -> Any:
    from base64 import b64encode

    from amp.record import Capture

    answer = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                         "response": {"uid": "u1", "allowed": True, "patchType": "JSONPatch",
                                      "patch": b64encode(b"[]").decode()}}).encode()
    return Capture(time=0.0, uid="u1", namespace="team-a", labels={}, annotations={}, endpoints=("http://e:1/x",),
                   failure_policy="Ignore", mode="normal", request_body=review_bytes(pod("web")), answer_body=answer,
                   result="patched", reason="", trace_id=trace_id)
