"""
The soak under injected faults: C{bench/soak --quick} runs amp under twistd
for a minute of load while its endpoint misbehaves in every way the chaos
endpoint knows, its serving certificate is rotated and the Kubernetes API
cuts its watch and answers 410, and must pass every criterion.  On a machine
busy with other work the soak may call its result inconclusive (only timing
failed): the test is then skipped, except in CI, where it fails.  The checks
the soak's client applies to each answer and its reconciliation are tested
here too, so that a soak that passes is known to be able to fail.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from importlib.machinery import SourceFileLoader
from importlib.util import module_from_spec, spec_from_loader
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
SOAK = REPO / "bench" / "soak"
from bench.chaos_endpoint import KINDS

INCONCLUSIVE = 3  # bench/soak's exit status when only timing failed on a busy machine
UID = "6f1c2d3e-4f50-4a6b-8c7d-0e1f2a3b4c5d"
V1 = "admission.k8s.io/v1"


def _load_soak() -> ModuleType:
    loader = SourceFileLoader("amp_soak", str(SOAK))
    spec = spec_from_loader("amp_soak", loader)
    assert spec is not None
    module = module_from_spec(spec)
    loader.exec_module(module)
    return module


soak = _load_soak()


@pytest.fixture(scope="module")
def quick_soak(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("soak-results")
    done = subprocess.run([sys.executable, str(SOAK), "--quick", "--wait-quiet", "20", "--out", str(out)],
                          cwd=str(REPO), capture_output=True, text=True, timeout=150)
    written = sorted(out.glob("soak-*.json"))
    assert len(written) == 1, f"expected one report, found {written}; stderr:\n{done.stderr[-3000:]}"
    report = json.loads(written[0].read_text())
    if done.returncode == INCONCLUSIVE:
        # Only timing criteria failed while other processes kept the
        # machine busy: that measures them, not amp.  CI runs on a machine
        # of its own, so there it is a failure.
        reason = f"soak inconclusive on a busy machine: {report.get('busy')}, failed {report.get('failed')}"
        if os.environ.get("CI") == "true":
            pytest.fail(reason + "\n" + done.stdout[-6000:])
        pytest.skip(reason)
    report["_exit"] = done.returncode
    report["_output"] = done.stdout[-6000:] + done.stderr[-3000:]
    return report


def test_quick_soak_passes(quick_soak: dict[str, Any]) -> None:
    failed = {name: c for name, c in quick_soak.get("criteria", {}).items() if not c["passed"]}
    assert quick_soak["_exit"] == 0 and quick_soak["passed"] and not failed, quick_soak["_output"]
    load = quick_soak["load"]
    assert load["sent"] >= 50 * 60 and load["violations"] == 0 and load["answered"] == load["sent"]


def test_every_fault_was_injected_and_counted_by_amp(quick_soak: dict[str, Any]) -> None:
    outcomes = quick_soak["criteria"]["outcomes"]
    for kind in KINDS:
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
    assert len(quick_soak["samples"]) >= 50
    assert 10 * 1024 < c["rss"]["median_last_third"] < 4 * 1024 * 1024, c["rss"]
    assert c["fds"]["median_last_third"] > 0, c["fds"]
    assert c["tls"]["rotations"] >= 10 and c["tls"]["reloads"]["success"] == c["tls"]["rotations"]
    assert c["tls"]["certificates_seen_by_client"] >= 2
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
SKIP_OP = {"op": "add", "path": soak.SKIPPED_PATH, "value": "timeout: http://127.0.0.1:1"}
IGNORED = {"uid": UID, "allowed": True, **_patch([SKIP_OP]),
           "warnings": ["amp: http://127.0.0.1:1 timeout; Pod admitted unchanged"],
           "auditAnnotations": {"error": "endpoint http://127.0.0.1:1 failed (timeout): no reply"}}
DENIED = {"uid": UID, "allowed": False,
          "status": {"code": 500, "message": "amp: endpoint http://127.0.0.1:1 failed (http-5xx): HTTP 500"}}
JSON_HEADERS = {"content-type": "application/json"}


def _check(ns: dict[str, Any], body: bytes, status: int = 200, version: str = V1) -> tuple[str, str, str]:
    return soak.check_answer(ns, version, UID, status, JSON_HEADERS, body, POD)


def test_client_names_good_answers() -> None:
    patched = {"uid": UID, "allowed": True, **_patch([LABEL_OP])}
    assert _check(IGNORE, _answer(patched)) == ("patched", "", "delay")
    assert _check(IGNORE, _answer(IGNORED)) == ("ignored", "timeout", "")
    assert _check(FAIL, _answer(DENIED)) == ("denied", "http-5xx", "")
    assert _check(OFF, _answer({"uid": UID, "allowed": True})) == ("skipped", "", "")
    beta = "admission.k8s.io/v1beta1"
    assert _check(OFF, _answer({"uid": UID, "allowed": True}, beta), version=beta) == ("skipped", "", "")


@pytest.mark.parametrize("ns,body,status", [
    (IGNORE, _answer({"uid": UID, "allowed": True}), 500),
    (IGNORE, b"not json", 200),
    (IGNORE, _answer({"uid": "someone-else", "allowed": True, **_patch([LABEL_OP])}), 200),
    (IGNORE, _answer({"uid": UID, "allowed": True, **_patch([LABEL_OP])}, "admission.k8s.io/v1beta1"), 200),
    (IGNORE, _answer(DENIED), 200),
    (FAIL, _answer(IGNORED), 200),
    (IGNORE, _answer({"uid": UID, "allowed": True,
                      **_patch([{"op": "replace", "path": "/metadata/labels/missing", "value": "x"}])}), 200),
    (IGNORE, _answer({"uid": UID, "allowed": True, "patch": "W10="}), 200),
    (IGNORE, _answer({"uid": UID, "allowed": True}), 200),
    (IGNORE, _answer({**IGNORED, "warnings": []}), 200),
    (FAIL, _answer({**DENIED, "status": {"code": 500, "message": "no reason here"}}), 200),
    (OFF, _answer({"uid": UID, "allowed": True, **_patch([LABEL_OP])}), 200),
])
def test_client_refuses_bad_answers(ns: dict[str, Any], body: bytes, status: int) -> None:
    with pytest.raises(soak.Violation):
        _check(ns, body, status)


def test_reconciliation_catches_a_miscounted_outcome() -> None:
    namespaces = [{"name": "soak-ignore", "port": "steady", "enabled": True}]
    ports = {"steady": 1}
    records = {"u1": {"uid": "u1", "ns": "soak-ignore", "out": "ignored", "reason": "timeout"},
               "u2": {"uid": "u2", "ns": "soak-ignore", "out": "patched", "reason": "", "kind": "ok"}}
    amp_log = {"u1": ("soak-ignore", "ignored", "timeout", 300.1), "u2": ("soak-ignore", "patched", "", 2.0)}
    calls = {"u1": ("steady", "hang"), "u2": ("steady", "ok")}
    injected = {"steady": {"hang": 1, "ok": 1}}
    counted = {"http://127.0.0.1:1": {"timeout": 1, "ok": 1}}
    good = soak.reconcile(namespaces, ports, records, amp_log, calls, injected, counted)
    assert good["problems"] == [] and good["review_mismatches"] == 0 and not any(good["endpoint_timing"].values())
    # amp counting the hang as a reset is a miscount ...
    wrong = soak.reconcile(namespaces, ports, records, amp_log, calls, injected,
                           {"http://127.0.0.1:1": {"connection-reset": 1, "ok": 1}})
    assert len(wrong["problems"]) == 2
    # ... and so is a review whose reason does not follow from the endpoint's behaviour,
    amp_log["u1"] = ("soak-ignore", "ignored", "invalid-json", 3.0)
    records["u1"]["reason"] = "invalid-json"
    assert soak.reconcile(namespaces, ports, records, amp_log, calls, injected, counted)["review_mismatches"] == 1
    # ... or a client that got something else than amp logged.
    amp_log["u1"] = ("soak-ignore", "ignored", "timeout", 300.1)
    assert soak.reconcile(namespaces, ports, records, amp_log, calls, injected, counted)["review_mismatches"] == 1


def test_reconciliation_tells_timing_apart_from_miscounts() -> None:
    namespaces = [{"name": "soak-fail", "port": "steady", "enabled": True}]
    records = {uid: {"uid": uid, "ns": "soak-fail", "out": "denied", "reason": reason}
               for uid, reason in (("u1", "timeout"), ("u2", "timeout"), ("u3", "concurrency-limit"))}
    amp_log = {"u1": ("soak-fail", "denied", "timeout", 300.4), "u2": ("soak-fail", "denied", "timeout", 300.2),
               "u3": ("soak-fail", "denied", "concurrency-limit", 0.1)}
    # u1: the endpoint answered after amp's timeout; u2: it never read the
    # call; u3: amp's bulkhead refused it.
    counted = {"http://127.0.0.1:1": {"timeout": 2, "concurrency-limit": 1}}
    result = soak.reconcile(namespaces, {"steady": 1}, records, amp_log, {"u1": ("steady", "delay")},
                            {"steady": {"delay": 1}}, counted)
    assert result["problems"] == [] and result["review_mismatches"] == 0
    assert result["endpoint_timing"] == {"late_answers": 1, "unread_calls": 1, "bulkhead_refusals": 1,
                                        "cancelled_by_client": 0}
    # A bulkhead refusal amp did not count is a miscount, not timing.
    counted["http://127.0.0.1:1"]["concurrency-limit"] = 0
    result = soak.reconcile(namespaces, {"steady": 1}, records, amp_log, {"u1": ("steady", "delay")},
                            {"steady": {"delay": 1}}, counted)
    assert len(result["problems"]) == 1


def _samples(busy: set[int]) -> list[dict[str, Any]]:
    return [{"t": float(t), "other_cpu_pct": 80.0 if t in busy else 5.0} for t in range(30)]


def test_timing_failures_are_put_down_to_a_busy_machine_only_when_they_coincide() -> None:
    samples = _samples({12})
    assert soak.attributable(["endpoint_timing"], samples, [(12.2, 12.5)])["attributable"]
    assert soak.attributable(["deadlines", "endpoint_timing"], samples, [(11.5, 12.1), (13.0, 13.9)])["attributable"]
    # A late answer in a quiet second is amp's.
    assert not soak.attributable(["endpoint_timing"], samples, [(12.2, 12.5), (3.0, 3.3)])["attributable"]
    # A miscount is never the machine's.
    assert not soak.attributable(["outcomes", "endpoint_timing"], samples, [(12.2, 12.5)])["attributable"]
    # Growth of RSS or fds only when the last third had a busy second.
    assert not soak.attributable(["rss"], samples, [])["attributable"]
    assert soak.attributable(["fds"], _samples({25}), [])["attributable"]
    # amp runnable and given no CPU at all makes a busy second too.
    starved = [dict(x, amp_main_thread="R:0") if x["t"] == 3 else x for x in samples]
    assert soak.attributable(["deadlines"], starved, [(3.4, 3.9)])["attributable"]


def test_a_review_cancelled_is_timing_only_when_the_client_gave_up() -> None:
    namespaces = [{"name": "soak-ignore", "port": "steady", "enabled": True}]
    amp_log = {"u1": ("soak-ignore", "ignored", "cancelled", 2900.0)}
    calls = {"u1": ("steady", "ok")}
    counted = {"http://127.0.0.1:1": {"cancelled": 1}}
    gave_up = {"u1": {"uid": "u1", "ns": "soak-ignore", "out": "violation", "late": True, "at": 1.0}}
    result = soak.reconcile(namespaces, {"steady": 1}, gave_up, amp_log, calls, {"steady": {"ok": 1}}, counted)
    assert result["problems"] == [] and result["endpoint_timing"]["cancelled_by_client"] == 1
    assert result["endpoint_timing"]["late_answers"] == 0
    waited = {"u1": {"uid": "u1", "ns": "soak-ignore", "out": "ignored", "reason": "cancelled", "at": 1.0}}
    result = soak.reconcile(namespaces, {"steady": 1}, waited, amp_log, calls, {"steady": {"ok": 1}}, counted)
    assert result["review_mismatches"] == 1
