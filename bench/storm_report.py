"""
bench/storm's report: the Markdown section (tables with ratios against the
no-mutation and policy floors, the goals of the storm), the picture of the
API server's latencies against time for each target, and publishing both
into bench/latest.md (between C{STORM_BEGIN} and C{STORM_END}, which
bench/run keeps when it rewrites the file) and bench/latest-storm.{json,png}.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
from typing import Any, Optional

from bench.harness import say

BENCH = os.path.dirname(os.path.abspath(__file__))
STORM_BEGIN = "<!-- storm:begin -->"
STORM_END = "<!-- storm:end -->"
COLORS = {
    "none": "tab:gray",
    "policy": "tab:green",
    "amp": "tab:blue",
    "amp-w2": "tab:orange",
    "amp-slow": "tab:red",
    "amp-slow-budget": "tab:brown",
    "amp-fail": "tab:purple",
}


def _median(values: list[Optional[float]]) -> Optional[float]:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _f(value: Optional[float], fmt: str = "{:.2f}") -> str:
    return "—" if value is None else fmt.format(value)


def summary(runs: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """Per scenario and target: the medians over rounds of what a run measured."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for run in runs:
        out.setdefault(run["scenario"], {}).setdefault(run["target"], {"runs": []})["runs"].append(run)
    for targets in out.values():
        for row in targets.values():
            rs = row["runs"]
            row["ready_s"] = _median([r["ready_s"] for r in rs])
            row["create_ms"] = _median([r["creates"]["mean_ms"] for r in rs])
            row["creates"] = _median([r["creates"]["count"] for r in rs])
            hooks = [r["webhook"] for r in rs if "webhook" in r]
            if hooks:
                calls = sum(h["calls"] for h in hooks)
                row["webhook_mean_ms"] = _median([h["mean_ms"] for h in hooks])
                row["within"] = {
                    b: 100 * sum(h["within_ms"].get(b, 0) for h in hooks) / calls if calls else None
                    for b in ("5", "25", "100")
                }
                row["rejections"] = sum(h["rejections"] for h in hooks)
                row["fail_open"] = sum(h["fail_open"] for h in hooks)
                row["webhook_calls"] = calls
                row["webhook_p99_bound_ms"] = _bucket_p99(hooks)
            amps = [r["amp"] for r in rs if "amp" in r]
            if amps:
                row["amp_cpu_ms_per_pod"] = _median([a["cpu_ms_per_pod"] for a in amps])
                row["amp_p99_ms"] = _median([a["answer_p99_ms"] for a in amps])
                row["amp_mean_ms"] = _median([a["answer_mean_ms"] for a in amps])
                row["endpoint_mean_ms"] = _median([a["endpoint_mean_ms"] for a in amps])
            stamps: dict[str, int] = {}
            for r in rs:
                for k, v in r["stamps"].items():
                    stamps[k] = stamps.get(k, 0) + v
            row["stamps"] = stamps
    return out


def _bucket_p99(hooks: list[dict[str, Any]]) -> Optional[float]:
    """The smallest bucket bound (ms) of the API server's webhook histogram
    holding 99% of the calls: what its buckets can say about the p99."""
    calls = sum(h["calls"] for h in hooks)
    if not calls:
        return None
    bounds = sorted({float(b) for h in hooks for b in h["within_ms"]})
    for b in bounds:
        if sum(h["within_ms"].get(f"{b:g}", 0) for h in hooks) >= 0.99 * calls:
            return b
    return None


def run_cpu_per_review() -> Optional[float]:
    """amp's CPU ms per typical review in bench/run's latest published row (b)."""
    try:
        with open(os.path.join(BENCH, "latest.json")) as f:
            table = json.load(f)["table"]
    except (OSError, KeyError, ValueError):
        return None
    for row in table:
        if row.get("mode") == "b" and row.get("body") == "typical":
            return row.get("amp_cpu_ms_per_review")
    return None


def goals(s: dict[str, dict[str, dict[str, Any]]]) -> list[tuple[str, str, str]]:
    """The storm's goals, each (goal, measured, met)."""
    up = s.get("scale-up", {})
    none, policy, amp = up.get("none", {}), up.get("policy", {}), up.get("amp", {})
    rows = []
    if none.get("create_ms") is not None and policy.get("create_ms") is not None and amp:
        added = policy["create_ms"] - none["create_ms"]
        budget = added + (amp.get("endpoint_mean_ms") or 0.0) + 1.0
        own, mean, seen = amp.get("amp_p99_ms"), amp.get("amp_mean_ms"), amp.get("webhook_mean_ms")
        bound = amp.get("webhook_p99_bound_ms")
        # The API server's buckets (5/25/100 ms) hold no p99; its exact mean less amp's own
        # mean is what the call costs around amp's answer (TLS, HTTP, the API server's side).
        estimate = own + max(0.0, seen - mean) if None not in (own, mean, seen) else None
        rows.append(
            (
                "amp's p99 webhook latency (scale-up) <= policy's added latency + endpoint time + 1 ms",
                f"{_f(estimate)} ms (amp's own p99 {_f(own)} + the API server's mean {_f(seen)} - amp's own mean "
                f"{_f(mean)}) vs {added:.2f} + {amp.get('endpoint_mean_ms') or 0:.2f} + 1 = {budget:.2f} ms; the API "
                f"server's buckets hold 99% of calls within {_f(bound, '{:g}')} ms",
                "yes" if estimate is not None and estimate <= budget + 1e-9 else "no",
            )
        )
    if none.get("ready_s") and amp.get("ready_s"):
        ratio = amp["ready_s"] / none["ready_s"]
        rows.append(
            (
                "scale-up time to all ready <= 1.1x no mutation",
                f"{ratio:.2f}x ({amp['ready_s']:.2f} s vs {none['ready_s']:.2f} s)",
                "yes" if ratio <= 1.1 else "no",
            )
        )
    per_review = run_cpu_per_review()
    if amp.get("amp_cpu_ms_per_pod") is not None and per_review:
        cpu = amp["amp_cpu_ms_per_pod"]
        rows.append(
            (
                "amp CPU per Pod in the storm <= CPU per review in bench/run",
                f"{cpu:.3f} ms vs {per_review:.3f} ms (bench/run (b), typical)",
                "yes" if cpu <= per_review else "no",
            )
        )
    return rows


def markdown(result: dict[str, Any], picture: Optional[str]) -> str:
    s = summary(result["runs"])
    st = result["settings"]
    lines = [
        STORM_BEGIN,
        f"## Storm — {result['date']}",
        "",
        f"`bench/storm`: kube-apiserver {result['versions']['kubernetes']} + etcd {result['versions']['etcd']}, "
        f"kube-controller-manager and kube-scheduler (client qps {st['qps']:g}, burst {st['burst']}), kwok "
        f"{result['versions']['kwok']} fake nodes, on {result['versions']['machine_cpus']} CPUs, all on loopback. "
        f"{st['rounds']} round(s), targets interleaved (order rotated each round); medians over rounds. "
        f"Scale-up 0 → {st['pods']}, rolling update of {st['rolling']}, {st['jobs']} Jobs at once; "
        f"the webhook's timeoutSeconds {st['webhook_timeout']}, amp's endpoint timeout {st['endpoint_timeout']}.",
        "",
        "Targets: *none* (no mutation), *policy* (a MutatingAdmissionPolicy adding the same variable and stamp, "
        f"{result['versions']['policy_api']}), *amp* (one worker, the example endpoint `/user-env`), *amp-w2* "
        "(`workers: 2`). *create ms*: the API server's mean Pod create latency (exact sum ÷ count of "
        "`apiserver_request_duration_seconds`); *webhook ms*: its mean webhook call (exact, "
        "`apiserver_admission_webhook_admission_duration_seconds`); *≤5/≤25 ms*: the share of calls in those "
        "buckets (its buckets are 5/25/100/500 ms, so no finer percentile exists there); *amp p99*: amp's own "
        "answer latency (`amp_admission_duration_seconds`, buckets from 0.5 ms), interpolated.",
        "",
    ]
    for scenario in ("scale-up", "rolling", "jobs"):
        rows = s.get(scenario)
        if not rows:
            continue
        none, policy = rows.get("none", {}), rows.get("policy", {})
        lines += [
            f"### {scenario}",
            "",
            "| target | ready s | ÷ none | ÷ policy | creates | create ms | + vs none ms | webhook ms | ≤5 ms | "
            "≤25 ms | rejections | fail-open | amp p99 ms | amp CPU ms/Pod | stamps |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        for name in ("none", "policy", "amp", "amp-w2"):
            r = rows.get(name)
            if not r:
                continue
            within = r.get("within") or {}
            lines.append(
                f"| {name} | {_f(r['ready_s'])} | {_ratio(r['ready_s'], none.get('ready_s'))} | "
                f"{_ratio(r['ready_s'], policy.get('ready_s'))} | {_f(r['creates'], '{:.0f}')} | "
                f"{_f(r['create_ms'])} | "
                f"{_f(_minus(r['create_ms'], none.get('create_ms')))} | {_f(r.get('webhook_mean_ms'))} | "
                f"{_f(within.get('5'), '{:.1f}%')} | {_f(within.get('25'), '{:.1f}%')} | "
                f"{_f(r.get('rejections'), '{:.0f}')} | {_f(r.get('fail_open'), '{:.0f}')} | "
                f"{_f(r.get('amp_p99_ms'))} | "
                f"{_f(r.get('amp_cpu_ms_per_pod'), '{:.3f}')} | {_stamps(r['stamps'])} |"
            )
        lines.append("")
    turned = [(sc, name, r) for sc in ("slow", "fail") for name, r in (s.get(sc) or {}).items()]
    if turned:
        lines += [
            "### Scale-up with the endpoint turning halfway",
            "",
            f"The endpoint answers the first {st['pods'] // 2} calls at once, then each call after "
            f"{st['slow']:g} s (slow) or with HTTP 500 (fail). *amp-slow-budget* is amp with "
            f"`endpoints.latency_budget: {st.get('budget')}` (off in the others).",
            "",
            "| scenario | target | ready s | webhook ms | ≤25 ms | rejections | fail-open | amp p99 ms | stamps |",
            "|---|---|---:|---:|---:|---:|---:|---:|---|",
        ]
        for sc, name, r in turned:
            within = r.get("within") or {}
            lines.append(
                f"| {sc} | {name} | {_f(r['ready_s'])} | {_f(r.get('webhook_mean_ms'))} | "
                f"{_f(within.get('25'), '{:.1f}%')} | {_f(r.get('rejections'), '{:.0f}')} | "
                f"{_f(r.get('fail_open'), '{:.0f}')} | {_f(r.get('amp_p99_ms'))} | {_stamps(r['stamps'])} |"
            )
        lines.append("")
    g = goals(s)
    if g:
        lines += ["### Goals", "", "| goal | measured | met |", "|---|---|---|"]
        lines += [f"| {a} | {b} | {c} |" for a, b, c in g]
        lines.append("")
    if picture:
        lines += [f"![API server latency against time, scale-up, per target]({picture})", ""]
    lines += [f"Run: `bench/storm {result['argv']}` ({result['elapsed_s']:.0f} s).", STORM_END]
    return "\n".join(lines) + "\n"


def _ratio(a: Optional[float], b: Optional[float]) -> str:
    return f"{a / b:.2f}×" if a is not None and b else "—"


def _minus(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return a - b if a is not None and b is not None else None


def _stamps(stamps: dict[str, int]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in sorted(stamps.items())) or "—"


def chart(result: dict[str, Any], path: str) -> bool:
    """Pod create latency (every target) and webhook latency (amp's) per
    second during the first round's scale-up, from the API server's metrics."""
    try:
        import matplotlib
    except ImportError:
        say("matplotlib is not installed (pip install -e '.[bench]'): no picture")
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6.5), dpi=110, sharex=True)
    first = {}
    for run in result["runs"]:
        if run["scenario"] in ("scale-up", "slow", "fail"):
            first.setdefault(run["target"], run)
    for key, run in first.items():
        series = run["series"]
        color = COLORS.get(key, "black")
        xs = [p["t"] for p in series if p["create_ms"] is not None]
        top.plot(
            xs,
            [p["create_ms"] for p in series if p["create_ms"] is not None],
            "-",
            color=color,
            label=f"{key}: {run['pods']} Pods ready in {run['ready_s']:.1f} s",
        )
        ws = [p for p in series if p["webhook_ms"] is not None]
        if ws:
            bottom.plot([p["t"] for p in ws], [p["webhook_ms"] for p in ws], "-", color=color, label=key)
    top.set_ylabel("Pod create, mean ms per second")
    bottom.set_ylabel("webhook call, mean ms per second")
    bottom.set_xlabel("seconds since the scale-up began")
    for ax in (top, bottom):
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    top.set_title(
        f"The API server's latencies during a 0 → {result['settings']['pods']} scale-up ({result['date'][:10]})",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def publish(outdir: str, stem: str, has_picture: bool) -> None:
    """The run's JSON and picture to bench/latest-storm.*, its section into bench/latest.md."""
    shutil.copyfile(os.path.join(outdir, f"{stem}.json"), os.path.join(BENCH, "latest-storm.json"))
    if has_picture:
        shutil.copyfile(os.path.join(outdir, f"{stem}.png"), os.path.join(BENCH, "latest-storm.png"))
    with open(os.path.join(outdir, f"{stem}.md")) as f:
        section = f.read().replace(f"]({stem}.png)", "](latest-storm.png)")
    latest = os.path.join(BENCH, "latest.md")
    text = open(latest).read() if os.path.exists(latest) else ""
    with open(latest, "w") as f:
        f.write(with_section(text, section))
    say("published to bench/latest.md (storm section) and bench/latest-storm.*")


def with_section(text: str, section: str) -> str:
    """C{text} with its storm section (if any) replaced by C{section}, else with it appended."""
    section = section.strip() + "\n"
    if STORM_BEGIN in text and STORM_END in text:
        head, rest = text.split(STORM_BEGIN, 1)
        _, tail = rest.split(STORM_END, 1)
        return head + section + tail.lstrip("\n")
    return text.rstrip("\n") + "\n\n" + section


def storm_section(text: str) -> str:
    """The storm section of a bench/latest.md text, or ''."""
    if STORM_BEGIN in text and STORM_END in text:
        return STORM_BEGIN + text.split(STORM_BEGIN, 1)[1].split(STORM_END, 1)[0] + STORM_END + "\n"
    return ""
