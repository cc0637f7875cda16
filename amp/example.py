"""
Example amp endpoints as pure functions: Pod in, JSON Patch / reply out.

This module owns the business logic of the example endpoint server (one
function per use case amp was built for); ``amp.example_tap`` puts thin
twisted.web resources on top. Nothing here does I/O.

Every patch is built against a working copy of the Pod (``PatchBuilder``),
so each operation applies cleanly after the ones before it: a list that does
not exist yet is created with ``add <path> [value]`` rather than appended to
with ``<path>/-``. amp repairs missing parents itself, but these examples do
not rely on it.

Replies come in the two shapes of amp's endpoint protocol: a bare JSON array
of RFC 6902 operations, or an object ``{"patch", "allowed", "status",
"warnings", "auditAnnotations"}``.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import yaml

Pod = dict[str, Any]
PatchOp = dict[str, Any]
Reply = dict[str, Any]
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


class PatchBuilder:
    """
    Accumulate JSON Patch operations against a private copy of a document.

    Each method applies its operation to the copy as well, so later
    operations see earlier ones (a list created by one ``append`` is appended
    to by the next).
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


def _items(doc: Any, tokens: Sequence[Token]) -> list[tuple[int, dict[str, Any]]]:
    """(index, item) for every object in the list at ``tokens``; [] if there is no list."""
    value = _get(doc, tokens)
    if not isinstance(value, list):
        return []
    return [(i, item) for i, item in enumerate(value) if isinstance(item, dict)]


def _find(doc: Any, tokens: Sequence[Token], name: str, key: str = "name") -> tuple[int, dict[str, Any]] | None:
    for i, item in _items(doc, tokens):
        if item.get(key) == name:
            return i, item
    return None


def _labels(pod: Mapping[str, Any]) -> dict[str, str]:
    labels = _get(pod, ["metadata", "labels"])
    return labels if isinstance(labels, dict) else {}


def _annotations(pod: Mapping[str, Any]) -> dict[str, str]:
    annotations = _get(pod, ["metadata", "annotations"])
    return annotations if isinstance(annotations, dict) else {}


def _has_spec(pod: Mapping[str, Any]) -> bool:
    return isinstance(pod.get("spec"), dict)


def _container_names(pod: Mapping[str, Any]) -> set[str]:
    return {
        str(c.get("name"))
        for kind in ("containers", "initContainers")
        for _, c in _items(pod, ["spec", kind])
    }


def _set_env(b: PatchBuilder, container: int, name: str, value: str) -> None:
    """Give ``name`` the literal ``value`` in a container: replace it if defined, else add it."""
    env_tokens: list[Token] = ["spec", "containers", container, "env"]
    found = _find(b.doc, env_tokens, name)
    wanted = {"name": name, "value": value}
    if found is None:
        b.append(env_tokens, wanted)
    elif found[1] != wanted:
        b.replace([*env_tokens, found[0]], wanted)


def _add_mount(b: PatchBuilder, container: int, mount: Mapping[str, Any]) -> None:
    """Mount unless the container already mounts that volume or uses that path."""
    tokens: list[Token] = ["spec", "containers", container, "volumeMounts"]
    if _find(b.doc, tokens, mount["name"]) or _find(b.doc, tokens, mount["mountPath"], "mountPath"):
        return
    b.append(tokens, dict(mount))


# --- /user-env: the JupyterHub use case -------------------------------------

USERNAME_KEY = "hub.jupyter.org/username"
ANONYMOUS = "anonymous"
USER_VOLUME = "user-home"
USER_INIT_CONTAINER = {"name": "new-init-container", "image": "alpine:3.12.0"}
ADDED_VAR = ("ADDED_VAR", "something important")


def pod_username(pod: Mapping[str, Any]) -> str:
    """The JupyterHub user of a Pod: annotation, else label, else ``anonymous``."""
    for source in (_annotations(pod), _labels(pod)):
        value = source.get(USERNAME_KEY)
        if isinstance(value, str) and value.strip():
            return value.strip()
    return ANONYMOUS


def home_dir_name(user: str) -> str:
    """
    A safe single path segment for ``user``.

    Anything outside ``[A-Za-z0-9._-]`` becomes ``-``; ``.``/``..`` and empty
    results fall back to ``anonymous`` (a mountPath may not contain ``..``).
    """
    segment = re.sub(r"[^A-Za-z0-9._-]", "-", user)
    if segment in ("", ".", "..") or set(segment) <= {"."}:
        return ANONYMOUS
    return segment


def user_env_patch(pod: Mapping[str, Any]) -> list[PatchOp]:
    """
    The original amp example: per-user env vars, home volume and an init container.

    Every container gets ``AMP_USER=<user>`` and ``ADDED_VAR=something
    important`` (an existing variable of that name is replaced); the Pod gets
    an ``emptyDir`` volume ``user-home`` mounted at ``/home/<user>`` in the
    first container and an init container ``new-init-container``. Things
    that are already there are left alone, so applying the patch twice adds
    nothing the second time.
    """
    if not _has_spec(pod):
        return []
    user = pod_username(pod)
    b = PatchBuilder(pod)
    containers = _items(pod, ["spec", "containers"])
    for i, _ in containers:
        _set_env(b, i, "AMP_USER", user)
        _set_env(b, i, *ADDED_VAR)
    if _find(b.doc, ["spec", "volumes"], USER_VOLUME) is None:
        b.append(["spec", "volumes"], {"name": USER_VOLUME, "emptyDir": {}})
    if containers and containers[0][0] == 0:
        _add_mount(b, 0, {"name": USER_VOLUME, "mountPath": f"/home/{home_dir_name(user)}"})
    if USER_INIT_CONTAINER["name"] not in _container_names(b.doc):
        b.append(["spec", "initContainers"], dict(USER_INIT_CONTAINER))
    return b.ops


# --- /registry: the API Gateway image-rewrite use case ----------------------

DOCKER_HUB = "docker.io"
DOCKER_HUB_ALIASES = frozenset({"docker.io", "index.docker.io", "registry-1.docker.io"})
DEFAULT_REGISTRY_MAP: Mapping[str, str] = {"gcr.io": "asia.gcr.io", "docker.io": "mirror.local"}


def split_image(image: str) -> tuple[str, str]:
    """
    Split an image reference into (registry, repository-and-tag), Docker style.

    The first path component is a registry only if it contains ``.`` or
    ``:`` or is ``localhost``; otherwise the image lives on Docker Hub
    (``docker.io``). Docker Hub images with a single-component repository
    are official images under ``library/``. So ``nginx:1.25`` is
    ``("docker.io", "library/nginx:1.25")``, ``bitnami/redis`` is
    ``("docker.io", "bitnami/redis")`` and ``gcr.io/nginx:latest`` is
    ``("gcr.io", "nginx:latest")``. The Docker Hub aliases
    ``index.docker.io`` and ``registry-1.docker.io`` count as ``docker.io``.
    """
    first, slash, rest = image.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        registry, remainder = first, rest
    else:
        registry, remainder = DOCKER_HUB, image
    if registry in DOCKER_HUB_ALIASES:
        registry = DOCKER_HUB
        if "/" not in remainder:
            remainder = "library/" + remainder
    return registry, remainder


def parse_registry_map(entries: Iterable[str]) -> dict[str, str]:
    """
    Parse ``FROM=TO`` entries (``gcr.io=asia.gcr.io``) into a mapping.

    ``FROM`` is a registry host (optionally with port); ``TO`` is a registry
    host optionally followed by a path prefix (``mirror.local/hub``).
    """
    result: dict[str, str] = {}
    for entry in entries:
        source, eq, target = entry.partition("=")
        source, target = source.strip(), target.strip().rstrip("/")
        if not eq or not source or not target:
            raise ValueError(f"registry map entry {entry!r} is not FROM=TO")
        if "/" in source:
            raise ValueError(f"registry map entry {entry!r}: FROM must be a registry host, not a path")
        result[DOCKER_HUB if source in DOCKER_HUB_ALIASES else source] = target
    return result


def rewrite_image(image: str, registry_map: Mapping[str, str]) -> str | None:
    """The rewritten image reference, or None when its registry is not mapped."""
    if not image:
        return None
    registry, remainder = split_image(image)
    target = registry_map.get(registry)
    if target is None:
        return None
    rewritten = f"{target}/{remainder}"
    return None if rewritten == image else rewritten


def registry_reply(pod: Mapping[str, Any], registry_map: Mapping[str, str] = DEFAULT_REGISTRY_MAP) -> Reply:
    """
    Rewrite the registry of every container and init container image.

    Object form: ``replace`` ops for each rewritten image and one warning
    listing the rewrites (no warning when nothing matched).
    """
    ops: list[PatchOp] = []
    done: list[str] = []
    for kind in ("initContainers", "containers"):
        for i, container in _items(pod, ["spec", kind]):
            image = container.get("image")
            new = rewrite_image(image, registry_map) if isinstance(image, str) else None
            if new is not None:
                ops.append({"op": "replace", "path": pointer(["spec", kind, i, "image"]), "value": new})
                done.append(f"{kind}[{i}] {image} -> {new}")
    reply: Reply = {"patch": ops, "allowed": True, "warnings": []}
    if done:
        reply["warnings"] = ["registry rewritten: " + "; ".join(done)]
    return reply


# --- /sidecar: the App Mesh / filer sidecar-injection use case --------------

SIDECAR_NAME = "amp-proxy"
SIDECAR_IMAGE = "envoyproxy/envoy:v1.27.0"
SIDECAR_INIT_NAME = "amp-proxy-init"
SIDECAR_INIT_IMAGE = "alpine:3.12.0"
SHARED_VOLUME = "amp-shared"
SHARED_MOUNT_PATH = "/var/run/amp"
INJECT_ANNOTATION = "amp.txn2.com/inject"
INJECTED_AUDIT_KEY = "sidecar-injected"


def container_ports(pod: Mapping[str, Any]) -> list[int]:
    """The distinct ``containerPort`` values of the Pod's app containers, in order."""
    ports: list[int] = []
    for _, container in _items(pod, ["spec", "containers"]):
        for _, port in _items(container, ["ports"]):
            value = port.get("containerPort")
            if isinstance(value, int) and not isinstance(value, bool) and value not in ports:
                ports.append(value)
    return ports


def sidecar_skip_reason(pod: Mapping[str, Any]) -> str | None:
    """Why the sidecar is not injected into this Pod, or None to inject."""
    if str(_annotations(pod).get(INJECT_ANNOTATION, "")).strip().lower() == "false":
        return f"annotation {INJECT_ANNOTATION} is false"
    if SIDECAR_NAME in _container_names(pod):
        return f"pod already has {SIDECAR_NAME}"
    if not _items(pod, ["spec", "containers"]):
        return "pod has no containers"
    return None


def sidecar_patch(pod: Mapping[str, Any]) -> list[PatchOp]:
    """
    Inject the ``amp-proxy`` sidecar; [] when ``sidecar_skip_reason`` says so.

    Adds the shared ``emptyDir`` volume ``amp-shared`` (reused if a volume of
    that name exists), mounts it at ``/var/run/amp`` in every app container
    and the sidecar, adds the init container ``amp-proxy-init`` with
    ``APP_PORTS`` (comma-joined containerPorts) and appends the sidecar last
    so existing container indexes do not move.
    """
    if sidecar_skip_reason(pod) is not None:
        return []
    b = PatchBuilder(pod)
    mount = {"name": SHARED_VOLUME, "mountPath": SHARED_MOUNT_PATH}
    if _find(b.doc, ["spec", "volumes"], SHARED_VOLUME) is None:
        b.append(["spec", "volumes"], {"name": SHARED_VOLUME, "emptyDir": {}})
    if SIDECAR_INIT_NAME not in _container_names(b.doc):
        b.append(
            ["spec", "initContainers"],
            {
                "name": SIDECAR_INIT_NAME,
                "image": SIDECAR_INIT_IMAGE,
                "command": ["sh", "-c", 'echo "proxying ports: $APP_PORTS"'],
                "env": [{"name": "APP_PORTS", "value": ",".join(str(p) for p in container_ports(pod))}],
            },
        )
    for i, _ in _items(pod, ["spec", "containers"]):
        _add_mount(b, i, mount)
    b.append(
        ["spec", "containers"],
        {"name": SIDECAR_NAME, "image": SIDECAR_IMAGE, "volumeMounts": [dict(mount)]},
    )
    return b.ops


def sidecar_reply(pod: Mapping[str, Any]) -> Reply:
    """Object form of ``sidecar_patch`` with the ``injected`` audit annotation when injected."""
    ops = sidecar_patch(pod)
    reply: Reply = {"patch": ops, "allowed": True}
    if ops:
        reply["auditAnnotations"] = {INJECTED_AUDIT_KEY: "true"}
    return reply


# --- /poddefault: the Kubeflow PodDefault use case --------------------------

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
    labels = _labels(pod)
    return sorted((p for p in presets if selector_matches(p.selector, labels)), key=lambda p: p.name)


def _apply_preset(b: PatchBuilder, preset: Preset) -> None:
    def conflict(what: str) -> PresetConflict:
        return PresetConflict(f"PodDefault {preset.name} conflicts with the pod: {what}")

    for volume in preset.volumes:
        found = _find(b.doc, ["spec", "volumes"], volume["name"])
        if found is None:
            b.append(["spec", "volumes"], dict(volume))
        elif not _same(volume, found[1]):
            raise conflict(f"volume {volume['name']} already exists with a different definition")
    for i, container in _items(b.doc, ["spec", "containers"]):
        cname = container.get("name", i)
        for env in preset.env:
            found = _find(b.doc, ["spec", "containers", i, "env"], env["name"])
            if found is None:
                b.append(["spec", "containers", i, "env"], dict(env))
            elif not _same(env, found[1]):
                raise conflict(f"env {env['name']} in container {cname} already has a different value")
        for env_from in preset.env_from:
            if not any(_same(env_from, e) for _, e in _items(b.doc, ["spec", "containers", i, "envFrom"])):
                b.append(["spec", "containers", i, "envFrom"], dict(env_from))
        for mount in preset.volume_mounts:
            tokens: list[Token] = ["spec", "containers", i, "volumeMounts"]
            by_name = _find(b.doc, tokens, mount["name"])
            by_path = _find(b.doc, tokens, mount["mountPath"], "mountPath")
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
    if not matched or not _has_spec(pod):
        return [], []
    b = PatchBuilder(pod)
    for preset in matched:
        _apply_preset(b, preset)
    return b.ops, [p.name for p in matched]


def poddefault_reply(pod: Mapping[str, Any], presets: Iterable[Preset] = DEFAULT_PRESETS) -> Reply:
    """Object form: the patch plus an audit annotation naming the presets, or a 403 denial on conflict."""
    try:
        ops, applied = poddefault_patch(pod, presets)
    except PresetConflict as e:
        return deny(str(e))
    reply: Reply = {"patch": ops, "allowed": True}
    if applied:
        reply["auditAnnotations"] = {"poddefaults": ",".join(applied)}
    return reply


# --- endpoints for exercising amp itself ------------------------------------

DENY_MESSAGE = "denied by example policy"
REQUIRED_LABEL = "app"


def deny(message: str, code: int = 403) -> Reply:
    """Object form of a denial."""
    return {"allowed": False, "status": {"code": code, "message": message}}


def deny_reply() -> Reply:
    """``/deny``: always deny."""
    return deny(DENY_MESSAGE)


def bad_patch() -> list[PatchOp]:
    """``/bad-patch``: valid JSON Patch that cannot apply to any Pod (removes a missing member)."""
    return [{"op": "remove", "path": "/spec/ampExampleDoesNotExist"}]


def validate_labels_reply(pod: Mapping[str, Any]) -> Reply:
    """``/validate-labels``: deny a Pod without an ``app`` label; otherwise allow unchanged."""
    if REQUIRED_LABEL not in _labels(pod):
        return deny(f"pod has no {REQUIRED_LABEL} label")
    return {"patch": [], "allowed": True}
