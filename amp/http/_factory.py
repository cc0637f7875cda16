"""
The webhook listener's factory: its routes, the limits of C{listen.*}, the
count of open connections (and the hook that publishes it to the other
workers), the repeated-warning limiter, and the graceful drain.

L{HTTPServerFactory.drain} is the listener's part of a graceful shutdown
(the listening port is already closed): idle kept-alive connections are
closed at once, a connection with a request in progress gets its answer
with C{Connection: close} and is closed after it, a connection that has not
sent its first request yet (one accepted as the port closed, or just
before) may still send it within C{listen.request_timeout} of being
accepted and is answered the same way, and whatever is still open when the
drain's time is up is aborted.
"""

from __future__ import annotations

from typing import Callable, Optional

from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IAddress, IDelayedCall, IReactorTime
from twisted.internet.protocol import Factory
from twisted.logger import Logger, LogLevel

from amp.config import ListenConfig
from amp.http._limits import WARNING_BURST, WARNING_INTERVAL, WARNING_KINDS
from amp.http._request import Handler, IConnection, Request
from amp.http._server import HTTPServerProtocol
from amp.logs import RepeatLimiter
from amp.metrics import Metrics


def _not_found(request: Request) -> None:
    request.plain(404, "Not Found")


class HTTPServerFactory(Factory):
    """
    Builds L{HTTPServerProtocol}s that answer C{routes}: a request whose
    path (without its query) is a key is given to that handler, any other
    to C{not_found}.
    """

    logger = Logger()

    def __init__(
        self,
        routes: dict[bytes, Handler],
        *,
        reactor: IReactorTime,
        metrics: Metrics,
        max_body: int,
        max_connections: int,
        request_timeout: float,
        idle_timeout: float,
        not_found: Handler = _not_found,
        on_connections: Optional[Callable[[int], None]] = None,
    ) -> None:
        """
        @param on_connections: called with L{open_connections} every time
            it changes (with workers, L{amp.balance.WorkerListener} publishes
            it to the other workers).
        """
        self.routes = routes
        self.not_found = not_found
        self.reactor = reactor
        self.metrics = metrics
        self.max_body = max_body
        self.max_connections = max_connections
        self.request_timeout = request_timeout
        self.idle_timeout = idle_timeout
        #: Connections accepted and not refused, still open.
        self.open_connections = 0
        self.on_connections = on_connections
        #: The listener's repeated warnings, limited.
        self.warnings = RepeatLimiter(
            self.logger, reactor, WARNING_KINDS, burst=WARNING_BURST, interval=WARNING_INTERVAL
        )
        #: The connections counted in C{open_connections}.
        self.connections: set[IConnection] = set()
        #: Set by L{drain}: every answer closes its connection, and a
        #: connection accepted now is closed at once.
        self.draining = False
        self._drained: Optional[Deferred[int]] = None
        self._drain_timer: Optional[IDelayedCall] = None

    def buildProtocol(self, addr: Optional[IAddress]) -> HTTPServerProtocol:
        return HTTPServerProtocol(self)

    def connection_made(self, connection: IConnection) -> bool:
        """
        Count C{connection} in, or say it must be closed at once (the
        listener is draining, or C{listen.max_connections} are open).
        """
        if self.draining:
            # Accepted just before the port closed: nothing of it was received.
            self.metrics.connections_dropped.labels("shutting-down").inc()
            return False
        if self.open_connections >= self.max_connections:
            self.metrics.connections_dropped.labels("max-connections").inc()
            self.warnings.emit(
                "connections-refused",
                LogLevel.warn,
                "Connection refused: {count} connections open (listen.max_connections)",
                count=self.open_connections,
            )
            return False
        self.connections.add(connection)
        self._count(1)
        return True

    def connection_lost(self, connection: IConnection) -> None:
        self.connections.discard(connection)
        self._count(-1)
        timer = self._drain_timer
        if self._drained is not None and not self.connections and timer is not None and timer.active():
            timer.cancel()
            self._drained.callback(0)

    def _count(self, change: int) -> None:
        self.open_connections += change
        self.metrics.open_connections.set(self.open_connections)
        if self.on_connections is not None:
            self.on_connections(self.open_connections)

    def no_request(self, connection: IConnection) -> None:
        """C{connection} sent no request within C{listen.request_timeout}."""
        self.metrics.connections_dropped.labels("no-request").inc()
        self.warnings.emit(
            "timed-out",
            LogLevel.info,
            "Closed a connection that sent no request within {timeout:g}s (listen.request_timeout)",
            timeout=self.request_timeout,
        )

    def drain(self, timeout: float) -> "Deferred[int]":
        """
        Finish with every open connection (L{HTTPServerProtocol.drain}):
        fires once all are closed, or after C{timeout} seconds, when those
        still open are aborted.  Fires with how many were aborted.  Call it
        once the listening port is closed.
        """
        self.draining = True
        if self._drained is not None:
            return self._drained
        for connection in list(self.connections):
            connection.drain()
        if not self.connections:
            return succeed(0)
        self._drained = Deferred()
        self._drain_timer = self.reactor.callLater(timeout, self._drain_timed_out, timeout)
        return self._drained

    def _drain_timed_out(self, timeout: float) -> None:
        left = list(self.connections)
        self.logger.warn(
            "Drain: {count} connections still open after {timeout:g}s (listen.drain_timeout), aborted",
            count=len(left),
            timeout=timeout,
        )
        for connection in left:
            connection.abort()
        assert self._drained is not None
        self._drained.callback(len(left))

    def apply(self, listen: ListenConfig) -> None:
        """
        The limits of a reloaded C{listen} section, for every request and
        connection from now on.
        """
        self.max_body = listen.max_body
        self.max_connections = listen.max_connections
        self.request_timeout = listen.request_timeout
        self.idle_timeout = listen.idle_timeout

    def stopFactory(self) -> None:
        self.warnings.flush()
