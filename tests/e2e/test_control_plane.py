"""The end-to-end control plane works: the API server admits and stores
Pods, authenticates the admin and service accounts, enforces RBAC, and the
harness starts and stops cleanly."""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import urllib.request
from pathlib import Path
from typing import Optional

import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from ..support.waiting import poll_until
from . import build
from .cluster import ControlPlane, ControlPlaneError

pytestmark = pytest.mark.e2e


def test_pod_is_admitted_stored_and_stays_pending(control_plane: ControlPlane) -> None:
    core = client.CoreV1Api(control_plane.admin_client())
    control_plane.create_namespace("cp-pods", labels={"team": "e2e"})
    core.create_namespaced_pod(
        "cp-pods",
        client.V1Pod(
            metadata=client.V1ObjectMeta(name="web"),
            spec=client.V1PodSpec(containers=[client.V1Container(name="web", image="registry.invalid/web:1")]),
        ),
    )

    pod = core.read_namespaced_pod("web", "cp-pods")

    assert pod.spec.containers[0].image == "registry.invalid/web:1"
    assert pod.status.phase == "Pending"
    assert pod.spec.node_name is None
    # The ServiceAccount admission plugin ran (a mutating plugin, as amp's
    # webhook will be): it defaulted the account and mounted its token.
    assert pod.spec.service_account_name == "default"
    assert any(v.name.startswith("kube-api-access-") for v in pod.spec.volumes)
    assert core.read_namespace("cp-pods").metadata.labels["team"] == "e2e"


def test_admin_kubeconfig_works_for_other_clients(control_plane: ControlPlane) -> None:
    # The kubeconfig file is what amp itself (or kubectl) would be given.
    api = config.new_client_from_config(config_file=str(control_plane.kubeconfig_path))
    try:
        review = client.AuthenticationV1Api(api).create_self_subject_review(client.V1SelfSubjectReview())
    finally:
        api.close()
    assert review.status.user_info.username == "admin"
    assert "system:masters" in review.status.user_info.groups


def test_api_server_serves_a_certificate_signed_by_ca_pem(control_plane: ControlPlane) -> None:
    context = ssl.create_default_context(cadata=control_plane.ca_pem.decode())
    with urllib.request.urlopen(f"{control_plane.api_url}/livez", context=context, timeout=5) as r:
        assert r.status == 200
        assert r.read() == b"ok"


def test_service_account_kubeconfig_authenticates_and_rbac_applies(
    control_plane: ControlPlane,
) -> None:
    path = control_plane.service_account_kubeconfig("cp-sa", "watcher")
    api = config.new_client_from_config(config_file=str(path))
    try:
        review = client.AuthenticationV1Api(api).create_self_subject_review(client.V1SelfSubjectReview())
        assert review.status.user_info.username == "system:serviceaccount:cp-sa:watcher"

        with pytest.raises(ApiException) as denied:
            client.CoreV1Api(api).list_namespace()
        assert denied.value.status == 403

        rbac = client.RbacAuthorizationV1Api(control_plane.admin_client())
        rbac.create_cluster_role(
            client.V1ClusterRole(
                metadata=client.V1ObjectMeta(name="cp-sa-namespace-reader"),
                rules=[client.V1PolicyRule(api_groups=[""], resources=["namespaces"], verbs=["get", "list", "watch"])],
            )
        )
        rbac.create_cluster_role_binding(
            client.V1ClusterRoleBinding(
                metadata=client.V1ObjectMeta(name="cp-sa-namespace-reader"),
                role_ref=client.V1RoleRef(
                    api_group="rbac.authorization.k8s.io",
                    kind="ClusterRole",
                    name="cp-sa-namespace-reader",
                ),
                subjects=[client.RbacV1Subject(kind="ServiceAccount", name="watcher", namespace="cp-sa")],
            )
        )

        def listed() -> Optional[set[str]]:
            # The API server applies a new binding a moment after it is stored.
            try:
                return {ns.metadata.name for ns in client.CoreV1Api(api).list_namespace().items}
            except ApiException as e:
                if e.status != 403:
                    raise
                return None

        try:
            names = poll_until("the new ClusterRoleBinding to take effect", listed, 10)
        finally:
            rbac.delete_cluster_role_binding("cp-sa-namespace-reader")
            rbac.delete_cluster_role("cp-sa-namespace-reader")
        assert {"cp-sa", "default", "kube-system"} <= names
    finally:
        api.close()


def _refused(url: str) -> bool:
    host, port = url.rsplit("//", 1)[1].rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


def test_stop_ends_both_processes(e2e_binaries: build.Binaries, tmp_path: Path) -> None:
    plane = ControlPlane(tmp_path, e2e_binaries)
    plane.start()
    pids = list(plane.pids.values())
    assert len(pids) == 2
    api_url, etcd_url = plane.api_url, plane.etcd_url

    plane.stop()

    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.killpg(pid, 0)
    assert _refused(api_url)
    assert _refused(etcd_url)


def test_start_failure_reports_the_logs(e2e_binaries: build.Binaries, tmp_path: Path) -> None:
    false = shutil.which("false")
    assert false is not None
    broken = build.Binaries(
        kube_apiserver=Path(false),
        etcd=e2e_binaries.etcd,
        kubernetes_version=e2e_binaries.kubernetes_version,
        etcd_version=e2e_binaries.etcd_version,
    )
    plane = ControlPlane(tmp_path, broken)

    with pytest.raises(ControlPlaneError) as failed:
        plane.start()

    message = str(failed.value)
    assert "kube-apiserver exited with status 1" in message
    assert str(tmp_path / "etcd.log") in message
    assert plane.pids == {}  # etcd was stopped again


def _handshake(server: ssl.SSLContext, client_ctx: ssl.SSLContext, hostname: str) -> None:
    """A TLS handshake over memory buffers; raises what the client rejects."""
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    ends = [
        (client_ctx.wrap_bio(c_in, c_out, server_hostname=hostname), c_out, s_in),
        (server.wrap_bio(s_in, s_out, server_side=True), s_out, c_in),
    ]
    done = [False, False]
    for _ in range(10):
        for i, (end, outgoing, peer_incoming) in enumerate(ends):
            if not done[i]:
                try:
                    end.do_handshake()
                    done[i] = True
                except ssl.SSLWantReadError:
                    pass
            peer_incoming.write(outgoing.read())
        if all(done):
            return
    raise AssertionError("TLS handshake did not complete")


def test_issued_serving_certificate_is_trusted_through_ca_pem(
    control_plane: ControlPlane,
) -> None:
    cert, key = control_plane.issue_serving_certificate("cp-webhook")
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(cert, key)
    trusting = ssl.create_default_context(cadata=control_plane.ca_pem.decode())

    _handshake(server, trusting, "127.0.0.1")
    _handshake(server, trusting, "localhost")
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(server, trusting, "amp.example")
