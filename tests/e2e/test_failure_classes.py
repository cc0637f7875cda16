"""End-to-end: each namespace's failure class holds when amp is gone.

amp is registered with the shipped registration (deploy/cert-manager's
MutatingWebhookConfiguration: one entry per failure class, selecting on
the label amp.txn2.com/failure-class), pointed at amp by URL and narrowed to
this test's instance label.  With amp running, Pods in a Fail-class and an
Ignore-class namespace are mutated and stamped, and amp reports no
registration problem.  With amp SIGKILLed, the API server itself refuses a
Pod in the Fail-class namespace, naming the Fail entry, and admits one in
the Ignore-class namespace, which amp's bypass report names exactly once
when amp is back; Pods in kube-system (labelled enabled and Fail) and in a
namespace amp does not manage are created throughout.  A hand edit of the
registration is named by amp (the log and amp_registration_problems).

The scenario prints the time from the kill to the API server's refusal and
from amp's restart to the bypass Event.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from ..support.waiting import poll_until
from .amp_process import (
    ENABLED_LABEL,
    INSTANCE_LABEL,
    LOOPBACK,
    STATUS_ANNOTATION,
    AmpInstance,
    ExampleEndpoints,
    free_port,
    pod_manifest,
    unique,
)
from .cluster import ControlPlane
from .conftest import DEPLOY_DIR, deploy_amp_config
from .test_bypass import bypass_events, core  # noqa: F401 (fixtures; lease_rbac is in conftest.py)

pytestmark = pytest.mark.e2e

CLASS_LABEL = "amp.txn2.com/failure-class"
WAIT = 30.0


def shipped_registration(instance: str, url: str, ca_pem: bytes) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """The registration deploy/cert-manager ships, calling amp at C{url} for this instance's namespaces."""

    def make(one_entry: dict[str, Any]) -> dict[str, Any]:
        shipped = yaml.safe_load((DEPLOY_DIR / "cert-manager" / "mutatingwebhookconfiguration.yaml").read_text())
        shipped["metadata"] = {"name": one_entry["metadata"]["name"]}
        for hook in shipped["webhooks"]:
            hook["namespaceSelector"]["matchLabels"][INSTANCE_LABEL] = instance
            hook["clientConfig"] = {"url": url, "caBundle": base64.b64encode(ca_pem).decode()}
        return shipped

    return make


@pytest.fixture
def kube_system(control_plane: ControlPlane) -> Iterator[client.CoreV1Api]:
    """kube-system with its ``default`` ServiceAccount (no controller-manager makes it here)."""
    core_api = client.CoreV1Api(control_plane.admin_client())
    try:
        core_api.create_namespaced_service_account("kube-system", {"metadata": {"name": "default"}})
    except ApiException as exc:
        if exc.status != 409:
            raise
    yield core_api


def test_the_api_server_keeps_each_namespace_failure_class_while_amp_is_killed(
    control_plane: ControlPlane,
    amp_kubeconfig: Path,
    example_endpoints: ExampleEndpoints,
    lease_rbac: str,
    kube_system: client.CoreV1Api,
    tmp_path: Path,
) -> None:
    core_api = kube_system
    metrics_port = free_port()
    # The names deploy/ gives amp's webhook configuration: its ClusterRole
    # grants access to that one by name only.
    kube = deploy_amp_config()["kubernetes"]
    amp = AmpInstance(
        control_plane,
        amp_kubeconfig,
        example_endpoints,
        tmp_path,
        "classes",
        watch_webhook_configuration=True,
        webhook_configuration_name=kube["webhook_configuration"],
        webhook_name=kube["webhook_name"],
        overrides={
            "metrics": {"port": metrics_port, "interface": LOOPBACK},
            "failure_policy": "auto",
            "endpoints": {"timeout": "2s"},
            "kubernetes": {"bypass": {"enabled": True, "lease_namespace": lease_rbac, "lease_duration": "3s"}},
        },
    )
    amp.registration = shipped_registration(amp.instance, amp.process.mutate_url, control_plane.ca_pem)
    process = amp.process
    endpoint = example_endpoints.url("user-env")
    strict = amp.namespace(unique("strict"), endpoint)
    relaxed = amp.namespace(unique("relaxed"), endpoint)
    core_api.patch_namespace(strict, {"metadata": {"labels": {CLASS_LABEL: "Fail"}}})
    core_api.patch_namespace(relaxed, {"metadata": {"labels": {CLASS_LABEL: "Ignore"}}})
    unmanaged = amp.namespace(unique("unmanaged"), endpoint, enabled=False)
    system_labels = core_api.read_namespace("kube-system").metadata.labels or {}
    added = {ENABLED_LABEL: "true", INSTANCE_LABEL: amp.instance, CLASS_LABEL: "Fail"}
    core_api.patch_namespace("kube-system", {"metadata": {"labels": added}})
    made_in_system: list[str] = []

    def create(namespace: str, name: str) -> dict[str, Any]:
        pod = core_api.create_namespaced_pod(namespace, pod_manifest(name))
        if namespace == "kube-system":
            made_in_system.append(name)
        return {
            "annotations": pod.metadata.annotations or {},
            "env": [e.name for e in pod.spec.containers[0].env or ()],
        }

    try:
        amp.start()
        # amp running: both classes mutated and stamped; kube-system and
        # the unmanaged namespace left alone
        for namespace in (strict, relaxed):
            pod = create(namespace, "while-up")
            assert "AMP_USER" in pod["env"], pod
            assert pod["annotations"][STATUS_ANNOTATION].startswith("mutated"), pod
        for namespace in ("kube-system", unmanaged):
            pod = create(namespace, f"up-{amp.instance}")
            assert STATUS_ANNOTATION not in pod["annotations"] and "AMP_USER" not in pod["env"], pod
        assert poll_until(
            "amp's first registration check",
            lambda: process.metric("amp_registration_problems", problem="class-not-enforced") == 0 or None,
            WAIT,
            details=process.describe,
        )
        problems = {
            p: process.metric("amp_registration_problems", problem=p)
            for p in (
                "class-not-called",
                "class-not-enforced",
                "entries-overlap",
                "selects-protected-namespace",
                "timeout-below-endpoints",
                "rules-missing",
                "side-effects",
                "ca-bundle-mismatch",
            )
        }
        assert set(problems.values()) == {0}, f"{problems}\n{process.describe()}"
        assert "registration problem(s)" not in process.log_text()
        assert (
            f"MutatingWebhookConfiguration {amp.webhook_configuration_name}: no registration problem"
            in process.log_text()
        )

        # amp killed: the API server applies each namespace's class itself
        assert process.proc is not None
        os.killpg(process.pid, signal.SIGKILL)
        killed = time.monotonic()
        with pytest.raises(ApiException) as refused:
            create(strict, "while-down")
        refusal = time.monotonic() - killed
        assert refused.value.status == 500, refused.value.body
        message = json.loads(refused.value.body)["message"]
        assert 'failed calling webhook "fail.mutate.amp.txn2.com"' in message, message
        admitted_at = time.monotonic()
        pod = create(relaxed, "while-down")
        admitted = time.monotonic() - admitted_at
        assert STATUS_ANNOTATION not in pod["annotations"] and "AMP_USER" not in pod["env"], pod
        for namespace in ("kube-system", unmanaged):
            create(namespace, f"down-{amp.instance}")
        process.stop()
        print(
            f"\nSIGKILL -> API server refuses the Fail-class Pod: {refusal * 1000:.0f} ms; "
            f"Ignore-class Pod admitted without amp in {admitted * 1000:.0f} ms"
        )

        # amp back: the Ignore-class Pod is reported, once; nothing else is
        restarted = time.monotonic()
        process.start_and_wait(WAIT)
        events = poll_until(
            "the AmpBypassed Event",
            lambda: bypass_events(core_api, relaxed) or None,
            WAIT,
            interval=0.05,
            details=process.describe,
        )
        print(f"amp restart -> AmpBypassed Event on the Ignore-class Pod: {time.monotonic() - restarted:.2f}s")
        assert {name: len(found) for name, found in events.items()} == {"while-down": 1}
        assert [e.count for e in events["while-down"]] == [1]
        assert bypass_events(core_api, strict) == {} and bypass_events(core_api, unmanaged) == {}
        assert [n for n in bypass_events(core_api, "kube-system") if amp.instance in n] == []
        assert process.metric("amp_bypassed_pods_total", namespace=relaxed) == 1

        # a hand edit of the registration is named by amp, which stays ready
        hooks = client.AdmissionregistrationV1Api(amp.admin)
        edited = hooks.read_mutating_webhook_configuration(amp.webhook_configuration_name)
        for hook in edited.webhooks:
            if hook.name == "fail.mutate.amp.txn2.com":
                hook.failure_policy = "Ignore"
        hooks.replace_mutating_webhook_configuration(amp.webhook_configuration_name, edited)
        poll_until(
            "amp to name the hand edit",
            lambda: process.metric("amp_registration_problems", problem="class-not-enforced") == 1 or None,
            WAIT,
            details=process.describe,
        )
        assert (
            "class-not-enforced: enabled namespaces labelled amp.txn2.com/failure-class=Fail are sent by entry "
            "fail.mutate.amp.txn2.com, whose failurePolicy is Ignore"
        ) in process.log_text()
        process.wait_healthy(process.port, "/readyz", process.client_context(), WAIT)
        # ... and by amp check against the cluster, with amp's own config (and RBAC)
        checked = subprocess.run(
            [
                sys.executable,
                "-c",
                "from amp.cli import main; main()",
                "check",
                "--cluster",
                "--config",
                str(process.config_path),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert checked.returncode == 1, checked.stdout + checked.stderr
        assert (
            f"MutatingWebhookConfiguration {amp.webhook_configuration_name}: 1 registration problem(s)"
            in checked.stdout
        )
        assert "class-not-enforced: enabled namespaces labelled amp.txn2.com/failure-class=Fail" in checked.stdout
        # ... and by amp explain, beside the namespace's class and where it came from
        pod_file = tmp_path / "pod.yaml"
        pod_file.write_text(yaml.safe_dump(pod_manifest("explained")))
        explained = subprocess.run(
            [
                sys.executable,
                "-c",
                "from amp.cli import main; main()",
                "explain",
                "--config",
                str(process.config_path),
                "-n",
                strict,
                "-o",
                "json",
                str(pod_file),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        notes = json.loads(explained.stdout).get("notes") or []
        assert [n for n in notes if n.startswith("registration: class-not-enforced: ")], explained.stdout
        assert f"the namespace's failure-class label {CLASS_LABEL}" in explained.stdout
    finally:
        status = amp.close()
        core_api.patch_namespace(
            "kube-system", {"metadata": {"labels": {k: None for k in added if k not in system_labels}}}
        )
        for name in made_in_system:
            try:
                core_api.delete_namespaced_pod(name, "kube-system")
            except ApiException as exc:
                if exc.status != 404:
                    raise
    assert process.stopped_cleanly(), f"amp did not stop cleanly (status {status})\n{process.describe()}"
