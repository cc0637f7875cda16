"""
The soak's command line: L{parse_args} reads C{python -m bench.soak}'s
options and fills in the defaults that depend on C{--quick}; the driver
(L{bench.soak.driver}) runs what it returns.
"""

from __future__ import annotations

import argparse
import os
from typing import Optional

from bench.soak.settings import QUICK_DURATION, QUICK_RATE, RSS_LIMIT_MIB

BENCH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.soak", description="amp's soak under injected faults (see bench/README.md)"
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"a {QUICK_DURATION:g}-second run that judges behaviour only (what the test suite runs)",
    )
    p.add_argument("--minutes", type=float, help="minutes of load (default 10)")
    p.add_argument("--duration", type=float, help="seconds of load (instead of --minutes)")
    p.add_argument("--rate", type=float, help=f"reviews per second (default 150, quick {QUICK_RATE:g})")
    p.add_argument("--seed", type=int, default=20240501, help="seed of the chaos endpoint and the client")
    p.add_argument("--rotate-every", type=float, default=3.0, help="seconds between certificate rotations")
    p.add_argument(
        "--fault-every", type=float, default=5.0, help="seconds between watch faults (a drop and a forced 410 in turn)"
    )
    p.add_argument(
        "--rss-limit-mib",
        type=float,
        default=RSS_LIMIT_MIB,
        help=f"amp's RSS must stay under this many MiB (default {RSS_LIMIT_MIB:g}, the shipped limit)",
    )
    p.add_argument(
        "--hostile",
        action="store_true",
        help="mix hostile endpoints in with the faults: header floods, one huge header line, deeply "
        "nested JSON, slow-drip bodies (see bench/chaos_endpoint.py)",
    )
    p.add_argument(
        "--config-every",
        type=float,
        default=2.0,
        help="with --hostile: seconds between swaps of amp's config file (hostile and good in turn)",
    )
    p.add_argument(
        "--flood-mib",
        type=int,
        default=8,
        help="MiB of head a hostile header-flood or huge-header call sends at most (default 8)",
    )
    p.add_argument("--out", default=os.path.join(BENCH, "results"), help="results directory")
    p.add_argument("--keep-logs", action="store_true", help="copy amp's log and the call logs to the results")
    p.add_argument("--no-pin", action="store_true", help="do not give amp a CPU of its own")
    p.add_argument(
        "--wait-quiet",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="first wait up to this long for other processes to use under 15%% of a CPU",
    )
    a = p.parse_args(argv)
    if a.rate is None:
        a.rate = QUICK_RATE if a.quick else 150.0
    if a.duration is None:
        a.duration = QUICK_DURATION if a.quick and a.minutes is None else 60.0 * (a.minutes or 10.0)
    return a
