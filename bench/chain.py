#!/usr/bin/env python3
"""
The added latency of an endpoint chain: the same reviews through amp's
review path (L{amp.admission.Admitter}, the real endpoint client, pooled
keep-alive connections over loopback) with one endpoint, and with a chain
of two, in one run, against the benchmark's endpoint (C{bench/endpoint.py},
its own process, answering a one-operation patch).

Reviews alternate between the two namespaces, one at a time, so both see
the same machine.  Reported: p50/p90/p99 of each, the chain's added p50 in
milliseconds and the ratio of the p50s (two / one).  Nothing here asserts a
timing.

Run: C{python -m bench.chain [--reviews N] [--json]}.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from typing import Any

from twisted.internet import defer

from amp.admission import Admitter
from amp.admission_review import parse_review
from amp.breaker import BreakerRegistry
from amp.config import parse_config
from amp.deadline import Deadline
from amp.endpoint import EndpointClient
from amp.metrics import Metrics
from amp.namespaces import StaticNamespaceSource

POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "web", "labels": {"app": "web"}},
    "spec": {"containers": [{"name": "app", "image": "registry.invalid/app:1"}]},
}


def review_body(namespace: str, n: int) -> bytes:
    return json.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": f"bench-{n}",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "namespace": namespace,
                "operation": "CREATE",
                "object": POD,
                "dryRun": False,
            },
        }
    ).encode()


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def start_endpoint() -> tuple[subprocess.Popen, int]:
    process = subprocess.Popen([sys.executable, "-m", "bench.endpoint", "--port", "0"], stdout=subprocess.PIPE)
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line:
        process.kill()
        raise SystemExit("bench/endpoint.py did not start")
    return process, int(json.loads(line)["port"])


@defer.inlineCallbacks
def measure(reactor: Any, port: int, reviews: int, warmup: int) -> Any:
    base = f"http://127.0.0.1:{port}"
    enabled = {"amp.txn2.com/enabled": "true"}
    config = parse_config(
        {
            "kubernetes": {
                "source": "static",
                "namespaces": {
                    "one": {"labels": enabled, "annotations": {"amp.txn2.com/ep": f"{base}/a"}},
                    "two": {"labels": enabled, "annotations": {"amp.txn2.com/ep": f"{base}/a\n{base}/b"}},
                },
            },
            "endpoints": {"allow": ["http://127.0.0.1:*/*"], "timeout": "2s"},
            "failure_policy": "Fail",
        }
    )
    metrics = Metrics()
    client = EndpointClient(reactor, metrics, BreakerRegistry(reactor))
    admitter = Admitter(config, StaticNamespaceSource(config.kubernetes), client, reactor, metrics)
    bodies = {ns: review_body(ns, 0) for ns in ("one", "two")}
    times: dict[str, list[float]] = {"one": [], "two": []}
    try:
        for n in range(warmup + reviews):
            for ns in ("one", "two"):
                started = time.perf_counter()
                answer = yield admitter.review(parse_review(bodies[ns]), Deadline.after(reactor.seconds(), 9.5))
                elapsed = time.perf_counter() - started
                if answer.outcome.result != "patched":
                    raise SystemExit(f"review in {ns} was {answer.outcome.result} ({answer.outcome.reason})")
                if n >= warmup:
                    times[ns].append(elapsed)
    finally:
        yield client.close()
    return times


def report(times: dict[str, list[float]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for ns, label in (("one", "one_endpoint"), ("two", "two_endpoint_chain")):
        values = times[ns]
        out[label] = {f"p{p}_ms": round(percentile(values, p) * 1000, 3) for p in (50, 90, 99)}
        out[label]["reviews"] = len(values)
    one, two = out["one_endpoint"]["p50_ms"], out["two_endpoint_chain"]["p50_ms"]
    out["added_p50_ms"] = round(two - one, 3)
    out["ratio_p50"] = round(two / one, 3) if one else None
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reviews", type=int, default=2000, help="measured reviews per case")
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    args = parser.parse_args(argv)
    endpoint, port = start_endpoint()
    result: dict[str, Any] = {}
    try:

        def run(reactor: Any) -> Any:
            d = measure(reactor, port, args.reviews, args.warmup)
            d.addCallback(lambda times: result.update(report(times)))
            return d

        _react(run)
    finally:
        endpoint.terminate()
        endpoint.wait(10)
    if args.json:
        print(json.dumps(result))
    else:
        for label in ("one_endpoint", "two_endpoint_chain"):
            r = result[label]
            print(
                f"{label:20} p50 {r['p50_ms']:.3f} ms  p90 {r['p90_ms']:.3f} ms  p99 {r['p99_ms']:.3f} ms"
                f"  ({r['reviews']} reviews)"
            )
        print(
            f"a second endpoint adds {result['added_p50_ms']:.3f} ms at p50: "
            f"ratio {result['ratio_p50']:.2f}x one endpoint"
        )
    return 0


def _react(run: Any) -> None:
    """Run C{run(reactor)} on the global reactor until it fires (without
    C{task.react}'s exit: the endpoint process is stopped afterwards)."""
    from twisted.internet import reactor

    failures: list[Any] = []

    def go() -> None:
        d = defer.maybeDeferred(run, reactor)
        d.addErrback(failures.append)
        d.addBoth(lambda _: reactor.stop())

    reactor.callWhenRunning(go)
    reactor.run()
    if failures:
        failures[0].raiseException()


if __name__ == "__main__":
    sys.exit(main())
