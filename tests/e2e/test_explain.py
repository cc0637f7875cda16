"""``amp explain`` against a real kube-apiserver: it reads the namespace with
amp's own ServiceAccount (one GET, within the RBAC from ``deploy/``), calls
the example endpoints, and predicts what the running amp then does to the
same Pod: what the API server stores (or refuses) is what explain said.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from .amp_process import STATUS_ANNOTATION, AmpInstance, ExampleEndpoints, closed_port, pod_manifest, unique
from .cluster import ControlPlane
from .conftest import AmpFactory

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def amp(start_module_amp: AmpFactory) -> AmpInstance:
    return start_module_amp("explain")


@pytest.fixture
def core(control_plane: ControlPlane) -> client.CoreV1Api:
    return client.CoreV1Api(control_plane.admin_client())


def explain(amp: AmpInstance, namespace: str, pod: dict[str, Any], tmp_path: Path) -> tuple[int, dict[str, Any]]:
    """Run the installed ``amp explain -o json`` with the running amp's own
    config (its kubeconfig source) on ``pod``; the exit status and the JSON."""
    script = shutil.which("amp", path=os.path.dirname(sys.executable))
    assert script is not None, "the amp console script is not installed beside the interpreter"
    path = tmp_path / f"{pod['metadata']['name']}.yaml"
    path.write_text(yaml.safe_dump(pod))
    done = subprocess.run(
        [script, "explain", "--config", str(amp.process.config_path), "-n", namespace, "-o", "json", str(path)],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.stderr == b"", done.stderr
    return done.returncode, json.loads(done.stdout)


def own(pod: dict[str, Any]) -> dict[str, Any]:
    """What the endpoint and amp decide about a Pod, without what the API
    server adds itself (defaults, the token volume and its mounts)."""
    spec = pod["spec"]

    def container(c: dict[str, Any]) -> tuple[Any, ...]:
        mounts = [
            (m["name"], m["mountPath"])
            for m in c.get("volumeMounts") or []
            if not m["name"].startswith("kube-api-access-")
        ]
        return c["name"], c["image"], [(e["name"], e.get("value")) for e in c.get("env") or []], mounts

    return {
        "containers": [container(c) for c in spec["containers"]],
        "initContainers": [container(c) for c in spec.get("initContainers") or []],
        "volumes": [v for v in spec.get("volumes") or [] if not v["name"].startswith("kube-api-access-")],
        "annotations": pod["metadata"].get("annotations") or {},
    }


def test_explain_predicts_the_stored_pod(
    amp: AmpInstance, example_endpoints: ExampleEndpoints, core: client.CoreV1Api, tmp_path: Path
) -> None:
    ns = amp.namespace(unique("explain-ok"), example_endpoints.url("user-env"))
    pod = pod_manifest("notebook", annotations={"hub.jupyter.org/username": "alice"})

    status, predicted = explain(amp, ns, pod, tmp_path)

    assert (status, predicted["result"]) == (0, "patched")
    assert "the cluster (kubeconfig" in predicted["namespace_source"]
    core.create_namespaced_pod(ns, pod)
    stored = json.loads(core.read_namespaced_pod("notebook", ns, _preload_content=False).data)
    assert own(predicted["pod"]) == own(stored)
    assert stored["metadata"]["annotations"][STATUS_ANNOTATION].startswith("mutated ")


def test_explain_predicts_the_failure_policy(
    amp: AmpInstance, example_endpoints: ExampleEndpoints, core: client.CoreV1Api, tmp_path: Path
) -> None:
    ignored = amp.namespace(unique("explain-ignore"), example_endpoints.url("bad-patch"))
    status, predicted = explain(amp, ignored, pod_manifest("web"), tmp_path)
    assert (status, predicted["result"], predicted["reason"]) == (1, "ignored", "apply-failed")
    core.create_namespaced_pod(ignored, pod_manifest("web"))
    stored = json.loads(core.read_namespaced_pod("web", ignored, _preload_content=False).data)
    assert own(predicted["pod"]) == own(stored)

    down = f"http://127.0.0.1:{closed_port()}"
    failing = amp.namespace(unique("explain-fail"), f"{down}/mutate", failure_policy="Fail")
    status, predicted = explain(amp, failing, pod_manifest("web"), tmp_path)
    assert (status, predicted["result"], predicted["pod"]) == (1, "failed", None)
    with pytest.raises(ApiException) as caught:
        core.create_namespaced_pod(failing, pod_manifest("web"))
    assert predicted["message"] in json.loads(caught.value.body)["message"]
