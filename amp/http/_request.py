"""
One request as the webhook listener hands it to a handler: what a handler
reads (method, path, query, Content-Type, body) and how it answers
(L{Request.respond}), once, now or later.

A request is received whole before its handler runs: the body is in memory,
capped by C{listen.max_body} while it arrived.  A handler that answers later
(a review waiting on its endpoint) keeps the request; if the client goes
away first, L{Request.disconnected} is set and L{Request.review} (anything
with a C{cancel()}: a review, a Deferred) is cancelled, and a later
L{Request.respond} does nothing.
"""

from __future__ import annotations

from collections import deque
from typing import Callable, Mapping, Optional
from typing import Protocol as TypingProtocol
from urllib.parse import unquote_to_bytes

from twisted.internet.interfaces import IConsumer, IPushProducer, IReactorTime, ITCPTransport

from amp.logs import RepeatLimiter
from amp.metrics import Metrics

#: The Content-Type of amp's plain-text answers.
TEXT = b"text/plain; charset=utf-8"

#: A handler: answers the request it is given (L{Request.respond}), now or
#: later.
Handler = Callable[["Request"], None]


class ICancellable(TypingProtocol):
    """What answers a request later: cancelled if the client goes away first."""

    def cancel(self) -> None:
        """The client went away: stop, the answer is not read."""


class IConnection(TypingProtocol):
    """What the listener needs of a connection it counts (L{amp.http.HTTPServerProtocol})."""

    def drain(self) -> None:
        """The listener is shutting down: finish what was asked, then close."""

    def abort(self) -> None:
        """The drain's time is up: abort now."""


class IListener(TypingProtocol):
    """
    What a connection needs of its listener (L{amp.http.HTTPServerFactory}),
    and all it may reach: the connection names no listener class, and the
    listener's module imports the connection's, never the other way.
    """

    @property
    def reactor(self) -> IReactorTime:
        """The clock of every timer of the connection's."""

    @property
    def metrics(self) -> Metrics:
        """Where refusals are counted."""

    @property
    def warnings(self) -> RepeatLimiter:
        """The listener's repeated warnings, limited."""

    @property
    def routes(self) -> Mapping[bytes, Handler]:
        """Path (without its query) -> its handler."""

    @property
    def not_found(self) -> Handler:
        """The handler of any other path."""

    @property
    def max_body(self) -> int:
        """C{listen.max_body}."""

    @property
    def request_timeout(self) -> float:
        """C{listen.request_timeout}, seconds."""

    @property
    def idle_timeout(self) -> float:
        """C{listen.idle_timeout}, seconds."""

    @property
    def draining(self) -> bool:
        """The listener is shutting down: every answer closes its connection."""

    def connection_made(self, connection: IConnection) -> bool:
        """Count C{connection} in; False if it must be closed at once."""

    def connection_lost(self, connection: IConnection) -> None:
        """C{connection}, counted in, is gone."""

    def no_request(self, connection: IConnection) -> None:
        """C{connection} sent no request within C{request_timeout}."""


class IChannel(TypingProtocol):
    """What a request needs of the connection it arrived on."""

    @property
    def factory(self) -> IListener:
        """The listener the connection belongs to."""

    def respond(self, request: Request, code: int, body: bytes, content_type: bytes, headers: bytes) -> None:
        """Write C{request}'s answer in its turn (only its first counts)."""


class IServerTransport(ITCPTransport, IPushProducer, IConsumer):
    """
    A webhook connection's transport (TCP, or TLS over it): one amp writes
    to, aborts, pauses while its answers wait (it is their producer's
    consumer) and stops reading from while amp's own writes wait.
    """


class Request:
    """
    A request received in full.

    @ivar method: the method, as sent (C{b"POST"}).
    @ivar path: the request target up to its C{?}.
    @ivar query: the request target after its C{?} (C{b""} if none).
    @ivar content_type: the Content-Type header's value, C{b""} if none.
    @ivar body: the body.
    @ivar review: what answers this request later (L{ICancellable}: the
        review in progress), cancelled if the client goes away before the
        answer; set by the handler.
    @ivar disconnected: the client went away before the answer.
    @ivar traceparent: the W3C C{traceparent} header's value, or None.
    @ivar tracestate: the W3C C{tracestate} header's value, or None.
    """

    __slots__ = (
        "method",
        "path",
        "query",
        "content_type",
        "body",
        "keep_alive",
        "http10",
        "expect_continue",
        "refusal",
        "review",
        "disconnected",
        "channel",
        "traceparent",
        "tracestate",
    )

    def __init__(self, channel: IChannel) -> None:
        self.channel = channel
        self.method = b""
        self.path = b""
        self.query = b""
        self.content_type = b""
        self.body = b""
        self.keep_alive = True
        self.http10 = False
        self.expect_continue = False
        #: (code, message) of a refusal in this request's place in line.
        self.refusal: Optional[tuple[int, str]] = None
        self.review: Optional[ICancellable] = None
        self.disconnected = False
        self.traceparent: Optional[bytes] = None
        self.tracestate: Optional[bytes] = None

    def respond(self, code: int, body: bytes, content_type: bytes = TEXT, headers: bytes = b"") -> None:
        """
        Answer with status C{code} and C{body}; C{headers} are extra header
        lines, each ending in CRLF.  Only the first answer counts, and none
        after the client went away.
        """
        self.channel.respond(self, code, body, content_type, headers)

    def plain(self, code: int, message: str, headers: bytes = b"") -> None:
        """
        Answer C{code} with C{message} and a newline as plain text.
        """
        self.channel.respond(self, code, message.encode("utf-8") + b"\n", TEXT, headers)

    @property
    def server(self) -> IListener:
        """The listener (L{amp.http.HTTPServerFactory}) this request arrived on."""
        return self.channel.factory


def client_gone(current: Optional[Request], waiting: deque[Request]) -> None:
    """
    The connection is lost: the request being answered (C{current}) and
    those C{waiting} (emptied) are L{Request.disconnected}, and what answers
    each (L{Request.review}) is cancelled.
    """
    pending = list(waiting)
    waiting.clear()
    if current is not None:
        pending.insert(0, current)
    for request in pending:
        request.disconnected = True
        review, request.review = request.review, None
        if review is not None:
            review.cancel()


def query_parameter(query: bytes, name: bytes) -> Optional[bytes]:
    """
    The value of the first C{name=value} in C{query}, percent-decoded
    (C{+} is a space), or None if C{query} has none.
    """
    prefix = name + b"="
    for part in query.split(b"&"):
        if part.startswith(prefix):
            value = part[len(prefix) :]
            if b"%" in value or b"+" in value:
                value = unquote_to_bytes(value.replace(b"+", b" "))
            return value
    return None
