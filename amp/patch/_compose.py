"""
Composition of checked patches (pure): a chain's steps into the one patch
the API server applies (L{compose}), and amp's own annotations after an
endpoint's patch (L{annotate}).
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from amp.patch._check import DEFAULT_DENIED, CheckedPatch, check_patch, unchanged
from amp.pointer import escape_pointer_token


def compose(
    pod: dict[str, Any],
    steps: Sequence[CheckedPatch],
    *,
    denied: Sequence[str] = DEFAULT_DENIED,
    allowed: Sequence[str] = (),
    max_operations: int = 1000,
) -> CheckedPatch:
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
    whole = check_patch(pod, operations, denied=denied, allowed=allowed, repair=False, max_operations=max_operations)
    warnings = tuple(w for step in steps for w in step.warnings)
    return CheckedPatch(whole.operations, sum(step.repaired for step in steps), warnings, whole.pod)


def annotation_ops(pod: Any, changes: Mapping[str, Optional[str]]) -> list[dict[str, Any]]:
    """
    The operations that make C{pod}'s C{metadata.annotations} hold each key
    of C{changes} set to its value, or without it where the value is None:
    creating C{/metadata/annotations} (or C{/metadata}) when it is missing
    or not an object, removing only keys that are there.
    """
    return _annotated(pod, changes, False)[0]


def annotate(checked: CheckedPatch, changes: Mapping[str, Optional[str]]) -> CheckedPatch:
    """
    amp's own annotations after an endpoint's checked patch: the operations
    of L{annotation_ops} for the Pod as the patch leaves it
    (L{CheckedPatch.pod}), and that Pod with them applied.  They apply
    whatever the endpoint's patch did to C{/metadata/annotations} (replaced
    it, removed it, set one of the same keys), and C{patch.denied_paths}
    does not apply to them: they are amp's, not the endpoint's.
    """
    ops, pod = _annotated(checked.pod, changes, True)
    if not ops:
        return checked
    return CheckedPatch(checked.operations + ops, checked.repaired, checked.warnings, pod)


def _annotated(pod: Any, changes: Mapping[str, Optional[str]], build: bool) -> tuple[list[dict[str, Any]], Any]:
    """
    L{annotation_ops} for C{pod} and, with C{build}, the Pod they leave,
    copied on write (what applying them does, without parsing and walking
    operations amp made itself; a property test holds the two together).
    """
    sets = {k: v for k, v in changes.items() if v is not None}
    metadata = pod.get("metadata") if type(pod) is dict else None
    if type(metadata) is not dict:
        if not sets:
            return [], None
        return (
            [{"op": "add", "path": "/metadata", "value": {"annotations": sets}}],
            {**pod, "metadata": {"annotations": dict(sets)}} if build else None,
        )
    annotations = metadata.get("annotations")
    if type(annotations) is not dict:
        if not sets:
            return [], None
        return (
            [{"op": "add", "path": "/metadata/annotations", "value": sets}],
            {**pod, "metadata": {**metadata, "annotations": dict(sets)}} if build else None,
        )
    ops: list[dict[str, Any]] = []
    after = dict(annotations) if build else annotations
    for key, value in changes.items():
        path = "/metadata/annotations/" + escape_pointer_token(key)
        if value is not None:
            ops.append({"op": "add", "path": path, "value": value})
            if build:
                after[key] = value
        elif key in annotations:
            ops.append({"op": "remove", "path": path})
            if build:
                del after[key]
    if not (build and ops):
        return ops, None
    return ops, {**pod, "metadata": {**metadata, "annotations": after}}
