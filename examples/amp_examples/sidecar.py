"""
``/sidecar``: inject a proxy sidecar and its init container, the App Mesh
injector's use case.

For every Pod that does not opt out, the endpoint adds

- the ``amp-proxy`` sidecar (an Envoy image), appended after the app's own
  containers so their indexes do not move;
- the init container ``amp-proxy-init``, whose ``APP_PORTS`` lists the
  ``containerPort`` values of the app containers (what a real init
  container would redirect to the proxy);
- a shared ``emptyDir`` volume ``amp-shared``, mounted at ``/var/run/amp``
  in every app container and the sidecar.

A Pod annotated ``amp.txn2.com/inject: "false"`` is left alone, and so is a
Pod that already has the sidecar, so a second call returns no change. The
reply uses amp's object form, with the audit annotation
``sidecar-injected: "true"`` when the sidecar was added.

Run it alone: ``python -m amp_examples.sidecar --port 8090``.
"""

from __future__ import annotations

from typing import Any, Mapping

from amp_examples import serving
from amp_examples.patching import PatchBuilder, PatchOp, annotations, container_names, items

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
    for _, container in items(pod, ["spec", "containers"]):
        for _, port in items(container, ["ports"]):
            value = port.get("containerPort")
            if isinstance(value, int) and not isinstance(value, bool) and value not in ports:
                ports.append(value)
    return ports


def sidecar_skip_reason(pod: Mapping[str, Any]) -> str | None:
    """Why the sidecar is not injected into this Pod, or None to inject."""
    if str(annotations(pod).get(INJECT_ANNOTATION, "")).strip().lower() == "false":
        return f"annotation {INJECT_ANNOTATION} is false"
    if SIDECAR_NAME in container_names(pod):
        return f"pod already has {SIDECAR_NAME}"
    if not items(pod, ["spec", "containers"]):
        return "pod has no containers"
    return None


def sidecar_patch(pod: Mapping[str, Any], image: str = SIDECAR_IMAGE) -> list[PatchOp]:
    """The operations that inject the sidecar (of ``image``); [] when ``sidecar_skip_reason`` says so."""
    if sidecar_skip_reason(pod) is not None:
        return []
    b = PatchBuilder(pod)
    mount = {"name": SHARED_VOLUME, "mountPath": SHARED_MOUNT_PATH}
    b.add_volume({"name": SHARED_VOLUME, "emptyDir": {}})
    if SIDECAR_INIT_NAME not in container_names(b.doc):
        b.append(
            ["spec", "initContainers"],
            {
                "name": SIDECAR_INIT_NAME,
                "image": SIDECAR_INIT_IMAGE,
                "command": ["sh", "-c", 'echo "proxying ports: $APP_PORTS"'],
                "env": [{"name": "APP_PORTS", "value": ",".join(str(p) for p in container_ports(pod))}],
            },
        )
    for i, _ in items(pod, ["spec", "containers"]):
        b.add_mount(i, mount)
    b.append(["spec", "containers"], {"name": SIDECAR_NAME, "image": image, "volumeMounts": [dict(mount)]})
    return b.ops


def sidecar_reply(pod: Mapping[str, Any], image: str = SIDECAR_IMAGE) -> dict[str, Any]:
    """Object form of ``sidecar_patch``, with the ``sidecar-injected`` audit annotation when injected."""
    ops = sidecar_patch(pod, image)
    reply: dict[str, Any] = {"patch": ops, "allowed": True}
    if ops:
        reply["auditAnnotations"] = {INJECTED_AUDIT_KEY: "true"}
    return reply


class Options(serving.Options):
    longdesc = "Serve /sidecar: inject the amp-proxy sidecar and its init container."
    optParameters = [["sidecar-image", None, SIDECAR_IMAGE, "The image of the injected amp-proxy sidecar."]]


def endpoints(options: Mapping[str, Any]) -> dict[str, serving.Handler]:
    image = str(options.get("sidecar-image") or SIDECAR_IMAGE)
    return {"sidecar": lambda pod, call: sidecar_reply(pod, image)}


if __name__ == "__main__":
    serving.main(Options, endpoints)
