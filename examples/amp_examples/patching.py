"""
Building JSON Patches that apply cleanly and change nothing the second time.

This module owns the patch arithmetic every example shares: RFC 6901
pointers, reading a Pod safely whatever its shape, and ``PatchBuilder``,
which records RFC 6902 operations while applying each one to a private
copy of the Pod. Later operations therefore see earlier ones: a list that
does not exist yet is created with ``add <path> [value]`` and appended to
with ``<path>/-`` after that. amp repairs missing parents itself, but the
examples do not rely on it.

Idempotency is the endpoint's job (the API server may send the same Pod
twice, and reinvocation sends the Pod amp already changed): look before
adding, with ``find``, and a second call returns ``[]``.

Nothing here does I/O.
"""

from __future__ import annotations

import copy
from typing import Any, Mapping, Sequence

Pod = dict[str, Any]
PatchOp = dict[str, Any]
Token = str | int

_MISSING: Any = object()


def pointer(tokens: Sequence[Token]) -> str:
    """RFC 6901 JSON Pointer for ``tokens`` (``~`` and ``/`` escaped)."""
    return "".join("/" + str(t).replace("~", "~0").replace("/", "~1") for t in tokens)


def _get(doc: Any, tokens: Sequence[Token]) -> Any:
    for t in tokens:
        if isinstance(doc, dict) and isinstance(t, str):
            doc = doc.get(t, _MISSING)
        elif isinstance(doc, list) and isinstance(t, int) and 0 <= t < len(doc):
            doc = doc[t]
        else:
            return _MISSING
        if doc is _MISSING:
            return _MISSING
    return doc


def items(doc: Any, tokens: Sequence[Token]) -> list[tuple[int, dict[str, Any]]]:
    """(index, item) for every object in the list at ``tokens``; [] if there is no list."""
    value = _get(doc, tokens)
    if not isinstance(value, list):
        return []
    return [(i, item) for i, item in enumerate(value) if isinstance(item, dict)]


def find(doc: Any, tokens: Sequence[Token], value: str, key: str = "name") -> tuple[int, dict[str, Any]] | None:
    """The first (index, item) of the list at ``tokens`` whose ``key`` is ``value``, or None."""
    for i, item in items(doc, tokens):
        if item.get(key) == value:
            return i, item
    return None


def labels(pod: Mapping[str, Any]) -> dict[str, str]:
    """The Pod's labels ({} when absent or malformed)."""
    value = _get(pod, ["metadata", "labels"])
    return value if isinstance(value, dict) else {}


def annotations(pod: Mapping[str, Any]) -> dict[str, str]:
    """The Pod's annotations ({} when absent or malformed)."""
    value = _get(pod, ["metadata", "annotations"])
    return value if isinstance(value, dict) else {}


def has_spec(pod: Mapping[str, Any]) -> bool:
    return isinstance(pod.get("spec"), dict)


def container_names(pod: Mapping[str, Any]) -> set[str]:
    """Names of every container and init container of the Pod."""
    return {str(c.get("name")) for kind in ("containers", "initContainers") for _, c in items(pod, ["spec", kind])}


class PatchBuilder:
    """
    Accumulate JSON Patch operations against a private copy of a document.

    Each method applies its operation to the copy as well, so later
    operations see earlier ones (a list created by one ``append`` is appended
    to by the next). ``ops`` is the patch; ``doc`` is the result.
    """

    def __init__(self, doc: Mapping[str, Any]) -> None:
        self.doc: dict[str, Any] = copy.deepcopy(dict(doc))
        self.ops: list[PatchOp] = []

    def get(self, tokens: Sequence[Token], default: Any = None) -> Any:
        """The value at ``tokens`` in the working copy, or ``default``."""
        value = _get(self.doc, tokens)
        return default if value is _MISSING or value is None else value

    def _ensure_object(self, tokens: Sequence[Token]) -> dict[str, Any]:
        target = _get(self.doc, tokens)
        if isinstance(target, dict):
            return target
        if target is not _MISSING and target is not None:
            raise ValueError(f"{pointer(tokens)} is not an object")
        if not tokens:
            raise ValueError("the document root is not an object")
        parent = self._ensure_object(tokens[:-1])
        key = tokens[-1]
        if not isinstance(key, str):
            raise ValueError(f"cannot create {pointer(tokens)}")
        self.ops.append({"op": "add", "path": pointer(tokens), "value": {}})
        parent[key] = {}
        return parent[key]

    def append(self, tokens: Sequence[Token], value: Any) -> None:
        """Append ``value`` to the list at ``tokens``, creating the list if missing."""
        target = _get(self.doc, tokens)
        if isinstance(target, list):
            self.ops.append({"op": "add", "path": pointer(tokens) + "/-", "value": copy.deepcopy(value)})
            target.append(copy.deepcopy(value))
            return
        if target is not _MISSING and target is not None:
            raise ValueError(f"{pointer(tokens)} is not a list")
        parent = self._ensure_object(tokens[:-1])
        self.ops.append({"op": "add", "path": pointer(tokens), "value": [copy.deepcopy(value)]})
        parent[str(tokens[-1])] = [copy.deepcopy(value)]

    def put(self, tokens: Sequence[Token], key: str, value: Any) -> None:
        """Set ``key`` in the object at ``tokens``, creating the object if missing."""
        target = self._ensure_object(tokens)
        self.ops.append({"op": "add", "path": pointer([*tokens, key]), "value": copy.deepcopy(value)})
        target[key] = copy.deepcopy(value)

    def replace(self, tokens: Sequence[Token], value: Any) -> None:
        """Replace the existing value at ``tokens``."""
        if _get(self.doc, tokens) is _MISSING or not tokens:
            raise ValueError(f"{pointer(tokens)} does not exist")
        parent = _get(self.doc, tokens[:-1])
        self.ops.append({"op": "replace", "path": pointer(tokens), "value": copy.deepcopy(value)})
        parent[tokens[-1]] = copy.deepcopy(value)

    def set_env(self, container: int, name: str, value: str) -> None:
        """Give ``name`` the literal ``value`` in a container: replace it if defined differently, else add it."""
        tokens: list[Token] = ["spec", "containers", container, "env"]
        found = find(self.doc, tokens, name)
        wanted = {"name": name, "value": value}
        if found is None:
            self.append(tokens, wanted)
        elif found[1] != wanted:
            self.replace([*tokens, found[0]], wanted)

    def add_mount(self, container: int, mount: Mapping[str, Any]) -> None:
        """Mount unless the container already mounts that volume or uses that path."""
        tokens: list[Token] = ["spec", "containers", container, "volumeMounts"]
        if find(self.doc, tokens, mount["name"]) or find(self.doc, tokens, mount["mountPath"], "mountPath"):
            return
        self.append(tokens, dict(mount))

    def add_volume(self, volume: Mapping[str, Any]) -> None:
        """Add a Pod volume unless one of that name exists."""
        if find(self.doc, ["spec", "volumes"], volume["name"]) is None:
            self.append(["spec", "volumes"], dict(volume))
