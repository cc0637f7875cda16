#!/usr/bin/env python3
"""
The benchmark's trace collector: an OTLP/HTTP (protobuf) receiver that
takes every C{POST /v1/traces}, counts the requests and bytes, and answers
an empty C{ExportTraceServiceResponse} (zero bytes of protobuf), decoding
nothing, so that what modes (t) and (u) measure is amp's tracing, not the
collector.

Run: C{python -m bench.otlp_sink}.  It listens on 127.0.0.1 (a free port),
prints C{{"port": N}} on one line once listening, runs until SIGTERM or
SIGINT, and then prints C{{"exports": N, "bytes": B}}.
"""

from __future__ import annotations

import json
from typing import Any

from twisted.web.resource import Resource
from twisted.web.server import Site


class Sink(Resource):
    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.exports = 0
        self.bytes = 0

    def render_POST(self, request: Any) -> bytes:
        self.exports += 1
        self.bytes += len(request.content.read())
        request.setHeader(b"content-type", b"application/x-protobuf")
        return b""


def main() -> None:
    from twisted.internet import reactor

    sink = Sink()
    site = Site(sink)
    site.log = lambda request: None  # type: ignore[method-assign]
    port = reactor.listenTCP(0, site, interface="127.0.0.1")  # type: ignore[attr-defined]
    print(json.dumps({"port": port.getHost().port}), flush=True)
    reactor.addSystemEventTrigger(  # type: ignore[attr-defined]
        "after", "shutdown", lambda: print(json.dumps({"exports": sink.exports, "bytes": sink.bytes}), flush=True)
    )
    reactor.run()  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
