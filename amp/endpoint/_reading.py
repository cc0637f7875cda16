"""
Reading endpoint replies within their limits.

  - L{read_limited}: a reply body, failed with C{response-too-large} at once
    when its Content-Length is over C{max_response}, else as soon as the
    body passes it; the connection is closed either way.
  - L{Drop}: a body amp will not read (non-2xx replies): its connection is
    closed.
  - L{GuardedConnection}: sits between the transport (TCP, or TLS over it)
    and Twisted's C{HTTP11ClientProtocol} of every connection the client
    opens; it tells the client when the connection opens and closes, and
    remembers when amp started closing it, so that the pool never hands that
    connection out again (L{amp.endpoint._pool}).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from twisted.internet.defer import Deferred, fail
from twisted.internet.interfaces import IProtocol
from twisted.internet.protocol import Protocol
from twisted.protocols.policies import ProtocolWrapper, WrappingFactory
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone
from twisted.web.http import PotentialDataLoss
from twisted.web.iweb import IResponse

from amp.endpoint._failures import EndpointFailure
from amp.reasons import Reason


class _LimitedBody(Protocol):
    """
    Collect a response body, failing and closing the connection as soon as
    it passes C{limit} bytes.
    """

    def __init__(self, finished: Deferred, limit: int) -> None:
        self._finished = finished
        self._limit = limit
        self._chunks: list[bytes] = []
        self._size = 0

    def dataReceived(self, data: bytes) -> None:
        if self._finished.called:
            return
        self._size += len(data)
        if self._size > self._limit:
            self._chunks = []
            # Fail first: a transport may report the loss at once.
            self._finished.errback(Failure(EndpointFailure(
                Reason.RESPONSE_TOO_LARGE, f"reply is larger than the {self._limit} byte limit")))
            self.transport.loseConnection()
            return
        self._chunks.append(data)

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


def read_limited(response: IResponse, limit: int) -> Deferred:
    """
    The body of C{response}, or an L{EndpointFailure} past C{limit} bytes.
    Cancelling the result closes the connection.
    """
    length = response.length
    if isinstance(length, int) and length > limit:
        response.deliverBody(Drop())
        return fail(EndpointFailure(
            Reason.RESPONSE_TOO_LARGE, f"reply of {length} bytes is larger than the {limit} byte limit"))
    collector: _LimitedBody

    def cancel(d: Deferred) -> None:
        if collector.transport is not None:
            collector.transport.loseConnection()

    finished: Deferred = Deferred(cancel)
    collector = _LimitedBody(finished, limit)
    response.deliverBody(collector)
    return finished


class GuardedConnection(ProtocolWrapper):
    """
    One connection of the endpoint client, between its transport and the
    C{HTTP11ClientProtocol} (C{http}) the pool drives.

    It is the HTTP protocol's transport, so every close amp asks for (a body
    it drops or stops reading, a cancelled request, the pool's idle timer)
    passes through here and sets C{disconnecting}, which the pool looks at
    before handing the connection out.
    """

    factory: "GuardedFactory"

    def __init__(self, factory: "GuardedFactory", wrappedProtocol: IProtocol) -> None:
        super().__init__(factory, wrappedProtocol)
        #: The HTTP protocol, kept after the wrapper lets go of it on close.
        self.http = wrappedProtocol
        self._lost_waiters: Optional[list[Deferred]] = None

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

    def connectionLost(self, reason: Failure = None) -> None:  # type: ignore[assignment]
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


class GuardedFactory(WrappingFactory):
    """
    Wraps the pool's HTTP client factory for one new connection; reports the
    connection to C{opened} and C{lost}.
    """

    protocol = GuardedConnection

    def __init__(self, wrapped: Any, opened: Callable[[GuardedConnection], None],
                 lost: Callable[[GuardedConnection], None]) -> None:
        super().__init__(wrapped)
        self._opened = opened
        self._lost = lost

    def registerProtocol(self, p: GuardedConnection) -> None:
        self._opened(p)

    def unregisterProtocol(self, p: GuardedConnection) -> None:
        self._lost(p)
