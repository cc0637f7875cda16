"""amp against a real kube-apiserver: real AdmissionReviews over TLS with a
``caBundle``, real patches, warnings, failure policy, watches, certificate
rotation, dry-run.  (tests/e2e/test_chart.py applies the ``deploy/``
manifests and the Helm chart.)

amp runs as ``twistd -n --pidfile= amp`` with ``kubernetes.source:
kubeconfig`` (a ServiceAccount bound to the RBAC from ``deploy/``), the
example endpoints as ``twistd amp-example``; the API server calls amp through
a MutatingWebhookConfiguration by ``clientConfig.url`` on loopback.  Every
Pod is read back from the API server: what is stored is what counts.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any, Optional

import pytest
from cryptography import x509
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from ..support.stdlib_endpoints import StdlibEndpoint, Style
from ..support.waiting import poll_until
from .amp_process import (
    ENABLED_LABEL,
    ENDPOINT_ANNOTATION,
    FAILURE_POLICY_ANNOTATION,
    INSTANCE_LABEL,
    STATUS_ANNOTATION,
    AmpInstance,
    ExampleEndpoints,
    RecordingEndpoint,
    closed_port,
    free_port,
    parse_warning,
    pod_manifest,
    unique,
    webhook_configuration,
)
from .cluster import ControlPlane
from .conftest import AmpFactory, deploy_amp_config

pytestmark = pytest.mark.e2e

#: How long a change in the cluster may take to reach amp's behaviour.
PROPAGATION_DEADLINE = 10.0


def create_pod(
    core: client.CoreV1Api, namespace: str, body: dict[str, Any], *, dry_run: Optional[str] = None
) -> tuple[dict[str, Any], list[str]]:
    """Create a Pod; the API server's answer (the stored Pod, as JSON) and
    the texts of the ``Warning`` headers it sent."""
    response = core.create_namespaced_pod(namespace, body, dry_run=dry_run, _preload_content=False)
    return json.loads(response.data), [parse_warning(w) for w in response.headers.getlist("Warning")]


def read_pod(core: client.CoreV1Api, namespace: str, name: str) -> dict[str, Any]:
    return json.loads(core.read_namespaced_pod(name, namespace, _preload_content=False).data)


def refused(core: client.CoreV1Api, namespace: str, body: dict[str, Any]) -> tuple[int, str]:
    """Create a Pod that must be refused; the status code and message."""
    with pytest.raises(ApiException) as caught:
        core.create_namespaced_pod(namespace, body, _preload_content=False)
    status = json.loads(caught.value.body)
    return caught.value.status, status.get("message", "")


def by_name(items: Optional[list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    return {item["name"]: item for item in items or []}


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in container.get("env") or []}


def own_volumes(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The Pod's volumes without the ServiceAccount token volume the API
    server adds itself."""
    return {n: v for n, v in by_name(pod["spec"].get("volumes")).items() if not n.startswith("kube-api-access-")}


def own_mounts(container: dict[str, Any]) -> dict[str, str]:
    return {
        m["name"]: m["mountPath"]
        for m in container.get("volumeMounts") or []
        if not m["name"].startswith("kube-api-access-")
    }


def assert_unchanged(pod: dict[str, Any], image: str = "registry.invalid/app:1") -> None:
    """The Pod is as ``pod_manifest`` made it, plus only what the API
    server itself adds (defaults, the token volume)."""
    spec = pod["spec"]
    assert [(c["name"], c["image"]) for c in spec["containers"]] == [("app", image)]
    assert "env" not in spec["containers"][0]
    assert own_mounts(spec["containers"][0]) == {}
    assert own_volumes(pod) == {}
    assert "initContainers" not in spec


@pytest.fixture(scope="module")
def amp(start_module_amp: AmpFactory) -> AmpInstance:
    """The amp shared by the scenarios that need no amp of their own
    (config ``failure_policy: Ignore``; its webhook's failurePolicy Fail)."""
    return start_module_amp("shared")


@pytest.fixture
def core(control_plane: ControlPlane) -> client.CoreV1Api:
    return client.CoreV1Api(control_plane.admin_client())


# ---- 1. Pods in a labelled namespace are stored mutated, others not


def test_labelled_namespace_pod_is_stored_mutated_unlabelled_is_not(
    amp: AmpInstance, example_endpoints: ExampleEndpoints, core: client.CoreV1Api
) -> None:
    endpoint = example_endpoints.url("user-env")
    enabled = amp.namespace(unique("s1-enabled"), endpoint)
    plain = amp.namespace(unique("s1-plain"), endpoint, enabled=False)

    create_pod(core, enabled, pod_manifest("web"))
    create_pod(core, plain, pod_manifest("web"))

    mutated = read_pod(core, enabled, "web")
    assert env_of(mutated["spec"]["containers"][0]) == {
        "AMP_USER": "anonymous",
        "ADDED_VAR": "something important",
    }
    assert own_volumes(mutated) == {"user-home": {"name": "user-home", "emptyDir": {}}}
    assert mutated["metadata"]["annotations"] == {STATUS_ANNOTATION: f"mutated {endpoint.rsplit('/', 1)[0]}"}

    untouched = read_pod(core, plain, "web")
    assert_unchanged(untouched)
    assert untouched["metadata"].get("annotations") is None


# ---- 2. each example endpoint, as stored


def test_user_env_endpoint_adds_env_home_volume_and_init_container(
    amp: AmpInstance, example_endpoints: ExampleEndpoints, core: client.CoreV1Api
) -> None:
    ns = amp.namespace(unique("s2-user-env"), example_endpoints.url("user-env"))
    body = pod_manifest(
        "notebook",
        containers=[
            {
                "name": "notebook",
                "image": "registry.invalid/notebook:1",
                "env": [{"name": "ADDED_VAR", "value": "stale"}, {"name": "KEEP", "value": "me"}],
            },
            {"name": "helper", "image": "registry.invalid/helper:1"},
        ],
        annotations={"hub.jupyter.org/username": "alice"},
    )

    create_pod(core, ns, body)

    pod = read_pod(core, ns, "notebook")
    notebook, helper = pod["spec"]["containers"]
    assert env_of(notebook) == {"ADDED_VAR": "something important", "KEEP": "me", "AMP_USER": "alice"}
    assert env_of(helper) == {"AMP_USER": "alice", "ADDED_VAR": "something important"}
    assert own_volumes(pod) == {"user-home": {"name": "user-home", "emptyDir": {}}}
    assert own_mounts(notebook) == {"user-home": "/home/alice"}
    assert own_mounts(helper) == {}
    assert [(c["name"], c["image"]) for c in pod["spec"]["initContainers"]] == [("new-init-container", "alpine:3.12.0")]


def test_registry_endpoint_rewrites_images_and_warns(
    amp: AmpInstance, example_endpoints: ExampleEndpoints, core: client.CoreV1Api
) -> None:
    ns = amp.namespace(unique("s2-registry"), example_endpoints.url("registry"))
    body = pod_manifest(
        "mirrored",
        containers=[
            {"name": "gcr", "image": "gcr.io/team/app:1.2"},
            {"name": "hub", "image": "nginx:1.25"},
            {"name": "quay", "image": "quay.io/org/tool:3"},
        ],
        init_containers=[{"name": "setup", "image": "docker.io/library/busybox:1.36"}],
    )

    _, warnings = create_pod(core, ns, body)

    pod = read_pod(core, ns, "mirrored")
    assert [c["image"] for c in pod["spec"]["containers"]] == [
        "asia.gcr.io/team/app:1.2",
        "mirror.local/library/nginx:1.25",
        "quay.io/org/tool:3",
    ]
    assert [c["image"] for c in pod["spec"]["initContainers"]] == ["mirror.local/library/busybox:1.36"]
    rewritten = [w for w in warnings if w.startswith("amp: registry rewritten: ")]
    assert len(rewritten) == 1, warnings
    # The endpoint lists init containers first; amp clips each warning to
    # 119 characters, so the later rewrites are cut off.
    assert "initContainers[0] docker.io/library/busybox:1.36 -> mirror.local/library/busybox:1.36" in rewritten[0]


def test_sidecar_endpoint_injects_proxy_and_init_container(
    amp: AmpInstance, example_endpoints: ExampleEndpoints, core: client.CoreV1Api
) -> None:
    ns = amp.namespace(unique("s2-sidecar"), example_endpoints.url("sidecar"))
    body = pod_manifest(
        "meshed",
        containers=[
            {
                "name": "app",
                "image": "registry.invalid/app:1",
                "ports": [{"containerPort": 8080}, {"containerPort": 9090}],
            }
        ],
    )

    create_pod(core, ns, body)

    pod = read_pod(core, ns, "meshed")
    containers = by_name(pod["spec"]["containers"])
    assert list(containers) == ["app", "amp-proxy"]
    assert containers["amp-proxy"]["image"] == "envoyproxy/envoy:v1.27.0"
    assert own_mounts(containers["amp-proxy"]) == {"amp-shared": "/var/run/amp"}
    assert own_mounts(containers["app"]) == {"amp-shared": "/var/run/amp"}
    assert own_volumes(pod) == {"amp-shared": {"name": "amp-shared", "emptyDir": {}}}
    (init,) = pod["spec"]["initContainers"]
    assert (init["name"], init["image"]) == ("amp-proxy-init", "alpine:3.12.0")
    assert env_of(init) == {"APP_PORTS": "8080,9090"}


def test_poddefault_endpoint_applies_matching_preset_only(
    amp: AmpInstance, example_endpoints: ExampleEndpoints, core: client.CoreV1Api
) -> None:
    ns = amp.namespace(unique("s2-poddefault"), example_endpoints.url("poddefault"))

    create_pod(core, ns, pod_manifest("with-secret", labels={"add-gcp-secret": "true"}))
    create_pod(core, ns, pod_manifest("without-secret", labels={"app": "plain"}))

    pod = read_pod(core, ns, "with-secret")
    volume = own_volumes(pod)["secret-volume"]
    assert volume["secret"]["secretName"] == "gcp-secret"
    assert list(own_volumes(pod)) == ["secret-volume"]
    (app,) = pod["spec"]["containers"]
    assert own_mounts(app) == {"secret-volume": "/secret/gcp"}
    assert env_of(app) == {"GOOGLE_APPLICATION_CREDENTIALS": "/secret/gcp/key.json"}
    assert_unchanged(read_pod(core, ns, "without-secret"))


# ---- 3. an endpoint that is down, under Ignore and under Fail


def test_endpoint_down_under_ignore_admits_unchanged_with_warning(amp: AmpInstance, core: client.CoreV1Api) -> None:
    down = f"http://127.0.0.1:{closed_port()}"
    ns = amp.namespace(unique("s3-ignore"), f"{down}/mutate", failure_policy="Ignore")

    returned, warnings = create_pod(core, ns, pod_manifest("admitted"))

    pod = read_pod(core, ns, "admitted")
    assert_unchanged(pod)
    annotations = pod["metadata"]["annotations"]
    assert list(annotations) == [STATUS_ANNOTATION]
    assert annotations[STATUS_ANNOTATION].startswith("skipped ")
    assert annotations[STATUS_ANNOTATION].endswith(f" {down}")
    assert any(
        w.startswith(f"amp: {down} ") and w.endswith("; admitted without the endpoint's patch") for w in warnings
    ), warnings
    assert returned["metadata"]["uid"] == pod["metadata"]["uid"]


def test_endpoint_down_under_fail_refuses_with_amps_message(amp: AmpInstance, core: client.CoreV1Api) -> None:
    down = f"http://127.0.0.1:{closed_port()}"
    ns = amp.namespace(unique("s3-fail"), f"{down}/mutate", failure_policy="Fail")

    status, message = refused(core, ns, pod_manifest("refused"))

    assert status == 500
    assert 'admission webhook "pods.amp.txn2.com" denied the request' in message
    assert f"amp: endpoint {down} failed (" in message
    assert message.endswith("failure policy Fail denies the Pod")
    assert core.list_namespaced_pod(ns).items == []


# ---- 4. a namespace change reaches amp through its watch


def test_namespace_annotation_change_reaches_amp_through_the_watch(
    amp: AmpInstance, example_endpoints: ExampleEndpoints, core: client.CoreV1Api
) -> None:
    ns = amp.namespace(unique("s4-switch"), example_endpoints.url("user-env"))
    pid = amp.process.pid
    create_pod(core, ns, pod_manifest("before"))
    assert "AMP_USER" in env_of(read_pod(core, ns, "before")["spec"]["containers"][0])

    core.patch_namespace(ns, {"metadata": {"annotations": {ENDPOINT_ANNOTATION: example_endpoints.url("sidecar")}}})

    created: list[dict[str, Any]] = []

    def next_pod_has_sidecar() -> Optional[dict[str, Any]]:
        pod, _ = create_pod(core, ns, pod_manifest(f"after-{len(created)}"))
        created.append(pod)
        names = [c["name"] for c in pod["spec"]["containers"]]
        return pod if "amp-proxy" in names else None

    switched = poll_until(
        "a Pod mutated by the new endpoint", next_pod_has_sidecar, PROPAGATION_DEADLINE, details=amp.process.describe
    )

    stored = read_pod(core, ns, switched["metadata"]["name"])
    assert [c["name"] for c in stored["spec"]["containers"]] == ["app", "amp-proxy"]
    assert "AMP_USER" not in env_of(stored["spec"]["containers"][0])
    # Every Pod on the way was mutated by one endpoint or the other.
    for pod in created[:-1]:
        assert "AMP_USER" in env_of(pod["spec"]["containers"][0]), pod["metadata"]["name"]
    assert amp.process.running() and amp.process.pid == pid


# ---- 7. dry-run


def test_dry_run_reaches_the_endpoint_marked_and_stores_nothing(amp: AmpInstance, core: client.CoreV1Api) -> None:
    label = [{"op": "add", "path": "/metadata/labels", "value": {"recorded": "yes"}}]
    with RecordingEndpoint(label) as endpoint:
        ns = amp.namespace(unique("s7-dry-run"), endpoint.url("record"))

        returned, _ = create_pod(core, ns, pod_manifest("rehearsal"), dry_run="All")

        (call,) = endpoint.recorded()
        assert call["x-amp-dry-run"] == "true"
        assert call["x-amp-namespace"] == ns
        assert call["x-amp-operation"] == "CREATE"
        assert json.loads(call["(body)"])["metadata"]["name"] == "rehearsal"
        # The API server answers with the Pod as it would have been stored...
        assert returned["metadata"]["labels"] == {"recorded": "yes"}
        # ... and stores nothing.
        with pytest.raises(ApiException) as missing:
            core.read_namespaced_pod("rehearsal", ns)
        assert missing.value.status == 404
        assert core.list_namespaced_pod(ns).items == []

        create_pod(core, ns, pod_manifest("real"))

        assert [c["x-amp-dry-run"] for c in endpoint.recorded()] == ["true", "false"]
        assert read_pod(core, ns, "real")["metadata"]["labels"] == {"recorded": "yes"}


# ---- 9. a patch that cannot apply is caught by amp


def test_patch_the_api_server_would_reject_is_caught_by_amp_under_fail(
    amp: AmpInstance, example_endpoints: ExampleEndpoints, core: client.CoreV1Api
) -> None:
    ns = amp.namespace(unique("s9-fail"), example_endpoints.url("bad-patch"), failure_policy="Fail")

    status, message = refused(core, ns, pod_manifest("bad"))

    assert status == 500
    origin = example_endpoints.url("").rstrip("/")
    assert f"amp: endpoint {origin} failed (apply-failed): " in message
    assert "/spec/ampExampleDoesNotExist" in message
    assert message.endswith("failure policy Fail denies the Pod")
    assert core.list_namespaced_pod(ns).items == []


def test_patch_the_api_server_would_reject_is_dropped_by_amp_under_ignore(
    amp: AmpInstance, example_endpoints: ExampleEndpoints, core: client.CoreV1Api
) -> None:
    ns = amp.namespace(unique("s9-ignore"), example_endpoints.url("bad-patch"), failure_policy="Ignore")

    _, warnings = create_pod(core, ns, pod_manifest("bad"))

    pod = read_pod(core, ns, "bad")
    assert_unchanged(pod)
    origin = example_endpoints.url("").rstrip("/")
    assert pod["metadata"]["annotations"] == {STATUS_ANNOTATION: f"skipped apply-failed {origin}"}
    assert f"amp: {origin} apply-failed; admitted without the endpoint's patch" in warnings


# ---- 5. failure_policy auto follows the webhook configuration


def set_webhook_failure_policy(control_plane: ControlPlane, name: str, policy: str) -> None:
    client.AdmissionregistrationV1Api(control_plane.admin_client()).patch_mutating_webhook_configuration(
        name, [{"op": "replace", "path": "/webhooks/0/failurePolicy", "value": policy}]
    )


def test_failure_policy_auto_follows_the_webhook_configuration(
    start_amp: AmpFactory, control_plane: ControlPlane, core: client.CoreV1Api
) -> None:
    # The names deploy/ gives amp's webhook configuration: its ClusterRole
    # grants access to that one by name only.
    kube = deploy_amp_config()["kubernetes"]
    amp = start_amp(
        "auto",
        failure_policy="auto",
        watch_webhook_configuration=True,
        webhook_configuration_name=kube["webhook_configuration"],
        webhook_name=kube["webhook_name"],
        webhook_failure_policy="Fail",
    )
    down = f"http://127.0.0.1:{closed_port()}"
    ns = amp.namespace(unique("s5-auto"), f"{down}/mutate")  # no failure-policy annotation

    status, message = refused(core, ns, pod_manifest("under-fail"))
    assert status == 500 and message.endswith("failure policy Fail denies the Pod"), message

    set_webhook_failure_policy(control_plane, amp.webhook_configuration_name, "Ignore")

    attempts: list[str] = []

    def admitted() -> Optional[tuple[dict[str, Any], list[str]]]:
        name = f"under-ignore-{len(attempts)}"
        attempts.append(name)
        try:
            return create_pod(core, ns, pod_manifest(name))
        except ApiException as exc:
            assert "failure policy Fail denies the Pod" in exc.body, exc.body
            return None

    _, warnings = poll_until("amp to answer under Ignore", admitted, PROPAGATION_DEADLINE, details=amp.process.describe)
    pod = read_pod(core, ns, attempts[-1])
    assert_unchanged(pod)
    assert list(pod["metadata"]["annotations"]) == [STATUS_ANNOTATION]
    assert any(
        w.startswith(f"amp: {down} ") and w.endswith("; admitted without the endpoint's patch") for w in warnings
    ), warnings

    set_webhook_failure_policy(control_plane, amp.webhook_configuration_name, "Fail")

    def refused_again() -> Optional[bool]:
        try:
            create_pod(core, ns, pod_manifest(f"back-to-fail-{len(attempts)}"))
        except ApiException as exc:
            assert "failure policy Fail denies the Pod" in exc.body, exc.body
            return True
        attempts.append("admitted")
        return None

    poll_until("amp to answer under Fail again", refused_again, PROPAGATION_DEADLINE, details=amp.process.describe)
    log = amp.process.log_text()
    assert f"MutatingWebhookConfiguration {amp.webhook_configuration_name}: failurePolicy is now Ignore" in log


# ---- 6. certificate rotation under load


def replace_file(path: Path, data: bytes) -> None:
    """Write ``data`` to a temporary file beside ``path`` and rename it over
    ``path``: readers see the old file or the new one, never a mix."""
    temporary = path.with_name(f".{path.name}.new")
    temporary.write_bytes(data)
    temporary.chmod(path.stat().st_mode)
    temporary.replace(path)


def serial(der: bytes) -> int:
    return x509.load_der_x509_certificate(der).serial_number


def test_certificate_rotation_while_pods_are_created(
    start_amp: AmpFactory, control_plane: ControlPlane, example_endpoints: ExampleEndpoints
) -> None:
    amp = start_amp("rotation", overrides={"tls": {"reload_interval": "500ms"}})
    ns = amp.namespace(unique("s6-rotation"), example_endpoints.url("user-env"), failure_policy="Fail")
    old_serial = serial(amp.process.served_certificate())

    created: list[str] = []
    errors: list[str] = []
    stop = threading.Event()
    marks: dict[str, int] = {}

    def create_pods() -> None:
        # A client of its own: this thread creates Pods while the test
        # rotates the certificate and checks what amp serves.
        api = config.new_client_from_config(config_file=str(control_plane.kubeconfig_path))
        core = client.CoreV1Api(api)
        try:
            while not stop.is_set():
                name = f"pod-{len(created) + len(errors)}"
                try:
                    pod, _ = create_pod(core, ns, pod_manifest(name))
                except Exception as exc:  # every failure counts, not only ApiException
                    errors.append(f"{name}: {exc}")
                    continue
                if "AMP_USER" not in env_of(pod["spec"]["containers"][0]):
                    errors.append(f"{name}: admitted without amp's mutation")
                created.append(name)
        finally:
            api.close()

    creator = threading.Thread(target=create_pods, name="pod-creator", daemon=True)
    creator.start()
    try:
        poll_until("Pods to be created before the rotation", lambda: len(created) >= 5 or None, 20.0)
        new_cert, new_key = control_plane.issue_serving_certificate("amp-rotation-renewed")
        marks["rotated"] = len(created)
        # Key first, then certificate, each atomically: a reload check that
        # falls in between sees a pair that does not belong together and
        # must keep serving the old one.
        replace_file(amp.key_path, new_key.read_bytes())
        replace_file(amp.cert_path, new_cert.read_bytes())
        new_serial = x509.load_pem_x509_certificate(new_cert.read_bytes()).serial_number
        assert new_serial != old_serial

        poll_until(
            "amp to serve the new certificate",
            lambda: serial(amp.process.served_certificate()) == new_serial or None,
            5.0,
            details=amp.process.describe,
        )
        marks["served"] = len(created)
        poll_until("Pods to be created after the rotation", lambda: len(created) >= marks["served"] + 10 or None, 20.0)
    finally:
        stop.set()
        creator.join(timeout=15)
    assert not creator.is_alive()

    assert errors == []
    assert len(created) >= marks["served"] + 10 > marks["rotated"] >= 5
    log = amp.process.log_text()
    assert f"serial {new_serial:#x}" in log


# ---- more real-server behaviour


def test_amp_answers_a_hung_endpoint_before_the_api_servers_timeout(
    start_amp: AmpFactory, example_endpoints: ExampleEndpoints, core: client.CoreV1Api
) -> None:
    """The API server gives the webhook ``timeoutSeconds`` (sent to amp as
    ``?timeout=2s``); amp's own endpoint timeout is longer, so only that
    budget lets amp answer, under Ignore, before the API server gives up
    (and, its webhook failurePolicy being Fail, would refuse the Pod)."""
    amp = start_amp("deadline", webhook_timeout_seconds=2, overrides={"endpoints": {"timeout": "20s"}})
    ns = amp.namespace(unique("x-deadline"), example_endpoints.url("hang"), failure_policy="Ignore")

    started = time.monotonic()
    _, warnings = create_pod(core, ns, pod_manifest("patient"))
    elapsed = time.monotonic() - started

    pod = read_pod(core, ns, "patient")
    assert_unchanged(pod)
    origin = example_endpoints.url("").rstrip("/")
    # The endpoint call is cut when the review's deadline passes: "timeout".
    assert pod["metadata"]["annotations"] == {STATUS_ANNOTATION: f"skipped timeout {origin}"}
    assert f"amp: {origin} timeout; admitted without the endpoint's patch" in warnings
    assert 1.0 < elapsed < 2.0


def test_an_http_server_endpoint_that_closes_every_connection_mutates_every_pod(
    amp: AmpInstance, core: client.CoreV1Api
) -> None:
    """The smallest endpoint Python offers (``http.server``'s default
    handler: HTTP/1.0, the connection closed after each reply), as a chain
    of two steps on its one origin, under Fail: every Pod in a row is
    stored with both patches (a call sent on a connection the endpoint had
    closed would have refused it)."""
    with StdlibEndpoint(Style.HTTP10) as endpoint:
        chain = f"{endpoint.url('/label/team/payments')} {endpoint.url('/label/tier/web')}"
        ns = amp.namespace(unique("x-closing"), chain, failure_policy="Fail")
        for i in range(5):
            create_pod(core, ns, pod_manifest(f"web-{i}"))
        for i in range(5):
            labels = read_pod(core, ns, f"web-{i}")["metadata"]["labels"]
            assert (labels["team"], labels["tier"]) == ("payments", "web"), labels
        assert (endpoint.requests, endpoint.connections) == (10, 10)


def test_v1beta1_admission_reviews_are_answered_in_kind(
    amp: AmpInstance, control_plane: ControlPlane, example_endpoints: ExampleEndpoints, core: client.CoreV1Api
) -> None:
    """A webhook registered for ``admission.k8s.io/v1beta1`` only gets
    v1beta1 reviews; the API server refuses an answer of another version."""
    registrations = client.AdmissionregistrationV1Api(control_plane.admin_client())
    instance = unique("v1beta1")
    name = f"amp-e2e-{instance}"
    registrations.create_mutating_webhook_configuration(
        webhook_configuration(
            name, amp.process.mutate_url, control_plane.ca_pem, instance, review_versions=("v1beta1",)
        )
    )
    try:
        ns = unique("x-v1beta1")
        control_plane.create_namespace(
            ns,
            labels={ENABLED_LABEL: "true", INSTANCE_LABEL: instance},
            annotations={ENDPOINT_ANNOTATION: example_endpoints.url("user-env"), FAILURE_POLICY_ANNOTATION: "Fail"},
        )
        attempts: list[int] = []

        def mutated() -> Optional[dict[str, Any]]:
            attempts.append(1)
            pod, _ = create_pod(core, ns, pod_manifest(f"old-review-{len(attempts)}"))
            return pod if "AMP_USER" in env_of(pod["spec"]["containers"][0]) else None

        pod = poll_until(
            "the API server to use the v1beta1 registration",
            mutated,
            PROPAGATION_DEADLINE,
            details=amp.process.describe,
        )
    finally:
        registrations.delete_mutating_webhook_configuration(name)
    assert read_pod(core, ns, pod["metadata"]["name"])["spec"]["initContainers"][0]["name"] == "new-init-container"


def test_namespace_watch_resumes_after_the_server_ends_it(
    start_amp: AmpFactory, example_endpoints: ExampleEndpoints, core: client.CoreV1Api
) -> None:
    """With a 1 s watch timeout the API server ends amp's watch every
    second; amp resumes it from the last resourceVersion and still sees the
    next annotation change."""
    amp = start_amp("rewatch", overrides={"kubernetes": {"watch_timeout": "1s"}, "metrics": {"port": free_port()}})
    ns = amp.namespace(unique("x-rewatch"), example_endpoints.url("user-env"))
    restarts = "amp_namespace_watch_restarts_total"
    poll_until(
        "two watch restarts on the server's timeout",
        lambda: (amp.process.metric(restarts, reason="timeout") or 0) >= 2 or None,
        10.0,
        details=amp.process.describe,
    )
    assert amp.process.metric(restarts, reason="expired") in (None, 0.0)

    core.patch_namespace(ns, {"metadata": {"annotations": {ENDPOINT_ANNOTATION: example_endpoints.url("sidecar")}}})
    attempts: list[int] = []

    def sidecar() -> Optional[bool]:
        attempts.append(1)
        pod, _ = create_pod(core, ns, pod_manifest(f"after-{len(attempts)}"))
        return True if "amp-proxy" in [c["name"] for c in pod["spec"]["containers"]] else None

    poll_until("a Pod mutated by the new endpoint", sidecar, PROPAGATION_DEADLINE, details=amp.process.describe)
    assert (amp.process.metric("amp_namespace_events_total", type="MODIFIED") or 0) >= 1
