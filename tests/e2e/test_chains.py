"""amp's endpoint chains, per-Pod opt-out and ephemeral containers against a
real kube-apiserver: what is stored is what counts.

One amp (config ``ephemeral_containers: true``) serves the module; its
webhook configuration is given the shipped chart's ``objectSelector`` (Pods
labelled ``amp.txn2.com/enabled: "false"`` never reach amp) and the
``pods/ephemeralcontainers`` UPDATE rule, as ``deploy/`` ships them
(the rule commented out unless ``webhook.ephemeralContainers``).
"""

from __future__ import annotations

import json
from typing import Any, Optional

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from ..support.waiting import poll_until
from .amp_process import (
    ENABLED_LABEL,
    STATUS_ANNOTATION,
    AmpInstance,
    ExampleEndpoints,
    parse_warning,
    pod_manifest,
    unique,
)
from .cluster import ControlPlane
from .conftest import AmpFactory

pytestmark = pytest.mark.e2e

#: How long a change of the webhook configuration may take to reach the API server's calls.
PROPAGATION_DEADLINE = 10.0

OBJECT_SELECTOR = {"matchExpressions": [{"key": ENABLED_LABEL, "operator": "NotIn", "values": ["false"]}]}
EPHEMERAL_RULE = {
    "operations": ["UPDATE"],
    "apiGroups": [""],
    "apiVersions": ["v1"],
    "resources": ["pods/ephemeralcontainers"],
}


@pytest.fixture(scope="module")
def amp(start_module_amp: AmpFactory) -> AmpInstance:
    return start_module_amp("chains", overrides={"ephemeral_containers": True})


@pytest.fixture
def core(control_plane: ControlPlane) -> client.CoreV1Api:
    return client.CoreV1Api(control_plane.admin_client())


def create_pod(core: client.CoreV1Api, namespace: str, body: dict[str, Any]) -> list[str]:
    response = core.create_namespaced_pod(namespace, body, _preload_content=False)
    return [parse_warning(w) for w in response.headers.getlist("Warning")]


def read_pod(core: client.CoreV1Api, namespace: str, name: str) -> dict[str, Any]:
    return json.loads(core.read_namespaced_pod(name, namespace, _preload_content=False).data)


def annotations(pod: dict[str, Any]) -> dict[str, str]:
    return pod["metadata"].get("annotations") or {}


def images(pod: dict[str, Any], kind: str = "containers") -> dict[str, str]:
    return {c["name"]: c["image"] for c in pod["spec"].get(kind) or []}


def reconfigure_webhook(amp: AmpInstance, core: client.CoreV1Api, ns: str, **webhook: Any) -> None:
    """Merge ``webhook`` into amp's one webhook entry, then wait until the API
    server calls amp under it (a probe Pod that opts out comes back unstamped
    once ``objectSelector`` is in effect; a rule change is checked by its user)."""
    api = client.AdmissionregistrationV1Api(amp.admin)
    current = api.read_mutating_webhook_configuration(amp.webhook_configuration_name)
    entry = api.api_client.sanitize_for_serialization(current)["webhooks"][0]
    entry.update(webhook)
    api.patch_mutating_webhook_configuration(amp.webhook_configuration_name, {"webhooks": [entry]})


def amp_log_mentions(amp: AmpInstance, text: str) -> bool:
    return text in amp.process.log_text()


# ---- a chain of two example endpoints


def test_a_chain_of_registry_then_sidecar_is_applied_in_order_as_one_patch(
    amp: AmpInstance, example_endpoints: ExampleEndpoints, core: client.CoreV1Api
) -> None:
    registry, sidecar = example_endpoints.url("registry"), example_endpoints.url("sidecar")
    ns = amp.namespace(unique("chain"), f"{registry}\n{sidecar}\n")
    body = pod_manifest(
        "chained", containers=[{"name": "app", "image": "gcr.io/team/app:1", "ports": [{"containerPort": 8080}]}]
    )

    warnings = create_pod(core, ns, body)

    pod = read_pod(core, ns, "chained")
    # The registry ran first: the app's image is on the mirror; the sidecar,
    # injected after it, keeps its own image; the init container too.
    assert images(pod) == {"app": "asia.gcr.io/team/app:1", "amp-proxy": "envoyproxy/envoy:v1.27.0"}
    assert images(pod, "initContainers") == {"amp-proxy-init": "alpine:3.12.0"}
    assert annotations(pod)[STATUS_ANNOTATION] == f"mutated {registry} {sidecar}"
    assert any(w.startswith(f"amp: {registry}: registry rewritten: ") for w in warnings), warnings


def test_a_failing_first_step_under_ignore_leaves_the_rest_of_the_chain(
    amp: AmpInstance, example_endpoints: ExampleEndpoints, core: client.CoreV1Api
) -> None:
    error, sidecar = example_endpoints.url("error"), example_endpoints.url("sidecar")
    ns = amp.namespace(unique("chain-ignore"), f"{error} {sidecar}", failure_policy="Ignore")
    body = pod_manifest(
        "partly", containers=[{"name": "app", "image": "registry.invalid/app:1", "ports": [{"containerPort": 8080}]}]
    )

    warnings = create_pod(core, ns, body)

    pod = read_pod(core, ns, "partly")
    assert list(images(pod)) == ["app", "amp-proxy"]
    assert annotations(pod)[STATUS_ANNOTATION] == f"skipped http-5xx {error}; mutated {sidecar}"
    assert f"amp: {error} http-5xx; the chain went on without its patch" in warnings


def test_a_failing_step_under_fail_refuses_the_pod_naming_it(
    amp: AmpInstance, example_endpoints: ExampleEndpoints, core: client.CoreV1Api
) -> None:
    registry, error = example_endpoints.url("registry"), example_endpoints.url("error")
    ns = amp.namespace(unique("chain-fail"), f"{registry} {error}", failure_policy="Fail")
    with pytest.raises(ApiException) as caught:
        core.create_namespaced_pod(ns, pod_manifest("refused"), _preload_content=False)
    message = json.loads(caught.value.body)["message"]
    assert f"endpoint {error} failed (http-5xx)" in message
    assert "failure policy Fail denies the Pod" in message


# ---- per-Pod opt-out


def test_an_opted_out_pod_is_never_changed_asked_or_not(
    amp: AmpInstance, example_endpoints: ExampleEndpoints, core: client.CoreV1Api
) -> None:
    ns = amp.namespace(unique("optout"), example_endpoints.url("registry"), failure_policy="Fail")
    opted_out = {ENABLED_LABEL: "false"}
    gcr = [{"name": "app", "image": "gcr.io/team/app:1"}]

    # Without an objectSelector the API server asks amp, which leaves the Pod alone without a call.
    create_pod(core, ns, pod_manifest("asked", containers=gcr, labels=opted_out))
    asked = read_pod(core, ns, "asked")
    assert images(asked) == {"app": "gcr.io/team/app:1"}
    assert STATUS_ANNOTATION not in annotations(asked)
    assert amp_log_mentions(amp, f"{ns}/asked skipped (opted-out)")

    # A Pod that does not opt out, in the same namespace, is mutated.
    create_pod(core, ns, pod_manifest("mutated", containers=gcr))
    assert images(read_pod(core, ns, "mutated")) == {"app": "asia.gcr.io/team/app:1"}

    # With the shipped objectSelector such Pods never reach amp.
    reconfigure_webhook(amp, core, ns, objectSelector=OBJECT_SELECTOR)
    counter = iter(range(1000))

    def bypassed() -> Optional[str]:
        name = f"selected-{next(counter)}"
        create_pod(core, ns, pod_manifest(name, containers=gcr, labels=opted_out))
        return None if amp_log_mentions(amp, f"{ns}/{name} ") else name

    name = poll_until("the objectSelector to keep opted-out Pods from amp", bypassed, PROPAGATION_DEADLINE)
    pod = read_pod(core, ns, name)
    assert images(pod) == {"app": "gcr.io/team/app:1"}
    assert STATUS_ANNOTATION not in annotations(pod)
    # ... and the others still do.
    create_pod(core, ns, pod_manifest("still-mutated", containers=gcr))
    assert images(read_pod(core, ns, "still-mutated")) == {"app": "asia.gcr.io/team/app:1"}


# ---- ephemeral containers


def test_kubectl_debug_gets_its_image_rewritten_through_the_subresource(
    amp: AmpInstance, example_endpoints: ExampleEndpoints, core: client.CoreV1Api
) -> None:
    ns = amp.namespace(unique("debug"), example_endpoints.url("registry"), failure_policy="Fail")
    create_pod(core, ns, pod_manifest("debugged", containers=[{"name": "app", "image": "gcr.io/team/app:1"}]))
    reconfigure_webhook(
        amp,
        core,
        ns,
        rules=[
            {"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]},
            EPHEMERAL_RULE,
        ],
    )
    counter = iter(range(1000))

    def rewritten() -> Optional[dict[str, Any]]:
        # What `kubectl debug` does: add an ephemeral container through the
        # pods/ephemeralcontainers subresource of the stored Pod.
        pod = read_pod(core, ns, "debugged")
        name = f"debugger-{next(counter)}"
        ephemeral = list(pod["spec"].get("ephemeralContainers") or [])
        ephemeral.append(
            {
                "name": name,
                "image": "busybox:1.36",
                "targetContainerName": "app",
                "terminationMessagePolicy": "File",
                "imagePullPolicy": "IfNotPresent",
            }
        )
        core.patch_namespaced_pod_ephemeralcontainers("debugged", ns, {"spec": {"ephemeralContainers": ephemeral}})
        stored = read_pod(core, ns, "debugged")
        return stored if images(stored, "ephemeralContainers")[name].startswith("mirror.local/") else None

    pod = poll_until("the API server to send ephemeral container updates to amp", rewritten, PROPAGATION_DEADLINE)
    debuggers = images(pod, "ephemeralContainers")
    assert debuggers[max(debuggers)] == "mirror.local/library/busybox:1.36"
    # The app container (rewritten at creation) is untouched by the update.
    assert images(pod) == {"app": "asia.gcr.io/team/app:1"}
    assert annotations(pod)[STATUS_ANNOTATION].startswith("mutated ")
