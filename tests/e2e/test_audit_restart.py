"""``amp audit`` with the controllers running: a Deployment whose Pods
the real ReplicaSet controller created, found stale after its endpoint's
sidecar image changes, and current again after the restart command the
audit gives (what ``kubectl rollout restart`` does: a new template
annotation, a rolling update by the controllers, every Pod reviewed anew).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kubernetes import client

from ..support.waiting import poll_until
from . import workloads
from .amp_process import closed_port, unique
from .cluster import ControlPlane
from .conftest import AmpFactory
from .controllers import Controllers
from .test_audit import NEW, OLD, SidecarEndpoint, run_audit

pytestmark = pytest.mark.e2e

#: Bounds a hang on a loaded machine; nothing here asserts a time.
CONVERGE = 300.0
REPLICAS = 3


def test_a_rollout_restart_brings_every_pod_of_a_stale_deployment_up_to_date(
    controllers: Controllers, control_plane: ControlPlane, start_amp: AmpFactory, tmp_path: Path
) -> None:
    recordings = tmp_path / "recordings"
    recordings.mkdir()
    port = closed_port()
    endpoint = SidecarEndpoint(tmp_path / "v1", port, OLD).start_and_wait()
    amp = start_amp("audit-restart", webhook_failure_policy="Ignore")
    core = client.CoreV1Api(control_plane.admin_client())
    apps = client.AppsV1Api(control_plane.admin_client())
    ns = amp.namespace(unique("audit-restart"), endpoint.url("sidecar"), failure_policy="Ignore")
    try:
        apps.create_namespaced_deployment(ns, workloads.deployment("web", REPLICAS))
        workloads.wait_rolled_out(apps, ns, "web", REPLICAS, CONVERGE, amp.process.describe)
        assert all(p["spec"]["containers"][-1]["image"] == OLD for p in workloads.pods(core, ns))

        endpoint.stop()
        endpoint = SidecarEndpoint(tmp_path / "v2", port, NEW).start_and_wait()
        status, out, _ = run_audit(amp, control_plane, ns, recordings, "-o", "json")
        report = json.loads(out)
        assert [(w["kind"], w["name"]) for w in report["workloads"]] == [("Deployment", "web")], out
        assert sorted(p["state"] for p in report["workloads"][0]["pods"]) == ["stale"] * REPLICAS, out
        assert report["workloads"][0]["command"] == f"kubectl rollout restart deployment/web -n {ns}"
        assert status == 1

        # The command the audit gave, as kubectl runs it.
        apps.patch_namespaced_deployment(
            "web",
            ns,
            {
                "spec": {
                    "template": {
                        "metadata": {"annotations": {"kubectl.kubernetes.io/restartedAt": "2026-11-29T00:00:00Z"}}
                    }
                }
            },
        )
        workloads.wait_rolled_out(apps, ns, "web", REPLICAS, CONVERGE, amp.process.describe)
        poll_until(
            "the replaced Pods to be gone",
            lambda: len(workloads.pods(core, ns)) == REPLICAS or None,
            CONVERGE,
            interval=0.5,
        )

        status, out, _ = run_audit(amp, control_plane, ns, recordings, "-o", "json")
        report = json.loads(out)
        assert sorted(p["state"] for w in report["workloads"] for p in w["pods"]) == ["current"] * REPLICAS, out
        assert status == 0
    finally:
        endpoint.stop()
        workloads.remove_namespace(core, ns)
