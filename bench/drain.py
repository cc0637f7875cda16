#!/usr/bin/env python3
"""
How long a graceful shutdown takes with a review in flight: a real
C{twistd amp} process (tests/integration/process/test_shutdown.py's C{Amp}) reviews a Pod on an
endpoint that answers one second after C{SIGTERM} reaches amp; the time from
the signal to the process's exit is measured, and the review must get its
patched answer.  The drain is bounded by its own deadline, so a figure near
1 s says amp waited for the review and nothing else.

Usage: C{python -m bench.drain [--runs 5]}; prints each run and the median.
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Optional

from tests.integration.process.test_shutdown import Amp, HeldEndpoint, assert_patched
from tests.support.waiting import poll_until

#: Seconds after the signal at which the endpoint answers.
ANSWER_AFTER = 1.0


def one_run(pool: ThreadPoolExecutor) -> float:
    endpoint = HeldEndpoint()
    amp = Amp(Path(tempfile.mkdtemp(prefix="amp-drain-")), endpoint.url, listen={"drain_timeout": "20s"})
    try:
        poll_until("amp to serve", amp.healthy, 60, amp.output)
        review = pool.submit(amp.review, "in-flight")
        poll_until("the review to reach the endpoint", lambda: endpoint.held() or None, 10, amp.output)
        threading.Timer(ANSWER_AFTER, endpoint.release).start()
        started = time.monotonic()
        amp.process.send_signal(signal.SIGTERM)
        amp.process.wait(timeout=30)
        seconds = time.monotonic() - started
        assert_patched(review.result(timeout=5), "in-flight")
        return seconds
    finally:
        amp.stop()


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    with ThreadPoolExecutor(2) as pool:
        times = [one_run(pool) for _ in range(args.runs)]
    print(
        f"SIGTERM -> exit with a review in flight (the endpoint answers {ANSWER_AFTER:g}s after the signal): "
        + ", ".join(f"{t:.3f}s" for t in times)
        + f"; median {statistics.median(times):.3f}s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
