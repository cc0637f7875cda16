"""
No output of a review ever holds the query, password or fragment of an
endpoint URL (L{amp.urls.shown_url}, L{amp.urls.step_names}).

A property test: for chains of one to three endpoint URLs carrying secrets
in their query, their user information or their fragment (and a canary
URL that may carry them too), under either failure policy and in shadow
mode, with endpoints that patch, allow, deny,
fail or answer garbage, one review goes through amp's assembled site in
memory, and nothing amp says afterwards holds a secret: the answer (the
AdmissionReview, its decoded patch with the status stamp, its warnings,
audit annotations and deny message), every log line in both formats, the
metrics text and C{/debug/reviews}.
"""

from __future__ import annotations

import base64
import io
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest
from twisted.internet.testing import MemoryReactorClock
from twisted.logger import globalLogPublisher
from twisted.trial.unittest import SynchronousTestCase

from amp.canary import CANARY_ANNOTATION
from amp.cli.recorded_reply import recorded_reply
from amp.logs import ConfigurableObserver
from amp.metrics import Metrics
from amp.service import AmpService, namespace_source, serving_certificate
from amp.urls import parse_endpoint_url, shown_url, step_names
from tests.support.helpers import make_config, namespace, parse_raw_response, review_bytes
from tests.unit.http.test_channel import Connection, ListeningAtOnce, Transport, post_head

#: Every secret starts with this, and nothing else amp could say does.
MARK = "sekret"

_SECRET = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789", min_size=1, max_size=12).map(lambda s: MARK + s)


@st.composite
def endpoint_url(draw: Any) -> str:
    """An endpoint URL on one of three hosts, maybe carrying secrets."""
    host = draw(st.sampled_from(["ep-a.tools.svc", "ep-b.tools.svc", "blocked.example"]))
    port = draw(st.sampled_from(["", ":8080"]))
    path = draw(st.sampled_from(["/", "/mutate", "/m/x"]))
    user = draw(st.sampled_from(["", "user:{s}@", "{s}@"]))
    query = draw(st.sampled_from(["", "?token={s}", "?a=1&key={s}", "?{s}"]))
    fragment = draw(st.sampled_from(["", "", "", "#{s}"]))
    url = f"http://{user}{host}{port}{path}{query}{fragment}"
    while "{s}" in url:
        url = url.replace("{s}", draw(_SECRET), 1)
    return url


REPLIES = [
    b"[]",
    json.dumps([{"op": "add", "path": "/metadata/labels/x", "value": "y"}]).encode(),
    json.dumps({"allowed": False, "status": {"message": "not today"}}).encode(),
    json.dumps({"patch": [{"op": "replace", "path": "/metadata/name", "value": "x"}]}).encode(),
    b"{not json",
]


class NoSecretInAnyOutputTests(SynchronousTestCase):
    @settings(
        max_examples=150,
        derandomize=True,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    @given(
        chain=st.lists(endpoint_url(), min_size=1, max_size=3).filter(lambda c: MARK in " ".join(c)),
        policy=st.sampled_from(["Ignore", "Fail"]),
        shadow=st.booleans(),
        reply=st.sampled_from(REPLIES),
        code=st.sampled_from([200, 200, 500]),
        canary=st.one_of(st.none(), endpoint_url()),
    )
    def test_no_output_of_a_review_holds_a_query_password_or_fragment(
        self, chain: list[str], policy: str, shadow: bool, reply: bytes, code: int, canary: str | None
    ) -> None:
        annotation = " ".join(chain)
        outputs = self.review(annotation, policy, shadow, reply, code, canary)
        for name in ("json log", "text log", "/debug/reviews"):
            self.assertIn("u-1", outputs[name], f"the review is not in the {name}")
        for name, text in outputs.items():
            self.assertNotIn(MARK, text, f"{name} shows a secret of {annotation!r}:\n{text}")

    def review(
        self, annotation: str, policy: str, shadow: bool, reply: bytes, code: int, canary: str | None
    ) -> dict[str, str]:
        directory = Path(tempfile.mkdtemp(prefix="amp-secrets-"))
        self.addCleanup(shutil.rmtree, directory, True)
        config = make_config(
            {
                "team-a": namespace(
                    annotation,
                    failure_policy=policy,
                    mode="shadow" if shadow else None,
                    annotations={CANARY_ANNOTATION: canary} if canary else None,
                )
            },
            endpoints={"allow": ["http://*.tools.svc:*/*"], "chain_limit": 3},
            log={"format": "json"},
            metrics={"debug_reviews": 16},
        )
        clock = MemoryReactorClock()
        metrics = Metrics()
        json_log, text_log = io.StringIO(), io.StringIO()
        observers = [ConfigurableObserver("json", "debug", json_log), ConfigurableObserver("text", "debug", text_log)]
        for observer in observers:
            globalLogPublisher.addObserver(observer)
        try:
            service = AmpService(
                config,
                clock,
                certificate=serving_certificate(config.tls, clock, metrics),
                webhook_endpoint=ListeningAtOnce([]),
                metrics_endpoint=None,
                namespaces=namespace_source(config, clock, metrics),
                metrics=metrics,
                connector=recorded_reply(reply, code),
                install_sighup=False,
            )
            service.startService()
            transport = Transport()
            channel = service.webhook_server.buildProtocol(None)
            channel.makeConnection(transport)
            body = review_bytes(uid="u-1", namespace="team-a")
            Connection(channel, transport).send(post_head(len(body)) + body)
            status, _, answer = parse_raw_response(transport.value())
            # The log line, metrics and /debug/reviews come two turns after the answer.
            clock.advance(0)
            clock.advance(0)
            service.stopService()
        finally:
            for observer in observers:
                globalLogPublisher.removeObserver(observer)
        self.assertEqual(status, 200, answer)
        response = json.loads(answer)["response"]
        patch = base64.b64decode(response.get("patch", "")).decode()
        return {
            "answer": answer.decode(),
            "patch": patch,
            "json log": json_log.getvalue(),
            "text log": text_log.getvalue(),
            "metrics": generate_latest(metrics.registry).decode(),
            "/debug/reviews": json.dumps([d.as_json() for d in service.recent.select()]),
        }


class ShownTests(SynchronousTestCase):
    """What the property relies on, said plainly."""

    @settings(max_examples=300, derandomize=True, deadline=None)
    @given(chain=st.lists(endpoint_url(), min_size=1, max_size=4))
    def test_shown_url_and_step_names_never_show_a_secret(self, chain: list[str]) -> None:
        self.assertNotIn(MARK, shown_url(" ".join(chain)))
        for url in chain:
            self.assertNotIn(MARK, shown_url(url))
        checked = [parse_endpoint_url(u) for u in chain if "@" not in u and "#" not in u]
        names = step_names(checked)
        self.assertFalse(any(MARK in n for n in names), names)
        self.assertEqual(len(set(names)), len(names), "every step has a name of its own")
