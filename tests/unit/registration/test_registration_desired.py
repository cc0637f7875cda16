"""
The MutatingWebhookConfiguration the managed mode applies
(amp.registration.desired): the registration check of it reports nothing
for the config it was built from, it is the shape the chart ships, and
drift from it is found where it is.
"""

from __future__ import annotations

import base64
import copy
import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from amp.config import ConfigError
from amp.registration import check, desired, drifted, needs, selects
from amp_dev.devcert import issue_cert, make_ca, pem_cert
from tests.unit.registration.test_registration import shipped_config

ROOT = Path(__file__).resolve().parents[3]
SHIPPED = ROOT / "deploy" / "cert-manager" / "mutatingwebhookconfiguration.yaml"
HOSTS = ["amp.amp-system.svc", "amp.amp-system.svc.cluster.local"]


#: The shipped config with dotted keys changed (the registration check's
#: tests build theirs the same way).
config = shipped_config


@pytest.fixture(scope="module")
def pki() -> tuple[Any, Any, bytes]:
    ca, ca_key = make_ca("amp ca")
    leaf, _ = issue_cert(ca, ca_key, "amp", HOSTS)
    return ca, leaf, pem_cert(ca)


def test_the_check_finds_no_problem_in_what_amp_applies(pki: Any) -> None:
    _, leaf, ca_pem = pki
    # after the certificates were issued (at import time "now" could precede them)
    now = datetime.datetime.now(datetime.timezone.utc).timestamp()
    for changes in (
        {},
        {"failure_policy": "Fail", "kubernetes.webhook_name": "fail.mutate.amp.txn2.com"},
        {"failure_policy": "Fail", "kubernetes.webhook_name": None},
        {"failure_policy": "Ignore"},
        {"registration.default_class": "Fail", "kubernetes.webhook_name": None},
        {"ephemeral_containers": True},
        {"deadline.default_timeout": "25s"},
        {"kubernetes.protected_namespaces": ["kube-system", "kube-public", "gatekeeper-system"]},
        {"kubernetes.failure_class_label": None, "kubernetes.webhook_name": None},
        {"kubernetes.allow_protected_namespaces": True},
    ):
        c = config(**changes)
        obj = desired(c, ca_pem)
        assert check(obj, needs(c), [leaf], now) == (), changes


def test_it_is_the_shape_the_chart_ships(pki: Any) -> None:
    """Everything the chart's registration sets, amp applies the same (but the caBundle cert-manager injects)."""
    shipped = yaml.safe_load(SHIPPED.read_text())
    obj = desired(config(), pki[2])
    for entry in obj["webhooks"]:
        del entry["clientConfig"]["caBundle"]
    assert drifted(shipped, obj) is None
    assert [e["name"] for e in obj["webhooks"]] == ["ignore.mutate.amp.txn2.com", "fail.mutate.amp.txn2.com"]


def test_each_class_goes_to_its_entry_and_protected_namespaces_to_none(pki: Any) -> None:
    obj = desired(config(**{"kubernetes.protected_namespaces": ["kube-system", "istio-system"]}), pki[2])

    def chosen(name: str, **labels: str) -> list[tuple[str, str]]:
        labels = {"kubernetes.io/metadata.name": name, "amp.txn2.com/enabled": "true", **labels}
        return [(e["name"], e["failurePolicy"]) for e in obj["webhooks"] if selects(e["namespaceSelector"], labels)]

    fail = {"amp.txn2.com/failure-class": "Fail"}
    assert chosen("team-a", **fail) == [("fail.mutate.amp.txn2.com", "Fail")]
    assert chosen("team-a", **{"amp.txn2.com/failure-class": "Ignore"}) == [("ignore.mutate.amp.txn2.com", "Ignore")]
    assert chosen("team-a") == [("ignore.mutate.amp.txn2.com", "Ignore")]
    for protected in ("amp-system", "kube-system", "istio-system"):
        assert chosen(protected) == [] and chosen(protected, **fail) == []
    assert all(e["timeoutSeconds"] == 10 for e in obj["webhooks"])
    assert {e["clientConfig"]["service"]["namespace"] for e in obj["webhooks"]} == {"amp-system"}
    assert base64.b64decode(obj["webhooks"][0]["clientConfig"]["caBundle"]) == pki[2]


def test_the_timeout_follows_the_deadline(pki: Any) -> None:
    obj = desired(config(**{"deadline.default_timeout": "4s", "endpoints.timeout": "2s"}), pki[2])
    assert {e["timeoutSeconds"] for e in obj["webhooks"]} == {4}


def test_what_cannot_be_built_is_named() -> None:
    with pytest.raises(ValueError, match="whole number of seconds"):
        desired(config(**{"deadline.default_timeout": "2500ms"}), b"")
    with pytest.raises(ValueError, match="webhook_name ignore.mutate.amp.txn2.com names the entry of class Ignore"):
        desired(config(failure_policy="Fail"), b"")
    with pytest.raises(ValueError, match="webhook_configuration"):
        desired(config(**{"kubernetes.webhook_configuration": None}), b"")
    with pytest.raises(ConfigError, match="registration.managed: deadline.default_timeout 2.5s"):
        config(**{"registration.managed": True, "deadline.default_timeout": "2500ms"})
    with pytest.raises(ConfigError, match="registration.managed: needs kubernetes.webhook_configuration"):
        config(**{"registration.managed": True, "kubernetes.webhook_configuration": None})
    assert config(**{"registration.managed": True}).registration.managed


def test_drift_is_found_where_it_is(pki: Any) -> None:
    want = desired(config(), pki[2])
    assert drifted(copy.deepcopy(want), want) is None
    # what the API server fills in, and fields of other managers, are no drift
    served = copy.deepcopy(want)
    served["metadata"].update(resourceVersion="7", uid="u", annotations={"argocd": "x"})
    served["webhooks"][0]["clientConfig"]["service"]["extra"] = 1
    assert drifted(served, want) is None
    assert drifted(None, want) == "(missing)"

    def edit(change: Any) -> Any:
        obj = copy.deepcopy(want)
        change(obj)
        return drifted(obj, want)

    assert edit(lambda o: o["webhooks"][1].update(timeoutSeconds=30)) == (
        "webhooks[fail.mutate.amp.txn2.com].timeoutSeconds"
    )
    assert (
        edit(lambda o: o["webhooks"][0]["namespaceSelector"]["matchExpressions"][0]["values"].remove("kube-system"))
        == "webhooks[ignore.mutate.amp.txn2.com].namespaceSelector.matchExpressions[0].values"
    )
    assert edit(lambda o: o["webhooks"][0]["clientConfig"].update(caBundle="")) == (
        "webhooks[ignore.mutate.amp.txn2.com].clientConfig.caBundle"
    )
    assert edit(lambda o: o["webhooks"].pop()) == "webhooks[fail.mutate.amp.txn2.com] (missing)"
    assert edit(lambda o: o["webhooks"].append({"name": "extra"})) == "webhooks[extra] (not amp's)"


def test_the_operators_selector_requirements_apply_in_the_managed_mode_too(pki: Any) -> None:
    """registration.match_expressions narrows every managed entry, as webhook.namespaceSelector does the chart's."""
    extra = [{"key": "team", "operator": "In", "values": ["a", "b"]}, {"key": "legacy", "operator": "DoesNotExist"}]
    obj = desired(config(**{"registration.match_expressions": extra}), pki[2])
    for entry in obj["webhooks"]:
        assert entry["namespaceSelector"]["matchExpressions"][-2:] == extra

    def called(**labels: str) -> list[str]:
        labels = {"kubernetes.io/metadata.name": "ns", "amp.txn2.com/enabled": "true", **labels}
        return [e["name"] for e in obj["webhooks"] if selects(e["namespaceSelector"], labels)]

    assert called(team="a") == ["ignore.mutate.amp.txn2.com"]
    assert called(team="c") == []
    assert called(team="a", legacy="yes") == []
    assert called(team="b", **{"amp.txn2.com/failure-class": "Fail"}) == ["fail.mutate.amp.txn2.com"]


def test_a_bad_selector_requirement_is_named() -> None:
    for bad, words in (
        ([{"key": "team", "operator": "Has"}], "operator must be one of"),
        ([{"key": "team", "operator": "In"}], "In needs values"),
        ([{"key": "team", "operator": "Exists", "values": ["x"]}], "takes no values"),
        ([{"operator": "Exists"}], "with a key"),
        ([{"key": "t", "operator": "In", "values": [True]}], "list of strings"),
    ):
        with pytest.raises(ConfigError, match="registration.match_expressions") as info:
            config(**{"registration.match_expressions": bad})
        assert words in str(info.value)


def test_a_url_replaces_the_service(pki: Any) -> None:
    obj = desired(config(**{"registration.url": "https://127.0.0.1:8443/mutate"}), pki[2])
    assert {e["clientConfig"].get("url") for e in obj["webhooks"]} == {"https://127.0.0.1:8443/mutate"}
    assert all("service" not in e["clientConfig"] for e in obj["webhooks"])
