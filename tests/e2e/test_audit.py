"""``amp audit`` against a real kube-apiserver: the fleet after an endpoint
change.

There is no controller-manager in this control plane, so the test creates
what the controllers would: a Deployment, its ReplicaSet (owned by it) and
the Pods (owned by the ReplicaSet, from its template), each Pod through the
API server, so that amp reviews it as it would a controller's.  The
namespace's endpoint is the example sidecar injector (``twistd
amp-example``, ``--sidecar-image``), first with the proxy image v1.27.0:

- ``web-a``, ``web-b`` (Deployment web) and ``api-a`` (Deployment api) get
  the v1.27.0 sidecar; so does the bare Pod ``solo`` (amp records its
  review);
- ``web-c`` is created while amp is unreachable (the webhook, failure
  policy Ignore, points at a closed port): the API server admits it
  unreviewed;
- the endpoint is stopped (its redeployment): ``web-d`` is admitted under
  the namespace's Ignore policy, stamped ``skipped``;
- the endpoint comes back with v1.28.0: ``web-e`` gets the new sidecar.

A MutatingAdmissionPolicy adds a label to every Pod of the namespace
throughout (a second admission plugin): it must cause no difference.

``amp audit`` (the installed console script, the admin's kubeconfig) then
says exactly: web-a, web-b, api-a and solo stale at the proxy's image,
v1.27.0 -> v1.28.0, and nothing else; web-c never-mutated; web-d failed;
web-e current; the restart command of each Deployment; one endpoint call
per template.

The same amp runs the continuous audit (``audit.continuous``, with the
admin's kubeconfig for its lists and its Lease): once the namespace's
amp annotations change, it audits again and ``/metrics`` shows the
namespace's Pods by state.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest
from kubernetes import client

from ..support.waiting import poll_until
from .amp_process import LOOPBACK, STATUS_ANNOTATION, AmpInstance, ExampleEndpoints, closed_port, free_port, unique
from .cluster import ControlPlane
from .conftest import AmpFactory

pytestmark = pytest.mark.e2e

OLD = "envoyproxy/envoy:v1.27.0"
NEW = "envoyproxy/envoy:v1.28.0"
POLICY_LABEL = "e2e.amp.txn2.com/policy"
PROPAGATION = 30.0


class SidecarEndpoint(ExampleEndpoints):
    """``twistd amp-example --sidecar-image IMAGE`` on a given port."""

    def __init__(self, workdir: Path, port: int, image: str) -> None:
        super().__init__(workdir, port)
        self.args += ["--sidecar-image", image]


def template(app: str) -> dict[str, Any]:
    return {
        "metadata": {"labels": {"app": app}},
        "spec": {"containers": [{"name": app, "image": "registry.invalid/app:1", "ports": [{"containerPort": 8080}]}]},
    }


class Controllers:
    """What the Deployment and ReplicaSet controllers would create, through the API."""

    def __init__(self, control_plane: ControlPlane, namespace: str) -> None:
        api = control_plane.admin_client()
        self.apps = client.AppsV1Api(api)
        self.core = client.CoreV1Api(api)
        self.ns = namespace
        self.replicasets: dict[str, tuple[str, str, dict[str, Any]]] = {}

    def deployment(self, name: str) -> None:
        tmpl = template(name)
        selector = {"matchLabels": {"app": name}}
        d = self.apps.create_namespaced_deployment(
            self.ns,
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": name},
                "spec": {"replicas": 1, "selector": selector, "template": tmpl},
            },
        )
        rs_name = f"{name}-7c9d8"
        rs_template = json.loads(json.dumps(tmpl))
        rs_template["metadata"]["labels"]["pod-template-hash"] = "7c9d8"
        rs = self.apps.create_namespaced_replica_set(
            self.ns,
            {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "metadata": {
                    "name": rs_name,
                    "labels": rs_template["metadata"]["labels"],
                    "ownerReferences": [
                        {
                            "apiVersion": "apps/v1",
                            "kind": "Deployment",
                            "name": name,
                            "uid": d.metadata.uid,
                            "controller": True,
                            "blockOwnerDeletion": True,
                        }
                    ],
                },
                "spec": {
                    "replicas": 1,
                    "selector": {"matchLabels": rs_template["metadata"]["labels"]},
                    "template": rs_template,
                },
            },
        )
        self.replicasets[name] = (rs_name, rs.metadata.uid, rs_template)

    def pod(self, deployment: str, name: str) -> dict[str, Any]:
        rs_name, uid, tmpl = self.replicasets[deployment]
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "labels": tmpl["metadata"]["labels"],
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "ReplicaSet",
                        "name": rs_name,
                        "uid": uid,
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": tmpl["spec"],
        }
        return self.create(pod)

    def create(self, pod: dict[str, Any], dry_run: Optional[str] = None) -> dict[str, Any]:
        kwargs = {"dry_run": dry_run} if dry_run else {}
        response = self.core.create_namespaced_pod(self.ns, pod, _preload_content=False, **kwargs)
        return json.loads(response.data)


@contextlib.contextmanager
def label_policy(control_plane: ControlPlane, namespace: str, probe: Controllers) -> Iterator[None]:
    """A MutatingAdmissionPolicy adding a label to the namespace's Pods, in effect until the block ends."""
    objects = client.CustomObjectsApi(control_plane.admin_client())
    group, version = "admissionregistration.k8s.io", "v1"
    name = unique("audit-label")
    policy = {
        "apiVersion": f"{group}/{version}",
        "kind": "MutatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "matchConstraints": {
                "resourceRules": [
                    {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}
                ]
            },
            "failurePolicy": "Fail",
            "reinvocationPolicy": "Never",
            "mutations": [
                {
                    "patchType": "ApplyConfiguration",
                    "applyConfiguration": {
                        "expression": (f"Object{{metadata: Object.metadata{{labels: {{'{POLICY_LABEL}': 'added'}}}}}}")
                    },
                }
            ],
        },
    }
    binding = {
        "apiVersion": f"{group}/{version}",
        "kind": "MutatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {
            "policyName": name,
            "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}},
        },
    }
    objects.create_cluster_custom_object(group, version, "mutatingadmissionpolicies", policy)
    try:
        objects.create_cluster_custom_object(group, version, "mutatingadmissionpolicybindings", binding)
        try:
            counter = iter(range(10_000))

            def in_effect() -> Optional[bool]:
                pod = probe.create(bare(f"policy-probe-{next(counter)}"), dry_run="All")
                return True if POLICY_LABEL in (pod["metadata"].get("labels") or {}) else None

            poll_until("the API server to apply the MutatingAdmissionPolicy", in_effect, PROPAGATION)
            yield
        finally:
            objects.delete_cluster_custom_object(group, version, "mutatingadmissionpolicybindings", name)
    finally:
        objects.delete_cluster_custom_object(group, version, "mutatingadmissionpolicies", name)


def bare(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": template("solo")["spec"]}


@contextlib.contextmanager
def amp_unreachable(amp: AmpInstance, probe: Controllers) -> Iterator[None]:
    """amp's webhook pointed at a closed port (failure policy Ignore) until the block ends."""
    adm = client.AdmissionregistrationV1Api(amp.admin)
    name = amp.webhook_configuration_name

    def point_at(url: str) -> None:
        config = adm.read_mutating_webhook_configuration(name)
        config.webhooks[0].client_config.url = url
        adm.replace_mutating_webhook_configuration(name, config)

    def stamped() -> bool:
        return STATUS_ANNOTATION in (
            probe.create(bare("reach-probe"), dry_run="All")["metadata"].get("annotations") or {}
        )

    point_at(f"https://127.0.0.1:{closed_port()}/mutate")
    try:
        poll_until("the API server to stop calling amp", lambda: True if not stamped() else None, PROPAGATION)
        yield
    finally:
        point_at(amp.process.mutate_url)
        poll_until("the API server to call amp again", lambda: True if stamped() else None, PROPAGATION)


def audit_gauge(port: int, namespace: str) -> dict[str, float]:
    """amp_audit_pods of C{namespace} on amp's /metrics, by state."""
    import urllib.request

    with urllib.request.urlopen(f"http://{LOOPBACK}:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    found = {}
    for line in text.splitlines():
        if line.startswith("amp_audit_pods{") and f'namespace="{namespace}"' in line:
            state = line.split('state="')[1].split('"')[0]
            found[state] = float(line.rsplit(" ", 1)[1])
    return found


def run_audit(
    amp: AmpInstance, control_plane: ControlPlane, namespace: str, recordings: Path, *extra: str
) -> tuple[int, str, float]:
    script = shutil.which("amp", path=os.path.dirname(sys.executable))
    assert script is not None, "the amp console script is not installed beside the interpreter"
    started = time.monotonic()
    done = subprocess.run(
        [
            script,
            "audit",
            "--config",
            str(amp.process.config_path),
            "--kubeconfig",
            str(control_plane.kubeconfig_path),
            "-n",
            namespace,
            "--recordings",
            str(recordings),
            *extra,
        ],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.stderr == b"", done.stderr
    return done.returncode, done.stdout.decode(), time.monotonic() - started


def test_audit_after_a_sidecar_image_change(start_amp: AmpFactory, control_plane: ControlPlane, tmp_path: Path) -> None:
    recordings = tmp_path / "recordings"
    lease_ns = unique("audit-lease")
    control_plane.create_namespace(lease_ns)
    metrics_port = free_port()
    amp = start_amp(
        "audit",
        webhook_failure_policy="Ignore",
        overrides={
            "record": {"enabled": True, "directory": str(recordings)},
            "metrics": {"port": metrics_port, "interface": LOOPBACK},
            "kubernetes": {"kubeconfig": str(control_plane.kubeconfig_path), "bypass": {"lease_namespace": lease_ns}},
            "audit": {"continuous": True, "interval": "10m", "min_interval": "1s"},
        },
    )
    port = closed_port()
    endpoint = SidecarEndpoint(tmp_path / "v1", port, OLD).start_and_wait()
    try:
        ns = amp.namespace(unique("audit"), endpoint.url("sidecar"), failure_policy="Ignore")
        k = Controllers(control_plane, ns)
        with label_policy(control_plane, ns, k):
            k.deployment("web")
            k.deployment("api")
            stored = [k.pod("web", "web-a"), k.pod("web", "web-b"), k.pod("api", "api-a"), k.create(bare("solo"))]
            assert all(p["spec"]["containers"][-1]["image"] == OLD for p in stored)
            with amp_unreachable(amp, k):
                unreviewed = k.pod("web", "web-c")
            assert STATUS_ANNOTATION not in (unreviewed["metadata"].get("annotations") or {})
            endpoint.stop()
            failed = k.pod("web", "web-d")
            assert failed["metadata"]["annotations"][STATUS_ANNOTATION].startswith("skipped ")
            endpoint = SidecarEndpoint(tmp_path / "v2", port, NEW).start_and_wait()
            fresh = k.pod("web", "web-e")
            assert fresh["spec"]["containers"][-1]["image"] == NEW
            assert fresh["metadata"]["labels"][POLICY_LABEL] == "added"

        def versions() -> dict[str, str]:
            pods = k.core.list_namespaced_pod(ns).items
            sets = k.apps.list_namespaced_replica_set(ns).items + k.apps.list_namespaced_deployment(ns).items
            return {f"{type(o).__name__}/{o.metadata.name}": o.metadata.resource_version for o in pods + sets}

        before = versions()
        status, out, _ = run_audit(amp, control_plane, ns, recordings, "-o", "json")
        report = json.loads(out)
        states = {(w["kind"], w["name"]): {p["name"]: p["state"] for p in w["pods"]} for w in report["workloads"]}
        assert states == {
            ("Deployment", "web"): {
                "web-a": "stale",
                "web-b": "stale",
                "web-c": "never-mutated",
                "web-d": "failed",
                "web-e": "current",
            },
            ("Deployment", "api"): {"api-a": "stale"},
            ("Pod", "solo"): {"solo": "stale"},
        }, out
        image_change = {"after": NEW, "before": OLD}
        for w in report["workloads"]:
            for p in w["pods"]:
                if p["state"] == "stale":
                    assert [dict(d, path=None) for d in p["differences"]] == [dict(image_change, path=None)], p
                    assert p["differences"][0]["path"].endswith("/image")
        commands = {w["name"]: w["command"] for w in report["workloads"]}
        assert commands["web"] == f"kubectl rollout restart deployment/web -n {ns}"
        assert commands["api"] == f"kubectl rollout restart deployment/api -n {ns}"
        assert report["endpoint_calls"] == 3  # one per template: web, api, solo's recorded review
        assert status == 1

        status, table, seconds = run_audit(amp, control_plane, ns, recordings)
        assert status == 1
        assert f'/spec/containers/1/image: "{OLD}" -> "{NEW}"' in table, table
        print(f"\n$ amp audit -n {ns} ... ({seconds:.2f} s)\n{table}")
        assert versions() == before  # read-only: nothing in the cluster changed

        # The continuous audit: a change of the namespace's amp annotations is its cue.
        k.core.patch_namespace(ns, {"metadata": {"annotations": {"amp.txn2.com/record": "true"}}})
        want = {"stale": 3, "current": 1, "never-mutated": 1, "failed": 1, "unknown": 1}  # no recordings: solo

        def audited() -> Optional[dict[str, float]]:
            found = audit_gauge(metrics_port, ns)
            return found if found == want else None

        poll_until(
            "the continuous audit to expose the namespace's Pods",
            audited,
            PROPAGATION,
            details=lambda: f"{audit_gauge(metrics_port, ns)}\n{amp.process.describe()}",
        )
    finally:
        endpoint.stop()
