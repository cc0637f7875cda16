"""
The path rules of a patch (pure): which JSON pointers C{patch.denied_paths}
refuses, with C{patch.allowed_paths} as exceptions.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Optional

from amp.pointer import parse_pointer

#: A JSON pointer's reference tokens (L{amp.pointer.parse_pointer}).
Tokens = tuple[str, ...]

#: The denied paths (tokens and as written) and the allowed ones (tokens).
PathRules = tuple[tuple[tuple[Tokens, str], ...], tuple[Tokens, ...]]


@lru_cache(maxsize=64)
def path_rules(denied: tuple[str, ...], allowed: tuple[str, ...]) -> PathRules:
    def parse(key: str, paths: tuple[str, ...]) -> tuple[tuple[Tokens, str], ...]:
        out = []
        for p in paths:
            try:
                out.append((parse_pointer(p), p))
            except ValueError as e:
                raise ValueError(f"patch.{key}: {p!r} {e}") from None
        return tuple(out)

    return parse("denied_paths", denied), tuple(t for t, _ in parse("allowed_paths", allowed))


def refusal(tokens: Tokens, rules: PathRules) -> Optional[str]:
    """
    Why changing C{tokens} is refused, or L{None} when it is not.

    A path is refused when it is a denied path, is under one, or contains one
    (replacing C{/metadata} rewrites C{/metadata/name}); an allowed path opens
    itself and everything under it.
    """
    denied, allowed = rules
    n = len(tokens)
    for dtokens, dpath in denied:
        m = len(dtokens)
        if n >= m:
            if tokens[:m] != dtokens:
                continue
            if any(tokens[: len(a)] == a for a in allowed):
                return None
            how = "is refused by amp" if n == m else f"is under {dpath}, which is refused by amp"
        elif dtokens[:n] == tokens:
            if any(dtokens[: len(a)] == a for a in allowed):
                continue
            how = f"contains {dpath}, which is refused by amp"
        else:
            continue
        return how + " (patch.denied_paths)"
    return None
