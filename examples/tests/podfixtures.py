"""Pods as the example endpoints see them, and the API server's way of applying a patch (jsonpatch as the oracle)."""

from __future__ import annotations

from typing import Any

import jsonpatch


def jupyter_pod(**spec_extra: Any) -> dict[str, Any]:
    """A Pod as the API server hands it to a mutating webhook after defaulting."""
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "jupyter-jovyan",
            "namespace": "hub",
            "labels": {"app": "jupyterhub", "component": "singleuser-server"},
            "annotations": {"hub.jupyter.org/username": "jovyan"},
        },
        "spec": {
            "containers": [
                {
                    "name": "notebook",
                    "image": "jupyter/base-notebook:latest",
                    "ports": [{"containerPort": 8888, "name": "notebook-port", "protocol": "TCP"}],
                    "resources": {},
                    "terminationMessagePath": "/dev/termination-log",
                    "volumeMounts": [
                        {
                            "name": "kube-api-access-x2v9z",
                            "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                            "readOnly": True,
                        }
                    ],
                },
            ],
            "volumes": [
                {
                    "name": "kube-api-access-x2v9z",
                    "projected": {"defaultMode": 420, "sources": [{"serviceAccountToken": {"path": "token"}}]},
                }
            ],
            "restartPolicy": "OnFailure",
            "serviceAccountName": "default",
        },
        "status": {},
    }
    pod["spec"].update(spec_extra)
    return pod


def bare_pod(*containers: dict[str, Any], labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A minimal Pod: no env, no volumes, no init containers."""
    pod: dict[str, Any] = {"metadata": {"name": "p"}, "spec": {"containers": list(containers)}}
    if labels is not None:
        pod["metadata"]["labels"] = labels
    return pod


def apply(pod: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """Apply ``ops`` as the API server would; raises if any op does not apply."""
    return jsonpatch.apply_patch(pod, ops)


def env_of(container: dict[str, Any]) -> dict[str, str]:
    """A container's env as a dict of literal values."""
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def mesh_pod() -> dict[str, Any]:
    """Three app containers with overlapping ports and an ``app`` label."""
    return bare_pod(
        {"name": "app", "image": "app:1", "ports": [{"containerPort": 8080}, {"containerPort": 9090}]},
        {"name": "metrics", "image": "exporter:1", "ports": [{"containerPort": 9090}, {"containerPort": 9100}]},
        {"name": "worker", "image": "worker:1"},
        labels={"app": "shop"},
    )
