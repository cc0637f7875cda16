"""
The benchmark harness works end to end: C{bench/run --quick} starts amp under
twistd, the endpoint, the fake Kubernetes API and wrk, measures every mode
with both bodies and writes its results.  Nothing here is about speed: every
answer must be the right one and the figures must be there and be sane.

wrk is installed by the project's set-up step (C{make tools}, which C{make
test} runs first) into C{~/.cache/amp-tools}; no test installs anything.
Without it the test says so and how to get it: a skip on a developer's
machine, a failure in CI (C{CI=true}).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.harness import WrkMissing, ensure_wrk

REPO = Path(__file__).resolve().parents[3]
WRK_MISSING = 3  # bench/run's exit status when wrk cannot be had
MODES = {"a", "b", "c", "d", "f", "g", "t", "u"}
BODIES = {"typical", "large"}


def require_wrk(what: str) -> None:
    """
    wrk, which the project's set-up step installs: without it, a failure in
    CI and a skip naming how to get it on a developer's machine (it is not a
    Python package, and no test installs anything).
    """
    try:
        ensure_wrk()
    except WrkMissing as e:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{what} cannot run in CI: {e}")
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    require_wrk("bench/run")
    out = tmp_path_factory.mktemp("bench-results")
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "run"), "--quick", "--out", str(out)],
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode != WRK_MISSING, done.stderr[-2000:]
    assert done.returncode == 0, f"bench/run --quick failed ({done.returncode}):\n{done.stderr[-5000:]}"
    written = sorted(out.glob("*.json"))
    assert len(written) == 1, f"expected one JSON result, found {written}"
    return json.loads(written[0].read_text()), out


def test_every_mode_and_body_is_measured(quick_run: tuple[dict, Path]) -> None:
    result, _ = quick_run
    assert result["namespace_source"] == "kubeconfig"
    measured = {(row["mode"], row["body"]) for row in result["table"]}
    assert measured == {(m, b) for m in MODES for b in BODIES}
    assert {(p["mode"], p["connections"]) for p in result["curve"]} == {(m, c) for m in "afgb" for c in (1, 4)}


def test_figures_are_sane(quick_run: tuple[dict, Path]) -> None:
    result, _ = quick_run
    for row in result["table"] + result["curve"]:
        where = f"mode ({row['mode']}) c={row['connections']}"
        assert row["reviews_per_s"] > 0, where
        lat = row["latency_ms"]
        assert 0 < lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["max"], (where, lat)
    for row in result["table"]:
        where = f"mode ({row['mode']}) {row['body']}"
        assert row["requests"] > 0 and not any(row["errors"].values()), (where, row["errors"])
        if row["mode"] == "a":
            assert "amp_cpu_ms_per_review" not in row and row["endpoint_cpu_ms_per_request"] > 0, where
            continue
        if row["mode"] in ("f", "g"):
            # The floors answered every review with the endpoint's patch (bench/run checked one answer and
            # wrk saw no error) and its own CPU and memory were measured.
            assert "amp_cpu_ms_per_review" not in row and row["floor_cpu_ms_per_review"] > 0, where
            assert 10 < row["floor_peak_rss_mib"] < 4096, where
            continue
        # amp's CPU per review is compared with the floors' and the endpoint's of the same run.
        assert row["amp_cpu_vs_floor"] > 0 and row["amp_cpu_vs_stack"] > 0 and row["amp_cpu_vs_endpoint"] > 0, where
        assert row["amp_cpu_ms_per_review"] > 0, where
        # A Python process running Twisted, pyOpenSSL and the kubernetes
        # client holds tens of MiB; under 10 MiB would mean a wrong pid.
        assert 10 < row["amp_peak_rss_mib"] < 4096, where
        # amp answered every request wrk counted, with the mode's result
        # unless the machine was too busy for a namespace GET or an endpoint
        # call in time (then under its failure policy, which bench/run
        # reports).
        expected = "result=skipped" if row["mode"] == "d" else "result=patched"
        results = {k: v for k, v in row["amp_counts"].items() if k.startswith("result=")}
        assert row["amp_counts"].get(expected, 0) > 0 and sum(results.values()) >= row["requests"], (
            where,
            row["amp_counts"],
        )
        assert set(results) - {expected} <= {"result=ignored"}, (where, results)
    assert result["machine"]["nproc"] >= 1 and result["machine"]["python"]


def test_tracing_off_1_and_100_percent_are_side_by_side(quick_run: tuple[dict, Path]) -> None:
    result, out = quick_run
    cost = {(c["mode"], c["body"]): c for c in result["tracing_cost"]}
    assert set(cost) == {(m, b) for m in "tu" for b in BODIES}
    off = {r["body"]: r for r in result["table"] if r["mode"] == "b"}
    for (mode, body), c in cost.items():
        assert c["ratio"] == {"t": 0.01, "u": 1.0}[mode]
        assert c["cpu_ms_per_review_off"] == off[body]["amp_cpu_ms_per_review"]
        assert c["cpu_ms_per_review"] > 0 and c["p99_ms"] > 0
    (md,) = out.glob("*.md")
    assert "**What tracing costs**" in md.read_text()


def test_markdown_table_is_written(quick_run: tuple[dict, Path]) -> None:
    _, out = quick_run
    (md,) = out.glob("*.md")
    text = md.read_text()
    assert "| mode | body | reviews/s |" in text
    assert "| amp CPU ÷ floor (f) | amp CPU ÷ stack floor (g) | amp CPU ÷ endpoint (a) |" in text
    for label in (
        "(a) endpoint alone",
        "(b) amp, warm namespace cache",
        "(c) amp, one Namespace GET",
        "(d) amp, namespace not enabled",
        "(f) floor: minimal Twisted TLS proxy",
        "(g) stack floor: twisted.web + Agent proxy",
    ):
        assert label in text


def test_the_safe_changes_bench_runs_the_canary_and_the_recorder(tmp_path: Path) -> None:
    """C{bench.safe_changes --quick}: four amps measured (a control beside plain for the noise); the canary compared
    reviews and the recorder wrote them (figures are only reported)."""
    require_wrk("bench.safe_changes")
    done = subprocess.run(
        [sys.executable, "-m", "bench.safe_changes", "--quick", "--out", str(tmp_path)],
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "safe-changes.json").read_text())
    assert {(r["variant"], r["connections"]) for r in result["rows"]} == {
        (v, c) for v in ("plain", "control", "canary", "record") for c in (1, 16)
    }
    assert all(r["errors"] == 0 and r["cpu_ms"] > 0 for r in result["rows"])
    # The candidate is the same endpoint: it never differs (under load a
    # review may time out, which the canary counts as skipped or failed).
    assert result["canary"].get("same", 0) > 0 and not result["canary"].get("differs")
    assert result["recorded"]["written"] > 0 and result["recording_files"] >= 1


def test_the_config_reload_bench_loads_every_hostile_file_each_way(tmp_path: Path) -> None:
    """C{bench.config_reload}: the good file loads, every hostile one is
    refused, each both ways, with its figures (only reported)."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.config_reload", "--repeat", "1", "--out", str(tmp_path)],
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    [written] = tmp_path.glob("config-reload-*.json")
    rows = {r["kind"]: r for r in json.loads(written.read_text())["rows"]}
    assert set(rows) == {"good", "alias-bomb", "50MiB", "1MiB-parsed", "deep-json", "nan", "invalid-utf8", "empty"}
    assert rows.pop("good")["result"] == "loaded"
    assert all(r["result"].startswith("refused: ") for r in rows.values()), rows
    assert all(r[how]["stall_ms"] > 0 for r in rows.values() for how in ("thread", "reactor"))


def test_the_listener_bench_measures_both_listeners_on_both_bodies() -> None:
    """C{bench.listener}: amp's listener and twisted.web's, each answering
    every request with its body (the script stops otherwise), figures only
    reported."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.listener", "--requests", "20"],
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert set(result) == BODIES
    for figures in result.values():
        assert figures["amp.http us/request"] > 0 and figures["twisted.web us/request"] > 0


@pytest.mark.parametrize("in_flight", [1, 4])
def test_the_review_path_bench_gets_the_endpoints_patch_for_every_review(in_flight: int) -> None:
    """C{bench.review_path}: every review through amp's listener, admitter
    and endpoint client in memory, one or several in flight, is answered
    200 with the endpoint's patch (the script stops otherwise); figures
    only reported."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.review_path", "--reviews", "8", "--in-flight", str(in_flight)],
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert set(result) == BODIES
    for figures in result.values():
        assert figures["in_flight"] == in_flight and figures["us/review"] > 0


def test_the_audit_bench_audits_its_fleet_with_one_call_per_template() -> None:
    """C{bench.audit --quick}: every Pod of the fleet judged, the Deployments with the old image stale, one endpoint
    call per workload template (the time is only reported)."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.audit", "--quick"], cwd=str(REPO), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout)
    assert found["states"] == {"current": found["pods"] // 2, "stale": found["pods"] // 2}
    assert found["endpoint_calls"] == found["workloads"] == 4
    assert found["exit_status"] == 1
