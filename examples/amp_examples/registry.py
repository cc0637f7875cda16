"""
``/registry``: rewrite image registries, the API Gateway webhook's use case.

A cluster that cannot reach public registries (a firewall, or one regional
mirror per region) pulls from a mirror instead: every container, init
container and ephemeral container image whose registry is in the map gets
that registry replaced, e.g. ``gcr.io/nginx`` -> ``asia.gcr.io/nginx``.
Registries are read the way Docker reads them: ``nginx:1.25`` is
``docker.io/library/nginx:1.25``.

The reply uses amp's object form: ``replace`` operations plus one warning
listing the rewrites, so the user who created the Pod sees what changed.
An image already under one of the map's targets is never rewritten again,
so a second call returns no change, even when a target is itself a mapped
registry (``docker.io=docker.io/mirror``), and an image that another
endpoint added after this one ran is rewritten once.

Run it alone: ``python -m amp_examples.registry --registry-map gcr.io=asia.gcr.io``.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from twisted.python import usage

from amp_examples import serving
from amp_examples.patching import PatchOp, items, pointer

DOCKER_HUB = "docker.io"
DOCKER_HUB_ALIASES = frozenset({"docker.io", "index.docker.io", "registry-1.docker.io"})
DEFAULT_REGISTRY_MAP: Mapping[str, str] = {"gcr.io": "asia.gcr.io", "docker.io": "mirror.local"}
CONTAINER_KINDS = ("initContainers", "containers", "ephemeralContainers")


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


def _under(image: str, target: str) -> bool:
    """True when ``image`` already lives under the mirror ``target`` (a host or host/path prefix)."""
    registry, remainder = split_image(image)
    return f"{registry}/{remainder}".startswith(target + "/") or image.startswith(target + "/")


def rewrite_image(image: str, registry_map: Mapping[str, str]) -> str | None:
    """The rewritten image reference, or None when its registry is not mapped or it is already mirrored."""
    if not image or any(_under(image, target) for target in registry_map.values()):
        return None
    registry, remainder = split_image(image)
    target = registry_map.get(registry)
    if target is None:
        return None
    rewritten = f"{target}/{remainder}"
    return None if rewritten == image else rewritten


def registry_reply(
    pod: Mapping[str, Any],
    registry_map: Mapping[str, str] = DEFAULT_REGISTRY_MAP,
    kinds: Iterable[str] = CONTAINER_KINDS,
) -> dict[str, Any]:
    """``replace`` operations for every image to rewrite (of the container lists ``kinds``), and one warning
    listing them (none when nothing matched)."""
    ops: list[PatchOp] = []
    done: list[str] = []
    for kind in kinds:
        for i, container in items(pod, ["spec", kind]):
            image = container.get("image")
            new = rewrite_image(image, registry_map) if isinstance(image, str) else None
            if new is not None:
                ops.append({"op": "replace", "path": pointer(["spec", kind, i, "image"]), "value": new})
                done.append(f"{kind}[{i}] {image} -> {new}")
    reply: dict[str, Any] = {"patch": ops, "allowed": True, "warnings": []}
    if done:
        reply["warnings"] = ["registry rewritten: " + "; ".join(done)]
    return reply


class Options(serving.Options):
    longdesc = "Serve /registry: rewrite image registries to mirrors."

    def __init__(self) -> None:
        super().__init__()
        self["registry-map"] = []

    def opt_registry_map(self, value: str) -> None:
        """FROM=TO registry rewrite for /registry, e.g. gcr.io=asia.gcr.io; repeatable; replaces the default map (gcr.io=asia.gcr.io, docker.io=mirror.local)."""  # noqa: E501
        self["registry-map"].append(value)

    def postOptions(self) -> None:
        super().postOptions()
        try:
            self["registry_map"] = (
                parse_registry_map(self["registry-map"]) if self["registry-map"] else dict(DEFAULT_REGISTRY_MAP)
            )
        except ValueError as e:
            raise usage.UsageError(f"--registry-map: {e}") from None


def endpoints(options: Mapping[str, Any]) -> dict[str, serving.Handler]:
    registry_map = dict(options.get("registry_map", DEFAULT_REGISTRY_MAP))

    def registry(pod: serving.Pod, call: serving.Call) -> dict[str, Any]:
        # kubectl debug: only spec.ephemeralContainers may change.
        kinds = ("ephemeralContainers",) if call.subresource == "ephemeralcontainers" else CONTAINER_KINDS
        return registry_reply(pod, registry_map, kinds)

    return {"registry": registry}


if __name__ == "__main__":
    serving.main(Options, endpoints)
