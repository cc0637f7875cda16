"""
Hostile config swaps for the soak (C{--hostile}): amp's config file is
replaced, as an attacker with one ConfigMap edit would, by each hostile
kind in turn, and the good file put back between them, while the load
runs.  amp must refuse every hostile file (counted in
C{amp_config_reloads_total{result="error"}}, logged once per content), keep
the config it runs with (the same C{amp_config_info} hash at the end) and
keep answering every review in time; the soak's own criteria judge the
answers, the deadlines and amp's RSS.

The kinds (L{HOSTILE_CONFIGS}): an alias bomb (a few hundred bytes that
would expand to 10**9 nodes), a 50 MiB file (an unknown key holding a long
string; sparse past its first 2 MiB, since amp reads no further than its
cap), a file just under the 1 MiB cap that parses in full before it is
refused (the most a reload can make amp parse), JSON nested 100,000 deep,
NaN, invalid UTF-8 and an empty file.
"""

from __future__ import annotations

import os
from typing import Any, BinaryIO, Callable

MIB = 1024 * 1024


def _alias_bomb() -> bytes:
    lines = [b'a: &a ["x","x","x","x","x","x","x","x","x","x"]']
    names = b"abcdefghi"
    for previous, name in zip(names, names[1:]):
        lines.append(b"%c: &%c [%s]" % (name, name, b",".join([b"*%c" % previous] * 10)))
    lines.append(b"failure_policy: *i")
    return b"\n".join(lines) + b"\n"


def _fifty_mib(f: BinaryIO) -> None:
    # Sparse: amp reads at most its 1 MiB cap and a byte, so the rest need
    # not cost the machine 50 MiB of writing at every swap.
    f.write(b"failure_policy: Fail\nunknown: " + b"x" * (2 * MIB))
    f.truncate(50 * MIB)


def _just_under_the_cap() -> bytes:
    return b"failure_policy: Fail\nunknown: " + b"x" * (MIB - 64) + b"\n"


def _bytes(data: bytes) -> Callable[[BinaryIO], None]:
    def write(f: BinaryIO) -> None:
        f.write(data)

    return write


#: Each hostile kind: a function writing it to an open file.
HOSTILE_CONFIGS: dict[str, Callable[[BinaryIO], None]] = {
    "alias-bomb": _bytes(_alias_bomb()),
    "50MiB": _fifty_mib,
    "1MiB-parsed": _bytes(_just_under_the_cap()),
    "deep-json": _bytes(b'{"failure_policy": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
    "nan": _bytes(b"endpoints: {timeout: .nan}\n"),
    "invalid-utf8": _bytes(b"failure_policy: \xff\xfe\n"),
    "empty": _bytes(b""),
}


class ConfigSwapper:
    """
    Swaps amp's config file: L{swap} puts the next hostile kind in place
    (written beside it, then renamed over it, as the kubelet swaps a
    ConfigMap), and the good file back at the following call.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        with open(path, "rb") as f:
            self.good = f.read()
        self.hostile = 0
        self.restored = 0
        self.by_kind: dict[str, int] = {}
        self._next = 0
        self._out = False

    def _write(self, write: Callable[[BinaryIO], None]) -> None:
        new = self.path + ".new"
        with open(new, "wb") as f:
            write(f)
        os.replace(new, self.path)

    def swap(self) -> str:
        """Put the next file in place; returns its kind (C{good} for the good file)."""
        if self._out:
            self._write(_bytes(self.good))
            self._out = False
            self.restored += 1
            return "good"
        kinds = list(HOSTILE_CONFIGS)
        kind = kinds[self._next % len(kinds)]
        self._next += 1
        self._write(HOSTILE_CONFIGS[kind])
        self._out = True
        self.hostile += 1
        self.by_kind[kind] = self.by_kind.get(kind, 0) + 1
        return kind

    def restore(self) -> None:
        """Put the good file back if a hostile one is in place."""
        if self._out:
            self.swap()

    def figures(self) -> dict[str, Any]:
        return {"hostile_swaps": self.hostile, "restored": self.restored, "by_kind": dict(self.by_kind)}
