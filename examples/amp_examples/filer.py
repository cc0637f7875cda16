"""
``/filer``: mount network file shares through sidecars, the filer sidecar
injector's use case.

Notebook Pods get one sidecar per file share their namespace may use. Each
sidecar mounts the share's S3 bucket (rclone, with credentials from the
Secret ``filer-<filer>-credentials`` in the Pod's namespace) on a shared
volume, and the user's container sees it under
``/home/jovyan/filers/<filer>/<share>``; ``FILER_MOUNTS`` lists those paths.

Which shares a namespace gets is the operator's decision, not the Pod's: a
YAML file (``--shares FILE``) maps filers to their S3 endpoints and
namespaces to share names::

    filers:
      fld9: https://fld9.filers.internal:9000
    shares:               # namespace -> shares; "*" applies to every namespace
      team-a: [fld9/projects/alpha, fld9/scratch]

Built in (without ``--shares``): every namespace gets ``fld9/projects``.

Only Pods labelled ``notebook-name`` are changed. The user's container is
the one that defines ``NB_PREFIX`` (Kubeflow notebooks do), else the first.
A share whose sidecar is already there is skipped, so a second call on the
changed Pod returns no change. The reply uses amp's object form, with the
audit annotation ``filer-shares`` naming the shares mounted.

Run it alone: ``python -m amp_examples.filer --shares shares.yaml``.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any, Mapping

import yaml
from twisted.python import usage

from amp_examples import serving
from amp_examples.patching import PatchBuilder, PatchOp, container_names, find, has_spec, items, labels

NOTEBOOK_LABEL = "notebook-name"
USER_CONTAINER_ENV = "NB_PREFIX"
MOUNT_ROOT = "/home/jovyan/filers"
MOUNTS_ENV = "FILER_MOUNTS"
SIDECAR_IMAGE = "rclone/rclone:1.66"
SIDECAR_MOUNT_PATH = "/mnt/share"
AUDIT_KEY = "filer-shares"
EVERY_NAMESPACE = "*"
_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$")


@dataclass(frozen=True)
class Share:
    """One file share: ``path`` on ``filer``, served as an S3 bucket at ``url``."""

    filer: str
    path: str
    url: str

    @property
    def name(self) -> str:
        return f"{self.filer}/{self.path}"

    @property
    def bucket(self) -> str:
        """The bucket the share lives in: its path made DNS-safe, plus a hash so distinct paths stay distinct."""
        readable = re.sub(r"[^a-z0-9-]+", "-", self.path.lower()).strip("-")[:40]
        return f"{readable}-{hashlib.sha256(self.path.encode()).hexdigest()[:8]}"

    @property
    def container(self) -> str:
        """The sidecar's (and its volume's) name: ``filer-<filer>-<hash>``, a valid DNS label."""
        return f"filer-{self.filer}-{hashlib.sha256(self.name.encode()).hexdigest()[:10]}"

    @property
    def mount_path(self) -> str:
        return f"{MOUNT_ROOT}/{self.filer}/{self.path}"


@dataclass(frozen=True)
class ShareConfig:
    """Which shares each namespace's notebooks mount."""

    shares: Mapping[str, tuple[Share, ...]]

    def for_namespace(self, namespace: str) -> tuple[Share, ...]:
        return self.shares.get(namespace, self.shares.get(EVERY_NAMESPACE, ()))


def parse_shares(text: str) -> ShareConfig:
    """A ShareConfig from YAML text (see the module docstring); ValueError names what is wrong."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ValueError(f"shares are not valid YAML: {e}") from None
    if not isinstance(doc, dict) or set(doc) - {"filers", "shares"}:
        raise ValueError("shares file must be a mapping with the keys filers and shares")
    filers, by_namespace = doc.get("filers") or {}, doc.get("shares") or {}
    if not isinstance(filers, dict) or not isinstance(by_namespace, dict):
        raise ValueError("filers and shares must be mappings")
    for filer, url in filers.items():
        if not isinstance(filer, str) or not _NAME.match(filer):
            raise ValueError(f"filers: {filer!r} is not a lowercase name of at most 32 characters")
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"filers.{filer}: {url!r} is not an http(s) URL")
    shares: dict[str, tuple[Share, ...]] = {}
    for namespace, names in by_namespace.items():
        if not isinstance(names, list):
            raise ValueError(f"shares.{namespace}: must be a list of FILER/PATH")
        found: list[Share] = []
        for name in names:
            filer, _, path = str(name).partition("/")
            where = f"shares.{namespace}: {name!r}"
            if filer not in filers:
                raise ValueError(f"{where}: filer {filer!r} is not under filers")
            if not path or any(part in ("", ".", "..") for part in path.split("/")):
                raise ValueError(f"{where}: the path must be FILER/DIR[/DIR...] without empty, . or .. parts")
            found.append(Share(filer, path, filers[filer]))
        shares[str(namespace)] = tuple(found)
    return ShareConfig(shares)


DEFAULT_SHARES = ShareConfig({EVERY_NAMESPACE: (Share("fld9", "projects", "http://fld9.filers.svc:9000"),)})


def sidecar(share: Share) -> dict[str, Any]:
    """The sidecar that mounts ``share`` on its volume and shares the mount with the Pod."""
    return {
        "name": share.container,
        "image": SIDECAR_IMAGE,
        "args": [
            "mount",
            f":s3:{share.bucket}",
            SIDECAR_MOUNT_PATH,
            "--s3-provider=Other",
            f"--s3-endpoint={share.url}",
            "--allow-other",
        ],
        "envFrom": [{"secretRef": {"name": f"filer-{share.filer}-credentials"}}],
        "securityContext": {"privileged": True},
        "volumeMounts": [
            {"name": share.container, "mountPath": SIDECAR_MOUNT_PATH, "mountPropagation": "Bidirectional"}
        ],
    }


def user_container(pod: Mapping[str, Any]) -> int:
    """Index of the container that defines ``NB_PREFIX``, else 0."""
    for i, container in items(pod, ["spec", "containers"]):
        if find(container, ["env"], USER_CONTAINER_ENV) is not None:
            return i
    return 0


def filer_patch(pod: Mapping[str, Any], namespace: str, config: ShareConfig = DEFAULT_SHARES) -> list[PatchOp]:
    """The operations that mount the namespace's shares into a notebook Pod; [] when there is nothing to do."""
    shares = config.for_namespace(namespace)
    if NOTEBOOK_LABEL not in labels(pod) or not shares or not has_spec(pod) or not items(pod, ["spec", "containers"]):
        return []
    b = PatchBuilder(pod)
    user = user_container(pod)
    for share in shares:
        if share.container in container_names(b.doc):
            continue
        b.add_volume({"name": share.container, "emptyDir": {}})
        b.add_mount(
            user, {"name": share.container, "mountPath": share.mount_path, "mountPropagation": "HostToContainer"}
        )
        b.append(["spec", "containers"], sidecar(share))
    b.set_env(user, MOUNTS_ENV, ":".join(share.mount_path for share in shares))
    return b.ops


def filer_reply(pod: Mapping[str, Any], namespace: str, config: ShareConfig = DEFAULT_SHARES) -> dict[str, Any]:
    """Object form of ``filer_patch``, naming the namespace's shares in an audit annotation when it changed the Pod."""
    ops = filer_patch(pod, namespace, config)
    reply: dict[str, Any] = {"patch": ops, "allowed": True}
    if ops:
        reply["auditAnnotations"] = {AUDIT_KEY: ",".join(s.name for s in config.for_namespace(namespace))}
    return reply


def _namespace(pod: Mapping[str, Any], call: serving.Call) -> str:
    """amp's ``X-Amp-Namespace``; the Pod's own ``metadata.namespace`` when called without it."""
    metadata = pod.get("metadata")
    return call.namespace or (str(metadata.get("namespace") or "") if isinstance(metadata, dict) else "")


class Options(serving.Options):
    longdesc = "Serve /filer: mount each namespace's file shares into notebook Pods through sidecars."
    optParameters = [["shares", None, None, "YAML file: filers and the shares of each namespace."]]

    def postOptions(self) -> None:
        super().postOptions()
        self["share_config"] = DEFAULT_SHARES
        if self["shares"]:
            try:
                with open(self["shares"], encoding="utf-8") as f:
                    self["share_config"] = parse_shares(f.read())
            except (OSError, ValueError) as e:
                raise usage.UsageError(f"--shares {self['shares']}: {e}") from None


def endpoints(options: Mapping[str, Any]) -> dict[str, serving.Handler]:
    config: ShareConfig = options.get("share_config", DEFAULT_SHARES)
    return {"filer": lambda pod, call: filer_reply(pod, _namespace(pod, call), config)}


if __name__ == "__main__":
    serving.main(Options, endpoints)
