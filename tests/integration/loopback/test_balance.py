"""
Tests for L{amp.balance}: the workers' load table, the least-connections
listener over the shared socket (driven by hand on a L{MemoryReactorClock}
with real loopback sockets), and two listeners sharing one socket on the
real reactor.
"""

from __future__ import annotations

import errno
import os
import socket
from typing import Any, Callable, Optional

import pytest
from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.internet.error import CannotListenError
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.testing import MemoryReactorClock
from twisted.logger import LogLevel, globalLogPublisher
from twisted.trial.unittest import TestCase

from amp.balance import ERROR_PAUSE, HEARTBEAT, RECHECK, SLOT, STALE, BalancedPort, LoadTable, WorkerListener
from amp.tls import ReloadingCertificate, tls_endpoint
from tests.support.helpers import dev_tls, tls_exchange
from tests.support.waiting import wait_until


class _Now:
    """A settable clock for the table."""

    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _views(workers: int, now: Callable[[], float]) -> list[LoadTable]:
    """Every worker's view of one table in ordinary memory."""
    buffer = bytearray(workers * SLOT)
    return [LoadTable(buffer, i, now) for i in range(workers)]


# ---------------------------------------------------------------- the table


def test_the_least_loaded_live_worker_accepts() -> None:
    now = _Now()
    views = _views(3, now)
    for view, count in zip(views, (4, 2, 3)):
        view.publish(count)
        view.beat()
    assert [v.least() for v in views] == [False, True, False]
    assert views[0].loads() == [4, 2, 3]


def test_ties_accept() -> None:
    now = _Now()
    views = _views(3, now)
    for view, count in zip(views, (2, 2, 5)):
        view.publish(count)
        view.beat()
    assert [v.least() for v in views] == [True, True, False]


def test_stale_heartbeats_are_ignored() -> None:
    now = _Now()
    a, b = _views(2, now)
    a.publish(5)
    a.beat()
    b.publish(0)
    b.beat()
    assert not a.least()
    now.t += STALE
    assert not a.least(), "a heartbeat exactly STALE old still counts"
    now.t += 0.001
    assert a.least(), "a worker that stopped beating is dead or hung"
    assert a.loads() == [5, None]
    assert b.least(), "a worker always counts itself"
    b.beat()
    assert not a.least()


def test_a_slot_never_started_withdrawn_or_retired_does_not_count() -> None:
    now = _Now()
    a, b, c = _views(3, now)
    a.publish(3)
    a.beat()
    assert a.least(), "workers 1 and 2 have not started"
    b.publish(1)
    b.beat()
    assert not a.least()
    b.withdraw()
    assert a.least()
    b.beat()
    assert not a.least()
    a.retire(1)
    assert a.least()
    assert a.loads() == [3, None, None]
    a.retire()
    assert a.loads() == [0, None, None]


def test_a_table_is_shared_through_its_descriptor() -> None:
    now = _Now()
    first, fd = LoadTable.create(3, now)
    try:
        assert os.get_inheritable(fd) is False
        third = LoadTable.inherit(os.dup(fd), 2, now)
        first.publish(7)
        first.beat()
        third.publish(1)
        third.beat()
        assert third.loads() == [7, None, 1]
        assert first.loads() == [7, None, 1]
        assert third.least() and not first.least()
        assert third.workers == 3
    finally:
        os.close(fd)


def test_without_memfd_a_table_is_an_unlinked_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(os, "memfd_create")
    first, fd = LoadTable.create(2)
    try:
        assert os.fstat(fd).st_nlink == 0 and os.get_inheritable(fd) is False
        second = LoadTable.inherit(os.dup(fd), 1)
        second.publish(4)
        second.beat()
        assert first.loads() == [0, 4]
    finally:
        os.close(fd)


def test_inherit_refuses_what_is_not_a_table() -> None:
    read, write = os.pipe()
    try:
        with pytest.raises(ValueError, match=f"descriptor {read} is not a load table"):
            LoadTable.inherit(read, 1)
    finally:
        os.close(read)
        os.close(write)
    fd = os.memfd_create("empty")
    try:
        with pytest.raises(ValueError, match=r"is not a load table \(0 bytes\)"):
            LoadTable.inherit(fd, 1)
    finally:
        os.close(fd)
    _, fd = LoadTable.create(2)
    try:
        with pytest.raises(ValueError, match="worker 2: the load table has 2 slots"):
            LoadTable.inherit(os.dup(fd), 2)
    finally:
        os.close(fd)


# ---------------------------------------------------------------- one listener, by hand


class _Reactor(MemoryReactorClock):
    """
    Records adopted connections as MemoryReactor does, and tells C{on_adopt}
    (the webhook site's count going up).
    """

    def __init__(self) -> None:
        super().__init__()
        self.on_adopt: Callable[[], None] = lambda: None
        self.adopt_error: list[OSError] = []

    def adoptStreamConnection(self, fileDescriptor: int, addressFamily: Any, factory: Any) -> None:
        if self.adopt_error:
            raise self.adopt_error.pop(0)
        os.fstat(fileDescriptor)  # still open while it is handed over
        super().adoptStreamConnection(fileDescriptor, addressFamily, factory)
        self.on_adopt()


class _Factory(Factory):
    started = stopped = 0

    def doStart(self) -> None:
        self.started += 1

    def doStop(self) -> None:
        self.stopped += 1


class _Listener:
    """
    A L{BalancedPort} of worker 0 of two on a real loopback socket, on a
    memory reactor whose clock is also the table's; C{other} is worker 1's
    view of the table.
    """

    def __init__(self, test: TestCase, sock: Optional[Any] = None) -> None:
        self.reactor = _Reactor()
        self.reactor.advance(100)
        buffer = bytearray(2 * SLOT)
        self.table = LoadTable(buffer, 0, self.reactor.seconds)
        self.other = LoadTable(buffer, 1, self.reactor.seconds)
        if sock is None:
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sock.listen(64)
            sock.setblocking(False)
        self.sock = sock
        self.factory = _Factory()
        self.port = BalancedPort(self.reactor, sock, self.factory, self.table)
        self.open = 0
        self.reactor.on_adopt = self._adopted
        self.clients: list[socket.socket] = []
        test.addCleanup(self.close)

    def _adopted(self) -> None:
        # What the webhook listener (amp.http.HTTPServerFactory) does through the hook when a connection is made.
        self.open += 1
        self.table.publish(self.open)

    def connect(self, n: int = 1) -> None:
        for _ in range(n):
            self.clients.append(socket.create_connection(self.sock.getsockname()))

    def set_other(self, count: int) -> None:
        self.other.publish(count)
        self.other.beat()

    def accepted(self) -> int:
        return len(self.reactor.adoptedStreamConnections)

    def reading(self) -> bool:
        return self.port in self.reactor.readers

    def close(self) -> None:
        self.port.stopListening()
        for c in self.clients:
            c.close()
        self.sock.close()


class ListenerTests(TestCase):
    def test_it_accepts_one_connection_per_read(self) -> None:
        one = _Listener(self)
        one.set_other(10)
        one.port.startListening()
        assert one.factory.started == 1
        assert one.reading()
        one.connect(3)
        one.port.doRead()
        assert one.accepted() == 1
        one.port.doRead()
        assert one.accepted() == 2
        assert one.reading()
        one.port.doRead()
        one.port.doRead()  # nothing left: EAGAIN, nothing happens
        assert one.accepted() == 3 and one.reading()

    def test_it_reads_only_while_least_loaded_and_decides_again_every_recheck(self) -> None:
        one = _Listener(self)
        one.set_other(1)
        one.port.startListening()
        one.connect(4)
        one.port.doRead()
        assert (one.accepted(), one.reading()) == (1, True), "1 against 1: ties accept"
        one.port.doRead()
        assert (one.accepted(), one.reading()) == (2, False), "2 against 1: not the least loaded"
        one.reactor.advance(RECHECK)
        assert not one.reading()
        one.set_other(2)
        one.reactor.advance(RECHECK)
        assert one.reading()
        one.port.doRead()
        assert one.accepted() == 3 and not one.reading()
        # The other worker's heartbeat keeps it counted.
        for _ in range(int(STALE / RECHECK) * 2):
            one.other.beat()
            one.reactor.advance(RECHECK)
        assert not one.reading()

    def test_a_read_when_no_longer_least_loaded_accepts_nothing(self) -> None:
        one = _Listener(self)
        one.set_other(5)
        one._adopted()
        one._adopted()
        one.port.startListening()
        one.connect()
        assert one.reading()
        one.set_other(1)
        one.port.doRead()
        assert one.accepted() == 0
        assert not one.reading()
        assert [
            c.getTime() - one.reactor.seconds() for c in one.reactor.getDelayedCalls() if c.func == one.port._rechecked
        ] == [pytest.approx(RECHECK)]

    def test_one_of_its_own_connections_closing_decides_at_once(self) -> None:
        one = _Listener(self)
        listener = WorkerListener(one.reactor, 0, lambda: (one.sock, one.table))
        listener.listen(one.factory)
        one.port = listener.port  # type: ignore[assignment]
        one.set_other(1)
        listener.connections_changed(1)
        listener.connections_changed(2)
        one.port.decide()  # what the read that accepted it does next
        assert not one.reading()
        one.reactor.advance(RECHECK / 2)
        listener.connections_changed(1)
        assert one.reading(), "no wait for the next recheck"
        assert one.table.loads() == [1, 1]

    def test_a_dead_workers_slot_stops_counting_after_stale(self) -> None:
        one = _Listener(self)
        one.set_other(0)
        one._adopted()
        one.port.startListening()
        assert not one.reading()
        one.reactor.advance(STALE)
        assert not one.reading()
        one.reactor.pump([RECHECK] * 2)
        assert one.reading()
        assert one.table.loads() == [1, None]

    def test_it_heartbeats_while_listening(self) -> None:
        one = _Listener(self)
        assert one.other.loads() == [None, 0], "not listening yet"
        one.port.startListening()
        one.reactor.pump([HEARTBEAT] * int(4 * STALE / HEARTBEAT))
        assert one.other.loads() == [0, 0], "alive long after STALE"
        one.port.stopListening()
        assert one.other.loads() == [None, 0]

    def test_stopping_stops_reading_clears_its_slot_and_closes_its_copy(self) -> None:
        one = _Listener(self)
        one.set_other(0)
        one._adopted()
        one.port.startListening()
        assert one.reactor.getDelayedCalls()
        assert self.successResultOf(one.port.stopListening()) is None
        assert not one.reading()
        assert one.reactor.getDelayedCalls() == []
        assert one.sock.fileno() == -1
        assert one.factory.stopped == 1
        assert one.other.loads() == [None, 0]
        # Once stopped, a count that drops does nothing, and stopping again neither.
        one.port.decide()
        assert not one.reading()
        self.successResultOf(one.port.stopListening())
        assert one.factory.stopped == 1

    def test_stopping_first_takes_every_connection_waiting_in_the_queue(self) -> None:
        one = _Listener(self)
        one.set_other(0)
        one._adopted()
        one.port.startListening()
        one.connect(3)
        assert not one.reading(), "worker 1 has fewer: the three wait in the queue"
        self.successResultOf(one.port.stopListening())
        # Handed over for the drain to answer, not left for the kernel to
        # reset when the last copy of the socket closes.
        assert one.accepted() == 3
        assert one.sock.fileno() == -1 and one.other.loads() == [None, 0]

    def test_out_of_descriptors_while_taking_the_queue_it_stops_taking(self) -> None:
        one = _Listener(self)
        one.port.startListening()
        one.connect(3)
        one.reactor.adopt_error = [OSError(errno.EMFILE, "Too many open files")]
        self.successResultOf(one.port.stopListening())
        assert one.accepted() == 0 and one.port._held is None
        assert one.sock.fileno() == -1 and one.reactor.getDelayedCalls() == []

    def test_a_connection_held_over_from_a_shortage_is_handed_over_when_it_stops(self) -> None:
        one = _Listener(self)
        one.port.startListening()
        one.connect()
        one.reactor.adopt_error = [OSError(errno.EMFILE, "Too many open files")]
        one.port.doRead()
        held = one.port._held
        assert held is not None and one.accepted() == 0
        self.successResultOf(one.port.stopListening())
        assert one.accepted() == 1 and held.fileno() == -1 and one.port._held is None

    def test_the_reactor_shutting_down_stops_it(self) -> None:
        one = _Listener(self)
        one.port.startListening()
        one.connect()
        one.reactor.removeReader(one.port)
        one.port.connectionLost(None)  # type: ignore[arg-type]
        assert not one.port.listening and one.sock.fileno() == -1
        assert one.accepted() == 0, "nothing would serve a connection taken now"

    def test_get_host(self) -> None:
        one = _Listener(self)
        host = one.port.getHost()
        assert (host.type, host.host, host.port) == ("TCP", "127.0.0.1", one.sock.getsockname()[1])


class _FailingSocket:
    """A listening socket whose accept() raises the errors given, then EAGAIN."""

    family = socket.AF_INET

    def __init__(self, *errors: int) -> None:
        self.errors = list(errors)
        self.closed = False

    def accept(self) -> Any:
        if self.errors:
            code = self.errors.pop(0)
            raise OSError(code, os.strerror(code))
        raise BlockingIOError(errno.EAGAIN, "again")

    def fileno(self) -> int:
        return -1 if self.closed else 99

    def getsockname(self) -> tuple[str, int]:
        return ("127.0.0.1", 1)

    def close(self) -> None:
        self.closed = True


class AcceptErrorTests(TestCase):
    def setUp(self) -> None:
        self.events: list[dict[str, Any]] = []
        globalLogPublisher.addObserver(self.events.append)
        self.addCleanup(globalLogPublisher.removeObserver, self.events.append)

    def errors(self) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("log_level") == LogLevel.error]

    def test_a_connection_that_went_away_before_accept_is_skipped(self) -> None:
        one = _Listener(self, _FailingSocket(errno.ECONNABORTED, errno.EPROTO, errno.EINTR))  # type: ignore[arg-type]
        one.port.startListening()
        for _ in range(4):
            one.port.doRead()
        assert one.reading() and self.errors() == [] and one.accepted() == 0

    def test_out_of_descriptors_pauses_withdraws_logs_once_and_resumes(self) -> None:
        one = _Listener(self, _FailingSocket(errno.EMFILE, errno.EMFILE, errno.ENFILE))  # type: ignore[arg-type]
        one.set_other(3)
        one.port.startListening()
        one.port.doRead()
        assert not one.reading()
        assert one.other.loads() == [None, 3], "the other workers take the new connections meanwhile"
        [logged] = self.errors()
        assert "Could not accept a connection on the webhook port" in logged["log_format"]
        assert logged["errno"] == "EMFILE"
        one.reactor.advance(ERROR_PAUSE)
        assert one.reading() and one.other.loads() == [0, 3]
        one.port.doRead()
        one.reactor.advance(ERROR_PAUSE)
        one.port.doRead()
        one.reactor.advance(ERROR_PAUSE)
        assert len(self.errors()) == 1, "once per interval"
        one.port.doRead()
        assert one.reading()
        one.port.stopListening()
        assert any(
            e.get("count") == 2 and e.get("subject") == "failed accepts on the shared webhook socket"
            for e in self.events
        ), "the summary of what was not logged"

    def test_a_connection_accepted_without_a_descriptor_to_spare_is_held_not_dropped(self) -> None:
        one = _Listener(self)
        one.port.startListening()
        one.connect()
        one.reactor.adopt_error = [OSError(errno.EMFILE, "Too many open files")]
        one.port.doRead()
        assert one.accepted() == 0 and not one.reading()
        held = one.port._held
        assert held is not None and held.fileno() >= 0
        one.reactor.advance(ERROR_PAUSE)
        assert one.accepted() == 1, "handed over when the pause ends"
        assert held.fileno() == -1 and one.port._held is None
        assert one.reading()

    def test_a_connection_reset_before_it_is_handed_over_is_closed(self) -> None:
        one = _Listener(self)
        one.port.startListening()
        one.connect()
        one.reactor.adopt_error = [OSError(errno.ENOTCONN, "not connected")]
        one.port.doRead()
        assert one.accepted() == 0 and one.reading() and self.errors() == []


# ---------------------------------------------------------------- two listeners, one socket, real reactor


class _Count(Protocol):
    def connectionMade(self) -> None:
        self.factory.opened(self)  # type: ignore[attr-defined]

    def connectionLost(self, reason: Any) -> None:
        self.factory.closed(self)  # type: ignore[attr-defined]


class _Site(Factory):
    """Counts its open connections and reports them as the webhook listener does."""

    protocol = _Count

    def __init__(self, hook: Callable[[int], None]) -> None:
        self.hook = hook
        self.open: list[_Count] = []

    def opened(self, p: _Count) -> None:
        self.open.append(p)
        self.hook(len(self.open))

    def closed(self, p: _Count) -> None:
        self.open.remove(p)
        self.hook(len(self.open))


class SharedSocketTests(TestCase):
    def certificate(self) -> ReloadingCertificate:
        tls = dev_tls()
        cert = ReloadingCertificate(str(tls["cert"]), str(tls["key"]), clock=reactor)
        cert.load()
        return cert

    def pair(self) -> tuple[WorkerListener, WorkerListener]:
        """Worker 0 and, in this same process, a worker 1 from copies of its descriptors."""
        first = WorkerListener.bind(reactor, "127.0.0.1", 0, workers=2)
        listen_fd, table_fd = first.descriptors()
        second = WorkerListener.inherit(reactor, 1, os.dup(listen_fd), os.dup(table_fd))
        self.addCleanup(os.close, table_fd)
        for listener in (first, second):
            # A port closes its own socket; this one, if there was none.
            self.addCleanup(lambda sock=listener._socket: sock.close())  # type: ignore[misc]
        return first, second

    @inlineCallbacks
    def test_sixteen_connections_at_once_split_eight_and_eight(self) -> Any:
        first, second = self.pair()
        sites = [_Site(first.connections_changed), _Site(second.connections_changed)]
        ports = [(yield first.listen(sites[0])), (yield second.listen(sites[1]))]
        for p in ports:
            self.addCleanup(p.stopListening)
        address = ports[0].getHost()
        assert ports[1].getHost() == address
        clients = []
        for _ in range(16):
            c = socket.socket()
            c.setblocking(False)
            c.connect_ex((address.host, address.port))
            clients.append(c)
        self.addCleanup(lambda: [c.close() for c in clients])
        yield wait_until(lambda: sum(len(s.open) for s in sites) == 16, 10, "16 connections accepted")
        assert [len(s.open) for s in sites] == [8, 8]
        assert first.table is not None and first.table.loads() == [8, 8]

        # Worker 1 stops: worker 0 takes every new connection, though it has more.
        yield ports[1].stopListening()
        assert first.table.loads() == [8, None]
        more = [socket.create_connection((address.host, address.port)) for _ in range(4)]
        self.addCleanup(lambda: [c.close() for c in more])
        yield wait_until(lambda: len(sites[0].open) == 12, 10, "worker 0 to take 4 more")
        assert len(sites[1].open) == 8

    @inlineCallbacks
    def test_what_waits_in_the_queue_as_the_last_worker_stops_is_served_not_reset(self) -> Any:
        first, second = self.pair()
        sites = [_Site(first.connections_changed), _Site(second.connections_changed)]
        ports = [(yield first.listen(sites[0])), (yield second.listen(sites[1]))]
        address = ports[0].getHost()
        yield ports[0].stopListening()
        # The kernel completes these handshakes and queues them; no reactor
        # turn passes before worker 1 stops, so it has read none of them.
        clients = [socket.create_connection((address.host, address.port)) for _ in range(3)]
        self.addCleanup(lambda: [c.close() for c in clients])
        self.addCleanup(lambda: [p.transport.abortConnection() for p in list(sites[1].open)])
        assert sites[1].open == []
        yield ports[1].stopListening()
        assert len(sites[1].open) == 3 and sites[0].open == []
        for c in clients:
            c.setblocking(False)
            with pytest.raises(BlockingIOError):
                c.recv(1)  # open, neither reset nor closed
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((address.host, address.port))

    @inlineCallbacks
    def test_both_answer_tls(self) -> Any:
        cert = self.certificate()
        first, second = self.pair()

        def saying(word: bytes, hook: Callable[[int], None]) -> Factory:
            class Say(Protocol):
                def connectionMade(self) -> None:
                    hook(1)
                    self.transport.write(word)
                    self.transport.loseConnection()

            return Factory.forProtocol(Say)

        a = yield tls_endpoint(reactor, 0, "", cert, inner=first).listen(saying(b"a", first.connections_changed))
        b = yield tls_endpoint(reactor, 0, "", cert, inner=second).listen(saying(b"b", second.connections_changed))
        self.addCleanup(a.stopListening)
        self.addCleanup(b.stopListening)
        port = a.getHost().port
        # Each answers once, then has one more than the other: they alternate.
        answers = {(yield tls_exchange(reactor, port)), (yield tls_exchange(reactor, port))}
        assert answers == {b"a", b"b"}
        yield b.stopListening()
        assert (yield tls_exchange(reactor, port)) == b"a"

    @inlineCallbacks
    def test_the_shared_port_is_bound_once(self) -> Any:
        first, _ = self.pair()
        port = yield first.listen(Factory.forProtocol(Protocol))
        self.addCleanup(port.stopListening)
        taken = WorkerListener.bind(reactor, "127.0.0.1", port.getHost().port, workers=2)
        with self.assertRaises(CannotListenError):
            yield taken.listen(Factory.forProtocol(Protocol))
        with self.assertRaises(CannotListenError):
            yield first.listen(Factory.forProtocol(Protocol))

    def test_a_stopped_worker_zero_passes_no_closed_socket_on(self) -> None:
        first, second = self.pair()
        port = self.successResultOf(first.listen(Factory.forProtocol(Protocol)))
        self.successResultOf(port.stopListening())
        with self.assertRaises(OSError):
            first.descriptors()
        with self.assertRaises(OSError):
            second.descriptors()
        second_port = self.successResultOf(second.listen(Factory.forProtocol(Protocol)))
        self.successResultOf(second_port.stopListening())

    def test_inherit_refuses_what_is_not_a_listening_socket(self) -> None:
        _, fd = LoadTable.create(2)
        self.addCleanup(os.close, fd)
        s = socket.socket()
        self.addCleanup(s.close)
        with self.assertRaisesRegex(ValueError, "is not a listening TCP socket"):
            WorkerListener.inherit(reactor, 1, s.fileno(), os.dup(fd))
        read, write = os.pipe()
        self.addCleanup(os.close, read)
        self.addCleanup(os.close, write)
        with self.assertRaisesRegex(ValueError, f"descriptor {read} is not a socket"):
            WorkerListener.inherit(reactor, 1, read, os.dup(fd))
