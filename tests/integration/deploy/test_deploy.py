"""
Tests for the Kubernetes manifests in deploy/: the kustomize overlays, built
with kustomize as C{kubectl apply -k} would, are rendered from the Helm chart
(deploy/chart/amp) and equal a fresh render; every object validates offline
against the Kubernetes JSON schemas (kubernetes-validate ships them); the
kustomizations list every file and name amp's ConfigMap by a hash of its
content, so an edit rolls the Deployment; the RBAC is exactly least
privilege; the pieces refer to each other correctly (names, ports, paths,
labels); the ConfigMap's amp.yaml loads with amp's own config loader; and
the no-cert-manager install script produces a Secret and a caBundle that
belong together (run against a stand-in kubectl that records what it is
given).  tests/integration/deploy/test_chart.py tests the chart's values.
"""

from __future__ import annotations

import base64
import binascii
import copy
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml
from cryptography import x509

from amp.config import Config, parse_config
from tests.support.deploytools import DEPLOY, ROOT, helm_template, kustomize_build, tool

kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate")

OVERLAYS = ("cert-manager", "no-cert-manager")
#: The Kubernetes version whose schemas the manifests must satisfy (the
#: end-to-end tests run kube-apiserver 1.37).
K8S_VERSION = "1.37"
CERT_MANAGER = "cert-manager.io/v1"
PROMETHEUS_OPERATOR = "monitoring.coreos.com/v1"
#: Custom resources: the Kubernetes schemas do not have them (checked, so
#: that a skip is never silent); their own tests check their shape.
CUSTOM_RESOURCES = (CERT_MANAGER, PROMETHEUS_OPERATOR)
CA_PLACEHOLDER = "${CA_BUNDLE}"

POD_LABELS = {"app.kubernetes.io/name": "amp", "app.kubernetes.io/component": "webhook"}

#: What is checked against the schemas: every kustomization of deploy/ as
#: built, and the chart rendered with the values that switch its parts on
#: and off.
BUILDS = ("base", *OVERLAYS, "monitoring", "tracing")
CHART_RENDERS = {
    "chart-defaults": [],
    "chart-self-signed": ["--set", "certManager.enabled=false"],
    "chart-everything": [
        "--set",
        "monitoring.enabled=true",
        "--set",
        "namespace.create=true",
        "--set",
        "priorityClassName=system-cluster-critical",
        "--set",
        "webhook.ephemeralContainers=true",
        "--set",
        "webhook.reinvocationPolicy=IfNeeded",
        "--set",
        "image.digest=sha256:" + "0" * 64,
        "--set-json",
        'tolerations=[{"key":"dedicated","operator":"Exists"}]',
        "--set-json",
        'nodeSelector={"kubernetes.io/os":"linux"}',
    ],
    "chart-minimal": [
        "--set",
        "podDisruptionBudget.enabled=false",
        "--set",
        "preStopSleepSeconds=0",
        "--set",
        "monitoring.podAnnotations=false",
        "--set",
        "configChecksum=false",
        "--set-json",
        "topologySpread=[]",
    ],
}


# ---------------------------------------------------------------- loading


_BUILT: dict[str, list[dict[str, Any]]] = {}


def build(directory: str) -> list[dict[str, Any]]:
    """The objects of one kustomization of deploy/, built by kustomize (once per session)."""
    if directory not in _BUILT:
        _BUILT[directory] = kustomize_build(DEPLOY / directory)
    return copy.deepcopy(_BUILT[directory])


def objects(overlay: str) -> dict[tuple[str, str], dict[str, Any]]:
    """The objects of an overlay keyed by (kind, name)."""
    out = {}
    for doc in build(overlay):
        key = (doc["kind"], doc["metadata"]["name"])
        assert key not in out, f"{key} defined twice in {overlay}"
        out[key] = doc
    return out


def only(overlay: str, kind: str) -> dict[str, Any]:
    found = [d for (k, _), d in objects(overlay).items() if k == kind]
    assert len(found) == 1, f"{overlay}: expected one {kind}, found {len(found)}"
    return found[0]


def amp_yaml() -> Config:
    return parse_config(yaml.safe_load(only("cert-manager", "ConfigMap")["data"]["amp.yaml"]))


def pod_spec() -> dict[str, Any]:
    return only("cert-manager", "Deployment")["spec"]["template"]["spec"]


def container() -> dict[str, Any]:
    [c] = pod_spec()["containers"]
    return c


def all_docs() -> Iterator[dict[str, Any]]:
    """Every object deploy/ can install, each once."""
    seen = set()
    for directory in BUILDS:
        for doc in build(directory):
            key = (doc["kind"], doc["metadata"].get("namespace"), doc["metadata"]["name"])
            if key not in seen:
                seen.add(key)
                yield doc


def rendered(source: str) -> list[dict[str, Any]]:
    if source in CHART_RENDERS:
        return helm_template(*CHART_RENDERS[source])
    return build(source)


# ---------------------------------------------------------------- one source of truth


def test_kustomize_manifests_are_the_chart_rendered() -> None:
    """
    deploy/base, the overlays and deploy/monitoring are exactly what
    deploy/render makes from the chart now: nobody edited a rendered file
    or the chart without rendering again.
    """
    tool("helm")
    result = subprocess.run(
        [sys.executable, str(DEPLOY / "render"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, AMP_HELM=tool("helm")),
    )
    assert result.returncode == 0, result.stderr


def test_render_check_notices_a_hand_edit(tmp_path: Path) -> None:
    """The check above can fail: a rendered file edited by hand, and a stale one, are named."""
    copy_ = tmp_path / "deploy"
    shutil.copytree(DEPLOY, copy_, ignore=shutil.ignore_patterns("chart"))
    deployment = copy_ / "base" / "deployment.yaml"
    deployment.write_text(deployment.read_text().replace("replicas: 2", "replicas: 3"))
    (copy_ / "monitoring" / "old.yaml").write_text("{}\n")
    result = subprocess.run(
        [sys.executable, str(DEPLOY / "render"), "--check", "--out", str(copy_)],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, AMP_HELM=tool("helm")),
    )
    assert result.returncode == 1
    assert "differs: base/deployment.yaml" in result.stderr
    assert "not rendered any more: monitoring/old.yaml" in result.stderr
    assert "amp.yaml" not in result.stderr


# ---------------------------------------------------------------- schema validation


@pytest.mark.parametrize("source", [*BUILDS, "managed", *CHART_RENDERS])
def test_manifest_validates_against_kubernetes_schema(source: str) -> None:
    """
    Every Kubernetes object, as kustomize builds it and as the chart renders
    it, validates against the strict schema (no unknown fields).
    cert-manager and Prometheus Operator objects are custom resources: the
    Kubernetes schemas do not have them (checked here, so that a skip is
    never silent) and their own tests check them.
    """
    docs = rendered(source)
    assert docs, f"{source} has no objects"
    for doc in docs:
        if doc["apiVersion"] in CUSTOM_RESOURCES:
            with pytest.raises(kubernetes_validate.SchemaNotFoundError):
                kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
            continue
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_schema_validation_catches_mistakes() -> None:
    """
    The validator is really looking: a wrong type and an unknown field in
    the Deployment are both refused.
    """
    deployment = only("cert-manager", "Deployment")
    wrong_type = copy.deepcopy(deployment)
    wrong_type["spec"]["template"]["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"] = "yes"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(wrong_type, K8S_VERSION, strict=True)
    unknown = copy.deepcopy(deployment)
    unknown["spec"]["template"]["spec"]["containers"][0]["readinessProbes"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(unknown, K8S_VERSION, strict=True)


_GO_DURATION = re.compile(r"^(\d+h)?(\d+m)?(\d+s)?$")
_USAGES = {"digital signature", "key encipherment", "server auth", "client auth", "cert sign", "crl sign"}


def _hours(duration: str) -> float:
    m = _GO_DURATION.match(duration)
    assert m and duration, f"{duration!r} is not a Go duration in h/m/s"
    h, mi, s = (int(g[:-1]) if g else 0 for g in m.groups())
    return h + mi / 60 + s / 3600


def test_cert_manager_objects_shape() -> None:
    """
    The cert-manager Issuers and Certificates (custom resources, so not in
    the Kubernetes schemas) use only cert-manager v1 fields with valid
    values, and form a chain: self-signed Issuer -> CA Certificate -> CA
    Issuer -> amp's Certificate.
    """
    objs = objects("cert-manager")
    issuers = {name: d for (kind, name), d in objs.items() if kind == "Issuer"}
    certificates = {name: d for (kind, name), d in objs.items() if kind == "Certificate"}
    for doc in list(issuers.values()) + list(certificates.values()):
        assert doc["apiVersion"] == CERT_MANAGER
        assert set(doc) == {"apiVersion", "kind", "metadata", "spec"}
        assert set(doc["metadata"]) <= {"name", "namespace", "labels", "annotations"}
        assert doc["metadata"]["namespace"] == "amp-system"
    for name, issuer in issuers.items():
        spec = issuer["spec"]
        assert len(spec) == 1 and set(spec) <= {"selfSigned", "ca"}, f"Issuer {name}: one issuer type"
        if "ca" in spec:
            assert set(spec["ca"]) == {"secretName"}
    for name, cert in certificates.items():
        spec = cert["spec"]
        assert set(spec) <= {
            "secretName",
            "dnsNames",
            "isCA",
            "commonName",
            "duration",
            "renewBefore",
            "privateKey",
            "usages",
            "issuerRef",
        }, name
        assert spec["secretName"]
        assert _hours(spec["renewBefore"]) < _hours(spec["duration"]), name
        key = spec["privateKey"]
        assert set(key) <= {"algorithm", "size", "rotationPolicy", "encoding"}
        assert key["algorithm"] in ("RSA", "ECDSA", "Ed25519")
        assert key["rotationPolicy"] in ("Never", "Always")
        assert set(spec.get("usages", [])) <= _USAGES
        ref = spec["issuerRef"]
        assert ref["group"] == "cert-manager.io" and ref["kind"] == "Issuer"
        assert ref["name"] in issuers, f"Certificate {name} refers to a missing Issuer {ref['name']}"

    [ca] = [c for c in certificates.values() if c["spec"].get("isCA")]
    assert "selfSigned" in issuers[ca["spec"]["issuerRef"]["name"]]["spec"]
    assert ca["spec"]["privateKey"]["rotationPolicy"] == "Never", "a renewed CA must keep its key"
    ca_issuers = [
        n for n, i in issuers.items() if i["spec"].get("ca", {}).get("secretName") == ca["spec"]["secretName"]
    ]
    assert len(ca_issuers) == 1
    serving = certificates["amp-tls"]["spec"]
    assert serving["issuerRef"]["name"] == ca_issuers[0]
    assert not serving.get("isCA")
    assert "server auth" in serving["usages"]


# ---------------------------------------------------------------- kustomize layout


@pytest.mark.parametrize("directory", [*BUILDS, "managed"])
def test_kustomization_lists_every_manifest(directory: str) -> None:
    here = DEPLOY / directory
    kustomization = yaml.safe_load((here / "kustomization.yaml").read_text())
    assert kustomization["apiVersion"] == "kustomize.config.k8s.io/v1beta1"
    assert kustomization["kind"] == "Kustomization"
    files = {e for e in kustomization["resources"] if not (here / e).is_dir()}
    generated = {f for g in kustomization.get("configMapGenerator", []) for f in g["files"]}
    patches = {p["path"] for p in kustomization.get("patches", [])}
    assert files | generated | patches == {
        p.name for p in here.iterdir() if p.suffix in (".yaml", ".json") and p.name != "kustomization.yaml"
    }
    dirs = [e for e in kustomization["resources"] if (here / e).is_dir()]
    assert dirs == (
        ["../base"] if directory in (*OVERLAYS, "managed") else ["../cert-manager"] if directory == "tracing" else []
    )


def test_amp_yaml_is_generated_so_an_edit_rolls_the_deployment(tmp_path: Path) -> None:
    """
    amp's ConfigMap comes from deploy/base/amp.yaml through kustomize's
    configMapGenerator: its name carries a hash of the content and the
    Deployment's volume follows it, so a changed amp.yaml is a changed Pod
    template (a rollout), never a silent swap under running replicas.
    """
    copy_ = tmp_path / "deploy"
    shutil.copytree(DEPLOY, copy_, ignore=shutil.ignore_patterns("chart"))

    def configmap_and_reference(root: Path) -> tuple[str, str]:
        docs = kustomize_build(root / "cert-manager")
        [configmap] = [d for d in docs if d["kind"] == "ConfigMap"]
        [deployment] = [d for d in docs if d["kind"] == "Deployment"]
        [volume] = [v for v in deployment["spec"]["template"]["spec"]["volumes"] if "projected" in v]
        [ref] = [s["configMap"]["name"] for s in volume["projected"]["sources"] if "configMap" in s]
        return configmap["metadata"]["name"], ref

    before, ref_before = configmap_and_reference(copy_)
    assert before == ref_before and re.fullmatch(r"amp-[a-z0-9]{10}", before)
    path = copy_ / "base" / "amp.yaml"
    path.write_text(path.read_text().replace("level: info", "level: debug"))
    after, ref_after = configmap_and_reference(copy_)
    assert after == ref_after != before


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_has_everything_an_installation_needs(overlay: str) -> None:
    kinds = sorted(kind for kind, _ in objects(overlay))
    expected = [
        "ClusterRole",
        "ClusterRoleBinding",
        "ConfigMap",
        "Deployment",
        "MutatingWebhookConfiguration",
        "Namespace",
        "PodDisruptionBudget",
        "Role",
        "RoleBinding",
        "Service",
        "ServiceAccount",
    ]
    if overlay == "cert-manager":
        expected += ["Certificate", "Certificate", "Issuer", "Issuer"]
    assert kinds == sorted(expected)
    for (kind, name), doc in objects(overlay).items():
        if kind not in ("Namespace", "ClusterRole", "ClusterRoleBinding", "MutatingWebhookConfiguration"):
            assert doc["metadata"].get("namespace") == "amp-system", f"{kind}/{name}"


# ---------------------------------------------------------------- RBAC


def test_rbac_is_exactly_least_privilege() -> None:
    """
    Read-only access to namespaces and to amp's own
    MutatingWebhookConfiguration (by name); for the bypassed-Pod report,
    list/watch of Pods, create of Events, and its Lease in amp's own
    namespace (by name once it exists); nothing else anywhere in deploy/:
    no other role, no other verb, no wildcard.
    """

    def rules_of(role: dict[str, Any]) -> list[tuple]:
        for rule in role["rules"]:
            assert set(rule) <= {"apiGroups", "resources", "verbs", "resourceNames"}, "no nonResourceURLs"
        return sorted(
            (tuple(r["apiGroups"]), tuple(r["resources"]), tuple(sorted(r["verbs"])), tuple(r.get("resourceNames", ())))
            for r in role["rules"]
        )

    roles = [d for d in all_docs() if d["kind"] in ("ClusterRole", "Role")]
    assert sorted(r["kind"] for r in roles) == ["ClusterRole", "Role"], [r["metadata"]["name"] for r in roles]
    by_kind = {r["kind"]: r for r in roles}
    webhook = only("cert-manager", "MutatingWebhookConfiguration")["metadata"]["name"]
    assert rules_of(by_kind["ClusterRole"]) == [
        (("",), ("events",), ("create",), ()),
        (("",), ("namespaces",), ("get", "list", "watch"), ()),
        (("",), ("pods",), ("list", "watch"), ()),
        (("admissionregistration.k8s.io",), ("mutatingwebhookconfigurations",), ("get", "list", "watch"), (webhook,)),
    ]
    config = amp_yaml()
    assert config.kubernetes.webhook_configuration == webhook, "amp watches the one it may read"
    assert rules_of(by_kind["Role"]) == [
        (("coordination.k8s.io",), ("leases",), ("create",), ()),
        (("coordination.k8s.io",), ("leases",), ("get", "update"), (config.kubernetes.bypass.lease_name,)),
    ]
    account = only("cert-manager", "ServiceAccount")
    assert by_kind["Role"]["metadata"]["namespace"] == account["metadata"]["namespace"], "amp's own namespace"
    assert config.kubernetes.bypass.enabled and config.kubernetes.bypass.lease_namespace is None, (
        "the report is on, its Lease in the namespace amp runs in"
    )

    bindings = [d for d in all_docs() if d["kind"] in ("ClusterRoleBinding", "RoleBinding")]
    assert sorted(b["kind"] for b in bindings) == ["ClusterRoleBinding", "RoleBinding"]
    for binding in bindings:
        kind = binding["kind"].removesuffix("Binding")
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": kind,
            "name": by_kind[kind]["metadata"]["name"],
        }
        assert binding["subjects"] == [
            {
                "kind": "ServiceAccount",
                "name": account["metadata"]["name"],
                "namespace": account["metadata"]["namespace"],
            }
        ]
    assert pod_spec()["serviceAccountName"] == account["metadata"]["name"]


def _granted(roles: Iterator[dict[str, Any]]) -> set[tuple[str, str, str, str]]:
    """(ClusterRole or Role, resource, verb, resource name or "") for every grant of C{roles}."""
    return {
        (role["kind"], resource, verb, name)
        for role in roles
        for rule in role["rules"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
        for name in rule.get("resourceNames") or ("",)
    }


def test_the_security_notes_name_every_grant() -> None:
    """
    docs/operations.md's RBAC table names every resource and verb that
    deploy/ (kustomize) and the chart (helm, bypass report on and off)
    grant, by name where a grant is by name, and nothing they do not.
    """
    text = (ROOT / "docs" / "operations.md").read_text()
    notes = text[text.index("## Security notes") :]
    documented: set[tuple[str, str, str, str]] = set()
    with_report: set[tuple[str, str, str, str]] = set()
    managed: set[tuple[str, str, str, str]] = set()
    for line in notes.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.strip().startswith("| `") else []
        if len(cells) != 4:
            continue
        resource, *names = re.findall(r"`([^`]+)`", cells[0])
        kind = "ClusterRole" if cells[2].startswith("cluster") else "Role"
        assert cells[2].startswith(("cluster", "amp's namespace")), cells[2]
        rows = {(kind, resource, verb, name) for verb in re.findall(r"`([^`]+)`", cells[1]) for name in names or [""]}
        if "managed registration" in cells[3] and "bypass report" not in cells[3]:
            managed |= rows
            continue
        documented |= rows
        if "bypass report" in cells[3] or resource == "leases":
            with_report |= rows
    assert documented and managed, "the RBAC table is in the security notes"
    roles = [d for d in all_docs() if d["kind"] in ("ClusterRole", "Role")]
    assert _granted(iter(roles)) == documented
    chart = [d for d in helm_template() if d["kind"] in ("ClusterRole", "Role")]
    assert _granted(iter(chart)) == documented
    # the managed mode's grants, only in its overlay and with its chart value
    in_overlay = [d for d in build("managed") if d["kind"] in ("ClusterRole", "Role")]
    assert _granted(iter(in_overlay)) == documented | managed
    on = [
        d
        for d in helm_template("--set", "registration.managed=true", "--set", "certManager.enabled=false")
        if d["kind"] in ("ClusterRole", "Role")
    ]
    assert _granted(iter(on)) == documented | managed
    # the Lease stays granted for the managed mode without the bypass report
    alone = [
        d
        for d in helm_template(
            "--set",
            "registration.managed=true",
            "--set",
            "certManager.enabled=false",
            "--set",
            "config.kubernetes.bypass.enabled=false",
        )
        if d["kind"] in ("ClusterRole", "Role")
    ]
    leases = {g for g in with_report if g[1] == "leases"}
    assert _granted(iter(alone)) == (documented - with_report) | leases | managed
    off = [
        d
        for d in helm_template("--set", "config.kubernetes.bypass.enabled=false")
        if d["kind"] in ("ClusterRole", "Role")
    ]
    assert _granted(iter(off)) == documented - with_report


# ---------------------------------------------------------------- amp.yaml


def test_configmap_amp_yaml_loads_for_in_cluster_use() -> None:
    config = amp_yaml()
    webhook = only("cert-manager", "MutatingWebhookConfiguration")
    assert config.kubernetes.source == "cluster"
    assert config.kubernetes.webhook_configuration == webhook["metadata"]["name"]
    assert config.kubernetes.webhook_name == webhook["webhooks"][0]["name"]
    assert config.failure_policy == "auto"
    assert config.log.format == "json"
    assert config.metrics.port == 9090
    assert config.listen.interface == config.metrics.interface == "0.0.0.0"
    assert config.deadline.default_timeout == webhook["webhooks"][0]["timeoutSeconds"]
    assert config.endpoints.defaults.timeout < config.deadline.default_timeout - config.deadline.margin
    for pattern in config.endpoints.allow:
        assert pattern.host.endswith((".svc", ".svc.cluster.local")), f"{pattern.text} is not in-cluster"
        assert pattern.scheme in ("http", "https")


def test_the_tracing_overlay_is_cert_manager_with_tracing_on() -> None:
    """deploy/tracing: the cert-manager installation, amp's config the same but for its tracing section."""
    traced = objects("tracing")
    plain = objects("cert-manager")
    assert {kind for kind, _ in traced} == {kind for kind, _ in plain}
    [config_map] = [d for (k, _), d in traced.items() if k == "ConfigMap"]
    config = parse_config(yaml.safe_load(config_map["data"]["amp.yaml"]))
    assert config.tracing.enabled and config.tracing.endpoint and config.tracing.sampling_ratio == 0.01
    assert dataclasses.replace(config, tracing=amp_yaml().tracing) == amp_yaml()
    # The Deployment mounts the replaced ConfigMap, and names its Pod in the spans' resource.
    [deployment] = [d for (k, _), d in traced.items() if k == "Deployment"]
    mounted = json.dumps(deployment["spec"]["template"]["spec"]["volumes"])
    assert f'"{config_map["metadata"]["name"]}"' in mounted
    env = {e["name"]: e for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["OTEL_RESOURCE_ATTRIBUTES"]["value"] == "k8s.pod.name=$(POD_NAME),k8s.namespace.name=$(POD_NAMESPACE)"
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"


def test_config_paths_and_ports_match_the_deployment() -> None:
    """
    What amp.yaml says and what the Deployment provides agree: the
    container ports, the config file and the certificate files that the
    projected volume puts under /etc/amp.
    """
    config = amp_yaml()
    c = container()
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {
        "webhook": config.listen.port,
        "metrics": config.metrics.port,
    }
    assert (config.listen.port, config.metrics.port) == (8443, 9090)
    [mount] = [m for m in c["volumeMounts"] if m["mountPath"] == "/etc/amp"]
    assert mount["readOnly"] is True
    [volume] = [v for v in pod_spec()["volumes"] if v["name"] == mount["name"]]
    files = {}
    for source in volume["projected"]["sources"]:
        [(kind, ref)] = source.items()
        for item in ref["items"]:
            files[f"{mount['mountPath']}/{item['path']}"] = (kind, ref["name"], item["key"])
    configmap = only("cert-manager", "ConfigMap")
    certificate = objects("cert-manager")[("Certificate", "amp-tls")]
    assert files == {
        "/etc/amp/amp.yaml": ("configMap", configmap["metadata"]["name"], "amp.yaml"),
        config.tls.cert: ("secret", certificate["spec"]["secretName"], "tls.crt"),
        config.tls.key: ("secret", certificate["spec"]["secretName"], "tls.key"),
    }
    assert c["command"] == ["twistd", "--nodaemon", "--pidfile=", "amp", "--config", "/etc/amp/amp.yaml"]


# ---------------------------------------------------------------- Deployment, Service, PDB


def test_deployment_is_highly_available_and_locked_down() -> None:
    deployment = only("cert-manager", "Deployment")
    spec = deployment["spec"]
    assert spec["replicas"] == 2
    assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    template_labels = spec["template"]["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= template_labels.items()
    pod = pod_spec()
    keys = {t["topologyKey"]: t for t in pod["topologySpreadConstraints"]}
    assert keys["kubernetes.io/hostname"]["whenUnsatisfiable"] == "DoNotSchedule"
    assert keys["topology.kubernetes.io/zone"]["whenUnsatisfiable"] == "ScheduleAnyway"
    for t in keys.values():
        assert t["labelSelector"]["matchLabels"].items() <= template_labels.items()

    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 65532
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    c = container()
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["runAsNonRoot"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    for kind in ("requests", "limits"):
        assert set(c["resources"][kind]) == {"cpu", "memory"}

    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        get = c[probe]["httpGet"]
        assert (get["path"], get["port"], get["scheme"]) == (path, "webhook", "HTTPS"), probe


def test_rollout_gives_amp_time_to_drain() -> None:
    """
    A terminating replica keeps serving through preStop, then drains for up
    to listen.drain_timeout (every review in flight answered): the kubelet's
    grace period covers both, so it never kills amp with reviews in flight.
    """
    command = container()["lifecycle"]["preStop"]["exec"]["command"]
    match = re.fullmatch(r"import time; time\.sleep\((\d+)\)", command[-1])
    assert command[:2] == ["python", "-c"] and match, command
    pre_stop = int(match.group(1))
    assert pod_spec()["terminationGracePeriodSeconds"] >= pre_stop + amp_yaml().listen.drain_timeout + 1


def test_service_and_pdb_select_the_pods() -> None:
    template_labels = only("cert-manager", "Deployment")["spec"]["template"]["metadata"]["labels"]
    service = only("cert-manager", "Service")
    assert service["spec"]["selector"].items() <= template_labels.items()
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    assert (ports["https"]["port"], ports["https"]["targetPort"]) == (443, "webhook")
    assert ports["metrics"]["targetPort"] == "metrics"
    pdb = only("cert-manager", "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= template_labels.items()
    assert POD_LABELS.items() <= template_labels.items()


# ---------------------------------------------------------------- the webhook registration


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_webhook_registration(overlay: str) -> None:
    """One entry per failure class, alike but for their name, policy and class expression."""
    mwc = only(overlay, "MutatingWebhookConfiguration")
    assert mwc["metadata"]["name"] == "amp.txn2.com"
    entries = {hook["failurePolicy"]: hook for hook in mwc["webhooks"]}
    assert {p: h["name"] for p, h in entries.items()} == {
        "Ignore": "ignore.mutate.amp.txn2.com",
        "Fail": "fail.mutate.amp.txn2.com",
    }
    assert amp_yaml().kubernetes.webhook_name == "ignore.mutate.amp.txn2.com", "auto follows the unlabelled's entry"
    for policy, hook in entries.items():
        selector = hook["namespaceSelector"]
        assert selector["matchLabels"] == {"amp.txn2.com/enabled": "true"}
        names, chosen = selector["matchExpressions"]
        assert names["key"] == "kubernetes.io/metadata.name"
        assert names["operator"] == "NotIn"
        assert sorted(names["values"]) == ["amp-system", "kube-system"]
        assert chosen == {
            "key": "amp.txn2.com/failure-class",
            "operator": "NotIn" if policy == "Ignore" else "In",
            "values": ["Fail"],
        }
        assert hook["rules"] == [
            {
                "operations": ["CREATE"],
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "resources": ["pods"],
                "scope": "Namespaced",
            }
        ]
        assert hook["sideEffects"] == "None"
        assert hook["admissionReviewVersions"] == ["v1", "v1beta1"]
        assert hook["timeoutSeconds"] == 10
        assert hook["matchPolicy"] == "Equivalent"
        assert hook["reinvocationPolicy"] == "Never"
        service = only(overlay, "Service")
        assert hook["clientConfig"]["service"] == {
            "name": service["metadata"]["name"],
            "namespace": service["metadata"]["namespace"],
            "path": "/mutate",
            "port": 443,
        }


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a Kubernetes label selector matches an object with C{labels}."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for e in selector.get("matchExpressions", []):
        key, op, values = e["key"], e["operator"], e.get("values", [])
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_webhook_selectors_protect_the_cluster_and_let_pods_opt_out(overlay: str) -> None:
    """
    The API server asks amp only about Pods in namespaces labelled enabled,
    never in amp's own namespace or kube-system even when labelled (a
    webhook that must answer before its own Pods start would lock the
    cluster out of recovering), and never about a Pod labelled
    amp.txn2.com/enabled: "false".
    """
    hooks = only(overlay, "MutatingWebhookConfiguration")["webhooks"]
    config = amp_yaml()
    enabled = {config.kubernetes.enabled_label: config.kubernetes.enabled_value}
    amp_namespace = only(overlay, "Deployment")["metadata"]["namespace"]
    label = config.kubernetes.failure_class_label
    assert label is not None

    def sending(name: str, labels: dict[str, str]) -> list[str]:
        """The failure policies of the entries that send this namespace's Pods to amp."""
        labels = {"kubernetes.io/metadata.name": name, **labels}
        return [h["failurePolicy"] for h in hooks if selects(h["namespaceSelector"], labels)]

    # each enabled namespace by exactly the entry of its class
    assert sending("team-a", enabled) == ["Ignore"]
    assert sending("team-a", {**enabled, label: "Ignore"}) == ["Ignore"]
    assert sending("team-a", {**enabled, label: "Fail"}) == ["Fail"]
    assert sending("team-a", {**enabled, label: "fail"}) == ["Ignore"]
    assert sending("team-b", {label: "Fail"}) == []
    assert sending("team-c", {config.kubernetes.enabled_label: "false", label: "Fail"}) == []
    for chosen in ({}, {label: "Fail"}, {label: "Ignore"}):
        assert sending(amp_namespace, {**enabled, **chosen}) == []
        assert sending("kube-system", {**enabled, **chosen}) == []

    for hook in hooks:
        pods = hook["objectSelector"]
        assert selects(pods, {})
        assert selects(pods, {"app": "web", "amp.txn2.com/enabled": "true"})
        assert not selects(pods, {"app": "web", "amp.txn2.com/enabled": "false"})


def test_cert_manager_injects_the_ca_of_the_serving_certificate() -> None:
    objs = objects("cert-manager")
    mwc = only("cert-manager", "MutatingWebhookConfiguration")
    annotation = mwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
    assert annotation == "amp-system/amp-tls"
    namespace, name = annotation.split("/")
    certificate = objs[("Certificate", name)]
    assert certificate["metadata"]["namespace"] == namespace
    service = only("cert-manager", "Service")
    svc = f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
    assert svc in certificate["spec"]["dnsNames"], "the API server verifies this name"
    assert all("caBundle" not in hook["clientConfig"] for hook in mwc["webhooks"])


def test_no_cert_manager_variant_has_a_ca_bundle_placeholder() -> None:
    with_cm = only("cert-manager", "MutatingWebhookConfiguration")
    without = only("no-cert-manager", "MutatingWebhookConfiguration")
    [placeholder] = {hook["clientConfig"]["caBundle"] for hook in without["webhooks"]}
    assert placeholder == CA_PLACEHOLDER
    with pytest.raises(binascii.Error):
        base64.b64decode(placeholder, validate=True)  # the API server refuses it unreplaced
    assert "annotations" not in without["metadata"]
    same = copy.deepcopy(without)
    for hook in same["webhooks"]:
        del hook["clientConfig"]["caBundle"]
    expected = copy.deepcopy(with_cm)
    del expected["metadata"]["annotations"]
    assert same == expected, "the two registrations differ only in where the CA comes from"


# ---------------------------------------------------------------- install.sh


FAKE_KUBECTL = textwrap.dedent('''\
    #!{python}
    """A stand-in for kubectl: records what would be applied as JSON lines."""
    import base64, json, os, subprocess, sys
    from pathlib import Path
    import yaml

    log = Path(os.environ["FAKE_KUBECTL_LOG"])
    args = sys.argv[1:]

    def record(text):
        with log.open("a") as f:
            for doc in yaml.safe_load_all(text):
                if doc:
                    f.write(json.dumps(doc) + "\\n")

    def build(directory):
        return subprocess.run([os.environ["FAKE_KUBECTL_KUSTOMIZE"], "build", str(directory)],
                              check=True, capture_output=True, text=True).stdout

    if args[:2] == ["apply", "-f"]:
        record(sys.stdin.read() if args[2] == "-" else Path(args[2]).read_text())
    elif args[:2] == ["apply", "-k"]:
        record(build(Path(args[2])))
    elif args[:5] == ["-n", "amp-system", "create", "secret", "generic"]:
        assert "--dry-run=client" in args and args[-2:] == ["-o", "yaml"], args
        data, kind = {{}}, "Opaque"
        for a in args[6:]:
            if a.startswith("--type="):
                kind = a.split("=", 1)[1]
            elif a.startswith("--from-file="):
                key, path = a.split("=", 2)[1:]
                data[key] = base64.b64encode(Path(path).read_bytes()).decode()
        print(yaml.safe_dump({{"apiVersion": "v1", "kind": "Secret", "type": kind, "data": data,
                              "metadata": {{"name": args[5], "namespace": "amp-system"}}}}))
    else:
        sys.exit("fake kubectl: unexpected arguments %r" % (args,))
''')


def test_install_script_without_cert_manager(tmp_path: Path) -> None:
    """
    install.sh makes the certificate with amp_dev.devcert, creates the Secret
    the Deployment mounts, applies the base, and registers the webhook with
    a caBundle that verifies the serving certificate for the Service name.
    """
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    kubectl = bin_dir / "kubectl"
    kubectl.write_text(FAKE_KUBECTL.format(python=sys.executable))
    kubectl.chmod(0o755)
    log = tmp_path / "applied.jsonl"
    env = dict(
        os.environ,
        PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        PYTHON=sys.executable,
        PYTHONPATH=str(ROOT),
        FAKE_KUBECTL_LOG=str(log),
        FAKE_KUBECTL_KUSTOMIZE=tool("kustomize"),
    )
    tls_dir = tmp_path / "amp-tls"
    result = subprocess.run(
        ["sh", str(DEPLOY / "no-cert-manager" / "install.sh"), str(tls_dir)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    applied = [json.loads(line) for line in log.read_text().splitlines()]
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for doc in applied:
        by_kind.setdefault(doc["kind"], []).append(doc)

    assert {d["kind"] for d in build("base")} <= set(by_kind)
    [secret] = by_kind["Secret"]
    projected = [
        s["secret"]["name"]
        for v in pod_spec()["volumes"]
        if "projected" in v
        for s in v["projected"]["sources"]
        if "secret" in s
    ]
    assert secret["metadata"]["name"] in projected
    assert secret["type"] == "kubernetes.io/tls"
    cert_pem = base64.b64decode(secret["data"]["tls.crt"])
    assert cert_pem == (tls_dir / "tls.crt").read_bytes()
    assert base64.b64decode(secret["data"]["tls.key"]) == (tls_dir / "tls.key").read_bytes()

    [mwc] = by_kind["MutatingWebhookConfiguration"]
    [bundle] = {hook["clientConfig"]["caBundle"] for hook in mwc["webhooks"]}
    ca_pem = base64.b64decode(bundle, validate=True)
    assert ca_pem == (tls_dir / "ca.crt").read_bytes()
    ca = x509.load_pem_x509_certificate(ca_pem)
    cert = x509.load_pem_x509_certificate(cert_pem)
    cert.verify_directly_issued_by(ca)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert "amp.amp-system.svc" in names

    # Run again (renewal): same CA, new serving certificate.
    log.unlink()
    result = subprocess.run(
        ["sh", str(DEPLOY / "no-cert-manager" / "install.sh"), str(tls_dir)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    again = [json.loads(line) for line in log.read_text().splitlines()]
    [secret2] = [d for d in again if d["kind"] == "Secret"]
    [mwc2] = [d for d in again if d["kind"] == "MutatingWebhookConfiguration"]
    assert mwc2["webhooks"][0]["clientConfig"]["caBundle"] == mwc["webhooks"][0]["clientConfig"]["caBundle"]
    assert secret2["data"]["tls.crt"] != secret["data"]["tls.crt"]


# ---------------------------------------------------------------- amp check in CI


@pytest.mark.parametrize("overlay", [*OVERLAYS, "managed"])
def test_each_overlay_passes_amp_check(overlay: str) -> None:
    """
    What `kubectl kustomize deploy/<overlay> | amp check --manifest -` says in
    CI: amp's config comes from the built ConfigMap, and the registration
    meets it.
    """
    import sys

    built = yaml.safe_dump_all(build(overlay))
    result = subprocess.run(
        [sys.executable, "-c", "from amp.cli import main; main()", "check", "--manifest", "-"],
        input=built,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (result.returncode, result.stdout, result.stderr) == (
        0,
        "MutatingWebhookConfiguration amp.txn2.com: no registration problem\n",
        "",
    )


# ---------------------------------------------------------------- the managed registration


def test_the_managed_overlay_is_the_base_with_amp_keeping_its_registration_and_certificates() -> None:
    """
    deploy/managed: ../base plus the managed mode without cert-manager (amp's
    config says so and names the Secret of its own certificates, no
    certificate is mounted or issued by anyone else, amp may patch its one
    configuration by name and keep that one Secret); what amp applies is
    what the overlay ships, but the caBundle amp writes itself.
    """
    from amp.registration import desired, drifted
    from amp_dev.devcert import make_ca, pem_cert

    managed, base = objects("managed"), objects("base")
    assert {k for k in set(managed) - set(base) if k[0] != "ConfigMap"} == {
        ("ClusterRole", "amp-registration"),
        ("ClusterRoleBinding", "amp-registration"),
        ("MutatingWebhookConfiguration", "amp.txn2.com"),
    }
    assert not {k for k in managed if k[0] in ("Certificate", "Issuer", "Secret")}
    config = parse_config(yaml.safe_load(only("managed", "ConfigMap")["data"]["amp.yaml"]))
    assert config.registration.managed and not amp_yaml().registration.managed
    assert config.registration.secret == "amp-certificates"
    deployment = only("managed", "Deployment")
    [volume] = [v for v in deployment["spec"]["template"]["spec"]["volumes"] if "projected" in v]
    assert [src for src in volume["projected"]["sources"] if "secret" in src] == []
    [role] = [d for d in build("managed") if d["kind"] == "Role"]
    by_name = [r for r in role["rules"] if r.get("resources") == ["secrets"] and r.get("resourceNames")]
    assert by_name == [
        {
            "apiGroups": [""],
            "resources": ["secrets"],
            "resourceNames": ["amp-certificates"],
            "verbs": ["get", "update", "patch"],
        }
    ]
    shipped = only("managed", "MutatingWebhookConfiguration")
    assert all("caBundle" not in e["clientConfig"] for e in shipped["webhooks"])
    want = desired(config, pem_cert(make_ca("ca")[0]))
    for entry in want["webhooks"]:
        del entry["clientConfig"]["caBundle"]  # amp's to apply
    assert drifted(shipped, want) is None
    service = only("managed", "Service")
    assert (config.registration.service, config.registration.service_port) == (
        service["metadata"]["name"],
        service["spec"]["ports"][0]["port"],
    )


def test_the_chart_refuses_the_managed_mode_with_cert_manager() -> None:
    result = subprocess.run(
        [
            tool("helm"),
            "template",
            "amp",
            str(DEPLOY / "chart" / "amp"),
            "--set",
            "registration.managed=true",
            "--set",
            "certManager.enabled=true",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert "registration.managed keeps amp's own CA" in result.stderr and "certManager.enabled=false" in result.stderr


def test_the_chart_applies_its_selector_requirements_in_the_managed_mode_too() -> None:
    extra = [{"key": "team", "operator": "In", "values": ["a"]}]
    docs = helm_template(
        "--set",
        "registration.managed=true",
        "--set",
        "certManager.enabled=false",
        "--set-json",
        f"webhook.namespaceSelector.matchExpressions={json.dumps(extra)}",
    )
    [configmap] = [d for d in docs if d["kind"] == "ConfigMap" and "amp.yaml" in d.get("data", {})]
    config = parse_config(yaml.safe_load(configmap["data"]["amp.yaml"]))
    assert config.registration.match_expressions == (("team", "In", ("a",)),)
