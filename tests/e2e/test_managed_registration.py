"""End-to-end: the managed registration on a real kube-apiserver.

amp runs with ``registration.managed`` and only the RBAC deploy/ grants
(the ClusterRole of deploy/base, the Lease Role, and deploy/managed's
``amp-registration``: patch on the one configuration by name).  It creates
the MutatingWebhookConfiguration by server-side apply under the field
manager ``amp``, and repairs hand edits of the timeout, a selector and the
caBundle.  Its enable label is unique to the test, so the entries it
applies (which call a Service no one serves here) select no namespace of
the other scenarios.  The scenario prints the time each repair took.
"""

from __future__ import annotations

import base64
import copy
import time
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from amp.config import parse_config
from amp.registration import check, desired, needs

from ..support.waiting import poll_until
from .amp_process import LOOPBACK, AmpProcess, amp_config, free_port
from .cluster import ControlPlane
from .conftest import AMP_SERVICE_ACCOUNT, DEPLOY_DIR, deploy_amp_config

pytestmark = pytest.mark.e2e

WAIT = 30.0


@pytest.fixture
def managed_rbac(control_plane: ControlPlane, amp_kubeconfig: Path) -> Iterator[None]:
    """deploy/managed's ClusterRole and binding, bound to the session's amp ServiceAccount."""
    docs = list(yaml.safe_load_all((DEPLOY_DIR / "managed" / "registration-rbac.yaml").read_text()))
    role = next(d for d in docs if d and d["kind"] == "ClusterRole")
    rbac = client.RbacAuthorizationV1Api(control_plane.admin_client())
    namespace, account = AMP_SERVICE_ACCOUNT
    name = "amp-e2e-registration"
    rbac.create_cluster_role(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": name},
            "rules": role["rules"],
        }
    )
    rbac.create_cluster_role_binding(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
        }
    )
    try:
        yield
    finally:
        rbac.delete_cluster_role_binding(name)
        rbac.delete_cluster_role(name)


def test_amp_creates_its_registration_and_repairs_hand_edits(
    control_plane: ControlPlane,
    amp_kubeconfig: Path,
    lease_rbac: str,
    managed_rbac: None,  # noqa: F811
    tmp_path: Path,
) -> None:
    name = deploy_amp_config()["kubernetes"]["webhook_configuration"]
    admission = client.AdmissionregistrationV1Api(control_plane.admin_client())

    def read() -> Optional[dict[str, Any]]:
        try:
            return control_plane.admin_client().sanitize_for_serialization(
                admission.read_mutating_webhook_configuration(name)
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    if read() is not None:
        admission.delete_mutating_webhook_configuration(name)
    cert, key = control_plane.issue_serving_certificate("amp-managed")
    ca_file = tmp_path / "ca.crt"
    ca_file.write_bytes(control_plane.ca_pem)
    metrics_port = free_port()
    config = amp_config(
        port=free_port(),
        cert=cert,
        key=key,
        kubeconfig=amp_kubeconfig,
        webhook_configuration=name,
        overrides={
            "metrics": {"port": metrics_port, "interface": LOOPBACK},
            "kubernetes": {
                "own_namespace": lease_rbac,
                "enabled_label": "e2e-managed.amp.txn2.com/enabled",
                "bypass": {"enabled": False, "lease_namespace": lease_rbac, "lease_duration": "3s"},
            },
            "registration": {"managed": True, "ca_bundle": str(ca_file), "repair_interval": "1s"},
        },
    )
    want = desired(parse_config(config), control_plane.ca_pem, lease_rbac)
    # The overlay ships the object (amp may patch it, not create it): here
    # a stale one, without a caBundle and with the API server's longest
    # timeout, which amp's first apply repairs.
    shipped = copy.deepcopy(want)
    for entry in shipped["webhooks"]:
        del entry["clientConfig"]["caBundle"]
        entry["timeoutSeconds"] = 30
    admission.create_mutating_webhook_configuration(shipped)
    process = AmpProcess("amp-managed", tmp_path, config, control_plane.ca_pem)
    try:
        process.start_and_wait(WAIT)
        obj = poll_until(
            "amp to apply its registration",
            lambda: (lambda o: o if o["webhooks"][0].get("clientConfig", {}).get("caBundle") else None)(read()),
            WAIT,
            details=process.describe,
        )
        assert [e["name"] for e in obj["webhooks"]] == [e["name"] for e in want["webhooks"]]
        assert check(obj, needs(parse_config(config), lease_rbac)) == ()
        assert base64.b64decode(obj["webhooks"][0]["clientConfig"]["caBundle"]) == control_plane.ca_pem
        managers = {(m["manager"], m["operation"]) for m in obj["metadata"]["managedFields"]}
        assert ("amp", "Apply") in managers, managers

        def repaired(edit: Any, holds: Any, what: str) -> float:
            current = read()
            assert current is not None
            edit(current["webhooks"])
            started = time.monotonic()
            admission.replace_mutating_webhook_configuration(name, current)
            poll_until(
                f"amp to repair {what}",
                lambda: True if holds(read()["webhooks"]) else None,
                WAIT,
                details=process.describe,
            )
            return time.monotonic() - started

        timings = {
            "timeoutSeconds": repaired(
                lambda w: w[1].update(timeoutSeconds=30), lambda w: w[1]["timeoutSeconds"] == 10, "the timeout"
            ),
            "selector": repaired(
                lambda w: w[0]["namespaceSelector"].pop("matchExpressions"),
                lambda w: "matchExpressions" in w[0]["namespaceSelector"],
                "the selector",
            ),
            "caBundle": repaired(
                lambda w: w[0]["clientConfig"].update(
                    caBundle=base64.b64encode(
                        b"-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n"
                    ).decode()
                ),
                lambda w: base64.b64decode(w[0]["clientConfig"]["caBundle"]) == control_plane.ca_pem,
                "the caBundle",
            ),
        }
        print(
            "\nmanaged registration, time from a hand edit to its repair: "
            + ", ".join(f"{k} {v:.2f}s" for k, v in timings.items())
        )
        assert poll_until(
            "the repairs counted",
            lambda: (process.metric("amp_registration_repairs_total") or 0) >= 4 or None,
            WAIT,
            details=process.describe,
        )
        assert process.log_text().count("repaired webhooks[") >= 3, process.describe()
    finally:
        process.stop()
        if read() is not None:
            admission.delete_mutating_webhook_configuration(name)
    assert process.stopped_cleanly(), process.describe()
