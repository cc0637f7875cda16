"""
"Did you mean": the known name most like one that is not known, so that a
typo is named with its fix (pure; imports nothing of amp).

L{closest} and L{did_you_mean} compare whole names (config keys, with
L{amp.config}'s "unknown key" error); L{closest_label_key} compares label
and annotation keys by the part after their C{/}, a shortening counting as
close (L{amp.hints} names those on Namespaces and Pods).
"""

from __future__ import annotations

import difflib
from typing import Iterable, Optional

__all__ = ["closest", "closest_label_key", "did_you_mean"]


def closest(name: str, known: Iterable[str]) -> Optional[str]:
    """The known key most like C{name}, if one is close enough to be a typo of it."""
    found = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return found[0] if found else None


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """C{" (did you mean X?)"} for the closest known key, else the empty string."""
    match = closest(name, known)
    return f" (did you mean {match}?)" if match is not None else ""


def _abbreviates(short: str, long: str) -> bool:
    """Whether C{short} is C{long} shortened (C{ep} of C{endpoint}): its letters in order, the first first."""
    if not short or len(short) >= len(long) or short[0] != long[0]:
        return False
    rest = iter(long)
    return all(c in rest for c in short)


def closest_label_key(key: str, known: Iterable[str]) -> Optional[str]:
    """
    The known label or annotation key most like C{key}: the part after
    the C{/} compared (a shortening, C{ep} of C{endpoint}, counts as
    close), a different domain prefix counting against it.
    """
    prefix, _, name = key.rpartition("/")
    best, best_score = None, 0.5
    for candidate in known:
        cprefix, _, cname = candidate.rpartition("/")
        score = difflib.SequenceMatcher(None, name, cname).ratio()
        if _abbreviates(cname, name) or _abbreviates(name, cname):
            score = max(score, 0.8)
        if cprefix != prefix:
            score *= difflib.SequenceMatcher(None, prefix, cprefix).ratio()
        if score >= best_score and (best is None or score > best_score):
            best, best_score = candidate, score
    return best
