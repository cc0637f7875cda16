"""
bench/run's report: the Markdown of a run (the table, the latency added,
tracing's cost, the curve, the ratio rounds, the goals, the profiles), the
latency-against-load chart (matplotlib, when installed), and publishing a
run to bench/latest.* and bench/README.md (keeping bench/storm's section).
"""

from __future__ import annotations

import os
import shutil
from typing import Any, Optional

from bench.harness import say
from bench.run_modes import MODES, PROXIES
from bench.storm_report import storm_section, with_section

BENCH = os.path.dirname(os.path.abspath(__file__))


def _num(value: Any, fmt: str = "{:.2f}") -> str:
    return "—" if value is None else fmt.format(value)


def markdown(result: dict[str, Any], chart: Optional[str]) -> str:
    m = result["machine"]
    s = result["settings"]
    lines = [
        f"# amp benchmark — {result['date']}",
        "",
        f"Machine: {m['nproc']} CPUs, {m['cpu_model']}; Linux {m['kernel']}; Python {m['python']}, "
        f"Twisted {m['twisted']}, {m['openssl']}; {m['wrk']}.",
        f"Run: {'quick' if s['quick'] else 'full'}; wrk -t1 -c{s['connections']} -d{s['duration_s']}s "
        f"(after {s['warmup_s']}s of warm-up) per row; HTTP/1.1 keep-alive, TLS to amp; "
        f"amp pinned to CPU {s['amp_cpus']}, wrk + endpoint + fake API to CPU {s['load_cpus']}; "
        f"namespace source for (b)/(d): `{result['namespace_source']}`.",
        "",
        "| mode | body | reviews/s | p50 ms | p90 ms | p99 ms | max ms | proxy CPU ms/review (kernel %) | "
        "amp CPU ÷ floor (f) | amp CPU ÷ stack floor (g) | amp CPU ÷ endpoint (a) | proxy CPU % | "
        "proxy peak RSS MiB | reviews/s ÷ (a) | "
        "p99 ÷ (a) | other CPU % | 1 CPU capacity/s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    base = {r["body"]: r for r in result["table"] if r["mode"] == "a"}
    for r in result["table"]:
        a = base.get(r["body"])
        lat = r["latency_ms"]
        who = "floor" if r["mode"] in PROXIES else "amp"
        cpu = r.get(f"{who}_cpu_ms_per_review")
        kernel = r.get(f"{who}_cpu_kernel_pct")
        if r["mode"] == "a":
            cpu, kernel = r.get("endpoint_cpu_ms_per_request"), None
        lines.append(
            f"| ({r['mode']}) {r['label']} | {r['body']} ({r['body_bytes'] / 1024:.1f} KiB) | "
            f"{r['reviews_per_s']:.0f} | {lat['p50']:.2f} | {lat['p90']:.2f} | {lat['p99']:.2f} | {lat['max']:.2f} | "
            f"{_num(cpu, '{:.3f}')}{'' if kernel is None else ' (%.0f%%)' % kernel} | "
            f"{_num(r.get('amp_cpu_vs_floor'), '{:.1f}×')} | {_num(r.get('amp_cpu_vs_stack'), '{:.1f}×')} | "
            f"{_num(r.get('amp_cpu_vs_endpoint'), '{:.1f}×')} | "
            f"{_num(r['cpu_pct'].get(who if r['mode'] != 'a' else 'endpoint'), '{:.0f}')} | "
            f"{_num(r.get(f'{who}_peak_rss_mib'), '{:.1f}')} | "
            f"{_num(r['reviews_per_s'] / a['reviews_per_s'] if a else None)} | "
            f"{_num(lat['p99'] / a['latency_ms']['p99'] if a and a['latency_ms']['p99'] else None)} | "
            f"{r['cpu_pct'].get('other', 0):.0f} | "
            f"{_num(1000 / cpu if cpu else None, '{:.0f}')} |"
        )
    lines += [
        "",
        "*proxy CPU ms/review*: the CPU time of the process under test per review: amp in (b)–(d), "
        "the proxy in (f) and (g), the endpoint per request in (a). *amp CPU ÷ floor (f)*, *÷ stack "
        "floor (g)* and *÷ endpoint (a)* compare amp's with theirs, for the same body in the same run: "
        "the floor is a minimal Twisted TLS proxy doing the same round trip and nothing else (raw "
        "protocols; bench/floor.py; JSON by " + result.get("floor_json", "?") + "), the runtime's lower "
        "bound; the stack floor does the same through twisted.web's Site and Twisted's Agent and pool, "
        "the stack amp's hot path ran on before amp owned its HTTP/1.1 (llhttp on both sides), kept "
        "for comparison. Neither is a webhook (see bench/README.md).",
        "",
        "*1 CPU capacity/s* = 1000 ÷ proxy CPU ms/review: what one process could answer with a CPU "
        "to itself. Unlike reviews/s and latency it hardly depends on what else the machine was doing "
        "(*other CPU %*, in % of one CPU).",
    ]
    if result.get("latency_added"):
        la = result["latency_added"]
        lines += [
            "",
            f"**Latency added by amp** at half of its maximum throughput, the fewest connections that carry it "
            f"({la['amp_max_reviews_per_s']:.0f}/s → c={la['connections']}: (b) {la['b_reviews_per_s']:.0f}/s, "
            f"(a) {la['a_reviews_per_s']:.0f}/s): p50 {la['p50_ms']:+.2f} ms, **p99 {la['p99_ms']:+.2f} ms**"
            + (
                f"; the floor (f) at the same connections adds p50 {la['floor_p50_ms']:+.2f} ms, "
                f"p99 {la['floor_p99_ms']:+.2f} ms"
                if "floor_p99_ms" in la
                else ""
            )
            + (
                f"; the stack floor (g) adds p50 {la['stack_p50_ms']:+.2f} ms, p99 {la['stack_p99_ms']:+.2f} ms"
                if "stack_p99_ms" in la
                else ""
            )
            + (
                "."
                if la.get("reliable", True)
                else f" — not reliable: other processes used {la['other_cpu_pct']:.0f}% of a CPU during these points."
            ),
        ]
    if result.get("tracing_cost"):
        lines += [
            "",
            "**What tracing costs** (amp with `tracing` on, exporting over OTLP/HTTP to the benchmark's "
            "collector, against (b), tracing off, same run and connections; wrk sends no "
            "`traceparent`, so amp starts each trace at the ratio):",
            "",
            "| mode | body | sampled | amp CPU ms/review | off (b) | added | ÷ off | p99 ms | off (b) | p99 added ms |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for c in result["tracing_cost"]:
            lines.append(
                f"| ({c['mode']}) | {c['body']} | {c['ratio']:.0%} | {_num(c['cpu_ms_per_review'], '{:.3f}')} | "
                f"{_num(c['cpu_ms_per_review_off'], '{:.3f}')} | {_num(c['cpu_added_ms'], '{:+.3f}')} | "
                f"{_num(c['cpu_ratio'], '{:.2f}×')} | {c['p99_ms']:.2f} | {c['p99_ms_off']:.2f} | "
                f"{c['p99_added_ms']:+.2f} |"
            )
    if result.get("curve"):
        lines += [
            "",
            "Latency against load (typical body; each point one wrk run at that many connections):",
            "",
            "| mode | connections | reviews/s | p50 ms | p99 ms | amp CPU ms/review | other CPU % |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for p in result["curve"]:
            lines.append(
                f"| ({p['mode']}) | {p['connections']} | {p['reviews_per_s']:.0f} | "
                f"{p['latency_ms']['p50']:.2f} | {p['latency_ms']['p99']:.2f} | "
                f"{_num(p.get('amp_cpu_ms_per_review'), '{:.3f}')} | {p.get('other_cpu_pct', 0):.0f} |"
            )
    if chart:
        lines += ["", f"![latency against load]({chart})"]
    if result.get("ratio_rounds"):
        lines += [
            "",
            f"amp (b) and the floor (f) in turn, {s.get('ratio_rounds')} rounds per body of "
            f"{s.get('ratio_duration_s')}s each (the order swapped every round): what the CPU goals are "
            "judged on, the median ratio of each body:",
            "",
            "| body | round | floor (f) CPU ms/review | amp (b) CPU ms/review | amp ÷ floor | other CPU % |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for r in result["ratio_rounds"]:
            lines.append(
                f"| {r['body']} | {r['round']} | {r['floor_ms']:.3f} | {r['amp_ms']:.3f} | "
                f"{r['ratio']:.2f}× | {r['other_cpu_pct']:.0f} |"
            )
    if result.get("targets"):
        lines += [
            "",
            "Goals (from the issue; reported, not asserted):",
            "",
            "| goal | measured | met |",
            "|---|---|---|",
        ]
        for t in result["targets"]:
            met = "unknown" if t["met"] is None else "yes" if t["met"] else "no"
            lines.append(f"| {t['goal']} | {t['value']} | {met} |")
    for key, full in (("profile", True), ("profile_floor", False)):
        prof = result.get(key)
        if prof:
            lines += profile_markdown(prof, full)
    lines.append("")
    return "\n".join(lines)


def profile_markdown(prof: dict[str, Any], full: bool) -> list[str]:
    lines = [
        "",
        f"Profile of amp in mode ({prof['mode']}) ({MODES[prof['mode']]}), {prof.get('body', 'typical')} body "
        f"({prof['tool']}, "
        f"{prof['duration_s']}s, {prof.get('samples', '?')} samples; {prof['note']}):",
        "",
        "| # | function (file) | own % | total % |",
        "|---:|---|---:|---:|",
    ]
    for i, t in enumerate(prof["top"][:10], 1):
        lines.append(f"| {i} | `{t['function']}` | {t['own_pct']:.1f} | {t['total_pct']:.1f} |")
    if prof.get("breakdown"):
        lines += [
            "",
            "Where the time goes (share of samples whose stack includes the part; parts overlap):",
            "",
            "| part | % of samples |",
            "|---|---:|",
        ]
        for part in prof["breakdown"]:
            if full or part["total_pct"] >= 1.0:
                lines.append(f"| {part['part']} | {part['total_pct']:.1f} |")
    if full and prof.get("own_by_package"):
        lines += ["", "Own time by package (top 10):", "", "| package | own % |", "|---|---:|"]
        for row in prof["own_by_package"][:10]:
            lines.append(f"| `{row['package']}` | {row['own_pct']:.1f} |")
    if full and prof.get("own_by_file"):
        lines += ["", "Own time by file (top 10):", "", "| file | own % |", "|---|---:|"]
        for row in prof["own_by_file"][:10]:
            lines.append(f"| `{row['file']}` | {row['own_pct']:.1f} |")
    return lines


def chart(result: dict[str, Any], path: str) -> bool:
    try:
        import matplotlib
    except ImportError:
        say("matplotlib is not installed (pip install -e '.[bench]'): no chart")
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    styles = {
        "a": ("tab:gray", MODES["a"]),
        "f": ("tab:green", MODES["f"]),
        "g": ("tab:orange", MODES["g"]),
        "b": ("tab:blue", MODES["b"]),
    }
    for mode, (color, label) in styles.items():
        pts = [p for p in result["curve"] if p["mode"] == mode]
        if not pts:
            continue
        x = [p["reviews_per_s"] for p in pts]
        ax.plot(x, [p["latency_ms"]["p50"] for p in pts], "o-", color=color, label=f"({mode}) {label}: p50")
        ax.plot(x, [p["latency_ms"]["p99"] for p in pts], "s--", color=color, label=f"({mode}) {label}: p99")
        for p in pts:
            ax.annotate(
                f"c={p['connections']}",
                (p["reviews_per_s"], p["latency_ms"]["p99"]),
                textcoords="offset points",
                xytext=(3, 4),
                fontsize=7,
                color=color,
            )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("achieved throughput (reviews/s, log scale)")
    ax.set_ylabel("latency (ms, log scale)")
    m = result["machine"]
    ax.set_title(f"amp: latency against load, typical Pod ({result['date'][:10]}, {m['nproc']} CPUs)", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


README_BEGIN = "<!-- latest:begin -->"
README_END = "<!-- latest:end -->"


def publish(outdir: str, stem: str, has_chart: bool) -> None:
    for ext in ("json", "md") + (("png",) if has_chart else ()):
        src = os.path.join(outdir, f"{stem}.{ext}")
        dst = os.path.join(BENCH, f"latest.{ext}")
        if ext == "md":
            with open(src) as f:
                text = f.read().replace(f"]({stem}.png)", "](latest.png)")
            # bench/storm's section is its own run's: kept as it is
            section = storm_section(open(dst).read()) if os.path.exists(dst) else ""
            with open(dst, "w") as f:
                f.write(with_section(text, section) if section else text)
        else:
            shutil.copyfile(src, dst)
    readme = os.path.join(BENCH, "README.md")
    if os.path.exists(readme):
        with open(readme) as f:
            text = f.read()
        if README_BEGIN in text and README_END in text:
            with open(os.path.join(BENCH, "latest.md")) as f:
                latest = f.read().replace("# amp benchmark — ", "### Latest run: ", 1)
            latest = latest.replace("](latest.png)", "](latest.png)")
            head, rest = text.split(README_BEGIN, 1)
            _, tail = rest.split(README_END, 1)
            with open(readme, "w") as f:
                f.write(f"{head}{README_BEGIN}\n{latest.strip()}\n{README_END}{tail}")
    say(f"published to {os.path.join(BENCH, 'latest')}.*")
