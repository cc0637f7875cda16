#!/usr/bin/env python3
"""
Instructions per review: the in-memory review path of L{bench.review_path}
run under C{valgrind --tool=callgrind}, which counts instructions instead
of timing them, so the figure is the same on a quiet machine and on a busy
one (a shared CI runner, a laptop compiling).  Instructions are not time
(cache misses and the kernel are not in them): use this to compare two
versions of amp's code, and C{bench/run} for what a review costs.

Each body is run twice, with C{--few} and C{--many} reviews after the same
warm-up; the difference, divided by the difference in reviews, is what one
review costs without the interpreter's start-up.  With C{--top N} it also
lists the N C functions that account for most of a review's instructions
(the interpreter's own loop among them: Python code shows as
C{_PyEval_EvalFrameDefault}).

Run: C{python -m bench.instructions [--top 20]}; needs valgrind.  Prints
one JSON object.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Any

_COLLECTED = re.compile(r"Collected : (\d+)")
_FUNCTION = re.compile(r"^\s*([\d,]+) \([^)]*\)\s+(\S+?):(\S+)")


def _child(body_name: str, reviews: int) -> None:
    """Run C{reviews} reviews of C{body_name} after a warm-up (under valgrind)."""
    from twisted.logger import globalLogBeginner

    globalLogBeginner.beginLoggingTo([], discardBuffer=True, redirectStandardIO=False)
    from bench import bodies
    from bench.review_path import ReviewPath, check_answer, request_pieces

    path = ReviewPath()
    pieces = request_pieces(bodies.review_body(body_name, "bench"))
    for _ in range(20):
        check_answer(path.review(pieces))
    for _ in range(reviews):
        path.review(pieces)


def _functions(out_file: str) -> collections.Counter[str]:
    annotated = subprocess.run(
        ["callgrind_annotate", "--inclusive=no", "--threshold=100", out_file],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    functions: collections.Counter[str] = collections.Counter()
    for line in annotated.splitlines():
        match = _FUNCTION.match(line)
        if match:
            name = match.group(2).rsplit("/", 1)[-1] + ":" + match.group(3).split("'")[0]
            functions[name] += int(match.group(1).replace(",", ""))
    return functions


def _count(body_name: str, reviews: int, workdir: str) -> tuple[int, collections.Counter[str]]:
    out_file = os.path.join(workdir, f"callgrind.{body_name}.{reviews}")
    done = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out_file}",
            sys.executable,
            "-m",
            "bench.instructions",
            "--child",
            body_name,
            str(reviews),
        ],
        capture_output=True,
        text=True,
    )
    match = _COLLECTED.search(done.stderr)
    if done.returncode != 0 or match is None:
        raise SystemExit(f"valgrind failed ({done.returncode}): {done.stderr[-2000:]}")
    return int(match.group(1)), _functions(out_file)


def measure(body_name: str, few: int, many: int, top: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="amp-instructions-") as workdir:
        low, low_functions = _count(body_name, few, workdir)
        high, high_functions = _count(body_name, many, workdir)
    per_review = (high - low) / (many - few)
    result: dict[str, Any] = {"instructions_per_review": round(per_review)}
    if top:
        costs = {name: (high_functions[name] - low_functions[name]) / (many - few) for name in high_functions}
        result["top"] = [
            {"function": name, "per_review": round(cost), "percent": round(100 * cost / per_review, 1)}
            for name, cost in sorted(costs.items(), key=lambda kv: -kv[1])[:top]
        ]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--few", type=int, default=20, help="reviews of the shorter run (default 20)")
    parser.add_argument("--many", type=int, default=220, help="reviews of the longer run (default 220)")
    parser.add_argument("--top", type=int, default=0, help="also list the C functions that cost most")
    parser.add_argument(
        "--body", choices=("typical", "large"), action="append", help="the bodies to measure (default both)"
    )
    parser.add_argument("--child", nargs=2, metavar=("BODY", "REVIEWS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child[0], int(args.child[1]))
        return
    if shutil.which("valgrind") is None or shutil.which("callgrind_annotate") is None:
        raise SystemExit("bench.instructions needs valgrind (callgrind and callgrind_annotate)")
    if args.many <= args.few:
        parser.error("--many must be more than --few")
    print(
        json.dumps(
            {name: measure(name, args.few, args.many, args.top) for name in args.body or ("typical", "large")}, indent=2
        )
    )


if __name__ == "__main__":
    main()
