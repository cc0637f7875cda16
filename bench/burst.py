#!/usr/bin/env python3
"""
A burst of reviews at once against one amp process and a healthy endpoint,
in one process over loopback: how many Pods come back without their
mutation, and what the burst costs.

amp (the real service, L{amp.service.AmpService}, its webhook over plain
HTTP on a loopback port so that the client's TLS does not share amp's
core; one process, the default C{endpoints.max_concurrent} of 64) reviews
C{--reviews} Pods sent at once on as many connections, as a controller's
storm sends them through the API server; the endpoint, on another loopback
port in the same process, answers each call with a patch after
C{--delay} seconds (a healthy endpoint: it never fails, it is only busy).
Each answer is checked as the API server would store the Pod: mutated and
stamped, or stamped C{skipped <reason>}.  With C{--max-queued 0} amp
behaves as before the bulkhead's queue: a call over C{max_concurrent}
fails at once.

Everything shares one reactor and one core (the client's TLS included), so
the times are an upper bound of amp's own; the counts are the point.

Run: C{python -m bench.burst [--reviews 500] [--delay 0.005]
[--max-queued N] [--timeout 10]}; prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import treq
from twisted.internet import task
from twisted.internet.defer import inlineCallbacks
from twisted.internet.endpoints import TCP4ServerEndpoint
from twisted.web.client import Agent, HTTPConnectionPool
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Site

from amp.metrics import Metrics
from amp.service import AmpService, namespace_source, serving_certificate
from tests.support.helpers import (
    RecordingEndpoint,
    apply_patch,
    decode_answer,
    make_config,
    namespace,
    pod,
    review_bytes,
    wait_all,
)

PATCH = json.dumps([{"op": "add", "path": "/metadata/labels/mutated", "value": "yes"}]).encode()
STATUS = "amp.txn2.com/status"


class BusyEndpoint(Resource):
    """Answers L{PATCH} after C{delay} seconds; counts the most calls it had at once."""

    isLeaf = True

    def __init__(self, reactor: Any, delay: float) -> None:
        super().__init__()
        self.reactor = reactor
        self.delay = delay
        self.open = self.most = self.calls = 0

    def render_POST(self, request: Any) -> Any:
        self.calls += 1
        self.open += 1
        self.most = max(self.most, self.open)
        self.reactor.callLater(self.delay, self._answer, request)
        return NOT_DONE_YET

    def _answer(self, request: Any) -> None:
        self.open -= 1
        if request.channel is not None:
            request.setHeader(b"content-type", b"application/json")
            request.write(PATCH)
            request.finish()


def _percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(p / 100 * len(ordered) + 0.5)) - 1))]


@inlineCallbacks
def burst(reactor: Any, options: argparse.Namespace) -> Any:
    endpoint = BusyEndpoint(reactor, options.delay)
    # A real endpoint server listens with a long backlog (Go: somaxconn); 50,
    # Twisted's default, drops the SYNs of a burst of new connections.
    port = yield TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1", backlog=1024).listen(Site(endpoint))
    origin = f"http://127.0.0.1:{port.getHost().port}"
    config = make_config(
        {"storm": namespace(f"{origin}/mutate")},
        endpoints={"timeout": "5s", "max_queued": options.max_queued},
        listen={"max_connections": max(1024, options.reviews + 16)},
    )
    # amp's webhook over plain HTTP on loopback: the client's TLS would
    # otherwise share amp's one core (the API server's does not).
    metrics = Metrics()
    webhook = RecordingEndpoint(TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1", backlog=1024), reactor)
    service = AmpService(
        config,
        reactor,
        certificate=serving_certificate(config.tls, reactor, metrics),
        webhook_endpoint=webhook,
        metrics_endpoint=None,
        namespaces=namespace_source(config, reactor, metrics),
        metrics=metrics,
        install_sighup=False,
    )
    service.startService()
    listening = yield webhook.listening
    url = f"http://127.0.0.1:{listening.getHost().port}/mutate?timeout={options.timeout:g}s".encode()
    pool = HTTPConnectionPool(reactor, persistent=True)
    pool.maxPersistentPerHost = options.reviews
    pool.retryAutomatically = False
    client = treq.client.HTTPClient(Agent(reactor, pool=pool))
    peak = [0]
    watch = task.LoopingCall(lambda: peak.__setitem__(0, max(peak[0], service.endpoint_client.queued(origin))))
    watch.start(0.001)
    outcomes: dict[str, int] = {}
    seconds: list[float] = []

    @inlineCallbacks
    def one(n: int) -> Any:
        the_pod = pod(name=f"web-{n}")
        started = reactor.seconds()
        response = yield client.post(
            url,
            data=review_bytes(the_pod, namespace="storm", uid=f"uid-{n}"),
            headers={b"content-type": [b"application/json"]},
        )
        content = yield treq.content(response)
        seconds.append(reactor.seconds() - started)
        answer = decode_answer(content)["response"]
        admitted = apply_patch(the_pod, answer["_patch"])
        mutated = admitted["metadata"].get("labels", {}).get("mutated") == "yes"
        stamp = admitted["metadata"].get("annotations", {}).get(STATUS, "(no stamp)")
        key = "mutated" if mutated and stamp.startswith("mutated") else stamp.split(" http")[0]
        outcomes[key] = outcomes.get(key, 0) + 1

    cpu = time.process_time()
    wall = reactor.seconds()
    try:
        yield wait_all(one(n) for n in range(options.reviews))
    finally:
        wall = reactor.seconds() - wall
        cpu = time.process_time() - cpu
        watch.stop()
        yield pool.closeCachedConnections()
        yield service.stopService()
        yield port.stopListening()
    return {
        "reviews": options.reviews,
        "endpoint_delay_s": options.delay,
        "max_concurrent": config.endpoints.defaults.max_concurrent,
        "max_queued": options.max_queued,
        "outcomes": outcomes,
        "unmutated": options.reviews - outcomes.get("mutated", 0),
        "endpoint_most_at_once": endpoint.most,
        "peak_queued": peak[0],
        "wall_s": round(wall, 3),
        "cpu_s_whole_process": round(cpu, 3),
        "review_ms_p50": round(_percentile(seconds, 50) * 1000, 1),
        "review_ms_p99": round(_percentile(seconds, 99) * 1000, 1),
        "review_ms_max": round(max(seconds) * 1000, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reviews", type=int, default=500)
    parser.add_argument("--delay", type=float, default=0.005, help="the endpoint's time per call (seconds)")
    parser.add_argument("--max-queued", type=int, default=1024, help="endpoints.max_queued (0: no queue)")
    parser.add_argument("--timeout", type=float, default=10.0, help="the API server's ?timeout= (seconds)")
    options = parser.parse_args(argv)

    def run(reactor: Any) -> Any:
        return burst(reactor, options).addCallback(lambda result: print(json.dumps(result, indent=2)))

    task.react(run)
    return 0


if __name__ == "__main__":
    sys.exit(main())
