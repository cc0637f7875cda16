"""
The dry-apply of a patch to a Pod, operation by operation (pure), with the
RFC 6902 semantics the API server applies, only stricter where the two
differ; and the repair of an C{add} whose parent does not exist.

The document is copied on write: only the containers along the changed
paths are copied, so the caller's Pod is never mutated and the patched Pod
shares all unchanged parts with it.  A member the Pod holds as raw JSON
(L{amp.podjson}) is decoded when an operation reads or writes inside it,
and kept decoded in the caller's Pod (the same JSON); one it does not
touch stays raw.
"""

from __future__ import annotations

import json
import re
from typing import Any, Optional, Sequence

from amp.patch._ops import Op, PatchError, show
from amp.patch._paths import PathRules, refusal
from amp.podjson import RAW, MemberError, member, read, read_all
from amp.pointer import json_type, pointer
from amp.reasons import Reason

_WARNING_MAX = 119

_MISSING = object()
_METADATA = ("metadata",)


class Fail(Exception):
    """
    An operation does not apply.

    @ivar node: when the failure is a missing (or null) member of an object,
        that object (already writable) so that a repair can create the member;
        L{None} when no repair is possible.
    @ivar depth: the index of the missing token.
    """

    def __init__(self, message: str, node: Optional[dict[str, Any]] = None, depth: int = -1) -> None:
        super().__init__(message)
        self.message = message
        self.node = node
        self.depth = depth


def _index(tokens: Sequence[str], depth: int, size: int, append: bool) -> int:
    """
    The list index that C{tokens[depth]} names in a list of C{size} items.
    """
    tok = tokens[depth]
    if tok == "-":
        if append:
            return size
        raise Fail(f'{show(pointer(tokens[: depth + 1]))}: "-" (past the end of the list) names no element here')
    if not (tok.isascii() and tok.isdigit()) or (len(tok) > 1 and tok[0] == "0"):
        raise Fail(f"{show(pointer(tokens[: depth + 1]))}: {show(tok)} is not a list index")
    i = int(tok)
    if i > size or (i == size and not append):
        raise Fail(
            f"{show(pointer(tokens[: depth + 1]))} does not exist "
            f"({show(pointer(tokens[:depth]))} has {size} item{'' if size == 1 else 's'})"
        )
    return i


def _clone(value: Any) -> Any:
    t = type(value)
    if t is dict:
        return {k: _clone(v) if type(v) in _CONTAINERS else v for k, v in value.items()}
    if t is list:
        return [_clone(v) if type(v) in _CONTAINERS else v for v in value]
    return value


_CONTAINERS = frozenset((dict, list))

# Strings that Go's encoding/json writes differently from Python's json
# (HTML characters, non-ASCII, control characters); see _test.
_UNSTABLE = re.compile(r"[^\x20-\x7e]|[<>&]")


def _json_equal(a: Any, b: Any) -> bool:
    """
    JSON equality, strict about types: C{1}, C{1.0} and C{true} all differ.
    """
    t = type(a)
    if t is not type(b):
        return False
    if t is dict:
        if len(a) != len(b):
            return False
        for k, v in a.items():
            w = b.get(k, _MISSING)
            if w is _MISSING or not _json_equal(v, w):
                return False
        return True
    if t is list:
        return len(a) == len(b) and all(map(_json_equal, a, b))
    equal: bool = a == b
    return equal


def _unstable_string(value: Any) -> Optional[str]:
    stack = [value]
    while stack:
        v = stack.pop()
        t = type(v)
        if t is str:
            if _UNSTABLE.search(v):
                found: str = v
                return found
        elif t is dict:
            stack.extend(v.values())
        elif t is list:
            stack.extend(v)
    return None


class Doc:
    """
    The document being patched, copied on write.

    Containers whose ids are in C{owned} were created here and are referenced
    from one place only, so they may be changed in place; every other container
    (the caller's Pod, operation values) is copied before it is changed.  Each
    owned container is kept alive by C{owned} itself: one an operation threw
    away would otherwise leave its id to the next object made, which might be
    the caller's (a raw member decoded into the caller's Pod), then changed in
    place as if it were a copy.
    """

    __slots__ = ("root", "source", "owned", "warnings")

    def __init__(self, root: dict[str, Any]) -> None:
        self.root = root
        #: The caller's Pod: a raw member (L{amp.podjson}) read here is
        #: decoded into it too, once for every later reader.
        self.source = root
        #: The containers made here, by id.
        self.owned: dict[int, Any] = {}
        self.warnings: list[str] = []

    def _own(self, node: Any) -> Any:
        node = node.copy()
        self.owned[id(node)] = node
        return node

    def _member(self, tok: str) -> Any:
        """
        The root's member C{tok}, a raw one decoded (in the caller's Pod
        and the root's copy alike).
        """
        value = member(self.source, tok)
        if self.root is not self.source:
            self.root[tok] = value
        return value

    def _read(self, node: Any, key: Any, tokens: tuple[str, ...], depth: int) -> Any:
        """
        C{node[key]} (at C{tokens[:depth + 1]}) below the root, a raw one
        (the metadata's managedFields) decoded in C{node}.
        """
        if depth == 0:
            return self._member(key)
        return read(node, key, ".".join(tokens[: depth + 1]))

    def _whole(self, value: Any, tokens: tuple[str, ...]) -> Any:
        """
        C{value}, read at C{tokens} to be copied, moved or compared whole:
        the metadata with its raw members decoded (nothing else holds any).
        """
        if tokens == _METADATA and type(value) is dict:
            read_all(value, "metadata")
        return value

    def parent(self, tokens: tuple[str, ...]) -> Any:
        """
        The writable container that holds C{tokens[-1]}.
        """
        node = self.root
        owned = self.owned
        if id(node) not in owned:
            node = self.root = self._own(node)
        for depth in range(len(tokens) - 1):
            tok = tokens[depth]
            if type(node) is dict:
                child = node.get(tok)
                key: Any = tok
                if type(child) is RAW:
                    child = self._read(node, tok, tokens, depth)
                if child is None:
                    what = "does not exist" if tok not in node else "is null"
                    raise Fail(f"{show(pointer(tokens[: depth + 1]))} {what}", node, depth)
            else:
                key = _index(tokens, depth, len(node), False)
                child = node[key]
            t = type(child)
            if t is not dict and t is not list:
                raise Fail(f"{show(pointer(tokens[: depth + 1]))} is a {json_type(child)}, not an object or a list")
            if id(child) not in owned:
                child = self._own(child)
                node[key] = child
            node = child
        return node

    def get(self, tokens: tuple[str, ...]) -> Any:
        node: Any = self.root
        for depth, tok in enumerate(tokens):
            t = type(node)
            if t is dict:
                child = node.get(tok, _MISSING)
                if child is _MISSING:
                    raise Fail(f"{show(pointer(tokens[: depth + 1]))} does not exist")
                if type(child) is RAW:
                    child = self._read(node, tok, tokens, depth)
                node = child
            elif t is list:
                node = node[_index(tokens, depth, len(node), False)]
            else:
                raise Fail(f"{show(pointer(tokens[:depth]))} is a {json_type(node)}, not an object or a list")
        return self._whole(node, tokens)

    def add(self, op: Op, tokens: tuple[str, ...], value: Any) -> None:
        node = self.parent(tokens)
        key = tokens[-1]
        if type(node) is dict:
            old = node.get(key, _MISSING)
            if type(old) is RAW and type(value) is list:
                # Whether it was a list is in what the raw JSON holds.
                old = self._read(node, key, tokens, len(tokens) - 1)
            if type(old) is list and old and type(value) is list:
                self.warnings.append(
                    _short(
                        f"operation {op.index} ({op.op} {show(op.path)}) replaced an existing list of "
                        f"{len(old)} item{'' if len(old) == 1 else 's'}"
                    )
                )
            node[key] = value
        else:
            node.insert(_index(tokens, len(tokens) - 1, len(node), True), value)

    def remove(self, tokens: tuple[str, ...]) -> Any:
        node = self.parent(tokens)
        key = tokens[-1]
        if type(node) is dict:
            if key not in node:
                raise Fail(f"{show(pointer(tokens))} does not exist")
            if type(node[key]) is RAW:
                # A member moved elsewhere is read there.
                self._read(node, key, tokens, len(tokens) - 1)
            return self._whole(node.pop(key), tokens)
        return node.pop(_index(tokens, len(tokens) - 1, len(node), False))

    def replace(self, tokens: tuple[str, ...], value: Any) -> None:
        node = self.parent(tokens)
        key = tokens[-1]
        if type(node) is dict:
            if key not in node:
                raise Fail(f"{show(pointer(tokens))} does not exist")
            node[key] = value
        else:
            node[_index(tokens, len(tokens) - 1, len(node), False)] = value


def _short(s: str) -> str:
    return s if len(s) <= _WARNING_MAX else s[: _WARNING_MAX - 3] + "..."


def apply_op(doc: Doc, op: Op) -> None:
    """
    Apply C{op} to C{doc}.

    @raise Fail: it does not apply; a raw part of the Pod it reads that
        does not decode (L{amp.podjson.MemberError}) fails it, with why.
    """
    try:
        name = op.op
        tokens = op.tokens
        if not tokens:
            # The API server's JSON Patch implementation cannot address the whole
            # document; an operation on "" fails there even where RFC 6902 allows it.
            raise Fail('the API server does not apply operations to the whole document (path "")')
        if name == "add":
            doc.add(op, tokens, op.value)
        elif name == "replace":
            doc.replace(tokens, op.value)
        elif name == "remove":
            doc.remove(tokens)
        elif name == "test":
            actual = doc.get(tokens)
            if not _json_equal(actual, op.value):
                raise Fail(f"test failed: the Pod has {show(json.dumps(actual))[:80]} at {show(op.path)}")
            unstable = _unstable_string(op.value)
            if unstable is not None:
                # The API server compares the encoded bytes of scalar values, and Go
                # encodes these characters differently from Python.
                raise Fail(
                    f"the test value {show(json.dumps(unstable))[:60]} has characters (<, >, &, "
                    "non-ASCII or control) that the API server may compare differently"
                )
        else:
            ftokens = op.ftokens
            if not ftokens:
                raise Fail('the API server does not apply operations to the whole document (from "")')
            if name == "move":
                if len(tokens) > len(ftokens) and tokens[: len(ftokens)] == ftokens:
                    raise Fail("cannot move a value into itself")
                value = doc.remove(ftokens)
                doc.add(op, tokens, value)
            else:
                doc.add(op, tokens, _clone(doc.get(ftokens)))
    except MemberError as e:
        raise Fail(str(e)) from None


def _repair_plan(tokens: tuple[str, ...], depth: int) -> list[tuple[tuple[str, ...], bool]]:
    """
    The ancestors of C{tokens} to create, from C{tokens[:depth + 1]} down to the
    parent, each with whether it is a list.

    @raise Fail: the parent chain cannot be created without creating list
        elements.
    """
    plan = []
    last = len(tokens) - 1
    for j in range(depth, last):
        nxt = tokens[j + 1]
        is_list = nxt == "-" or (nxt.isascii() and nxt.isdigit())
        if is_list and (j + 1 < last or nxt not in ("-", "0")):
            raise Fail(
                f"{show(pointer(tokens[: j + 1]))} does not exist, and amp does not create "
                f"list elements ({show(pointer(tokens[: j + 2]))})"
            )
        plan.append((tokens[: j + 1], is_list))
    return plan


def repair_parents(doc: Doc, op: Op, fail: Fail, rules: PathRules, out: list[dict[str, Any]]) -> int:
    plan = _repair_plan(op.tokens, fail.depth)
    for tokens, _ in plan:
        why = refusal(tokens, rules)
        if why is not None:
            raise PatchError(
                Reason.REFUSED_PATH, f"{op.label}: {fail.message}, and creating it ({show(pointer(tokens))}) {why}"
            )
    node: Any = fail.node
    for tokens, is_list in plan:
        child: Any = [] if is_list else {}
        doc.owned[id(child)] = child
        node[tokens[-1]] = child
        node = child
        out.append({"op": "add", "path": pointer(tokens), "value": [] if is_list else {}})
    apply_op(doc, op)
    return len(plan)
