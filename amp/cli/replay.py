"""
A recorded endpoint reply, served in memory (C{amp explain --reply FILE}).

L{RecordedReplyAgent} is the C{IAgent} L{amp.endpoint.EndpointClient} is
given instead of its own connections: the client sends its request and reads
the reply as it does over a socket (its timer, its size limits on the
announced length and on the bytes, the reply parsing and the naming of every
failure all run), but every POST is answered at once, in memory, with the
recorded bytes.  Nothing here touches the network or the reactor.
"""

from __future__ import annotations

from typing import Any, Optional

from twisted.internet.defer import Deferred, succeed
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone
from twisted.web.http import RESPONSES
from twisted.web.http_headers import Headers
from twisted.web.iweb import IAgent, IClientRequest, IResponse
from zope.interface import implementer

__all__ = ["RecordedReplyAgent", "recorded_reply_agent"]


class _Body:
    """
    The consumer a request's body producer writes to.
    """

    def __init__(self) -> None:
        self.chunks: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.chunks.append(data)


class _Transport:
    """
    What a response body protocol may call on its transport.
    """

    def __init__(self) -> None:
        self.lost = False

    def loseConnection(self) -> None:
        self.lost = True

    def stopProducing(self) -> None:
        self.lost = True

    def pauseProducing(self) -> None:
        pass

    def resumeProducing(self) -> None:
        pass


@implementer(IClientRequest)
class _Request:
    def __init__(self, method: bytes, uri: bytes, headers: Headers) -> None:
        self.method = method
        self.absoluteURI = uri
        self.headers = headers


@implementer(IResponse)
class _Response:
    version = (b"HTTP", 1, 1)
    previousResponse = None

    def __init__(self, code: int, body: bytes, request: _Request) -> None:
        self.code = code
        self.phrase = RESPONSES.get(code, b"")
        self.length = len(body)
        self.headers = Headers({b"content-type": [b"application/json"],
                                b"content-length": [str(len(body)).encode("ascii")]})
        self.request = request
        self._body = body

    def deliverBody(self, protocol: Any) -> None:
        transport = _Transport()
        protocol.makeConnection(transport)
        if not transport.lost and self._body:
            protocol.dataReceived(self._body)
        protocol.connectionLost(Failure(ResponseDone("Response body fully received")))

    def setPreviousResponse(self, response: Any) -> None:
        self.previousResponse = response


@implementer(IAgent)
class RecordedReplyAgent:
    """
    Answers every request with C{body} (status C{code}, JSON), and keeps the
    request bodies it was sent.
    """

    def __init__(self, body: bytes, code: int = 200) -> None:
        self.body = body
        self.code = code
        self.requests: list[bytes] = []

    def request(self, method: bytes, uri: bytes, headers: Optional[Headers] = None,
                bodyProducer: Any = None) -> Deferred:
        request = _Request(method, uri, headers if headers is not None else Headers())
        sent = _Body()
        written = bodyProducer.startProducing(sent) if bodyProducer is not None else succeed(None)

        def answer(_: Any) -> _Response:
            self.requests.append(b"".join(sent.chunks))
            return _Response(self.code, self.body, request)

        return written.addCallback(answer)


def recorded_reply_agent(body: bytes, code: int = 200) -> RecordedReplyAgent:
    """
    An agent whose every request is answered with C{body}.
    """
    return RecordedReplyAgent(body, code)
