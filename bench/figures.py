#!/usr/bin/env python3
"""
The small figures behind choices in amp's code, measured again: each
choice's two sides timed in this process (best of several rounds, in
microseconds).  bench/README.md ("Figures behind the code") lists what each
figure justifies and where; the code's comments keep the why and point
there, so that a figure that ages is measured again here, not trusted from
a comment.

  - dataclass: constructing each per-review value class as amp defines it
    (not frozen) and as a frozen twin (C{object.__setattr__} per field);
  - metrics: a C{prometheus_client} child's C{inc}/C{observe} (a lock per
    change) against amp's reactor-thread children (L{amp.metrics});
  - pipe: the recorder's frame head in L{marshal} against C{json.dumps};
  - base64: the answer's patch written by msgspec as bytes against
    C{base64.b64encode} then decoded to a string;
  - digits: the search for nineteen digits in a row in a 60 KiB review,
    a translation and a find against a regular expression;
  - lines: L{amp.logs.lines_together} against a generator-based context
    manager doing the same.

Run: C{python -m bench.figures [--rounds N]}; prints one JSON object.
Figures are time: run on a quiet machine, compare runs of one machine.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import dataclasses
import json
import marshal
import re
import time
import timeit
from typing import Any, Callable, Iterator

import msgspec

from bench import bodies


def best_us(fn: Callable[[], Any], number: int, rounds: int) -> float:
    """
    The best of C{rounds} rounds of C{number} calls, per call, in
    microseconds of this process's CPU time (other processes' load does not
    count, as wall-clock time would on a shared machine).
    """
    timer = timeit.Timer(fn, timer=time.process_time)
    return round(min(timer.repeat(number=number, repeat=rounds)) / number * 1e6, 3)


def frozen_twin(cls: type) -> type:
    """A frozen dataclass of C{cls}'s fields (slots, like amp's)."""
    fields = [(f.name, f.type, f) for f in dataclasses.fields(cls)]
    return dataclasses.make_dataclass(cls.__name__ + "Frozen", fields, frozen=True, slots=True)


def dataclass_figures(number: int, rounds: int) -> dict[str, Any]:
    from amp.answers import Outcome
    from amp.deadline import Deadline
    from amp.patch._check import CheckedPatch
    from amp.recent import Decision
    from amp.reply import EndpointDecision

    out: dict[str, Any] = {}
    for cls in (Deadline, Decision, Outcome, CheckedPatch, EndpointDecision):
        args = [None] * len(dataclasses.fields(cls))  # the values do not change what __init__ costs
        twin = frozen_twin(cls)
        out[f"{cls.__module__}.{cls.__name__}"] = {
            "frozen_us": best_us(lambda twin=twin, args=args: twin(*args), number, rounds),
            "amp_us": best_us(lambda cls=cls, args=args: cls(*args), number, rounds),
        }
    return out


def metrics_figures(number: int, rounds: int) -> dict[str, Any]:
    from prometheus_client import CollectorRegistry, Counter, Histogram

    from amp.metrics import HotCounter, HotHistogram

    registry = CollectorRegistry()
    counter = Counter("bench_c", "c", ["a"], registry=registry).labels("x")
    histogram = Histogram("bench_h", "h", ["a"], registry=registry).labels("x")
    hot_counter = HotCounter("bench_hc", "c", ["a"], registry=registry).labels("x")
    hot_histogram = HotHistogram("bench_hh", "h", ["a"], Histogram.DEFAULT_BUCKETS, registry=registry).labels("x")
    return {
        "inc": {
            "prometheus_client_us": best_us(counter.inc, number, rounds),
            "amp_us": best_us(hot_counter.inc, number, rounds),
        },
        "observe": {
            "prometheus_client_us": best_us(lambda: histogram.observe(0.012), number, rounds),
            "amp_us": best_us(lambda: hot_histogram.observe(0.012), number, rounds),
        },
    }


def pipe_figures(number: int, rounds: int) -> dict[str, Any]:
    head = (
        1764372000.123,
        "705ab4f5-6b7e-4f1e-9a39-0d5a3c1c0f42",
        "team-a",
        {"amp.txn2.com/enabled": "true", "team": "a"},
        {"amp.txn2.com/ep": "http://user-env.platform.svc:8080"},
        ("http://user-env.platform.svc:8080/",),
        "Ignore",
        "normal",
        "patched",
        "",
        "",
    )
    return {
        "marshal_us": best_us(lambda: marshal.dumps(head), number, rounds),
        "json_us": best_us(lambda: json.dumps(head).encode(), number, rounds),
    }


def base64_figures(number: int, rounds: int) -> dict[str, Any]:
    patch = json.dumps(
        [{"op": "add", "path": f"/metadata/labels/bench-{i}", "value": "x" * 20} for i in range(5)]
    ).encode()[:300]
    encode = msgspec.json.Encoder().encode
    return {
        "patch_bytes": len(patch),
        "msgspec_bytes_us": best_us(lambda: encode({"patch": patch}), number, rounds),
        "b64encode_then_str_us": best_us(
            lambda: encode({"patch": base64.b64encode(patch).decode("ascii")}), number, rounds
        ),
    }


def digits_figures(number: int, rounds: int) -> dict[str, Any]:
    body = bodies.review_body("large", "team-a")
    table = bytes(0x31 if 0x30 <= c <= 0x39 else 0x30 for c in range(256))
    ones = b"1" * 19
    pattern = re.compile(rb"[0-9]{19}")
    return {
        "body_bytes": len(body),
        "translate_find_us": best_us(lambda: body.translate(table).find(ones), number, rounds),
        "regex_us": best_us(lambda: pattern.search(body), number, rounds),
    }


def lines_figures(number: int, rounds: int) -> dict[str, Any]:
    from amp.logs import lines_together

    @contextlib.contextmanager
    def generator_based() -> Iterator[None]:
        yield

    def amp_turn() -> None:
        with lines_together():
            pass

    def generator_turn() -> None:
        with generator_based():
            pass

    return {"amp_us": best_us(amp_turn, number, rounds), "generator_based_us": best_us(generator_turn, number, rounds)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7, help="rounds per figure, the best kept")
    parser.add_argument("--number", type=int, default=20000, help="calls per round")
    args = parser.parse_args()
    n, r = args.number, args.rounds
    print(
        json.dumps(
            {
                "dataclass": dataclass_figures(n, r),
                "metrics": metrics_figures(n, r),
                "pipe": pipe_figures(n, r),
                "base64": base64_figures(n, r),
                "digits": digits_figures(max(n // 100, 10), r),
                "lines": lines_figures(n, r),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
