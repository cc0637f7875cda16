"""amp registered with ``reinvocationPolicy: IfNeeded`` against a real
kube-apiserver: the API server calls amp a second time for one admission,
and what is stored is each injection exactly once and a stamp that tells
what amp did across both rounds (a round that changes nothing sends no
patch, and leaves the first round's ``mutated``).

The API server reinvokes a webhook registered with ``IfNeeded`` when a
webhook called after it changed the object.  Here that later webhook is
the test's own (``LaterWebhook``): registered in a configuration whose name
sorts after amp's (the API server calls configurations in name order), it
adds one annotation to every Pod of amp's namespaces.

amp's namespaces name their example endpoints through a ``Relay`` in this
process, which forwards each call to ``twistd amp-example`` (or answers the
n-th call for a Pod with HTTP 500 instead) and records what it was sent and
what it answered.  That record is the proof that amp was reinvoked: two
calls for the one Pod, the second carrying the later webhook's annotation
and amp's first-round stamp; without reinvocation every test here fails.

The last test forces reinvocation with a MutatingAdmissionPolicy
(``admissionregistration.k8s.io/v1``, served by the API server without
flags) instead: it runs before every webhook, and again after amp
(``reinvocationPolicy: IfNeeded``), where it changes the Pod because amp
did; the API server then calls amp again.  That test has an amp instance of
its own, whose namespaces the later webhook does not select.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import http.server
import json
import ssl
from dataclasses import dataclass
from typing import Any, Iterator, Optional

import pytest
from kubernetes import client

from ..support.waiting import poll_until
from .amp_process import (
    LOOPBACK,
    STATUS_ANNOTATION,
    AmpInstance,
    ExampleEndpoints,
    LoopbackServer,
    parse_warning,
    pod_manifest,
    unique,
    webhook_configuration,
)
from .cluster import ControlPlane
from .conftest import AmpFactory

pytestmark = pytest.mark.e2e

LEGACY_SKIPPED_ANNOTATION = "amp.txn2.com/skipped"
#: What the later webhook adds to every Pod it is sent.
LATER_ANNOTATION = "e2e.amp.txn2.com/later"
#: How long a new webhook configuration may take to reach the API server's calls.
PROPAGATION_DEADLINE = 10.0


# ---- two small HTTP servers of the test's own


@dataclass(frozen=True)
class RelayedCall:
    """One call amp made through the relay: the Pod it sent, and what it got back."""

    endpoint: str
    pod: dict[str, Any]
    status: int
    reply: Any

    @property
    def annotations(self) -> dict[str, str]:
        return self.pod["metadata"].get("annotations") or {}

    @property
    def patch(self) -> list[Any]:
        """The operations of the reply (bare array or object form)."""
        return self.reply if isinstance(self.reply, list) else self.reply.get("patch") or []


class Relay(LoopbackServer):
    """amp's endpoint: ``/<mode>/<example>`` forwards amp's call to the
    example endpoint ``/<example>``, unless ``mode`` is ``fail-<n>`` and this
    is the n-th call for the Pod (per namespace, Pod name and URL): that call
    is answered with HTTP 500 (amp's reason ``http-5xx``).  ``pass/<example>``
    always forwards.  Every call is recorded before it is answered."""

    def __init__(self, examples: ExampleEndpoints) -> None:
        super().__init__("relay")
        self.examples = examples
        self._calls: list[tuple[str, str, RelayedCall]] = []
        self._counts: dict[tuple[str, str, str], int] = {}

    @property
    def origin(self) -> str:
        """How amp's stamp names a lone endpoint of the relay."""
        return f"http://{LOOPBACK}:{self.port}"

    def endpoint(self, example: str, fail_call: Optional[int] = None) -> str:
        return self.url(f"{'pass' if fail_call is None else f'fail-{fail_call}'}/{example}")

    def answer(self, path: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
        mode, _, example = path.lstrip("/").partition("/")
        pod = json.loads(body)
        namespace, name = headers.get("x-amp-namespace", ""), pod["metadata"]["name"]
        with self._lock:
            key = (namespace, name, path)
            self._counts[key] = n = self._counts.get(key, 0) + 1
        if mode == f"fail-{n}":
            status, reply = 500, json.dumps({"error": f"call {n} fails on purpose"}).encode()
        else:
            status, reply = self._forward(example, headers, body)
        with self._lock:
            self._calls.append(
                (namespace, name, RelayedCall(self.url(path.lstrip("/")), pod, status, json.loads(reply)))
            )
        return status, reply

    def _forward(self, example: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
        connection = http.client.HTTPConnection(LOOPBACK, self.examples.port, timeout=5)
        try:
            forwarded = {k: v for k, v in headers.items() if k.startswith("x-amp-")}
            connection.request("POST", f"/{example}", body, {**forwarded, "Content-Type": "application/json"})
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def calls(self, namespace: str, name: str) -> list[RelayedCall]:
        """Every call for the Pod, in order, whatever the URL."""
        with self._lock:
            return [call for ns, n, call in self._calls if (ns, n) == (namespace, name)]


class LaterWebhook(LoopbackServer):
    """A mutating webhook (HTTPS, AdmissionReview v1) that adds
    ``LATER_ANNOTATION`` to every Pod it is sent and records the Pod."""

    def __init__(self, control_plane: ControlPlane) -> None:
        cert, key = control_plane.issue_serving_certificate(unique("later-webhook"))
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        super().__init__("later-webhook", context)
        self._pods: list[tuple[str, dict[str, Any]]] = []

    def answer(self, path: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
        review = json.loads(body)
        request = review["request"]
        pod = request["object"]
        with self._lock:
            # request.namespace: the object's own may be empty on CREATE.
            self._pods.append((request["namespace"], pod))
        if pod["metadata"].get("annotations") is None:
            op = {"op": "add", "path": "/metadata/annotations", "value": {LATER_ANNOTATION: "seen"}}
        else:
            op = {"op": "add", "path": "/metadata/annotations/" + LATER_ANNOTATION.replace("/", "~1"), "value": "seen"}
        response = {
            "uid": request["uid"],
            "allowed": True,
            "patchType": "JSONPatch",
            "patch": base64.b64encode(json.dumps([op]).encode()).decode(),
        }
        return 200, json.dumps(
            {"apiVersion": review["apiVersion"], "kind": "AdmissionReview", "response": response}
        ).encode()

    def pods(self, namespace: str, name: str) -> list[dict[str, Any]]:
        """The Pods sent for ``namespace/name``, in order, as they came."""
        with self._lock:
            return [pod for ns, pod in self._pods if (ns, pod["metadata"]["name"]) == (namespace, name)]


# ---- fixtures


@pytest.fixture(scope="module")
def amp(start_module_amp: AmpFactory) -> AmpInstance:
    return start_module_amp("reinvoke", webhook_reinvocation_policy="IfNeeded")


@pytest.fixture(scope="module")
def relay(example_endpoints: ExampleEndpoints) -> Iterator[Relay]:
    with Relay(example_endpoints) as server:
        yield server


@pytest.fixture(scope="module")
def later(amp: AmpInstance, control_plane: ControlPlane) -> Iterator[LaterWebhook]:
    """The later webhook, registered after amp for amp's namespaces, in
    effect (a dry-run Pod in amp's probe namespace comes back with its
    annotation) until the module ends."""
    registrations = client.AdmissionregistrationV1Api(control_plane.admin_client())
    # A name that sorts after amp's: the API server calls it after amp.
    name = f"{amp.webhook_configuration_name}-later"
    assert name > amp.webhook_configuration_name
    core = client.CoreV1Api(control_plane.admin_client())
    with LaterWebhook(control_plane) as webhook:
        registrations.create_mutating_webhook_configuration(
            webhook_configuration(
                name,
                webhook.url("mutate"),
                control_plane.ca_pem,
                amp.instance,
                webhook_name="later.e2e.amp.txn2.com",
                review_versions=("v1",),
            )
        )
        try:
            counter = iter(range(10_000))

            def in_effect() -> Optional[bool]:
                pod, _ = create_pod(
                    core, f"{amp.instance}-probe", pod_manifest(f"later-{next(counter)}"), dry_run="All"
                )
                return True if LATER_ANNOTATION in annotations(pod) else None

            poll_until(
                "the API server to call the later webhook",
                in_effect,
                PROPAGATION_DEADLINE,
                details=amp.process.describe,
            )
            yield webhook
        finally:
            registrations.delete_mutating_webhook_configuration(name)


@pytest.fixture
def core(control_plane: ControlPlane) -> client.CoreV1Api:
    return client.CoreV1Api(control_plane.admin_client())


# ---- reading Pods


def create_pod(
    core: client.CoreV1Api, namespace: str, body: dict[str, Any], *, dry_run: Optional[str] = None
) -> tuple[dict[str, Any], list[str]]:
    """Create a Pod; the API server's answer (the Pod, as JSON) and the
    texts of the ``Warning`` headers it sent."""
    response = core.create_namespaced_pod(namespace, body, dry_run=dry_run, _preload_content=False)
    return json.loads(response.data), [parse_warning(w) for w in response.headers.getlist("Warning")]


def read_pod(core: client.CoreV1Api, namespace: str, name: str) -> dict[str, Any]:
    return json.loads(core.read_namespaced_pod(name, namespace, _preload_content=False).data)


def annotations(pod: dict[str, Any]) -> dict[str, str]:
    return pod["metadata"].get("annotations") or {}


def names(items: Optional[list[dict[str, Any]]]) -> list[str]:
    """The ``name`` of every item, in order, duplicates kept, without the
    ServiceAccount token volume (and its mounts) the API server adds."""
    return [i["name"] for i in items or [] if not i["name"].startswith("kube-api-access-")]


def containers(pod: dict[str, Any], kind: str = "containers") -> dict[str, dict[str, Any]]:
    found = pod["spec"].get(kind) or []
    assert len({c["name"] for c in found}) == len(found), f"duplicate {kind}: {names(found)}"
    return {c["name"]: c for c in found}


def reviews_logged(amp: AmpInstance, ns: str, name: str, rounds: int = 2) -> list[str]:
    """What amp's log says of each review of ``ns/name``, in order, once it
    has said it of ``rounds`` (it logs a review after answering it): the
    result, and ``patch=0B`` when the answer had no patch."""

    def said() -> Optional[list[str]]:
        found = []
        for line in amp.process.log_text().splitlines():
            words = line.partition(f" {ns}/{name} ")[2].split()
            if words and "endpoint=" in line:
                found.append(words[0] + (" patch=0B" if " patch=0B " in line else ""))
        return found if len(found) >= rounds else None

    return poll_until(f"amp to log {rounds} reviews of {ns}/{name}", said, 5.0, details=amp.process.describe)


def assert_reinvoked(
    relay: Relay, later: LaterWebhook, ns: str, name: str, first_stamp: str
) -> tuple[list[RelayedCall], list[RelayedCall]]:
    """amp was called for the Pod twice: once before the later webhook
    (which saw amp's first-round stamp) and once after it (the Pod carries
    the later webhook's annotation and amp's first-round stamp).  The calls
    of the first round and of the second, each in the chain's order."""
    seen_by_later = later.pods(ns, name)
    assert len(seen_by_later) == 1, f"the later webhook was called {len(seen_by_later)} times for {ns}/{name}"
    assert annotations(seen_by_later[0]).get(STATUS_ANNOTATION) == first_stamp, "amp did not run before it"
    calls = relay.calls(ns, name)
    first = [c for c in calls if LATER_ANNOTATION not in c.annotations]
    second = [c for c in calls if LATER_ANNOTATION in c.annotations]
    called = [(c.endpoint, c.status) for c in calls]
    assert second, f"amp was not reinvoked for {ns}/{name}: its endpoints saw only {called}"
    assert calls == first + second, f"the rounds are interleaved: {called}"
    assert [c.endpoint for c in first] == [c.endpoint for c in second], called
    assert [c.annotations.get(STATUS_ANNOTATION) for c in second] == [first_stamp] * len(second)
    return first, second


# ---- 1. the shipped injecting examples, reinvoked: each injection once


def test_a_reinvoked_chain_of_injecting_examples_adds_each_thing_once(
    amp: AmpInstance, relay: Relay, later: LaterWebhook, core: client.CoreV1Api
) -> None:
    """sidecar (a container, an init container, a volume and its mounts),
    user-env (env vars in every container, a volume and its mount, an init
    container) and poddefault (a secret volume, its mount and an env var in
    every container): the second round finds everything in place, each
    example answers no change, and amp answers that round with no patch:
    the stamp still says ``mutated``."""
    chain = [relay.endpoint("sidecar"), relay.endpoint("user-env"), relay.endpoint("poddefault")]
    ns = amp.namespace(unique("reinvoke-inject"), " ".join(chain), failure_policy="Fail")
    body = pod_manifest(
        "notebook",
        labels={"add-gcp-secret": "true"},
        annotations={"hub.jupyter.org/username": "alice"},
        containers=[{"name": "app", "image": "registry.invalid/app:1", "ports": [{"containerPort": 8080}]}],
    )

    _, warnings = create_pod(core, ns, body)

    first, second = assert_reinvoked(relay, later, ns, "notebook", f"mutated {' '.join(chain)}")
    assert all(c.status == 200 and c.patch for c in first), first
    assert [(c.status, c.patch) for c in second] == [(200, [])] * 3
    pod = read_pod(core, ns, "notebook")
    assert annotations(pod)[STATUS_ANNOTATION] == f"mutated {' '.join(chain)}"
    assert reviews_logged(amp, ns, "notebook") == ["patched", "allowed patch=0B"]
    assert annotations(pod)[LATER_ANNOTATION] == "seen"
    assert LEGACY_SKIPPED_ANNOTATION not in annotations(pod)
    assert list(containers(pod)) == ["app", "amp-proxy"]
    assert list(containers(pod, "initContainers")) == ["amp-proxy-init", "new-init-container"]
    assert names(pod["spec"]["volumes"]) == ["amp-shared", "user-home", "secret-volume"]
    app, proxy = containers(pod).values()
    assert names(app["volumeMounts"]) == ["amp-shared", "user-home", "secret-volume"]
    assert names(proxy["volumeMounts"]) == ["amp-shared", "secret-volume"]
    for container in (app, proxy):
        assert names(container["env"]) == ["AMP_USER", "ADDED_VAR", "GOOGLE_APPLICATION_CREDENTIALS"]
    assert not [w for w in warnings if w.startswith("amp:")], warnings


def test_reinvocation_completes_a_chain_whose_later_step_adds_a_container_once(
    amp: AmpInstance, relay: Relay, later: LaterWebhook, core: client.CoreV1Api
) -> None:
    """user-env before sidecar: the first round gives env vars to the app
    only (the sidecar comes after it); the second round gives them to the
    sidecar, and adds nothing twice."""
    chain = [relay.endpoint("user-env"), relay.endpoint("sidecar")]
    ns = amp.namespace(unique("reinvoke-complete"), " ".join(chain), failure_policy="Fail")

    create_pod(core, ns, pod_manifest("meshed"))

    first, second = assert_reinvoked(relay, later, ns, "meshed", f"mutated {' '.join(chain)}")
    user_env, sidecar = second
    assert user_env.patch and all(op["path"].startswith("/spec/containers/1/env") for op in user_env.patch)
    assert sidecar.patch == []
    pod = read_pod(core, ns, "meshed")
    assert annotations(pod)[STATUS_ANNOTATION] == f"mutated {' '.join(chain)}"
    assert list(containers(pod)) == ["app", "amp-proxy"]
    assert list(containers(pod, "initContainers")) == ["new-init-container", "amp-proxy-init"]
    assert names(pod["spec"]["volumes"]) == ["user-home", "amp-shared"]
    for container in containers(pod).values():
        assert names(container["env"]) == ["AMP_USER", "ADDED_VAR"]


# ---- 2. the first round's call fails, the second succeeds


def test_a_failed_first_round_is_made_good_by_the_second_and_stamped_so(
    amp: AmpInstance, relay: Relay, later: LaterWebhook, core: client.CoreV1Api
) -> None:
    sidecar = relay.endpoint("sidecar", fail_call=1)
    origin = relay.origin
    ns = amp.namespace(unique("reinvoke-heal"), sidecar, failure_policy="Ignore")

    _, warnings = create_pod(core, ns, pod_manifest("healed"))

    (first,), (second,) = assert_reinvoked(relay, later, ns, "healed", f"skipped http-5xx {origin}")
    assert first.status == 500
    assert (second.status, bool(second.patch)) == (200, True)
    pod = read_pod(core, ns, "healed")
    assert annotations(pod)[STATUS_ANNOTATION] == f"mutated {origin}"
    assert LEGACY_SKIPPED_ANNOTATION not in annotations(pod)
    assert list(containers(pod)) == ["app", "amp-proxy"]
    assert list(containers(pod, "initContainers")) == ["amp-proxy-init"]
    assert names(pod["spec"]["volumes"]) == ["amp-shared"]
    for container in containers(pod).values():
        assert names(container["volumeMounts"]) == ["amp-shared"]
    # The first round's warning reaches the client; the second round adds none.
    assert [w for w in warnings if w.startswith("amp:")] == [
        f"amp: {origin} http-5xx; admitted without the endpoint's patch"
    ]


# ---- 3. the first round succeeds, the second fails


def test_a_failed_second_round_keeps_the_first_rounds_patch_and_says_skipped(
    amp: AmpInstance, relay: Relay, later: LaterWebhook, core: client.CoreV1Api
) -> None:
    sidecar = relay.endpoint("sidecar", fail_call=2)
    origin = relay.origin
    ns = amp.namespace(unique("reinvoke-lapse"), sidecar, failure_policy="Ignore")

    _, warnings = create_pod(core, ns, pod_manifest("lapsed"))

    (first,), (second,) = assert_reinvoked(relay, later, ns, "lapsed", f"mutated {origin}")
    assert (first.status, bool(first.patch)) == (200, True)
    assert second.status == 500
    pod = read_pod(core, ns, "lapsed")
    # The second round's failure, and the first round's change on the Pod.
    assert annotations(pod)[STATUS_ANNOTATION] == f"skipped http-5xx {origin}; mutated {origin}"
    assert LEGACY_SKIPPED_ANNOTATION not in annotations(pod)
    assert list(containers(pod)) == ["app", "amp-proxy"]
    assert list(containers(pod, "initContainers")) == ["amp-proxy-init"]
    assert names(pod["spec"]["volumes"]) == ["amp-shared"]
    assert [w for w in warnings if w.startswith("amp:")] == [
        f"amp: {origin} http-5xx; admitted without the endpoint's patch"
    ]


# ---- 4. a MutatingAdmissionPolicy before amp forces the reinvocation

#: What the policy sets on every Pod: its containers' names, so it changes
#: the Pod again after amp added one.
CONTAINERS_ANNOTATION = "e2e.amp.txn2.com/containers"


@pytest.fixture(scope="module")
def amp_without_later(start_module_amp: AmpFactory) -> AmpInstance:
    return start_module_amp("reinvoke-map", webhook_reinvocation_policy="IfNeeded")


@contextlib.contextmanager
def containers_policy(control_plane: ControlPlane, namespace: str) -> Iterator[None]:
    """A MutatingAdmissionPolicy and its binding for ``namespace``, in
    effect (a dry-run Pod comes back with its annotation) until the block
    ends."""
    objects = client.CustomObjectsApi(control_plane.admin_client())
    group, version = "admissionregistration.k8s.io", "v1"
    name = unique("containers")
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
            "reinvocationPolicy": "IfNeeded",
            "mutations": [
                {
                    "patchType": "ApplyConfiguration",
                    "applyConfiguration": {
                        "expression": (
                            "Object{metadata: Object.metadata{annotations: {"
                            f"'{CONTAINERS_ANNOTATION}': object.spec.containers.map(c, c.name).join(',')}}}}}}"
                        )
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
            core = client.CoreV1Api(control_plane.admin_client())
            counter = iter(range(10_000))

            def in_effect() -> Optional[bool]:
                pod, _ = create_pod(core, namespace, pod_manifest(f"policy-probe-{next(counter)}"), dry_run="All")
                return True if CONTAINERS_ANNOTATION in annotations(pod) else None

            poll_until("the API server to apply the MutatingAdmissionPolicy", in_effect, PROPAGATION_DEADLINE)
            yield
        finally:
            objects.delete_cluster_custom_object(group, version, "mutatingadmissionpolicybindings", name)
    finally:
        objects.delete_cluster_custom_object(group, version, "mutatingadmissionpolicies", name)


def test_a_mutating_admission_policy_before_amp_reinvokes_it_and_the_pod_stays_stamped_mutated(
    amp_without_later: AmpInstance, relay: Relay, control_plane: ControlPlane, core: client.CoreV1Api
) -> None:
    """The policy names the Pod's containers before amp (``app``); the
    sidecar example adds ``amp-proxy``; the policy, reinvoked, names both,
    which changes the Pod, so the API server calls amp again.  The sidecar
    is there already: the example answers no change, amp answers with no
    patch, and the stored Pod says ``mutated`` with the sidecar once."""
    amp = amp_without_later
    sidecar = relay.endpoint("sidecar")
    ns = amp.namespace(unique("reinvoke-policy"), sidecar, failure_policy="Fail")

    with containers_policy(control_plane, ns):
        create_pod(core, ns, pod_manifest("policed"))

    calls = relay.calls(ns, "policed")
    seen = [(c.annotations.get(CONTAINERS_ANNOTATION), c.annotations.get(STATUS_ANNOTATION)) for c in calls]
    # Called twice: after the policy's first round, and after its second.
    assert seen == [("app", None), ("app,amp-proxy", f"mutated {relay.origin}")], seen
    assert [bool(c.patch) for c in calls] == [True, False]
    pod = read_pod(core, ns, "policed")
    assert annotations(pod)[STATUS_ANNOTATION] == f"mutated {relay.origin}"
    assert annotations(pod)[CONTAINERS_ANNOTATION] == "app,amp-proxy"
    assert list(containers(pod)) == ["app", "amp-proxy"]
    assert list(containers(pod, "initContainers")) == ["amp-proxy-init"]
    assert reviews_logged(amp, ns, "policed") == ["patched", "allowed patch=0B"]
