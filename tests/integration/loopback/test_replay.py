"""
C{amp replay} over loopback: amp records real reviews to files, and the
recording is replayed through amp's own review core against the recorded
answers and against a candidate endpoint.  The same without endpoints, on a
MemoryReactorClock: tests/unit/cli/test_replay.py.
"""

from __future__ import annotations

import io
import json
import os
import stat
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.trial.unittest import TestCase

from amp.cli import dispatch
from amp.record import recording_files
from tests.support.candidates import CANDIDATE_IMAGE, start_live_and_candidate
from tests.support.helpers import WebhookClient, decode_answer, make_config, namespace, pod, review_bytes, start_amp


class ReplayTests(TestCase):
    timeout = 30

    @inlineCallbacks
    def setUp(self) -> Any:
        self.example, self.candidate = yield start_live_and_candidate(self, reactor)
        self.directory = self.mktemp()
        config = make_config(
            {
                "mesh": namespace(self.example.url("/sidecar")),
                "hub": namespace(self.example.url("/user-env")),
                "quiet": namespace(self.example.url("/sidecar")),
            },
            record={"enabled": True, "directory": self.directory, "namespaces": ["mesh", "hub"]},
        )
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
        self.assertEqual(
            [(x["namespace"]["name"], x["uid"]) for x in lines],
            [("mesh", "u0"), ("mesh", "u1"), ("mesh", "u2"), ("hub", "u3")],
        )
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
        self.assertEqual(
            out.splitlines()[-1],
            "replayed 4 reviews against the recorded answers: 4 same, 0 different, 0 failed, 0 unreadable",
        )

    @inlineCallbacks
    def test_a_candidate_is_compared_with_the_live_endpoint(self) -> Any:
        status, out, err = yield self.replay(
            *self.files, "--config", self._config(), "--against", self.candidate.url("/sidecar")
        )
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
        status, out, err = yield self.replay(
            *self.files, "--config", self._config(), "-o", "json", "--endpoint", self.example.url("/sidecar")
        )
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
