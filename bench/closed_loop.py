#!/usr/bin/env python3
"""
A closed-loop review client for L{bench.process_instructions}: a fixed
number of TLS keep-alive connections to 127.0.0.1, opened once and kept, on
which each line read from stdin (a number N) sends N reviews per connection,
one after the other, and prints one line of JSON: C{[answered, without a
patch]}.  An empty line ends it.

Unlike wrk, which runs for a time and opens its connections anew on every
run, the work it asks for is a count and the TLS handshakes are done before
any measured round: what a process spends on them is not in the figure.

With C{fresh} as a fifth argument, every review goes on a connection of
its own instead, as a burst through kube-apiserver's webhook client makes
them (it keeps 25 idle connections per host and resumes no TLS session):
open, handshake, one review, close by the client.  The counters then hold
a handshake, an accept and a teardown per review.

Run: C{python -m bench.closed_loop PORT BODY_FILE CONNECTIONS CA_FILE [fresh]}.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import sys


async def _reviews(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes, count: int, tally: list[int]
) -> None:
    for _ in range(count):
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        body = await reader.readexactly(length)
        tally[0] += 1
        if b'"patch"' not in body:
            tally[1] += 1


async def _fresh(port: int, context: ssl.SSLContext, request: bytes, count: int, tally: list[int]) -> None:
    """C{count} reviews one after the other, each on a new TLS connection closed after its answer."""
    for _ in range(count):
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
        await _reviews(reader, writer, request, 1, tally)
        writer.close()
        await writer.wait_closed()


async def _main(port: int, body_file: str, connections: int, ca: str, fresh: bool = False) -> None:
    context = ssl.create_default_context(cafile=ca)
    context.check_hostname = False
    with open(body_file, "rb") as f:
        body = f.read()
    request = (
        b"POST /mutate?timeout=10s HTTP/1.1\r\nHost: amp\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body)
    ) + body
    streams = (
        [] if fresh else [await asyncio.open_connection("127.0.0.1", port, ssl=context) for _ in range(connections)]
    )
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line.strip():
            break
        tally = [0, 0]
        if fresh:
            await asyncio.gather(*(_fresh(port, context, request, int(line), tally) for _ in range(connections)))
        else:
            await asyncio.gather(*(_reviews(r, w, request, int(line), tally) for r, w in streams))
        print(json.dumps(tally), flush=True)
    for _, writer in streams:
        writer.close()


def main() -> None:
    port, body_file, connections, ca = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
    fresh = sys.argv[5:] == ["fresh"]
    asyncio.run(_main(port, body_file, connections, ca, fresh))


if __name__ == "__main__":
    main()
