"""
amp's own HTTP/1.1 on its hot path, parsed by llhttp (the C{httptools}
package) on Twisted's reactor and transports.

The endpoint client's side:

  - L{amp.http._client}: L{ClientConnection}, one connection's requests and
    replies, read within their limits while they arrive.
  - L{amp.http._pool}: L{OriginPool}, the idle connections to one origin and
    the one retry on a reused connection.
  - L{amp.http._replyhead}: bounding a reply's head while it arrives, and
    the reply budget shared by every call (L{ReplyBudget}).
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
from amp.http._pool import OriginPool
from amp.http._replyhead import Charge, ReplyBudget, ReplyLimits

__all__ = [
    "BodyTooLarge", "BufferFull", "Charge", "ClientConnection", "ConnectionClosed", "HeadTooLarge",
    "MalformedReply", "OriginPool", "Reply", "ReplyBudget", "ReplyFailed", "ReplyLimits",
]
