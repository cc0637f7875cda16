"""
What a config reload costs the reactor, for a good config file and for each
hostile one (L{bench.soak.configswap.HOSTILE_CONFIGS}: an alias bomb, a
50 MiB file, a file just under the 1 MiB cap that parses in full, JSON
nested 100,000 deep, NaN, invalid UTF-8, an empty file).

Each file is loaded as amp loads it (L{amp.reload.load_config_file}: the
bounded reader, then the config's own checks) two ways: in the reactor's
thread pool, as L{amp.reload.ConfigFile} does, and on the reactor thread, as
amp did before.  Meanwhile a 1 ms C{LoopingCall} measures the longest gap
between its ticks (what a review arriving then would wait); the figure is
that gap as a ratio to the longest gap of the same loop with nothing loading,
measured in the same run just before.  The process's peak RSS (C{VmHWM})
after every load shows whether any file made amp's memory grow.

Usage: python -m bench.config_reload [--repeat 5] [--out DIR]
Prints a table and writes bench/results/config-reload-<UTC timestamp>.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import tempfile
import time
from functools import partial
from typing import Any, Callable

from twisted.internet.defer import Deferred, inlineCallbacks
from twisted.internet.task import LoopingCall, deferLater, react
from twisted.internet.threads import deferToThreadPool

from amp.reload import load_config_file
from bench.harness import busy_seconds, machine
from bench.soak.configswap import HOSTILE_CONFIGS

BENCH = os.path.dirname(os.path.abspath(__file__))
TICK = 0.001
#: How long the loop runs on its own before each load, for the baseline, and after it.
SETTLE = 0.2

GOOD = b"""listen: {port: 8443, interface: 127.0.0.1}
endpoints:
  allow: ["http://*.svc:*/*"]
  timeout: 2s
failure_policy: Ignore
kubernetes:
  source: static
  namespaces:
    team-a: {labels: {amp.txn2.com/enabled: "true"}, annotations: {amp.txn2.com/ep: "http://ep.svc:8080/m"}}
"""


def peak_rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


class Gaps:
    """The longest gap between ticks of a 1 ms loop since L{reset}."""

    def __init__(self, reactor: Any) -> None:
        self.reactor = reactor
        self.last = time.monotonic()
        self.longest = 0.0
        self.loop = LoopingCall(self._tick)
        self.loop.clock = reactor

    def _tick(self) -> None:
        now = time.monotonic()
        self.longest = max(self.longest, now - self.last)
        self.last = now

    def reset(self) -> None:
        self.last = time.monotonic()
        self.longest = 0.0


@inlineCallbacks
def measure(reactor: Any, gaps: Gaps, load: Callable[[], Deferred[Any]]) -> Any:
    """(longest gap with nothing loading, longest gap while C{load} runs and just after)."""
    gaps.reset()
    yield deferLater(reactor, SETTLE, lambda: None)
    idle = gaps.longest
    gaps.reset()
    started = time.monotonic()
    yield load()
    took = time.monotonic() - started
    yield deferLater(reactor, SETTLE / 4, lambda: None)
    return idle, gaps.longest, took


@inlineCallbacks
def run(reactor: Any, args: argparse.Namespace) -> Any:
    directory = tempfile.mkdtemp(prefix="amp-config-reload-")
    writers = {"good": lambda f: f.write(GOOD), **HOSTILE_CONFIGS}
    paths = {}
    for kind, write in writers.items():
        paths[kind] = os.path.join(directory, f"{kind}.yaml")
        with open(paths[kind], "wb") as f:
            write(f)
    gaps = Gaps(reactor)
    gaps.loop.start(TICK)
    pool = reactor.getThreadPool()
    rows: list[dict[str, Any]] = []
    busy_before = busy_seconds()
    wall_before = time.monotonic()
    for kind, path in paths.items():
        row: dict[str, Any] = {"kind": kind, "bytes": os.path.getsize(path)}
        for how in ("thread", "reactor"):
            ratios, stalls, took = [], [], []
            for _ in range(args.repeat):
                if how == "thread":
                    load = partial(deferToThreadPool, reactor, pool, load_config_file, path, None)
                else:
                    load = partial(deferLater, reactor, 0, load_config_file, path, None)
                idle, longest, seconds = yield measure(reactor, gaps, load)
                ratios.append(longest / idle if idle else float("inf"))
                stalls.append(longest * 1000)
                took.append(seconds * 1000)
            row[how] = {
                "stall_ms": round(statistics.median(stalls), 2),
                "stall_vs_idle": round(statistics.median(ratios), 2),
                "load_ms": round(statistics.median(took), 2),
            }
        loaded = load_config_file(path, None)
        row["result"] = "loaded" if loaded.config is not None else f"refused: {loaded.error}"[:100]
        row["peak_rss_mib"] = round(peak_rss_kib() / 1024, 1)
        rows.append(row)
    gaps.loop.stop()
    elapsed = time.monotonic() - wall_before
    other = 100 * (busy_seconds() - busy_before) / elapsed if elapsed else 0.0
    print(
        f"{'file':14} {'bytes':>9}  {'in a thread: stall ms (x idle)':>31}  "
        f"{'on the reactor: stall ms (x idle)':>34}  "
        f"{'peak RSS MiB':>12}  result"
    )
    for r in rows:
        t, o = r["thread"], r["reactor"]
        print(
            f"{r['kind']:14} {r['bytes']:>9}  {t['stall_ms']:>20} ({t['stall_vs_idle']:>6}x)  "
            f"{o['stall_ms']:>23} ({o['stall_vs_idle']:>6}x)  {r['peak_rss_mib']:>12}  {r['result'][:60]}"
        )
    print(
        f"(median of {args.repeat}; the machine's CPUs were busy {other:.0f}% of one CPU over the run, this "
        f"process included)"
    )
    out = args.out
    os.makedirs(out, exist_ok=True)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = os.path.join(out, f"config-reload-{stamp}.json")
    with open(path, "w") as f:
        json.dump(
            {
                "date": stamp,
                "machine": machine(),
                "repeat": args.repeat,
                "tick_s": TICK,
                "rows": rows,
                "busy_cpu_pct": round(other, 1),
            },
            f,
            indent=2,
        )
    print(f"wrote {path}")


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.config_reload", description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=5, help="loads of each file each way (the median is shown)")
    p.add_argument("--out", default=os.path.join(BENCH, "results"), help="results directory")
    args = p.parse_args()
    react(run, [args])


if __name__ == "__main__":
    main()
