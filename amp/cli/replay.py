"""
A recorded endpoint reply, served in memory (C{amp explain --reply FILE}).

L{recorded_reply_agent} is an C{IAgent} for L{amp.endpoints.EndpointClient}:
the client sends its request and reads the reply exactly as it does over a
socket (its timer, its size limit, the reply parsing and the naming of every
failure all run), but the request goes to an in-memory HTTP server that
answers every POST with the recorded bytes.  It rests on
C{treq.testing.RequestTraversalAgent}, which connects Twisted's own HTTP
client and server through in-memory transports: no socket, no reactor work.
"""

from __future__ import annotations

from typing import Any

from treq.testing import RequestTraversalAgent
from twisted.web.iweb import IAgent
from twisted.web.resource import Resource
from twisted.web.server import Request

__all__ = ["RecordedReply", "recorded_reply_agent"]


class RecordedReply(Resource):
    """
    Answers every POST with C{body} (status C{code}, JSON), and keeps the
    request bodies it was sent.
    """

    isLeaf = True

    def __init__(self, body: bytes, code: int = 200) -> None:
        super().__init__()
        self.body = body
        self.code = code
        self.requests: list[bytes] = []

    def render_POST(self, request: Request) -> bytes:
        content: Any = request.content
        self.requests.append(content.read() if content is not None else b"")
        request.setResponseCode(self.code)
        request.setHeader(b"content-type", b"application/json")
        return self.body


def recorded_reply_agent(body: bytes, code: int = 200) -> IAgent:
    """
    An agent whose every POST is answered with C{body}.
    """
    return RequestTraversalAgent(RecordedReply(body, code))
