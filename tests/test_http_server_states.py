"""
One webhook connection driven in any order: a stateful property test of
L{amp.http.HTTPServerProtocol} on a L{MemoryReactorClock} over a
L{StringTransport}.

Hypothesis queues requests (answered at once or held by the handler until
the test answers them, kept alive or closing, sized or chunked, HTTP/1.1 or
HTTP/1.0 with keep-alive), then interleaves: their bytes sent in pieces of
any size (pipelined, split anywhere), bytes that are not HTTP, the held
request answered, the client leaving (C{connectionLost} at any point), the
transport's buffer filling and emptying, the listener's drain, and time
passing across the read, idle, linger and drain deadlines.

What must hold, as the API server sees it: answers come once each, in the
order the requests were sent, each the request's own; a refusal, if any, is
the last thing written; nothing is written once amp closed the connection
or the client left; no timer of the connection is left once it is gone;
every request sent whole before amp closed is answered unless the client
left or a deadline ended the connection; and the drain ends.
"""

from __future__ import annotations

import re
from typing import Optional

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from twisted.internet.defer import Deferred
from twisted.internet.error import ConnectionDone
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.python.failure import Failure

from amp.http import HTTPServerFactory, Request
from amp.metrics import Metrics

_REQUEST_TIMEOUT = 5.0
_IDLE_TIMEOUT = 7.0
_DRAIN_TIMEOUT = 11.0
_STATUS = re.compile(rb"HTTP/1\.[01] (\d{3}) ")


def _request(ident: int, path: bytes, close: bool, chunked: bool, http10: bool, body: bytes) -> bytes:
    """The bytes of one request for C{path}, its id in the query."""
    version = b"HTTP/1.0" if http10 else b"HTTP/1.1"
    head = b"POST %s?id=%d %s\r\nHost: 127.0.0.1\r\nContent-Type: text/plain\r\n" % (path, ident, version)
    if close:
        head += b"Connection: close\r\n"
    elif http10:
        head += b"Connection: keep-alive\r\n"
    if chunked and not http10:
        return (
            head + b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
            if body
            else head + b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
        )
    return head + b"Content-Length: %d\r\n\r\n%s" % (len(body), body)


def _answers(data: bytes) -> list[tuple[int, bytes, bool]]:
    """The answers in C{data}: (status, body, Connection: close), in order."""
    answers = []
    while data:
        end = data.find(b"\r\n\r\n")
        assert end >= 0, f"an answer's head is cut: {data!r}"
        head = data[:end]
        status = _STATUS.match(head)
        assert status is not None, f"not a status line: {head!r}"
        length = re.search(rb"\r\nContent-Length: (\d+)", head)
        assert length is not None, f"no Content-Length: {head!r}"
        start = end + 4
        size = int(length.group(1))
        body = data[start : start + size]
        assert len(body) == size, f"an answer's body is cut: {data!r}"
        answers.append((int(status.group(1)), body, b"\r\nConnection: close" in head))
        data = data[start + size :]
    return answers


class ConnectionStates(RuleBasedStateMachine):
    """One connection; see the module docstring."""

    @initialize()
    def start(self) -> None:
        self.clock = MemoryReactorClock()
        self.held: list[Request] = []
        self.factory = HTTPServerFactory(
            {b"/now": self._now, b"/later": self.held.append},
            reactor=self.clock,
            metrics=Metrics(),
            max_body=64,
            max_connections=4,
            request_timeout=_REQUEST_TIMEOUT,
            idle_timeout=_IDLE_TIMEOUT,
        )
        self.transport = StringTransport()
        self.channel = self.factory.buildProtocol(None)
        self.channel.makeConnection(self.transport)
        #: Bytes queued to send, and (id, offset of its last byte + 1, close) of each request in them.
        self.pending = b""
        self.sent = 0
        self.requests: list[tuple[int, int, bool]] = []
        self.next_id = 0
        #: Bytes that are not a request were sent from this offset on (nothing after is answered).
        self.garbage_at: Optional[int] = None
        self.lost = False
        #: How much was written when amp closed (or the client left): nothing may follow.
        self.written_at_close: Optional[int] = None
        self.timed_out = False
        self.drained: Optional[Deferred[int]] = None
        self.drain_result: list[int] = []

    def _now(self, request: Request) -> None:
        request.respond(200, request.query, b"text/plain")

    # ------------------------------------------------------------ the client

    @rule(
        later=st.booleans(),
        close=st.booleans(),
        chunked=st.booleans(),
        http10=st.booleans(),
        body=st.binary(max_size=12).map(lambda b: b.replace(b"\r", b"r").replace(b"\n", b"n")),
    )
    @precondition(lambda self: len(self.requests) < 8)
    def queue_request(self, later: bool, close: bool, chunked: bool, http10: bool, body: bytes) -> None:
        data = _request(self.next_id, b"/later" if later else b"/now", close, chunked, http10, body)
        offset = self.sent + len(self.pending) + len(data)
        self.requests.append((self.next_id, offset, close))
        self.next_id += 1
        self.pending += data

    @rule()
    @precondition(lambda self: self.garbage_at is None and len(self.requests) < 8)
    def queue_garbage(self) -> None:
        self.garbage_at = self.sent + len(self.pending)
        self.pending += b"\x01NOT HTTP\r\n\r\n"

    @rule(size=st.integers(min_value=1, max_value=400))
    @precondition(lambda self: self.pending and not self.lost)
    def send(self, size: int) -> None:
        piece, self.pending = self.pending[:size], self.pending[size:]
        self.sent += len(piece)
        self.channel.dataReceived(piece)

    @rule()
    @precondition(lambda self: not self.lost)
    def leave(self) -> None:
        self.lost = True
        self.channel.connectionLost(Failure(ConnectionDone()))

    @rule()
    def pause(self) -> None:
        if not self.lost:
            self.channel.pauseProducing()

    @rule()
    def resume(self) -> None:
        if not self.lost:
            self.channel.resumeProducing()

    # ------------------------------------------------------------ amp's side

    @rule()
    @precondition(lambda self: self.held)
    def answer_held(self) -> None:
        request = self.held.pop(0)
        request.respond(200, request.query, b"text/plain")

    @rule()
    @precondition(lambda self: self.drained is None)
    def drain(self) -> None:
        self.drained = self.factory.drain(_DRAIN_TIMEOUT)
        self.drained.addCallback(self.drain_result.append)

    @rule(seconds=st.sampled_from([0.5, 2.0, _REQUEST_TIMEOUT, _IDLE_TIMEOUT, _DRAIN_TIMEOUT]))
    def advance(self, seconds: float) -> None:
        before = len(self.transport.value())
        self.clock.advance(seconds)
        if not self.lost and (self.transport.disconnecting or len(self.transport.value()) > before):
            self.timed_out = True

    # ------------------------------------------------------------ invariants

    @invariant()
    def answers_are_in_order_once_each(self) -> None:
        answers = _answers(self.transport.value())
        expected = [b"id=%d" % ident for ident, _, _ in self.requests]
        ok = [body for status, body, _ in answers if status == 200]
        assert ok == expected[: len(ok)], (ok, expected)
        refusals = [i for i, (status, _, _) in enumerate(answers) if status != 200]
        assert refusals in ([], [len(answers) - 1]), answers
        if refusals or (answers and answers[-1][2]):
            assert self.transport.disconnecting, "a refusal or Connection: close, and the connection open"

    @invariant()
    def nothing_is_written_after_close(self) -> None:
        written = len(self.transport.value())
        if self.written_at_close is not None:
            assert written == self.written_at_close, self.transport.value()[self.written_at_close :]
        elif self.transport.disconnecting or self.lost:
            self.written_at_close = written

    @invariant()
    def no_timer_is_left_once_gone(self) -> None:
        if self.lost:
            left = [
                call for call in self.clock.getDelayedCalls() if getattr(call.func, "__self__", None) is self.channel
            ]
            assert not left, left

    @invariant()
    def the_connection_is_counted_while_open(self) -> None:
        assert self.factory.open_connections == (0 if self.lost else 1)

    def teardown(self) -> None:
        if not hasattr(self, "channel"):
            return
        # The client sends the rest, amp answers what it holds, time passes.
        if not self.lost:
            self.channel.resumeProducing()
            if self.pending:
                self.send(len(self.pending))
            while self.held:
                self.answer_held()
            self.answers_are_in_order_once_each()
            self.nothing_is_written_after_close()
            answers = _answers(self.transport.value())
            if not self.timed_out and self.drained is None:
                # Every request sent whole before one that closes (or bytes
                # that are not HTTP) is answered.
                closing = [offset for _, offset, close in self.requests if close]
                end = min(closing + ([self.garbage_at + 1] if self.garbage_at is not None else []), default=self.sent)
                whole = [ident for ident, offset, _ in self.requests if offset <= min(end, self.sent)]
                assert [body for status, body, _ in answers if status == 200] == [b"id=%d" % i for i in whole]
        if self.drained is not None:
            self.clock.advance(_DRAIN_TIMEOUT)
            if self.transport.disconnecting and not self.lost:
                self.leave()
            assert self.drain_result, "the drain did not end"
        if self.transport.disconnecting and not self.lost:
            self.leave()
        if self.lost:
            self.no_timer_is_left_once_gone()
            assert self.factory.open_connections == 0


ConnectionStates.TestCase.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)
TestConnectionStates = ConnectionStates.TestCase


def test_a_transition_not_in_the_table_is_refused_by_name() -> None:
    """The tables are the only way states change: an illegal one raises, naming both states."""
    from amp.http._state import IllegalTransition, Link, Receiving, check_link, check_receiving

    assert check_link(Link.FRESH, Link.OPEN) is Link.OPEN
    try:
        check_link(Link.LOST, Link.OPEN)
    except IllegalTransition as e:
        assert "LOST -> OPEN" in str(e)
    else:
        raise AssertionError("LOST -> OPEN allowed")
    try:
        check_receiving(Receiving.BODY, Receiving.LINE)
    except IllegalTransition as e:
        assert "BODY -> LINE" in str(e)
    else:
        raise AssertionError("BODY -> LINE allowed")
