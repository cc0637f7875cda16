"""
The workers' shared load table (L{LoadTable}): one slot per worker in a
shared memory buffer, each worker's open webhook connections and its
heartbeat; see L{amp.balance} for how the workers use it.
"""

from __future__ import annotations

import mmap
import os
import struct
import tempfile
import time
from typing import Callable, Optional

__all__ = ["HEARTBEAT", "SLOT", "STALE", "LoadTable"]

#: Seconds between a worker's heartbeats.
HEARTBEAT = 0.25
#: A slot whose heartbeat is older than this many seconds is a dead (or
#: hung) worker's and does not count.
STALE = 1.0

#: One slot: open connections, then the heartbeat.
_COUNT = struct.Struct("=q")
_BEAT = struct.Struct("=d")
SLOT = 16


class LoadTable:
    """
    The workers' shared load table over C{buffer} (a writable buffer of
    L{SLOT} bytes per worker), as seen by worker C{worker}.

    @param now: the heartbeat's clock; every process sharing the table must
        use the same one (C{time.monotonic}).
    """

    def __init__(self, buffer: mmap.mmap | bytearray, worker: int, now: Callable[[], float] = time.monotonic) -> None:
        self.workers = len(buffer) // SLOT
        if not 0 <= worker < self.workers:
            raise ValueError(f"worker {worker}: the load table has {self.workers} slots")
        self._buffer = buffer
        self.worker = worker
        self._now = now
        self._mine = worker * SLOT
        self._others = tuple(i * SLOT for i in range(self.workers) if i != worker)

    @classmethod
    def create(cls, workers: int, now: Callable[[], float] = time.monotonic) -> tuple["LoadTable", int]:
        """
        A new zeroed table of C{workers} slots in shared memory, seen by
        worker 0, and its descriptor (close-on-exec) to pass to the others.
        """
        try:
            fd = os.memfd_create("amp-worker-load", os.MFD_CLOEXEC)
        except (AttributeError, OSError):
            # No memfd (not Linux, or forbidden): an unlinked file does the same.
            with tempfile.TemporaryFile() as f:
                fd = os.dup(f.fileno())
        try:
            os.ftruncate(fd, workers * SLOT)
            buffer = mmap.mmap(fd, workers * SLOT)
        except BaseException:
            os.close(fd)
            raise
        return cls(buffer, 0, now), fd

    @classmethod
    def inherit(cls, fd: int, worker: int, now: Callable[[], float] = time.monotonic) -> "LoadTable":
        """
        The table worker 0 created, from the descriptor C{fd} it passed,
        seen by worker C{worker}.  The descriptor is closed (the mapping
        stays).

        @raises ValueError: C{fd} is not such a table.
        """
        try:
            size = os.fstat(fd).st_size
            if size == 0 or size % SLOT:
                raise ValueError(f"descriptor {fd} is not a load table ({size} bytes)")
            buffer = mmap.mmap(fd, size)
        except OSError as e:
            raise ValueError(f"descriptor {fd} is not a load table ({e.strerror})") from None
        os.close(fd)
        return cls(buffer, worker, now)

    # ------------------------------------------------------------ this worker's slot

    def publish(self, connections: int) -> None:
        """This worker has C{connections} open connections."""
        _COUNT.pack_into(self._buffer, self._mine, connections)

    def beat(self) -> None:
        """This worker is alive and accepting."""
        _BEAT.pack_into(self._buffer, self._mine + 8, self._now())

    def withdraw(self) -> None:
        """This worker does not accept for now: its slot stops counting."""
        _BEAT.pack_into(self._buffer, self._mine + 8, 0.0)

    def retire(self, worker: Optional[int] = None) -> None:
        """
        Clear the slot of C{worker} (default: this one): stopped, or, from
        worker 0, a child that has exited.
        """
        offset = self._mine if worker is None else worker * SLOT
        _COUNT.pack_into(self._buffer, offset, 0)
        _BEAT.pack_into(self._buffer, offset + 8, 0.0)

    # ------------------------------------------------------------ reading

    def least(self) -> bool:
        """
        Whether this worker's open connections are at most those of every
        live worker (a slot with a heartbeat within L{STALE} seconds).
        """
        buffer, now = self._buffer, self._now()
        mine = _COUNT.unpack_from(buffer, self._mine)[0]
        for offset in self._others:
            if _COUNT.unpack_from(buffer, offset)[0] < mine:
                beat = _BEAT.unpack_from(buffer, offset + 8)[0]
                if beat and now - beat <= STALE:
                    return False
        return True

    def loads(self) -> list[Optional[int]]:
        """Every worker's open connections, None for a slot that does not count."""
        now = self._now()
        out: list[Optional[int]] = []
        for i in range(self.workers):
            count = _COUNT.unpack_from(self._buffer, i * SLOT)[0]
            beat = _BEAT.unpack_from(self._buffer, i * SLOT + 8)[0]
            live = i == self.worker or (beat and now - beat <= STALE)
            out.append(count if live else None)
        return out
