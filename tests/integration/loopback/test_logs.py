"""
The one log line a real review writes (L{amp.logs}): an in-process amp on a
loopback TLS port reviews Pods against the example endpoints, logging
through the JSON observer on the global log publisher (as under twistd);
the line carries the review's fields and never the Pod.  The observers,
formats and the limit on repeated lines are tested in memory in
tests/unit/observability/test_logs.py, whose helpers these tests share.
"""

from __future__ import annotations

import io
import json
import re
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.logger import globalLogPublisher
from twisted.trial.unittest import TestCase

from amp.logs import make_observer
from tests.support.helpers import (
    WebhookClient,
    decode_answer,
    make_config,
    namespace,
    pod,
    review_bytes,
    start_amp,
    start_example,
)
from tests.unit.observability.test_logs import REVIEW_FIELDS, lines_of

SECRET_VALUE = "hunter2-do-not-log"
SECRET_IMAGE = "gcr.io/team/secret-app:1.0"


class ReviewLogTests(TestCase):
    """
    The one line a real review logs, through the JSON observer on the
    global log publisher (as under twistd).
    """

    timeout = 30

    @inlineCallbacks
    def setUp(self) -> Any:
        self.buf = io.StringIO()
        observer = make_observer("json", "info", self.buf)
        globalLogPublisher.addObserver(observer)
        self.addCleanup(globalLogPublisher.removeObserver, observer)
        self.example = yield start_example(reactor)
        self.addCleanup(self.example.stop)
        ex = self.example.url
        config = make_config(
            {
                "team-a": namespace(ex("/user-env")),
                "broken": namespace(ex("/error")),
                "shadow": namespace(ex("/registry"), mode="shadow"),
            },
            log={"format": "json"},
        )
        self.amp = yield start_amp(config, reactor)
        self.addCleanup(self.amp.stop)
        self.client = WebhookClient(reactor)
        self.addCleanup(self.client.close)
        self.origin = f"http://127.0.0.1:{self.example.port}"

    def secret_pod(self) -> dict[str, Any]:
        return pod(
            "notebook",
            annotations={"hub.jupyter.org/username": "alice", "team.example/token": SECRET_VALUE},
            containers=[
                {"name": "app", "image": SECRET_IMAGE, "env": [{"name": "DB_PASSWORD", "value": SECRET_VALUE}]}
            ],
        )

    @inlineCallbacks
    def admit(self, ns: str, uid: str) -> Any:
        response, body = yield self.client.post(
            self.amp.url("/mutate", "timeout=10s"), review_bytes(self.secret_pod(), namespace=ns, uid=uid)
        )
        self.assertEqual(response.code, 200)
        return decode_answer(body)["response"]

    def review_line(self, uid: str) -> dict[str, Any]:
        found = [
            line for line in lines_of(self.buf) if line["logger"] == "amp.web.ReviewHandler" and line.get("uid") == uid
        ]
        self.assertEqual(len(found), 1, self.buf.getvalue())
        return found[0]

    @inlineCallbacks
    def test_patched_review_line(self) -> Any:
        answer = yield self.admit("team-a", "uid-patched")
        line = self.review_line("uid-patched")
        patch_bytes = json.dumps(answer["_patch"], separators=(",", ":")).encode("utf-8")
        self.assertEqual(
            {k: line[k] for k in REVIEW_FIELDS if k != "duration_ms"},
            {
                "uid": "uid-patched",
                "namespace": "team-a",
                "pod": "notebook",
                "endpoint": self.origin,
                "result": "patched",
                "reason": "",
                "patch_size": len(patch_bytes),
            },
        )
        self.assertIsInstance(line["duration_ms"], float)
        self.assertGreater(line["duration_ms"], 0)
        self.assertIn("team-a/notebook patched", line["message"])

    @inlineCallbacks
    def test_failed_review_line_names_the_reason(self) -> Any:
        yield self.admit("broken", "uid-broken")
        line = self.review_line("uid-broken")
        self.assertEqual((line["result"], line["reason"], line["endpoint"]), ("ignored", "http-5xx", self.origin))

    @inlineCallbacks
    def test_no_pod_body_in_the_logs(self) -> Any:
        """
        Neither the container image, nor env values, nor annotation values
        of the Pod appear anywhere in what amp (or the example endpoint
        server) logged for the reviews.
        """
        yield self.admit("team-a", "uid-1")
        yield self.admit("broken", "uid-2")
        text = self.buf.getvalue()
        self.assertIn("uid-1", text)
        self.assertIn("uid-2", text)
        for secret in (SECRET_VALUE, SECRET_IMAGE, "secret-app", "DB_PASSWORD"):
            self.assertNotIn(secret, text)
        self.assertIsNone(re.search(r'"(object|spec|containers)"\s*:', text))

    @inlineCallbacks
    def test_no_pod_content_in_shadow_mode_logs(self) -> Any:
        """
        Shadow mode logs what the endpoint would have done, but not the
        values of its patch (which are derived from the Pod).
        """
        answer = yield self.admit("shadow", "uid-shadow")
        self.assertIsNone(answer["_patch"], "shadow mode never patches")
        text = self.buf.getvalue()
        self.assertIn("uid-shadow", text)
        self.assertNotIn("team/secret-app", text)
