#!/usr/bin/env python3
"""
A review's whole path through amp, in memory: CPU time per review of the
webhook listener (L{amp.http}), the review (L{amp.web}, L{amp.admission})
and the endpoint client (L{amp.endpoint}) on a memory reactor, with no
sockets, no TLS and no other process.

Each review is the benchmark's AdmissionReview (typical and large,
L{bench.bodies}) with the API server's headers, fed in 16 KiB pieces (TLS
records) on one kept-alive connection; the endpoint's one pooled
connection is answered at once with the benchmark endpoint's patch, and the
answer is checked.  The review's accounting (log line, metrics), which amp
does two reactor turns after answering, is run after every review and
counted.  The steadiest figure for comparing versions of amp's own code;
what TLS and the kernel add is in C{bench/run}.

With C{--in-flight N}, N reviews are received together on N connections
before their N endpoint connections answer, as under the benchmark's
sixteen connections: what many decoded Pods alive at once cost (cache
misses, the allocator's fresh pages) shows there and not one at a time.

With C{--managed-fields}, each Pod carries the C{metadata.managedFields}
a real API server adds before admission (L{bench.bodies.managed_fields}),
which the benchmark's bodies otherwise leave out.

Run: C{python -m bench.review_path [--reviews N] [--in-flight N]
[--managed-fields] [--profile typical|large]}; prints one JSON object, or
with C{--profile} the functions that cost most (cProfile, own time).
"""

from __future__ import annotations

import argparse
import base64
import cProfile
import json
import pstats
import time
from typing import Any, Callable

from twisted.internet.address import IPv4Address
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.logger import globalLogBeginner

from amp.admission import Admitter
from amp.breaker import BreakerRegistry
from amp.config import parse_config
from amp.endpoint import EndpointClient
from amp.http import HTTPServerFactory
from amp.metrics import Metrics
from amp.namespaces import StaticNamespaceSource
from amp.web import webhook_routes
from bench import bodies
from bench.endpoint import PATCH

_HEAD = (
    b"POST /mutate?timeout=10s HTTP/1.1\r\nHost: amp.amp.svc:443\r\nUser-Agent: kube-apiserver-admission\r\n"
    b"Content-Type: application/json\r\nAccept: application/json, */*\r\nAccept-Encoding: gzip\r\n"
    b"Content-Length: %d\r\n\r\n"
)
_REPLY = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(PATCH), PATCH)


class ReviewPath:
    """
    amp's listener, admitter and endpoint client on one memory reactor,
    with the client's pooled connection answered by hand.
    """

    def __init__(self) -> None:
        self.clock = MemoryReactorClock()
        config = parse_config(
            {
                "kubernetes": {
                    "source": "static",
                    "namespaces": {
                        "bench": {
                            "labels": {"amp.txn2.com/enabled": "true"},
                            "annotations": {"amp.txn2.com/ep": "http://127.0.0.1:8090/mutate"},
                        }
                    },
                },
                "endpoints": {"allow": ["http://127.0.0.1:*/*"], "timeout": "2s"},
            }
        )
        metrics = Metrics()
        self.client = EndpointClient(self.clock, metrics, BreakerRegistry(self.clock))
        admitter = Admitter(config, StaticNamespaceSource(config.kubernetes), self.client, self.clock, metrics)
        routes = webhook_routes(admitter, self.clock, metrics, {})
        factory = HTTPServerFactory(
            routes,
            reactor=self.clock,
            metrics=metrics,
            max_body=config.listen.max_body,
            max_connections=100,
            request_timeout=10.0,
            idle_timeout=60.0,
        )
        self.factory = factory
        #: Connections and endpoint connections for L{reviews}.
        self.more: list[tuple[Any, StringTransport]] = []
        self.endpoints: list[tuple[Any, StringTransport]] = []
        self.server = StringTransport()
        self.protocol = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 40000))
        self.protocol.makeConnection(self.server)

    def reviews(self, pieces: list[bytes], count: int) -> list[bytes]:
        """
        C{count} reviews in flight together, each on its own connection and
        its own pooled endpoint connection, as under the benchmark's
        sixteen connections: all received, then all answered.
        """
        while len(self.more) < count:
            transport = StringTransport()
            protocol = self.factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 40001 + len(self.more)))
            protocol.makeConnection(transport)
            self.more.append((protocol, transport))
        for protocol, _ in self.more[:count]:
            for piece in pieces:
                protocol.dataReceived(piece)
        self._answer_endpoints()
        answers = []
        for _, transport in self.more[:count]:
            answers.append(transport.value())
            transport.clear()
        return answers

    def _answer_endpoints(self) -> None:
        """
        Connect the endpoint connections the client opened since, answer
        every request they were sent, and run the reactor's next two turns
        (the reviews' accounting).
        """
        while len(self.endpoints) < len(self.clock.tcpClients):
            host, port, factory = self.clock.tcpClients[len(self.endpoints)][:3]
            endpoint = factory.buildProtocol(IPv4Address("TCP", host, port))
            transport = StringTransport()
            endpoint.makeConnection(transport)
            self.endpoints.append((endpoint, transport))
        for endpoint, transport in self.endpoints:
            if transport.value():
                transport.clear()
                endpoint.dataReceived(_REPLY)
        self.clock.advance(0)
        self.clock.advance(0)

    def review(self, pieces: list[bytes]) -> bytes:
        feed: Callable[[bytes], None] = self.protocol.dataReceived
        for piece in pieces:
            feed(piece)
        self._answer_endpoints()
        answer = self.server.value()
        self.server.clear()
        return answer


def request_pieces(body: bytes) -> list[bytes]:
    """A review of C{body} as the listener receives it: the request in reads of at most 16 KiB."""
    request = _HEAD % len(body) + body
    return [request[i : i + 16384] for i in range(0, len(request), 16384)]


def check_answer(answer: bytes) -> None:
    """Stop unless C{answer} is a 200 whose patch holds the endpoint's, without warnings."""
    head, _, body = answer.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200 "):
        raise SystemExit(f"not answered 200: {answer[:300]!r}")
    response = json.loads(body)["response"]
    ops = json.loads(base64.b64decode(response.get("patch", "")) or b"[]")
    if json.loads(PATCH)[0] not in ops or response.get("warnings"):
        raise SystemExit(f"not answered with the endpoint's patch: {body[:300]!r}")


def cpu_per_review(path: ReviewPath, body: bytes, reviews: int, in_flight: int = 1, rounds: int = 5) -> float:
    """Microseconds of CPU per review (median of C{rounds} rounds)."""
    pieces = request_pieces(body)

    def checked() -> None:
        for answer in [path.review(pieces)] if in_flight == 1 else path.reviews(pieces, in_flight):
            check_answer(answer)

    checked()
    figures = []
    batches = max(1, reviews // in_flight)
    for _ in range(rounds):
        started = time.process_time()
        for _ in range(batches):
            if in_flight == 1:
                path.review(pieces)
            else:
                path.reviews(pieces, in_flight)
        figures.append((time.process_time() - started) / (batches * in_flight) * 1e6)
    checked()
    figures.sort()
    return figures[len(figures) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reviews", type=int, default=2000, help="reviews per round (median of five rounds)")
    parser.add_argument("--profile", choices=("typical", "large"), help="profile this body instead")
    parser.add_argument("--top", type=int, default=30, help="functions shown by --profile")
    parser.add_argument(
        "--in-flight", type=int, default=1, help="reviews in flight together, each on its own connections (default 1)"
    )
    parser.add_argument(
        "--managed-fields",
        action="store_true",
        help="the Pods carry the managedFields a real API server adds (bench.bodies.managed_fields)",
    )
    args = parser.parse_args()
    # The review log lines go nowhere (not into the start-up buffer, which
    # would keep them).
    globalLogBeginner.beginLoggingTo([], discardBuffer=True, redirectStandardIO=False)
    path = ReviewPath()
    if args.profile:
        pieces = request_pieces(bodies.review_body(args.profile, "bench", args.managed_fields))
        check_answer(path.review(pieces))
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(args.reviews):
            path.review(pieces)
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(args.top)
        return
    results: dict[str, Any] = {}
    for name in ("typical", "large"):
        body = bodies.review_body(name, "bench", args.managed_fields)
        us = cpu_per_review(path, body, args.reviews, max(1, args.in_flight))
        results[name] = {"body_bytes": len(body), "in_flight": max(1, args.in_flight), "us/review": round(us, 1)}
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
