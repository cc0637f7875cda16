#!/usr/bin/env python3
"""
The soak's chaos endpoint: an amp endpoint (twisted.web) that answers each
POST in a way picked by a seeded random generator, and counts what it did.

What it can do to a call (the C{kind}s, and the outcome amp must name):

  ==============  ==========================================  ===================
  kind            what the endpoint does                      amp's outcome
  ==============  ==========================================  ===================
  ok              200 with a one-operation JSON Patch         ok
  delay           the same, after a pause shorter than the    ok
                  smallest endpoint timeout of the soak
  error           HTTP 500                                    http-5xx
  garbage         200, Content-Type JSON, a body that is not  invalid-json
                  JSON
  wrong-shape     200 with JSON that is not the protocol      invalid-reply
  reset           status line, headers and part of the body,  connection-reset
                  then C{abortConnection} (an RST)
  hang            never answers; the call ends when amp       timeout (or
                  gives up and closes the connection          cancelled)
  oversized       a 200 body larger than amp's                response-too-large
                  C{max_response}, half of the time with a
                  Content-Length, else chunked
  ==============  ==========================================  ===================

With C{--hostile} it also mixes in the endpoints of an attacker (who can point
their namespace's annotation at a Service of their own), each bounded so that
the chaos endpoint itself stays small:

  ==============  ==========================================  ===================
  header-flood    a status line, then short header lines      a header limit
                  (C{X-H1: v}, ...) as fast as amp reads      (timeout until amp
                  them, never the end of the head (up to      has one)
                  C{--flood-bytes} per call)
  huge-header     a status line and one header line of        a header limit
                  C{--flood-bytes}, never the end of the head  (timeout until amp
                                                              has one)
  deep-json       200 with a JSON array nested 30,000 deep    invalid-json
                  (under amp's C{max_response})
  drip            200 with a Content-Length, then one byte    timeout (or
                  every 20 ms: the body never completes in    cancelled)
                  time
  ==============  ==========================================  ===================

The patch of C{ok} and C{delay} adds the label C{amp.soak/patched} whose
value is the kind, so the client can tell which one it got.

It listens on 127.0.0.1 on one free port per name given with C{--port NAME}
(each is one endpoint origin for amp, e.g. one with a sensitive circuit
breaker and one without), prints C{{"ports": {NAME: PORT, ...}}} on one line
to stdout once listening, and runs until SIGTERM/SIGINT.

C{GET /stats} on any port answers C{{"ports": {NAME: {KIND: COUNT}}, "total":
N, "hung_now": N, "duplicates": N}}: what was injected, by port, counted when
the request arrived.  With C{--log FILE} every POST also writes one line
C{UID NAME KIND} (C{UID} from amp's C{X-Amp-Uid} header) so that each review
can be matched with the answer amp gave for it; the file is flushed on every
C{GET /stats} and when the process stops.

Run::

    python bench/chaos_endpoint.py --port steady --port flaky --seed 1 --log calls.txt
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from typing import IO, Any, Optional

from twisted.web import server
from twisted.web.resource import Resource

from amp.reasons import Reason

#: What a well-meaning but failing endpoint does.
FAULT_KINDS = ("ok", "delay", "error", "garbage", "wrong-shape", "reset", "hang", "oversized")
#: What a hostile endpoint does (C{--hostile}).
HOSTILE_KINDS = ("header-flood", "huge-header", "deep-json", "drip")
KINDS = FAULT_KINDS + HOSTILE_KINDS

#: Default share of each kind, in percent.
DEFAULT_WEIGHTS = {
    "ok": 40,
    "delay": 20,
    "error": 8,
    "garbage": 6,
    "wrong-shape": 4,
    "reset": 7,
    "hang": 6,
    "oversized": 9,
    "header-flood": 0,
    "huge-header": 0,
    "deep-json": 0,
    "drip": 0,
}
#: The hostile kinds' shares with C{--hostile}, added to the others.
HOSTILE_WEIGHTS = {"header-flood": 3, "huge-header": 2, "deep-json": 3, "drip": 2}

#: A reason in amp's vocabulary for a reply whose head is too large (a
#: per-call limit on header bytes or count), whatever it is called.
HEADER_REASONS = tuple(sorted(r.value for r in Reason if "header" in r.value))

#: The outcome amp must report (C{amp_endpoint_requests_total{outcome}})
#: for a call that got each kind; the first is the usual one.
EXPECTED_OUTCOMES = {
    "ok": ("ok",),
    "delay": ("ok",),
    "error": ("http-5xx",),
    "garbage": ("invalid-json",),
    "wrong-shape": ("invalid-reply",),
    "reset": ("connection-reset",),
    # amp's own timer ends the call ("timeout"), or, when the review's
    # deadline is the shorter one and fires first, the review cancels it.
    "hang": ("timeout", "cancelled"),
    "oversized": ("response-too-large",),
    # Until amp limits the bytes and lines of a reply's head, it reads them
    # until its timeout.
    "header-flood": ("timeout", "cancelled") + HEADER_REASONS,
    "huge-header": ("timeout", "cancelled") + HEADER_REASONS,
    "deep-json": ("invalid-json",),
    "drip": ("timeout", "cancelled"),
}

#: Bytes of the deep-json reply: an array nested this deep.
DEEP_JSON_DEPTH = 30_000

PATCH_LABEL = "amp.soak/patched"
_LABEL_PATH = "/metadata/labels/" + PATCH_LABEL.replace("/", "~1")


def patch_for(kind: str) -> bytes:
    """
    The reply of an C{ok} or C{delay} call.
    """
    return json.dumps([{"op": "add", "path": _LABEL_PATH, "value": kind}], separators=(",", ":")).encode("ascii")


def parse_weights(text: str) -> dict[str, int]:
    """
    C{ok=40,delay=20,...} -> weights; kinds not named keep their default.
    """
    weights = dict(DEFAULT_WEIGHTS)
    for item in filter(None, (x.strip() for x in text.split(","))):
        kind, _, value = item.partition("=")
        if kind not in KINDS:
            raise ValueError(f"unknown kind {kind!r} (known: {', '.join(KINDS)})")
        weights[kind] = int(value)
    if sum(weights.values()) <= 0:
        raise ValueError("the weights add up to nothing")
    return weights


class Chaos:
    """
    The shared state of every port: the generator, the counts, the log.
    """

    def __init__(
        self,
        reactor: Any,
        seed: int,
        weights: dict[str, int],
        delay_ms: tuple[float, float],
        oversize: int,
        log: Optional[IO[str]],
        flood_bytes: int = 8 * 1024 * 1024,
    ) -> None:
        self.reactor = reactor
        self.rng = random.Random(seed)
        self.kinds = [k for k in KINDS if weights.get(k, 0) > 0]
        self.weights = [weights[k] for k in self.kinds]
        self.delay_ms = delay_ms
        self.oversize = oversize
        self.flood_bytes = flood_bytes
        self.log = log
        self.counts: dict[str, dict[str, int]] = {}
        self.hung: set[server.Request] = set()
        self.seen: set[str] = set()
        self.duplicates = 0

    def pick(self, port: str, uid: str) -> str:
        kind = self.rng.choices(self.kinds, self.weights)[0]
        by_kind = self.counts.setdefault(port, {k: 0 for k in KINDS})
        by_kind[kind] += 1
        if uid:
            if uid in self.seen:
                self.duplicates += 1
            self.seen.add(uid)
        if self.log is not None:
            self.log.write(f"{uid or '-'} {port} {kind}\n")
        return kind

    def stats(self) -> dict[str, Any]:
        if self.log is not None:
            self.log.flush()
        return {
            "ports": self.counts,
            "total": sum(sum(c.values()) for c in self.counts.values()),
            "hung_now": len(self.hung),
            "duplicates": self.duplicates,
        }


class ChaosResource(Resource):
    """
    One port's resource: POST anywhere is a call, C{GET /stats} the counts.
    """

    isLeaf = True

    def __init__(self, chaos: Chaos, port: str) -> None:
        super().__init__()
        self.chaos = chaos
        self.port = port

    def render_GET(self, request: server.Request) -> bytes:
        if request.path != b"/stats":
            request.setResponseCode(404)
            return b"POST a Pod, or GET /stats\n"
        request.setHeader(b"content-type", b"application/json")
        return json.dumps(self.chaos.stats()).encode("ascii")

    def render_POST(self, request: server.Request) -> Any:
        request.content.read()
        uid = (request.getHeader(b"x-amp-uid") or b"").decode("ascii", "replace")
        kind = self.chaos.pick(self.port, uid)
        request.setHeader(b"content-type", b"application/json")
        return getattr(self, "_" + kind.replace("-", "_"))(request)

    # ------------------------------------------------------------ the kinds

    def _ok(self, request: server.Request) -> bytes:
        return patch_for("ok")

    def _delay(self, request: server.Request) -> Any:
        low, high = self.chaos.delay_ms
        seconds = self.chaos.rng.uniform(low, high) / 1000.0

        def answer() -> None:
            request.write(patch_for("delay"))
            request.finish()

        call = self.chaos.reactor.callLater(seconds, answer)
        request.notifyFinish().addErrback(lambda _: call.cancel() if call.active() else None)
        return server.NOT_DONE_YET

    def _error(self, request: server.Request) -> bytes:
        request.setResponseCode(500)
        return b'{"error": "injected failure"}'

    def _garbage(self, request: server.Request) -> bytes:
        return b"<html><body>502 Bad Gateway</body></html>\n\x00\xff"

    def _wrong_shape(self, request: server.Request) -> bytes:
        return b'{"patch": "add a label, please"}'

    def _reset(self, request: server.Request) -> Any:
        request.setHeader(b"content-length", b"4096")
        request.write(b'[{"op":"add","path":"/metadata/labels/amp.soak~1patched","val')
        transport = request.channel.transport
        # The partial answer goes to the socket now (IWriteDescriptor's
        # doWrite) rather than on the reactor's next write pass, which on a
        # busy machine can come after the abort below and lose it: amp would
        # see a kept-alive connection closed before any byte of the reply
        # and send the call once more on a new connection (by design), and
        # the call would not end in connection-reset.  The abort comes a
        # moment later, so that the partial answer is on the wire first.
        transport.doWrite()
        self.chaos.reactor.callLater(0.002, transport.abortConnection)
        return server.NOT_DONE_YET

    def _hang(self, request: server.Request) -> Any:
        hung = self.chaos.hung
        hung.add(request)
        request.notifyFinish().addBoth(lambda _: hung.discard(request))
        return server.NOT_DONE_YET

    def _oversized(self, request: server.Request) -> Any:
        size = self.chaos.oversize
        body = b"[" + b" " * (size - 2) + b"]"
        if self.chaos.rng.random() < 0.5:
            return body  # twisted.web sends it with a Content-Length
        step = 16 * 1024
        for i in range(0, len(body), step):
            request.write(body[i : i + step])
        request.finish()
        return server.NOT_DONE_YET

    # ------------------------------------------------------------ the hostile kinds

    def _raw(self, request: server.Request, chunks: Any, every: float) -> Any:
        """
        Write C{chunks} straight to the connection (not through twisted.web,
        which would write a head of its own), one every C{every} seconds,
        until they run out or the connection is gone; never finish.
        """
        transport = request.channel.transport
        hung = self.chaos.hung
        hung.add(request)
        state = {"call": None}

        def more() -> None:
            chunk = next(chunks, None)
            if chunk is not None:
                transport.write(chunk)
                state["call"] = self.chaos.reactor.callLater(every, more)

        def gone(_: Any) -> None:
            hung.discard(request)
            if state["call"] is not None and state["call"].active():
                state["call"].cancel()

        request.notifyFinish().addBoth(gone)
        more()
        return server.NOT_DONE_YET

    def _header_flood(self, request: server.Request) -> Any:
        step = 64 * 1024

        def chunks() -> Any:
            yield b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            n, sent = 0, 0
            while sent < self.chaos.flood_bytes:
                lines = []
                size = 0
                while size < step:
                    n += 1
                    line = b"X-H%d: v\r\n" % n
                    lines.append(line)
                    size += len(line)
                sent += size
                yield b"".join(lines)

        return self._raw(request, chunks(), 0.002)

    def _huge_header(self, request: server.Request) -> Any:
        step = 64 * 1024

        def chunks() -> Any:
            yield b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Big: "
            for _ in range(self.chaos.flood_bytes // step):
                yield b"a" * step

        return self._raw(request, chunks(), 0.002)

    def _deep_json(self, request: server.Request) -> bytes:
        return b"[" * DEEP_JSON_DEPTH + b"]" * DEEP_JSON_DEPTH

    def _drip(self, request: server.Request) -> Any:
        request.setHeader(b"content-length", b"4096")
        hung = self.chaos.hung
        hung.add(request)
        state = {"call": None}

        def drip() -> None:
            request.write(b" ")
            state["call"] = self.chaos.reactor.callLater(0.02, drip)

        def gone(_: Any) -> None:
            hung.discard(request)
            if state["call"] is not None and state["call"].active():
                state["call"].cancel()

        request.notifyFinish().addBoth(gone)
        request.write(b"[")
        state["call"] = self.chaos.reactor.callLater(0.02, drip)
        return server.NOT_DONE_YET


class QuietSite(server.Site):
    """
    No access log.
    """

    def log(self, request: Any) -> None:  # type: ignore[override]
        pass


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--port",
        action="append",
        dest="ports",
        default=[],
        metavar="NAME",
        help="listen on a free port for this name (repeat for several origins)",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--weights",
        default="",
        help="kind=percent,... (default %s)" % ",".join(f"{k}={v}" for k, v in DEFAULT_WEIGHTS.items()),
    )
    parser.add_argument("--delay-ms", default="5:80", help="range of the delay kind, LOW:HIGH milliseconds")
    parser.add_argument("--oversize", type=int, default=80 * 1024, help="bytes of an oversized reply")
    parser.add_argument("--log", help="write one line per call (uid, port name, kind) to this file")
    parser.add_argument(
        "--hostile", action="store_true", help="also answer like a hostile endpoint (%s)" % ", ".join(HOSTILE_KINDS)
    )
    parser.add_argument(
        "--flood-bytes",
        type=int,
        default=8 * 1024 * 1024,
        help="bytes of head a header-flood or huge-header call sends at most",
    )
    args = parser.parse_args(argv)
    from twisted.internet import reactor as _reactor

    low, _, high = args.delay_ms.partition(":")
    log = open(args.log, "w", buffering=1 << 16) if args.log else None
    weights = parse_weights(args.weights)
    if args.hostile:
        weights.update({k: v for k, v in HOSTILE_WEIGHTS.items() if not weights.get(k)})
    chaos = Chaos(_reactor, args.seed, weights, (float(low), float(high or low)), args.oversize, log, args.flood_bytes)
    ports = {}
    for name in args.ports or ["chaos"]:
        site = QuietSite(ChaosResource(chaos, name))
        ports[name] = _reactor.listenTCP(0, site, interface="127.0.0.1").getHost().port
    print(json.dumps({"ports": ports}), flush=True)
    _reactor.run()  # SIGTERM and SIGINT stop it
    print(json.dumps(chaos.stats()), flush=True)
    if log is not None:
        log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
