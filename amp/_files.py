"""
What identifies one version of a file amp reloads when it changes (the
serving certificate's files, the config file): where its path resolves to,
its inode, size and modification time.

Comparing the resolved path sees the atomic C{..data} symlink swap the
kubelet does for a ConfigMap or Secret volume; inode, size and mtime see a
rewrite in place.  A rewrite with the same size within the file system's
timestamp granularity of the previous one is not seen: C{SIGHUP} re-reads
regardless.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Union


@dataclass(frozen=True)
class FileState:
    """One version of a file."""

    realpath: str
    inode: int
    size: int
    mtime_ns: int

    @classmethod
    def of_open_file(cls, path: str, fd: int) -> "FileState":
        """The state of exactly the file open as C{fd} (opened from C{path})."""
        st = os.fstat(fd)
        return cls(os.path.realpath(path), st.st_ino, st.st_size, st.st_mtime_ns)


#: A file's state, or the error that stopped us from looking at it.
Observed = Union[FileState, str]


def observe(path: str) -> Observed:
    """The state of the file at C{path} now, or the error seeing it."""
    try:
        st = os.stat(path)
    except OSError as e:
        return f"error {e.errno}"
    return FileState(os.path.realpath(path), st.st_ino, st.st_size, st.st_mtime_ns)
