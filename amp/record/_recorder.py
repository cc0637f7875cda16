"""
The recorder: which reviews are recorded, and the writer process that
puts them on disk without ever delaying an answer.

On the reactor thread, L{Recorder.offer} decides in a few comparisons
whether a review is recorded (C{record.enabled}, the namespace chosen by
C{record.namespaces} or its C{amp.txn2.com/record} annotation, the sampling
rate) and queues it for the writer as one frame (L{amp.record._pipe}: the
review's and the answer's bytes as amp holds them, and the small fields);
the frames of L{FLUSH_DELAY} are written together to the pipe on the
writer's standard input by the reactor, which never blocks on it (one
write and one wake of the writer per batch, not per review: at one
connection, amp's own CPU per review over not recording fell by more
than half; bench/README.md, "Figures behind the code").  What the writer has not yet reported done is bounded
in reviews (C{record.queue}) and in bytes (L{QUEUE_FILES} files' worth):
past either, the review is counted as C{dropped} and nothing waits (a
writer that stopped reading cannot make amp hold more).

The writer (L{amp.record._writer}) is a child process of amp's own: the
decoding, redaction and encoding of each line and the file work are
Python, which in amp's interpreter (a thread, as it was) held the
interpreter lock while the reactor, woken for the next review, waited.
It reports on its standard output, a few times a second, how many lines
it wrote and failed, how many of the reviews' bytes it is done with, and
the disk's state; the reactor counts C{amp_recorded_reviews_total{result}}
and logs a change of state once (an unwritable directory or a full disk is
one line when it starts failing and one when it recovers, never one per
review).

It is started as this Python, C{-P -m amp.record._writer}, with this amp
on its path, its standard input, output and error as pipes and no other
descriptor of amp's (the webhook's listening socket, which workers share,
stays amp's); its first frame holds the settings and redaction's key (a
key of the recorder's, random per amp process: the same value gives the
same marker across writers; never on a command line or on disk).  A
writer that ends without being asked is logged once (with the end of what
it wrote on its standard error), counted
(C{amp_record_writer_restarts_total}; the reviews it had not reported as
C{failed}) and started again after L{RESTART_DELAY}, doubling up to
L{RESTART_DELAY_MAX} (back to the start once one has run that long);
meanwhile offered reviews wait for it within the same bounds.

A reload that changes the section stops the old writer (its standard
input is closed: it writes all it was sent, then exits) and starts a new
one; turning recording off stops it; amp's stop waits for it, at most
L{STOP_TIMEOUT} seconds before killing it (what it had not reported is
then counted as C{failed}).  The writer also ends when amp does: its
standard input reaches end-of-file.
"""

from __future__ import annotations

import os
import random
import site
import sys
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Protocol

from twisted.application.service import Service
from twisted.internet.defer import Deferred, succeed
from twisted.internet.error import ProcessExitedAlready
from twisted.internet.interfaces import IProcessTransport
from twisted.internet.protocol import ProcessProtocol
from twisted.logger import Logger
from twisted.python.failure import Failure

import amp
from amp.metrics import RECORD_RESULTS
from amp.record._entry import Capture
from amp.record._pipe import (
    FrameError,
    LineReader,
    Problem,
    WriterSettings,
    capture_frame,
    decode_report,
    settings_frame,
)
from amp.record._redact import KeptAnnotations
from amp.rules import RECORD_ANNOTATION

if TYPE_CHECKING:
    from amp.reactors import IAmpReactor

__all__ = ["Recorder", "RecordSettings", "RECORD_ANNOTATION", "RECORD_RESULTS", "writer_argv"]


#: What waits for the writer holds at most this many C{record.file_size}s
#: of reviews' bytes.
QUEUE_FILES = 4

#: Seconds the frames of reviews wait on the reactor before they are written
#: to the writer's pipe together.
FLUSH_DELAY = 0.01

#: Seconds amp's stop (or a reload) waits for a writer to finish what it
#: was sent before killing it: within the 5 s the chart's
#: C{terminationGracePeriodSeconds} leaves after the drain.
STOP_TIMEOUT = 3.0

#: Seconds before a writer that ended is started again, doubling each time
#: up to L{RESTART_DELAY_MAX}.
RESTART_DELAY = 0.5
RESTART_DELAY_MAX = 30.0

#: The most bytes kept of what a writer wrote on its standard error.
ERROR_TAIL = 2000


class RecordSettings(Protocol):
    """The C{record} section of the config (L{amp.config.RecordConfig})."""

    @property
    def enabled(self) -> bool: ...
    @property
    def directory(self) -> str: ...
    @property
    def namespaces(self) -> tuple[str, ...]: ...
    @property
    def sample(self) -> float: ...
    @property
    def max_size(self) -> int: ...
    @property
    def file_size(self) -> int: ...
    @property
    def queue(self) -> int: ...
    @property
    def redact(self) -> bool: ...


def writer_argv() -> list[str]:
    """
    The writer's command line: this Python, without the current
    directory on its path (C{-P}), running L{amp.record._writer}.
    """
    return [sys.executable, "-P", "-m", "amp.record._writer"]


def _writer_environment() -> dict[str, str]:
    """
    amp's environment, with this amp first on the writer's path unless it
    is installed in a site directory (amp run from a checkout).
    """
    env = dict(os.environ)
    root = os.path.realpath(os.path.dirname(os.path.dirname(os.path.abspath(amp.__file__))))
    sites = {os.path.realpath(p) for p in [*site.getsitepackages(), site.getusersitepackages()]}
    if root not in sites:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return env


def _chooses(settings: RecordSettings) -> Callable[[str, Mapping[str, str]], bool]:
    names = settings.namespaces
    if names == ("*",):
        return lambda name, annotations: True
    if names == ("annotated",):
        return lambda name, annotations: annotations.get(RECORD_ANNOTATION) == "true"
    chosen = frozenset(names)
    return lambda name, annotations: name in chosen


class _Child(ProcessProtocol):
    """One writer process, as its L{_Writer} sees it."""

    #: Set by C{spawnProcess}, before the writer uses it.
    transport: IProcessTransport

    def __init__(self, writer: "_Writer") -> None:
        self.writer = writer
        self.lines = LineReader()
        self.errors = b""
        #: Reviews and bytes sent to this process and not reported done.
        self.reviews = 0
        self.bytes = 0

    def outReceived(self, data: bytes) -> None:
        for line in self.lines.feed(data):
            self.writer.reported(self, line)

    def errReceived(self, data: bytes) -> None:
        self.errors = (self.errors + data)[-ERROR_TAIL:]

    def processEnded(self, reason: Failure) -> None:
        self.writer.ended(self, reason)


class _Writer:
    """
    The writer process of one version of the settings: started, started
    again when it ends unasked, stopped (see the module docstring).
    """

    def __init__(self, recorder: "Recorder", settings: RecordSettings, reactor: IAmpReactor, frame: bytes) -> None:
        self.limit = settings.queue
        #: The most bytes of reviews waiting for the writer.
        self.byte_limit = QUEUE_FILES * settings.file_size
        #: Reviews and bytes offered and not yet reported done (sent or held).
        self.reviews = 0
        self.bytes = 0
        self._recorder = recorder
        self._reactor = reactor
        self._frame = frame
        self._child: Optional[_Child] = None
        #: Frames not yet written to a writer: until the next flush, or
        #: while no writer runs (it is being started again).
        self._outbox: list[tuple[bytes, ...]] = []
        self._outbox_bytes = 0
        self._flush: Any = None
        self._delay = RESTART_DELAY
        self._started = 0.0
        self._restart: Any = None
        self._kill: Any = None
        self._stopping = False
        self.stopped: Deferred[None] = Deferred()

    @property
    def pid(self) -> Optional[int]:
        """The running writer's process id, or None."""
        child = self._child
        return getattr(child.transport, "pid", None) if child is not None else None

    def start(self) -> None:
        self._restart = None
        child = _Child(self)
        self._started = self._reactor.seconds()
        try:
            self._reactor.spawnProcess(
                child, sys.executable, writer_argv(), env=_writer_environment(), childFDs={0: "w", 1: "r", 2: "r"}
            )
        except Exception as e:
            self._died(child, f"could not be started: {type(e).__name__}: {e}")
            return
        self._child = child
        child.transport.write(self._frame)
        self.flush()

    def offer(self, capture: Capture) -> bool:
        """
        Queue a review's frame for the next flush (at most L{FLUSH_DELAY}
        from now, when a writer runs); False when what waits is full.
        """
        size = len(capture.request_body) + len(capture.answer_body)
        if self.reviews >= self.limit or self.bytes + size > self.byte_limit:
            return False
        self._outbox.append(capture_frame(capture))
        self._outbox_bytes += size
        self.reviews += 1
        self.bytes += size
        if self._flush is None and self._child is not None:
            self._flush = self._reactor.callLater(FLUSH_DELAY, self.flush)
        return True

    def flush(self) -> None:
        """Write every frame waiting to the running writer, in one go."""
        if self._flush is not None and self._flush.active():
            self._flush.cancel()
        self._flush = None
        child = self._child
        if child is None or not self._outbox:
            return
        frames, self._outbox = self._outbox, []
        child.reviews += len(frames)
        child.bytes += self._outbox_bytes
        self._outbox_bytes = 0
        child.transport.writeSequence([piece for frame in frames for piece in frame])

    def stop(self) -> "Deferred[None]":
        """Let the writer finish what it was sent, then end it; fires when it has."""
        if self._stopping:
            return self.stopped
        self._stopping = True
        if self._restart is not None and self._restart.active():
            self._restart.cancel()
        self._restart = None
        child = self._child
        if child is None:
            self._lost(len(self._outbox), self._outbox_bytes)
            self._outbox, self._outbox_bytes = [], 0
            self.stopped.callback(None)
        else:
            self.flush()
            child.transport.closeStdin()
            self._kill = self._reactor.callLater(STOP_TIMEOUT, self._killed, child)
        return self.stopped

    def _killed(self, child: _Child) -> None:
        self._kill = None
        try:
            child.transport.signalProcess("KILL")
        except ProcessExitedAlready:
            pass

    def reported(self, child: _Child, line: bytes) -> None:
        try:
            news = decode_report(line)
        except FrameError as e:
            Recorder.log.warn("The recording's writer said: {problem}", problem=str(e))
            return
        if isinstance(news, Problem):
            Recorder.log.warn("Not recorded: {problem}", problem=news.message)
            return
        reviews = news.written + news.failed
        child.reviews = max(0, child.reviews - reviews)
        child.bytes = max(0, child.bytes - news.done)
        self.reviews = max(0, self.reviews - reviews)
        self.bytes = max(0, self.bytes - news.done)
        self._recorder.reported(news.written, news.failed, news.state)

    def ended(self, child: _Child, reason: Failure) -> None:
        if child is not self._child:
            return
        self._child = None
        if self._flush is not None and self._flush.active():
            self._flush.cancel()
        self._flush = None
        if self._stopping:
            if self._kill is not None and self._kill.active():
                self._kill.cancel()
            self._kill = None
            if child.reviews:
                Recorder.log.warn(
                    "The recording's writer did not finish within {timeout:g}s: {lost} reviews it was sent "
                    "are counted as failed",
                    timeout=STOP_TIMEOUT,
                    lost=child.reviews,
                )
            self._lost(child.reviews, child.bytes)
            self.stopped.callback(None)
            return
        why = reason.getErrorMessage()
        self._died(child, f"ended ({why})")

    def _died(self, child: _Child, why: str) -> None:
        """A writer ended unasked (or never started): log, count, start again later."""
        lost = child.reviews
        self._lost(child.reviews, child.bytes)
        if self._reactor.seconds() - self._started >= RESTART_DELAY_MAX:
            self._delay = RESTART_DELAY
        delay, self._delay = self._delay, min(self._delay * 2, RESTART_DELAY_MAX)
        errors = child.errors.decode("utf-8", "replace").strip()
        Recorder.log.error(
            "The recording's writer {why}; {lost} reviews it had not written are counted as failed; starting "
            "it again in {delay:g}s{errors}",
            why=why,
            lost=lost,
            delay=delay,
            errors=f"; it said: {errors}" if errors else "",
        )
        self._recorder.restarted()
        self._restart = self._reactor.callLater(delay, self.start)

    def _lost(self, reviews: int, size: int) -> None:
        self.reviews = max(0, self.reviews - reviews)
        self.bytes = max(0, self.bytes - size)
        if reviews:
            self._recorder.reported(0, reviews, None)


class Recorder(Service):
    """
    Records chosen reviews (see the module docstring).

    @param reactor: starts the writer process and times its restarts and
        stop (C{IReactorProcess}, C{IReactorTime}; used only while
        recording).
    @param metrics: L{amp.metrics.Metrics}.
    @param draw: a number in [0, 1) per review, for sampling.
    @param keep_annotation: annotation keys redaction keeps (amp's own).
    """

    log = Logger()

    def __init__(
        self,
        settings: RecordSettings,
        reactor: IAmpReactor,
        metrics: Any,
        *,
        draw: Callable[[], float] = random.random,
        keep_annotation: Optional[KeptAnnotations] = None,
    ) -> None:
        self.settings = settings
        self._reactor = reactor
        self._counter = metrics.recorded_reviews
        self._restarts = metrics.record_writer_restarts
        self._draw = draw
        self._keep = keep_annotation or KeptAnnotations()
        #: Redaction's key, the same for every writer of this process.
        self._key = os.urandom(32)
        self._writer: Optional[_Writer] = None
        self._chosen = _chooses(settings)
        self._state = ""

    # ------------------------------------------------------------ reactor side

    @property
    def recording(self) -> bool:
        """A writer runs: reviews offered may be recorded (a review asks before it gathers its facts)."""
        return self._writer is not None

    def offer(self, capture: Capture) -> None:
        """
        Record this review (L{Capture}: references only, nothing copied) if
        it is chosen; never blocks, never raises.
        """
        writer = self._writer
        if writer is None or not self._chosen(capture.namespace, capture.annotations):
            return
        sample = self.settings.sample
        if sample < 1.0 and self._draw() >= sample:
            return
        try:
            sent = writer.offer(capture)
        except Exception as e:
            self._counter.labels("failed").inc()
            self.log.warn("Not recorded: {problem}", problem=f"{type(e).__name__}: {e}")
            return
        if not sent:
            self._counter.labels("dropped").inc()

    def startService(self) -> None:
        Service.startService(self)
        self._start()

    def stopService(self) -> "Deferred[None]":
        Service.stopService(self)
        return self._stop()

    def apply(self, settings: RecordSettings) -> "Deferred[None]":
        """Take new settings (a reload); fires when the old writer is done."""
        if settings == self.settings and (self._writer is not None) == (settings.enabled and self.running):
            return succeed(None)
        self.settings = settings
        self._chosen = _chooses(settings)
        stopped = self._stop()
        if self.running:
            self._start()
        return stopped

    def _start(self) -> None:
        if self.settings.enabled and self._writer is None:
            s = self.settings
            frame = settings_frame(
                WriterSettings(
                    directory=s.directory,
                    file_size=s.file_size,
                    max_size=s.max_size,
                    queue=s.queue,
                    queue_bytes=QUEUE_FILES * s.file_size,
                    redact=s.redact,
                    key=self._key,
                    keep_prefixes=self._keep.prefixes,
                    keep_names=tuple(sorted(self._keep.names)),
                )
            )
            self._writer = _Writer(self, s, self._reactor, frame)
            self._writer.start()
            self.log.info(
                "Recording reviews into {directory} ({namespaces}, sample {sample}) by a writer process, pid {pid}",
                directory=s.directory,
                namespaces=",".join(s.namespaces),
                sample=s.sample,
                pid=self._writer.pid,
            )

    def _stop(self) -> "Deferred[None]":
        writer, self._writer = self._writer, None
        return writer.stop() if writer is not None else succeed(None)

    def reported(self, written: int, failed: int, state: Optional[str]) -> None:
        """Count a burst of a writer's work; log a change of the disk's state (None: no news of it)."""
        if written:
            self._counter.labels("written").inc(written)
        if failed:
            self._counter.labels("failed").inc(failed)
        if state is not None and state != self._state:
            if state:
                self.log.error(
                    "Recording reviews into {directory} fails: {problem}; reviews are "
                    "answered as ever, their recording is counted as failed",
                    directory=self.settings.directory,
                    problem=state,
                )
            else:
                self.log.info("Recording reviews into {directory} works again", directory=self.settings.directory)
            self._state = state

    def restarted(self) -> None:
        """A writer ended unasked and will be started again."""
        self._restarts.inc()
