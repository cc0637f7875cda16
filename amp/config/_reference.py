"""
The reference of every key in C{docs/config.md}, derived from the
declarations (pure): each table row is L{reference_row} of its key, and
L{rewrite_reference} brings a page's rows in step with the declarations
(C{python -m amp.config docs/config.md}).
"""

from __future__ import annotations

import re

from amp.config._declare import Key
from amp.config._sections import KEYS

__all__ = ["reference_row", "rewrite_reference"]

_ROW = re.compile(r"^\|[ \t]*`([^`]+)`[ \t]*\|.*\|[ \t]*$", re.M)


def reference_row(key: Key) -> str:
    """
    The Markdown table row of C{key}: its path, its default as written in
    a file, and what it does.
    """
    return f"| `{key.path}` | `{key.shown_default}` | {key.doc} |"


def rewrite_reference(text: str) -> str:
    """
    C{text} (a Markdown page) with every table row whose first cell names
    a declared key replaced by that key's L{reference_row}; the page keeps
    its own order, grouping and prose.
    """
    rows = {key.path: reference_row(key) for key in KEYS}
    return _ROW.sub(lambda m: rows.get(m.group(1), m.group(0)), text)
