"""
The structural sanity of a patched Pod (pure): a patch that would make the
Pod undecodable or invalid is blamed on the endpoint here rather than
rejected by the API server whatever the failure policy.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from amp.patch._ops import Op, PatchError
from amp.podjson import MemberError, member
from amp.pointer import json_type
from amp.reasons import Reason

_CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")


#: The parts of a Pod L{_pod_problems} checks: C{metadata} (the object
#: itself, its labels and annotations), C{labels}, C{annotations},
#: C{volumes} (and every container's mounts of them), C{containers} (every
#: container list: names are unique across them).
ALL_PARTS = frozenset({"metadata", "labels", "annotations", "spec", "volumes", "containers"})
#: The parts read from C{spec} (left raw, L{amp.podjson}, when none changed).
_SPEC_PARTS = frozenset({"spec", "volumes", "containers"})


def parts_changed(ops: Sequence[Op]) -> frozenset[str]:
    """
    The parts of the Pod (L{ALL_PARTS}) that C{ops} may change: a problem
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
                    return ALL_PARTS
                continue
            top, field = tokens[0], tokens[1]
            if top == "metadata" and field in ("labels", "annotations"):
                parts.add(field)
            elif top == "spec" and field == "volumes":
                parts.add("volumes")
            elif top == "spec" and field in _CONTAINER_LISTS:
                parts.add("containers")
    return frozenset(parts)


def _pod_problems(pod: dict[str, Any], parts: frozenset[str] = ALL_PARTS) -> list[tuple[str, str]]:
    """
    Structural problems of C{pod} that make the API server refuse it, as
    (check, message) pairs, in C{parts} of it (L{ALL_PARTS}).
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
                out.append((field, f"metadata.{field} must be an object, not {json_type(m)}"))
                continue
            for k, v in m.items():
                if type(v) is not str:
                    out.append((field, f"metadata.{field}[{q(k)}] must be a string, not {json_type(v)}"))
                    break
    if not parts & _SPEC_PARTS:
        return out
    try:
        spec = member(pod, "spec")
    except MemberError as e:
        out.append(("spec", str(e)))
        return out
    if type(spec) is not dict:
        if "spec" in parts:
            out.append(("spec", "spec must be an object"))
        return out
    volumes_changed = "volumes" in parts or "spec" in parts
    if not volumes_changed and "containers" not in parts:
        return out

    volume_names: set[object] = set()
    volumes = spec.get("volumes")
    if volumes is not None and not volumes_changed:
        # Only the names, for the mounts below: the volumes did not change.
        if type(volumes) is list:
            volume_names = {v.get("name") for v in volumes if type(v) is dict}
    elif volumes is not None:
        if type(volumes) is not list:
            out.append(("volumes", f"spec.volumes must be a list, not {json_type(volumes)}"))
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
            out.append(("containers", f"spec.{field} must be a list, not {json_type(containers)}"))
            continue
        for i, c in enumerate(containers):
            where = f"spec.{field}[{i}]"
            if type(c) is not dict:
                out.append(("container", f"{where} must be an object, not {json_type(c)}"))
                continue
            name = c.get("name")
            if type(name) is not str or not name:
                out.append(("container-name", f"{where}.name must be a non-empty string"))
            elif name in seen:
                out.append(
                    ("container-name-unique", f"container name {q(name)} is used by both {seen[name]} and {where}")
                )
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
                    out.append(("env", f"{where}.env must be a list, not {json_type(env)}"))
                else:
                    for j, var in enumerate(env):
                        ename = var.get("name") if type(var) is dict else None
                        if type(ename) is not str or not ename:
                            out.append(("env", f"{where}.env[{j}] must be an object with a non-empty string name"))
                            continue
                        value = var.get("value")
                        if value is not None and type(value) is not str:
                            out.append(
                                (
                                    "env-value",
                                    f"{where}.env[{j}].value ({ename}) must be a string, not {json_type(value)}",
                                )
                            )
            mounts = c.get("volumeMounts")
            if mounts is not None:
                if type(mounts) is not list:
                    out.append(("volume-mount", f"{where}.volumeMounts must be a list, not {json_type(mounts)}"))
                else:
                    for j, m in enumerate(mounts):
                        mname = m.get("name") if type(m) is dict else None
                        if type(mname) is not str:
                            out.append(
                                ("volume-mount", f"{where}.volumeMounts[{j}] must be an object with a string name")
                            )
                        elif mname not in volume_names:
                            out.append(
                                (
                                    "volume-mount",
                                    f"{where}.volumeMounts[{j}] mounts volume {q(mname)}, which is not in spec.volumes",
                                )
                            )
    return out


def check_pod(original: dict[str, Any], patched: dict[str, Any], parts: frozenset[str] = ALL_PARTS) -> None:
    problems = _pod_problems(patched, parts)
    if not problems:
        return
    already = {check for check, _ in _pod_problems(original, parts)}
    new = [message for check, message in problems if check not in already]
    if new:
        more = f" (and {len(new) - 1} more)" if len(new) > 1 else ""
        raise PatchError(Reason.INVALID_POD, f"the patched Pod would be invalid: {new[0]}{more}")
