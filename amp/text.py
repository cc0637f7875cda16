"""
Untrusted text (pure): what amp does with strings it did not write itself.

Two rules live here, each in one function:

  - L{lone_surrogate}: a JSON document's first string that is not valid
    Unicode (a lone surrogate escape such as C{"\\udc80"}, which Python's
    C{json} reads but no UTF-8 encoder can write), named by its path.  An
    API server never sends one (its encoder writes valid UTF-8 only), so
    the review parser refuses a review that holds one with a 400 naming
    the field (L{amp.admission_review.parse_review}).  It costs nothing in the
    common case: msgspec, the fast decoder, refuses a lone surrogate by
    itself, and only the careful path that follows (Python's C{json})
    looks, and walks the document only when the body holds a
    C{\\uD800}..C{\\uDFFF} escape (L{may_hold_surrogate}).
  - L{terminal}: a value shown on an operator's terminal by amp's command
    line tools (a namespace, a Pod's name, a JSON path, an annotation, an
    endpoint's message), with every character that a terminal would act on
    or that cannot be written as UTF-8 escaped: C0 and C1 controls, DEL,
    the line and paragraph separators, the bidirectional overrides and
    isolates, and lone surrogates.  Log lines keep their own encoding
    (L{amp.logs}).
"""

from __future__ import annotations

import json
import re
from typing import Any, Optional

__all__ = ["lone_surrogate", "may_hold_surrogate", "terminal"]

#: A surrogate escape in JSON text: a backslash, C{u}, then D800..DFFF in
#: either case.  Searched only when the body holds C{\\ud} or C{\\uD}.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def may_hold_surrogate(body: bytes) -> bool:
    """
    Whether the JSON text C{body} may hold a surrogate escape (one of a
    valid pair, or a lone one); False means it holds none.  A search in C
    for a backslash, then for the escape.
    """
    return b"\\" in body and _SURROGATE_ESCAPE.search(body) is not None


def _is_lone(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def lone_surrogate(doc: Any) -> Optional[str]:
    """
    The path of the first string in the decoded JSON C{doc} (a key or a
    value) that holds a lone surrogate, as C{request.object.metadata.
    annotations["key"]} with each key written as a JSON string (ASCII, so
    the path itself is printable); None when every string is valid
    Unicode.  Walked without recursion.
    """
    stack: list[tuple[Any, str]] = [(doc, "")]
    while stack:
        value, path = stack.pop()
        if isinstance(value, str):
            if _is_lone(value):
                return path or "the document"
        elif isinstance(value, dict):
            items = list(value.items())
            for key, member in reversed(items):
                shown = _member_path(path, key)
                if isinstance(key, str) and _is_lone(key):
                    return f"{shown} (its name)"
                stack.append((member, shown))
        elif isinstance(value, list):
            for index in range(len(value) - 1, -1, -1):
                stack.append((value[index], f"{path}[{index}]"))
    return None


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def _member_path(path: str, key: Any) -> str:
    if isinstance(key, str) and _NAME.match(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{json.dumps(key, ensure_ascii=True)}]"


#: What a terminal acts on, or cannot be written as UTF-8: C0 controls, DEL
#: and C1 controls, the line and paragraph separators, the bidirectional
#: embeddings, overrides and isolates, and surrogates (only lone ones reach
#: a str).
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _escaped(match: "re.Match[str]") -> str:
    c = ord(match.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def terminal(value: Any, limit: Optional[int] = None) -> str:
    """
    C{value} as text that is safe on a terminal: each character in
    L{_UNSAFE} written as C{\\xNN} or C{\\uNNNN} (an ESC as C{\\x1b}, a
    line feed as C{\\x0a}), everything else as it is.  Not a quoting: a
    backslash already in the value is left as it is.  With C{limit}, the
    escaped text is cut to that many characters, ending in C{...}.
    """
    text = value if isinstance(value, str) else str(value)
    if not (text.isascii() and text.isprintable()):
        text = _UNSAFE.sub(_escaped, text)
    if limit is not None and len(text) > limit:
        return text[: limit - 3] + "..."
    return text
