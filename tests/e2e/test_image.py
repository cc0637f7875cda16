"""amp's image against the real kube-apiserver: the container, started
with the chart's security settings (tests/support/imagerun.py) on the host's
network, its config, certificate and a ServiceAccount kubeconfig mounted
from files, watches namespaces through the API server and serves a Pod
created through it.  The example endpoints are the session's
(``twistd amp-example`` on loopback).
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from ..support.helpers import SecretVolume
from ..support.imagerun import (
    ConfigVolume,
    Container,
    built_image,
    chart_container,
    chart_deployment,
    run_flags,
    wait_answering,
)
from ..support.ports import free_port
from ..support.waiting import poll_until
from .amp_process import (
    ENABLED_LABEL,
    ENDPOINT_ANNOTATION,
    INSTANCE_LABEL,
    STATUS_ANNOTATION,
    ExampleEndpoints,
    amp_config,
    pod_manifest,
    unique,
    webhook_configuration,
)
from .cluster import ControlPlane

pytestmark = pytest.mark.e2e

#: Where the ServiceAccount's kubeconfig is mounted in the container.
KUBECONFIG_MOUNT = "/var/run/amp-kube"


@pytest.fixture
def image_amp(
    control_plane: ControlPlane, amp_kubeconfig: Path, tmp_path: Path
) -> Iterator[tuple[Container, str, int]]:
    """amp's image running against the control plane, registered by a
    MutatingWebhookConfiguration of its own; yields (container, instance
    label, port) and unregisters and stops it afterwards (exit status 0)."""
    image = built_image()
    spec = chart_container(chart_deployment())
    instance = unique("image")
    port = free_port()
    cert, key = control_plane.issue_serving_certificate(f"amp-{instance}")
    volume_files = {"secret:tls.crt": cert.read_bytes(), "secret:tls.key": key.read_bytes()}
    items = {key_: f"{spec.config_mount}/{path}" for path, key_ in spec.config_items}
    config = amp_config(
        port=port,
        cert=Path(items["secret:tls.crt"]),
        key=Path(items["secret:tls.key"]),
        kubeconfig=Path(f"{KUBECONFIG_MOUNT}/kubeconfig"),
        failure_policy="Fail",
    )
    volume_files["configMap:amp.yaml"] = yaml.safe_dump(config).encode()
    volume = ConfigVolume(tmp_path / "config", spec, volume_files)
    kube = SecretVolume(
        tmp_path / "kube", {"kubeconfig": amp_kubeconfig.read_bytes()}, mode=spec.config_mode, gid=spec.fs_group
    )
    container = Container(
        "e2e",
        image,
        [
            *run_flags(spec),
            "--network",
            "host",
            "--volume",
            f"{volume.dir}:{spec.config_mount}:ro",
            "--volume",
            f"{kube.dir}:{KUBECONFIG_MOUNT}:ro",
        ],
    )
    admission = client.AdmissionregistrationV1Api(control_plane.admin_client())
    name = f"amp-e2e-{instance}"
    container.start()
    registered = False
    try:
        context = ssl.create_default_context(cadata=control_plane.ca_pem.decode())
        wait_answering(container, port, spec.readiness, context)
        admission.create_mutating_webhook_configuration(
            webhook_configuration(name, f"https://127.0.0.1:{port}/mutate", control_plane.ca_pem, instance, "Fail")
        )
        registered = True
        yield container, instance, port
        admission.delete_mutating_webhook_configuration(name)
        registered = False
        status, _ = container.stop(spec.termination_grace)
        assert status == 0, container.describe()
    finally:
        if registered:
            admission.delete_mutating_webhook_configuration(name)
        container.remove()


def test_the_image_serves_a_pod_created_through_the_api_server(
    control_plane: ControlPlane, image_amp: tuple[Container, str, int], example_endpoints: ExampleEndpoints
) -> None:
    container, instance, _ = image_amp
    namespace = unique("image-ns")
    control_plane.create_namespace(
        namespace,
        labels={ENABLED_LABEL: "true", INSTANCE_LABEL: instance},
        annotations={ENDPOINT_ANNOTATION: example_endpoints.url("user-env")},
    )
    core = client.CoreV1Api(control_plane.admin_client())
    last = [""]

    def created() -> Any:
        # The webhook's registration reaches the API server's webhook
        # cache a moment after it is created; until then Pods pass unasked.
        try:
            pod = core.create_namespaced_pod(namespace, pod_manifest(unique("probe")), dry_run="All")
        except ApiException as e:
            last[0] = f"{e.status} {e.body}"
            return None
        if (pod.metadata.annotations or {}).get(STATUS_ANNOTATION) is None:
            last[0] = "admitted without amp"
            return None
        return True

    poll_until(
        "the API server to call amp in the container",
        created,
        30.0,
        details=lambda: f"{last[0]}\n{container.describe()}",
    )
    stored = core.create_namespaced_pod(namespace, pod_manifest("served"))
    read = core.read_namespaced_pod("served", namespace)
    for pod in (stored, read):
        assert pod.metadata.annotations[STATUS_ANNOTATION].split()[0] == "mutated"
        assert [c.name for c in pod.spec.init_containers] == ["new-init-container"]
        assert {"AMP_USER", "ADDED_VAR"} <= {e.name for e in pod.spec.containers[0].env}
