"""
amp's own HTTP/1.1, on Twisted's reactor and TLS, parsed by llhttp (the
C{httptools} package): the hot path of every review.

The webhook listener (L{HTTPServerFactory}, L{HTTPServerProtocol}) answers
the API server; a handler gets each L{Request} received in full and answers
it with L{Request.respond}.  The machinery is in the private modules beside
this one: C{_server} (a connection), C{_refusal} (its refusals),
C{_factory} (the listener, its counts and drain), C{_request} (a request),
C{_limits} (the fixed limits).

The endpoint client's side: L{ClientConnection} (C{_client}), one
connection's requests and their replies, read within their limits while
they arrive; L{OriginPool} (C{_pool}), the idle connections to one origin
and the one retry on a reused connection, each request an L{Exchange}
whose outcome goes to an L{IReceiver} (or a Deferred); C{_replyhead}, bounding a reply's
head while it arrives, and the reply budget shared by every call
(L{ReplyBudget}).
"""

from amp.http._client import (
    BodyTooLarge,
    BufferFull,
    ClientConnection,
    ConnectionClosed,
    HeadTooLarge,
    MalformedReply,
    Reply,
    ReplyFailed,
)
from amp.http._factory import HTTPServerFactory
from amp.http._limits import (
    CLOSE_GRACE,
    LINGER_BYTES,
    MAX_HEAD_BYTES,
    MAX_HEADERS,
    MAX_LINE,
    WARNING_BURST,
    WARNING_INTERVAL,
    WARNING_KINDS,
)
from amp.http._pool import DeferredReceiver, Exchange, IReceiver, OriginPool
from amp.http._replyhead import Charge, ReplyBudget, ReplyLimits
from amp.http._request import TEXT, Handler, IChannel, IConnection, IListener, Request, query_parameter
from amp.http._server import HTTPServerProtocol

__all__ = [
    "BodyTooLarge",
    "BufferFull",
    "CLOSE_GRACE",
    "Charge",
    "ClientConnection",
    "ConnectionClosed",
    "DeferredReceiver",
    "Exchange",
    "Handler",
    "HTTPServerFactory",
    "HTTPServerProtocol",
    "HeadTooLarge",
    "IChannel",
    "IConnection",
    "IListener",
    "IReceiver",
    "LINGER_BYTES",
    "MAX_HEAD_BYTES",
    "MAX_HEADERS",
    "MAX_LINE",
    "MalformedReply",
    "OriginPool",
    "Reply",
    "ReplyBudget",
    "ReplyFailed",
    "ReplyLimits",
    "Request",
    "TEXT",
    "WARNING_BURST",
    "WARNING_INTERVAL",
    "WARNING_KINDS",
    "query_parameter",
]
