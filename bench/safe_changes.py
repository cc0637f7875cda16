#!/usr/bin/env python3
"""
What the safe-change tools cost the live path: amp measured four ways in
one run, each its own C{twistd amp} process pinned to the same CPU, rounds
interleaved so that the machine's noise falls on all four alike:

  plain    the benchmark's namespace, nothing else;
  control  a second amp exactly like C{plain}: how far two identical amps
           differ in one run is the noise the others are judged against;
  canary   the same namespace with C{amp.txn2.com/canary} naming a second
           endpoint at 100% (every review also goes to the candidate);
  record   C{record.enabled} for every namespace at sample 1 (every review
           written to the recording files).

amp's own process is pinned; its child processes (the recording's writer)
are not: in a Pod a CPU limit is time, not a core, and the writer, in the
idle scheduling class, takes whatever core has time nothing else wants.
With C{--writer-with-amp} they are pinned with amp: at one connection the
writer then finds almost no spare time on amp's core, and most reviews
are dropped.

Each row: wrk with C{-c16} (throughput and amp's CPU per review, that of
its recording writer process included) and with C{-c1} (p99 of the live
answer at low load), typical body.  Reported as ratios to C{plain}
measured in the same round; nothing is asserted.  With
C{--quick} it only proves the harness: the canary compared reviews and the
recording holds lines (the test suite runs that).

Usage: C{python -m bench.safe_changes [--rounds 3] [--duration 8] [--quick] [--out DIR] [--writer-with-amp]}
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from typing import Any, Optional

from bench import bodies
from bench.harness import OFF, ON, Amp, Proc, child_pids, cpu_seconds_with_children, machine, run_wrk, say
from tests.support.prometheus import Scrape
from tests.support.waiting import poll_until

VARIANTS = ("plain", "control", "canary", "record")


def _overlay(variant: str, endpoint: str, candidate: str, workdir: str) -> Optional[dict[str, Any]]:
    if variant == "canary":
        return {
            "kubernetes": {
                "source": "static",
                "namespaces": {
                    ON: {
                        "labels": {"amp.txn2.com/enabled": "true"},
                        "annotations": {"amp.txn2.com/ep": endpoint, "amp.txn2.com/canary": candidate},
                    },
                    OFF: {"labels": {"team": "other"}},
                },
            }
        }
    if variant == "record":
        return {
            "record": {
                "enabled": True,
                "directory": os.path.join(workdir, "recordings"),
                "namespaces": ["*"],
                "max_size": "256MiB",
                "file_size": "16MiB",
            }
        }
    return None


def measure(amp: Amp, body: str, connections: int, duration: float) -> dict[str, Any]:
    before = cpu_seconds_with_children(amp.pid)
    summary = run_wrk(amp.url, body, connections=connections, duration=duration, cpus=None)
    cpu = cpu_seconds_with_children(amp.pid) - before
    requests = max(summary["requests"], 1)
    return {
        "rps": summary["requests"] / duration,
        "cpu_ms": 1000 * cpu / requests,
        "p99_ms": summary["latency_us"]["p99"] / 1000,
        "errors": sum(summary["errors"].values()),
    }


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=float, default=8.0)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default=None, help="write safe-changes.json there")
    p.add_argument(
        "--writer-with-amp",
        action="store_true",
        help="leave amp's child processes (the recording's writer) on amp's CPU",
    )
    args = p.parse_args(argv)
    rounds, duration = (1, 1.0) if args.quick else (args.rounds, args.duration)
    cpus = sorted(os.sched_getaffinity(0))
    amp_cpus = {cpus[0]} if len(cpus) >= 2 else None
    load_cpus = {cpus[1]} if len(cpus) >= 2 else None
    procs: list[Any] = []
    with tempfile.TemporaryDirectory(prefix="amp-bench-safe-") as workdir:
        from amp_dev.devcert import write_dev_tls

        tls = {k: str(v) for k, v in write_dev_tls(os.path.join(workdir, "tls")).items()}
        files = bodies.write_bodies(os.path.join(workdir, "bodies"), {"on": ON, "off": OFF})
        try:
            urls = []
            for name in ("endpoint", "candidate"):
                proc = Proc(name, [sys.executable, "-m", "bench.endpoint"], cpus=load_cpus)
                procs.append(proc)
                urls.append(f"http://127.0.0.1:{proc.first_line()['port']}/patch")
            amps = {}
            for variant in VARIANTS:
                amp = Amp(
                    variant,
                    workdir,
                    tls,
                    endpoint_url=urls[0],
                    source="static",
                    kubeconfig=None,
                    per_review_get=False,
                    cpus=amp_cpus,
                    overlay=_overlay(variant, urls[0], urls[1], workdir),
                )
                procs.append(amp)
                amps[variant] = amp
            for amp in amps.values():
                amp.wait_ready()
                for child in [] if args.writer_with_amp else child_pids(amp.pid):  # see the module docstring
                    os.sched_setaffinity(child, cpus)
                amp.review(files["typical-on"])  # warm up: TLS, pools
            rows: list[dict[str, Any]] = []
            for r in range(rounds):
                for variant in VARIANTS:
                    for connections in (16, 1):
                        row = measure(amps[variant], files["typical-on"], connections, duration)
                        row.update(variant=variant, connections=connections, round=r)
                        rows.append(row)
                        say(
                            f"round {r + 1} {variant} c={connections}: {row['rps']:.0f} reviews/s, "
                            f"{row['cpu_ms']:.3f} ms CPU/review, p99 {row['p99_ms']:.2f} ms"
                        )
            sent = {v: sum(round(r["rps"] * duration) for r in rows if r["variant"] == v) for v in VARIANTS}

            def settled(variant: str, name: str) -> Optional[dict[str, float]]:
                # The canary's comparisons and the recording's writer finish
                # after the answers: wait until they account for most reviews.
                counts = Scrape.get(amps[variant].metrics_port).by(name, "result")
                return counts if sum(counts.values()) >= 0.9 * sent[variant] else None

            canary = poll_until("the canary's comparisons", lambda: settled("canary", "amp_canary_reviews_total"), 30)
            recorded = poll_until("the recording", lambda: settled("record", "amp_recorded_reviews_total"), 30)
        finally:
            for proc in reversed(procs):
                proc.stop()
        recordings = (
            os.listdir(os.path.join(workdir, "recordings"))
            if os.path.isdir(os.path.join(workdir, "recordings"))
            else []
        )
    result = {
        "machine": machine(),
        "rows": rows,
        "canary": canary,
        "recorded": recorded,
        "recording_files": len(recordings),
        "summary": summarise(rows),
    }
    print(markdown(result))
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "safe-changes.json"), "w") as f:
            json.dump(result, f, indent=1)
    ok = canary.get("same", 0) > 0 and recorded.get("written", 0) > 0 and recordings
    if not ok:
        say(f"the canary compared {canary} and the recorder wrote {recorded}: something did not run")
    return 0 if ok else 1


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for variant in VARIANTS:
        mine = [r for r in rows if r["variant"] == variant]
        out[variant] = {
            "cpu_ms_c16": statistics.median(r["cpu_ms"] for r in mine if r["connections"] == 16),
            "rps_c16": statistics.median(r["rps"] for r in mine if r["connections"] == 16),
            "p99_ms_c1": statistics.median(r["p99_ms"] for r in mine if r["connections"] == 1),
            "p99_ms_c16": statistics.median(r["p99_ms"] for r in mine if r["connections"] == 16),
            "p99_ms_c1_rounds": [r["p99_ms"] for r in mine if r["connections"] == 1],
        }
    # The noise band: every round of the two identical amps at c=1.
    same = [r["p99_ms"] for r in rows if r["variant"] in ("plain", "control") and r["connections"] == 1]
    band = (min(same), max(same)) if same else (0.0, 0.0)
    for variant in VARIANTS:
        out[variant]["p99_c1_within_noise"] = band[0] <= out[variant]["p99_ms_c1"] <= band[1]
    out["noise_band_p99_ms_c1"] = list(band)
    base = out["plain"]
    for variant in VARIANTS:
        for key in ("cpu_ms_c16", "p99_ms_c1", "p99_ms_c16"):
            out[variant][key.replace("_ms", "") + "_ratio"] = out[variant][key] / base[key] if base[key] else None
    return out


def markdown(result: dict[str, Any]) -> str:
    s = result["summary"]
    lines = [
        "| variant | CPU ms/review (c=16) | ÷ plain | reviews/s (c=16) | p99 ms (c=1), median | ÷ plain "
        "| p99 ms (c=1), rounds | within noise | p99 ms (c=16) | ÷ plain |",
        "|---|---:|---:|---:|---:|---:|---|---|---:|---:|",
    ]

    def ratio(value: Optional[float]) -> str:
        # None where plain measured nothing (a starved machine served no review in a round).
        return "n/a" if value is None else f"{value:.2f}"

    for v in VARIANTS:
        x = s[v]
        rounds = " / ".join(f"{p:.2f}" for p in x["p99_ms_c1_rounds"])
        lines.append(
            f"| {v} | {x['cpu_ms_c16']:.3f} | {ratio(x['cpu_c16_ratio'])} | {x['rps_c16']:.0f} | "
            f"{x['p99_ms_c1']:.2f} | {ratio(x['p99_c1_ratio'])} | {rounds} | "
            f"{'yes' if x['p99_c1_within_noise'] else 'no'} | {x['p99_ms_c16']:.2f} | "
            f"{ratio(x['p99_c16_ratio'])} |"
        )
    low, high = s["noise_band_p99_ms_c1"]
    lines.append("")
    lines.append(f"noise band of p99 at c=1 (every round of plain and control): {low:.2f}–{high:.2f} ms")
    lines.append(
        f"canary comparisons: {result['canary']}; recorded: {result['recorded']} in {result['recording_files']} file(s)"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
