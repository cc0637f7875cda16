"""
JSON Patch (RFC 6902) checks for the patches that custom endpoints return (pure).

This module owns everything amp does to an endpoint's patch before it goes
back to the API server:

  - validation of the operations (shape, JSON pointers, JSON values);
  - refusal of operations that would change a denied path (C{patch.denied_paths},
    with C{patch.allowed_paths} as exceptions);
  - a dry-apply to the Pod, operation by operation, with the RFC 6902
    semantics the API server applies, only stricter where the two differ;
  - repair: an C{add} whose parent does not exist (C{/spec/volumes/-} on a Pod
    without volumes) gets the C{add} operations that create the missing
    parents inserted before it;
  - a structural sanity check of the patched Pod, so that a patch which would
    make the Pod undecodable or invalid is blamed on the endpoint here rather
    than rejected by the API server whatever the failure policy;
  - composition of a chain (L{compose}): each endpoint's checked patch was
    made for the Pod as the previous ones left it; their concatenation,
    checked and dry-applied again as a whole against the Pod as it came, is
    the one patch the API server applies, and equals applying each in turn.

The API server rejects the whole request, whatever the failure policy, when a
patch decodes but fails to apply; L{check_patch} therefore either returns a
patch that applies to the Pod or raises L{PatchError}.

The dry-apply copies on write: only the containers along the changed paths are
copied, so the caller's Pod is never mutated and the patched Pod shares all
unchanged parts with it (treat L{CheckedPatch.pod} as read-only).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Mapping, Optional, Sequence

from amp.reasons import Reason
from amp.trace import Step

__all__ = [
    "DEFAULT_DENIED", "PatchError", "CheckedPatch", "check_patch", "compose", "unchanged", "annotation_ops", "annotate",
    "escape_pointer_token", "parse_pointer",
]

DEFAULT_DENIED: tuple[str, ...] = ("/metadata/name", "/metadata/namespace", "/metadata/uid", "/status")


_OPS = ("add", "remove", "replace", "move", "copy", "test")
_NEEDS_VALUE = frozenset(("add", "replace", "test"))
_NEEDS_FROM = frozenset(("move", "copy"))
_WARNING_MAX = 119
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


@dataclass(frozen=True)
class CheckedPatch:
    """
    The result of L{check_patch}.

    @ivar operations: the patch to send to the API server, repaired; plain
        JSON lists and dicts with only C{op}, C{path}, C{value} and C{from}
        members; C{[]} when the patch changes nothing.
    @ivar repaired: how many operations amp inserted.
    @ivar warnings: short notes (under 120 characters each) about operations
        that are allowed but probably not what the endpoint meant.
    @ivar pod: the Pod after applying C{operations}.  It shares unchanged
        parts with the Pod given to L{check_patch}: treat it as read-only.
    """

    operations: list[dict]
    repaired: int
    warnings: tuple[str, ...]
    pod: dict


# ---------------------------------------------------------------- JSON pointers

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
        raise ValueError(f"a JSON pointer must be a string, not {_json_type(pointer)}")
    if not pointer:
        return ()
    if pointer[0] != "/":
        raise ValueError("is not a JSON pointer (must be empty or start with \"/\")")
    if "~" not in pointer:
        return tuple(pointer[1:].split("/"))
    if _BAD_ESCAPE.search(pointer):
        raise ValueError("is not a JSON pointer (\"~\" must be followed by 0 or 1)")
    return tuple(t.replace("~1", "/").replace("~0", "~") for t in pointer[1:].split("/"))


def _pointer(tokens: Sequence[str]) -> str:
    return "".join("/" + escape_pointer_token(t) for t in tokens)


def _show(s: str) -> str:
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


def _json_type(value: Any) -> str:
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


# ---------------------------------------------------------------- rules


@lru_cache(maxsize=64)
def _rules(denied: tuple[str, ...], allowed: tuple[str, ...]) -> tuple[tuple, tuple]:
    def parse(key: str, paths: tuple[str, ...]) -> tuple:
        out = []
        for p in paths:
            try:
                out.append((parse_pointer(p), p))
            except ValueError as e:
                raise ValueError(f"patch.{key}: {p!r} {e}") from None
        return tuple(out)

    return parse("denied_paths", denied), tuple(t for t, _ in parse("allowed_paths", allowed))


def _refusal(tokens: tuple[str, ...], rules: tuple[tuple, tuple]) -> Optional[str]:
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
            if any(tokens[:len(a)] == a for a in allowed):
                return None
            how = "is refused by amp" if n == m else f"is under {dpath}, which is refused by amp"
        elif dtokens[:n] == tokens:
            if any(dtokens[:len(a)] == a for a in allowed):
                continue
            how = f"contains {dpath}, which is refused by amp"
        else:
            continue
        return how + " (patch.denied_paths)"
    return None


# ---------------------------------------------------------------- validation


class _Op:
    __slots__ = ("index", "op", "path", "tokens", "frm", "ftokens", "value", "out")

    def __init__(self, index: int, op: str, path: str, tokens: tuple, frm: Optional[str],
                 ftokens: Optional[tuple], value: Any, out: dict) -> None:
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
            return f"operation {self.index} ({self.op} {_show(self.path)})"
        return f"operation {self.index} ({self.op} {_show(self.path)} from {_show(self.frm)})"


def _check_json(value: Any, where: str) -> Optional[str]:
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


def _parse_ops(ops: Any, max_operations: int) -> list[_Op]:
    if type(ops) is not list:
        raise PatchError(Reason.INVALID_PATCH, f"the patch must be a JSON array of operations, not {_json_type(ops)}")
    if len(ops) > max_operations:
        raise PatchError(Reason.TOO_MANY_OPERATIONS,
            f"the patch has {len(ops)} operations, more than patch.max_operations ({max_operations})")
    parsed = []
    for i, raw in enumerate(ops):
        if type(raw) is not dict:
            raise PatchError(Reason.INVALID_PATCH, f"operation {i}: must be an object, not {_json_type(raw)}")
        op = raw.get("op")
        if type(op) is not str or op not in _OPS:
            got = "missing" if "op" not in raw else f"got {_show(json.dumps(op, default=repr))}"
            raise PatchError(Reason.INVALID_PATCH, f"operation {i}: \"op\" must be one of {', '.join(_OPS)}; {got}")
        path = raw.get("path")
        if type(path) is not str:
            got = "missing" if "path" not in raw else f"a {_json_type(path)}"
            raise PatchError(Reason.INVALID_PATCH, f"operation {i} ({op}): \"path\" must be a string; it is {got}")
        try:
            tokens = parse_pointer(path)
        except ValueError as e:
            raise PatchError(Reason.INVALID_PATCH, f"operation {i} ({op} {_show(path)}): \"path\" {e}") from None
        out = {"op": op, "path": path}
        frm = ftokens = value = None
        if op in _NEEDS_FROM:
            frm = raw.get("from")
            if type(frm) is not str:
                got = "missing" if "from" not in raw else f"a {_json_type(frm)}"
                raise PatchError(Reason.INVALID_PATCH, f"operation {i} ({op} {_show(path)}): \"from\" must be a string; it is {got}")
            try:
                ftokens = parse_pointer(frm)
            except ValueError as e:
                raise PatchError(Reason.INVALID_PATCH, f"operation {i} ({op} {_show(path)}): \"from\" {e}") from None
            out["from"] = frm
        elif op in _NEEDS_VALUE:
            if "value" not in raw:
                raise PatchError(Reason.INVALID_PATCH, f"operation {i} ({op} {_show(path)}): \"value\" is missing")
            value = raw["value"]
            problem = _check_json(value, "value")
            if problem is not None:
                raise PatchError(Reason.INVALID_PATCH, f"operation {i} ({op} {_show(path)}): {problem}")
            out["value"] = value
        parsed.append(_Op(i, op, path, tokens, frm, ftokens, value, out))
    return parsed


# ---------------------------------------------------------------- dry-apply

_MISSING = object()


class _Fail(Exception):
    """
    An operation does not apply.

    @ivar node: when the failure is a missing (or null) member of an object,
        that object (already writable) so that a repair can create the member;
        L{None} when no repair is possible.
    @ivar depth: the index of the missing token.
    """

    def __init__(self, message: str, node: Optional[dict] = None, depth: int = -1) -> None:
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
        raise _Fail(f"{_show(_pointer(tokens[:depth + 1]))}: \"-\" (past the end of the list) "
                    "names no element here")
    if not (tok.isascii() and tok.isdigit()) or (len(tok) > 1 and tok[0] == "0"):
        raise _Fail(f"{_show(_pointer(tokens[:depth + 1]))}: {_show(tok)} is not a list index")
    i = int(tok)
    if i > size or (i == size and not append):
        raise _Fail(
            f"{_show(_pointer(tokens[:depth + 1]))} does not exist "
            f"({_show(_pointer(tokens[:depth]))} has {size} item{'' if size == 1 else 's'})")
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
    return a == b


def _unstable_string(value: Any) -> Optional[str]:
    stack = [value]
    while stack:
        v = stack.pop()
        t = type(v)
        if t is str:
            if _UNSTABLE.search(v):
                return v
        elif t is dict:
            stack.extend(v.values())
        elif t is list:
            stack.extend(v)
    return None


class _Doc:
    """
    The document being patched, copied on write.

    Containers whose ids are in C{owned} were created here and are referenced
    from one place only, so they may be changed in place; every other container
    (the caller's Pod, operation values) is copied before it is changed.
    """

    __slots__ = ("root", "owned", "warnings")

    def __init__(self, root: dict) -> None:
        self.root = root
        self.owned: set[int] = set()
        self.warnings: list[str] = []

    def _own(self, node: Any) -> Any:
        node = node.copy()
        self.owned.add(id(node))
        return node

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
                if child is None:
                    what = "does not exist" if tok not in node else "is null"
                    raise _Fail(f"{_show(_pointer(tokens[:depth + 1]))} {what}", node, depth)
            else:
                key = _index(tokens, depth, len(node), False)
                child = node[key]
            t = type(child)
            if t is not dict and t is not list:
                raise _Fail(f"{_show(_pointer(tokens[:depth + 1]))} is a {_json_type(child)}, "
                            "not an object or a list")
            if id(child) not in owned:
                child = self._own(child)
                node[key] = child
            node = child
        return node

    def get(self, tokens: tuple[str, ...]) -> Any:
        node = self.root
        for depth, tok in enumerate(tokens):
            t = type(node)
            if t is dict:
                node = node.get(tok, _MISSING)
                if node is _MISSING:
                    raise _Fail(f"{_show(_pointer(tokens[:depth + 1]))} does not exist")
            elif t is list:
                node = node[_index(tokens, depth, len(node), False)]
            else:
                raise _Fail(f"{_show(_pointer(tokens[:depth]))} is a {_json_type(node)}, "
                            "not an object or a list")
        return node

    def add(self, op: _Op, tokens: tuple[str, ...], value: Any) -> None:
        node = self.parent(tokens)
        key = tokens[-1]
        if type(node) is dict:
            old = node.get(key, _MISSING)
            if type(old) is list and old and type(value) is list:
                self.warnings.append(_short(
                    f"operation {op.index} ({op.op} {_show(op.path)}) replaced an existing list of "
                    f"{len(old)} item{'' if len(old) == 1 else 's'}"))
            node[key] = value
        else:
            node.insert(_index(tokens, len(tokens) - 1, len(node), True), value)

    def remove(self, tokens: tuple[str, ...]) -> Any:
        node = self.parent(tokens)
        key = tokens[-1]
        if type(node) is dict:
            if key not in node:
                raise _Fail(f"{_show(_pointer(tokens))} does not exist")
            return node.pop(key)
        return node.pop(_index(tokens, len(tokens) - 1, len(node), False))

    def replace(self, tokens: tuple[str, ...], value: Any) -> None:
        node = self.parent(tokens)
        key = tokens[-1]
        if type(node) is dict:
            if key not in node:
                raise _Fail(f"{_show(_pointer(tokens))} does not exist")
            node[key] = value
        else:
            node[_index(tokens, len(tokens) - 1, len(node), False)] = value


def _short(s: str) -> str:
    return s if len(s) <= _WARNING_MAX else s[:_WARNING_MAX - 3] + "..."


def _apply(doc: _Doc, op: _Op) -> None:
    name = op.op
    tokens = op.tokens
    if not tokens:
        # The API server's JSON Patch implementation cannot address the whole
        # document; an operation on "" fails there even where RFC 6902 allows it.
        raise _Fail("the API server does not apply operations to the whole document (path \"\")")
    if name == "add":
        doc.add(op, tokens, op.value)
    elif name == "replace":
        doc.replace(tokens, op.value)
    elif name == "remove":
        doc.remove(tokens)
    elif name == "test":
        actual = doc.get(tokens)
        if not _json_equal(actual, op.value):
            raise _Fail(f"test failed: the Pod has {_show(json.dumps(actual))[:80]} "
                        f"at {_show(op.path)}")
        unstable = _unstable_string(op.value)
        if unstable is not None:
            # The API server compares the encoded bytes of scalar values, and Go
            # encodes these characters differently from Python.
            raise _Fail(f"the test value {_show(json.dumps(unstable))[:60]} has characters (<, >, &, "
                        "non-ASCII or control) that the API server may compare differently")
    else:
        ftokens = op.ftokens
        if not ftokens:
            raise _Fail("the API server does not apply operations to the whole document (from \"\")")
        if name == "move":
            if len(tokens) > len(ftokens) and tokens[:len(ftokens)] == ftokens:
                raise _Fail("cannot move a value into itself")
            value = doc.remove(ftokens)
            doc.add(op, tokens, value)
        else:
            doc.add(op, tokens, _clone(doc.get(ftokens)))


def _repair_plan(tokens: tuple[str, ...], depth: int) -> list[tuple[tuple[str, ...], bool]]:
    """
    The ancestors of C{tokens} to create, from C{tokens[:depth + 1]} down to the
    parent, each with whether it is a list.

    @raise _Fail: the parent chain cannot be created without creating list
        elements.
    """
    plan = []
    last = len(tokens) - 1
    for j in range(depth, last):
        nxt = tokens[j + 1]
        is_list = nxt == "-" or (nxt.isascii() and nxt.isdigit())
        if is_list and (j + 1 < last or nxt not in ("-", "0")):
            raise _Fail(f"{_show(_pointer(tokens[:j + 1]))} does not exist, and amp does not create "
                        f"list elements ({_show(_pointer(tokens[:j + 2]))})")
        plan.append((tokens[:j + 1], is_list))
    return plan


def _repair(doc: _Doc, op: _Op, fail: _Fail, rules: tuple, out: list[dict]) -> int:
    plan = _repair_plan(op.tokens, fail.depth)
    for tokens, _ in plan:
        why = _refusal(tokens, rules)
        if why is not None:
            raise PatchError(Reason.REFUSED_PATH, f"{op.label}: {fail.message}, and creating it "
                                           f"({_show(_pointer(tokens))}) {why}")
    node: Any = fail.node
    for tokens, is_list in plan:
        child: Any = [] if is_list else {}
        doc.owned.add(id(child))
        node[tokens[-1]] = child
        node = child
        out.append({"op": "add", "path": _pointer(tokens), "value": [] if is_list else {}})
    _apply(doc, op)
    return len(plan)


# ---------------------------------------------------------------- the patched Pod

_CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")


#: The parts of a Pod L{_pod_problems} checks: C{metadata} (the object
#: itself, its labels and annotations), C{labels}, C{annotations},
#: C{volumes} (and every container's mounts of them), C{containers} (every
#: container list: names are unique across them).
_ALL_PARTS = frozenset({"metadata", "labels", "annotations", "spec", "volumes", "containers"})


def _parts_changed(ops: Sequence[_Op]) -> frozenset[str]:
    """
    The parts of the Pod (L{_ALL_PARTS}) that C{ops} may change: a problem
    anywhere else was in the Pod before the patch, so only these need
    checking afterwards.
    """
    parts: set[str] = set()
    for op in ops:
        if op.op == "test":
            continue
        for tokens in (op.tokens, op.ftokens if op.op == "move" else None):
            if tokens is None:
                continue
            if len(tokens) < 2:
                if not tokens or tokens[0] in ("metadata", "spec"):
                    return _ALL_PARTS
                continue
            top, field = tokens[0], tokens[1]
            if top == "metadata" and field in ("labels", "annotations"):
                parts.add(field)
            elif top == "spec" and field == "volumes":
                parts.add("volumes")
            elif top == "spec" and field in _CONTAINER_LISTS:
                parts.add("containers")
    return frozenset(parts)


def _pod_problems(pod: dict, parts: frozenset[str] = _ALL_PARTS) -> list[tuple[str, str]]:
    """
    Structural problems of C{pod} that make the API server refuse it, as
    (check, message) pairs, in C{parts} of it (L{_ALL_PARTS}).
    """
    out: list[tuple[str, str]] = []
    if not parts:
        return out
    q = json.dumps
    md = pod.get("metadata")
    if type(md) is not dict:
        if "metadata" in parts:
            out.append(("metadata", "metadata must be an object"))
    else:
        for field in ("labels", "annotations"):
            if field not in parts and "metadata" not in parts:
                continue
            m = md.get(field)
            if m is None:
                continue
            if type(m) is not dict:
                out.append((field, f"metadata.{field} must be an object, not {_json_type(m)}"))
                continue
            for k, v in m.items():
                if type(v) is not str:
                    out.append((field, f"metadata.{field}[{q(k)}] must be a string, not {_json_type(v)}"))
                    break
    spec = pod.get("spec")
    if type(spec) is not dict:
        if "spec" in parts:
            out.append(("spec", "spec must be an object"))
        return out
    volumes_changed = "volumes" in parts or "spec" in parts
    if not volumes_changed and "containers" not in parts:
        return out

    volume_names: set[str] = set()
    volumes = spec.get("volumes")
    if volumes is not None and not volumes_changed:
        # Only the names, for the mounts below: the volumes did not change.
        if type(volumes) is list:
            volume_names = {v.get("name") for v in volumes if type(v) is dict}
    elif volumes is not None:
        if type(volumes) is not list:
            out.append(("volumes", f"spec.volumes must be a list, not {_json_type(volumes)}"))
        else:
            for i, v in enumerate(volumes):
                name = v.get("name") if type(v) is dict else None
                if type(name) is not str or not name:
                    out.append(("volume-name", f"spec.volumes[{i}] must be an object with a non-empty string name"))
                elif name in volume_names:
                    out.append(("volume-name-unique", f"volume name {q(name)} is used more than once in spec.volumes"))
                else:
                    volume_names.add(name)

    seen: dict[str, str] = {}
    for field in _CONTAINER_LISTS:
        containers = spec.get(field)
        if field == "containers" and (type(containers) is not list or not containers):
            out.append(("containers", "spec.containers must be a non-empty list"))
            continue
        if containers is None:
            continue
        if type(containers) is not list:
            out.append(("containers", f"spec.{field} must be a list, not {_json_type(containers)}"))
            continue
        for i, c in enumerate(containers):
            where = f"spec.{field}[{i}]"
            if type(c) is not dict:
                out.append(("container", f"{where} must be an object, not {_json_type(c)}"))
                continue
            name = c.get("name")
            if type(name) is not str or not name:
                out.append(("container-name", f"{where}.name must be a non-empty string"))
            elif name in seen:
                out.append(("container-name-unique", f"container name {q(name)} is used by both {seen[name]} and {where}"))
            else:
                seen[name] = where
            image = c.get("image")
            if type(image) is not str or not image:
                out.append(("container-image", f"{where}.image must be a non-empty string"))
            for lf in ("command", "args"):
                v = c.get(lf)
                if v is not None and (type(v) is not list or any(type(x) is not str for x in v)):
                    out.append(("container-args", f"{where}.{lf} must be a list of strings"))
            env = c.get("env")
            if env is not None:
                if type(env) is not list:
                    out.append(("env", f"{where}.env must be a list, not {_json_type(env)}"))
                else:
                    for j, e in enumerate(env):
                        ename = e.get("name") if type(e) is dict else None
                        if type(ename) is not str or not ename:
                            out.append(("env", f"{where}.env[{j}] must be an object with a non-empty string name"))
                            continue
                        value = e.get("value")
                        if value is not None and type(value) is not str:
                            out.append(("env-value", f"{where}.env[{j}].value ({ename}) must be a string, "
                                                     f"not {_json_type(value)}"))
            mounts = c.get("volumeMounts")
            if mounts is not None:
                if type(mounts) is not list:
                    out.append(("volume-mount", f"{where}.volumeMounts must be a list, not {_json_type(mounts)}"))
                else:
                    for j, m in enumerate(mounts):
                        mname = m.get("name") if type(m) is dict else None
                        if type(mname) is not str:
                            out.append(("volume-mount", f"{where}.volumeMounts[{j}] must be an object with a string name"))
                        elif mname not in volume_names:
                            out.append(("volume-mount", f"{where}.volumeMounts[{j}] mounts volume {q(mname)}, "
                                                        "which is not in spec.volumes"))
    return out


def _check_pod(original: dict, patched: dict, parts: frozenset[str] = _ALL_PARTS) -> None:
    problems = _pod_problems(patched, parts)
    if not problems:
        return
    already = {check for check, _ in _pod_problems(original, parts)}
    problems = [message for check, message in problems if check not in already]
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise PatchError(Reason.INVALID_POD, f"the patched Pod would be invalid: {problems[0]}{more}")


# ---------------------------------------------------------------- public API


def check_patch(pod: dict, ops: Any, *, denied: Sequence[str] = DEFAULT_DENIED, allowed: Sequence[str] = (),
                repair: bool = True, max_operations: int = 1000, trace: Any = None,
                confined: Optional[str] = None) -> CheckedPatch:
    """
    Check an endpoint's patch against C{pod}, dry-apply it and repair it.

    @param pod: the Pod from the AdmissionReview (never mutated).
    @param ops: the decoded patch: a list of RFC 6902 operations.
    @param denied: JSON pointers the patch must not change (nor any ancestor
        of them, nor anything under them).
    @param allowed: JSON pointers under which changes are allowed even when
        C{denied} would refuse them.
    @param repair: insert C{add} operations for missing parents of an C{add}.
    @param max_operations: the most operations a patch may have.
    @param trace: an L{amp.trace.IReviewTrace} told each operation that
        applies and each repair, or None.
    @param confined: a JSON pointer every operation (its C{path}, and the
        C{from} of a C{move} or C{copy}) must be under, or None (the
        C{pods/ephemeralcontainers} subresource changes nothing else).
    @raise PatchError: the patch cannot be sent to the API server.
    @raise ValueError: C{denied} or C{allowed} holds a string that is not a
        JSON pointer.
    """
    parsed = _parse_ops(ops, max_operations)
    if type(pod) is not dict:
        raise PatchError(Reason.INVALID_POD, f"the Pod must be a JSON object, not {_json_type(pod)}")
    rules = _rules(tuple(denied), tuple(allowed))

    if confined is not None:
        inside = parse_pointer(confined)
        for op in parsed:
            for which, tokens in (("path", op.tokens), ("from", op.ftokens)):
                if tokens is not None and op.op != "test" and tokens[:len(inside)] != inside:
                    raise PatchError(Reason.REFUSED_PATH, f"{op.label}: {which} is not under {confined}, the only "
                                                          "part of the Pod this review may change")
    modifies = False
    for op in parsed:
        if op.op == "test":
            continue
        modifies = True
        why = _refusal(op.tokens, rules)
        if why is not None:
            raise PatchError(Reason.REFUSED_PATH, f"{op.label}: path {why}")
        if op.op == "move":
            why = _refusal(op.ftokens, rules)
            if why is not None:
                raise PatchError(Reason.REFUSED_PATH, f"{op.label}: from {why}")

    doc = _Doc(pod)
    operations: list[dict] = []
    repaired = 0
    for op in parsed:
        try:
            _apply(doc, op)
        except _Fail as fail:
            if op.op != "add" or fail.node is None:
                raise PatchError(Reason.APPLY_FAILED, f"{op.label}: {fail.message}") from None
            if not repair:
                raise PatchError(Reason.APPLY_FAILED, f"{op.label}: {fail.message} (patch.repair is off)") from None
            before = len(operations)
            try:
                repaired += _repair(doc, op, fail, rules, operations)
            except _Fail as again:
                raise PatchError(Reason.APPLY_FAILED, f"{op.label}: {again.message}") from None
            if trace is not None:
                _trace_repair(trace, op, fail, operations[before:])
        operations.append(op.out)
        if trace is not None:
            trace.record(Step.OPERATION, index=op.index, op=op.op, path=op.path, from_=op.frm, repair=False)

    if not modifies:
        return unchanged(pod)
    _check_pod(pod, doc.root, _parts_changed(parsed))
    return CheckedPatch(operations, repaired, tuple(doc.warnings), doc.root)


def _trace_repair(trace: Any, op: _Op, fail: _Fail, inserted: list[dict]) -> None:
    paths = ", ".join(i["path"] for i in inserted)
    trace.record(Step.REPAIR, index=op.index, message=f"{op.label}: {fail.message}; amp inserted add {paths}")
    for i in inserted:
        trace.record(Step.OPERATION, index=None, op=i["op"], path=i["path"], from_=None, repair=True)


def compose(pod: dict, steps: Sequence[CheckedPatch], *, denied: Sequence[str] = DEFAULT_DENIED,
            allowed: Sequence[str] = (), max_operations: int = 1000) -> CheckedPatch:
    """
    The one patch of a chain: C{steps}, each checked by L{check_patch}
    against the Pod as the steps before it left it (step I{n} against
    C{steps[n-1].pod}, the first against C{pod}), in order.

    Their operations (repairs included) are concatenated and checked as a
    whole against C{pod}: refused paths, a dry-apply, the patched Pod's
    sanity.  The result's C{pod} is the Pod after every step, and applying
    its C{operations} to C{pod} equals applying each step's in turn.
    C{max_operations} bounds the whole.

    @raise PatchError: the whole does not check (a step was not checked
        against the Pod its predecessor left, or it goes over
        C{max_operations}).
    """
    steps = [step for step in steps if step.operations]
    if not steps:
        return unchanged(pod)
    if len(steps) == 1:
        return steps[0]
    operations = [op for step in steps for op in step.operations]
    whole = check_patch(pod, operations, denied=denied, allowed=allowed, repair=False,
                        max_operations=max_operations)
    warnings = tuple(w for step in steps for w in step.warnings)
    return CheckedPatch(whole.operations, sum(step.repaired for step in steps), warnings, whole.pod)


def unchanged(pod: dict) -> CheckedPatch:
    """
    The L{CheckedPatch} of a patch that changes nothing: C{pod} as it is.
    """
    return CheckedPatch([], 0, (), pod)


def annotation_ops(pod: Any, changes: Mapping[str, Optional[str]]) -> list[dict]:
    """
    The operations that make C{pod}'s C{metadata.annotations} hold each key
    of C{changes} set to its value, or without it where the value is None:
    creating C{/metadata/annotations} (or C{/metadata}) when it is missing
    or not an object, removing only keys that are there.
    """
    sets = {k: v for k, v in changes.items() if v is not None}
    metadata = pod.get("metadata") if type(pod) is dict else None
    if type(metadata) is not dict:
        return [{"op": "add", "path": "/metadata", "value": {"annotations": sets}}] if sets else []
    annotations = metadata.get("annotations")
    if type(annotations) is not dict:
        return [{"op": "add", "path": "/metadata/annotations", "value": sets}] if sets else []
    ops: list[dict] = []
    for key, value in changes.items():
        path = "/metadata/annotations/" + escape_pointer_token(key)
        if value is not None:
            ops.append({"op": "add", "path": path, "value": value})
        elif key in annotations:
            ops.append({"op": "remove", "path": path})
    return ops


def annotate(checked: CheckedPatch, changes: Mapping[str, Optional[str]]) -> CheckedPatch:
    """
    amp's own annotations after an endpoint's checked patch: the operations
    of L{annotation_ops} for the Pod as the patch leaves it
    (L{CheckedPatch.pod}), dry-applied and appended.  They apply whatever
    the endpoint's patch did to C{/metadata/annotations} (replaced it,
    removed it, set one of the same keys), and C{patch.denied_paths} does
    not apply to them: they are amp's, not the endpoint's.

    @raise PatchError: C{apply-failed} if they do not apply (a bug).
    """
    ops = annotation_ops(checked.pod, changes)
    if not ops:
        return checked
    doc = _Doc(checked.pod)
    for op in _parse_ops(ops, len(ops)):
        try:
            _apply(doc, op)
        except _Fail as fail:
            raise PatchError(Reason.APPLY_FAILED, f"amp's annotation {op.label}: {fail.message}") from None
    return CheckedPatch(checked.operations + ops, checked.repaired, checked.warnings, doc.root)
