#!/usr/bin/env python3
"""
amp at an earlier commit beside amp as checked out, and the floor, measured
in the same minutes: CPU per review of each, in interleaved rounds.

On a shared virtual machine CPU per review drifts by tens of percent from
minute to minute, and amp's more than the floor's: two C{bench/run}s an
hour apart cannot say what a change did.  Here the three processes run
side by side (each C{twistd -n amp} with the benchmark's configuration and
static namespaces, the floor L{bench.floor}, all pinned to the same CPU,
wrk and the endpoint on the other), and each round measures all three one
after the other, the order reversed every round.  Every figure is a ratio
within a round: amp ÷ floor for each version, and after ÷ before.

The earlier commit is taken with C{git archive} into a temporary directory
and put first on that amp's C{PYTHONPATH}; its first log line names the
C{amp} package it imported, which is checked.

Run: C{python -m bench.versions --before REV [--rounds 6] [--duration 5]};
prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from typing import Any

from bench import bodies
from bench.harness import (
    OFF,
    ON,
    REPO,
    Amp,
    Proc,
    cpu_seconds,
    ensure_wrk,
    run_wrk,
    say,
)

AMP_CPU = {0}
LOAD_CPU = {1}


def _checkout(rev: str, into: str) -> str:
    """The tree of C{rev} unpacked into C{into}; its path."""
    archive = subprocess.run(["git", "-C", REPO, "archive", "--format=tar", rev], capture_output=True, check=True)
    path = os.path.join(into, "before")
    os.makedirs(path)
    with tempfile.TemporaryFile() as f:
        f.write(archive.stdout)
        f.seek(0)
        with tarfile.open(fileobj=f) as tar:
            tar.extractall(path, filter="data")
    return path


def _amp(name: str, source: str, workdir: str, tls: dict[str, str], endpoint_url: str) -> Amp:
    """One C{twistd -n amp} importing amp from C{source}, ready."""
    amp = Amp(
        name,
        workdir,
        tls,
        endpoint_url=endpoint_url,
        source="static",
        kubeconfig=None,
        per_review_get=False,
        cpus=AMP_CPU,
        env=dict(os.environ, PYTHONPATH=source),
        preamble="import amp; print('amp from', amp.__file__, flush=True); ",
    )
    amp.wait_ready()
    with open(amp.log_path) as f:
        first = f.readline()
    if not first.startswith(f"amp from {os.path.join(source, 'amp')}"):
        amp.stop()
        raise SystemExit(f"amp ({name}) imported the wrong amp: {first.strip()}")
    return amp


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", required=True, help="the earlier commit (any git revision)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per process per round")
    args = parser.parse_args()
    ensure_wrk()
    from amp_dev.devcert import write_dev_tls

    procs: list[Proc | Amp] = []
    result: dict[str, Any] = {"before": args.before, "rounds": args.rounds, "duration_s": args.duration}
    with tempfile.TemporaryDirectory(prefix="amp-versions-") as workdir:
        try:
            before = _checkout(args.before, workdir)
            tls = {k: str(v) for k, v in write_dev_tls(os.path.join(workdir, "tls")).items()}
            body_files = bodies.write_bodies(os.path.join(workdir, "bodies"), {"on": ON, "off": OFF})
            endpoint = Proc("endpoint", [sys.executable, "-m", "bench.endpoint"], cpus=LOAD_CPU)
            procs.append(endpoint)
            endpoint_url = f"http://127.0.0.1:{endpoint.first_line()['port']}/patch"
            floor = Proc(
                "floor",
                [
                    sys.executable,
                    "-m",
                    "bench.floor",
                    "--cert",
                    tls["cert"],
                    "--key",
                    tls["key"],
                    "--endpoint",
                    endpoint_url,
                ],
                cpus=AMP_CPU,
            )
            procs.append(floor)
            targets = {"floor": (floor.pid, f"https://127.0.0.1:{floor.first_line()['port']}/mutate?timeout=10s")}
            for name, source in (("before", before), ("after", REPO)):
                amp = _amp(name, source, workdir, tls, endpoint_url)
                procs.append(amp)
                targets[name] = (amp.pid, amp.url)
            for body in bodies.BODIES:
                body_file = body_files[f"{body}-on"]
                for _pid, url in targets.values():
                    run_wrk(url, body_file, connections=16, duration=2, cpus=LOAD_CPU)
                cpu: dict[str, list[float]] = {name: [] for name in targets}
                for n in range(args.rounds):
                    for name in list(targets) if n % 2 == 0 else list(reversed(targets)):
                        pid, url = targets[name]
                        start = cpu_seconds(pid)
                        summary = run_wrk(url, body_file, connections=16, duration=args.duration, cpus=LOAD_CPU)
                        if sum(summary["errors"].values()) or not summary["requests"]:
                            raise SystemExit(f"{name} {body}: {summary['requests']} requests, {summary['errors']}")
                        cpu[name].append(round((cpu_seconds(pid) - start) * 1000 / summary["requests"], 4))
                ratios = {name: [a / f for a, f in zip(cpu[name], cpu["floor"])] for name in ("before", "after")}
                change = [a / b for a, b in zip(cpu["after"], cpu["before"])]
                result[body] = {
                    "cpu_ms_per_review": cpu,
                    "before_vs_floor_median": round(statistics.median(ratios["before"]), 2),
                    "after_vs_floor_median": round(statistics.median(ratios["after"]), 2),
                    "after_vs_before": [round(x, 3) for x in change],
                    "after_vs_before_median": round(statistics.median(change), 3),
                }
                say(
                    f"{body}: amp ÷ floor {result[body]['before_vs_floor_median']}x before, "
                    f"{result[body]['after_vs_floor_median']}x after; after ÷ before "
                    f"{result[body]['after_vs_before_median']}"
                )
        finally:
            for proc in reversed(procs):
                proc.stop()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
