"""
JSON pointers (RFC 6901) and the JSON type names messages use (pure).

This module owns how amp reads and writes a JSON pointer: the patch checks
(L{amp.patch}) address the Pod with them, and the configuration
(C{patch.denied_paths}, C{patch.allowed_paths}) is checked with them.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

from amp.memo import Memo

__all__ = ["escape_pointer_token", "json_type", "parse_pointer", "pointer"]

_BAD_ESCAPE = re.compile(r"~(?![01])")


def escape_pointer_token(s: str) -> str:
    """
    Escape one JSON pointer reference token (RFC 6901): C{~} -> C{~0}, C{/} -> C{~1}.
    """
    return s.replace("~", "~0").replace("/", "~1")


def parse_pointer(pointer: str) -> tuple[str, ...]:
    """
    Split a JSON pointer into its unescaped reference tokens.

    @raise ValueError: C{pointer} is not a JSON pointer (RFC 6901): not empty
        and not starting with C{/}, or C{~} not followed by C{0} or C{1}.
    """
    if not isinstance(pointer, str):
        raise ValueError(f"a JSON pointer must be a string, not {json_type(pointer)}")
    tokens = _PARSED.get(pointer)
    if tokens is not None:
        return tokens
    if not pointer:
        return ()
    if pointer[0] != "/":
        raise ValueError('is not a JSON pointer (must be empty or start with "/")')
    if "~" not in pointer:
        tokens = tuple(pointer[1:].split("/"))
    elif _BAD_ESCAPE.search(pointer):
        raise ValueError('is not a JSON pointer ("~" must be followed by 0 or 1)')
    else:
        tokens = tuple(t.replace("~1", "/").replace("~0", "~") for t in pointer[1:].split("/"))
    if len(pointer) <= _PARSED_LENGTH:
        _PARSED[pointer] = tokens
    return tokens


#: Pointers parsed already: every review's patch names the same few paths
#: (amp's stamp, an endpoint's label or sidecar), escapes and all.
_PARSED: Memo[str, tuple[str, ...]] = Memo(4096)
_PARSED_LENGTH = 256


def pointer(tokens: Sequence[str]) -> str:
    """
    The JSON pointer of C{tokens}, the inverse of L{parse_pointer}.
    """
    return "".join("/" + escape_pointer_token(t) for t in tokens)


def json_type(value: Any) -> str:
    """
    The JSON name of C{value}'s type (C{object}, C{list}, C{string},
    C{boolean}, C{number}, C{null}), or its Python type's name when it is
    not a JSON value.
    """
    t = type(value)
    if t is dict:
        return "object"
    if t is list:
        return "list"
    if t is str:
        return "string"
    if t is bool:
        return "boolean"
    if t is int or t is float:
        return "number"
    if value is None:
        return "null"
    return t.__name__
