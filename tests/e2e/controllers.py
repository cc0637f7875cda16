"""Controllers for the end-to-end control plane: kube-controller-manager,
kube-scheduler and kwok's fake nodes, so that workloads behave as in a
cluster (a Deployment's Pods are created by its ReplicaSet in slow-start
batches, scheduled, and become Ready; rolling updates and Jobs complete).

This module owns starting them against a running ``cluster.ControlPlane``,
the fake nodes kwok plays the kubelet of, proving the chain works (a canary
Deployment's Pod becomes Ready) and stopping them again. They are added to
the one shared control plane only by the tests that ask for them (the
``controllers`` fixture), so the rest of the suite pays nothing.

The fake nodes carry the taint ``kwok.x-k8s.io/node=fake:NoSchedule``:
only Pods that tolerate it (``TOLERATION``, which ``workloads`` puts in
every template) are scheduled, and the Pods the other tests create stay
Pending as before. kube-controller-manager runs only the controllers the
workloads need (``CONTROLLERS``); none of them serves a port (everything
talks to the API server on loopback).

Usage::

    controllers = Controllers(plane, build.build_controllers(), workdir, qps=500, burst=1000)
    controllers.start()
    ...
    controllers.stop()
"""

from __future__ import annotations

import atexit
import subprocess
from pathlib import Path
from typing import Any, Optional

import yaml

from ..support.waiting import WaitTimeout, poll_until
from .build import ControllerBinaries
from .cluster import LOOPBACK, ControlPlane, _stop_process_group, _tail, spawn_logged

#: The controllers the workloads of the e2e tests and bench/storm need.
CONTROLLERS = (
    "deployment-controller",
    "replicaset-controller",
    "job-controller",
    "garbage-collector-controller",
    "namespace-controller",
)
KWOK_KEY = "kwok.x-k8s.io/node"
TAINT = {"key": KWOK_KEY, "value": "fake", "effect": "NoSchedule"}
TOLERATION = {"key": KWOK_KEY, "operator": "Exists", "effect": "NoSchedule"}
#: Pod IPs kwok hands out (never routed; wide enough for every storm).
POD_CIDR = "10.128.0.0/14"
CANARY_NAMESPACE = "amp-e2e-controllers"


class ControllersError(RuntimeError):
    """The controllers could not be started; the message holds the log tails."""


class Controllers:
    """kube-controller-manager, kube-scheduler and kwok against ``plane``.

    ``qps``/``burst`` are the client limits of the controller-manager and the
    scheduler (``--kube-api-qps``/``--kube-api-burst``; their defaults are 20
    and 30, at which the controller sets the pace of any storm). ``nodes``
    fake nodes are created (each with kwok's default capacity: 1000 CPUs,
    a million Pods).
    """

    def __init__(
        self,
        plane: ControlPlane,
        binaries: ControllerBinaries,
        workdir: Path | str,
        *,
        qps: float = 500.0,
        burst: int = 1000,
        nodes: int = 2,
        start_timeout: float = 90.0,
    ) -> None:
        self.plane = plane
        self.binaries = binaries
        self.workdir = Path(workdir).resolve()
        self.qps = qps
        self.burst = burst
        self.node_names = [f"amp-e2e-kwok-{i}" for i in range(nodes)]
        self.start_timeout = start_timeout
        self.logs = {
            name: self.workdir / f"{name}.log" for name in ("kwok", "kube-scheduler", "kube-controller-manager")
        }
        self._procs: dict[str, subprocess.Popen[bytes]] = {}

    # -- lifecycle ---------------------------------------------------------

    def start(self) -> "Controllers":
        """Start kwok, the fake nodes, the scheduler and the controller-manager;
        return once a canary Deployment's Pod is Ready."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        atexit.register(self.stop)
        try:
            self._start_kwok()
            self._create_nodes()
            self._start_scheduler()
            self._start_controller_manager()
            self._canary()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the controller-manager, the scheduler and kwok (each's whole
        process group). The fake nodes stay (they cost nothing)."""
        for name in ("kube-controller-manager", "kube-scheduler", "kwok"):
            proc = self._procs.pop(name, None)
            if proc is not None:
                _stop_process_group(proc)
        atexit.unregister(self.stop)

    @property
    def pids(self) -> dict[str, int]:
        """Process ids of the running programs."""
        return {name: proc.pid for name, proc in self._procs.items()}

    def __enter__(self) -> "Controllers":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- processes ---------------------------------------------------------

    def _spawn(self, name: str, args: list[str]) -> None:
        self._procs[name] = spawn_logged(args, self.workdir, self.logs[name])

    def describe(self) -> str:
        """Each program's state and log tail."""
        parts = []
        for name, log in self.logs.items():
            proc = self._procs.get(name)
            state = (
                "not started"
                if proc is None
                else ("running" if proc.poll() is None else f"exited with {proc.returncode}")
            )
            parts.append(f"--- {name} ({state}), {log} (tail) ---\n{_tail(log)}")
        return "\n".join(parts)

    def _check_running(self) -> None:
        for name, proc in self._procs.items():
            if proc.poll() is not None:
                raise ControllersError(f"{name} exited with status {proc.returncode}\n{self.describe()}")

    def _wait(self, what: str, probe: Any) -> None:
        def checked() -> Any:
            self._check_running()
            return probe()

        try:
            poll_until(what, checked, self.start_timeout, interval=0.2)
        except WaitTimeout:
            raise ControllersError(f"{what}: not within {self.start_timeout:.0f}s\n{self.describe()}") from None

    def _start_kwok(self) -> None:
        config = self.workdir / "kwok.yaml"
        options = {
            "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
            "kind": "KwokConfiguration",
            "options": {
                "manageAllNodes": False,
                "manageNodesWithAnnotationSelector": f"{KWOK_KEY}=fake",
                "cidr": POD_CIDR,
                "nodeIP": LOOPBACK,
                # Given a configuration, kwok applies none of its defaults to it.
                "podPlayStageParallelism": 16,
                "nodePlayStageParallelism": 4,
                "nodeLeaseParallelism": 4,
                "podsOnNodeSyncParallelism": 4,
            },
        }
        config.write_text(yaml.safe_dump(options) + "---\n" + self.binaries.kwok_stages.read_text())
        self._spawn(
            "kwok",
            [
                str(self.binaries.kwok),
                f"--kubeconfig={self.plane.kubeconfig_path}",
                f"--config={config}",
            ],
        )

    def _create_nodes(self) -> None:
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        core = client.CoreV1Api(self.plane.admin_client())
        for name in self.node_names:
            try:
                core.create_node(
                    {
                        "apiVersion": "v1",
                        "kind": "Node",
                        "metadata": {
                            "name": name,
                            "annotations": {KWOK_KEY: "fake"},
                            "labels": {"type": "kwok", "kubernetes.io/hostname": name},
                        },
                        "spec": {"taints": [TAINT]},
                    }
                )
            except ApiException as exc:
                if exc.status != 409:  # left by an earlier start on this control plane
                    raise

        def ready() -> Optional[bool]:
            for name in self.node_names:
                conditions = core.read_node(name).status.conditions or []
                if not any(c.type == "Ready" and c.status == "True" for c in conditions):
                    return None
            return True

        self._wait("kwok to make the fake nodes Ready", ready)
        # The API server's TaintNodesByCondition admission gave each new node
        # node.kubernetes.io/not-ready:NoSchedule; the node lifecycle
        # controller (not run here) would lift it once Ready: lift it.
        for name in self.node_names:
            core.patch_node(name, {"spec": {"taints": [TAINT]}})

    def _start_scheduler(self) -> None:
        config = self.workdir / "kube-scheduler.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "kubescheduler.config.k8s.io/v1",
                    "kind": "KubeSchedulerConfiguration",
                    "clientConnection": {
                        "kubeconfig": str(self.plane.kubeconfig_path),
                        "qps": float(self.qps),
                        "burst": int(self.burst),
                    },
                    "leaderElection": {"leaderElect": False},
                }
            )
        )
        self._spawn(
            "kube-scheduler",
            [
                str(self.binaries.kube_scheduler),
                f"--config={config}",
                "--secure-port=0",
                "--v=1",
            ],
        )

    def _start_controller_manager(self) -> None:
        self._spawn(
            "kube-controller-manager",
            [
                str(self.binaries.kube_controller_manager),
                f"--kubeconfig={self.plane.kubeconfig_path}",
                f"--controllers={','.join(CONTROLLERS)}",
                "--leader-elect=false",
                "--secure-port=0",
                f"--kube-api-qps={self.qps:g}",
                f"--kube-api-burst={self.burst}",
                "--v=1",
            ],
        )

    def _canary(self) -> None:
        """A one-replica Deployment whose Pod becomes Ready proves the chain
        (controller-manager, scheduler, kwok) works; it is then deleted."""
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        from .workloads import deployment, ready_replicas

        core = client.CoreV1Api(self.plane.admin_client())
        apps = client.AppsV1Api(self.plane.admin_client())
        try:
            core.read_namespace(CANARY_NAMESPACE)
        except ApiException as exc:
            if exc.status != 404:
                raise
            self.plane.create_namespace(CANARY_NAMESPACE)
        name = "canary"
        try:
            apps.delete_namespaced_deployment(name, CANARY_NAMESPACE)
        except ApiException as exc:
            if exc.status != 404:
                raise
        apps.create_namespaced_deployment(CANARY_NAMESPACE, deployment(name, 1))
        self._wait(
            "a canary Deployment's Pod to become Ready",
            lambda: True if ready_replicas(apps, CANARY_NAMESPACE, name) == 1 else None,
        )
        apps.delete_namespaced_deployment(name, CANARY_NAMESPACE, propagation_policy="Background")
