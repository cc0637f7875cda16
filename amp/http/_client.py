"""
amp's HTTP/1.1 client connection: L{ClientConnection}, one request at a time
on one connection, its replies parsed by llhttp (C{httptools}).

A request is bytes amp has built whole (head and body), written in one go;
its reply is read within its limits while it arrives:

  - the head, in bytes and lines, before the parser holds it
    (L{amp.http._replyhead.HeadCounter}); and the trailers of a chunked
    body against the same limits, with the head's own bytes and lines, as
    they arrive (its chunk framing allowed 32 bytes a chunk more): an
    endless trailer field is refused at the read that passes the limit,
    not at the call's timeout;
  - obsolete line folding (obs-fold) in a head is replaced by one space
    before the parser sees it (RFC 9112 section 5.2: a user agent MUST
    unfold), a line end at the end of a read held back until the next
    read shows whether a fold follows;
  - a Transfer-Encoding other than C{chunked} alone (C{gzip, chunked},
    C{gzip}): a coding amp does not decode, refused as an invalid reply
    and the connection closed, never read as the body (RFC 9112 section
    6.1);
  - the body, at once when its Content-Length is over C{limits.body}, else
    as soon as the bytes pass it; and every body byte is taken from the
    client's reply budget (a known length at once);
  - a status outside 2xx ends the reply at its head: the body is not read
    and the connection is closed.

What llhttp gives: framing (Content-Length, chunked, a body that ends with
the connection), refusal of what a response may not be (two different
Content-Lengths, Transfer-Encoding with Content-Length, an invalid length,
an invalid chunk size), 1xx interim heads, and
whether the connection may carry another request
(C{llhttp_should_keep_alive}: never after HTTP/1.0 without keep-alive,
C{Connection: close}, or a body delimited by the connection's end, RFC 9112
section 9.3; C{close} among the Connection options also after HTTP/1.0's
keep-alive, which llhttp lets win).  Bare line feeds are accepted as line
ends (section 2.2 allows a recipient to); and the parser reads on after a
head that ends the connection (a 1xx head's C{Connection: close} is not the
reply's; bytes after a final reply close the connection).  No content coding is
decoded: a gzipped body is bytes that are not JSON.

The connection hands every outcome to its L{IExchange}: the reply, or a
failure (L{ReplyFailed}), with whether any byte of a reply had arrived,
which is what decides the one retry (L{amp.http._pool}).
"""

from __future__ import annotations

import re
from typing import Any, Callable, Optional
from typing import Protocol as TypingProtocol

from httptools import HttpParserCallbackError, HttpParserError, HttpParserUpgrade, HttpResponseParser
from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import ITCPTransport
from twisted.internet.protocol import Protocol, connectionDone
from twisted.python.failure import Failure

from amp.http._replyhead import Charge, HeadCounter, ReplyLimits

#: An obs-fold: a line end followed by spaces or tabs (RFC 9112 section 5.2).
_FOLD = re.compile(rb"\r?\n[ \t]+")
#: Chunk framing allowed beside the trailers, per chunk (a size line and
#: the line end after the data, with room for a short extension).
_FRAMING_PER_CHUNK = 32


class ReplyFailed(Exception):
    """
    A request that got no usable reply.

    @ivar message: what happened, for the log and the deny message.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class HeadTooLarge(ReplyFailed):
    """
    The reply's head is over a limit (C{max_response_header_size},
    C{max_response_headers}, or one line over L{MAX_LINE}).
    """


class BodyTooLarge(ReplyFailed):
    """
    The reply's body is over C{max_response}.
    """


class BufferFull(ReplyFailed):
    """
    Holding the reply would pass amp's reply budget (C{max_buffered}): amp's
    own limit, reached by every call in flight together.
    """


class MalformedReply(ReplyFailed):
    """
    The bytes are not an HTTP/1.1 reply (llhttp's reason in the message).
    """


class ConnectionClosed(ReplyFailed):
    """
    The connection ended before a whole reply.

    @ivar reason: why it ended (the transport's failure: a reset, a TLS
        error, a clean close, an abort).
    """

    def __init__(self, reason: Failure) -> None:
        super().__init__("connection closed before a full reply")
        self.reason = reason


class Reply:
    """
    A reply: its status, its C{Location} (redirects name it), and its body
    (None when the status is not 2xx: not read).
    """

    __slots__ = ("code", "location", "body")

    def __init__(self, code: int, location: Optional[bytes], body: Optional[bytes]) -> None:
        self.code = code
        self.location = location
        self.body = body


class IExchange(TypingProtocol):
    """
    One request on a connection, and where its outcome goes.
    """

    #: The request, head and body.
    data: bytes
    #: What the reply takes from the reply budget.
    charge: Charge

    def replied(self, reply: Reply) -> None:
        """
        The whole reply arrived (or its head, when not 2xx).
        """

    def failed(self, failure: ReplyFailed, replying: bool) -> None:
        """
        No usable reply; C{replying}: some of a reply had arrived.
        """


class _Stop(Exception):
    """
    Raised from a parser callback to stop parsing: the reply is settled.
    A new one each time: a raised instance keeps its traceback, and raising
    the same one again would grow it (and the frames it holds) for good.
    """


class ClientConnection(Protocol):
    """
    One connection to an endpoint.

    @ivar reusable: the last reply allows another request on it, and it is
        neither busy nor closing.
    @ivar idle_since: when it last became idle (the pool's clock).
    """

    #: A TCP or TLS connection, set by C{makeConnection} before anything
    #: here uses it.
    transport: ITCPTransport

    def __init__(
        self,
        limits: ReplyLimits,
        opened: Callable[["ClientConnection"], None],
        lost: Callable[["ClientConnection"], None],
    ) -> None:
        self._limits = limits
        self._opened = opened
        self._lost = lost
        self._head = HeadCounter(limits)
        self._parser = HttpResponseParser(self)
        # A client may take bare line feeds as line ends (RFC 9112 2.2).
        # And the parser goes on after a head that ends the connection: a
        # 1xx head's Connection: close does not decide for the final reply,
        # and what follows a final reply closes the connection (see
        # on_message_begin) instead of being a parse error.
        self._parser.set_dangerous_leniencies(lenient_optional_cr_before_lf=True, lenient_keep_alive=True)
        self._exchange: Optional[IExchange] = None
        self._lost_waiters: Optional[list[Deferred[None]]] = None
        self.connected = False
        self.reusable = False
        self.idle_since = 0.0
        #: The pool this connection goes back to (set by the pool).
        self.pool: Any = None
        self._reset()

    def _reset(self) -> None:
        self._replying = False
        self._interim = False
        self._code = 0
        self._length: Optional[int] = None
        self._te: Optional[bytes] = None
        self._location: Optional[bytes] = None
        self._close = False
        self._chunks: list[bytes] = []
        self._size = 0
        self._prepaid = False
        self._complete = False
        self._early: Optional[Reply] = None
        self._refusal: Optional[ReplyFailed] = None
        #: The final head has ended: header callbacks are trailers now.
        self._trailing = False
        self._trailers = 0
        self._chunk_count = 0
        self._framing = 0
        #: A line end at the end of the last read of a head, not yet fed.
        self._line_end = b""

    # ------------------------------------------------------------ the pool's side

    def connectionMade(self) -> None:
        self.connected = True
        self._opened(self)

    def request(self, exchange: IExchange) -> None:
        """
        Send C{exchange.data}; its outcome goes to C{exchange}.  The
        connection is busy until then.
        """
        self._exchange = exchange
        self.reusable = False
        self._reset()
        self._head.start()
        # Last: over an in-memory transport the reply may arrive within.
        self.transport.write(exchange.data)

    def abort(self) -> None:
        """
        Close at once: a reply amp stopped reading, a cancelled call.
        """
        self.reusable = False
        self.transport.abortConnection()

    def close(self) -> None:
        """
        Close an idle connection.
        """
        self.reusable = False
        self.transport.loseConnection()

    def when_lost(self) -> Deferred[None]:
        """
        A Deferred that fires once this connection has closed.
        """
        if not self.connected:
            return succeed(None)
        d: Deferred[None] = Deferred()
        if self._lost_waiters is None:
            self._lost_waiters = []
        self._lost_waiters.append(d)
        return d

    # ------------------------------------------------------------ bytes in

    def dataReceived(self, data: bytes) -> None:
        exchange = self._exchange
        if exchange is None:
            # Nothing was asked: a peer that talks out of turn cannot be
            # trusted with the next request.
            self.abort()
            return
        self._replying = True
        head = self._head
        after_head = 0
        if head.in_head or self._line_end:
            if head.in_head:
                refused = head.count(data)
                if refused is not None:
                    self._fail(HeadTooLarge(refused) if refused else BufferFull(self._limits.budget.full()))
                    self.abort()
                    return
            data, after_head = self._unfolded(data)
        size = self._size
        try:
            self._parser.feed_data(data)
        except HttpParserCallbackError:
            if self._refusal is None and self._early is None and not self._complete:
                raise
        except (HttpParserError, HttpParserUpgrade) as e:
            if self._complete:
                # Bytes after the reply that are not HTTP: the peer is out
                # of step (and the parser stays in error).
                self.reusable = False
            else:
                self._refusal = MalformedReply(f"reply is not valid HTTP/1.1: {e}")
        if self._trailing and not self._complete and self._refusal is None and self._early is None:
            # Bytes of this read past the head that were not body: chunk
            # framing and trailers, which llhttp and httptools hold unbounded.
            self._count_framing(len(data) - after_head - (self._size - size))
        if self._refusal is not None:
            self._fail(self._refusal)
            self.abort()
        elif self._early is not None:
            reply, self._early = self._early, None
            self._done(reply, reuse=False)
        elif self._complete:
            reply = Reply(self._code, self._location, b"".join(self._chunks))
            self._done(reply, reuse=self.reusable)

    def _unfolded(self, data: bytes) -> tuple[bytes, int]:
        """
        C{data} of a head with each obs-fold replaced by a space, and where
        the head's bytes end in it; a line end (or its CR) at its end is
        held back while the head goes on (the next read may begin with a
        fold).
        """
        held, self._line_end = self._line_end, b""
        if held:
            data = held + data
        head = self._head
        end = len(data) if head.in_head else head.ended_at + len(held)
        part = data[:end]
        if b"\n " in part or b"\n\t" in part:
            part = _FOLD.sub(b" ", part)
            data = part + data[end:]
            end = len(part)
        if head.in_head and data[-1:] in (b"\n", b"\r"):
            end = len(data) - (2 if data.endswith(b"\r\n") else 1)
            self._line_end = data[end:]
            data = data[:end]
        return data, end

    def _count_framing(self, size: int) -> None:
        """
        C{size} more bytes that were neither head nor body: counted with
        the head against C{max_response_header_size}, beside
        L{_FRAMING_PER_CHUNK} bytes a chunk.
        """
        self._framing += size
        limit = self._limits.head_size
        if self._head.size + self._framing > limit + _FRAMING_PER_CHUNK * self._chunk_count:
            self._refusal = HeadTooLarge(
                f"reply headers and trailers are larger than the {limit} byte limit "
                f"(endpoints.max_response_header_size)"
            )

    # ------------------------------------------------------------ llhttp callbacks

    def on_message_begin(self) -> None:
        if self._complete:
            # Bytes after the reply: the peer is out of step.
            self.reusable = False
            raise _Stop()

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._trailing:
            # A trailer: counted with the head's lines, never read.
            self._trailers += 1
            limit = self._limits.head_count
            if self._head.lines + self._trailers > limit:
                self._refusal = HeadTooLarge(
                    f"reply has more than {limit} header and trailer lines (endpoints.max_response_headers)"
                )
                raise _Stop()
            return
        n = name.lower()
        if n == b"content-length":
            self._length = int(value)
        elif n == b"transfer-encoding":
            self._te = value if self._te is None else self._te + b"," + value
        elif n == b"location":
            self._location = value
        elif n == b"connection" and b"close" in [t.strip() for t in value.lower().split(b",")]:
            # llhttp lets HTTP/1.0's keep-alive outweigh it (RFC 9112 9.3: close wins).
            self._close = True

    def on_headers_complete(self) -> None:
        code = self._code = self._parser.get_status_code()
        if 100 <= code < 200 and code != 101:
            self._interim = True
            self._length = self._te = self._location = None
            self._close = False
            return
        if not 200 <= code < 300:
            self._early = Reply(code, self._location, None)
            raise _Stop()
        self._trailing = True
        te = self._te
        if te is not None and te.strip(b" \t").lower() != b"chunked":
            codings = [c.strip(b" \t").lower().decode("ascii", "replace") for c in te.split(b",")]
            if codings != ["chunked"]:
                unknown = next((c for c in codings if c != "chunked"), "chunked")
                self._refusal = MalformedReply(
                    f"reply's Transfer-Encoding is {', '.join(codings)!r}: amp decodes chunked alone, not {unknown!r}"
                )
                raise _Stop()
        length = self._length
        if length is not None:
            limit = self._limits.body
            if length > limit:
                self._refusal = BodyTooLarge(f"reply of {length} bytes is larger than the {limit} byte limit")
                raise _Stop()
            if not self._exchange.charge.take(length):  # type: ignore[union-attr]  # set while a reply is read
                self._refusal = BufferFull(self._limits.budget.full())
                raise _Stop()
            self._prepaid = True

    def on_chunk_header(self) -> None:
        self._chunk_count += 1

    def on_body(self, data: bytes) -> None:
        size = self._size = self._size + len(data)
        limit = self._limits.body
        if size > limit:
            self._refusal = BodyTooLarge(f"reply is larger than the {limit} byte limit")
            raise _Stop()
        if not self._prepaid and not self._exchange.charge.take(len(data)):  # type: ignore[union-attr]  # as above
            self._refusal = BufferFull(self._limits.budget.full())
            raise _Stop()
        self._chunks.append(data)

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            return
        self._complete = True
        self.reusable = not self._close and self._parser.should_keep_alive()

    # ------------------------------------------------------------ outcomes

    def _done(self, reply: Reply, reuse: bool) -> None:
        exchange = self._exchange
        self._exchange = None
        self._head.release()
        self._chunks = []
        if reuse:
            self.pool.idle(self)
        else:
            self.reusable = False
            if reply.body is None:
                # A reply amp does not read: stop it arriving.
                self.transport.abortConnection()
            else:
                self.transport.loseConnection()
        exchange.replied(reply)  # type: ignore[union-attr]  # a reply ends the exchange it was read for

    def _fail(self, failure: ReplyFailed) -> None:
        exchange = self._exchange
        self._exchange = None
        self.reusable = False
        self._head.release()
        self._chunks = []
        if exchange is not None:
            exchange.failed(failure, self._replying)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self.connected = False
        self.reusable = False
        if self._exchange is not None:
            if (
                self._code >= 200
                and not self._interim
                and not self._complete
                and self._refusal is None
                and self._length is None
                and not _chunked(self._te)
            ):
                # A body delimited by the connection's end: it has ended.
                self._done(Reply(self._code, self._location, b"".join(self._chunks)), reuse=False)
            else:
                self._fail(ConnectionClosed(reason))
        self._head.release()
        try:
            self._lost(self)
        finally:
            waiters, self._lost_waiters = self._lost_waiters, None
            for d in waiters or ():
                d.callback(None)


def _chunked(te: Optional[bytes]) -> bool:
    """
    Whether a Transfer-Encoding value's last coding is chunked (then the
    body's end is the last chunk, not the connection's).
    """
    return te is not None and te.rsplit(b",", 1)[-1].strip().lower() == b"chunked"
