"""
Reading endpoint replies within their limits, and the memory they take.

  - L{read_limited}: a reply body, failed with C{response-too-large} at once
    when its Content-Length is over C{max_response}, else as soon as the
    body passes it; the connection is closed either way.
  - L{Drop}: a body amp will not read (non-2xx replies): its connection is
    closed.
  - L{GuardedConnection}: sits between the transport (TCP, or TLS over it)
    and Twisted's C{HTTP11ClientProtocol} of every connection the client
    opens.  It bounds each reply's head (status line and headers) in bytes
    and in lines while it streams in, tells the client when the connection
    opens and closes, closes it after a reply that does not let it carry
    another request (L{keeps_connection}), and says when it must not be
    handed out again (C{reusable}, which the pool asks,
    L{amp.endpoint._pool}) and when the endpoint closed it under a request
    it had kept it open for (L{ClosedWhileIdle}).
  - L{ReplyBudget}: the bytes of endpoint replies amp holds at once, over
    every call (C{endpoints.max_buffered}): heads while they stream in and
    until their reply is over, bodies until their call has ended.

Why the wrapper reads the Connection header: Twisted's client keeps a
connection after any reply whose Connection header is not exactly C{close}:
after an HTTP/1.0 reply (which ends its connection unless it says
C{keep-alive}, and does with C{http.server}'s default handler), after
C{Close} or C{keep-alive, close}.  The endpoint closes it, but the next call
may already have been sent on it: a C{connection-reset}.

Why a wrapper bounds the head: Twisted's C{HTTPClientParser} reads header
lines until the blank line with no bound on their number or their total
(only on one line's length, C{LineReceiver.MAX_LENGTH}, which it answers by
closing the connection: a C{connection-reset}); an endpoint streaming short
header lines is read until the call's timeout.  Nothing in Twisted's client
can be told a limit without replacing its protocol (C{_newclient}, private),
which would take the stock pool with it.  A protocol wrapper sees the same
bytes first, and it only needs to find line ends and the blank line that
ends a head, not to parse HTTP: it is not in the way of the stock pool, the
stock agent or the stock parser.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from twisted.internet.defer import Deferred, fail
from twisted.internet.interfaces import IProtocol
from twisted.internet.protocol import Protocol
from twisted.protocols.basic import LineReceiver
from twisted.protocols.policies import ProtocolWrapper, WrappingFactory
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone
from twisted.web.http import PotentialDataLoss
from twisted.web.iweb import IResponse

from amp.endpoint._failures import ClosedWhileIdle, EndpointFailure, LocalFailure
from amp.reasons import Reason

#: The longest header line Twisted's HTTP client reads: its parser is a
#: C{LineReceiver} with the default C{MAX_LENGTH}, and closes the connection
#: on a longer one.  amp refuses such a line first, with its name.
MAX_LINE = LineReceiver.MAX_LENGTH

_CONNECTION = b"\nconnection:"


class ResponseHeadersTooLarge(EndpointFailure):
    """
    The reply's head is over C{max_response_header_size} bytes or
    C{max_response_headers} lines.  The endpoint's fault: the breaker counts
    it, as it counts C{response-too-large}.
    """

    def __init__(self, message: str) -> None:
        super().__init__(Reason.RESPONSE_HEADERS_TOO_LARGE, message)


class ReplyBufferFull(LocalFailure):
    """
    Taking the reply would put amp over C{endpoints.max_buffered} bytes of
    endpoint replies held at once.  amp's own limit, reached by every call
    in flight together: the breaker does not count it against this endpoint.
    """

    def __init__(self, budget: "ReplyBudget") -> None:
        super().__init__(Reason.REPLY_BUFFER_FULL,
                         f"amp already holds {budget.held} bytes of endpoint replies "
                         f"(endpoints.max_buffered: {budget.limit})")


class ReplyBudget:
    """
    The bytes of endpoint replies amp holds at once, over every call, and
    the bound on them.

    @ivar limit: the bound (C{endpoints.max_buffered}).
    @ivar held: bytes held now.
    @ivar peak: the most ever held at once.
    """

    __slots__ = ("limit", "held", "peak")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self.peak = 0

    def take(self, n: int) -> bool:
        """
        Hold C{n} more bytes, if that stays within the limit.
        """
        held = self.held + n
        if held > self.limit:
            return False
        self.held = held
        if held > self.peak:
            self.peak = held
        return True

    def give(self, n: int) -> None:
        """
        Hand back C{n} bytes taken before.
        """
        self.held -= n


class Charge:
    """
    What one call holds of the L{ReplyBudget}: taken as its body arrives,
    handed back at once when the call ends (L{close}); nothing can be taken
    after that.
    """

    __slots__ = ("_budget", "_held", "_closed")

    def __init__(self, budget: ReplyBudget) -> None:
        self._budget = budget
        self._held = 0
        self._closed = False

    @property
    def budget(self) -> ReplyBudget:
        return self._budget

    def take(self, n: int) -> bool:
        if self._closed or not self._budget.take(n):
            return False
        self._held += n
        return True

    def close(self) -> None:
        self._closed = True
        held, self._held = self._held, 0
        if held:
            self._budget.give(held)


class _LimitedBody(Protocol):
    """
    Collect a response body, failing and closing the connection as soon as
    it passes C{limit} bytes, or would put amp over its reply budget.

    @param prepaid: the body's length was taken from C{charge} already.
    """

    def __init__(self, finished: Deferred, limit: int, charge: Charge, prepaid: bool) -> None:
        self._finished = finished
        self._limit = limit
        self._charge = charge
        self._prepaid = prepaid
        self._chunks: list[bytes] = []
        self._size = 0

    def dataReceived(self, data: bytes) -> None:
        if self._finished.called:
            return
        self._size += len(data)
        if self._size > self._limit:
            failure = Failure(EndpointFailure(
                Reason.RESPONSE_TOO_LARGE, f"reply is larger than the {self._limit} byte limit"))
        elif self._prepaid or self._charge.take(len(data)):
            self._chunks.append(data)
            return
        else:
            failure = Failure(ReplyBufferFull(self._charge.budget))
        self._chunks = []
        # Fail first: a transport may report the loss at once.
        self._finished.errback(failure)
        self.transport.loseConnection()

    def connectionLost(self, reason: Failure = None) -> None:  # type: ignore[assignment]
        if self._finished.called:
            return
        if reason.check(ResponseDone, PotentialDataLoss):
            self._finished.callback(b"".join(self._chunks))
        else:
            self._finished.errback(reason)


class Drop(Protocol):
    """
    Takes a response body only to close its connection (a no-op if the whole
    response has already arrived and the connection went back to the pool).
    """

    def connectionMade(self) -> None:
        self.transport.loseConnection()


def read_limited(response: IResponse, limit: int, charge: Charge) -> Deferred:
    """
    The body of C{response}, or an L{EndpointFailure} past C{limit} bytes,
    or a L{ReplyBufferFull} when amp cannot hold it.  The bytes are taken
    from C{charge} (a known length at once).  Cancelling the result closes
    the connection.
    """
    length = response.length
    known = isinstance(length, int)
    if known and length > limit:
        response.deliverBody(Drop())
        return fail(EndpointFailure(
            Reason.RESPONSE_TOO_LARGE, f"reply of {length} bytes is larger than the {limit} byte limit"))
    if known and not charge.take(length):
        response.deliverBody(Drop())
        return fail(ReplyBufferFull(charge.budget))
    collector: _LimitedBody

    def cancel(d: Deferred) -> None:
        if collector.transport is not None:
            collector.transport.loseConnection()

    finished: Deferred = Deferred(cancel)
    collector = _LimitedBody(finished, limit, charge, known)
    response.deliverBody(collector)
    return finished


@dataclass(frozen=True)
class HeadLimits:
    """
    Bounds on one reply's head, for every connection of a settings profile.
    """

    #: C{max_response_header_size}: status line and header lines together,
    #: in bytes (1xx interim heads included).
    size: int
    #: C{max_response_headers}: header lines.
    count: int
    budget: ReplyBudget


class GuardedConnection(ProtocolWrapper):
    """
    One connection of the endpoint client, between its transport and the
    C{HTTP11ClientProtocol} (C{http}) the pool drives.

    It is the HTTP protocol's transport, so every close amp asks for (a body
    it drops or stops reading, a cancelled request, the pool's idle timer)
    passes through here and sets C{disconnecting}, which the pool looks at
    before handing the connection out.

    Each request written starts a reply: its head is counted (bytes, header
    lines, line length) as it arrives, before the HTTP parser sees it, and
    taken from the reply budget until the reply is over.  A head over a
    limit is refused at once: nothing more reaches the parser, the
    connection is aborted, and the request fails with
    L{ResponseHeadersTooLarge} (or L{ReplyBufferFull}).  The body that
    follows a head is not looked at here.
    """

    factory: "GuardedFactory"

    def __init__(self, factory: "GuardedFactory", wrappedProtocol: IProtocol) -> None:
        super().__init__(factory, wrappedProtocol)
        #: The HTTP protocol, kept after the wrapper lets go of it on close.
        self.http = wrappedProtocol
        #: Requests sent on this connection; more than one: it was reused.
        self.requests = 0
        #: The last reply lets the connection carry another request.
        self.keep_alive = True
        #: A byte of the current request's reply has arrived.
        self._answered = False
        #: The status line of the head being read, and its Connection
        #: header lines (read by L{_scan}).
        self._status = b""
        self._connection: list[bytes] = []
        self._limits = factory.limits
        self._lost_waiters: Optional[list[Deferred]] = None
        #: Why amp refused the reply coming in, once it has.
        self._refused: Optional[Failure] = None
        #: A reply's head is being read.
        self._in_head = False
        #: Bytes of the reply's head(s) so far, held from the budget.
        self._head = 0
        self._lines = 0
        self._line = 0
        self._line_start = bytearray()
        #: The next complete line is a status line.
        self._at_status = False
        self._interim = False

    # ------------------------------------------------------------ transport side (the HTTP protocol writes)

    def write(self, data: bytes) -> None:
        self._request_out()
        self.transport.write(data)

    def writeSequence(self, data: Any) -> None:
        self._request_out()
        self.transport.writeSequence(data)

    def _request_out(self) -> None:
        # The first write of a request: its reply's head starts with the
        # next byte in.  (A request is written whole before anything of its
        # reply can be read: amp's bodies are in memory.)
        if not self._in_head:
            self._release()
            self.requests += 1
            self._answered = False
            self._in_head = True
            self._lines = 0
            self._line = 0
            self._line_start = bytearray()
            self._at_status = True
            self._interim = False

    # Called on every reply: said here rather than found by ProtocolWrapper's
    # __getattr__ each time.
    def pauseProducing(self) -> None:
        self.transport.pauseProducing()

    def resumeProducing(self) -> None:
        self.transport.resumeProducing()

    def loseConnection(self) -> None:
        # Closing in the middle of a reply only happens to stop reading it
        # (a body amp drops or that passed its limit, a cancelled call):
        # abort then, so that a peer that goes on sending (over TLS, one
        # that never answers the close alert) cannot keep it open.
        if self.http.state == "QUIESCENT":
            super().loseConnection()
        else:
            self.abortConnection()

    def abortConnection(self) -> None:
        self.disconnecting = 1
        self.transport.abortConnection()

    @property
    def reusable(self) -> bool:
        """
        Whether the connection may carry another request: its last reply
        allows it and amp has not started closing it.
        """
        return self.keep_alive and not self.disconnecting

    # ------------------------------------------------------------ protocol side (the endpoint sends)

    def dataReceived(self, data: bytes) -> None:
        self._answered = True
        if self._refused is not None:
            return
        if self._in_head and not (self._at_status and not self._line and self._whole_head(data)) \
                and not self._scan(data):
            return
        self.wrappedProtocol.dataReceived(data)
        if not self._in_head and self.http.state == "QUIESCENT":
            # The reply is over: its head is no longer held, and the
            # connection ends with it if the reply said so.
            if self._head:
                self._release()
            if not self.keep_alive and not self.disconnecting:
                self.loseConnection()

    def _whole_head(self, data: bytes) -> bool:
        """
        The usual reply, counted in a few C calls: the whole head in the
        first bytes read, C{HTTP/1.x} and a final status code, within every
        limit.  True when it was; False leaves C{data} to L{_scan}, which
        handles everything else (and refuses what is over a limit).
        """
        blank = data.find(b"\n\r\n")
        if (blank < 0 or not data.startswith(b"HTTP/1.") or data[9:10] == b"1" or not data[9:12].isdigit()
                or data[12:13] not in (b" ", b"\r") or data.find(b"\n\n", 0, blank) >= 0):
            return False
        size = blank + 3
        limits = self._limits
        if size > limits.size or size > MAX_LINE or data.count(b"\n", 0, size) - 2 > limits.count:
            return False
        if not limits.budget.take(size):
            return False
        self._head = size
        self._in_head = False
        self.keep_alive = keeps_connection(data[:size])
        return True

    def _scan(self, data: bytes) -> bool:
        """
        Count the head bytes in C{data}; False when the reply was refused.
        """
        limits = self._limits
        counted = 0
        pos = 0
        size = len(data)
        while pos < size:
            nl = data.find(b"\n", pos)
            end = size if nl < 0 else nl + 1
            piece = end - pos
            counted += piece
            self._line += piece
            # Kept of the line: all of it (a status line's code decides
            # whether another head follows, its version and the Connection
            # header whether the connection is kept), up to the longest line.
            if len(self._line_start) <= MAX_LINE:
                self._line_start += data[pos:min(end, pos + MAX_LINE + 1 - len(self._line_start))]
            if self._head + counted > limits.size:
                return self._refuse(ResponseHeadersTooLarge(
                    f"reply headers are larger than the {limits.size} byte limit "
                    f"(endpoints.max_response_header_size)"))
            if self._line > MAX_LINE:
                return self._refuse(ResponseHeadersTooLarge(
                    f"a reply header line is longer than {MAX_LINE} bytes"))
            pos = end
            if nl < 0:
                break
            line, self._line_start, self._line = self._line_start, bytearray(), 0
            if self._at_status:
                self._at_status = False
                self._status = bytes(line)
                self._connection = []
                self._interim = _interim(self._status)
            elif line == b"\r\n" or line == b"\n":
                if self._interim:
                    # A 1xx head, which Twisted skips: the real one follows.
                    self._at_status = True
                    continue
                self._in_head = False
                self.keep_alive = keeps_connection(self._status + b"".join(self._connection))
                self._status, self._connection = b"", []
                break
            else:
                if line[:len(_CONNECTION) - 1].lower() == _CONNECTION[1:]:
                    self._connection.append(bytes(line))
                self._lines += 1
                if self._lines > limits.count:
                    return self._refuse(ResponseHeadersTooLarge(
                        f"reply has more than {limits.count} header lines (endpoints.max_response_headers)"))
        if not limits.budget.take(counted):
            return self._refuse(ReplyBufferFull(limits.budget))
        self._head += counted
        return True

    def _refuse(self, failure: EndpointFailure) -> bool:
        self._refused = Failure(failure)
        self._in_head = False
        self._release()
        self.abortConnection()
        return False

    def _release(self) -> None:
        if self._head:
            self._limits.budget.give(self._head)
            self._head = 0

    def connectionLost(self, reason: Failure = None) -> None:  # type: ignore[assignment]
        self._release()
        if self._refused is not None:
            # A refused reply fails its request with the refusal.
            reason = self._refused
        elif self.requests > 1 and self._in_head and not self._answered and not self.disconnecting:
            # The endpoint closed the kept connection the request went out
            # on, before answering it: it had closed it while it was idle.
            reason = Failure(ClosedWhileIdle(reason))
        try:
            super().connectionLost(reason)
        finally:
            waiters, self._lost_waiters = self._lost_waiters, None
            for d in waiters or ():
                d.callback(None)

    def when_lost(self) -> Deferred:
        """
        A Deferred that fires once this connection has closed.
        """
        d: Deferred = Deferred()
        if self._lost_waiters is None:
            self._lost_waiters = []
        self._lost_waiters.append(d)
        return d


def keeps_connection(head: bytes) -> bool:
    """
    Whether a reply lets its connection carry another request (RFC 9112
    section 9.3), from its head (the status line and header lines; only the
    Connection header lines are looked at): never when a Connection header
    lists C{close}; an HTTP/1.1 reply otherwise does; an HTTP/1.0 reply only
    when a Connection header lists C{keep-alive}; any other version never.
    """
    lowered = head.lower()
    tokens: set[bytes] = set()
    at = lowered.find(_CONNECTION)
    while at >= 0:
        end = lowered.find(b"\n", at + 1)
        if end < 0:
            end = len(lowered)
        tokens.update(t.strip(b" \t\r") for t in lowered[at + len(_CONNECTION):end].split(b","))
        at = lowered.find(_CONNECTION, end)
    if b"close" in tokens:
        return False
    if lowered.startswith(b"http/1.1 "):
        return True
    return lowered.startswith(b"http/1.0 ") and b"keep-alive" in tokens


def _interim(status_line: bytes) -> bool:
    """
    Whether a status line (with its line end) is a 1xx interim reply, which
    Twisted's parser skips to read the next head.  Read as that parser
    reads it (C{HTTPClientParser.statusReceived}: the line end off, split on
    spaces, C{int()} of the second part), so that no code it takes for 1xx
    (C{+100}, C{0100}) ends the count here.
    """
    line = status_line[:-1] if status_line.endswith(b"\n") else status_line
    if line.endswith(b"\r"):
        line = line[:-1]
    parts = line.split(b" ", 2)
    if len(parts) < 2:
        return False
    try:
        code = int(parts[1])
    except ValueError:
        return False
    return 100 <= code < 200


class GuardedFactory(WrappingFactory):
    """
    Wraps the pool's HTTP client factory for one new connection; reports the
    connection to C{opened} and C{lost}.
    """

    protocol = GuardedConnection

    def __init__(self, wrapped: Any, limits: HeadLimits, opened: Callable[[GuardedConnection], None],
                 lost: Callable[[GuardedConnection], None]) -> None:
        super().__init__(wrapped)
        self.limits = limits
        self._opened = opened
        self._lost = lost

    def registerProtocol(self, p: GuardedConnection) -> None:
        self._opened(p)

    def unregisterProtocol(self, p: GuardedConnection) -> None:
        self._lost(p)
