"""End-to-end: the bypassed-Pod report against a real kube-apiserver.

amp runs with the RBAC from ``deploy/`` (the session's ClusterRole, and here
the Lease Role of ``deploy/base/role.yaml`` in amp's own namespace), the
report on, and its webhook registered with ``failurePolicy: Ignore``.  While
amp is stopped the API server cannot reach it and admits Pods unchanged;
once amp is back, each of those Pods gets its ``AmpBypassed`` Event and is
counted, while the Pods amp reviewed (stamped), a Pod that opted out and a
Pod created before its namespace was enabled are not.  A second restart
reports only what was created during the second outage: no Pod twice.

The scenario prints the time from amp's restart to the first Event.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from ..waiting import poll_until
from .amp_process import (
    unique,
    ENABLED_LABEL,
    LOOPBACK,
    AmpInstance,
    ExampleEndpoints,
    free_port,
    pod_manifest,
)
from .cluster import ControlPlane
from .conftest import AMP_SERVICE_ACCOUNT, DEPLOY_DIR

pytestmark = pytest.mark.e2e

LEASE_NAME = "amp-bypass-reporter"
REASON = "AmpBypassed"
WAIT = 30.0



@pytest.fixture(scope="module")
def lease_rbac(control_plane: ControlPlane, amp_kubeconfig: Path) -> Iterator[str]:
    """The Lease Role and RoleBinding of ``deploy/base``, in the namespace of
    the session's amp ServiceAccount (amp's own namespace); its name."""
    namespace, account = AMP_SERVICE_ACCOUNT
    role = yaml.safe_load((DEPLOY_DIR / "base" / "role.yaml").read_text())
    rbac = client.RbacAuthorizationV1Api(control_plane.admin_client())
    name = "amp-e2e-bypass"
    rbac.create_namespaced_role(namespace, {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": name, "namespace": namespace}, "rules": role["rules"]})
    rbac.create_namespaced_role_binding(namespace, {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": name, "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]})
    try:
        yield namespace
    finally:
        rbac.delete_namespaced_role_binding(name, namespace)
        rbac.delete_namespaced_role(name, namespace)
        try:
            client.CoordinationV1Api(control_plane.admin_client()).delete_namespaced_lease(LEASE_NAME, namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise


@pytest.fixture
def core(control_plane: ControlPlane) -> client.CoreV1Api:
    return client.CoreV1Api(control_plane.admin_client())


def bypass_events(core: client.CoreV1Api, namespace: str) -> dict[str, list[Any]]:
    """The AmpBypassed Events in ``namespace``, by Pod name."""
    found: dict[str, list[Any]] = {}
    for event in core.list_namespaced_event(namespace, field_selector=f"reason={REASON}").items:
        found.setdefault(event.involved_object.name, []).append(event)
    return found


def create(core: client.CoreV1Api, namespace: str, name: str, **kwargs: Any) -> dict[str, Any]:
    pod = core.create_namespaced_pod(namespace, pod_manifest(name, **kwargs))
    return pod.metadata.annotations or {}


def test_pods_created_while_amp_was_down_are_reported_once_after_it_restarts(
    control_plane: ControlPlane,
    amp_kubeconfig: Path,
    example_endpoints: ExampleEndpoints,
    lease_rbac: str,
    tmp_path: Path,
    core: client.CoreV1Api,
) -> None:
    metrics_port = free_port()
    amp = AmpInstance(
        control_plane, amp_kubeconfig, example_endpoints, tmp_path, "bypass",
        webhook_failure_policy="Ignore",
        overrides={
            "metrics": {"port": metrics_port, "interface": LOOPBACK},
            "kubernetes": {"bypass": {"enabled": True, "lease_namespace": lease_rbac, "lease_duration": "6s"}},
        },
    )
    process = amp.process
    endpoint = example_endpoints.url("user-env")
    # Enabled well before any Pod is created in it (amp's start takes
    # seconds): the report compares whole seconds.
    team = amp.namespace(unique("bypass"), endpoint)
    late = amp.namespace(unique("bypass-late"), endpoint, enabled=False)
    try:
        amp.start()

        def lease_holder() -> Optional[str]:
            try:
                lease = client.CoordinationV1Api(amp.admin).read_namespaced_lease(LEASE_NAME, lease_rbac)
            except ApiException as exc:
                if exc.status == 404:
                    return None
                raise
            return lease.spec.holder_identity or None

        first_holder = poll_until("amp to take the Lease", lease_holder, WAIT, details=process.describe)

        # amp up: it reviews (and stamps) this one; the other namespace is
        # not enabled yet, so nobody reviews its Pod
        reviewed = create(core, team, "reviewed")
        assert "amp.txn2.com/status" in reviewed, reviewed
        create(core, late, "before-enabling")

        # amp down: the API server fails open
        process.stop()
        assert process.stopped_cleanly(), process.describe()
        core.patch_namespace(late, {"metadata": {"labels": {ENABLED_LABEL: "true"}}})
        for name in ("bypassed-1", "bypassed-2"):
            assert "amp.txn2.com/status" not in create(core, team, name)
        create(core, team, "opted-out", labels={ENABLED_LABEL: "false"})

        restarted = time.monotonic()
        process.start()

        def reported() -> Optional[dict[str, list[Any]]]:
            events = bypass_events(core, team)
            return events if {"bypassed-1", "bypassed-2"} <= set(events) else None

        events = poll_until("the AmpBypassed Events", reported, WAIT, interval=0.05, details=process.describe)
        seconds = time.monotonic() - restarted
        print(f"\namp restart -> AmpBypassed Event on the bypassed Pods: {seconds:.2f}s")
        process.wait_healthy(process.port, "/readyz", process.client_context(), WAIT)

        assert sorted(events) == ["bypassed-1", "bypassed-2"], sorted(events)
        for name in ("bypassed-1", "bypassed-2"):
            [event] = events[name]
            assert (event.type, event.involved_object.kind, event.involved_object.namespace) == \
                ("Warning", "Pod", team)
            assert "admitted without amp" in event.message and "Delete and create the Pod again" in event.message
        assert bypass_events(core, late) == {}
        assert process.metric("amp_bypassed_pods_total", namespace=team) == 2
        assert process.metric("amp_bypassed_pods_total", namespace=late) is None
        log = process.log_text()
        assert f"Pod {team}/bypassed-1 was created without amp's review" in log
        assert f"{team}/reviewed was created" not in log and f"{team}/opted-out was created" not in log

        # A second outage: only what was created during it is reported,
        # by the next amp, which takes over the released Lease.
        process.stop()
        assert process.stopped_cleanly(), process.describe()
        create(core, team, "bypassed-3")
        process.start()
        events = poll_until("the third Event", lambda: (e := bypass_events(core, team)) and
                            ("bypassed-3" in e and e or None), WAIT, details=process.describe)
        process.wait_healthy(process.port, "/readyz", process.client_context(), WAIT)
        assert {name: len(found) for name, found in events.items()} == \
            {"bypassed-1": 1, "bypassed-2": 1, "bypassed-3": 1}
        assert process.metric("amp_bypassed_pods_total", namespace=team) == 1
        second_holder = lease_holder()
        assert second_holder is not None and second_holder != first_holder
    finally:
        status = amp.close()
        assert process.stopped_cleanly(), f"amp did not stop cleanly (status {status})\n{process.describe()}"
