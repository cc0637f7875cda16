"""
What differs between two admitted Pods, by JSON path (pure).

Replay and the canary both ask the same question of two answers to one
review: would the Pod be stored the same?  L{pod_differences} answers it as
a list of L{Difference}s, one per JSON pointer where the two documents part
(the deepest place they still share a shape), so a report can say
C{/spec/containers/1/image: "proxy:1.4" -> "proxy:1.5"} instead of
printing two Pods.

amp's own status stamp is left out of the comparison: it names the
endpoint that answered, which is exactly what differs when two endpoint
versions are compared, and the results are compared beside it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Mapping, Optional

from amp.patch import escape_pointer_token as escape_token
from amp.podjson import RAW, decoded

__all__ = ["Difference", "MISSING", "pod_differences", "without_annotations"]


class _Missing:
    """A place present in one document and absent from the other."""

    def __repr__(self) -> str:
        return "MISSING"


#: A L{Difference}'s C{before} or C{after} where that side has no value.
MISSING: Any = _Missing()


@dataclass(frozen=True, slots=True)
class Difference:
    """
    One place where two documents part.

    @ivar path: the JSON pointer of the place (RFC 6901).
    @ivar before: the first document's value there, or L{MISSING}.
    @ivar after: the second document's value there, or L{MISSING}.
    """

    path: str
    before: Any
    after: Any

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path}
        if self.before is not MISSING:
            out["before"] = self.before
        if self.after is not MISSING:
            out["after"] = self.after
        return out


def without_annotations(pod: Mapping[str, Any], keys: Iterable[str]) -> Mapping[str, Any]:
    """
    C{pod} without the annotations C{keys} (a shallow copy where it
    changes; C{pod} itself is never modified).
    """
    metadata = pod.get("metadata")
    if not isinstance(metadata, Mapping):
        return pod
    annotations = metadata.get("annotations")
    if not isinstance(annotations, Mapping) or not any(k in annotations for k in keys):
        return pod
    kept = {k: v for k, v in annotations.items() if k not in set(keys)}
    new_metadata = dict(metadata)
    if kept:
        new_metadata["annotations"] = kept
    else:
        del new_metadata["annotations"]
    out = dict(pod)
    out["metadata"] = new_metadata
    return out


def pod_differences(
    before: Optional[Mapping[str, Any]],
    after: Optional[Mapping[str, Any]],
    *,
    ignore_annotations: Iterable[str] = (),
    limit: int = 100,
) -> tuple[Difference, ...]:
    """
    Where C{before} and C{after} part, by JSON pointer, in document order;
    at most C{limit} places.  C{None} stands for "no Pod admitted" (a
    denied review): it differs from any Pod at the root.

    @raise amp.podjson.MemberError: a part one Pod still holds raw, and
        the other does not hold the same, does not decode.
    """
    if before is None or after is None:
        if before is None and after is None:
            return ()
        return (Difference("", MISSING if before is None else "admitted", MISSING if after is None else "admitted"),)
    keys = tuple(ignore_annotations)
    if keys:
        before, after = without_annotations(before, keys), without_annotations(after, keys)
    out: list[Difference] = []
    for difference in _walk("", before, after):
        out.append(difference)
        if len(out) >= limit:
            break
    return tuple(out)


def _walk(path: str, a: Any, b: Any) -> Iterator[Difference]:
    # An explicit stack, not recursion: a Pod nested deeper than Python's
    # recursion limit must not crash a comparison (replay reads files).
    stack: list[tuple[str, Any, Any]] = [(path, a, b)]
    while stack:
        where, x, y = stack.pop()
        if x is y or (type(x) is type(y) and not isinstance(x, (dict, list)) and x == y):
            continue
        if type(x) is RAW or type(y) is RAW:
            # A part still raw in one Pod (amp.podjson: a member no patch
            # read, the metadata's managedFields) is compared as what it
            # holds: a Pod whose spec one patch read (and so decoded) and
            # another did not is still the same.
            name = where[1:].replace("/", ".")
            stack.append((where, decoded(x, name) if type(x) is RAW else x, decoded(y, name) if type(y) is RAW else y))
            continue
        if isinstance(x, dict) and isinstance(y, dict):
            pending = []
            for key in x:
                sub = f"{where}/{escape_token(str(key))}"
                pending.append((sub, x[key], y[key] if key in y else MISSING))
            for key in y:
                if key not in x:
                    pending.append((f"{where}/{escape_token(str(key))}", MISSING, y[key]))
            stack.extend(reversed(pending))
        elif isinstance(x, list) and isinstance(y, list):
            pending = []
            for i in range(max(len(x), len(y))):
                pending.append((f"{where}/{i}", x[i] if i < len(x) else MISSING, y[i] if i < len(y) else MISSING))
            stack.extend(reversed(pending))
        elif x is MISSING or y is MISSING or x != y or type(x) is not type(y):
            yield Difference(where, x, y)
