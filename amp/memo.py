"""
A bounded memo (pure): what amp remembers of values it has computed
before, at most a fixed number of them, so that no input an API server or
an endpoint sends can grow its memory.

A L{Memo} is a dict whose writes evict the entry written least recently
once it holds its C{size}: reads are a plain C{dict.get} (the hot path's
memos are read every review and written almost never), and a full memo
forgets one old entry at a time, not everything at once.  The entries kept
are the latest written, not the latest read: a read moves nothing, which is
what keeps it as cheap as a dict's (see bench/README.md, "Figures behind
the code").
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, TypeVar

__all__ = ["Memo"]

K = TypeVar("K")
V = TypeVar("V")


class Memo(OrderedDict[K, V]):
    """
    A dict of at most C{size} entries: writing a new key to a full memo
    first evicts the key written least recently.  Reads (C{get}, C{[]},
    C{in}) are C{dict}'s own.
    """

    __slots__ = ("size",)

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"a memo holds at least one entry, not {size}")
        super().__init__()
        #: The most entries the memo holds.
        self.size = size

    def __setitem__(self, key: K, value: V) -> None:
        if len(self) >= self.size and key not in self:
            self.popitem(last=False)
        super().__setitem__(key, value)

    def __reduce__(self) -> tuple[Any, ...]:
        # copy and pickle make a memo of the same size (OrderedDict's own
        # would call the class without it).
        return (type(self), (self.size,), None, None, iter(self.items()))

    def __repr__(self) -> str:
        return f"Memo(size={self.size}, entries={len(self)})"
