"""
A recorded endpoint reply, served in memory (C{amp explain --reply FILE}).

L{RecordedReply} is the connector L{amp.endpoint.EndpointClient} is given
instead of its own TCP and TLS: the client sends its request and reads the
reply as it does over a socket (its pool, its timer, its limits on the
head, the announced length and the bytes, the reply parsing and the naming
of every failure all run), but each request is answered at once, in memory,
with the recorded bytes as an HTTP/1.1 reply.  Nothing here touches the
network or the reactor.
"""

from __future__ import annotations

from typing import Any

from httptools import HttpParserError, HttpRequestParser
from twisted.internet.address import IPv4Address
from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.error import ConnectionDone, NoProtocol
from twisted.internet.interfaces import IProtocol, IProtocolFactory, IStreamClientEndpoint, ITransport
from twisted.python.failure import Failure
from twisted.web.http import RESPONSES
from zope.interface import implementer

__all__ = ["RecordedReply", "recorded_reply"]

_ADDRESS = IPv4Address("TCP", "127.0.0.1", 0)


@implementer(ITransport)
class _Transport:
    """
    The client's end of an in-memory connection: each whole request
    written is answered with the recorded reply, at once.
    """

    disconnecting = False

    def __init__(self, served: "RecordedReply", protocol: Any) -> None:
        self._served = served
        self._protocol = protocol
        self._parser = HttpRequestParser(self)
        self._body: list[bytes] = []
        self._answer = False

    # httptools' callbacks for the requests the client writes.
    def on_body(self, data: bytes) -> None:
        self._body.append(data)

    def on_message_complete(self) -> None:
        self._served.requests.append(b"".join(self._body))
        self._body = []
        self._answer = True

    def write(self, data: bytes) -> None:
        if self.disconnecting:
            return
        try:
            self._parser.feed_data(data)
        except HttpParserError:
            self.loseConnection()
            return
        if self._answer:
            self._answer = False
            self._protocol.dataReceived(self._served.reply)

    def writeSequence(self, data: Any) -> None:
        self.write(b"".join(data))

    def loseConnection(self) -> None:
        if not self.disconnecting:
            self.disconnecting = True
            self._protocol.connectionLost(Failure(ConnectionDone()))

    abortConnection = loseConnection

    def getPeer(self) -> IPv4Address:
        return _ADDRESS

    def getHost(self) -> IPv4Address:
        return _ADDRESS


@implementer(IStreamClientEndpoint)
class _Endpoint:
    def __init__(self, served: "RecordedReply") -> None:
        self._served = served

    def connect(self, factory: IProtocolFactory) -> Deferred[IProtocol]:
        protocol = factory.buildProtocol(_ADDRESS)
        if protocol is None:
            return fail(NoProtocol())
        protocol.makeConnection(_Transport(self._served, protocol))
        return succeed(protocol)


class RecordedReply:
    """
    Answers every request with C{body} (status C{code}, JSON), and keeps
    the request bodies it was sent (C{requests}).  Called with a scheme, a
    host and a port, it is an L{amp.endpoint.Connector}.
    """

    def __init__(self, body: bytes, code: int = 200) -> None:
        self.body = body
        self.code = code
        self.requests: list[bytes] = []
        phrase = RESPONSES.get(code, b"Reply")
        #: The reply's bytes on the wire.
        self.reply = b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
            code,
            phrase,
            len(body),
            body,
        )

    def __call__(self, scheme: bytes, host: str, port: int) -> IStreamClientEndpoint:
        return _Endpoint(self)


def recorded_reply(body: bytes, code: int = 200) -> RecordedReply:
    """
    A connector whose every request is answered with C{body}.
    """
    return RecordedReply(body, code)
