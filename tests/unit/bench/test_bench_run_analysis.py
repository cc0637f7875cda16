"""
bench/run's arithmetic, without a run: amp's CPU ratios to the floors and the
endpoint, the point at which the latency amp adds is read, and the CPU goals
judged on the interleaved rounds rather than on one row of the table.
"""

from __future__ import annotations

from typing import Any

from bench.run_analysis import add_cpu_ratios, latency_added, targets, tracing_cost


def point(mode: str, connections: int, per_s: float, p99: float, other: float = 0.0) -> dict[str, Any]:
    """One point of the latency curve."""
    return {
        "mode": mode,
        "connections": connections,
        "reviews_per_s": per_s,
        "latency_ms": {"p50": p99 / 2, "p99": p99},
        "other_cpu_pct": other,
    }


def test_cpu_ratios_compare_amp_with_the_floors_and_endpoint_of_the_same_body() -> None:
    rows: list[dict[str, Any]] = [
        {"mode": "a", "body": "typical", "endpoint_cpu_ms_per_request": 0.1},
        {"mode": "f", "body": "typical", "floor_cpu_ms_per_review": 0.2},
        {"mode": "g", "body": "typical", "floor_cpu_ms_per_review": 0.25},
        {"mode": "f", "body": "large", "floor_cpu_ms_per_review": 1.0},
        {"mode": "b", "body": "typical", "amp_cpu_ms_per_review": 0.5},
        {"mode": "b", "body": "large", "amp_cpu_ms_per_review": 2.5},
    ]
    add_cpu_ratios(rows)
    typical, large = rows[4], rows[5]
    assert (typical["amp_cpu_vs_floor"], typical["amp_cpu_vs_stack"], typical["amp_cpu_vs_endpoint"]) == (2.5, 2.0, 5.0)
    # No stack floor or endpoint row for the large body: no ratio to them.
    assert large["amp_cpu_vs_floor"] == 2.5
    assert "amp_cpu_vs_stack" not in large and "amp_cpu_vs_endpoint" not in large
    assert "amp_cpu_vs_floor" not in rows[1]


def test_latency_added_is_read_at_the_fewest_connections_that_carry_half_the_maximum() -> None:
    # Not monotonic (a busy machine): 4 connections carry less than 1 does.
    curve = [
        point("a", 1, 5000, 0.4),
        point("a", 4, 9000, 0.9),
        point("a", 16, 9500, 2.0),
        point("b", 1, 2289, 1.0),
        point("b", 4, 1790, 3.0),
        point("b", 16, 3322, 9.0),
        point("f", 1, 4000, 0.6),
    ]
    added = latency_added([], curve)
    assert added is not None
    assert (added["connections"], added["amp_max_reviews_per_s"], added["half"]) == (1, 3322, 1661.0)
    assert (added["p99_ms"], added["floor_p99_ms"]) == (0.6, 0.2)
    assert added["reliable"] is True
    assert "stack_p99_ms" not in added  # no stack floor on the curve


def test_latency_added_on_a_busy_machine_is_not_reliable() -> None:
    curve = [point("a", 1, 5000, 0.4), point("b", 1, 2000, 1.0, other=80.0)]
    added = latency_added([], curve)
    assert added is not None and added["reliable"] is False and added["other_cpu_pct"] == 80.0


def test_the_cpu_goal_is_judged_on_the_median_of_the_interleaved_rounds() -> None:
    table = [
        {"mode": "f", "body": "typical", "floor_cpu_ms_per_review": 0.2},
        # The table's row alone misses the goal (3.0x > 2.5x) ...
        {"mode": "b", "body": "typical", "amp_cpu_ms_per_review": 0.6, "amp_cpu_vs_floor": 3.0},
    ]
    # ... the median of the rounds, measured seconds apart, meets it.
    rounds = [{"body": "typical", "ratio": r} for r in (2.4, 3.1, 2.2)]
    (goal,) = targets({"table": table, "ratio_rounds": rounds, "latency_added": None})
    assert goal["met"] is True
    assert goal["value"].startswith("2.40x, median of 3 interleaved rounds (2.20–3.10x)")
    (goal,) = targets({"table": table, "ratio_rounds": [], "latency_added": None})
    assert goal["met"] is False and goal["value"].startswith("3.00x")


def test_tracing_cost_is_each_tracing_mode_against_tracing_off() -> None:
    table = [
        {"mode": m, "body": "typical", "amp_cpu_ms_per_review": cpu, "latency_ms": {"p99": p99}, "reviews_per_s": 1000}
        for m, cpu, p99 in (("b", 0.4, 1.0), ("t", 0.42, 1.1), ("u", 0.6, 1.5))
    ]
    costs = {c["mode"]: c for c in tracing_cost(table)}
    assert sorted(costs) == ["t", "u"]
    assert (costs["u"]["ratio"], costs["u"]["cpu_added_ms"], costs["u"]["cpu_ratio"]) == (1.0, 0.2, 1.5)
    assert costs["t"]["p99_added_ms"] == 0.1
