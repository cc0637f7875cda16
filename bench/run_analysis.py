"""
The figures bench/run derives from its measured rows (pure, no I/O): amp's
CPU per review as a ratio to the floors' and the endpoint's, the latency amp
adds at half its maximum throughput, what tracing costs, and each
performance goal with whether it is met.
"""

from __future__ import annotations

import statistics
from typing import Any, Optional

from bench.run_modes import BUSY_PCT, TARGETS, TRACING


def add_cpu_ratios(rows: list[dict[str, Any]]) -> None:
    """
    Put on every amp row its CPU per review as a ratio to the floor's (f),
    to the stack floor's (g) and to the endpoint's alone (a), all for the
    same body and measured in the same run: C{amp_cpu_vs_floor},
    C{amp_cpu_vs_stack}, C{amp_cpu_vs_endpoint}.
    """
    floor = {r["body"]: r.get("floor_cpu_ms_per_review") for r in rows if r["mode"] == "f"}
    stack = {r["body"]: r.get("floor_cpu_ms_per_review") for r in rows if r["mode"] == "g"}
    endpoint = {r["body"]: r.get("endpoint_cpu_ms_per_request") for r in rows if r["mode"] == "a"}
    for row in rows:
        cpu = row.get("amp_cpu_ms_per_review")
        if not cpu:
            continue
        for key, base in (
            ("amp_cpu_vs_floor", floor.get(row["body"])),
            ("amp_cpu_vs_stack", stack.get(row["body"])),
            ("amp_cpu_vs_endpoint", endpoint.get(row["body"])),
        ):
            if base:
                row[key] = round(cpu / base, 2)


def latency_added(table: list[dict[str, Any]], curve: list[dict[str, Any]]) -> Optional[dict[str, Any]]:
    """
    p99(b) - p99(a) at the fewest connections at which (b)'s throughput
    reaches half of amp's maximum (the lightest load on the curve that
    carries half the maximum: at exactly half, latency is no higher), or,
    when no point reaches it, at the point of most throughput.

    The point nearest half, the rule before, picked a heavier load with
    less throughput when the curve was not monotonic (on a busy machine, 4
    connections at 1790/s over 1 connection at 2289/s, for a maximum of
    3322/s): more requests queued, a higher p99, and not "at half".
    """
    b = [p for p in curve if p["mode"] == "b"]
    a = {p["connections"]: p for p in curve if p["mode"] == "a"}
    g = {p["connections"]: p for p in curve if p["mode"] == "g"}
    f = {p["connections"]: p for p in curve if p["mode"] == "f"}
    if not b:
        return None
    best = max(
        [p["reviews_per_s"] for p in b]
        + [r["reviews_per_s"] for r in table if r["mode"] == "b" and r["body"] == "typical"]
    )
    half = best / 2
    reaching = [p for p in b if p["reviews_per_s"] >= half]
    point = min(reaching, key=lambda p: p["connections"]) if reaching else max(b, key=lambda p: p["reviews_per_s"])
    base = a.get(point["connections"])
    if base is None:
        return None
    busy = max(point.get("other_cpu_pct", 0.0), base.get("other_cpu_pct", 0.0))
    stack = g.get(point["connections"])
    over_stack = (
        {}
        if stack is None
        else {
            "g_reviews_per_s": stack["reviews_per_s"],
            "stack_p50_ms": round(stack["latency_ms"]["p50"] - base["latency_ms"]["p50"], 3),
            "stack_p99_ms": round(stack["latency_ms"]["p99"] - base["latency_ms"]["p99"], 3),
        }
    )
    floor = f.get(point["connections"])
    over_floor = (
        {}
        if floor is None
        else {
            "floor_p50_ms": round(floor["latency_ms"]["p50"] - base["latency_ms"]["p50"], 3),
            "floor_p99_ms": round(floor["latency_ms"]["p99"] - base["latency_ms"]["p99"], 3),
        }
    )
    return (
        over_stack
        | over_floor
        | {
            "reliable": busy <= BUSY_PCT,
            "other_cpu_pct": busy,
            "amp_max_reviews_per_s": best,
            "half": round(half, 1),
            "connections": point["connections"],
            "b_reviews_per_s": point["reviews_per_s"],
            "a_reviews_per_s": base["reviews_per_s"],
            "p50_ms": round(point["latency_ms"]["p50"] - base["latency_ms"]["p50"], 3),
            "p99_ms": round(point["latency_ms"]["p99"] - base["latency_ms"]["p99"], 3),
        }
    )


def tracing_cost(table: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """
    What tracing costs, per body: the CPU per review and the p99 of amp
    with tracing at 1% (t) and 100% (u) beside amp with it off (b), same
    run, and the differences.
    """
    rows = {(r["mode"], r["body"]): r for r in table}
    out = []
    for (mode, body), r in rows.items():
        off = rows.get(("b", body))
        if mode not in TRACING or off is None:
            continue
        cpu, cpu_off = r.get("amp_cpu_ms_per_review"), off.get("amp_cpu_ms_per_review")
        out.append(
            {
                "mode": mode,
                "ratio": TRACING[mode],
                "body": body,
                "cpu_ms_per_review": cpu,
                "cpu_ms_per_review_off": cpu_off,
                "cpu_added_ms": round(cpu - cpu_off, 4) if cpu is not None and cpu_off is not None else None,
                "cpu_ratio": round(cpu / cpu_off, 3) if cpu and cpu_off else None,
                "p99_ms": r["latency_ms"]["p99"],
                "p99_ms_off": off["latency_ms"]["p99"],
                "p99_added_ms": round(r["latency_ms"]["p99"] - off["latency_ms"]["p99"], 3),
                "reviews_per_s": r["reviews_per_s"],
                "reviews_per_s_off": off["reviews_per_s"],
            }
        )
    return out


def targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    """
    The performance issue's goals, with the figure measured and whether it
    is met; CPU goals also as the stack floor (g) of the same run, which no
    amp on that stack can go below.
    """
    rows = {(r["mode"], r["body"]): r for r in result["table"]}
    out = []
    for body, key in (("typical", "cpu_vs_floor_typical_max"), ("large", "cpu_vs_floor_large_max")):
        b = rows.get(("b", body))
        if not b or not b.get("amp_cpu_vs_floor"):
            continue
        floor = rows.get(("f", body), {}).get("floor_cpu_ms_per_review")
        table = f"{b['amp_cpu_vs_floor']:.2f}x ({b['amp_cpu_ms_per_review']:.3f} ms; floor (f): {floor:.3f} ms)"
        ratios = [r["ratio"] for r in result.get("ratio_rounds") or [] if r["body"] == body]
        if not ratios:
            value, ratio = table, b["amp_cpu_vs_floor"]
        else:
            ratio = statistics.median(ratios)
            value = (
                f"{ratio:.2f}x, median of {len(ratios)} interleaved rounds ({min(ratios):.2f}–{max(ratios):.2f}x); "
                f"the table's row: {table}"
            )
        out.append(
            {
                "goal": f"amp CPU per {body} review <= {TARGETS[key]:g}x the floor (f)",
                "value": value,
                "met": ratio <= TARGETS[key],
            }
        )
    added = result.get("latency_added")
    if added:
        goal = TARGETS["added_p99_ms_max"]
        met: Optional[bool] = added["p99_ms"] <= goal if added.get("reliable", True) else None
        value = f"{added['p99_ms']:+.2f} ms (c={added['connections']})"
        if not added.get("reliable", True):
            value += " (busy machine)"
        elif "floor_p99_ms" in added:
            value += f"; the floor (f) adds {added['floor_p99_ms']:+.2f} ms at the same point"
            if not met and added["floor_p99_ms"] > goal:
                # No proxy meets it here: the machine's tail, not amp's.
                met = None
                value += " (over the goal itself: this machine cannot show it)"
        out.append(
            {"goal": f"p99 added by amp <= {goal:g} ms at half of amp's max throughput", "value": value, "met": met}
        )
    b = rows.get(("b", "typical"))
    c = rows.get(("c", "typical"))
    if b and c:
        ratio = b["reviews_per_s"] / c["reviews_per_s"]
        out.append(
            {
                "goal": "warm cache (b) >= 2x per-review GET (c) throughput, better p99",
                "value": f"{ratio:.1f}x, p99 {b['latency_ms']['p99']:.2f} vs {c['latency_ms']['p99']:.2f} ms "
                f"(CPU per review: (c) is {c['amp_cpu_ms_per_review'] / b['amp_cpu_ms_per_review']:.1f}x (b))",
                "met": ratio >= TARGETS["cache_vs_get_throughput_min"]
                and b["latency_ms"]["p99"] < c["latency_ms"]["p99"],
            }
        )
    return out
