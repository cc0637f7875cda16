"""
Composition of checked patches (pure): a chain's steps into the one patch
the API server applies (L{compose}), and amp's own annotations after an
endpoint's patch (L{annotate}).
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from amp.patch._check import DEFAULT_DENIED, CheckedPatch, check_patch, unchanged
from amp.pointer import escape_pointer_token


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
    not apply to them: they are amp's, not the endpoint's.  The Pod they
    leave is built directly (a property test holds it to applying them).
    """
    ops = annotation_ops(checked.pod, changes)
    if not ops:
        return checked
    # What applying ops does, without parsing and walking them: they are
    # amp's own, on the one path annotation_ops made them for.
    pod = dict(checked.pod)
    metadata = pod.get("metadata")
    sets = {k: v for k, v in changes.items() if v is not None}
    if type(metadata) is not dict:
        pod["metadata"] = {"annotations": sets}
    else:
        metadata = pod["metadata"] = dict(metadata)
        annotations = metadata.get("annotations")
        if type(annotations) is not dict:
            metadata["annotations"] = sets
        else:
            annotations = metadata["annotations"] = dict(annotations)
            for key, value in changes.items():
                if value is not None:
                    annotations[key] = value
                else:
                    annotations.pop(key, None)
    return CheckedPatch(checked.operations + ops, checked.repaired, checked.warnings, pod)
