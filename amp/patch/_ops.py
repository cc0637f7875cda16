"""
The operations of an endpoint's patch (pure): their shape, their JSON
pointers and their JSON values, parsed into L{Op}; and L{PatchError}, what
every check of L{amp.patch} raises.
"""

from __future__ import annotations

import json
import math
from typing import Any, Optional

from amp.pointer import escape_pointer_token, json_type, parse_pointer
from amp.reasons import Reason

_OPS = ("add", "remove", "replace", "move", "copy", "test")
_NEEDS_VALUE = frozenset(("add", "replace", "test"))
_NEEDS_FROM = frozenset(("move", "copy"))
_SHOW_MAX = 160


class PatchError(ValueError):
    """
    An endpoint's patch cannot be sent to the API server.

    @ivar reason: one of L{amp.reasons.PATCH_REASONS} but
        C{patch-too-large} (the caller, which sees the bytes, checks the
        size).

    C{str(error)} is a one-line message that names the operation (its index in
    the endpoint's patch, the op and the path) and the problem.
    """

    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def show(s: str) -> str:
    """
    C{s} for a one-line message: control characters escaped, long values cut.
    """
    if s == "":
        return '""'
    if not s.isprintable():
        s = json.dumps(s)[1:-1]
    if len(s) > _SHOW_MAX:
        s = s[:_SHOW_MAX] + "..."
    return s


class Op:
    __slots__ = ("index", "op", "path", "tokens", "frm", "ftokens", "value", "out")

    def __init__(
        self,
        index: int,
        op: str,
        path: str,
        tokens: tuple[str, ...],
        frm: Optional[str],
        ftokens: Optional[tuple[str, ...]],
        value: Any,
        out: dict[str, Any],
    ) -> None:
        self.index = index
        self.op = op
        self.path = path
        self.tokens = tokens
        self.frm = frm
        self.ftokens = ftokens
        self.value = value
        self.out = out

    @property
    def label(self) -> str:
        if self.frm is None:
            return f"operation {self.index} ({self.op} {show(self.path)})"
        return f"operation {self.index} ({self.op} {show(self.path)} from {show(self.frm)})"


def check_json(value: Any, where: str) -> Optional[str]:
    """
    What makes C{value} not plain JSON, or L{None}.
    """
    stack = [(value, where)]
    while stack:
        v, w = stack.pop()
        t = type(v)
        if t is str or t is int or t is bool or v is None:
            continue
        if t is dict:
            for k, item in v.items():
                if type(k) is not str:
                    return f"{w} has a {type(k).__name__} key {k!r}; JSON object keys are strings"
                if type(item) is not str:
                    stack.append((item, f"{w}/{escape_pointer_token(k)}"))
        elif t is list:
            for i, item in enumerate(v):
                if type(item) is not str:
                    stack.append((item, f"{w}/{i}"))
        elif t is float:
            if not math.isfinite(v):
                return f"{w} is {v!r}, which JSON cannot represent"
        else:
            return f"{w} is a {t.__name__}, which is not a JSON value"
    return None


def parse_ops(ops: Any, max_operations: int) -> list[Op]:
    if type(ops) is not list:
        raise PatchError(Reason.INVALID_PATCH, f"the patch must be a JSON array of operations, not {json_type(ops)}")
    if len(ops) > max_operations:
        raise PatchError(
            Reason.TOO_MANY_OPERATIONS,
            f"the patch has {len(ops)} operations, more than patch.max_operations ({max_operations})",
        )
    parsed = []
    for i, raw in enumerate(ops):
        if type(raw) is not dict:
            raise PatchError(Reason.INVALID_PATCH, f"operation {i}: must be an object, not {json_type(raw)}")
        op = raw.get("op")
        if type(op) is not str or op not in _OPS:
            got = "missing" if "op" not in raw else f"got {show(json.dumps(op, default=repr))}"
            raise PatchError(Reason.INVALID_PATCH, f'operation {i}: "op" must be one of {", ".join(_OPS)}; {got}')
        path = raw.get("path")
        if type(path) is not str:
            got = "missing" if "path" not in raw else f"a {json_type(path)}"
            raise PatchError(Reason.INVALID_PATCH, f'operation {i} ({op}): "path" must be a string; it is {got}')
        try:
            tokens = parse_pointer(path)
        except ValueError as e:
            raise PatchError(Reason.INVALID_PATCH, f'operation {i} ({op} {show(path)}): "path" {e}') from None
        out = {"op": op, "path": path}
        frm = ftokens = value = None
        if op in _NEEDS_FROM:
            frm = raw.get("from")
            if type(frm) is not str:
                got = "missing" if "from" not in raw else f"a {json_type(frm)}"
                raise PatchError(
                    Reason.INVALID_PATCH, f'operation {i} ({op} {show(path)}): "from" must be a string; it is {got}'
                )
            try:
                ftokens = parse_pointer(frm)
            except ValueError as e:
                raise PatchError(Reason.INVALID_PATCH, f'operation {i} ({op} {show(path)}): "from" {e}') from None
            out["from"] = frm
        elif op in _NEEDS_VALUE:
            if "value" not in raw:
                raise PatchError(Reason.INVALID_PATCH, f'operation {i} ({op} {show(path)}): "value" is missing')
            value = raw["value"]
            problem = check_json(value, "value")
            if problem is not None:
                raise PatchError(Reason.INVALID_PATCH, f"operation {i} ({op} {show(path)}): {problem}")
            out["value"] = value
        parsed.append(Op(i, op, path, tokens, frm, ftokens, value, out))
    return parsed
