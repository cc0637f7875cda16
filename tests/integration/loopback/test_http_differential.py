"""
amp's HTTP/1.1 client against Twisted's C{Agent}, the client it replaces,
on the same corpus of endpoint replies served on loopback: normal, chunked,
truncated, oversized, slow and malformed.  Each must reach the same verdict
in both: the reply (status and body), a status amp does not read, a body
over the limit, or no reply.

Where llhttp is stricter than Twisted's parser (a response that could
smuggle a second one past a proxy), the difference is listed with the
verdict of each, so that it stays a decision rather than an accident.
"""

from __future__ import annotations

from typing import Any, Optional

from twisted.internet import reactor
from twisted.internet.defer import Deferred, inlineCallbacks
from twisted.internet.endpoints import TCP4ClientEndpoint
from twisted.internet.protocol import Factory, Protocol
from twisted.python.failure import Failure
from twisted.trial.unittest import TestCase
from twisted.web.client import Agent, HTTPConnectionPool, ResponseDone
from twisted.web.http import PotentialDataLoss

from amp.http import BodyTooLarge, Charge, OriginPool, ReplyBudget, ReplyFailed, ReplyLimits

#: The body limit both clients read with.
LIMIT = 1000

BODY = b'[{"op":"add","path":"/metadata/labels/a","value":"b"}]'


def _chunked(body: bytes, size: int = 7) -> bytes:
    return (
        b"".join(b"%x\r\n%s\r\n" % (len(body[i : i + size]), body[i : i + size]) for i in range(0, len(body), size))
        + b"0\r\n\r\n"
    )


def _length(body: bytes, status: bytes = b"200 OK", extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 %s\r\nContent-Length: %d\r\n%s\r\n%s" % (status, len(body), extra, body)


#: Name: (the reply's pieces, sent one per reactor turn; close after them).
CORPUS: dict[str, tuple[list[bytes], bool]] = {
    "length": ([_length(BODY)], False),
    "chunked": ([b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + _chunked(BODY)], False),
    "chunked-extensions-trailers": (
        [b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\n[{"op\r\n0\r\nX-Trailer: t\r\n\r\n'],
        False,
    ),
    "empty-204": ([b"HTTP/1.1 204 No Content\r\n\r\n"], False),
    "status-404": ([_length(b"no such path", b"404 Not Found")], False),
    "status-503": ([_length(b"busy", b"503 Unavailable")], False),
    "redirect": ([_length(b"", b"302 Found", b"Location: /elsewhere\r\n")], False),
    "interim-then-reply": ([b"HTTP/1.1 100 Continue\r\n\r\n" + _length(BODY)], False),
    "connection-close": ([_length(BODY, extra=b"Connection: close\r\n")], True),
    "http-10-until-close": ([b"HTTP/1.0 200 OK\r\n\r\n" + BODY], True),
    "http-11-until-close": ([b"HTTP/1.1 200 OK\r\n\r\n", BODY], True),
    "bare-line-feeds": ([b"HTTP/1.1 200 OK\nContent-Length: %d\n\n%s" % (len(BODY), BODY)], False),
    "many-headers": ([_length(BODY, extra=b"".join(b"X-H%d: v\r\n" % i for i in range(50)))], False),
    # Slow: a byte or a few per reactor turn.
    "slow-head": ([bytes([b]) for b in _length(BODY)[:40]] + [_length(BODY)[40:]], False),
    "slow-chunks": (
        [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"]
        + [_chunked(BODY, 3)[i : i + 5] for i in range(0, len(_chunked(BODY, 3)), 5)],
        False,
    ),
    # Truncated: the connection ends before the reply does.
    "nothing": ([], True),
    "half-a-head": ([b"HTTP/1.1 200 OK\r\nContent-Le"], True),
    "short-body": ([b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + BODY[:10]], True),
    "unfinished-chunks": ([b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + _chunked(BODY)[:20]], True),
    # Oversized: over the body limit.
    "length-over": ([b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n[" % (LIMIT + 1)], False),
    "chunked-over": (
        [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"] + [b"100\r\n" + b" " * 256 + b"\r\n"] * 5,
        False,
    ),
    "until-close-over": ([b"HTTP/1.1 200 OK\r\n\r\n"] + [b" " * 300] * 4, True),
    # Malformed.
    "not-http": ([b"SSH-2.0-OpenSSH_9.6\r\n"], True),
    "bad-chunk-size": ([b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n[]\r\n0\r\n\r\n"], True),
    "two-lengths": ([b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n[]"], True),
    "length-not-a-number": ([b"HTTP/1.1 200 OK\r\nContent-Length: two\r\n\r\n[]"], True),
    "status-not-a-number": ([b"HTTP/1.1 2x0 OK\r\nContent-Length: 2\r\n\r\n[]"], True),
    # RFC 9112 5.2: obsolete line folding, unfolded (a user agent MUST),
    # also when the fold arrives in the next read.
    "folded-header": (
        [b"HTTP/1.1 200 OK\r\nX-A: a\r\n folded\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY)],
        True,
    ),
    "folded-header-split": (
        [b"HTTP/1.1 200 OK\r\nX-A: a\r\n", b"\t folded\r\nContent-Length: %d\r\n" % len(BODY), b"\r\n" + BODY],
        True,
    ),
}

#: Where the verdicts differ, by design: name -> (Twisted's, amp's), why.
STRICTER = {
    # RFC 9112 6.3: a response with both is a smuggling vector; llhttp
    # refuses it, Twisted reads it as chunked.
    "length-and-chunked": (
        [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n" + _chunked(BODY)],
        True,
    ),
}
STRICTER_VERDICTS = {
    "length-and-chunked": (("reply", 200, BODY), ("no reply",)),
}


class _Replies(Protocol):
    """
    Answers the first request on a connection with a corpus entry (named by
    the request's path), its pieces one per reactor turn.
    """

    def __init__(self) -> None:
        self._seen = b""
        self._answered = False

    def dataReceived(self, data: bytes) -> None:
        if self._answered:
            return
        self._seen += data
        if b"\r\n" not in self._seen:
            return
        self._answered = True
        name = self._seen.split(b" ", 2)[1].decode()[1:]
        pieces, close = CORPUS.get(name) or STRICTER[name]
        self._send(list(pieces), close)

    def _send(self, pieces: list[bytes], close: bool) -> None:
        if not self.transport.connected:
            return
        if pieces:
            self.transport.write(pieces.pop(0))
            reactor.callLater(0, self._send, pieces, close)
        elif close:
            self.transport.loseConnection()


class _Collect(Protocol):
    def __init__(self, done: Deferred) -> None:
        self._done = done
        self._chunks: list[bytes] = []
        self._size = 0

    def dataReceived(self, data: bytes) -> None:
        if self._done.called:
            return
        self._size += len(data)
        if self._size > LIMIT:
            self._done.callback(("too large",))
            self.transport.loseConnection()
            return
        self._chunks.append(data)

    def connectionLost(self, reason: Failure = None) -> None:  # type: ignore[assignment]
        if not self._done.called:
            self._done.callback(
                ("body", b"".join(self._chunks)) if reason.check(ResponseDone, PotentialDataLoss) else ("no reply",)
            )


class DifferentialTests(TestCase):
    timeout = 60

    def setUp(self) -> None:
        factory = Factory.forProtocol(_Replies)
        self.port = reactor.listenTCP(0, factory, interface="127.0.0.1")
        self.addCleanup(self.port.stopListening)
        self.pool = HTTPConnectionPool(reactor, persistent=False)
        self.addCleanup(self.pool.closeCachedConnections)

    @inlineCallbacks
    def twisted_verdict(self, name: str) -> Any:
        agent = Agent(reactor, pool=self.pool)
        url = b"http://127.0.0.1:%d/%s" % (self.port.getHost().port, name.encode())
        try:
            response = yield agent.request(b"POST", url)
        except Exception:
            return ("no reply",)
        if not 200 <= response.code < 300:
            response.deliverBody(_Drop())
            return ("status", response.code)
        length: Optional[int] = response.length if isinstance(response.length, int) else None
        if length is not None and length > LIMIT:
            response.deliverBody(_Drop())
            return ("too large",)
        done: Deferred = Deferred()
        response.deliverBody(_Collect(done))
        outcome = yield done
        return ("reply", response.code, outcome[1]) if outcome[0] == "body" else outcome

    @inlineCallbacks
    def amp_verdict(self, name: str) -> Any:
        budget = ReplyBudget(1 << 20)
        limits = ReplyLimits(16384, 100, LIMIT, budget)
        opened: list[Any] = []
        pool = OriginPool(
            reactor,
            TCP4ClientEndpoint(reactor, "127.0.0.1", self.port.getHost().port),
            limits,
            10,
            60.0,
            opened.append,
            lambda c: None,
        )
        request = b"POST /%s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n" % name.encode()
        charge = Charge(budget)
        try:
            reply = yield pool.request(request, charge)
        except BodyTooLarge:
            verdict: Any = ("too large",)
        except ReplyFailed:
            verdict = ("no reply",)
        else:
            verdict = ("status", reply.code) if reply.body is None else ("reply", reply.code, reply.body)
        charge.close()
        yield pool.close_idle()
        for conn in opened:
            conn.abort()
        self.assertEqual(budget.held, 0, name)
        return verdict

    @inlineCallbacks
    def test_same_verdicts(self) -> Any:
        differ = {}
        for name in CORPUS:
            theirs = yield self.twisted_verdict(name)
            ours = yield self.amp_verdict(name)
            if theirs != ours:
                differ[name] = (theirs, ours)
        self.assertEqual(differ, {})

    @inlineCallbacks
    def test_where_amp_is_stricter(self) -> Any:
        for name, (theirs, ours) in STRICTER_VERDICTS.items():
            self.assertEqual((yield self.twisted_verdict(name)), theirs, name)
            self.assertEqual((yield self.amp_verdict(name)), ours, name)


class _Drop(Protocol):
    def connectionMade(self) -> None:
        self.transport.stopProducing()
