"""
The places amp's endpoints decide, and a running Pod compared with them
(pure): the comparison at the heart of C{amp audit}.

L{touched_places} reads what the pipeline's patch did to a workload's
template Pod (the template as amp reviews it, and the Pod it admits): each
place the patch changed becomes a L{Place}, a path whose list steps name
the element by its C{name} (containers, volumes, mounts, env) or by its
content (a toleration), never by its index.  An index would not survive
what the API server and other admission plugins do to the real Pod before
and after amp (the service account's volume before amp's, another
injector's container after), but a name does.

L{compare} looks at a running Pod only at those places, and asks whether
what the endpoint would give now is there: every member the endpoint sets
must have the endpoint's value; members the Pod has beside it (defaults,
other plugins' fields) do not count.  A place the endpoint removes must be
absent.  Each place that differs is a L{amp.record.Difference} with the
running Pod's concrete JSON pointer, its value now and the value the
endpoint would give (C{/spec/containers/1/image: "envoy:v1.27" ->
"envoy:v1.28"}).

What this cannot see: a change the endpoint made in the past and no
longer makes at a place it no longer touches (an older version's extra
volume): nothing in the Pod says who put it there.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable, Optional, Union

from amp.poddiff import MISSING, Difference, pod_differences
from amp.pointer import escape_pointer_token
from amp.rules import STAMP_ANNOTATIONS

__all__ = ["Named", "Like", "Place", "Step", "compare", "touched_places"]


@dataclass(frozen=True, slots=True)
class Named:
    """A list element picked by its C{name} member."""

    name: str


@dataclass(frozen=True, slots=True)
class Like:
    """
    A list element picked by content: the first element that holds every
    member of C{element} (kept as JSON text so the step is hashable).
    """

    element: str


#: One step of a L{Place}: a mapping member, or a list element.
Step = Union[str, Named, Like]


@dataclass(frozen=True, slots=True)
class Place:
    """A place in a Pod the endpoint decides, by L{Step}s from the root."""

    steps: tuple[Step, ...]

    def __str__(self) -> str:
        out = []
        for step in self.steps:
            if isinstance(step, Named):
                out.append(f"[name={step.name}]")
            elif isinstance(step, Like):
                out.append(f"[{step.element}]")
            else:
                out.append("/" + escape_pointer_token(step))
        return "".join(out) or "/"

    def within(self, other: "Place") -> bool:
        """Whether this place is C{other} or lies inside it."""
        return self.steps[: len(other.steps)] == other.steps


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def _named(element: Any) -> Optional[str]:
    name = element.get("name") if isinstance(element, dict) else None
    return name if isinstance(name, str) else None


def _place_of(pointer: str, template: Any, admitted: Any) -> Place:
    """
    The L{Place} of the JSON pointer C{pointer} where C{template} and
    C{admitted} differ: list indexes become names, or the element itself,
    or the list as a whole for a list of scalars.
    """
    steps: list[Step] = []
    a, b = template, admitted
    for token in pointer.split("/")[1:] if pointer else ():
        key = _unescape(token)
        if isinstance(b, dict) or isinstance(a, dict):
            steps.append(key)
            a = a.get(key, MISSING) if isinstance(a, dict) else MISSING
            b = b.get(key, MISSING) if isinstance(b, dict) else MISSING
            continue
        if isinstance(a, list) or isinstance(b, list):
            i = int(key) if key.isdigit() else -1
            ea = a[i] if isinstance(a, list) and 0 <= i < len(a) else MISSING
            eb = b[i] if isinstance(b, list) and 0 <= i < len(b) else MISSING
            sample = eb if eb is not MISSING else ea
            name = _named(sample)
            if name is not None:
                # The same element on both sides, if the template has it.
                steps.append(Named(name))
                a = next((e for e in a if _named(e) == name), MISSING) if isinstance(a, list) else MISSING
                b = next((e for e in b if _named(e) == name), MISSING) if isinstance(b, list) else MISSING
                continue
            if isinstance(sample, dict) and eb is not MISSING:
                steps.append(Like(json.dumps(eb, sort_keys=True)))
            # A list of scalars (or an element that left): the list is the place.
            break
        break
    return Place(tuple(steps))


def touched_places(
    template: dict[str, Any], admitted: dict[str, Any], ignore_annotations: Iterable[str] = STAMP_ANNOTATIONS
) -> tuple[Place, ...]:
    """
    The places where the admitted Pod differs from the template Pod it
    was made from (amp's stamps left out), outermost first, none inside
    another.
    """
    differences = pod_differences(template, admitted, ignore_annotations=tuple(ignore_annotations), limit=10_000)
    places: list[Place] = []
    for place in sorted(
        {_place_of(d.path, template, admitted) for d in differences}, key=lambda p: (len(p.steps), str(p))
    ):
        if not any(place.within(outer) for outer in places):
            places.append(place)
    return tuple(places)


# ---------------------------------------------------------------- comparing


def _holds(have: Any, want: Any) -> bool:
    """Whether C{have} holds everything C{want} says (see L{_differences})."""
    return not _differences("", have, want, limit=1)


def _element(items: Any, step: Union[Named, Like], base: str) -> tuple[Any, str]:
    """The element of the list C{items} that C{step} picks, and its pointer."""
    if isinstance(items, list):
        if isinstance(step, Named):
            for i, e in enumerate(items):
                if _named(e) == step.name:
                    return e, f"{base}/{i}"
        else:
            want = json.loads(step.element)
            for i, e in enumerate(items):
                if _holds(e, want):
                    return e, f"{base}/{i}"
    return MISSING, f"{base}/-"


def _at(doc: Any, place: Place) -> tuple[Any, str]:
    """The value at C{place} in C{doc} (or L{MISSING}) and its JSON pointer there."""
    pointer = ""
    value = doc
    for step in place.steps:
        if isinstance(step, str):
            value = value.get(step, MISSING) if isinstance(value, dict) else MISSING
            pointer = f"{pointer}/{escape_pointer_token(step)}"
        elif value is MISSING:
            # Past a missing part, the pointer names where it would go.
            pointer = f"{pointer}/-"
        else:
            value, pointer = _element(value, step, pointer)
    return value, pointer


def _same_scalar(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b


def _same_json(a: Any, b: Any) -> bool:
    """Equal as JSON (C{1} is not C{true}, nor C{1.0})."""
    if a is MISSING or b is MISSING:
        return a is b
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def _differences(
    pointer: str, have: Any, want: Any, limit: int, names: tuple[Any, Any] = (MISSING, MISSING)
) -> list[Difference]:
    """
    Where C{have} (the running Pod's value) lacks what C{want} (the
    endpoint's) says: every member of a mapping, every named or mapping
    element of a list (found by name or content, wherever it is), a list
    of scalars as a whole, a scalar by value.  C{names}: the template's
    Pod name and the running Pod's; an endpoint that writes the Pod's own
    name (a sidecar's identity) wrote the template's where the running
    Pod has its own, and that is no difference.  Nor is an empty string
    the API server did not store: it leaves out a string field's empty
    value (C{omitempty}, as an env var's C{value: ""}).
    """
    out: list[Difference] = []
    stack: list[tuple[str, Any, Any]] = [(pointer, have, want)]
    while stack and len(out) < limit:
        where, h, w = stack.pop()
        if isinstance(w, dict):
            if not isinstance(h, dict):
                out.append(Difference(where, h, w))
                continue
            for key in reversed(list(w)):
                stack.append((f"{where}/{escape_pointer_token(str(key))}", h.get(key, MISSING), w[key]))
        elif isinstance(w, list) and w and all(isinstance(e, dict) for e in w):
            if not isinstance(h, list):
                out.append(Difference(where, h, w))
                continue
            pending = []
            for e in w:
                name = _named(e)
                if name is not None:
                    found = next(((i, x) for i, x in enumerate(h) if _named(x) == name), None)
                else:
                    found = next(((i, x) for i, x in enumerate(h) if _holds(x, e)), None)
                if found is None:
                    out.append(Difference(f"{where}/-", MISSING, e))
                else:
                    pending.append((f"{where}/{found[0]}", found[1], e))
            stack.extend(reversed(pending))
        elif isinstance(w, list):
            if not _same_json(h, w):
                out.append(Difference(where, h, w))
        elif not (_same_scalar(h, w) or (w == names[0] and h == names[1]) or (w == "" and h is MISSING)):
            out.append(Difference(where, h, w))
    return out


def compare(
    running: dict[str, Any], admitted: dict[str, Any], places: Iterable[Place], limit: int = 50
) -> tuple[Difference, ...]:
    """
    Where C{running} differs from C{admitted} (what the endpoint would
    give now) at C{places}, by C{running}'s JSON pointers: its value now
    (C{before}) and the endpoint's (C{after}); at most C{limit}.
    """
    out: list[Difference] = []
    names = ((admitted.get("metadata") or {}).get("name", ""), (running.get("metadata") or {}).get("name", MISSING))
    for place in places:
        want, _ = _at(admitted, place)
        have, pointer = _at(running, place)
        if want is MISSING:
            if have is not MISSING:
                out.append(Difference(pointer, have, MISSING))
        else:
            out.extend(_differences(pointer, have, want, limit - len(out), names))
        if len(out) >= limit:
            break
    return tuple(out[:limit])
