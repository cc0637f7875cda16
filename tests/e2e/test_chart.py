"""The Helm chart and the ``deploy/`` manifests against a real kube-apiserver.

Every object the chart renders (cert-manager, self-signed and monitoring
variants) and every kustomization of ``deploy/`` builds is applied
server-side: for real where it needs no controller (the self-signed
release's namespace, Secrets, ConfigMap, ServiceAccount, Service,
Deployment, PodDisruptionBudget), as a server-side dry run otherwise
(cluster-scoped objects, which other tests' namespaces would see; custom
resources whose CRDs this control plane does not have are named, not
silently dropped).  The shipped webhook's selectors are then registered
for real, pointing at a closed port under failurePolicy Ignore: the API
server's own fail-open counter shows which Pods it would have sent to amp,
which proves the selectors (amp's namespace, kube-system and opted-out Pods
never reach amp) and that the API server metrics the alerting rules use
exist under those names.
"""

from __future__ import annotations

import base64
import copy
import json
import re
import uuid
from typing import Any, Iterator, Optional

import pytest
from kubernetes import client, dynamic
from kubernetes.client.rest import ApiException

from ..support.deploytools import APISERVER_METRICS, DEPLOY, helm_template, kustomize_build
from ..support.prometheus import Scrape
from ..support.waiting import poll_until
from .amp_process import INSTANCE_LABEL, closed_port, pod_manifest, unique
from .cluster import ControlPlane

pytestmark = pytest.mark.e2e

#: API groups whose objects are not sent to this control plane, and why.
NOT_APPLIED = {
    "cert-manager.io": "cert-manager's CRDs are not installed in this control plane",
    "monitoring.coreos.com": "the Prometheus Operator's CRDs are not installed in this control plane",
}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "MutatingWebhookConfiguration"}


def apply(dyn: dynamic.DynamicClient, doc: dict[str, Any], dry_run: Optional[str]) -> Any:
    resource = dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
    return dyn.server_side_apply(
        resource,
        body=doc,
        namespace=doc["metadata"].get("namespace"),
        field_manager="amp-e2e",
        force_conflicts=True,
        dry_run=dry_run,
    )


def apply_all(api: client.ApiClient, docs: list[dict[str, Any]], *, for_real: bool) -> tuple[list[str], list[str]]:
    """Apply every object (Namespaces for real first, so that namespaced
    objects have one); namespaced objects for real when C{for_real}.  The
    objects applied and those skipped, as C{kind/name} lines."""
    dyn = dynamic.DynamicClient(api)
    for doc in docs:
        if doc["kind"] == "Namespace":
            apply(dyn, doc, None)
    applied, skipped, failures = [], [], []
    for doc in docs:
        where = f"{doc['kind']}/{doc['metadata']['name']}"
        group = doc["apiVersion"].partition("/")[0]
        if group in NOT_APPLIED:
            skipped.append(f"{where}: {NOT_APPLIED[group]}")
            continue
        if doc["kind"] == "Namespace":
            applied.append(where)
            continue
        dry_run = None if for_real and doc["kind"] not in CLUSTER_SCOPED else "All"
        try:
            apply(dyn, doc, dry_run)
        except ApiException as exc:
            failures.append(f"{where}: {exc.status} {exc.body}")
        else:
            applied.append(where)
    assert failures == []
    return applied, skipped


def no_cert_manager_overlay(ca_pem: bytes) -> list[dict[str, Any]]:
    """deploy/no-cert-manager as install.sh applies it: the placeholder replaced by a CA."""
    docs = kustomize_build(DEPLOY / "no-cert-manager")
    for doc in docs:
        if doc["kind"] == "MutatingWebhookConfiguration":
            for hook in doc["webhooks"]:
                assert hook["clientConfig"]["caBundle"] == "${CA_BUNDLE}"
                hook["clientConfig"]["caBundle"] = base64.b64encode(ca_pem).decode()
    return docs


BASE_KINDS = {
    "Namespace",
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "ConfigMap",
    "Deployment",
    "Service",
    "PodDisruptionBudget",
    "MutatingWebhookConfiguration",
}


@pytest.mark.parametrize("overlay", ["cert-manager", "no-cert-manager"])
def test_kustomize_overlays_pass_a_server_side_dry_run_apply(control_plane: ControlPlane, overlay: str) -> None:
    docs = (
        no_cert_manager_overlay(control_plane.ca_pem)
        if overlay == "no-cert-manager"
        else kustomize_build(DEPLOY / overlay)
    )
    applied, skipped = apply_all(control_plane.admin_client(), docs, for_real=False)
    assert BASE_KINDS <= {where.split("/")[0] for where in applied}, applied
    if overlay == "cert-manager":
        assert sorted(s.split(":")[0] for s in skipped) == [
            "Certificate/amp-ca",
            "Certificate/amp-tls",
            "Issuer/amp-ca",
            "Issuer/amp-selfsigned",
        ]
    else:
        assert skipped == []


def test_monitoring_kustomization_passes_a_server_side_dry_run_apply(control_plane: ControlPlane) -> None:
    applied, skipped = apply_all(
        control_plane.admin_client(),
        kustomize_build(DEPLOY / "base") + kustomize_build(DEPLOY / "monitoring"),
        for_real=False,
    )
    assert "ConfigMap/amp-dashboard" in applied
    assert sorted(s.split(":")[0] for s in skipped) == ["PrometheusRule/amp", "ServiceMonitor/amp"]


@pytest.fixture
def chart_namespace(control_plane: ControlPlane) -> Iterator[str]:
    name = unique("amp-chart")
    yield name
    core = client.CoreV1Api(control_plane.admin_client())
    try:
        core.delete_namespace(name)
    except ApiException as exc:
        if exc.status != 404:
            raise


def test_chart_installs_for_real(control_plane: ControlPlane, chart_namespace: str) -> None:
    """
    The self-signed release (everything but cert-manager's objects): its
    namespaced objects are stored, its cluster-scoped ones pass a dry run,
    and what is stored is what the chart rendered (the config checksum on
    the Pod template, the certificate in the Secret the Deployment mounts).
    """
    docs = helm_template(
        "--set",
        "certManager.enabled=false",
        "--set",
        "namespace.create=true",
        "--set",
        "priorityClassName=system-cluster-critical",
        namespace=chart_namespace,
    )
    applied, skipped = apply_all(control_plane.admin_client(), docs, for_real=True)
    assert skipped == []
    assert BASE_KINDS | {"Secret"} <= {where.split("/")[0] for where in applied}, applied

    api = control_plane.admin_client()
    apps = client.AppsV1Api(api)
    stored = apps.read_namespaced_deployment("amp", chart_namespace)
    [rendered] = [d for d in docs if d["kind"] == "Deployment"]
    assert (
        stored.spec.template.metadata.annotations["checksum/config"]
        == rendered["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    )
    assert stored.spec.template.spec.priority_class_name == "system-cluster-critical"
    secret = client.CoreV1Api(api).read_namespaced_secret("amp-tls", chart_namespace)
    [mwc] = [d for d in docs if d["kind"] == "MutatingWebhookConfiguration"]
    assert secret.data["ca.crt"] == mwc["webhooks"][0]["clientConfig"]["caBundle"]

    # Applying the same release again (helm upgrade) changes nothing stored but the certificate.
    again = helm_template(
        "--set",
        "certManager.enabled=false",
        "--set",
        "namespace.create=true",
        "--set",
        "priorityClassName=system-cluster-critical",
        namespace=chart_namespace,
    )
    apply_all(api, again, for_real=True)
    assert apps.read_namespaced_deployment("amp", chart_namespace).metadata.generation == stored.metadata.generation


def test_chart_with_monitoring_passes_a_server_side_dry_run_apply(control_plane: ControlPlane) -> None:
    docs = helm_template(
        "--set",
        "monitoring.enabled=true",
        "--set",
        "namespace.create=true",
        "--set",
        "webhook.ephemeralContainers=true",
    )
    applied, skipped = apply_all(control_plane.admin_client(), docs, for_real=False)
    assert BASE_KINDS <= {where.split("/")[0] for where in applied}, applied
    assert {s.split(":")[0] for s in skipped} >= {"PrometheusRule/amp", "ServiceMonitor/amp", "Certificate/amp-tls"}


def test_pod_template_is_admitted_under_its_namespace_pod_security(control_plane: ControlPlane) -> None:
    """The Deployment dry-runs fine, but its Pods are what the namespace's
    ``pod-security.kubernetes.io/enforce`` label is enforced on."""
    api = control_plane.admin_client()
    documents = kustomize_build(DEPLOY / "cert-manager")
    (deployment,) = [d for d in documents if d["kind"] == "Deployment"]
    (namespace,) = [d for d in documents if d["kind"] == "Namespace"]
    ns = deployment["metadata"]["namespace"]
    assert namespace["metadata"]["name"] == ns
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    core = client.CoreV1Api(api)
    dyn = dynamic.DynamicClient(api)
    # For real: the namespace with its labels, and the ServiceAccount the
    # Pod runs as (the ServiceAccount admission plugin looks it up).
    apply(dyn, namespace, None)
    template = deployment["spec"]["template"]
    account = template["spec"].get("serviceAccountName", "default")
    try:
        core.create_namespaced_service_account(ns, {"metadata": {"name": account}})
    except ApiException as exc:
        if exc.status != 409:
            raise

    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "amp-", "labels": template["metadata"].get("labels")},
        "spec": template["spec"],
    }
    try:
        response = core.create_namespaced_pod(ns, pod, dry_run="All", _preload_content=False)
    except ApiException as exc:
        pytest.fail(f"the API server refuses amp's Pod in {ns}: {exc.status} {exc.body}")
    assert response.headers.getlist("Warning") == []


# ---- the shipped webhook's selectors, for real


def apiserver_metrics(api: client.ApiClient) -> Scrape:
    """The API server's /metrics."""
    method, url, headers, _, _ = api.param_serialize("GET", "/metrics", auth_settings=["BearerToken"])
    response = api.call_api(method, url, header_params=headers)
    response.read()
    assert response.status == 200, response.data
    return Scrape(response.data.decode())


def exposed(scrape: Scrape, name: str, webhook: str) -> list[str]:
    """The lines of metric C{name} (as exposed, so as PromQL names it) for C{webhook}."""
    pattern = re.compile(rf'^{re.escape(name)}{{[^}}]*\bname="{re.escape(webhook)}"[^}}]*}} ', re.M)
    return [m.group(0) for m in pattern.finditer(scrape.text)]


def of_webhook(scrape: Scrape, sample: str, webhook: str) -> list[tuple[dict[str, str], float]]:
    """The samples named C{sample} whose label C{name} is C{webhook} (a label
    Scrape's keyword filters cannot take)."""
    return [
        (dict(labels), value)
        for (n, labels), value in scrape.samples.items()
        if n == sample and ("name", webhook) in labels
    ]


def fail_opens(api: client.ApiClient, webhook: str) -> float:
    # prometheus_client's parser names the counter's samples with _total.
    return sum(
        v for _, v in of_webhook(apiserver_metrics(api), "apiserver_admission_webhook_fail_open_count_total", webhook)
    )


@pytest.fixture
def kube_system_default_account(control_plane: ControlPlane) -> None:
    """kube-system's ``default`` ServiceAccount (no controller-manager makes it here)."""
    try:
        client.CoreV1Api(control_plane.admin_client()).create_namespaced_service_account(
            "kube-system", {"metadata": {"name": "default"}}
        )
    except ApiException as exc:
        if exc.status != 409:
            raise


def test_shipped_selectors_keep_amp_off_its_namespace_kube_system_and_opted_out_pods(
    control_plane: ControlPlane, kube_system_default_account: None
) -> None:
    """
    The chart's webhook entries, one per failure class, with their own
    selectors (plus this test's instance label, so no other test's
    namespace matches) but pointing at a closed port: each Pod the API
    server sends to the Ignore entry fails open and is counted in its own
    apiserver_admission_webhook_fail_open_count, and a Pod it sends to the
    Fail entry is refused naming that entry.  A Pod in an enabled namespace
    is sent by the entry of its namespace's failure class (Ignore without
    the label); a Pod labelled amp.txn2.com/enabled: "false" there is not,
    nor are Pods in amp's own namespace and kube-system, even when they are
    labelled enabled and Fail.
    """
    api = control_plane.admin_client()
    core = client.CoreV1Api(api)
    admission = client.AdmissionregistrationV1Api(api)
    instance = uuid.uuid4().hex[:8]
    amp_namespace = unique("amp-own")
    [mwc] = [d for d in helm_template(namespace=amp_namespace) if d["kind"] == "MutatingWebhookConfiguration"]
    registration = copy.deepcopy(mwc)
    registration["metadata"] = {"name": f"amp-selectors-{instance}"}
    hooks = {hook["failurePolicy"]: hook for hook in registration["webhooks"]}
    assert sorted(hooks) == ["Fail", "Ignore"]
    for policy, hook in hooks.items():
        assert hook["name"] == f"{policy.lower()}.mutate.amp.txn2.com"
        hook["name"] = f"{policy.lower()}-{instance}.amp.txn2.com"
        hook["namespaceSelector"]["matchLabels"][INSTANCE_LABEL] = instance
        hook["clientConfig"] = {
            "url": f"https://127.0.0.1:{closed_port()}/mutate",
            "caBundle": base64.b64encode(control_plane.ca_pem).decode(),
        }
        hook["timeoutSeconds"] = 2
    webhook = hooks["Ignore"]["name"]
    enabled = {**mwc["webhooks"][0]["namespaceSelector"]["matchLabels"], INSTANCE_LABEL: instance}
    fail_class = {**enabled, "amp.txn2.com/failure-class": "Fail"}

    team = unique("team")
    strict = unique("strict")
    control_plane.create_namespace(team, labels=enabled)
    control_plane.create_namespace(strict, labels=fail_class)
    control_plane.create_namespace(amp_namespace, labels=fail_class)
    kube_system = core.read_namespace("kube-system").metadata.labels or {}
    core.patch_namespace("kube-system", {"metadata": {"labels": fail_class}})
    admission.create_mutating_webhook_configuration(registration)
    try:

        def created(namespace: str, name: str, labels: Optional[dict[str, str]] = None) -> float:
            """Create a Pod; how many calls to amp failed open for it."""
            before = fail_opens(api, webhook)
            core.create_namespaced_pod(namespace, pod_manifest(name, labels=labels))
            return fail_opens(api, webhook) - before

        # The registration has reached the API server's webhook cache once a
        # Pod of an enabled namespace fails open.
        attempts = iter(range(10_000))
        poll_until(
            "the webhook registration to reach the API server",
            lambda: created(team, f"warm-{next(attempts)}") or None,
            60.0,
        )

        assert created(team, "sent") == 1
        assert created(team, "opted-out", {"amp.txn2.com/enabled": "false"}) == 0
        assert created(team, "opted-in", {"amp.txn2.com/enabled": "true"}) == 1
        assert created(amp_namespace, "own") == 0
        assert created("kube-system", f"system-{instance}") == 0
        with pytest.raises(ApiException) as refused:
            core.create_namespaced_pod(strict, pod_manifest("refused"))
        assert f'failed calling webhook "{hooks["Fail"]["name"]}"' in json.loads(refused.value.body)["message"]
        assert created(strict, "opted-out", {"amp.txn2.com/enabled": "false"}) == 0

        scrape = apiserver_metrics(api)
        for name in APISERVER_METRICS:
            assert exposed(scrape, name, webhook), f"the API server exposes no {name} for {webhook}"
        codes = {
            labels["code"] for labels, _ in of_webhook(scrape, "apiserver_admission_webhook_request_total", webhook)
        }
        assert codes and "200" not in codes, f'the alert\'s code!="200" sees the failed calls: {codes}'
    finally:
        admission.delete_mutating_webhook_configuration(registration["metadata"]["name"])
        labels = {k: None for k in fail_class if k not in kube_system}
        core.patch_namespace("kube-system", {"metadata": {"labels": labels}})
        try:
            core.delete_namespaced_pod(f"system-{instance}", "kube-system")
        except ApiException as exc:
            if exc.status != 404:
                raise
