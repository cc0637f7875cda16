#!/usr/bin/env python3
"""
The webhook listener alone, in memory: CPU time per request of amp's own
HTTP/1.1 (L{amp.http}, llhttp) against twisted.web's C{Site} with a leaf
C{Resource} doing the same, measured in the same run.

Each request is a C{POST} of the benchmark's AdmissionReview (typical and
large, L{bench.bodies}) with the API server's headers, fed in 16 KiB pieces
(TLS records) on one kept-alive connection over a C{StringTransport}; the
handler answers with the body it got.  No sockets, no TLS, no review: the
HTTP layer's own cost, the steadiest figure for comparing request paths.

Run: C{python -m bench.listener [--requests N]}; prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any, Callable

from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.web.resource import Resource
from twisted.web.server import Site

from amp.http import HTTPServerFactory, Request
from amp.metrics import Metrics
from bench import bodies

_HEAD = (
    b"POST /mutate?timeout=10s HTTP/1.1\r\nHost: amp.amp.svc:443\r\nUser-Agent: kube-apiserver-admission\r\n"
    b"Content-Type: application/json\r\nAccept: application/json, */*\r\nAccept-Encoding: gzip\r\n"
    b"Content-Length: %d\r\n\r\n"
)


class _Echo(Resource):
    isLeaf = True

    def render_POST(self, request: Any) -> bytes:
        request.setHeader(b"content-type", b"application/json")
        return request.content.read()  # type: ignore[no-any-return]


def _echo(request: Request) -> None:
    request.respond(200, request.body, b"application/json")


def factories(clock: MemoryReactorClock) -> dict[str, Any]:
    """The two listeners, each answering C{/mutate} with the request's body."""
    site = Site(_Echo(), reactor=clock)
    site.log = lambda request: None  # type: ignore[method-assign]
    return {
        "amp.http": HTTPServerFactory(
            {b"/mutate": _echo},
            reactor=clock,
            metrics=Metrics(),
            max_body=1 << 20,
            max_connections=100,
            request_timeout=10.0,
            idle_timeout=60.0,
        ),
        "twisted.web": site,
    }


def cpu_per_request(factory: Any, body: bytes, requests: int) -> float:
    """Microseconds of CPU per request (best of three rounds)."""
    request = _HEAD % len(body) + body
    pieces = [request[i : i + 16384] for i in range(0, len(request), 16384)]
    transport = StringTransport()
    protocol = factory.buildProtocol(None)
    protocol.makeConnection(transport)
    feed: Callable[[bytes], None] = protocol.dataReceived
    best = float("inf")
    for _ in range(3):
        started = time.process_time()
        for _ in range(requests):
            for piece in pieces:
                feed(piece)
            answer = transport.value()
            if not (answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(body)):
                raise SystemExit(f"not answered with the body: {answer[:200]!r}")
            transport.clear()
        best = min(best, (time.process_time() - started) / requests * 1e6)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=3000, help="requests per round (three rounds)")
    args = parser.parse_args()
    clock = MemoryReactorClock()
    results: dict[str, Any] = {}
    for name in ("typical", "large"):
        body = bodies.review_body(name, "bench")
        us = {listener: cpu_per_request(factory, body, args.requests) for listener, factory in factories(clock).items()}
        results[name] = {
            "body_bytes": len(body),
            **{f"{k} us/request": round(v, 1) for k, v in us.items()},
            "amp.http / twisted.web": round(us["amp.http"] / us["twisted.web"], 3),
        }
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
