"""
The recorder's writer process run inside the test, for the tests of what
the recorder does (amp.record): L{InlineWriters} spawns "processes" whose
standard input waits until the test calls L{InlineWriters.run}, which feeds
it through the writer's own loop (L{amp.record._writer.WriterLoop}) and
hands the report lines back to the recorder, as a real writer's would
reach it.  No thread, no process, no waiting: the test decides when the
writer works (a writer not yet run is a stalled disk).  The process
plumbing itself is tested with real writer processes in
tests/integration/process/test_record_process.py.
"""

from __future__ import annotations

import itertools
from typing import Any, Optional

from twisted.internet.error import ProcessDone, ProcessExitedAlready, ProcessTerminated
from twisted.internet.task import Clock
from twisted.python.failure import Failure

from amp.record import recording_files
from amp.record._writer import WriterLoop

_PIDS = itertools.count(70000)


class InlineWriter:
    """One writer "process": the transport the recorder writes to."""

    def __init__(self, protocol: Any, args: list[str], childFDs: Any) -> None:
        self.protocol = protocol
        self.args = args
        self.childFDs = childFDs
        self.pid: Optional[int] = next(_PIDS)
        self.loop = WriterLoop()
        self.stdin: list[bytes] = []
        self.stdin_closed = False
        #: How many times the recorder wrote to this writer.
        self.writes = 0

    # the transport

    def write(self, data: bytes) -> None:
        if not self.stdin_closed:
            self.writes += 1
            self.stdin.append(data)

    def writeSequence(self, seq: Any) -> None:
        if not self.stdin_closed:
            self.writes += 1
            self.stdin.extend(seq)

    def closeStdin(self) -> None:
        self.stdin_closed = True

    def signalProcess(self, name: str) -> None:
        if self.pid is None:
            raise ProcessExitedAlready()
        self.end(Failure(ProcessTerminated(signal=9 if name == "KILL" else 15)))

    # the process

    def run(self) -> None:
        """Read all that was written; end when standard input was closed."""
        if self.pid is None:
            return
        data, self.stdin = b"".join(self.stdin), []
        out = self.loop.feed(data) + self.loop.flush()
        if self.stdin_closed:
            out += self.loop.finish()
        if out:
            self.protocol.childDataReceived(1, out)
        if self.stdin_closed:
            self.end(Failure(ProcessDone(0)))

    def end(self, reason: Failure) -> None:
        """The process ends now (it was killed, or it crashed)."""
        if self.pid is not None:
            self.pid = None
            self.protocol.processEnded(reason)


class InlineWriters(Clock):
    """A clock whose C{spawnProcess} starts L{InlineWriter}s."""

    def __init__(self) -> None:
        super().__init__()
        self.writers: list[InlineWriter] = []

    def spawnProcess(
        self,
        protocol: Any,
        executable: Any,
        args: Any = (),
        env: Any = None,
        path: Any = None,
        uid: Any = None,
        gid: Any = None,
        usePTY: bool = False,
        childFDs: Any = None,
    ) -> InlineWriter:
        return spawn_inline(self.writers, protocol, args, childFDs)

    def run(self) -> None:
        """Let every writer read what it was sent."""
        run_all(self.writers)

    @staticmethod
    def adopt(reactor: Any) -> list[InlineWriter]:
        """Give C{reactor} (a memory reactor) this C{spawnProcess} and C{run_writers()}."""
        writers: list[InlineWriter] = []

        def spawn(
            protocol: Any,
            executable: Any,
            args: Any = (),
            env: Any = None,
            path: Any = None,
            uid: Any = None,
            gid: Any = None,
            usePTY: bool = False,
            childFDs: Any = None,
        ) -> InlineWriter:
            return spawn_inline(writers, protocol, args, childFDs)

        reactor.spawnProcess = spawn
        reactor.run_writers = lambda: run_all(writers)
        return writers


def spawn_inline(writers: list[InlineWriter], protocol: Any, args: Any, childFDs: Any) -> InlineWriter:
    writer = InlineWriter(protocol, list(args), childFDs)
    writers.append(writer)
    protocol.makeConnection(writer)
    return writer


def run_all(writers: list[InlineWriter]) -> None:
    for writer in list(writers):
        writer.run()


def recorded_lines(tmp_path: Any) -> list[bytes]:
    """Every line of the recording files under C{tmp_path/rec}, oldest file first."""
    out = []
    for name in recording_files(str(tmp_path / "rec")):
        with open(name, "rb") as f:
            out.extend(f.read().splitlines())
    return out
