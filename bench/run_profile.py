"""
bench/run's profile of amp: py-spy attached to a running amp of L{Bench}
while wrk drives it, summarised by L{bench.profile_summary}; without py-spy,
a second amp restarted under twistd's cProfile.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from typing import Any, Optional

from bench.harness import run_wrk, say
from bench.profile_summary import _short, summarise_collapsed
from bench.run_measure import Bench


def profile(bench: Bench, outdir: str, stem: str, mode: str = "b") -> Optional[dict[str, Any]]:
    """
    Profile amp during a run of C{mode} with the body of
    C{--profile-body} (typical unless told): py-spy attached to the
    running amp, else (mode (b) only) cProfile.
    """
    spy = shutil.which("py-spy") or shutil.which("py-spy", path=os.path.dirname(sys.executable))
    duration = bench.args.profile_duration
    url, body_file, amp = bench.target(mode, bench.args.profile_body)
    assert amp is not None, f"mode ({mode}) runs no amp to profile"
    if spy:
        raw = os.path.join(outdir, f"{stem}-profile-{mode}.txt")
        proc = subprocess.Popen(
            [
                spy,
                "record",
                "--pid",
                str(amp.pid),
                "--duration",
                str(duration),
                "--rate",
                "250",
                "--format",
                "raw",
                "--output",
                raw,
                "--nonblocking",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        # py-spy says "Sampling process ..." once attached: the load starts after it.
        assert proc.stdout is not None
        attached = proc.stdout.readline()
        run_wrk(url, body_file, connections=bench.args.connections, duration=duration + 1, cpus=bench.load_cpus)
        out, _ = proc.communicate(timeout=60)
        out = attached + out
        if proc.returncode == 0 and os.path.exists(raw):
            summary = summarise_collapsed(raw)
            summary.update(
                tool="py-spy",
                file=os.path.basename(raw),
                duration_s=duration,
                mode=mode,
                body=bench.args.profile_body,
                note="own time of the amp process's busy threads (idle time is not sampled)",
            )
            return summary
        say(f"py-spy could not profile amp ({proc.returncode}): {out.strip()[-500:]}")
    if mode != "b":
        return None
    say("profiling with cProfile instead")
    return cprofile(bench, outdir, stem, duration)


def cprofile(bench: Bench, outdir: str, stem: str, duration: int) -> Optional[dict[str, Any]]:
    """
    amp restarted under twistd's cProfile (much slower: shares are what count).
    """
    import pstats

    stats_path = os.path.join(outdir, f"{stem}-profile.pstats")
    amp = bench.new_amp("cprofile", extra_twistd=(f"--profile={stats_path}", "--profiler=cprofile", "--savestats"))
    try:
        amp.wait_ready()
        run_wrk(
            amp.url,
            bench.bodies[f"{bench.args.profile_body}-on"],
            connections=bench.args.connections,
            duration=duration,
            cpus=bench.load_cpus,
        )
    finally:
        amp.stop()
    if not os.path.exists(stats_path):
        say("cProfile wrote no statistics")
        return None
    # (file, line, function) -> (calls, primitive calls, own time, total time, callers)
    table: dict[tuple[str, int, str], tuple[Any, ...]] = pstats.Stats(stats_path).stats  # type: ignore[attr-defined]  # undocumented, not in typeshed
    total = sum(v[2] for v in table.values()) or 1.0  # tottime
    top = sorted(table.items(), key=lambda kv: kv[1][2], reverse=True)[:15]
    return {
        "tool": "cProfile",
        "file": os.path.basename(stats_path),
        "duration_s": duration,
        "mode": "b",
        "body": bench.args.profile_body,
        "note": "cProfile own time (tottime); the profiler's overhead inflates small functions",
        "top": [
            {
                "function": f"{fn} ({_short(path)}:{line})",
                "own_pct": round(100 * v[2] / total, 1),
                "total_pct": round(100 * v[3] / total, 1),
            }
            for (path, line, fn), v in top
        ],
    }
