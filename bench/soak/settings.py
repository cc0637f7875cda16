"""
The soak's fixed settings: the namespaces reviews go to, amp's endpoint and
breaker settings (L{amp_overlay}, the config amp runs under), the chaos
endpoint's faults, and the pass thresholds.
"""

from __future__ import annotations

from typing import Any

from bench.chaos_endpoint import HEADER_REASONS

ENABLED_LABEL = "amp.txn2.com/enabled"
ENDPOINT_ANNOTATION = "amp.txn2.com/ep"
POLICY_ANNOTATION = "amp.txn2.com/failure-policy"
STATUS_ANNOTATION = "amp.txn2.com/status"

#: The namespaces reviews are sent to: (name, failure policy, chaos port,
#: endpoint path, the API server's timeout in seconds, share of the load).
#: Paths under /t300/ get amp's endpoint timeout of 300ms, /t1000/ one of
#: 1s.  In soak-tight the API server's 1s timeout leaves amp a budget of
#: 0.5s (deadline.margin), shorter than the endpoint's own 1s timeout.
NAMESPACES = (
    ("soak-ignore", "Ignore", "steady", "/t300/ignore", 10, 3),
    ("soak-fail", "Fail", "steady", "/t300/fail", 10, 3),
    ("soak-slow", "Ignore", "steady", "/t1000/slow", 10, 1),
    ("soak-tight", "Fail", "steady", "/t1000/tight", 1, 1),
    ("soak-flaky-ignore", "Ignore", "flaky", "/t300/flaky", 10, 2),
    ("soak-flaky-fail", "Fail", "flaky", "/t300/flaky", 10, 1),
    ("soak-off", None, None, None, 10, 1),
)

#: A breaker that never opens, and one that opens after three failures in a
#: row with a short cool-down, so that it keeps opening and closing.
NEVER_OPENS = {"consecutive_failures": 1_000_000_000, "min_requests": 1_000_000_000}
OPENS_OFTEN = {
    "consecutive_failures": 3,
    "failure_ratio": 0.5,
    "min_requests": 10,
    "window": "10s",
    "cooldown": "200ms",
    "max_cooldown": "1s",
}

#: amp's endpoint reply limit in the soak, and the chaos endpoint's
#: oversized reply (bigger).
MAX_RESPONSE = 64 * 1024
OVERSIZE = 80 * 1024
#: Range of the chaos endpoint's delays: well under the smallest endpoint
#: timeout (300ms), so a delay never becomes a timeout.
DELAY_MS = (5, 80)

#: How review reasons (in amp's answer) follow from what the endpoint did.
#: A hang ends with amp's endpoint timeout, or in soak-tight possibly with
#: the review's own deadline (the two timers are due at the same moment).
REVIEW_REASONS = {
    "error": {"http-5xx"},
    "garbage": {"invalid-json"},
    "wrong-shape": {"invalid-reply"},
    "reset": {"connection-reset"},
    "hang": {"timeout", "deadline"},
    "oversized": {"response-too-large"},
    # The hostile kinds (--hostile): see bench/chaos_endpoint.py.
    "header-flood": {"timeout", "deadline", *HEADER_REASONS},
    "huge-header": {"timeout", "deadline", *HEADER_REASONS},
    "deep-json": {"invalid-json"},
    "drip": {"timeout", "deadline"},
}

#: Lines in amp's log that fail the soak.
LOG_PROBLEMS = ("Unhandled Error", "Traceback", "CRITICAL", "#critical]", "#error]")

#: The soak's exit statuses.
PASSED, FAILED, BROKEN = 0, 1, 2

#: Seconds of load in a --quick run: enough for every fault kind, the
#: flaky breaker opening, certificate rotations and both watch faults.
QUICK_DURATION = 15.0
#: Reviews per second in a --quick run: every fault kind still comes up
#: dozens of times.
QUICK_RATE = 100.0

#: amp's RSS must stay under this (MiB) unless --rss-limit-mib says
#: otherwise: the memory limit of the shipped manifests (deploy/base).
RSS_LIMIT_MIB = 256.0

#: A run this long (seconds) also checks that RSS is flat: the median of the
#: last third of the run against the median of the middle third (the first
#: third is warm-up).  A shorter run has too few samples for a trend.
FLATNESS_MIN_DURATION = 300.0
RSS_GROWTH_MAX_PCT = 10.0

#: Open file descriptors amp may hold after the run, once idle, beyond those
#: it held before the load started: a few for connections still closing.
#: Pooled endpoint connections close after the soak's endpoint idle timeout.
FD_SLACK = 8
ENDPOINT_IDLE_TIMEOUT = "2s"

#: Criteria about time (reviews answered before the API server's timeout,
#: endpoint answers that came after amp's timeout): judged in a full run,
#: only reported in a --quick run (the test suite's, on a machine that may
#: be busy), since a busy machine can fail them on its own.
TIMING_CRITERIA = ("deadlines", "endpoint_timing")


def amp_overlay(ports: dict[str, int]) -> dict[str, Any]:
    steady, flaky = ports["steady"], ports["flaky"]
    return {
        "tls": {"reload_interval": "1s"},
        "endpoints": {
            "allow": ["http://127.0.0.1:*/*"],
            "timeout": "300ms",
            "max_response": MAX_RESPONSE,
            "pool_size": 16,
            # Pooled connections close soon after the load, so that the fd
            # check after it sees amp back where it started.
            "idle_timeout": ENDPOINT_IDLE_TIMEOUT,
            # The defaults' breaker is the steady origin's (no override of
            # its root path): a path-scoped override may not set a breaker.
            "breaker": NEVER_OPENS,
            "overrides": [
                {"match": f"http://127.0.0.1:{steady}/t1000/*", "timeout": "1s"},
                {"match": f"http://127.0.0.1:{flaky}/*", "breaker": OPENS_OFTEN},
            ],
        },
        "failure_policy": "Ignore",
    }
