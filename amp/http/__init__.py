"""
amp's own HTTP/1.1, on Twisted's reactor and TLS, parsed by llhttp (the
C{httptools} package): the hot path of every review.

The webhook listener (L{HTTPServerFactory}, L{HTTPServerProtocol}) answers
the API server; a handler gets each L{Request} received in full and answers
it with L{Request.respond}.  The machinery is in the private modules beside
this one: C{_server} (a connection), C{_factory} (the listener, its counts
and drain), C{_request} (a request), C{_limits} (the fixed limits).
"""

from amp.http._factory import Handler, HTTPServerFactory
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
from amp.http._request import TEXT, Request, query_parameter
from amp.http._server import HTTPServerProtocol

__all__ = [
    "CLOSE_GRACE",
    "Handler",
    "HTTPServerFactory",
    "HTTPServerProtocol",
    "LINGER_BYTES",
    "MAX_HEAD_BYTES",
    "MAX_HEADERS",
    "MAX_LINE",
    "Request",
    "TEXT",
    "WARNING_BURST",
    "WARNING_INTERVAL",
    "WARNING_KINDS",
    "query_parameter",
]
