"""
``/poddefault``: PodDefault presets, the Kubeflow admission webhook's use case.

A PodDefault says what to add to every Pod whose labels match its selector:
volumes, volume mounts, env and envFrom (Kubeflow's notebook UI labels a
notebook Pod with the PodDefaults its user picked). This endpoint applies
every matching preset, in name order, to every container, and names them
in the audit annotation ``poddefaults``.

A preset never overrides what the Pod (or an earlier preset) already
defines differently: a volume of the same name, an env var of the same
name with another value, a mount of another volume at the same path. Such a
conflict denies the Pod (403) with a message that names it. Everything a
preset adds is looked for first, so a second call on the changed Pod
returns no change; fields the API server defaults (a secret volume's
``defaultMode``) do not count as a difference.

Built in: ``add-gcp-secret`` (label ``add-gcp-secret: "true"``), the example
of Kubeflow's README. More presets come from a YAML file of PodDefault
manifests (``--presets FILE``).

Run it alone: ``python -m amp_examples.poddefault --presets presets.yaml``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import yaml
from twisted.python import usage

from amp_examples import serving
from amp_examples.patching import PatchBuilder, PatchOp, Token, find, has_spec, items, labels

SELECTOR_OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist"})
PRESET_FIELDS = frozenset({"selector", "desc", "env", "envFrom", "volumes", "volumeMounts"})


@dataclass(frozen=True)
class Preset:
    """A PodDefault: what to add to every Pod whose labels match ``selector``."""

    name: str
    selector: Mapping[str, Any]
    env: tuple[Mapping[str, Any], ...] = ()
    env_from: tuple[Mapping[str, Any], ...] = ()
    volumes: tuple[Mapping[str, Any], ...] = ()
    volume_mounts: tuple[Mapping[str, Any], ...] = ()
    desc: str = ""

    def __post_init__(self) -> None:
        validate_selector(self.selector)


class PresetConflict(Exception):
    """A preset cannot be applied to a Pod without changing what the Pod already defines."""


def validate_selector(selector: Any) -> None:
    """Raise ValueError unless ``selector`` is a well-formed Kubernetes LabelSelector."""
    if not isinstance(selector, Mapping):
        raise ValueError("selector must be a mapping")
    unknown = set(selector) - {"matchLabels", "matchExpressions"}
    if unknown:
        raise ValueError(f"selector has unknown field(s): {', '.join(sorted(unknown))}")
    labels = selector.get("matchLabels") or {}
    if not isinstance(labels, Mapping):
        raise ValueError("selector.matchLabels must be a mapping")
    for key, value in labels.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise ValueError(f"selector.matchLabels {key!r}: keys and values must be strings (quote them)")
    expressions = selector.get("matchExpressions") or []
    if not isinstance(expressions, list):
        raise ValueError("selector.matchExpressions must be a list")
    for n, expr in enumerate(expressions):
        where = f"selector.matchExpressions[{n}]"
        if not isinstance(expr, Mapping) or not isinstance(expr.get("key"), str):
            raise ValueError(f"{where} needs a string key")
        op = expr.get("operator")
        if op not in SELECTOR_OPERATORS:
            raise ValueError(f"{where}: operator {op!r} is not one of {', '.join(sorted(SELECTOR_OPERATORS))}")
        values = expr.get("values") or []
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise ValueError(f"{where}: values must be a list of strings")
        if op in ("In", "NotIn") and not values:
            raise ValueError(f"{where}: operator {op} needs values")
        if op in ("Exists", "DoesNotExist") and values:
            raise ValueError(f"{where}: operator {op} takes no values")


DEFAULT_PRESETS: tuple[Preset, ...] = (
    Preset(
        name="add-gcp-secret",
        desc="add gcp credential",
        selector={"matchLabels": {"add-gcp-secret": "true"}},
        volumes=({"name": "secret-volume", "secret": {"secretName": "gcp-secret"}},),
        volume_mounts=({"name": "secret-volume", "mountPath": "/secret/gcp"},),
        env=({"name": "GOOGLE_APPLICATION_CREDENTIALS", "value": "/secret/gcp/key.json"},),
    ),
)


def selector_matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """
    Kubernetes LabelSelector semantics: every matchLabels pair and every
    matchExpression must hold; an empty selector matches everything.

    ``In``: the key is present with one of the values. ``NotIn``: the key is
    absent or has none of the values. ``Exists``/``DoesNotExist``: presence.
    """
    validate_selector(selector)
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        present = key in labels
        if op == "In" and not (present and labels[key] in values):
            return False
        if op == "NotIn" and present and labels[key] in values:
            return False
        if op == "Exists" and not present:
            return False
        if op == "DoesNotExist" and present:
            return False
    return True


def _mapping_list(
    spec: Mapping[str, Any], key: str, where: str, required: Sequence[str]
) -> tuple[Mapping[str, Any], ...]:
    value = spec.get(key) or []
    if not isinstance(value, list):
        raise ValueError(f"{where}: {key} must be a list")
    for n, item in enumerate(value):
        if not isinstance(item, Mapping) or any(not isinstance(item.get(r), str) or not item.get(r) for r in required):
            raise ValueError(f"{where}: {key}[{n}] needs {' and '.join(required)}")
    return tuple(value)


def preset_from_mapping(doc: Mapping[str, Any], position: int = 0) -> Preset:
    """
    A Preset from a PodDefault manifest (``metadata.name`` + ``spec``) or a
    flat mapping (``name`` next to the spec fields).
    """
    if not isinstance(doc, Mapping):
        raise ValueError(f"preset #{position} is not a mapping")
    if "spec" in doc:
        metadata = doc.get("metadata") or {}
        name = metadata.get("name") if isinstance(metadata, Mapping) else None
        spec = doc["spec"]
    else:
        name = doc.get("name")
        spec = {k: v for k, v in doc.items() if k != "name"}
    if not isinstance(name, str) or not name:
        raise ValueError(f"preset #{position} has no name")
    where = f"preset {name}"
    if not isinstance(spec, Mapping):
        raise ValueError(f"{where}: spec must be a mapping")
    unknown = set(spec) - PRESET_FIELDS
    if unknown:
        raise ValueError(f"{where}: unsupported field(s) {', '.join(sorted(unknown))}")
    if "selector" not in spec:
        raise ValueError(f"{where}: selector is required")
    try:
        return Preset(
            name=name,
            selector=spec["selector"] or {},
            desc=str(spec.get("desc") or ""),
            env=_mapping_list(spec, "env", where, ["name"]),
            env_from=_mapping_list(spec, "envFrom", where, []),
            volumes=_mapping_list(spec, "volumes", where, ["name"]),
            volume_mounts=_mapping_list(spec, "volumeMounts", where, ["name", "mountPath"]),
        )
    except ValueError as e:
        if str(e).startswith(where):
            raise
        raise ValueError(f"{where}: {e}") from None


def parse_presets(text: str) -> list[Preset]:
    """
    Presets from YAML text: one or more documents, each a PodDefault manifest,
    a flat preset mapping, a list of those, or a list object with ``items``.
    """
    items: list[Any] = []
    try:
        documents = list(yaml.safe_load_all(text))
    except yaml.YAMLError as e:
        raise ValueError(f"presets are not valid YAML: {e}") from None
    for doc in documents:
        if doc is None:
            continue
        if isinstance(doc, Mapping) and isinstance(doc.get("items"), list):
            items.extend(doc["items"])
        elif isinstance(doc, list):
            items.extend(doc)
        else:
            items.append(doc)
    presets = [preset_from_mapping(item, n) for n, item in enumerate(items)]
    names = [p.name for p in presets]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"duplicate preset name(s): {', '.join(duplicates)}")
    return presets


def combine_presets(base: Iterable[Preset], extra: Iterable[Preset]) -> tuple[Preset, ...]:
    """``base`` plus ``extra``; a preset in ``extra`` replaces the one of the same name."""
    combined = {p.name: p for p in base}
    combined.update({p.name: p for p in extra})
    return tuple(combined.values())


def _same(wanted: Any, existing: Any) -> bool:
    """
    True when ``existing`` already has everything ``wanted`` sets.

    The API server defaults fields before webhooks see the Pod (a secret
    volume gains ``defaultMode: 420``), so extra fields on the existing side
    do not count as a difference.
    """
    if isinstance(wanted, Mapping) and isinstance(existing, Mapping):
        return all(k in existing and _same(v, existing[k]) for k, v in wanted.items())
    return bool(wanted == existing)


def matching_presets(pod: Mapping[str, Any], presets: Iterable[Preset]) -> list[Preset]:
    """The presets whose selector matches the Pod's labels, ordered by name."""
    pod_labels = labels(pod)
    return sorted((p for p in presets if selector_matches(p.selector, pod_labels)), key=lambda p: p.name)


def _apply_preset(b: PatchBuilder, preset: Preset) -> None:
    def conflict(what: str) -> PresetConflict:
        return PresetConflict(f"PodDefault {preset.name} conflicts with the pod: {what}")

    for volume in preset.volumes:
        found = find(b.doc, ["spec", "volumes"], volume["name"])
        if found is None:
            b.append(["spec", "volumes"], dict(volume))
        elif not _same(volume, found[1]):
            raise conflict(f"volume {volume['name']} already exists with a different definition")
    for i, container in items(b.doc, ["spec", "containers"]):
        cname = container.get("name", i)
        for env in preset.env:
            found = find(b.doc, ["spec", "containers", i, "env"], env["name"])
            if found is None:
                b.append(["spec", "containers", i, "env"], dict(env))
            elif not _same(env, found[1]):
                raise conflict(f"env {env['name']} in container {cname} already has a different value")
        for env_from in preset.env_from:
            if not any(_same(env_from, e) for _, e in items(b.doc, ["spec", "containers", i, "envFrom"])):
                b.append(["spec", "containers", i, "envFrom"], dict(env_from))
        for mount in preset.volume_mounts:
            tokens: list[Token] = ["spec", "containers", i, "volumeMounts"]
            by_name = find(b.doc, tokens, mount["name"])
            by_path = find(b.doc, tokens, mount["mountPath"], "mountPath")
            if by_name is None and by_path is None:
                b.append(tokens, dict(mount))
            elif by_name is None or not _same(mount, by_name[1]):
                raise conflict(
                    f"container {cname} already mounts "
                    + (f"{mount['mountPath']}" if by_name is None else f"volume {mount['name']}")
                    + " differently"
                )


def poddefault_patch(
    pod: Mapping[str, Any], presets: Iterable[Preset] = DEFAULT_PRESETS
) -> tuple[list[PatchOp], list[str]]:
    """
    Apply every matching preset; returns (ops, names of the presets applied).

    Raises PresetConflict when a preset would have to change something the
    Pod (or an earlier preset) already defines differently: a volume of the
    same name, an env var of the same name with another value, a mount of the
    same volume elsewhere or of another volume at the same path.
    """
    matched = matching_presets(pod, presets)
    if not matched or not has_spec(pod):
        return [], []
    b = PatchBuilder(pod)
    for preset in matched:
        _apply_preset(b, preset)
    return b.ops, [p.name for p in matched]


def poddefault_reply(pod: Mapping[str, Any], presets: Iterable[Preset] = DEFAULT_PRESETS) -> dict[str, Any]:
    """Object form: the patch plus an audit annotation naming the presets, or a 403 denial on conflict."""
    try:
        ops, applied = poddefault_patch(pod, presets)
    except PresetConflict as e:
        return {"allowed": False, "status": {"code": 403, "message": str(e)}}
    reply: dict[str, Any] = {"patch": ops, "allowed": True}
    if applied:
        reply["auditAnnotations"] = {"poddefaults": ",".join(applied)}
    return reply


class Options(serving.Options):
    longdesc = "Serve /poddefault: Kubeflow-style PodDefault presets."
    optParameters = [
        [
            "presets",
            None,
            None,
            "YAML file of PodDefault-style presets for /poddefault, added to the built-in "
            "add-gcp-secret preset (a preset of the same name replaces it).",
        ],
    ]

    def postOptions(self) -> None:
        super().postOptions()
        extra: list[Preset] = []
        if self["presets"]:
            try:
                with open(self["presets"], encoding="utf-8") as f:
                    extra = parse_presets(f.read())
            except (OSError, ValueError) as e:
                raise usage.UsageError(f"--presets {self['presets']}: {e}") from None
        self["preset_list"] = combine_presets(DEFAULT_PRESETS, extra)


def endpoints(options: Mapping[str, Any]) -> dict[str, serving.Handler]:
    presets = tuple(options.get("preset_list", DEFAULT_PRESETS))
    return {"poddefault": lambda pod, call: poddefault_reply(pod, presets)}


if __name__ == "__main__":
    serving.main(Options, endpoints)
