"""
bench/storm's arithmetic, without a cluster: quantiles from the increase of
a histogram between two scrapes, what the API server's coarse buckets can
say, the goals judged from a summary, and its section of bench/latest.md
surviving bench/run's rewrite of the file.
"""

from __future__ import annotations

from typing import Any

from bench.storm_report import STORM_BEGIN, STORM_END, goals, storm_section, summary, with_section
from bench.storm_scenarios import histogram_quantile, stamps
from tests.support.prometheus import Scrape

HIST = "amp_admission_duration_seconds"


def histogram(counts: dict[str, float], total_s: float) -> Scrape:
    """A scrape holding one histogram with these cumulative bucket counts."""
    lines = [f'{HIST}_bucket{{le="{le}"}} {n}' for le, n in counts.items()]
    lines += [f"{HIST}_count {counts['+Inf']}", f"{HIST}_sum {total_s}"]
    return Scrape("\n".join(lines) + "\n")


def test_a_quantile_comes_from_the_increase_between_scrapes_not_the_totals() -> None:
    before = histogram({"0.001": 1000, "0.005": 1000, "0.01": 1000, "+Inf": 1000}, 0.5)
    # 100 new answers: 50 within 1 ms, 49 more within 5 ms, one within 10 ms
    after = histogram({"0.001": 1050, "0.005": 1099, "0.01": 1100, "+Inf": 1100}, 0.7)
    assert histogram_quantile(before, after, HIST, 0.5) == 1.0
    assert abs(histogram_quantile(before, after, HIST, 0.99) - 5.0) < 1e-9
    assert histogram_quantile(before, before, HIST, 0.99) is None


def test_stamps_are_counted_by_outcome_and_reason() -> None:
    def pod(stamp: Any) -> dict[str, Any]:
        return {"metadata": {"annotations": {"amp.txn2.com/status": stamp} if stamp else {}}}

    pods = [
        pod("mutated"),
        pod("mutated"),
        pod("skipped timeout http://127.0.0.1:1"),
        pod("mutated http://127.0.0.1:1"),
        pod(None),
    ]
    assert stamps(pods) == {"mutated": 3, "skipped timeout": 1, "(none)": 1}


def run(scenario: str, target: str, ready: float, create_ms: float, **extra: Any) -> dict[str, Any]:
    return {
        "scenario": scenario,
        "target": target,
        "round": 1,
        "pods": 500,
        "ready_s": ready,
        "creates": {"count": 500, "mean_ms": create_ms},
        "stamps": {"mutated": 500},
        "series": [],
        **extra,
    }


def test_the_goals_compare_amp_with_both_floors() -> None:
    hook = {
        "calls": 500,
        "mean_ms": 1.8,
        "within_ms": {"5": 496, "25": 500, "100": 500},
        "rejections": 0,
        "fail_open": 0,
    }
    runs = [
        run("scale-up", "none", 20.0, 4.0),
        run("scale-up", "policy", 20.5, 5.0),
        run(
            "scale-up",
            "amp",
            21.0,
            7.0,
            webhook=hook,
            amp={"cpu_ms_per_pod": 0.3, "answer_p99_ms": 2.5, "answer_mean_ms": 1.5, "endpoint_mean_ms": 0.8},
        ),
    ]
    s = summary(runs)
    assert s["scale-up"]["amp"]["webhook_p99_bound_ms"] == 5.0  # 99.2% of calls within the 5 ms bucket
    met = {goal.split(" <=")[0]: (measured, ok) for goal, measured, ok in goals(s)}
    # budget: policy adds 1.0 ms over none, the endpoint 0.8 ms, plus 1 ms: 2.8 ms; amp's p99 as the API
    # server sees it: its own 2.5 ms + (1.8 - 1.5) ms around it = 2.8 ms
    assert met["amp's p99 webhook latency (scale-up)"][1] == "yes"
    assert met["scale-up time to all ready"] == ("1.05x (21.00 s vs 20.00 s)", "yes")


def test_bench_runs_rewrite_keeps_the_storm_section() -> None:
    section = f"{STORM_BEGIN}\n## Storm\nfigures\n{STORM_END}\n"
    first = with_section("# amp benchmark\nold table\n", section)
    assert first.startswith("# amp benchmark\nold table\n") and storm_section(first) == section
    # bench/run writes its new text with the section it found
    rewritten = with_section("# amp benchmark\nnew table\n", storm_section(first))
    assert "old table" not in rewritten and storm_section(rewritten) == section
    # a new storm run replaces its section only
    newer = with_section(rewritten, f"{STORM_BEGIN}\n## Storm\nnewer\n{STORM_END}\n")
    assert "new table" in newer and "newer" in newer and newer.count(STORM_BEGIN) == 1


# The API server's own exposition of one webhook's admission metrics, as its
# /metrics writes them: the counters keep the names they were registered
# with (``..._count``, no ``_total``).
_HOOK = 'name="w.amp",operation="CREATE",rejected="false",type="admit"'
_LATENCY = "apiserver_admission_webhook_admission_duration_seconds"
_REJECTED = 'error_type="calling_webhook_error",name="w.amp",operation="CREATE",rejection_code="500",type="admit"'
APISERVER = (
    "\n".join(
        [
            f"# TYPE {_LATENCY} histogram",
            f'{_LATENCY}_bucket{{{{{_HOOK},le="0.005"}}}} {{fast}}',
            f'{_LATENCY}_bucket{{{{{_HOOK},le="+Inf"}}}} {{calls}}',
            f"{_LATENCY}_sum{{{{{_HOOK}}}}} {{seconds}}",
            f"{_LATENCY}_count{{{{{_HOOK}}}}} {{calls}}",
            "# HELP apiserver_admission_webhook_fail_open_count [ALPHA] Admission webhook fail open count",
            "# TYPE apiserver_admission_webhook_fail_open_count counter",
            'apiserver_admission_webhook_fail_open_count{{name="w.amp",type="admit"}} {fail_open}',
            'apiserver_admission_webhook_fail_open_count{{name="other.amp",type="admit"}} 7',
            "# TYPE apiserver_admission_webhook_rejection_count counter",
            f"apiserver_admission_webhook_rejection_count{{{{{_REJECTED}}}}} {{rejections}}",
        ]
    )
    + "\n"
)


def test_the_api_servers_fail_open_and_rejection_counts_are_read_for_the_webhook() -> None:
    # A storm test's "no fail-open" must be able to fail: a Pod the API
    # server admitted without amp's answer (its own timeout, under Ignore)
    # is counted here and nowhere in amp.
    from tests.e2e.workloads import admission

    before = Scrape(APISERVER.format(fast=10, calls=10, seconds=0.02, fail_open=1, rejections=0))
    after = Scrape(APISERVER.format(fast=400, calls=510, seconds=900.5, fail_open=6, rejections=2))
    seen = admission(before, after, "w.amp")
    assert (seen.calls, seen.rejections, seen.fail_open) == (500, 2, 5)
    assert abs(seen.seconds - 900.48) < 1e-6
    assert seen.within == {0.005: 390}
    assert admission(before, after, "none.amp").fail_open == 0
