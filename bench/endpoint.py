#!/usr/bin/env python3
"""
The benchmark's endpoint: answers every POST with one fixed, small JSON Patch
(it adds the label L{bodies.PATCH_LABEL}), as fast as one Python process can.

It is a bare Twisted protocol, not twisted.web: it reads a request's head up
to the blank line, skips C{Content-Length} bytes of body and writes a canned
HTTP/1.1 answer with keep-alive, so that what the benchmark measures is amp,
not the endpoint.  Chunked request bodies are refused (411); neither amp nor
wrk sends them.

Run: C{python bench/endpoint.py [--port N]}.  It listens on 127.0.0.1 (port
0: a free one), prints C{{"port": N}} on one line to stdout once listening,
and runs until SIGTERM/SIGINT.  C{--stats} makes it print the number of
requests answered on stdout when it stops.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from twisted.internet.protocol import Factory, Protocol

from bench.bodies import PATCH_LABEL

PATCH = json.dumps(
    [{"op": "add", "path": "/metadata/labels/" + PATCH_LABEL.replace("/", "~1"), "value": "true"}],
    separators=(",", ":"),
).encode("ascii")

_OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(PATCH), PATCH)
_OK_CLOSE = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
    b"Connection: close\r\n\r\n%s" % (len(PATCH), PATCH)
)
_LENGTH_REQUIRED = b"HTTP/1.1 411 Length Required\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
_BAD = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
_MAX_HEAD = 64 * 1024


class FixedPatch(Protocol):
    """
    One keep-alive connection: requests in, the fixed patch out.
    """

    def __init__(self, counter: list[int]) -> None:
        self._buffer = b""
        self._skip = 0
        self._counter = counter

    def dataReceived(self, data: bytes) -> None:
        if self._skip:
            if len(data) <= self._skip:
                self._skip -= len(data)
                if self._skip == 0:
                    self._answer()
                return
            data = data[self._skip :]
            self._skip = 0
            self._answer()
            if self._close:
                return
        buffer = self._buffer + data if self._buffer else data
        while buffer:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(buffer) > _MAX_HEAD:
                    self._refuse(_BAD)
                    return
                break
            head = buffer[:end].lower()
            length = 0
            close = False
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name == b"content-length":
                    try:
                        length = int(value)
                    except ValueError:
                        self._refuse(_BAD)
                        return
                elif name == b"transfer-encoding":
                    self._refuse(_LENGTH_REQUIRED)
                    return
                elif name == b"connection" and value.strip() == b"close":
                    close = True
            self._close = close
            rest = end + 4 + length
            if rest > len(buffer):
                self._skip = rest - len(buffer)
                buffer = b""
                break
            buffer = buffer[rest:]
            self._answer()
            if close:
                return
        self._buffer = buffer

    _close = False

    def _answer(self) -> None:
        self._counter[0] += 1
        if self._close:
            self.transport.write(_OK_CLOSE)
            self.transport.loseConnection()
        else:
            self.transport.write(_OK)

    def _refuse(self, answer: bytes) -> None:
        self._buffer = b""
        self.transport.write(answer)
        self.transport.loseConnection()


class FixedPatchFactory(Factory):
    noisy = False

    def __init__(self) -> None:
        self.counter = [0]

    def buildProtocol(self, addr: Any) -> FixedPatch:
        p = FixedPatch(self.counter)
        p.factory = self
        return p


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--stats", action="store_true", help="print the request count when stopping")
    args = parser.parse_args(argv)
    from twisted.internet import reactor

    factory = FixedPatchFactory()
    port = reactor.listenTCP(args.port, factory, backlog=1024, interface="127.0.0.1")
    print(json.dumps({"port": port.getHost().port}), flush=True)
    if args.stats:
        reactor.addSystemEventTrigger(
            "after", "shutdown", lambda: print(json.dumps({"requests": factory.counter[0]}), flush=True)
        )
    reactor.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
