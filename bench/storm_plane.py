"""
bench/storm's cluster: the end-to-end suite's control plane (etcd and
kube-apiserver, whose MutatingAdmissionPolicy API is GA and on) plus its controllers
(kube-controller-manager and kube-scheduler with raised client limits, kwok's
fake nodes), and the targets a storm is measured against:

  - C{none}: no mutation at all (the namespace matches nothing);
  - C{policy}: a MutatingAdmissionPolicy adding the same variable and status
    stamp as the endpoint (the in-tree floor: no webhook, no network);
  - C{amp}: amp (one worker) with the example endpoint C{/user-env};
  - C{amp-w2}: the same with C{workers: 2}.

Each target gives a namespace its labels and annotations; amp's targets are
C{twistd amp} processes registered by a MutatingWebhookConfiguration of
their own (a webhook name of their own, which labels the API server's
metrics), failure policy Ignore. Everything listens on 127.0.0.1.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Callable, Optional

from bench.harness import cpu_seconds_with_children, say
from tests.e2e import build
from tests.e2e.amp_process import AmpInstance, ExampleEndpoints, free_port
from tests.e2e.cluster import ControlPlane
from tests.e2e.controllers import Controllers

TARGETS = ("none", "policy", "amp", "amp-w2")
POLICY_LABEL = "storm.amp.txn2.com/policy"
VARIABLE = "AMP_USER"
STATUS = "amp.txn2.com/status"
#: The webhook's timeoutSeconds (the Kubernetes default).
WEBHOOK_TIMEOUT = 10
ADMISSION_GROUP = "admissionregistration.k8s.io"


def policy_versions(plane: ControlPlane) -> list[str]:
    """The versions of the admissionregistration group that serve MutatingAdmissionPolicy."""
    found = []
    for version in ("v1", "v1beta1", "v1alpha1"):
        try:
            listing = json.loads(plane.get(f"/apis/{ADMISSION_GROUP}/{version}"))
        except Exception:
            continue
        if any(r.get("name") == "mutatingadmissionpolicies" for r in listing.get("resources") or []):
            found.append(version)
    return found


def policy_objects(version: str) -> list[dict[str, Any]]:
    """A MutatingAdmissionPolicy (and its binding to namespaces labelled
    C{POLICY_LABEL}) that adds C{VARIABLE} to the first container and the
    status stamp, as the endpoint and amp do."""
    api = f"{ADMISSION_GROUP}/{version}"
    expression = (
        '[JSONPatch{op: "add", path: "/spec/containers/0/env", '
        f'value: [Object.spec.containers.env{{name: "{VARIABLE}", value: "storm"}}]}}, '
        'JSONPatch{op: "add", path: "/metadata/annotations", '
        f'value: {{"{STATUS}": "mutated"}}}}]'
    )
    return [
        {
            "apiVersion": api,
            "kind": "MutatingAdmissionPolicy",
            "metadata": {"name": "storm-floor"},
            "spec": {
                "matchConstraints": {
                    "resourceRules": [
                        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}
                    ]
                },
                "failurePolicy": "Fail",
                "reinvocationPolicy": "Never",
                "mutations": [{"patchType": "JSONPatch", "jsonPatch": {"expression": expression}}],
            },
        },
        {
            "apiVersion": api,
            "kind": "MutatingAdmissionPolicyBinding",
            "metadata": {"name": "storm-floor"},
            "spec": {
                "policyName": "storm-floor",
                "matchResources": {"namespaceSelector": {"matchLabels": {POLICY_LABEL: "true"}}},
            },
        },
    ]


@dataclasses.dataclass
class Target:
    """One thing a storm runs against: the namespace it needs, and amp's process if any."""

    name: str
    labels: dict[str, str]
    annotations: dict[str, str]
    amp: Optional[AmpInstance] = None
    #: Run in a run's namespace before it is measured (e.g. until amp calls the endpoint again).
    prepare: Optional[Callable[[str], None]] = None

    @property
    def webhook(self) -> Optional[str]:
        return self.amp.webhook_name if self.amp else None

    def cpu_seconds(self) -> Optional[float]:
        """amp's CPU so far (its workers' included), or None without amp."""
        return cpu_seconds_with_children(self.amp.process.pid) if self.amp else None

    def amp_metrics(self) -> Any:
        from tests.support.prometheus import Scrape

        assert self.amp is not None
        return Scrape.get(int(self.amp.process.config["metrics"]["port"]), "127.0.0.1", timeout=10)


class StormCluster:
    """The control plane, its controllers, the example endpoints and the targets."""

    def __init__(self, workdir: Path, *, qps: float, burst: int) -> None:
        self.workdir = Path(workdir)
        self.qps = qps
        self.burst = burst
        self.plane: Optional[ControlPlane] = None
        self.controllers: Optional[Controllers] = None
        self.examples: Optional[ExampleEndpoints] = None
        self.targets: dict[str, Target] = {}
        self.policy_version: Optional[str] = None
        self._amps: list[AmpInstance] = []

    def start(self, names: tuple[str, ...] = TARGETS) -> None:
        binaries, controller_binaries = build.build(), build.build_controllers()
        # MutatingAdmissionPolicy is GA (admissionregistration.k8s.io/v1, on by
        # default) since Kubernetes 1.36; an older release needs
        # --feature-gates=MutatingAdmissionPolicy=true and
        # --runtime-config=admissionregistration.k8s.io/v1beta1=true here.
        self.plane = ControlPlane(self.workdir / "control-plane", binaries)
        say("starting etcd, kube-apiserver")
        self.plane.start()
        say(f"starting kwok, kube-scheduler, kube-controller-manager (client qps {self.qps:g}, burst {self.burst})")
        self.controllers = Controllers(
            self.plane, controller_binaries, self.workdir / "controllers", qps=self.qps, burst=self.burst
        )
        self.controllers.start()
        self.examples = ExampleEndpoints(self.workdir / "examples").start_and_wait()
        for name in names:
            self.targets[name] = self._target(name)

    def _target(self, name: str) -> Target:
        assert self.plane is not None and self.examples is not None
        if name == "none":
            return Target(name, {}, {})
        if name == "policy":
            versions = policy_versions(self.plane)
            if not versions:
                raise RuntimeError("the API server serves no MutatingAdmissionPolicy API")
            self.policy_version = versions[0]
            for obj in policy_objects(self.policy_version):
                self._create(obj)
            return Target(name, {POLICY_LABEL: "true"}, {})
        workers = 2 if name == "amp-w2" else 1
        return self.amp_target(name, self.examples.url("user-env"), workers=workers)

    def amp_target(
        self, name: str, endpoint: str, *, workers: int = 1, overrides: Optional[dict[str, Any]] = None
    ) -> Target:
        """An amp process registered for namespaces of its own, calling C{endpoint}."""
        assert self.plane is not None and self.examples is not None
        options: dict[str, Any] = {"metrics": {"port": free_port(), "interface": "127.0.0.1"}, **(overrides or {})}
        if workers > 1:
            options["workers"] = workers
        amp = AmpInstance(
            self.plane,
            self.plane.kubeconfig_path,
            self.examples,
            self.workdir / "amp",
            name,
            webhook_name=f"{name}.storm.amp.txn2.com",
            webhook_failure_policy="Ignore",
            webhook_timeout_seconds=WEBHOOK_TIMEOUT,
            overrides=options,
        )
        self._amps.append(amp)
        say(f"starting amp target {name} ({workers} worker{'s' if workers > 1 else ''})")
        amp.start(timeout=60)
        labels = {"amp.txn2.com/enabled": "true", "e2e.amp.txn2.com/instance": amp.instance}
        return Target(name, labels, {"amp.txn2.com/ep": endpoint}, amp)

    def _create(self, obj: dict[str, Any]) -> None:
        from kubernetes import client

        assert self.plane is not None
        group, version = obj["apiVersion"].split("/")
        plural = obj["kind"].lower() + "s" if not obj["kind"].endswith("y") else obj["kind"][:-1].lower() + "ies"
        client.CustomObjectsApi(self.plane.admin_client()).create_cluster_custom_object(group, version, plural, obj)

    def stop(self) -> None:
        for amp in self._amps:
            amp.close()
        if self.examples is not None:
            self.examples.stop()
        if self.controllers is not None:
            self.controllers.stop()
        if self.plane is not None:
            self.plane.stop()

    def versions(self) -> dict[str, str]:
        return {
            "kubernetes": build.kubernetes_version(),
            "etcd": build.etcd_version(),
            "kwok": build.kwok_version(),
            "policy_api": f"{ADMISSION_GROUP}/{self.policy_version}",
            "machine_cpus": str(os.cpu_count()),
        }
