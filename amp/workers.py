"""
amp's worker processes: C{workers: N} runs N amp processes that share the
webhook port.

One Twisted process uses one core.  With C{workers} above one, the process
twistd starts is worker 0; it also runs a L{WorkerMonitor} that starts
workers 1 .. N-1 as child processes (C{twistd amp --config <same file>
--worker i --listen-fd 3 --load-table-fd 4}), restarts a child that exits
(with the back-off of L{twisted.runner.procmon.ProcessMonitor}) and, when
worker 0 stops, stops the children and waits for them to exit.  A stop is a drain: worker 0 sends
each child C{SIGTERM} when its own drain begins, every worker drains its own
connections (L{amp.service.AmpService.stopService}), and a child still
running C{listen.drain_timeout} plus a second later is killed.

All workers accept from one listening socket, and each new connection goes
to the worker with the fewest open connections (L{amp.balance}): worker 0
binds the socket on C{listen.port} and creates the shared load table, and
starts every child with both as descriptors L{LISTEN_FD} and
L{LOAD_TABLE_FD} (told on its command line; a restarted child gets them
again); a child never binds.  When a child exits, worker 0 clears its slot
of the table at once, so the others no longer leave new connections to it.
(The API server keeps a few connections open for a long time: the spread at
accept time is the spread of the load.  A socket per worker with
C{SO_REUSEPORT} spreads them by a hash of their addresses, unevenly as often
as not; one socket read by every worker gives them all to the first one
woken.)

Children write their log lines straight to the parent's standard output and
error (the descriptors are inherited).  A child's standard input is a pipe
from the parent: when it reads end-of-file the parent is gone (killed without
the chance to stop its children), and the child stops too (L{ParentWatch}).

Everything else is per process: each worker has its own metrics (worker
C{i} serves them on C{metrics.port + i}), its own readiness, its own
namespace watch, its own certificate and config polling.  C{SIGHUP} to
worker 0 is passed on to every worker.
"""

from __future__ import annotations

import os
import stat
import sys
from typing import TYPE_CHECKING, Any, Callable, Optional

from twisted.application.service import Service
from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IReactorProcess, IReactorTime, IReadDescriptor
from twisted.internet.main import CONNECTION_DONE
from twisted.internet.protocol import ProcessProtocol
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.runner.procmon import ProcessMonitor
from zope.interface import implementer

if TYPE_CHECKING:
    from amp.reactors import IAmpReactor


#: How often the monitor looks whether its stopped children have exited.
_EXIT_POLL = 0.05


#: The descriptors a child worker finds the shared listening socket and the
#: load table on (L{amp.balance}).
LISTEN_FD = 3
LOAD_TABLE_FD = 4


def worker_argv(config_path: str, worker: int) -> list[str]:
    """
    The command line of worker C{worker}: this Python running twistd in the
    foreground, without a pid file, on the same configuration file, told
    where its shared socket and load table are.
    """
    return [
        sys.executable,
        "-c",
        "from twisted.scripts.twistd import run; run()",
        "--nodaemon",
        "--pidfile=",
        "amp",
        "--config",
        config_path,
        "--worker",
        str(worker),
        "--listen-fd",
        str(LISTEN_FD),
        "--load-table-fd",
        str(LOAD_TABLE_FD),
    ]


class _Ending(ProcessProtocol):
    """
    Passes everything on to C{inner} (the monitor's own protocol), and
    calls C{on_end} first when the process has ended.
    """

    def __init__(self, inner: ProcessProtocol, on_end: Callable[[], None]) -> None:
        self.inner = inner
        self.on_end = on_end

    def makeConnection(self, transport: Any) -> None:
        ProcessProtocol.makeConnection(self, transport)
        self.inner.makeConnection(transport)

    def childDataReceived(self, childFD: int, data: bytes) -> None:
        self.inner.childDataReceived(childFD, data)

    def childConnectionLost(self, childFD: int) -> None:
        self.inner.childConnectionLost(childFD)

    def processExited(self, reason: Failure) -> None:
        self.inner.processExited(reason)

    def processEnded(self, reason: Failure) -> None:
        try:
            self.on_end()
        finally:
            self.inner.processEnded(reason)


@implementer(IReactorProcess, IReactorTime)
class _InheritOutput:
    """
    The reactor as L{ProcessMonitor} sees it: processes are spawned with our
    standard output and error (so their log lines reach the same place
    unchanged), a pipe as their standard input (L{ParentWatch}) and the
    descriptors C{inherit()} names (child's number: ours); C{on_exit} is
    called with a process's name as soon as it has ended.
    """

    def __init__(
        self,
        reactor: IAmpReactor,
        inherit: Callable[[], dict[int, int]] = dict,
        on_exit: Optional[Callable[[str], None]] = None,
    ) -> None:
        self._reactor = reactor
        self._inherit = inherit
        self._on_exit = on_exit

    def spawnProcess(
        self,
        processProtocol: Any,
        executable: Any,
        args: Any = (),
        env: Any = None,
        path: Any = None,
        uid: Any = None,
        gid: Any = None,
        usePTY: bool = False,
        childFDs: Any = None,
    ) -> Any:
        fds: dict[int, Any] = {0: "w", 1: 1, 2: 2}
        fds.update(self._inherit())
        if self._on_exit is not None:
            on_exit, name = self._on_exit, processProtocol.name
            processProtocol = _Ending(processProtocol, lambda: on_exit(name))
        return self._reactor.spawnProcess(
            processProtocol, executable, args, env=env, path=path, uid=uid, gid=gid, childFDs=fds
        )

    def callLater(self, delay: float, callable: Any, *args: Any, **kw: Any) -> Any:
        return self._reactor.callLater(delay, callable, *args, **kw)

    def seconds(self) -> float:
        return float(self._reactor.seconds())

    def getDelayedCalls(self) -> Any:
        return self._reactor.getDelayedCalls()


class WorkerMonitor(ProcessMonitor):
    """
    A L{ProcessMonitor} for amp's workers whose C{stopService} waits until
    every child has exited (C{SIGTERM}, then C{SIGKILL} after C{killTime}
    seconds), so that twistd does not exit before its children.
    """

    log = Logger()

    def __init__(
        self,
        reactor: IAmpReactor,
        inherit: Callable[[], dict[int, int]] = dict,
        on_exit: Optional[Callable[[str], None]] = None,
    ) -> None:
        """
        @param inherit: the descriptors every child gets besides standard
            input, output and error, asked for at each start
            (C{{child's number: ours}}).
        @param on_exit: called with a child's name as soon as it has ended.
        """
        super().__init__(reactor=_InheritOutput(reactor, inherit, on_exit))
        self.clock: IReactorTime = reactor

    def signal_workers(self, signal_name: str = "HUP") -> None:
        """
        Send C{signal_name} to every running worker: C{SIGHUP} to worker 0
        reloads its certificate and config, and reaches the workers too.
        """
        for protocol in self.protocols.values():
            transport = getattr(protocol, "transport", None)
            if transport is not None and transport.pid is not None:
                transport.signalProcess(signal_name)

    # IService lets stopService return a Deferred; ProcessMonitor's annotation says None.
    def stopService(self) -> Deferred[None]:  # type: ignore[override]  # see above
        super().stopService()
        if not self.protocols:
            return succeed(None)
        done: Deferred[None] = Deferred()
        deadline = self.clock.seconds() + self.killTime + 2

        def check() -> None:
            if not self.protocols or self.clock.seconds() >= deadline:
                if self.protocols:
                    self.log.warn("Workers {names} did not exit", names=sorted(self.protocols))
                loop.stop()

        loop = LoopingCall(check)
        loop.clock = self.clock
        loop.start(_EXIT_POLL, now=False).addCallback(lambda _: done.callback(None))
        return done


def supervise(
    config_path: str,
    workers: int,
    reactor: IAmpReactor,
    drain_timeout: float,
    shared: Optional[Callable[[], tuple[int, int]]] = None,
    on_exit: Optional[Callable[[int], None]] = None,
) -> WorkerMonitor:
    """
    A L{WorkerMonitor} that runs workers 1 .. C{workers}-1 on C{config_path}
    with this process's environment.  C{shared()} names the descriptors of
    the listening socket and the load table (L{amp.balance}) every worker
    is started with, as L{LISTEN_FD} and L{LOAD_TABLE_FD}; C{on_exit} is
    called with a worker's number as soon as it has exited (its slot of the
    load table stops counting at once).  When the monitor stops, each worker
    gets C{SIGTERM} (and drains, as worker 0 does) and C{drain_timeout} plus
    a second to exit before C{SIGKILL}.
    """
    numbers: dict[str, int] = {}

    def inherit() -> dict[int, int]:
        if shared is None:
            return {}
        listen_fd, table_fd = shared()
        return {LISTEN_FD: listen_fd, LOAD_TABLE_FD: table_fd}

    def exited(name: str) -> None:
        if on_exit is not None and name in numbers:
            on_exit(numbers[name])

    monitor = WorkerMonitor(reactor, inherit=inherit, on_exit=exited)
    monitor.killTime = drain_timeout + 1  # type: ignore[assignment]  # int only by its default; used as a delay
    config_path = os.path.abspath(config_path)
    for worker in range(1, workers):
        name = f"amp-worker-{worker}"
        numbers[name] = worker
        monitor.addProcess(name, worker_argv(config_path, worker), env=dict(os.environ))
    return monitor


@implementer(IReadDescriptor)
class _StdinReader:
    """
    Reads and discards standard input; end-of-file calls C{on_eof}.
    """

    def __init__(self, fd: int, on_eof: Callable[[], None]) -> None:
        self.fd = fd
        self.on_eof = on_eof

    def fileno(self) -> int:
        return self.fd

    def logPrefix(self) -> str:
        return "ParentWatch"

    def doRead(self) -> Optional[Failure]:
        try:
            data = os.read(self.fd, 4096)
        except BlockingIOError:
            return None
        except OSError:
            data = b""
        if not data:
            return CONNECTION_DONE  # type: ignore[return-value]  # an exception, as Twisted's own descriptors return
        return None

    def connectionLost(self, reason: Failure) -> None:
        self.on_eof()


class ParentWatch(Service):
    """
    In a child worker: stop the reactor when standard input (a pipe from
    worker 0) reaches end-of-file, i.e. when worker 0 has exited.  Does
    nothing when standard input is not a pipe (a worker started by hand).
    """

    log = Logger()

    def __init__(self, reactor: IAmpReactor, fd: int = 0) -> None:
        self.reactor = reactor
        self.fd = fd
        self._reader: Optional[_StdinReader] = None

    def startService(self) -> None:
        Service.startService(self)
        try:
            if not stat.S_ISFIFO(os.fstat(self.fd).st_mode):
                return
        except OSError:
            return
        os.set_blocking(self.fd, False)
        self._reader = _StdinReader(self.fd, self._parent_gone)
        self.reactor.addReader(self._reader)

    def stopService(self) -> Optional[Deferred[None]]:
        if self._reader is not None:
            self.reactor.removeReader(self._reader)
            self._reader = None
        Service.stopService(self)
        return None

    def _parent_gone(self) -> None:
        self._reader = None
        if self.running:
            self.log.warn("Worker 0 has exited; stopping this worker")
            self.reactor.stop()
