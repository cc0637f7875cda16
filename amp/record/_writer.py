"""
The recording's writer process, C{python -P -m amp.record._writer}: it
reads the frames amp sends on its standard input (L{amp.record._pipe}),
turns each capture into a line (decoding, redaction, encoding:
L{encode_line}) and appends it to the recording files (L{RecordFiles}),
and tells amp on its standard output how many lines it wrote and failed,
how many of the reviews' bytes it is done with, and the disk's state.

It is a process of its own, not a thread of amp's, because that work is
Python: in amp's interpreter it held the interpreter lock while the
reactor thread, woken for the next review, waited for it (up to the
switch interval), which cost the live answers' tail latency.

It runs in the idle scheduling class (C{SCHED_IDLE}) where the kernel has
one, else at the lowest priority (nice 19): it takes only CPU time
nothing else wants, and amp, woken for a review while the writer runs on
its core, gets the core at once.  A writer of normal or merely lowered
priority keeps the core for up to the kernel's minimum slice (about a
millisecond): with amp and its writer pinned to one core, the answer's
p99 grew as much as with a writer thread, and much less in the idle
class; with the writer free to run on another core, not beyond the
run-to-run noise (bench/README.md, "Figures behind the code").  A writer that finds no spare CPU falls behind (on
that one busy core, four reviews in five), and amp counts the reviews
that do not fit what waits for it as dropped.

amp writes the frames of the reviews of a few milliseconds together, to
a pipe the writer asks to be L{PIPE_SIZE} large where the kernel allows:
woken for each review at low rates, the writer spent about three times
the CPU per review it spends on a batch.  Reports are short lines, at
once when the disk's state changes or a quarter of amp's bound on what
waits for the writer is done, else at most every L{REPORT_INTERVAL} (amp
is woken a few times a second, not once per review).

The process ends, after writing every whole frame it was sent, when its
standard input reaches end-of-file: amp closed it (stop, reload) or amp
is gone.  It ignores C{SIGINT}, C{SIGTERM} and C{SIGHUP}: a terminal's
signals, or a service manager's stop, reach every process of the group at
once, and amp, which then stops, closes the writer's input when its last
review is answered (a writer that does not end is killed).  L{WriterLoop}
is the loop without the process, for the tests.
"""

from __future__ import annotations

import fcntl
import os
import select
import signal
import sys
import time
from typing import Callable, Optional

from amp.record._entry import Capture, encode_line
from amp.record._files import LineTooLarge, RecordFiles
from amp.record._pipe import (
    CAPTURE,
    SETTINGS,
    FrameError,
    FrameReader,
    WriterSettings,
    decode_capture,
    decode_settings,
    problem_line,
    report_line,
)
from amp.record._redact import KeptAnnotations, Redactor

__all__ = ["NICE", "PIPE_SIZE", "REPORT_INTERVAL", "WriterLoop", "main"]

#: Seconds a report may wait for more work to join it.
REPORT_INTERVAL = 0.05

#: The writer's niceness where the idle scheduling class is refused.
NICE = 19

#: The most bytes read from the pipe at a time.
READ_SIZE = 1024 * 1024

#: The size asked for the pipe amp writes to (Linux's limit for a process
#: without privileges, by default).
PIPE_SIZE = 1024 * 1024


class WriterLoop:
    """
    The writer without its process: bytes from the pipe in, report lines
    out (see the module docstring).

    @param now: a monotonic clock, for L{REPORT_INTERVAL}.
    @param files: makes the L{RecordFiles} of the settings.
    """

    def __init__(
        self,
        now: Callable[[], float] = time.monotonic,
        files: Callable[[WriterSettings], RecordFiles] = lambda s: RecordFiles(s.directory, s.file_size, s.max_size),
    ) -> None:
        self._frames = FrameReader()
        self._now = now
        self._make_files = files
        self._files: Optional[RecordFiles] = None
        self._redactor: Optional[Redactor] = None
        self._early_reviews = 1
        self._early_bytes = 1
        self._state = ""
        self._written = self._failed = self._done = 0
        #: When the oldest work not yet reported was done, or None.
        self._since: Optional[float] = None

    def feed(self, data: bytes) -> bytes:
        """Write the lines of the frames C{data} completes; the report lines due."""
        out: list[bytes] = []
        for kind, body in self._frames.feed(data):
            if kind == CAPTURE:
                self._write(decode_capture(body), out)
            elif kind == SETTINGS:
                self._start(decode_settings(body))
            else:
                raise FrameError(f"a frame of kind {kind!r}")
        if self._since is not None and self._now() - self._since >= REPORT_INTERVAL:
            out.append(self.flush())
        return b"".join(out)

    def due(self) -> Optional[float]:
        """Seconds until the work not yet reported is to be; None when there is none."""
        if self._since is None:
            return None
        return max(0.0, self._since + REPORT_INTERVAL - self._now())

    def flush(self) -> bytes:
        """The report of the work done since the last one (C{b""} when none)."""
        if self._since is None:
            return b""
        line = report_line(self._written, self._failed, self._done, self._state)
        self._written = self._failed = self._done = 0
        self._since = None
        return line

    def finish(self) -> bytes:
        """Close the files; the last report (always one, to say the state)."""
        if self._files is not None:
            try:
                self._files.close()
            except OSError:
                pass
        line = report_line(self._written, self._failed, self._done, self._state)
        self._since = None
        return line

    def _start(self, settings: WriterSettings) -> None:
        if self._files is not None:
            raise FrameError("a second settings frame")
        self._files = self._make_files(settings)
        if settings.redact:
            keep = KeptAnnotations(settings.keep_prefixes, frozenset(settings.keep_names))
            self._redactor = Redactor(keep, key=settings.key)
        self._early_reviews = max(1, settings.queue // 4)
        self._early_bytes = max(1, settings.queue_bytes // 4)

    def _write(self, capture: Capture, out: list[bytes]) -> None:
        files = self._files
        if files is None:
            raise FrameError("a capture before the settings")
        self._done += len(capture.request_body) + len(capture.answer_body)
        if self._since is None:
            self._since = self._now()
        try:
            files.write(encode_line(capture, self._redactor))
            self._written += 1
            state = ""
        except LineTooLarge as e:
            self._failed += 1
            state = self._state  # one line too large is not a change of the disk's state
            out.append(problem_line(str(e)))
        except (OSError, ValueError) as e:
            self._failed += 1
            state = f"{type(e).__name__}: {e}"
        except Exception as e:
            # A bug in one review's line must not end the writer.
            self._failed += 1
            state = self._state
            out.append(problem_line(f"{type(e).__name__}: {e}"))
        if (
            state != self._state
            or self._written + self._failed >= self._early_reviews
            or self._done >= self._early_bytes
        ):
            self._state = state
            out.append(self.flush())


def _send(data: bytes) -> None:
    """Write C{data} to standard output; amp gone is no reason to stop writing files."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(1, view) :]
        except BrokenPipeError:
            return


def _idle_priority() -> None:
    """The idle scheduling class, else the lowest priority (see the module docstring)."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        return
    except (AttributeError, OSError):  # not Linux, or refused (a seccomp profile)
        pass
    try:
        os.nice(NICE)
    except OSError:
        pass


def main() -> int:
    """The writer process (see the module docstring)."""
    for name in ("SIGINT", "SIGTERM", "SIGHUP"):
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    _idle_priority()
    if hasattr(fcntl, "F_SETPIPE_SZ"):  # Linux
        try:
            fcntl.fcntl(0, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
        except OSError:
            pass
    loop = WriterLoop()
    while True:
        wait = loop.due()
        if wait is not None and not select.select([0], [], [], wait)[0]:
            _send(loop.flush())
            continue
        data = os.read(0, READ_SIZE)
        if not data:
            break
        _send(loop.feed(data))
    _send(loop.finish())
    return 0


if __name__ == "__main__":
    sys.exit(main())
