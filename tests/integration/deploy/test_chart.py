"""
Tests for the Helm chart in deploy/chart/amp: C{helm lint} passes; the
values an operator sets reach the objects they should (replicas, resources,
image, priority class, PDB, spread, the webhook's policy, timeout and
selectors); amp's configuration is structured values, rendered into amp.yaml
that amp's own loader accepts, with the keys the manifests decide set by the
chart and a checksum annotation that changes with it (so an edit rolls the
Deployment); and without cert-manager the chart's self-signed certificate
verifies against the webhook's caBundle for the Service's name.

The kustomize manifests are rendered from this chart (tests/integration/deploy/test_deploy.py
proves they equal a fresh render and validates both against the schemas).
"""

from __future__ import annotations

import base64
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from amp.config import parse_config
from tests.support.deploytools import CHART, helm_template, one, run, tool


def deployment(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return one(docs, "Deployment")


def hooks(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return one(docs, "MutatingWebhookConfiguration")["webhooks"]


def hook(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The entry of namespaces without the failure-class label (the first), the one amp's auto follows."""
    return hooks(docs)[0]


def amp_config(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return yaml.safe_load(one(docs, "ConfigMap")["data"]["amp.yaml"])


def checksum(docs: list[dict[str, Any]]) -> str:
    return deployment(docs)["spec"]["template"]["metadata"]["annotations"]["checksum/config"]


def refused(*args: str) -> str:
    """C{helm template} with C{args} fails: its standard error."""
    result = subprocess.run(
        [tool("helm"), "template", "amp", str(CHART), *args], capture_output=True, text=True, timeout=120
    )
    assert result.returncode != 0, result.stdout
    return result.stderr


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--set", "certManager.enabled=false"],
        ["--set", "monitoring.enabled=true", "--set", "namespace.create=true"],
    ],
    ids=["defaults", "self-signed", "monitoring"],
)
def test_helm_lint(args: list[str]) -> None:
    result = run([tool("helm"), "lint", str(CHART), "--strict", "--namespace", "amp-system", *args])
    assert "0 chart(s) failed" in result.stdout


def test_helm_lint_refuses_a_broken_chart(tmp_path: Path) -> None:
    """The lint above is really looking: a template that is not YAML fails it."""
    broken = tmp_path / "amp"
    shutil.copytree(CHART, broken)
    (broken / "templates" / "broken.yaml").write_text("kind: ConfigMap\nmetadata: [\n")
    result = subprocess.run(
        [tool("helm"), "lint", str(broken), "--strict"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode != 0
    assert "broken.yaml" in result.stdout + result.stderr


@pytest.mark.parametrize(
    "value, message",
    [
        ("webhook.failurePolicy=ignore", "at '/webhook/failurePolicy': value must be one of 'Ignore', 'Fail'"),
        ("webhook.timeoutSeconds=60", "at '/webhook/timeoutSeconds': maximum: got 60, want 30"),
        (
            "webhook.reinvocationPolicy=Always",
            "at '/webhook/reinvocationPolicy': value must be one of 'Never', 'IfNeeded'",
        ),
        ("replicas=0", "at '/replicas': minimum: got 0, want 1"),
        # Every level is closed, amp's config too: a misspelt key would
        # otherwise be ignored, or stop amp at start-up.
        ("replica=3", "at '': additional properties 'replica' not allowed"),
        ("config.endpoint.timeout=3s", "at '/config': additional properties 'endpoint' not allowed"),
        ("image.tga=1", "at '/image': additional properties 'tga' not allowed"),
        ("config.endpoints.timout=3s", "at '/config/endpoints': additional properties 'timout' not allowed"),
    ],
)
def test_wrong_values_are_refused_naming_the_value(value: str, message: str) -> None:
    """The chart's schema refuses a value amp or the API server would refuse later, and says which."""
    assert message in refused("--set", value)


def test_default_config_is_amp_yaml_amp_loads() -> None:
    """
    The config values render into an amp.yaml that amp's loader accepts,
    with what the manifests decide filled in by the chart: the mounted
    certificate files, the webhook configuration amp follows, and the
    default deadline equal to the webhook's timeout.
    """
    docs = helm_template()
    raw = amp_config(docs)
    config = parse_config(raw)
    h = hook(docs)
    assert (config.tls.cert, config.tls.key) == ("/etc/amp/tls/tls.crt", "/etc/amp/tls/tls.key")
    assert config.kubernetes.webhook_configuration == one(docs, "MutatingWebhookConfiguration")["metadata"]["name"]
    assert config.kubernetes.webhook_name == h["name"]
    assert config.deadline.default_timeout == h["timeoutSeconds"]
    assert config.kubernetes.source == "cluster"


def test_config_values_are_structured_and_roll_the_deployment() -> None:
    """
    One key of amp's configuration can be changed on its own (no YAML
    string to replace): the rest stays, amp's loader accepts the result,
    and the Pods' checksum annotation changes, so the Deployment rolls.
    """
    default = helm_template()
    narrowed = helm_template("--set-json", 'config.endpoints.allow=["http://*.platform.svc:8080/*"]')
    before, after = amp_config(default), amp_config(narrowed)
    assert after["endpoints"]["allow"] == ["http://*.platform.svc:8080/*"]
    assert after["endpoints"]["deny_networks"] == before["endpoints"]["deny_networks"]
    after["endpoints"]["allow"] = before["endpoints"]["allow"]
    assert after == before
    [pattern] = parse_config(amp_config(narrowed)).endpoints.allow
    assert pattern.host == "*.platform.svc"
    assert checksum(narrowed) != checksum(default)
    assert checksum(helm_template()) == checksum(default), "the same config gives the same checksum"
    # Everything else in the Pod template is the same: only the config rolled it.
    a, b = deployment(default)["spec"]["template"], deployment(narrowed)["spec"]["template"]
    del a["metadata"]["annotations"]["checksum/config"], b["metadata"]["annotations"]["checksum/config"]
    assert a == b


def test_the_chart_decides_what_the_manifests_fix() -> None:
    """
    Keys that must agree with the manifests are the chart's, whatever the
    values say: the certificate files, the webhook names, the deadline; the
    container ports follow amp's configured ports.
    """
    docs = helm_template(
        "--set",
        "config.tls.cert=/elsewhere.crt",
        "--set",
        "webhook.timeoutSeconds=7",
        "--set",
        "webhook.name=mutate.example.com",
        "--set",
        "config.listen.port=9443",
        "--set",
        "config.metrics.port=9100",
    )
    config = parse_config(amp_config(docs))
    assert config.tls.cert == "/etc/amp/tls/tls.crt"
    assert config.deadline.default_timeout == 7 == hook(docs)["timeoutSeconds"]
    assert config.kubernetes.webhook_name == "ignore.mutate.example.com" == hook(docs)["name"]
    assert [h["name"] for h in hooks(docs)] == ["ignore.mutate.example.com", "fail.mutate.example.com"]
    [c] = deployment(docs)["spec"]["template"]["spec"]["containers"]
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"webhook": 9443, "metrics": 9100}
    service = one(docs, "Service")
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == {"https": 443, "metrics": 9100}
    assert deployment(docs)["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] == "9100"


def test_workload_values() -> None:
    docs = helm_template(
        "--set",
        "replicas=3",
        "--set",
        "resources.limits.memory=512Mi",
        "--set",
        "image.repository=registry.example/amp",
        "--set",
        "image.tag=1.2.3",
        "--set",
        "priorityClassName=amp-critical",
        "--set",
        "podDisruptionBudget.minAvailable=2",
        "--set",
        "terminationGracePeriodSeconds=45",
        "--set",
        "preStopSleepSeconds=8",
        "--set-json",
        'topologySpread=[{"topologyKey":"topology.kubernetes.io/zone","maxSkew":2,"whenUnsatisfiable":"DoNotSchedule"}]',
    )
    d = deployment(docs)
    pod = d["spec"]["template"]["spec"]
    [c] = pod["containers"]
    assert d["spec"]["replicas"] == 3
    assert c["image"] == "registry.example/amp:1.2.3"
    assert c["resources"]["limits"] == {"cpu": "1", "memory": "512Mi"}
    assert pod["priorityClassName"] == "amp-critical"
    assert pod["terminationGracePeriodSeconds"] == 45
    assert c["lifecycle"]["preStop"]["exec"]["command"] == ["python", "-c", "import time; time.sleep(8)"]
    [spread] = pod["topologySpreadConstraints"]
    assert spread["maxSkew"] == 2 and spread["whenUnsatisfiable"] == "DoNotSchedule"
    assert spread["labelSelector"]["matchLabels"] == d["spec"]["selector"]["matchLabels"]
    assert spread["matchLabelKeys"] == ["pod-template-hash"]
    assert one(docs, "PodDisruptionBudget")["spec"]["minAvailable"] == 2

    digest = "sha256:" + "ab" * 32
    [c] = deployment(helm_template("--set", f"image.digest={digest}"))["spec"]["template"]["spec"]["containers"]
    assert c["image"] == f"amp@{digest}"
    [c] = deployment(helm_template())["spec"]["template"]["spec"]["containers"]
    assert c["image"] == "amp:" + yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]

    bare = helm_template("--set", "podDisruptionBudget.enabled=false", "--set", "preStopSleepSeconds=0")
    assert not [d for d in bare if d["kind"] == "PodDisruptionBudget"]
    assert "lifecycle" not in deployment(bare)["spec"]["template"]["spec"]["containers"][0]
    assert "priorityClassName" not in deployment(bare)["spec"]["template"]["spec"]


def test_grace_period_leaves_room_for_prestop_and_amps_drain() -> None:
    """
    The kubelet kills amp terminationGracePeriodSeconds after it starts
    stopping the Pod: the chart makes that preStop + amp's drain bound
    (listen.drain_timeout, amp's own default when unset) + 5 s, and refuses
    an explicit value that leaves no room for both.
    """

    def grace(*args: str) -> int:
        return deployment(helm_template(*args))["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]

    amp_default = parse_config({}).listen.drain_timeout
    assert grace() == 5 + amp_default + 5
    assert grace("--set", "config.listen.drain_timeout=1m", "--set", "preStopSleepSeconds=10") == 10 + 60 + 5
    assert grace("--set", "config.listen.drain_timeout=1500ms") == 5 + 2 + 5
    assert grace("--set", "terminationGracePeriodSeconds=120") == 120
    assert "terminationGracePeriodSeconds 30 is too short" in refused("--set", "terminationGracePeriodSeconds=30")


def test_webhook_values() -> None:
    docs = helm_template(
        "--set",
        "webhook.failurePolicy=Fail",
        "--set",
        "webhook.timeoutSeconds=5",
        "--set",
        "webhook.reinvocationPolicy=IfNeeded",
        "--set",
        "webhook.ephemeralContainers=true",
        "--set-json",
        'webhook.excludeNamespaces=["kube-system","monitoring"]',
        "--set-json",
        'webhook.namespaceSelector={"matchLabels":{"team":"a"},"matchExpressions":[{"key":"tier","operator":"Exists"}]}',
        "--set-json",
        'webhook.objectSelector={"matchExpressions":[{"key":"inject","operator":"In","values":["yes"]}]}',
        namespace="platform",
    )
    h = hook(docs)
    # Fail is the class of namespaces without the label: its entry takes
    # every namespace but those labelled Ignore, which the other entry takes
    assert (h["name"], h["failurePolicy"], h["timeoutSeconds"], h["reinvocationPolicy"]) == (
        "fail.mutate.amp.txn2.com",
        "Fail",
        5,
        "IfNeeded",
    )
    # Helm merges maps into the defaults (lists replace them): the enabled
    # label stays unless set to null.
    assert h["namespaceSelector"] == {
        "matchLabels": {"amp.txn2.com/enabled": "true", "team": "a"},
        "matchExpressions": [
            {
                "key": "kubernetes.io/metadata.name",
                "operator": "NotIn",
                "values": ["platform", "kube-system", "monitoring"],
            },
            {"key": "amp.txn2.com/failure-class", "operator": "NotIn", "values": ["Ignore"]},
            {"key": "tier", "operator": "Exists"},
        ],
    }
    other = hooks(docs)[1]
    assert (other["name"], other["failurePolicy"]) == ("ignore.mutate.amp.txn2.com", "Ignore")
    assert other["namespaceSelector"]["matchExpressions"][1] == {
        "key": "amp.txn2.com/failure-class",
        "operator": "In",
        "values": ["Ignore"],
    }
    assert {k: v for k, v in other.items() if k not in ("name", "failurePolicy", "namespaceSelector")} == {
        k: v for k, v in h.items() if k not in ("name", "failurePolicy", "namespaceSelector")
    }
    assert parse_config(amp_config(docs)).kubernetes.webhook_name == "fail.mutate.amp.txn2.com"
    assert h["objectSelector"] == {"matchExpressions": [{"key": "inject", "operator": "In", "values": ["yes"]}]}
    assert [r["resources"] for r in h["rules"]] == [["pods"], ["pods/ephemeralcontainers"]]
    assert h["rules"][1]["operations"] == ["UPDATE"]
    assert h["clientConfig"]["service"] == {"name": "amp", "namespace": "platform", "path": "/mutate", "port": 443}
    assert parse_config(amp_config(docs)).deadline.default_timeout == 5

    default = hook(helm_template())
    assert [r["resources"] for r in default["rules"]] == [["pods"]]


def test_release_name_and_namespace_name_everything() -> None:
    """Another release name or namespace renames the objects consistently."""
    docs = helm_template(release="hooks", namespace="webhooks")
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert ("Deployment", "hooks-amp") in names and ("Certificate", "hooks-amp-tls") in names
    mwc = one(docs, "MutatingWebhookConfiguration")
    assert mwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == "webhooks/hooks-amp-tls"
    certificate = [d for d in docs if d["kind"] == "Certificate" and d["metadata"]["name"] == "hooks-amp-tls"][0]
    assert "hooks-amp.webhooks.svc" in certificate["spec"]["dnsNames"]
    binding = one(docs, "ClusterRoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "hooks-amp", "namespace": "webhooks"}]
    for d in docs:
        if d["kind"] not in ("ClusterRole", "ClusterRoleBinding", "MutatingWebhookConfiguration"):
            assert d["metadata"]["namespace"] == "webhooks", d["kind"]
    assert not [d for d in docs if d["kind"] == "Namespace"], "helm install --create-namespace makes it"


def test_self_signed_certificate_verifies_for_the_service() -> None:
    """
    Without cert-manager the chart makes a CA and a serving certificate:
    the webhook's caBundle is the CA, which signed the certificate in the
    Secret the Deployment mounts, for the Service's DNS name, with its key.
    """
    docs = helm_template("--set", "certManager.enabled=false")
    assert not [d for d in docs if d["apiVersion"].startswith("cert-manager.io")]
    secrets = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Secret"}
    assert set(secrets) == {"amp-ca", "amp-tls"}
    tls = {k: base64.b64decode(v) for k, v in secrets["amp-tls"]["data"].items()}
    ca_pem = base64.b64decode(hook(docs)["clientConfig"]["caBundle"], validate=True)
    assert tls["ca.crt"] == ca_pem == base64.b64decode(secrets["amp-ca"]["data"]["tls.crt"])

    ca = x509.load_pem_x509_certificate(ca_pem)
    cert = x509.load_pem_x509_certificate(tls["tls.crt"])
    cert.verify_directly_issued_by(ca)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    service = one(docs, "Service")
    assert f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc" in names
    key = serialization.load_pem_private_key(tls["tls.key"], password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    assert key.public_key().public_numbers() == cert.public_key().public_numbers()

    [volume] = [v for v in deployment(docs)["spec"]["template"]["spec"]["volumes"] if "projected" in v]
    assert "amp-tls" in [s["secret"]["name"] for s in volume["projected"]["sources"] if "secret" in s]


def test_a_given_ca_bundle_is_used_as_is() -> None:
    """With selfSigned.caBundle (your own Secret), the chart makes no Secret and registers that CA."""
    docs = helm_template("--set", "certManager.enabled=false", "--set", "selfSigned.caBundle=Q0E=")
    assert not [d for d in docs if d["kind"] == "Secret"]
    assert hook(docs)["clientConfig"]["caBundle"] == "Q0E="
    assert "annotations" not in one(docs, "MutatingWebhookConfiguration")["metadata"]


@pytest.mark.parametrize("value", ["config.endpoints.timeout=soon", "config.listen.port=http", "config.workers=0"])
def test_config_values_amp_would_refuse_are_refused(value: str) -> None:
    assert "values don't meet the specifications of the schema" in refused("--set", value)


def test_standard_labels_on_every_object() -> None:
    from amp import __version__

    for d in helm_template():
        labels = d["metadata"]["labels"]
        assert labels["helm.sh/chart"] == f"amp-{__version__}", d["kind"]
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["app.kubernetes.io/version"] == __version__
        assert labels["app.kubernetes.io/name"] == "amp"


def test_name_overrides() -> None:
    docs = helm_template("--set", "fullnameOverride=foo")
    assert deployment(docs)["metadata"]["name"] == "foo"
    assert one(docs, "Service")["metadata"]["name"] == "foo"
    renamed = helm_template("--set", "nameOverride=mutator", release="team")
    dep = deployment(renamed)
    assert dep["metadata"]["name"] == "team-mutator"
    assert dep["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"] == "mutator"
    assert dep["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"] == "mutator"
    assert one(renamed, "Service")["spec"]["selector"]["app.kubernetes.io/name"] == "mutator"


def test_no_autoscaler_by_default() -> None:
    docs = helm_template()
    assert not [d for d in docs if d["kind"] == "HorizontalPodAutoscaler"]
    assert deployment(docs)["spec"]["replicas"] == 2


def test_the_autoscaler_replaces_the_fixed_replicas() -> None:
    docs = helm_template(
        "--set",
        "autoscaling.enabled=true",
        "--set",
        "config.workers=2",
        "--set",
        "resources.requests.cpu=1",
        "--set",
        "resources.limits.cpu=2",
    )
    hpa = one(docs, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "amp"}
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 6)
    assert hpa["spec"]["metrics"][0]["resource"]["target"] == {"type": "Utilization", "averageUtilization": 70}
    assert "replicas" not in deployment(docs)["spec"]


@pytest.mark.parametrize(
    "args, message",
    [
        # 70% of 2 cores is 1.4 cores: one worker uses at most one.
        (["--set", "resources.requests.cpu=2"], "which one Pod never reaches: it uses at most 1000m (config.workers 1"),
        (
            ["--set", "resources.requests.cpu=1", "--set", "config.workers=4", "--set", "resources.limits.cpu=500m"],
            "it uses at most 500m",
        ),
        (["--set", "autoscaling.minReplicas=1"], "podDisruptionBudget.minAvailable 1 would let no replica be evicted"),
        (["--set", "autoscaling.minReplicas=7"], "autoscaling.minReplicas 7 is above autoscaling.maxReplicas 6"),
    ],
    ids=["above-one-worker", "above-the-limit", "pdb", "min-above-max"],
)
def test_an_autoscaler_that_cannot_work_is_refused(args: list[str], message: str) -> None:
    assert message in refused("--set", "autoscaling.enabled=true", *args)


def test_an_autoscaler_lints_strictly() -> None:
    result = run(
        [tool("helm"), "lint", str(CHART), "--strict", "--namespace", "amp-system", "--set", "autoscaling.enabled=true"]
    )
    assert "0 chart(s) failed" in result.stdout


# ---------------------------------------------------------------- failure classes and amp check


def amp_check(rendered: str, *args: str) -> tuple[int, str]:
    """C{amp check --manifest -} on C{rendered}: its status and output."""
    import sys

    result = subprocess.run(
        [sys.executable, "-c", "from amp.cli import main; main()", "check", "--manifest", "-", *args],
        input=rendered,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return result.returncode, result.stdout + result.stderr


def rendered(*args: str) -> str:
    result = subprocess.run(
        [tool("helm"), "template", "amp", str(CHART), "--namespace", "amp-system", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return result.stdout


def test_one_entry_per_failure_class_by_default() -> None:
    docs = helm_template()
    entries = {h["name"]: h for h in hooks(docs)}
    assert {n: h["failurePolicy"] for n, h in entries.items()} == {
        "ignore.mutate.amp.txn2.com": "Ignore",
        "fail.mutate.amp.txn2.com": "Fail",
    }
    kube = parse_config(amp_config(docs)).kubernetes
    assert (kube.failure_class_label, kube.webhook_name) == ("amp.txn2.com/failure-class", "ignore.mutate.amp.txn2.com")
    assert entries["fail.mutate.amp.txn2.com"]["namespaceSelector"]["matchExpressions"][1] == {
        "key": "amp.txn2.com/failure-class",
        "operator": "In",
        "values": ["Fail"],
    }


def test_the_single_entry_mode() -> None:
    docs = helm_template("--set", "webhook.failureClasses.enabled=false", "--set", "webhook.failurePolicy=Fail")
    [h] = hooks(docs)
    assert (h["name"], h["failurePolicy"]) == ("mutate.amp.txn2.com", "Fail")
    assert [e["key"] for e in h["namespaceSelector"]["matchExpressions"]] == ["kubernetes.io/metadata.name"]
    kube = parse_config(amp_config(docs)).kubernetes
    assert (kube.failure_class_label, kube.webhook_name) == (None, "mutate.amp.txn2.com")


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--set", "webhook.failurePolicy=Fail"],
        ["--set", "webhook.failureClasses.enabled=false"],
        [
            "--set",
            "webhook.ephemeralContainers=true",
            "--set",
            "config.ephemeral_containers=true",
            "--set",
            "webhook.timeoutSeconds=20",
            "--set-json",
            'webhook.excludeNamespaces=["kube-system","monitoring"]',
        ],
    ],
)
def test_every_rendering_passes_amp_check(args: list[str]) -> None:
    """What the chart renders is what amp's own check needs: CI can run amp check on it."""
    status, out = amp_check(rendered(*args))
    assert (status, out) == (0, "MutatingWebhookConfiguration amp.txn2.com: no registration problem\n")


def test_amp_check_names_what_a_values_change_breaks() -> None:
    status, out = amp_check(rendered("--set", "webhook.timeoutSeconds=3"))
    assert status == 1
    assert (
        "timeout-below-endpoints: entry fail.mutate.amp.txn2.com: timeoutSeconds 3 less deadline.margin 0.5s "
        "leaves amp 2.5s, less than endpoints.timeout 5s" in out
    )


def test_the_self_signed_ca_bundle_verifies_the_served_certificate(tmp_path: Path) -> None:
    """amp check --cert with the chart's own Secret: the caBundle verifies it."""
    text = rendered("--set", "certManager.enabled=false")
    [secret] = [
        d for d in yaml.safe_load_all(text) if d and d["kind"] == "Secret" and d["metadata"]["name"] == "amp-tls"
    ]
    (tmp_path / "tls.crt").write_bytes(base64.b64decode(secret["data"]["tls.crt"]))
    assert amp_check(text, "--cert", str(tmp_path / "tls.crt")) == (
        0,
        "MutatingWebhookConfiguration amp.txn2.com: no registration problem\n",
    )
