"""
Least-connections accept for amp's workers (C{workers: N}): one listening
socket shared by every worker, and a small shared table of each worker's
load, so that every new connection goes to the worker with the fewest open
connections.

Why: the API server keeps a few long-lived keep-alive connections, so how
they are spread at accept time is how the load is spread for their whole
life.  A socket per worker with C{SO_REUSEPORT} spreads them by a hash of
the client's address and port (16 connections split 10/6 or worse about
half the time); one shared socket read by every worker gives the whole
burst to the first worker the kernel wakes.

L{LoadTable} (in C{amp._load_table})
    One slot per worker in a shared memory buffer (C{memfd_create}, else
    an unlinked file, and C{mmap}): the worker's open webhook connections (int64) and its
    heartbeat (float64, C{time.monotonic()}, one clock for every process on
    Linux).  Each worker writes only its own slot; worker 0 also clears the
    slot of a child that has exited.  A slot whose heartbeat is zero (not
    started, stopped) or older than L{STALE} seconds (the worker is dead or
    hung) does not count.  L{LoadTable.least}: whether this worker's count
    is at most every live worker's (ties accept, so the least-loaded
    worker always accepts and no connection waits for a worker that never
    will).  A decision reads every slot once: O(N).

L{BalancedPort}
    The listener (C{IListeningPort}) of one worker over the shared socket.
    It reads the socket only while its worker is the least loaded, accepts
    one connection per read and hands it to the reactor
    (C{adoptStreamConnection}), then decides again.  While it is not the
    least loaded it does not read, and decides again every L{RECHECK}
    seconds and whenever one of its own connections closes.  It heartbeats
    every L{HEARTBEAT} seconds.  Accept errors never stop it: a connection
    that failed before it was accepted is skipped; running out of file
    descriptors or memory is logged (limited, L{amp.logs.RepeatLimiter})
    and pauses its accepts for L{ERROR_PAUSE} seconds, during which its
    slot does not count (the other workers take the new connections) and a
    connection already accepted is held, not dropped, and handed over when
    the pause ends.  Stopping (the drain's first step) stops reading,
    clears its slot, accepts every connection already waiting in the
    socket's queue and hands it over, then closes its copy of the socket.
    The kernel completed those connections' handshakes while amp was
    serving, and resets whatever is still queued when the last copy of the
    socket closes; taken over, each gets its first request answered by the
    drain (L{amp.http.HTTPServerFactory.drain}).  Once every worker has stopped, a
    new connection is refused.  Only a connection whose handshake completes
    after the last worker's last accept, or is still under way when it
    closes, is reset, as by any listening socket that closes.

L{WorkerListener}
    The C{IStreamServerEndpoint} of the shared socket, wrapped in TLS like
    any other (L{amp.tls.tls_endpoint}).  Worker 0 binds the socket and
    creates the table (L{WorkerListener.bind}) and passes both descriptors
    to every child it starts (L{WorkerListener.descriptors},
    L{amp.workers}); a child takes them over (L{WorkerListener.inherit})
    and never binds.  Its L{WorkerListener.connections_changed} is the hook
    the webhook listener calls with its open connection count
    (L{amp.http.HTTPServerFactory}), so the table always holds it.

How far this goes: one slot per worker, decisions O(N), one wake-up per
worker per new connection while several are least loaded (one accepts,
the others find nothing).  For the few workers one replica runs that is
nothing; the limit is the 10 ms of a worker that waits for its turn.

Each value in the table is one aligned 8-byte store or load; a reader can
see a value a moment old, never a torn one on x86-64 or ARM64.  A stale
value misleads one decision, and the next (at most L{RECHECK} seconds
later) corrects it.
"""

from __future__ import annotations

import errno
import os
import socket
import time
from typing import TYPE_CHECKING, Any, Callable, Optional

from twisted.internet import address
from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.error import CannotListenError
from twisted.internet.interfaces import (
    IListeningPort,
    IProtocolFactory,
    IReadDescriptor,
    IStreamServerEndpoint,
)
from twisted.internet.task import LoopingCall
from twisted.logger import Logger, LogLevel
from twisted.python.failure import Failure
from zope.interface import implementer

from amp._load_table import HEARTBEAT, SLOT, STALE, LoadTable
from amp.logs import RepeatLimiter

if TYPE_CHECKING:
    from amp.reactors import IAmpReactor

__all__ = [
    "ERROR_PAUSE",
    "HEARTBEAT",
    "RECHECK",
    "SLOT",
    "STALE",
    "STOP_ACCEPTS",
    "BalancedPort",
    "LoadTable",
    "WorkerListener",
]

#: Seconds between decisions while this worker is not the least loaded.
RECHECK = 0.01
#: Seconds a worker stops accepting after running out of file descriptors
#: or memory.
ERROR_PAUSE = 0.1
#: Most connections a stopping worker accepts from the queue: more than
#: the queue holds (the listen backlog, which the kernel caps at
#: net.core.somaxconn, 4096 by default), so a flood still arriving cannot
#: keep it accepting.
STOP_ACCEPTS = 4096

#: accept() errors of one connection that went away before it was
#: accepted (accept(2): "treat them like EAGAIN"): try the next.
_SKIP = frozenset(
    {
        errno.EAGAIN,
        errno.EWOULDBLOCK,
        errno.EINTR,
        errno.ECONNABORTED,
        errno.EPROTO,
        errno.EPERM,
        errno.ENETDOWN,
        errno.ENOPROTOOPT,
        errno.EHOSTDOWN,
        errno.ENONET,
        errno.EHOSTUNREACH,
        errno.EOPNOTSUPP,
        errno.ENETUNREACH,
        errno.ETIMEDOUT,
    }
)
#: Errors of a process short of descriptors or memory: pause.
_SHORTAGE = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})

_WARNINGS = {"accept-failed": "failed accepts on the shared webhook socket"}


@implementer(IListeningPort, IReadDescriptor)
class BalancedPort:
    """
    One worker's listener over the shared socket C{sock} (listening,
    non-blocking), deciding with C{table} when to accept (see the module
    docstring).  Call L{startListening} to start.

    @ivar reading: whether the socket is being read now.
    """

    log = Logger()

    def __init__(self, reactor: IAmpReactor, sock: socket.socket, factory: IProtocolFactory, table: LoadTable) -> None:
        self.reactor = reactor
        self.socket = sock
        self.factory = factory
        self.table = table
        self.family = sock.family
        self.reading = False
        self.listening = False
        self.warnings = RepeatLimiter(self.log, reactor, _WARNINGS, burst=1, interval=60.0)
        self._heartbeat: Optional[LoopingCall] = None
        self._recheck: Any = None
        self._paused: Any = None
        #: A connection accepted but not yet handed over (out of descriptors).
        self._held: Optional[socket.socket] = None

    # ------------------------------------------------------------ IListeningPort

    def startListening(self) -> None:
        if self.listening:
            return
        self.listening = True
        self.factory.doStart()
        host = self.getHost()
        self.log.info(
            "Accepting webhook connections on {host}:{port}, shared by {workers} workers (each new "
            "connection to the one with the fewest)",
            host=host.host,
            port=host.port,
            workers=self.table.workers,
        )
        self.table.beat()
        self._heartbeat = LoopingCall(self._beat)
        self._heartbeat.clock = self.reactor
        self._heartbeat.start(HEARTBEAT, now=False)
        self.decide()

    def stopListening(self) -> Deferred[None]:
        """
        Stop accepting: stop reading, accept and hand over every connection
        already waiting in the queue (L{take_queue}), clear this worker's
        slot, close this copy of the socket.  Connections accepted are not
        touched (the drain handles them).
        """
        return self._stop(take_queue=True)

    def take_queue(self) -> int:
        """
        Accept every connection waiting in the socket's queue now (at most
        L{STOP_ACCEPTS}), whether or not this worker is the least loaded,
        and hand each over; first the one held over from a shortage, if
        any.  At the first shortage of descriptors or memory it stops: the
        connection that found none is closed, the rest stay queued.
        Returns how many were handed over.
        """
        taken = 0
        held, self._held = self._held, None
        if held is not None:
            if not self._adopt(held):
                return taken
            taken += 1
        for _ in range(STOP_ACCEPTS):
            try:
                connection, _ = self.socket.accept()
            except BlockingIOError:
                break
            except OSError as e:
                if e.errno in _SKIP:
                    continue
                break
            if not self._adopt(connection):
                break
            taken += 1
        return taken

    def _stop(self, take_queue: bool) -> Deferred[None]:
        if not self.listening:
            return succeed(None)
        self.listening = False
        self._stop_reading()
        if take_queue:
            self.take_queue()
        for call in (self._recheck, self._paused):
            if call is not None and call.active():
                call.cancel()
        self._recheck = self._paused = None
        if self._heartbeat is not None and self._heartbeat.running:
            self._heartbeat.stop()
        self._heartbeat = None
        self.table.retire()
        if self._held is not None:
            # Held over from a shortage and not taken over (the reactor
            # is shutting down): nothing would serve it.
            self._held.close()
            self._held = None
        self.socket.close()
        self.warnings.flush()
        self.factory.doStop()
        return succeed(None)

    def getHost(self) -> Any:
        host, port = self.socket.getsockname()[:2] if self.socket.fileno() >= 0 else ("", 0)
        if self.family == socket.AF_INET6:
            return address.IPv6Address("TCP", host, port)
        return address.IPv4Address("TCP", host, port)

    # ------------------------------------------------------------ deciding

    def decide(self) -> None:
        """
        Read the socket if this worker is the least loaded, else stop
        reading and decide again in L{RECHECK} seconds.
        """
        if not self.listening or self._paused is not None:
            return
        if self.table.least():
            if self._recheck is not None:
                if self._recheck.active():
                    self._recheck.cancel()
                self._recheck = None
            if not self.reading:
                self.reading = True
                self.reactor.addReader(self)
            return
        self._stop_reading()
        if self._recheck is None:
            self._recheck = self.reactor.callLater(RECHECK, self._rechecked)

    def _rechecked(self) -> None:
        self._recheck = None
        self.decide()

    def _stop_reading(self) -> None:
        if self.reading:
            self.reading = False
            self.reactor.removeReader(self)

    def _beat(self) -> None:
        if self._paused is None:
            self.table.beat()
            self.decide()

    # ------------------------------------------------------------ IReadDescriptor

    def fileno(self) -> int:
        return self.socket.fileno()

    def logPrefix(self) -> str:
        return "BalancedPort"

    def doRead(self) -> None:
        """
        Accept one connection if this worker is still the least loaded,
        hand it over, decide again.
        """
        if not self.table.least():
            self.decide()
            return None
        try:
            connection, _ = self.socket.accept()
        except OSError as e:
            if e.errno not in _SKIP:
                self._failed(e)
            return None
        self._hand_over(connection)
        self.decide()
        return None

    def connectionLost(self, reason: Failure) -> None:
        # The reactor is shutting down (disconnectAll) or gave up on us:
        # nothing accepted now would be served.
        self.reading = False
        self._stop(take_queue=False)

    # ------------------------------------------------------------ handing over

    def _hand_over(self, connection: socket.socket) -> None:
        """
        Give C{connection} to the reactor (which takes a copy of the
        descriptor); ours is closed.  Out of descriptors or memory, it is
        held and handed over after the pause.
        """
        try:
            self._adopt(connection, hold=True)
        except OSError as e:
            self._failed(e)

    def _adopt(self, connection: socket.socket, hold: bool = False) -> bool:
        """
        Give C{connection} to the reactor and close ours; whether there
        was no shortage of descriptors or memory.  On a shortage it is
        closed, or with C{hold} kept as L{_held} and the error raised.
        """
        try:
            connection.setblocking(False)
            self.reactor.adoptStreamConnection(connection.fileno(), self.family, self.factory)  # type: ignore[arg-type]  # any protocol factory
        except OSError as e:
            if e.errno in _SHORTAGE:
                if hold:
                    # No descriptor for the reactor's copy: keep the
                    # connection and try again after the pause.
                    self._held = connection
                    raise
                connection.close()
                return False
            # The client reset it before it could be handed over.
            connection.close()
            return True
        except Exception:
            connection.close()
            self.log.failure("Could not start serving an accepted connection")
            return True
        connection.close()
        return True

    def _failed(self, error: OSError) -> None:
        """
        An accept error that is not one connection's: log it (limited),
        withdraw from the table and pause for L{ERROR_PAUSE} seconds.
        """
        self.warnings.emit(
            "accept-failed",
            LogLevel.error,
            "Could not accept a connection on the webhook port: {error}; not accepting for {pause:g}s "
            "(the other workers take new connections)",
            error=os.strerror(error.errno or 0) or str(error),
            errno=errno.errorcode.get(error.errno or 0, str(error.errno)),
            pause=ERROR_PAUSE,
        )
        self._stop_reading()
        if self._recheck is not None and self._recheck.active():
            self._recheck.cancel()
        self._recheck = None
        self.table.withdraw()
        if self._paused is None:
            self._paused = self.reactor.callLater(ERROR_PAUSE, self._resume)

    def _resume(self) -> None:
        self._paused = None
        held, self._held = self._held, None
        if held is not None:
            self._hand_over(held)
            if self._paused is not None:
                return
        self.table.beat()
        self.decide()


@implementer(IStreamServerEndpoint)
class WorkerListener:
    """
    The webhook endpoint of one worker: the shared socket and load table
    (see the module docstring).  Build it with L{bind} (worker 0) or
    L{inherit} (the others).

    @ivar port: the L{BalancedPort}, once listening.
    @ivar connections: the webhook listener's last reported open connections.
    """

    def __init__(
        self,
        reactor: IAmpReactor,
        worker: int,
        opener: Callable[[], tuple[socket.socket, LoadTable]],
        *,
        interface: str = "",
        port: int = 0,
    ) -> None:
        self.reactor = reactor
        self.worker = worker
        self.interface = interface
        self.port_number = port
        self._opener = opener
        self._socket: Optional[socket.socket] = None
        self.table: Optional[LoadTable] = None
        #: Worker 0: the table's descriptor, kept open for every child it starts.
        self.table_fd: Optional[int] = None
        self.port: Optional[BalancedPort] = None
        self.connections = 0

    @classmethod
    def bind(
        cls,
        reactor: IAmpReactor,
        interface: str,
        port: int,
        workers: int,
        backlog: int = 128,
        now: Callable[[], float] = time.monotonic,
    ) -> "WorkerListener":
        """
        Worker 0's: binds C{interface:port} (IPv6 when C{interface} holds a
        C{:}) and creates the table of C{workers} slots when it first
        listens (or is asked for its descriptors).
        """

        def opener() -> tuple[socket.socket, LoadTable]:
            family = socket.AF_INET6 if ":" in interface else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((interface, port))
                sock.listen(backlog)
                sock.setblocking(False)
                table, listener.table_fd = LoadTable.create(workers, now)
            except BaseException:
                sock.close()
                raise
            return sock, table

        listener = cls(reactor, 0, opener, interface=interface, port=port)
        return listener

    @classmethod
    def inherit(
        cls, reactor: IAmpReactor, worker: int, listen_fd: int, table_fd: int, now: Callable[[], float] = time.monotonic
    ) -> "WorkerListener":
        """
        A child's: takes over, at once, the listening socket C{listen_fd}
        and the table C{table_fd} that worker 0 passed it.

        @raises ValueError: naming the descriptor that is not what it should be.
        """
        try:
            sock = socket.socket(fileno=listen_fd)
        except OSError as e:
            raise ValueError(f"descriptor {listen_fd} is not a socket ({e.strerror})") from None
        try:
            if sock.type != socket.SOCK_STREAM or not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                raise ValueError(f"descriptor {listen_fd} is not a listening TCP socket")
            sock.set_inheritable(False)
            sock.setblocking(False)
            table = LoadTable.inherit(table_fd, worker, now)
        except BaseException:
            sock.detach()
            raise
        listener = cls(reactor, worker, lambda: (sock, table))
        listener._open()
        return listener

    def _open(self) -> tuple[socket.socket, LoadTable]:
        if self._socket is None or self.table is None:
            self._socket, self.table = self._opener()
            self.table.publish(self.connections)
        if self._socket.fileno() < 0:
            raise OSError(errno.EBADF, "the shared webhook socket is closed (the listener has stopped)")
        return self._socket, self.table

    def descriptors(self) -> tuple[int, int]:
        """
        Worker 0: the descriptors of the listening socket and of the load
        table, which every child is started with (L{amp.workers}).

        @raises OSError: the socket cannot be bound, or is closed already.
        """
        sock, _ = self._open()
        if self.table_fd is None:
            raise OSError(errno.EBADF, "only worker 0 passes the shared socket on")
        return sock.fileno(), self.table_fd

    def listen(self, protocolFactory: IProtocolFactory) -> Deferred[IListeningPort]:
        if self.port is not None:
            return fail(CannotListenError(self.interface, self.port_number, OSError(errno.EBUSY, "already listening")))
        try:
            sock, table = self._open()
        except OSError as e:
            return fail(CannotListenError(self.interface, self.port_number, e))
        self.port = BalancedPort(self.reactor, sock, protocolFactory, table)
        self.port.startListening()
        return succeed(self.port)

    def connections_changed(self, count: int) -> None:
        """
        The webhook listener's hook: it has C{count} open connections now.
        Published to the table; one fewer may make this worker the least
        loaded.
        """
        previous, self.connections = self.connections, count
        if self.table is not None:
            self.table.publish(count)
        port = self.port
        if port is not None and count < previous:
            port.decide()

    def worker_exited(self, worker: int) -> None:
        """Worker 0: child C{worker} has exited; its slot stops counting now."""
        if self.table is not None:
            self.table.retire(worker)
