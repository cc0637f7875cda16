"""
Strings from the cluster, made safe to print (pure): a name, a label or an
annotation value is whatever its author wrote, and a terminal obeys the
control characters in it (a carriage return that hides a line, an escape
sequence that rewrites the screen).  L{shown} escapes every character
that is not printable; text amp writes itself is not passed through it.
"""

from __future__ import annotations

__all__ = ["shown"]


def shown(text: object, limit: int = 500) -> str:
    """
    C{text} with every unprintable character (C0 and C1 controls, DEL, line
    and paragraph separators, bidirectional overrides) escaped as
    C{\\xNN} or C{\\uNNNN}, cut to C{limit} characters with C{...}.
    """
    s = text if isinstance(text, str) else str(text)
    if not s.isprintable():
        s = "".join(c if c.isprintable() else (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")
                    for c in s)
    return s if len(s) <= limit else s[: limit - 3] + "..."
