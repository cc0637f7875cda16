"""
Pooled connections to one origin: L{OriginPool}, and L{Exchange}, one
request through it.

A request goes out on the connection that became idle last, or on a new
one from the pool's connect endpoint.  Its outcome goes to the
L{IReceiver} the caller gives L{OriginPool.send} (the endpoint call's hot
path: no Deferred between the connection and the call), or to the Deferred
of L{OriginPool.request}.  After a whole reply that allows it
(L{ClientConnection.reusable}) the connection comes back; the pool keeps
at most C{size} idle, closing the oldest beyond that, and closes any idle
for C{idle_timeout} seconds.  Busy connections are not bounded here (the
caller's bulkhead does that), and nothing waits for a connection.

One retry, and only this one: a request sent on a reused idle connection
that closes before any byte of a reply arrived is sent again on a new
connection.  The peer closed an idle connection while the request was on
its way (an idle timeout that raced the request); it never read it.  The
retry runs within the same call, under the same deadline, and the caller
sees one outcome.  A request on a new connection is never sent twice.
"""

from __future__ import annotations

from typing import Callable, Generic, Optional, TypeVar, cast
from typing import Protocol as TypingProtocol

from twisted.internet.defer import Deferred, gatherResults
from twisted.internet.interfaces import IAddress, IDelayedCall, IReactorTime, IStreamClientEndpoint
from twisted.internet.protocol import Factory
from twisted.python.failure import Failure

from amp.http._client import ClientConnection, ConnectionClosed, Reply, ReplyFailed
from amp.http._replyhead import Charge, ReplyLimits


class IReceiver(TypingProtocol):
    """
    Where the outcome of one request through an L{OriginPool} goes: exactly
    one of these is called, once, unless the exchange is cancelled first
    (then neither is).
    """

    def replied(self, reply: Reply) -> None:
        """The reply arrived (its body read when 2xx)."""

    def failed(self, failure: Failure) -> None:
        """No reply: a L{ReplyFailed}, or why no connection could be made."""


_T = TypeVar("_T")


class Cancellable(TypingProtocol):
    """What a L{DeferredReceiver} cancels: an L{Exchange}, a review."""

    def cancel(self) -> None:
        """Stop; tell the receiver nothing more."""


class DeferredReceiver(Generic[_T]):
    """
    The Deferred form of a receiver: C{result} fires with the reply or
    fails with the failure, and cancelling it cancels C{cancels} (what the
    receiver was given to, when it waits: an L{Exchange}, a review).  For
    L{OriginPool.request} and L{amp.admission.Admitter.review}, whose
    receivers' methods have the same names (C{replied}, and C{failed} where
    a failure is possible).  An endpoint call's Deferred is
    L{amp.endpoint.deferred_call}'s, which also times it.
    """

    __slots__ = ("result", "cancels")

    def __init__(self) -> None:
        #: What to cancel with the result; set once the receiver waits on it.
        self.cancels: Optional[Cancellable] = None
        self.result: Deferred[_T] = Deferred(self._cancel)

    def _cancel(self, result: Deferred[_T]) -> None:
        if self.cancels is not None:
            self.cancels.cancel()

    def replied(self, reply: _T) -> None:
        self.result.callback(reply)

    def failed(self, failure: Failure) -> None:
        self.result.errback(failure)


class _ConnectionFactory(Factory):
    """
    Builds the pool's connections.
    """

    noisy = False

    def __init__(self, pool: "OriginPool") -> None:
        self._pool = pool

    def buildProtocol(self, addr: Optional[IAddress]) -> ClientConnection:
        pool = self._pool
        conn = ClientConnection(pool.limits, pool.opened, pool.lost)
        conn.pool = pool
        return conn


class OriginPool:
    """
    The connections to one origin (scheme, host, port) under one settings
    profile.

    @param endpoint: where new connections come from.
    @param size: idle connections kept at most (C{pool_size}).
    @param idle_timeout: seconds an idle connection is kept.
    @param opened: called with each new connection.
    @param lost: called with each connection that closed.
    @ivar keep: idle connections are kept; False closes each as it comes
        back, and requests ask the peer to close too.
    """

    def __init__(
        self,
        clock: IReactorTime,
        endpoint: IStreamClientEndpoint,
        limits: ReplyLimits,
        size: int,
        idle_timeout: float,
        opened: Callable[[ClientConnection], None],
        lost: Callable[[ClientConnection], None],
    ) -> None:
        self._clock = clock
        self._endpoint = endpoint
        self.limits = limits
        self._size = size
        self._timeout = idle_timeout
        self._opened = opened
        self._lost = lost
        self._factory = _ConnectionFactory(self)
        #: Idle connections, the one idle longest first.
        self._idle: list[ClientConnection] = []
        self._sweep: Optional[IDelayedCall] = None
        self.keep = True

    def request(self, data: bytes, charge: Charge) -> "Deferred[Reply]":
        """
        Send C{data} (a whole request) and read its reply, whose body takes
        from C{charge}.  Fails with a L{ReplyFailed}, or with why no
        connection could be made; cancelling it closes the connection.
        """
        receiver: DeferredReceiver[Reply] = DeferredReceiver()
        receiver.cancels = self.send(data, charge, receiver)
        return receiver.result

    def send(self, data: bytes, charge: Charge, receiver: IReceiver) -> "Exchange":
        """
        L{request}, its outcome told to C{receiver} (possibly before this
        returns, when no connection can be made at once); the L{Exchange}'s
        C{cancel} closes the connection and tells nothing more.
        """
        exchange = Exchange(self, data, charge, receiver)
        idle = self._idle
        while idle:
            conn = idle.pop()
            if conn.reusable:
                exchange.send(conn, reused=True)
                return exchange
        exchange.connect()
        return exchange

    def connect(self) -> Deferred[ClientConnection]:
        """
        A new connection (fires with its L{ClientConnection}).
        """
        # The factory builds ClientConnections; the endpoint's interface says IProtocol.
        return cast("Deferred[ClientConnection]", self._endpoint.connect(self._factory))

    def idle_count(self) -> int:
        return len(self._idle)

    # ------------------------------------------------------------ connections' side

    def opened(self, conn: ClientConnection) -> None:
        self._opened(conn)

    def lost(self, conn: ClientConnection) -> None:
        try:
            self._idle.remove(conn)
        except ValueError:
            pass
        self._lost(conn)

    def idle(self, conn: ClientConnection) -> None:
        """
        C{conn} finished a reply that allows another request.
        """
        if not self.keep:
            conn.close()
            return
        now = self._clock.seconds()
        conn.idle_since = now
        idle = self._idle
        idle.append(conn)
        if len(idle) > self._size:
            idle.pop(0).close()
        if self._sweep is None and idle:
            self._sweep = self._clock.callLater(self._timeout, self._expire)

    def _expire(self) -> None:
        self._sweep = None
        now = self._clock.seconds()
        idle = self._idle
        while idle and idle[0].idle_since + self._timeout <= now:
            idle.pop(0).close()
        if idle:
            self._sweep = self._clock.callLater(idle[0].idle_since + self._timeout - now, self._expire)

    def close_idle(self) -> Deferred[list[None]]:
        """
        Close every idle connection; fires when they have closed.
        """
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        idle, self._idle = self._idle, []
        waits = [c.when_lost() for c in idle]
        for c in idle:
            c.close()
        return gatherResults(waits)


class Exchange:
    """
    One request through an L{OriginPool}: the connection it is on, the one
    retry, and where its outcome goes (an L{IReceiver}).
    """

    __slots__ = (
        "_pool",
        "data",
        "charge",
        "_receiver",
        "_conn",
        "_connecting",
        "_reused",
        "_cancelled",
        "finished",
        "resends",
    )

    def __init__(self, pool: OriginPool, data: bytes, charge: Charge, receiver: IReceiver) -> None:
        self._pool = pool
        self.data = data
        self.charge = charge
        self._receiver = receiver
        #: The receiver was told the outcome (or the exchange was cancelled).
        self.finished = False
        self._conn: Optional[ClientConnection] = None
        self._connecting: Optional[Deferred[ClientConnection]] = None
        self._reused = False
        self._cancelled = False
        #: Times the request was sent again on a new connection (the one retry below).
        self.resends = 0

    @property
    def reused(self) -> bool:
        """The request went out on a pooled idle connection (not one made for it)."""
        return self._reused

    def send(self, conn: ClientConnection, reused: bool) -> None:
        self._conn = conn
        self._reused = reused
        conn.request(self)

    def connect(self) -> None:
        self._reused = False
        d = self._connecting = self._pool.connect()
        d.addCallbacks(self._connected, self._not_connected)

    def _connected(self, conn: ClientConnection) -> None:
        self._connecting = None
        if self._cancelled:
            conn.close()
            return
        self.send(conn, reused=False)

    def _not_connected(self, failure: Failure) -> None:
        self._connecting = None
        if not self._cancelled:
            self.finished = True
            self._receiver.failed(failure)

    def replied(self, reply: Reply) -> None:
        if not self._cancelled:
            self.finished = True
            self._receiver.replied(reply)

    def failed(self, failure: ReplyFailed, replying: bool) -> None:
        if self._cancelled:
            return
        if self._reused and not replying and isinstance(failure, ConnectionClosed):
            # The peer closed the idle connection as the request went out.
            self.resends += 1
            self.connect()
            return
        self.finished = True
        self._receiver.failed(Failure(failure))

    def cancel(self) -> None:
        """
        Give up on the request: a connection being made is abandoned, the
        one the request is on is closed, and the receiver is told nothing.
        """
        if self._cancelled:
            return
        self._cancelled = self.finished = True
        if self._connecting is not None:
            connecting, self._connecting = self._connecting, None
            connecting.cancel()
        elif self._conn is not None:
            self._conn.abort()
