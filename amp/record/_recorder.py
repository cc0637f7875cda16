"""
The recorder: which reviews are recorded, and the writer thread that puts
them on disk without ever delaying an answer.

On the reactor thread, L{Recorder.offer} decides in a few comparisons
whether a review is recorded (C{record.enabled}, the namespace chosen by
C{record.namespaces} or its C{amp.txn2.com/record} annotation, the sampling
rate) and hands a L{Capture} (references to bytes amp already holds) to a
queue bounded in reviews (C{record.queue}) and in bytes (L{QUEUE_FILES}
files' worth); when the queue is full the review is counted as C{dropped}
and nothing waits.  One thread of the recorder's own takes captures off the
queue, encodes, redacts and appends them (L{RecordFiles}); after each burst
it tells the reactor, with one C{callFromThread}, how many lines it wrote
and failed, how many of the queue's bytes it is done with, and whether the
disk's state changed, and the reactor counts
C{amp_recorded_reviews_total{result}} and logs a change of state once (an
unwritable directory or a full disk is one line when it starts failing and
one when it recovers, never one per review).

A reload that changes the section stops the old writer (it finishes what
is queued) and starts a new one; turning recording off stops it.
"""

from __future__ import annotations

import queue
import random
import threading
from typing import Any, Callable, Iterable, Mapping, Optional, Protocol

from twisted.application.service import Service
from twisted.internet.defer import Deferred, succeed
from twisted.logger import Logger

from amp.metrics import RECORD_RESULTS
from amp.record._entry import Capture, encode_line
from amp.record._files import LineTooLarge, RecordFiles
from amp.record._redact import Redactor
from amp.rules import RECORD_ANNOTATION

__all__ = ["Recorder", "RecordSettings", "RECORD_ANNOTATION", "RECORD_RESULTS"]


#: The queue holds at most this many C{record.file_size}s of reviews' bytes.
QUEUE_FILES = 4


class RecordSettings(Protocol):
    """The C{record} section of the config (L{amp.config.RecordConfig})."""

    enabled: bool
    directory: str
    namespaces: tuple[str, ...]
    sample: float
    max_size: int
    file_size: int
    queue: int
    redact: bool


def _chooses(settings: RecordSettings) -> Callable[[str, Mapping[str, str]], bool]:
    names = settings.namespaces
    if names == ("*",):
        return lambda name, annotations: True
    if names == ("annotated",):
        return lambda name, annotations: annotations.get(RECORD_ANNOTATION) == "true"
    chosen = frozenset(names)
    return lambda name, annotations: name in chosen


def _size(capture: Capture) -> int:
    return len(capture.request_body) + len(capture.answer_body)


class _Writer:
    """One writer thread and its queue, for one version of the settings."""

    def __init__(self, settings: RecordSettings, report: Callable[..., None],
                 call_from_thread: Callable[..., Any], keep_annotation: Callable[[str], bool]) -> None:
        #: Captures waiting for the thread.  Bounded by L{Recorder.offer}
        #: (the only producer, on the reactor thread), not by the queue, so
        #: that the end-of-work sentinel always fits.
        self.queue: "queue.SimpleQueue[Optional[Capture]]" = queue.SimpleQueue()
        self.limit = settings.queue
        #: The most bytes of reviews the queue holds.
        self.byte_limit = QUEUE_FILES * settings.file_size
        self._files = RecordFiles(settings.directory, settings.file_size, settings.max_size)
        self._redactor = Redactor(keep_annotation) if settings.redact else None
        self._report = report
        self._call = call_from_thread
        self.stopped: Deferred[None] = Deferred()
        self._thread = threading.Thread(target=self._run, name="amp-record", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> "Deferred[None]":
        """Finish what is queued, then end the thread; fires when it has."""
        self.queue.put(None)
        return self.stopped

    def _run(self) -> None:
        state = ""
        written = failed = done = 0
        while True:
            capture = self.queue.get()
            if capture is None:
                break
            done += _size(capture)
            try:
                self._files.write(encode_line(capture, self._redactor))
                written += 1
                now = ""
            except LineTooLarge as e:
                failed += 1
                now = state  # one line too large is not a change of the disk's state
                self._call(self._not_recorded, str(e))
            except (OSError, ValueError) as e:
                failed += 1
                now = f"{type(e).__name__}: {e}"
            except Exception as e:
                # A bug must not end the thread: its stop would never fire.
                failed += 1
                now = state
                self._call(self._not_recorded, f"{type(e).__name__}: {e}")
            if now != state or self.queue.empty() or written + failed >= 256 or done >= self.byte_limit // 4:
                state = now
                self._call(self._report, written, failed, state, done)
                written = failed = done = 0
        try:
            self._files.close()
        except OSError:
            pass
        self._call(self._report, written, failed, state, done)
        self._call(self.stopped.callback, None)

    def _not_recorded(self, message: str) -> None:
        Recorder.log.warn("Not recorded: {problem}", problem=message)


class Recorder(Service):
    """
    Records chosen reviews (see the module docstring).

    @param reactor: the reactor the writer thread reports to
        (C{IReactorFromThreads}; used only while recording).
    @param metrics: L{amp.metrics.Metrics}.
    @param draw: a number in [0, 1) per review, for sampling.
    @param keep_annotation: annotation keys redaction keeps (amp's own).
    """

    log = Logger()

    def __init__(self, settings: RecordSettings, reactor: Any, metrics: Any, *,
                 draw: Callable[[], float] = random.random,
                 keep_annotation: Optional[Callable[[str], bool]] = None) -> None:
        self.settings = settings
        self._reactor = reactor
        self._counter = metrics.recorded_reviews
        self._draw = draw
        self._keep = keep_annotation or (lambda name: name.startswith("amp.txn2.com/"))
        self._writer: Optional[_Writer] = None
        self._chosen = _chooses(settings)
        self._state = ""
        #: Bytes of reviews offered to a writer and not yet reported done.
        self._queued = 0

    # ------------------------------------------------------------ reactor side

    def offer(self, time: float, uid: str, namespace: str, annotations: Mapping[str, str],
              labels: Mapping[str, str], endpoints: Iterable[str], failure_policy: str, mode: str,
              request_body: Optional[bytes], answer_body: bytes, result: str, reason: str) -> None:
        """
        Record this review if it is chosen; never blocks, never raises.
        """
        writer = self._writer
        if writer is None or request_body is None or not self._chosen(namespace, annotations):
            return
        sample = self.settings.sample
        if sample < 1.0 and self._draw() >= sample:
            return
        capture = Capture(time, uid, namespace, labels, annotations, tuple(endpoints), failure_policy, mode,
                          request_body, answer_body, result, reason)
        size = _size(capture)
        if writer.queue.qsize() >= writer.limit or self._queued + size > writer.byte_limit:
            self._counter.labels("dropped").inc()
            return
        self._queued += size
        writer.queue.put(capture)

    def startService(self) -> None:
        super().startService()
        self._start()

    def stopService(self) -> "Deferred[None]":
        super().stopService()
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
            self._writer = _Writer(self.settings, self._report, self._reactor.callFromThread, self._keep)
            self._writer.start()
            self.log.info("Recording reviews into {directory} ({namespaces}, sample {sample})",
                          directory=self.settings.directory, namespaces=",".join(self.settings.namespaces),
                          sample=self.settings.sample)

    def _stop(self) -> "Deferred[None]":
        writer, self._writer = self._writer, None
        return writer.stop() if writer is not None else succeed(None)

    def _report(self, written: int, failed: int, state: str, done: int) -> None:
        """Count a burst of the writer's work; log a change of the disk's state."""
        self._queued = max(0, self._queued - done)
        if written:
            self._counter.labels("written").inc(written)
        if failed:
            self._counter.labels("failed").inc(failed)
        if state != self._state:
            if state:
                self.log.error("Recording reviews into {directory} fails: {problem}; reviews are "
                               "answered as ever, their recording is counted as failed",
                               directory=self.settings.directory, problem=state)
            else:
                self.log.info("Recording reviews into {directory} works again", directory=self.settings.directory)
            self._state = state
