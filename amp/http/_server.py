"""
One webhook connection: HTTP/1.1 parsed by llhttp (C{httptools}), requests
answered in order, and every limit of the listener enforced while the bytes
arrive.

llhttp frames each request (Content-Length or chunked), decides keep-alive
(HTTP/1.0 only with C{Connection: keep-alive}, HTTP/1.1 unless
C{Connection: close}) and refuses, by default, what request smuggling needs:
Content-Length beside Transfer-Encoding, two Content-Lengths, a length that
is not all digits, a Transfer-Encoding other than a final C{chunked},
obsolete line folding, bare LF line ends, bad characters in names and
values.  What it leaves to amp, amp does here:
  - the request line and each header line at most L{MAX_LINE} bytes (414,
    431), at most L{MAX_HEADERS} fields and L{MAX_HEAD_BYTES} bytes of head
    (431), checked as each piece arrives, not once the head is whole;
  - the body at most C{listen.max_body} (413): on the Content-Length before
    any of the body, or on the running count of a chunked one;
  - HTTP/1.0 and HTTP/1.1 only (any other version is 400);
  - C{Expect: 100-continue} answered with 100 only when the request is next
    in line and not refused;
  - C{listen.request_timeout} from a request's first byte (the first
    request's from the accept) to its last, whatever the pace of the bytes
    (408, or a plain close for a connection that sent nothing);
  - C{listen.idle_timeout} while nothing is asked of amp: the connection is
    closed, then aborted after L{CLOSE_GRACE};
  - pipelined requests: each is answered in turn, in order; while one waits
    its turn the connection is not read, so what waits is at most what one
    read brought;
  - a client that does not read its answers: amp is the transport's
    producer, and stops reading and answering while the transport's buffer
    is full;
  - after a refusal, the rest of the client's input is read and dropped for
    at most L{CLOSE_GRACE} seconds or L{LINGER_BYTES} bytes, then the
    connection is aborted.

What RFC 9112 asks of a server that llhttp does not do is checked as the
head arrives (L{amp.http._target}): one valid Host, a target in origin or
absolute form, C{chunked} alone as the transfer coding (else 501), values
read without the whitespace around them.

An upgrade (C{Connection: upgrade}, C{CONNECT}) is answered, not followed,
and the connection closed.  One timer serves every deadline: one that moves
later only updates a number; the timer, firing early, sets itself again.
"""

from __future__ import annotations

from collections import deque
from typing import Optional

from httptools import HttpParserError, HttpParserUpgrade, HttpRequestParser
from twisted.internet.interfaces import IDelayedCall, IPushProducer
from twisted.internet.protocol import Protocol, connectionDone
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from amp.http._limits import CLOSE_GRACE, LINGER_BYTES, MAX_HEAD_BYTES, MAX_HEADERS, MAX_LINE, status_line
from amp.http._refusal import framing_over, head_over, parser_error, refusal, refused
from amp.http._request import TEXT, IListener, IServerTransport, Request, client_gone
from amp.http._state import LINK_NEXT, RECEIVING_NEXT, Link, Receiving, Timer, check_link, check_receiving, delay_until
from amp.http._target import OWS, absolute_target, head_problem, spaced, transfer_coding_problem

_FRESH, _OPEN, _CLOSING, _CLOSED, _REJECTED, _LOST = Link
_NOTHING, _LINE, _FIELDS, _BODY = Receiving
_NONE, _READ, _IDLE, _LINGER = Timer

_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_CLOSE = b"Connection: close\r\n"
_KEEP_ALIVE = b"Connection: keep-alive\r\n"


class _Refused(Exception):
    """Raised from a parser callback to stop parsing after a refusal."""


@implementer(IPushProducer)
class HTTPServerProtocol(Protocol):
    """
    One connection to the webhook listener (see the module docstring).

    Its state (L{amp.http._state}: the transitions, an illegal one raises):
    C{_link}, a L{Link}; C{_receiving}, a L{Receiving} (C{_incoming} is set
    exactly when it is not C{NOTHING}); C{_kind}, the timer's L{Timer}.
    Beside it, flow control (C{_write_paused}, C{_read_paused}) and
    C{_running}, which keeps L{_run_queue} from running inside itself.
    """

    log = Logger()
    transport: IServerTransport  # set by makeConnection, before anything here uses it

    def __init__(self, factory: IListener) -> None:
        self.factory = factory
        self._parser = HttpRequestParser(self)
        # A request with Connection: close followed by more bytes: answer
        # the request (llhttp would refuse the lot), ignore what follows.
        self._parser.set_dangerous_leniencies(lenient_data_after_close=True)
        #: Requests received in full, waiting their turn.
        self._queue: deque[Request] = deque()
        #: The request being answered.
        self._current: Optional[Request] = None
        #: The request being received (its first byte has arrived).
        self._incoming: Optional[Request] = None
        self._link = _FRESH
        self._receiving = _NOTHING
        #: Requests received whole (a read that completes one is not checked as a partial head).
        self._received = 0
        self._write_paused = False
        self._read_paused = False
        self._running = False
        self._dropped = 0
        self._timer: Optional[IDelayedCall] = None
        self._kind = _NONE
        self._deadline = 0.0
        # The head of the incoming request, as it arrives.
        self._url = b""
        self._fields = 0
        self._head = 0
        self._head_fed = 0
        self._line = 0
        self._length = 0
        self._body: list[bytes] = []
        self._body_size = 0
        # After the head: chunks begun, and bytes that were not body
        # (chunk sizes and extensions, trailers), and body bytes this read.
        self._chunks = 0
        self._framing = 0
        self._read_body = 0
        # The Host fields and Transfer-Encoding of the incoming request.
        self._hosts = 0
        self._host = b""
        self._te: Optional[bytes] = None

    # ------------------------------------------------------------ connection

    def _become(self, link: Link) -> None:
        """Go to C{link} (L{amp.http._state.LINK_NEXT} says whether it may)."""
        self._link = link if link in LINK_NEXT[self._link] else check_link(self._link, link)

    def _receive(self, receiving: Receiving, request: Optional[Request]) -> None:
        """C{request} arriving, read as far as C{receiving} (see L{amp.http._state.RECEIVING_NEXT})."""
        old = self._receiving
        self._receiving = receiving if receiving in RECEIVING_NEXT[old] else check_receiving(old, receiving)
        self._incoming = request

    def connectionMade(self) -> None:
        if not self.factory.connection_made(self):
            self._become(_REJECTED)
            self.transport.abortConnection()
            return
        self.transport.registerProducer(self, True)
        self._arm(_READ, self.factory.request_timeout)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        counted = self._link is not _REJECTED
        self._become(_LOST)
        timer, self._timer = self._timer, None
        if timer is not None and timer.active():
            timer.cancel()
        current, self._current = self._current, None
        client_gone(current, self._queue)
        if counted:
            self.factory.connection_lost(self)

    def dataReceived(self, data: bytes) -> None:
        if self._link >= _CLOSING:
            self._dropped += len(data)
            if self._dropped > LINGER_BYTES:
                self._abort()
            return
        received = self._received
        in_body = self._receiving is _BODY
        if not in_body and data.find(b"\t", 0, MAX_HEAD_BYTES) >= 0:
            data = spaced(data)
        self._read_body = 0
        try:
            self._parser.feed_data(data)
        except HttpParserUpgrade:
            self._upgraded()
        except HttpParserError as e:
            if self._link < _CLOSING:
                self.refuse(400, parser_error(e, self.log))
        receiving = self._receiving
        if receiving is not _NOTHING and self._received == received and self._link < _CLOSING:
            if receiving is not _BODY:
                self._check_partial_head(data)
            elif in_body:
                self._check_framing(len(data) - self._read_body)
        self._run_queue()

    def _check_partial_head(self, data: bytes) -> None:
        """
        A head still arriving: refuse it as soon as its current line or the
        whole of it is over the limits, without waiting for the line's end.
        A head that began after another request in the same read (not
        called then) is counted from the next read on: where in the read it
        began is not known.
        """
        self._head_fed += len(data)
        end = data.rfind(b"\n")
        if end < 0:
            self._line += len(data)
        else:
            self._line = len(data) - end - 1
            if self._receiving is _LINE:
                self._receive(_FIELDS, self._incoming)
        if self._line > MAX_LINE or self._head_fed > MAX_HEAD_BYTES:
            self.refuse(*head_over(self._line, self._receiving is _FIELDS or bool(self._fields)))

    def _check_framing(self, size: int) -> None:
        """C{size} bytes of this read were chunk framing or trailers: refused over amp's limit (L{framing_over})."""
        self._framing += size
        if framing_over(self._framing, self._chunks):
            self.refuse(431, f"chunk extensions and trailers are over {MAX_HEAD_BYTES} bytes")

    def _upgraded(self) -> None:
        """
        llhttp stopped at an upgrade (or CONNECT): amp speaks nothing else,
        so the request is answered and the connection closed after it.
        """
        self._become(_CLOSING)
        if self._queue:
            self._queue[-1].keep_alive = False

    # ------------------------------------------------------------ llhttp callbacks

    def on_message_begin(self) -> None:
        self._receive(_LINE, Request(self))
        self._url = b""
        self._fields = self._head = self._head_fed = self._line = self._length = self._body_size = 0
        self._chunks = self._framing = self._hosts = 0
        self._te = None
        if self._link is not _FRESH:
            self._arm(_READ, self.factory.request_timeout)

    def on_url(self, url: bytes) -> None:
        self._url = self._url + url if self._url else url
        if len(self._url) > MAX_LINE:
            self.refuse(414, f"request line is over {MAX_LINE} bytes")
            raise _Refused()

    def on_header(self, name: bytes, value: bytes) -> None:
        self._fields += 1
        if self._fields > MAX_HEADERS:
            self.refuse(431, f"more than {MAX_HEADERS} header fields")
            raise _Refused()
        size = len(name) + len(value) + 4
        if size > MAX_LINE:
            self.refuse(431, f"a header line is over {MAX_LINE} bytes")
            raise _Refused()
        self._head += size
        if self._head + len(self._url) > MAX_HEAD_BYTES:
            self.refuse(431, f"request headers are over {MAX_HEAD_BYTES} bytes")
            raise _Refused()
        if self._receiving is _BODY:
            # A trailer: counted, never read as one of the head's fields.
            return
        # Only these names matter here: compare lengths before case.
        length = len(name)
        if length == 12:
            if name.lower() == b"content-type":
                self._incoming.content_type = value.rstrip(OWS)  # type: ignore[union-attr]  # set in a head
        elif length == 14:
            if name.lower() == b"content-length":
                # llhttp has checked it is all digits (and the only one).
                self._length = int(value)
        elif length == 4:
            if name.lower() == b"host":
                self._hosts += 1
                self._host = value
        elif length == 17:
            if name.lower() == b"transfer-encoding":
                self._te = value if self._te is None else self._te + b"," + value
                refusal = transfer_coding_problem(self._te)
                if refusal is not None and refusal[0] == 501:
                    # Before llhttp's own verdict on the codings (a 400).
                    self.refuse(*refusal)
                    raise _Refused()
        elif length == 6 and name.lower() == b"expect" and value.rstrip(OWS).lower() == b"100-continue":
            self._incoming.expect_continue = True  # type: ignore[union-attr]  # set in a head
        elif length == 11:
            if name.lower() == b"traceparent":
                # W3C trace context (amp.tracing reads it when tracing is on).
                self._incoming.traceparent = value  # type: ignore[union-attr]  # set in a head
        # (User-Agent and Connection have ten letters too: their first is not t.)
        elif length == 10 and name[0] | 0x20 == 0x74 and name.lower() == b"tracestate":
            self._incoming.tracestate = value  # type: ignore[union-attr]  # set in a head

    def on_headers_complete(self) -> None:
        request = self._incoming
        assert request is not None
        self._receive(_BODY, request)
        parser = self._parser
        version = parser.get_http_version()
        if version != "1.1":
            if version != "1.0":
                self.refuse(400, f"request is not valid HTTP/1.1: HTTP version {version} is not supported")
                raise _Refused()
            request.http10 = True
            request.expect_continue = False
        request.method = parser.get_method()
        problem = head_problem(self._hosts, self._host, self._te, request.http10)
        if problem is not None:
            self.refuse(*problem)
            raise _Refused()
        url = self._url
        if not url.startswith(b"/") and b"://" in url:
            target, message = absolute_target(url)
            if target is None:
                self.refuse(400, f"request is not valid HTTP/1.1: {message}")
                raise _Refused()
            url = target
        mark = url.find(b"?")
        if mark < 0:
            request.path = url
        else:
            request.path, request.query = url[:mark], url[mark + 1 :]
        limit = self.factory.max_body
        if self._length > limit:
            self.refuse(413, f"request body of {self._length} bytes is over the {limit} byte limit (listen.max_body)")
            raise _Refused()
        if request.expect_continue and self._current is None and not self._queue:
            request.expect_continue = False
            self.transport.write(_CONTINUE)

    def on_chunk_header(self) -> None:
        self._chunks += 1

    def on_body(self, data: bytes) -> None:
        self._read_body += len(data)
        self._body_size += len(data)
        if self._body_size > self.factory.max_body:
            self.refuse(413, f"request body is over the {self.factory.max_body} byte limit (listen.max_body)")
            raise _Refused()
        self._body.append(data)

    def on_message_complete(self) -> None:
        request = self._incoming
        assert request is not None
        self._receive(_NOTHING, None)
        body = self._body
        if body:
            request.body = body[0] if len(body) == 1 else b"".join(body)
            self._body = []
        request.keep_alive = self._parser.should_keep_alive()
        self._queue.append(request)
        if self._link is _FRESH:
            self._become(_OPEN)
        self._received += 1
        self._kind = _NONE

    # ------------------------------------------------------------ answering

    def _run_queue(self) -> None:
        """
        Answer the requests waiting, in order, each once the one before it
        is answered; then set the timer and reading for what is left.
        """
        if self._running:
            return
        self._running = True
        try:
            queue = self._queue
            while self._current is None and queue and not self._write_paused and self._link < _CLOSED:
                request = queue.popleft()
                if request.refusal is not None:
                    self._write_refusal(*request.refusal)
                    return
                self._current = request
                self._dispatch(request)
        finally:
            self._running = False
        link = self._link
        if link >= _CLOSED:
            return
        if self._current is None:
            incoming = self._incoming
            if incoming is None:
                if not self._queue and link is _CLOSING:
                    # Upgraded, and every request answered.
                    self._close(abort_after=CLOSE_GRACE)
                    return
                if self._kind == _NONE:
                    # Idle from the last answer on (or the first request's
                    # read deadline still runs): bytes that begin no
                    # request do not move it.
                    self._arm(_IDLE, self.factory.idle_timeout)
            elif incoming.expect_continue and self._receiving is _BODY and not self._queue:
                incoming.expect_continue = False
                self.transport.write(_CONTINUE)
        self._set_reading(not self._queue and not self._write_paused)

    def _dispatch(self, request: Request) -> None:
        factory = self.factory
        handler = factory.routes.get(request.path)
        try:
            if handler is None:
                factory.not_found(request)
            else:
                handler(request)
        except Exception:
            self.log.failure("amp internal error answering {method} {path}", method=request.method, path=request.path)
            if self._current is request:
                request.keep_alive = False
                self.respond(request, 500, b"amp internal error\n", TEXT, b"")

    def respond(self, request: Request, code: int, body: bytes, content_type: bytes, headers: bytes) -> None:
        """
        Write C{request}'s answer (L{Request.respond}), then go on with the
        next request or close.
        """
        if request is not self._current or self._link >= _CLOSED:
            return
        self._current = None
        # The last answer on this connection: the client asked for it, or
        # amp is shutting down and nothing more of the client's is here.
        close = not request.keep_alive or (
            (self.factory.draining or self._link is _CLOSING) and not self._queue and self._incoming is None
        )
        if close:
            connection = _CLOSE
        elif request.http10:
            connection = _KEEP_ALIVE
        else:
            connection = b""
        head = b"%sContent-Type: %s\r\nContent-Length: %d\r\n%s%s\r\n" % (
            status_line(code),
            content_type,
            len(body),
            headers,
            connection,
        )
        self.transport.write(head if request.method == b"HEAD" else head + body)
        if self._incoming is None:
            # Idle again from this answer on (see _run_queue).
            self._kind = _NONE
        if close:
            self._close()
        elif not self._running:
            self._run_queue()

    def refuse(self, code: int, message: str) -> None:
        """
        Refuse the request being received with C{code} and C{message}, in
        its turn (after the answers to the requests before it), and close:
        nothing more is parsed (see the module docstring).  The refusal is
        written by the next L{_run_queue}.
        """
        if self._link >= _CLOSING:
            return
        self._become(_CLOSING)
        self._receive(_NOTHING, None)
        # Its deadline is over; waiting to write the refusal (behind an
        # answer, or for a client that does not read) is idle time.
        self._kind = _NONE
        refused(self.factory, code, message)
        request = Request(self)
        request.refusal = (code, message)
        self._queue.append(request)

    def _write_refusal(self, code: int, message: str) -> None:
        self.transport.write(refusal(code, message))
        self._close(abort_after=CLOSE_GRACE)

    def drain(self) -> None:
        """
        The shutdown's part for this connection: requests received in part
        or whole are answered, the last with C{Connection: close}, and so
        is the first request of a connection that has not sent one yet (it
        was accepted to send one; its read deadline still bounds the wait).
        An idle kept-alive connection is closed now, with L{CLOSE_GRACE} to
        take it.
        """
        link = self._link
        if link >= _CLOSED:
            return
        if self._current is not None or self._queue or self._incoming is not None or link is _FRESH:
            return
        self._close(abort_after=CLOSE_GRACE)

    def _close(self, abort_after: Optional[float] = None) -> None:
        """
        Close after what is written; with C{abort_after}, abort if the
        client has not taken the close after that many seconds, and read
        and drop its input meanwhile.
        """
        self._become(_CLOSED)
        self._queue.clear()
        self._receive(_NOTHING, None)
        transport = self.transport
        if self._read_paused:
            self._read_paused = False
            transport.resumeProducing()
        # A TLS transport does not close while a producer is registered.
        transport.unregisterProducer()
        if abort_after is not None:
            self._arm(_LINGER, abort_after)
        else:
            self._kind = _NONE
        transport.loseConnection()

    def _abort(self) -> None:
        self._become(_CLOSED)
        self._kind = _NONE
        self.transport.abortConnection()

    def abort(self) -> None:
        """Abort the connection now (the drain's time is up)."""
        self._abort()

    # ------------------------------------------------------------ flow control

    def _set_reading(self, reading: bool) -> None:
        if reading:
            if self._read_paused:
                self._read_paused = False
                self.transport.resumeProducing()
        elif not self._read_paused:
            self._read_paused = True
            self.transport.pauseProducing()

    def pauseProducing(self) -> None:
        """The transport's buffer is full: stop reading and answering."""
        self._write_paused = True
        if self._link < _CLOSED:
            self._set_reading(False)

    def resumeProducing(self) -> None:
        self._write_paused = False
        if self._link < _CLOSED:
            self._run_queue()

    def stopProducing(self) -> None:
        """The connection is going away; L{connectionLost} follows."""

    # ------------------------------------------------------------ the timer

    def _arm(self, kind: Timer, delay: float) -> None:
        """
        The one timer, for C{kind}, C{delay} seconds from now.  A timer
        already set to fire no later is kept (it sets itself again when it
        fires early).
        """
        clock = self.factory.reactor
        now = clock.seconds()
        when = now + delay
        self._kind = kind
        self._deadline = when
        timer = self._timer
        if timer is None:
            self._timer = clock.callLater(delay_until(now, when), self._expired)
        elif timer.getTime() > when:
            timer.reset(delay_until(now, when))

    def _expired(self) -> None:
        self._timer = None
        kind = self._kind
        if kind == _NONE:
            return
        clock = self.factory.reactor
        now = clock.seconds()
        if now + 1e-9 < self._deadline:
            self._timer = clock.callLater(delay_until(now, self._deadline), self._expired)
            return
        self._kind = _NONE
        if kind == _LINGER:
            self._abort()
        elif kind == _IDLE:
            self._close(abort_after=CLOSE_GRACE)
        elif self._incoming is None:
            # The first request never began (perhaps not even the TLS
            # handshake finished): nothing to answer, just close.
            self.factory.no_request(self)
            self._abort()
        else:
            self.refuse(408, f"request not received within {self.factory.request_timeout:g}s (listen.request_timeout)")
            self._run_queue()
