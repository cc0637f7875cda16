"""
What bench/run measures: its modes (one row of the table each), the order of
the rows, the tracing modes' sampling ratios, when a row counts as measured
on a busy machine, and the performance goals the report judges.  Constants
only: L{bench.run_measure} measures the modes, L{bench.run_analysis} and
L{bench.run_report} read them.
"""

from __future__ import annotations

MODES = {
    "a": "endpoint alone (direct, plain HTTP)",
    "b": "amp, warm namespace cache",
    "c": "amp, one Namespace GET per review",
    "d": "amp, namespace not enabled",
    "f": "floor: minimal Twisted TLS proxy",
    "g": "stack floor: twisted.web + Agent proxy",
    "t": "amp as (b), tracing on, 1% sampled",
    "u": "amp as (b), tracing on, every review sampled",
}
#: The proxies of the benchmark's own (bench/floor.py), by mode: the
#: runtime's floor and the stack floor.
PROXIES = {"f": "floor", "g": "stack"}

#: The order of the table's rows for each body.
ROW_ORDER = ("a", "f", "g", "b", "t", "u", "c", "d")
#: The sampling ratio of each tracing mode: (b) is tracing off.
TRACING = {"t": 0.01, "u": 1.0}

#: A row during which the rest of the machine used more than this (% of one
#: CPU) is measured again with --retry-busy.
BUSY_PCT = 25.0
#: With --wait-quiet, the longest wait for a quiet machine before each row.
ROW_WAIT = 60.0

#: The issue's goals: reported, never asserted.
TARGETS = {
    "cpu_vs_floor_typical_max": 2.5,
    "cpu_vs_floor_large_max": 3.0,
    "added_p99_ms_max": 1.0,
    "cache_vs_get_throughput_min": 2.0,
}
