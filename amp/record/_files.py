"""
The recording's files on disk: appending lines, rotating, keeping the
directory within its byte budget.  Used only in the recorder's writer
process (every call here may block on the disk).

Files are named C{amp-reviews-<UTC time>-<pid>-<n>.jsonl}, C{<pid>} the
writer's and C{n} counting up across its process, so that their names sort
by age and writers sharing a directory (a reload's new one while the old
one finishes, other workers and replicas) never write the same file;
each is created new (never through a name already there, a link
included) C{0600} in a directory created C{0700} (and made so if it
is amp's own and looser).  The budget covers every recording file in the
directory: when a file is rotated, the oldest files are removed until the
rest fit; a writer whose current file another one removed so starts a new
file at its next line.  A line the disk takes only part of is cut off
again, so that the next line starts a line.
"""

from __future__ import annotations

import itertools
import os
import stat
import time
from typing import Callable, Optional

__all__ = ["RecordFiles", "RECORDING_GLOB", "recording_files"]

PREFIX = "amp-reviews-"
SUFFIX = ".jsonl"
RECORDING_GLOB = PREFIX + "*" + SUFFIX

#: The C{n} of the next file's name, shared by every writer of the process.
_SEQUENCE = itertools.count(1)
#: Names tried for one new file before giving up (each taken one is skipped).
_NAME_ATTEMPTS = 100


def recording_files(directory: str) -> list[str]:
    """The recording files in C{directory}, oldest first."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(os.path.join(directory, n) for n in names if n.startswith(PREFIX) and n.endswith(SUFFIX))


class LineTooLarge(ValueError):
    """A line larger than one file may be."""


class RecordFiles:
    """
    Appends lines to the current file of C{directory}, rotating at
    C{file_bytes} and keeping every recording file together within
    C{total_bytes}.
    """

    def __init__(
        self,
        directory: str,
        file_bytes: int,
        total_bytes: int,
        now: Callable[[], float] = time.time,
        pid: Optional[int] = None,
    ) -> None:
        self.directory = directory
        self.file_bytes = file_bytes
        self.total_bytes = total_bytes
        self._now = now
        self._pid = os.getpid() if pid is None else pid
        self._fd: Optional[int] = None
        self._size = 0

    def write(self, line: bytes) -> None:
        """Append C{line}; C{OSError} when the disk refuses, L{LineTooLarge}."""
        if len(line) > self.file_bytes:
            raise LineTooLarge(
                f"a recorded review of {len(line)} bytes is larger than record.file_size ({self.file_bytes} bytes)"
            )
        if self._fd is None or self._size + len(line) > self.file_bytes or self._removed():
            self._rotate()
        assert self._fd is not None
        view = memoryview(line)
        written = 0
        try:
            while written < len(line):
                written += os.write(self._fd, view[written:])
        except OSError:
            if written:
                self._cut(self._size)
            raise
        self._size += written

    def _removed(self) -> bool:
        """Whether the current file was removed (by another writer's budget)."""
        assert self._fd is not None
        try:
            return os.fstat(self._fd).st_nlink == 0
        except OSError:
            return True

    def _cut(self, size: int) -> None:
        """Cut a partly written line off the current file; else leave the file."""
        assert self._fd is not None
        try:
            os.ftruncate(self._fd, size)
        except OSError:
            self.close()

    def _rotate(self) -> None:
        self.close()
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        self._private_directory()
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(self._now()))
        self._trim(keep_free=self.file_bytes)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_APPEND | os.O_CLOEXEC
        for attempt in range(_NAME_ATTEMPTS):
            path = os.path.join(self.directory, f"{PREFIX}{stamp}-{self._pid}-{next(_SEQUENCE):06d}{SUFFIX}")
            try:
                fd = os.open(path, flags, 0o600)
                break
            except FileExistsError:
                if attempt == _NAME_ATTEMPTS - 1:
                    raise
        os.fchmod(fd, 0o600)
        self._fd, self._size = fd, 0

    def _private_directory(self) -> None:
        """Make the directory C{0700} when it is amp's own and looser."""
        st = os.stat(self.directory)
        if st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) & 0o077:
            os.chmod(self.directory, 0o700)

    def _trim(self, keep_free: int) -> None:
        """
        Remove the oldest files until the rest and C{keep_free} bytes (the
        file about to be written, at its largest) fit the budget.
        """
        files = []
        for path in recording_files(self.directory):
            try:
                files.append((path, os.stat(path).st_size))
            except FileNotFoundError:
                continue
        total = sum(size for _, size in files) + keep_free
        for path, size in files:
            if total <= self.total_bytes:
                break
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            total -= size

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)
