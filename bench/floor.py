#!/usr/bin/env python3
"""
The benchmark's floor: a minimal Twisted TLS proxy that does amp's round trip
and nothing else, so that C{bench/run} can say what the runtime itself costs
per review and how much of amp's CPU is amp's own.

For every request on a TLS keep-alive connection (pyOpenSSL under Twisted's
TLS protocol, like amp) it reads the head up to the blank line and
C{Content-Length} bytes of body, decodes the AdmissionReview, forwards the
Pod to the endpoint over a pooled keep-alive connection (a raw client
protocol, one request at a time per connection), and answers an
AdmissionReview that allows the Pod with the endpoint's reply as its
base64 JSON Patch.

What it is not: it checks nothing (no content type, no size limits, no read
deadline, no validation of the review or of the patch), has no deadline, no
circuit breaker, no failure policy, no namespace lookup, no metrics and no
log line; a failed endpoint call closes the client's connection.  It is the
lower bound of what a Twisted process spends on this round trip, not a
webhook anyone should run.  It decodes JSON with msgspec when it is
installed (the review's C{request.object} kept as raw bytes), else with the
standard library's C{json}; C{{"json": ...}} on its first line says which.

Run: C{python -m bench.floor --cert C --key K --endpoint http://127.0.0.1:PORT/PATH}.
It listens on 127.0.0.1 (a free port), prints C{{"port": N, "json": ...}}
on one line once listening, and runs until SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from typing import Any, Callable, Optional
from urllib.parse import urlsplit

from twisted.internet.defer import Deferred
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.protocol import Factory, Protocol
from twisted.python.failure import Failure
from twisted.web.iweb import IBodyProducer
from zope.interface import implementer

_MAX_HEAD = 64 * 1024
_OK_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
_BAD = b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


def _codec() -> tuple[str, Callable[[bytes], tuple[str, str, bytes]], Callable[[Any], bytes]]:
    """
    The JSON library: a function from a review's bytes to (apiVersion, uid,
    the Pod's bytes), and an encoder.
    """
    try:
        import msgspec
    except ImportError:

        def split(body: bytes) -> tuple[str, str, bytes]:
            review = json.loads(body)
            request = review["request"]
            return (
                review["apiVersion"],
                request["uid"],
                json.dumps(request["object"], separators=(",", ":")).encode("utf-8"),
            )

        return "json", split, lambda doc: json.dumps(doc, separators=(",", ":")).encode("utf-8")

    # defstruct, not class statements: this module's annotations are
    # strings, which msgspec cannot resolve for classes local to a function.
    request = msgspec.defstruct("Request", [("uid", str), ("object", msgspec.Raw)])
    Review = msgspec.defstruct("Review", [("apiVersion", str), ("request", request)])
    decoder = msgspec.json.Decoder(Review)

    def split_raw(body: bytes) -> tuple[str, str, bytes]:
        review = decoder.decode(body)
        return review.apiVersion, review.request.uid, bytes(review.request.object)

    return "msgspec", split_raw, msgspec.json.encode


JSON_LIBRARY, split_review, encode = _codec()


def _head(buffer: bytes) -> Optional[tuple[int, int, bool]]:
    """
    (end of the head, Content-Length, connection close) once the head of a
    message is in C{buffer}, else None.
    """
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        if len(buffer) > _MAX_HEAD:
            raise ValueError("head too long")
        return None
    length, close = 0, False
    for line in buffer[:end].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"connection":
            close = value.strip().lower() == b"close"
    return end + 4, length, close


class EndpointConnection(Protocol):
    """One pooled keep-alive connection to the endpoint; one call at a time."""

    def __init__(self, pool: "EndpointPool") -> None:
        self.pool = pool
        self.buffer = b""
        self.waiting: Optional[Deferred] = None

    def call(self, request: bytes) -> Deferred:
        self.waiting = Deferred()
        self.transport.write(request)
        return self.waiting

    def dataReceived(self, data: bytes) -> None:
        self.buffer += data
        head = _head(self.buffer)
        if head is None:
            return
        start, length, close = head
        if len(self.buffer) < start + length:
            return
        status = self.buffer[9:12]
        body = self.buffer[start : start + length]
        self.buffer = self.buffer[start + length :]
        waiting, self.waiting = self.waiting, None
        if close:
            self.transport.loseConnection()
        else:
            self.pool.idle.append(self)
        if waiting is not None:
            if status == b"200":
                waiting.callback(body)
            else:
                waiting.errback(Failure(RuntimeError(f"endpoint answered {status!r}")))

    def connectionLost(self, reason: Failure = None) -> None:  # type: ignore[assignment]
        if self in self.pool.idle:
            self.pool.idle.remove(self)
        waiting, self.waiting = self.waiting, None
        if waiting is not None:
            waiting.errback(reason)


class EndpointPool:
    """Keep-alive connections to the endpoint, the most recently used first."""

    def __init__(self, reactor: Any, url: str) -> None:
        parts = urlsplit(url)
        self.endpoint = TCP4ClientEndpoint(reactor, parts.hostname or "127.0.0.1", parts.port or 80)
        self.prefix = b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: " % (
            (parts.path or "/").encode("ascii"),
            parts.netloc.encode("ascii"),
        )
        self.idle: list[EndpointConnection] = []

    def post(self, body: bytes) -> Deferred:
        request = b"%s%d\r\n\r\n%s" % (self.prefix, len(body), body)
        if self.idle:
            return self.idle.pop().call(request)
        return connectProtocol(self.endpoint, EndpointConnection(self)).addCallback(
            lambda connection: connection.call(request)
        )


class FloorProxy(Protocol):
    """One client connection: reviews in, the endpoint's patch out, in order."""

    def __init__(self, pool: EndpointPool) -> None:
        self.pool = pool
        self.buffer = b""
        self.busy = False

    def dataReceived(self, data: bytes) -> None:
        self.buffer += data
        self._next()

    def _next(self) -> None:
        if self.busy:
            return
        try:
            head = _head(self.buffer)
        except ValueError:
            self._fail(None)
            return
        if head is None:
            return
        start, length, _ = head
        if len(self.buffer) < start + length:
            return
        body = self.buffer[start : start + length]
        self.buffer = self.buffer[start + length :]
        self.busy = True
        try:
            version, uid, pod = split_review(body)
        except Exception:
            self._fail(None)
            return
        self.pool.post(pod).addCallbacks(self._answer, self._fail, callbackArgs=(version, uid))

    def _answer(self, patch: bytes, version: str, uid: str) -> None:
        answer = encode(
            {
                "apiVersion": version,
                "kind": "AdmissionReview",
                "response": {
                    "uid": uid,
                    "allowed": True,
                    "patchType": "JSONPatch",
                    "patch": base64.b64encode(patch).decode("ascii"),
                },
            }
        )
        self.transport.write(_OK_HEAD % len(answer) + answer)
        self.busy = False
        self._next()

    def _fail(self, _: Optional[Failure]) -> None:
        self.transport.write(_BAD)
        self.transport.loseConnection()


class FloorFactory(Factory):
    noisy = False

    def __init__(self, pool: EndpointPool) -> None:
        self.pool = pool

    def buildProtocol(self, addr: Any) -> FloorProxy:
        return FloorProxy(self.pool)


@implementer(IBodyProducer)
class BytesProducer:
    """
    A request body in memory, written at once (Twisted's C{FileBodyProducer}
    paces through the global cooperator); an C{IBodyProducer}.
    """

    def __init__(self, body: bytes) -> None:
        self._body = body
        self.length = len(body)

    def startProducing(self, consumer: Any) -> Deferred:
        consumer.write(self._body)
        d: Deferred = Deferred()
        d.callback(None)
        return d

    def pauseProducing(self) -> None:
        pass

    def resumeProducing(self) -> None:
        pass

    def stopProducing(self) -> None:
        pass


class StackProxy:
    """
    The stack floor (C{--stack}): the same round trip through the parts amp
    keeps, twisted.web's C{Site} for the listener and Twisted's C{Agent} over
    an C{HTTPConnectionPool} for the endpoint call, and nothing else: what
    amp's own code costs is what amp spends beyond this.
    """

    def __init__(self, reactor: Any, endpoint: str) -> None:
        from twisted.web.client import Agent, HTTPConnectionPool

        pool = HTTPConnectionPool(reactor, persistent=True)
        pool.maxPersistentPerHost = 64
        pool.retryAutomatically = False
        self.agent = Agent(reactor, pool=pool)
        self.endpoint = endpoint.encode("ascii")

    def resource(self) -> Any:
        from twisted.web import server
        from twisted.web.client import readBody
        from twisted.web.http_headers import Headers
        from twisted.web.resource import Resource

        proxy = self

        class Review(Resource):
            isLeaf = True

            def render_POST(self, request: Any) -> Any:
                api_version, uid, pod = split_review(request.content.read())
                d = proxy.agent.request(
                    b"POST", proxy.endpoint, Headers({b"content-type": [b"application/json"]}), BytesProducer(pod)
                )
                d.addCallback(readBody)
                d.addCallback(self._answer, request, api_version, uid)
                d.addErrback(lambda _: request.channel.loseConnection())
                return server.NOT_DONE_YET

            def _answer(self, patch: bytes, request: Any, api_version: str, uid: str) -> None:
                body = encode(
                    {
                        "apiVersion": api_version,
                        "kind": "AdmissionReview",
                        "response": {
                            "uid": uid,
                            "allowed": True,
                            "patchType": "JSONPatch",
                            "patch": base64.b64encode(patch).decode("ascii"),
                        },
                    }
                )
                request.setHeader(b"content-type", b"application/json")
                request.setHeader(b"content-length", b"%d" % len(body))
                request.write(body)
                request.finish()

        root = Resource()
        root.putChild(b"mutate", Review())
        return root


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cert", required=True, help="serving certificate (PEM)")
    parser.add_argument("--key", required=True, help="its private key (PEM)")
    parser.add_argument("--endpoint", required=True, help="the endpoint's URL, plain HTTP")
    parser.add_argument(
        "--stack",
        action="store_true",
        help="the stack floor: twisted.web's Site and Twisted's Agent and pool (StackProxy) instead of raw protocols",
    )
    args = parser.parse_args(argv)
    from twisted.internet import reactor
    from twisted.internet.ssl import PrivateCertificate

    with open(args.cert, "rb") as f:
        cert = f.read()
    with open(args.key, "rb") as f:
        key = f.read()
    options = PrivateCertificate.loadPEM(cert + b"\n" + key).options()
    if args.stack:
        from twisted.web.server import Site

        site = Site(StackProxy(reactor, args.endpoint).resource())
        site.log = lambda request: None  # no access log, as amp
        factory: Any = site
    else:
        factory = FloorFactory(EndpointPool(reactor, args.endpoint))
    port = reactor.listenSSL(0, factory, options, backlog=1024, interface="127.0.0.1")
    print(json.dumps({"port": port.getHost().port, "json": JSON_LIBRARY}), flush=True)
    reactor.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
