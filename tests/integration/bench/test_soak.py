"""
The soak under injected faults: C{python -m bench.soak --quick} runs amp under
twistd for a short run of load while its endpoint misbehaves in every way the
chaos endpoint knows, its serving certificate is rotated and the Kubernetes
API cuts its watch and answers 410, and must pass every behaviour criterion:
every review answered well-formed and reconciled with what was injected, a
clean log, RSS under its bound, no file descriptor left open.  Timing
(answers before the API server's timeout) is reported, not judged, in a
quick run: a busy machine can break it on its own.  The checks the soak's
client applies to each answer and its reconciliation are tested here too, so
that a soak that passes is known to be able to fail.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from twisted.internet.error import ConnectionDone
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from bench.chaos_endpoint import (
    DEEP_JSON_DEPTH,
    EXPECTED_OUTCOMES,
    FAULT_KINDS,
    HOSTILE_KINDS,
    Chaos,
    ChaosResource,
    QuietSite,
)
from bench.soak.load import Violation, check_answer
from bench.soak.reconcile import outcome_keys, reconcile
from bench.soak.settings import MAX_RESPONSE, QUICK_DURATION, QUICK_RATE, REVIEW_REASONS

REPO = Path(__file__).resolve().parents[3]
UID = "6f1c2d3e-4f50-4a6b-8c7d-0e1f2a3b4c5d"
V1 = "admission.k8s.io/v1"


@pytest.fixture(scope="module")
def quick_soak(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("soak-results")
    done = subprocess.run(
        [sys.executable, "-m", "bench.soak", "--quick", "--out", str(out)],
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=300,
    )
    written = sorted(out.glob("soak-*.json"))
    assert len(written) == 1, f"expected one report, found {written}; stderr:\n{done.stderr[-3000:]}"
    report = json.loads(written[0].read_text())
    report["_exit"] = done.returncode
    report["_output"] = done.stdout[-6000:] + done.stderr[-3000:]
    return report


def test_quick_soak_passes(quick_soak: dict[str, Any]) -> None:
    failed = {name: c for name, c in quick_soak.get("criteria", {}).items() if c["judged"] and not c["passed"]}
    assert quick_soak["_exit"] == 0 and quick_soak["passed"] and not failed, quick_soak["_output"]
    load = quick_soak["load"]
    # Every review sent got a well-formed answer (late ones too).
    assert load["sent"] >= QUICK_RATE * QUICK_DURATION and load["answered"] == load["sent"]
    assert load["violations"] == 0 and load["unanswered"] == 0


def test_only_timing_goes_unjudged_in_a_quick_run(quick_soak: dict[str, Any]) -> None:
    judged = {name for name, c in quick_soak["criteria"].items() if c["judged"]}
    assert judged == {"answers", "outcomes", "log", "rss", "fds", "tls", "watch"}


def test_every_fault_was_injected_and_counted_by_amp(quick_soak: dict[str, Any]) -> None:
    outcomes = quick_soak["criteria"]["outcomes"]
    for kind in FAULT_KINDS:
        assert outcomes["injected_total"][kind] > 0, (kind, outcomes["injected_total"])
    reconciliation = outcomes["reconciliation"]
    assert reconciliation["review_mismatches"] == 0, reconciliation["mismatch_examples"]
    for port, origin in reconciliation["origins"].items():
        assert all(row["match"] for row in origin["rows"]), (port, origin["rows"])
        assert origin["reached_endpoint"] > 0, port
    # The sensitive breaker opened, and amp said so for exactly the reviews
    # it refused; the other one never did.
    assert reconciliation["origins"]["flaky"]["breaker_open"] > 0
    assert reconciliation["origins"]["steady"]["breaker_open"] == 0


def test_resources_rotation_and_watch_figures_are_reported(quick_soak: dict[str, Any]) -> None:
    c = quick_soak["criteria"]
    assert len(quick_soak["samples"]) >= QUICK_DURATION / 2
    # A Python process with Twisted, pyOpenSSL and the kubernetes client
    # holds tens of MiB; under 10 MiB would mean a wrong pid.
    assert 10 * 1024 < c["rss"]["max"] <= c["rss"]["limit_mib"] * 1024, c["rss"]
    assert c["fds"]["before_load"] > 0 and c["fds"]["after_load_idle"] <= c["fds"]["before_load"] + c["fds"]["slack"]
    assert c["tls"]["rotations"] >= 2 and c["tls"]["reloads"]["success"] == c["tls"]["rotations"]
    assert c["tls"]["certificates_served"] >= 2 and not c["tls"]["served_unknown"]
    assert c["watch"]["amp_restarts"].get("expired", 0) >= 1 and c["watch"]["amp_restarts"].get("dropped", 0) >= 1


# ---------------------------------------------------------------------- the client's checks


POD = {"metadata": {"labels": {"app": "x"}, "annotations": {"a": "b"}}, "spec": {"containers": []}}
IGNORE = {"name": "soak-ignore", "policy": "Ignore", "enabled": True}
FAIL = {"name": "soak-fail", "policy": "Fail", "enabled": True}
OFF = {"name": "soak-off", "policy": None, "enabled": False}


def _answer(response: dict[str, Any], version: str = V1) -> bytes:
    return json.dumps({"apiVersion": version, "kind": "AdmissionReview", "response": response}).encode()


def _patch(ops: list[dict[str, Any]]) -> dict[str, Any]:
    return {"patchType": "JSONPatch", "patch": base64.b64encode(json.dumps(ops).encode()).decode()}


LABEL_OP = {"op": "add", "path": "/metadata/labels/amp.soak~1patched", "value": "delay"}
STATUS_PATH = "/metadata/annotations/amp.txn2.com~1status"
MUTATED_OP = {"op": "add", "path": STATUS_PATH, "value": "mutated http://127.0.0.1:1"}
SKIP_OP = {"op": "add", "path": STATUS_PATH, "value": "skipped timeout http://127.0.0.1:1"}
IGNORED = {
    "uid": UID,
    "allowed": True,
    **_patch([SKIP_OP]),
    "warnings": ["amp: http://127.0.0.1:1 timeout; admitted without the endpoint's patch"],
    "auditAnnotations": {"error": "endpoint http://127.0.0.1:1 failed (timeout): no reply"},
}
DENIED = {
    "uid": UID,
    "allowed": False,
    "status": {"code": 500, "message": "amp: endpoint http://127.0.0.1:1 failed (http-5xx): HTTP 500"},
}
JSON_HEADERS = {"content-type": "application/json"}


def _check(ns: dict[str, Any], body: bytes, status: int = 200, version: str = V1) -> tuple[str, str, str]:
    return check_answer(ns, version, UID, status, JSON_HEADERS, body, POD)


def test_client_names_good_answers() -> None:
    patched = {"uid": UID, "allowed": True, **_patch([LABEL_OP, MUTATED_OP])}
    assert _check(IGNORE, _answer(patched)) == ("patched", "", "delay")
    assert _check(IGNORE, _answer(IGNORED)) == ("ignored", "timeout", "")
    assert _check(FAIL, _answer(DENIED)) == ("failed", "http-5xx", "")
    assert _check(OFF, _answer({"uid": UID, "allowed": True})) == ("skipped", "", "")
    beta = "admission.k8s.io/v1beta1"
    assert _check(OFF, _answer({"uid": UID, "allowed": True}, beta), version=beta) == ("skipped", "", "")


@pytest.mark.parametrize(
    "ns,body,status",
    [
        (IGNORE, _answer({"uid": UID, "allowed": True}), 500),
        (IGNORE, b"not json", 200),
        (IGNORE, _answer({"uid": "someone-else", "allowed": True, **_patch([LABEL_OP])}), 200),
        (IGNORE, _answer({"uid": UID, "allowed": True, **_patch([LABEL_OP])}, "admission.k8s.io/v1beta1"), 200),
        (IGNORE, _answer(DENIED), 200),
        (FAIL, _answer(IGNORED), 200),
        (
            IGNORE,
            _answer(
                {
                    "uid": UID,
                    "allowed": True,
                    **_patch([{"op": "replace", "path": "/metadata/labels/missing", "value": "x"}]),
                }
            ),
            200,
        ),
        (IGNORE, _answer({"uid": UID, "allowed": True, "patch": "W10="}), 200),
        (IGNORE, _answer({"uid": UID, "allowed": True}), 200),
        (IGNORE, _answer({"uid": UID, "allowed": True, **_patch([LABEL_OP])}), 200),
        (IGNORE, _answer({"uid": UID, "allowed": True, **_patch([LABEL_OP, SKIP_OP])}), 200),
        (IGNORE, _answer({**IGNORED, "warnings": []}), 200),
        (FAIL, _answer({**DENIED, "status": {"code": 500, "message": "no reason here"}}), 200),
        (OFF, _answer({"uid": UID, "allowed": True, **_patch([LABEL_OP])}), 200),
    ],
)
def test_client_refuses_bad_answers(ns: dict[str, Any], body: bytes, status: int) -> None:
    with pytest.raises(Violation):
        _check(ns, body, status)


def test_reconciliation_catches_a_miscounted_outcome() -> None:
    namespaces = [{"name": "soak-ignore", "port": "steady", "enabled": True}]
    ports = {"steady": 1}
    records = {
        "u1": {"uid": "u1", "ns": "soak-ignore", "out": "ignored", "reason": "timeout"},
        "u2": {"uid": "u2", "ns": "soak-ignore", "out": "patched", "reason": "", "kind": "ok"},
    }
    amp_log = {"u1": ("soak-ignore", "ignored", "timeout", 300.1), "u2": ("soak-ignore", "patched", "", 2.0)}
    calls = {"u1": ("steady", "hang"), "u2": ("steady", "ok")}
    injected = {"steady": {"hang": 1, "ok": 1}}
    counted = {"http://127.0.0.1:1": {"timeout": 1, "ok": 1}}
    good = reconcile(namespaces, ports, records, amp_log, calls, injected, counted)
    assert good["problems"] == [] and good["review_mismatches"] == 0 and not any(good["endpoint_timing"].values())
    # amp counting the hang as a reset is a miscount ...
    wrong = reconcile(
        namespaces, ports, records, amp_log, calls, injected, {"http://127.0.0.1:1": {"connection-reset": 1, "ok": 1}}
    )
    assert len(wrong["problems"]) == 2
    # ... and so is a review whose reason does not follow from the endpoint's behaviour,
    amp_log["u1"] = ("soak-ignore", "ignored", "invalid-json", 3.0)
    records["u1"]["reason"] = "invalid-json"
    assert reconcile(namespaces, ports, records, amp_log, calls, injected, counted)["review_mismatches"] == 1
    # ... or a client that got something else than amp logged.
    amp_log["u1"] = ("soak-ignore", "ignored", "timeout", 300.1)
    assert reconcile(namespaces, ports, records, amp_log, calls, injected, counted)["review_mismatches"] == 1


def test_reconciliation_tells_timing_apart_from_miscounts() -> None:
    namespaces = [{"name": "soak-fail", "port": "steady", "enabled": True}]
    records = {
        uid: {"uid": uid, "ns": "soak-fail", "out": "failed", "reason": reason}
        for uid, reason in (("u1", "timeout"), ("u2", "timeout"), ("u3", "queue-timeout"))
    }
    amp_log = {
        "u1": ("soak-fail", "failed", "timeout", 300.4),
        "u2": ("soak-fail", "failed", "timeout", 300.2),
        "u3": ("soak-fail", "failed", "queue-timeout", 0.1),
    }
    # u1: the endpoint answered after amp's timeout; u2: it never read the
    # call; u3: amp's bulkhead refused it.
    counted = {"http://127.0.0.1:1": {"timeout": 2, "queue-timeout": 1}}
    result = reconcile(
        namespaces, {"steady": 1}, records, amp_log, {"u1": ("steady", "delay")}, {"steady": {"delay": 1}}, counted
    )
    assert result["problems"] == [] and result["review_mismatches"] == 0
    assert result["endpoint_timing"] == {
        "late_answers": 1,
        "unread_calls": 1,
        "bulkhead_refusals": 1,
        "cancelled_by_client": 0,
    }
    # A bulkhead refusal amp did not count is a miscount, not timing.
    counted["http://127.0.0.1:1"]["queue-timeout"] = 0
    result = reconcile(
        namespaces, {"steady": 1}, records, amp_log, {"u1": ("steady", "delay")}, {"steady": {"delay": 1}}, counted
    )
    assert len(result["problems"]) == 1


def test_a_review_cancelled_is_timing_only_when_the_client_gave_up() -> None:
    namespaces = [{"name": "soak-ignore", "port": "steady", "enabled": True}]
    amp_log = {"u1": ("soak-ignore", "ignored", "cancelled", 2900.0)}
    calls = {"u1": ("steady", "ok")}
    counted = {"http://127.0.0.1:1": {"cancelled": 1}}
    gave_up = {"u1": {"uid": "u1", "ns": "soak-ignore", "out": "violation", "late": True, "at": 1.0}}
    result = reconcile(namespaces, {"steady": 1}, gave_up, amp_log, calls, {"steady": {"ok": 1}}, counted)
    assert result["problems"] == [] and result["endpoint_timing"]["cancelled_by_client"] == 1
    assert result["endpoint_timing"]["late_answers"] == 0
    waited = {"u1": {"uid": "u1", "ns": "soak-ignore", "out": "ignored", "reason": "cancelled", "at": 1.0}}
    result = reconcile(namespaces, {"steady": 1}, waited, amp_log, calls, {"steady": {"ok": 1}}, counted)
    assert result["review_mismatches"] == 1


# ---------------------------------------------------------------------- the hostile endpoints


class HostileKindsTests(SynchronousTestCase):
    """
    What the chaos endpoint sends for each hostile kind (C{--hostile}), on an
    in-memory connection with a Clock.
    """

    FLOOD = 256 * 1024

    def answer(self, kind: str) -> tuple[Any, StringTransport, Clock]:
        clock = Clock()
        chaos = Chaos(clock, 1, {**{k: 0 for k in FAULT_KINDS}, kind: 1}, (5, 5), 80 * 1024, None, self.FLOOD)
        # The site's reactor is the Clock: the channel's idle timer must not
        # land on the global reactor (trial then finds it in a later test).
        channel = QuietSite(ChaosResource(chaos, "p"), reactor=clock).buildProtocol(None)
        transport = StringTransport()
        channel.makeConnection(transport)
        channel.dataReceived(b"POST /x HTTP/1.1\r\nHost: x\r\nX-Amp-Uid: u1\r\nContent-Length: 2\r\n\r\n{}")
        return channel, transport, clock

    def run_out(self, clock: Clock) -> None:
        for _ in range(10_000):
            if not clock.getDelayedCalls():
                return
            clock.advance(0.002)
        self.fail("the endpoint kept sending")

    def test_a_header_flood_never_ends_its_head_and_stops_at_its_bound(self) -> None:
        channel, transport, clock = self.answer("header-flood")
        self.run_out(clock)
        sent = transport.value()
        self.assertTrue(sent.startswith(b"HTTP/1.1 200 OK\r\n"))
        self.assertNotIn(b"\r\n\r\n", sent)
        self.assertGreater(sent.count(b"\r\nX-H"), 10_000)
        self.assertTrue(self.FLOOD <= len(sent) <= self.FLOOD + 70 * 1024, len(sent))

    def test_a_huge_header_is_one_line_that_never_ends(self) -> None:
        channel, transport, clock = self.answer("huge-header")
        self.run_out(clock)
        head = transport.value()
        self.assertEqual(head.count(b"\r\n"), 2)  # the status line and Content-Type; X-Big never ends
        self.assertGreaterEqual(len(head.rsplit(b"\r\n", 1)[1]), self.FLOOD)

    def test_deep_json_is_json_nested_past_any_decoder_limit_under_the_reply_limit(self) -> None:
        channel, transport, clock = self.answer("deep-json")
        _, _, body = transport.value().partition(b"\r\n\r\n")
        self.assertLess(len(body), MAX_RESPONSE)
        self.assertEqual(body, b"[" * DEEP_JSON_DEPTH + b"]" * DEEP_JSON_DEPTH)
        with self.assertRaises(RecursionError):
            json.loads(body)

    def test_a_drip_never_completes_its_body_and_stops_when_the_caller_hangs_up(self) -> None:
        channel, transport, clock = self.answer("drip")
        clock.advance(0.02)
        for _ in range(50):
            clock.advance(0.02)
        head, _, body = transport.value().partition(b"\r\n\r\n")
        self.assertIn(b"content-length: 4096", head.lower())
        self.assertTrue(0 < len(body) < 4096, len(body))
        channel.connectionLost(Failure(ConnectionDone()))
        self.assertEqual(clock.getDelayedCalls(), [])


def test_every_kind_has_expected_outcomes_and_review_reasons() -> None:
    for kind in FAULT_KINDS + HOSTILE_KINDS:
        assert EXPECTED_OUTCOMES[kind], kind
        assert kind in ("ok", "delay") or REVIEW_REASONS[kind], kind


def test_kinds_share_a_reconciliation_row_only_when_their_outcomes_overlap() -> None:
    assert outcome_keys(list(FAULT_KINDS))["hang"] == "timeout+cancelled"
    assert outcome_keys(list(FAULT_KINDS))["garbage"] == "invalid-json"
    keys = outcome_keys(list(FAULT_KINDS + HOSTILE_KINDS))
    assert keys["hang"] == keys["drip"] == keys["header-flood"] == keys["huge-header"]
    assert keys["deep-json"] == keys["garbage"] == "invalid-json"
    assert keys["oversized"] == "response-too-large"
