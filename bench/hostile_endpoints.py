#!/usr/bin/env python3
"""
Hostile endpoints for C{bench/endpoints.py} (measurement 5): an endpoint
process whose every reply is hostile (endless header lines, one endless
header, an endless chunked body, a body held just under C{max_response},
deep nesting; L{HOSTILE}), and the run that sends C{max_concurrent} calls
at once to each of its origins and reports amp's peak RSS and its reply
budget's peak, per kind.

Run as a script with a number of ports, it is the endpoint process
(L{serve_hostile}); C{python bench/endpoints.py --only-hostile} runs the
measurement.  Everything listens on 127.0.0.1.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any, Callable

HOSTILE = {
    # Short header lines, without end.
    "/headers": (b"HTTP/1.1 200 OK\r\n", lambda i: b"".join(b"X-H%d: v\r\n" % n for n in range(i, i + 4096))),
    # One header line, without end.
    "/header": (b"HTTP/1.1 200 OK\r\nX-Big: ", lambda i: b"b" * 65536),
    # A body without end, chunked (no length to refuse it by).
    "/chunked": (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
        lambda i: b"10000\r\n" + b" " * 65536 + b"\r\n",
    ),
    # A body of max_response (1 MiB) announced, all but 1 KiB of it sent, then
    # nothing: held until the timeout.
    "/held": (b"HTTP/1.1 200 OK\r\nContent-Length: 1048576\r\n\r\n", None),
    # 1 MiB of nesting.
    "/deep": (b"HTTP/1.1 200 OK\r\nContent-Length: 1048576\r\n\r\n" + b"[" * 1048576, None),
}
_HELD_BODY = b" " * (1024 * 1024 - 1024)


def serve_hostile(ports: int) -> None:
    """
    The hostile endpoint: on C{ports} ports (one origin each), answer each
    request as its path says (L{HOSTILE}), streaming while the connection
    lasts and at most 64 MiB; print the ports as a JSON line.
    """
    from twisted.internet import reactor
    from twisted.internet.protocol import Factory, Protocol

    class Hostile(Protocol):
        def connectionMade(self) -> None:
            self.sent = 0
            self.started = False
            self.gone = False

        def dataReceived(self, data: bytes) -> None:
            if self.started:
                return
            self.started = True
            path = data.split(b" ", 2)[1].decode("latin-1")
            head, more = HOSTILE[path]
            self.transport.write(head)
            if path == "/held":
                self.transport.write(_HELD_BODY)
            if more is not None:
                self._more(more)

        def _more(self, more: Callable[[int], bytes]) -> None:
            if self.gone or self.sent > 64 * 1024 * 1024:
                return
            chunk = more(self.sent)
            self.sent += len(chunk)
            self.transport.write(chunk)
            reactor.callLater(0.001, self._more, more)

        def connectionLost(self, reason: Any) -> None:
            self.gone = True

    listening = [
        reactor.listenTCP(0, Factory.forProtocol(Hostile), interface="127.0.0.1", backlog=512) for _ in range(ports)
    ]
    signal.signal(signal.SIGTERM, lambda *a: reactor.callFromThread(reactor.stop))
    print(json.dumps({"ports": [p.getHost().port for p in listening]}), flush=True)
    reactor.run()


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def hostile(origins: int, per_origin: int, body: bytes) -> Any:
    """
    C{per_origin} calls at once on each of C{origins} origins, every reply
    hostile, one kind after the other, with amp's default limits (the
    breaker kept closed so that every call goes out): amp's RSS at its peak
    and what the client held of its reply budget.
    """
    from twisted.internet import reactor
    from twisted.internet.defer import DeferredList, inlineCallbacks
    from twisted.internet.task import LoopingCall

    from amp.breaker import BreakerRegistry
    from amp.config import parse_config
    from amp.deadline import Deadline
    from amp.endpoint import EndpointClient, EndpointRequest, deferred_call
    from amp.metrics import Metrics
    from amp.urls import parse_endpoint_url

    @inlineCallbacks
    def run() -> Any:
        child = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), str(origins)], stdout=subprocess.PIPE, text=True
        )
        atexit.register(lambda: child.poll() is None and child.kill())
        assert child.stdout is not None
        ports = json.loads(child.stdout.readline())["ports"]
        config = parse_config(
            {
                "endpoints": {
                    "allow": ["http://127.0.0.1:*/*"],
                    "max_concurrent": per_origin,
                    "breaker": {"consecutive_failures": 1_000_000_000, "min_requests": 1_000_000_000},
                }
            }
        )
        settings = config.endpoints.defaults
        client = EndpointClient(reactor, Metrics(), BreakerRegistry(reactor))
        print(
            f"5. hostile endpoints: {per_origin} calls at once on each of {origins} origins, per kind; "
            f"endpoints.max_buffered {settings.max_buffered // 2**20} MiB, max_response "
            f"{settings.max_response // 2**20} MiB, timeout {settings.timeout:g}s:"
        )
        print(f"   RSS before: {_rss() / 2**20:.1f} MiB")
        for path in HOSTILE:
            peak = [_rss()]
            sampler = LoopingCall(lambda peak=peak: peak.__setitem__(0, max(peak[0], _rss())))
            sampler.start(0.01)
            client.budget.peak = 0
            started = time.perf_counter()
            calls = [
                deferred_call(
                    client,
                    EndpointRequest(
                        parse_endpoint_url(f"http://127.0.0.1:{port}{path}"),
                        settings,
                        body,
                        {},
                        Deadline.after(reactor.seconds(), 10.0),
                    ),
                )
                for port in ports
                for _ in range(per_origin)
            ]
            results = yield DeferredList(calls, consumeErrors=True)
            elapsed = time.perf_counter() - started
            sampler.stop()
            reasons: dict[str, int] = {}
            for ok, value in results:
                reason = "ok" if ok else str(getattr(value.value, "reason", value.type.__name__))
                reasons[reason] = reasons.get(reason, 0) + 1
            print(
                f"   {path:<9} peak RSS {peak[0] / 2**20:6.1f} MiB  reply budget peak "
                f"{client.budget.peak / 2**20:5.1f} MiB  all ended in {elapsed:5.2f}s  "
                + ", ".join(f"{n} {r}" for r, n in sorted(reasons.items()))
            )
            yield client.close_idle_connections()
        yield client.close()
        child.send_signal(signal.SIGTERM)
        child.wait(10)

    return run()


if __name__ == "__main__":
    serve_hostile(int(sys.argv[1]))
