"""
amp's registration against what its config needs (amp.registration): the
pure check on the shipped registrations and on each hand edit that breaks
one of its promises, the daemon's report (one log line per change, the
gauge, never unready), and C{amp check} on a rendered manifest.
"""

from __future__ import annotations

import base64
import copy
import datetime
import io
import json
from pathlib import Path
from typing import Any, Optional

import pytest
import yaml
from twisted.internet.task import Clock
from twisted.logger import capturedLogs, formatEvent
from twisted.python.threadpool import ThreadPool

from amp.cli import dispatch
from amp.config import Config, parse_config
from amp.metrics import Metrics
from amp.registration import RegistrationProblem as P
from amp.registration import RegistrationReport, check, needs, selects
from amp_dev.devcert import issue_cert, make_ca, pem_cert

ROOT = Path(__file__).resolve().parents[3]
SHIPPED = ROOT / "deploy" / "cert-manager" / "mutatingwebhookconfiguration.yaml"
SHIPPED_CONFIG = ROOT / "deploy" / "base" / "amp.yaml"
SERVICE_HOSTS = ["amp.amp-system.svc", "amp.amp-system.svc.cluster.local"]


def shipped() -> dict[str, Any]:
    """The registration deploy/cert-manager ships (rendered from the chart)."""
    return yaml.safe_load(SHIPPED.read_text())


def shipped_config(**changes: Any) -> Config:
    raw = yaml.safe_load(SHIPPED_CONFIG.read_text())
    for dotted, value in changes.items():
        here = raw
        *path, last = dotted.split(".")
        for key in path:
            here = here.setdefault(key, {})
        here[last] = value
    return parse_config(raw)


def names(problems: Any) -> list[str]:
    return sorted({p.name.value for p in problems})


def entry(obj: dict[str, Any], prefix: str) -> dict[str, Any]:
    [found] = [h for h in obj["webhooks"] if h["name"].startswith(prefix)]
    return found


# ---------------------------------------------------------------- the shipped registration


def test_the_shipped_registration_has_one_entry_per_failure_class() -> None:
    obj = shipped()
    by_name = {h["name"]: h for h in obj["webhooks"]}
    assert {n: h["failurePolicy"] for n, h in by_name.items()} == {
        "ignore.mutate.amp.txn2.com": "Ignore",
        "fail.mutate.amp.txn2.com": "Fail",
    }
    config = shipped_config()
    assert config.kubernetes.webhook_name == "ignore.mutate.amp.txn2.com"
    assert config.kubernetes.failure_class_label == "amp.txn2.com/failure-class"


def test_the_shipped_registration_meets_the_shipped_config() -> None:
    assert check(shipped(), needs(shipped_config())) == ()


@pytest.mark.parametrize(
    "labels, selected",
    [
        ({"amp.txn2.com/enabled": "true", "amp.txn2.com/failure-class": "Fail"}, ["fail.mutate.amp.txn2.com"]),
        ({"amp.txn2.com/enabled": "true", "amp.txn2.com/failure-class": "Ignore"}, ["ignore.mutate.amp.txn2.com"]),
        ({"amp.txn2.com/enabled": "true"}, ["ignore.mutate.amp.txn2.com"]),
        ({"amp.txn2.com/enabled": "true", "amp.txn2.com/failure-class": "fail"}, ["ignore.mutate.amp.txn2.com"]),
        ({"amp.txn2.com/enabled": "false", "amp.txn2.com/failure-class": "Fail"}, []),
        (
            {
                "amp.txn2.com/enabled": "true",
                "amp.txn2.com/failure-class": "Fail",
                "kubernetes.io/metadata.name": "kube-system",
            },
            [],
        ),
        ({"amp.txn2.com/enabled": "true", "kubernetes.io/metadata.name": "amp-system"}, []),
    ],
)
def test_the_shipped_selectors(labels: dict[str, str], selected: list[str]) -> None:
    """Each enabled namespace is sent by exactly the entry of its class; protected ones by none."""
    labels = {"kubernetes.io/metadata.name": "team-a", **labels}
    assert [h["name"] for h in shipped()["webhooks"] if selects(h["namespaceSelector"], labels)] == selected


# ---------------------------------------------------------------- hand edits, each named


def edited(change: Any) -> list[str]:
    obj = shipped()
    change(obj)
    return names(check(obj, needs(shipped_config())))


def test_an_operators_narrowing_is_a_choice_not_a_problem() -> None:
    """Entries narrowed to a team's namespaces still route each class right, and still must exclude kube-system."""
    obj = shipped()
    for h in obj["webhooks"]:
        h["namespaceSelector"]["matchLabels"]["team"] = "a"
        h["namespaceSelector"]["matchExpressions"].append({"key": "tier", "operator": "Exists"})
    assert check(obj, needs(shipped_config())) == ()
    for e in entry(obj, "fail.")["namespaceSelector"]["matchExpressions"]:
        if e["key"] == "kubernetes.io/metadata.name":
            e["values"] = ["amp-system"]
    assert names(check(obj, needs(shipped_config()))) == [P.SELECTS_PROTECTED]


def test_a_missing_configuration() -> None:
    [problem] = check(None, needs(shipped_config()))
    assert problem.name == P.CONFIGURATION_MISSING
    assert "amp.txn2.com does not exist" in problem.message


def test_the_fail_entry_turned_to_ignore_is_a_class_not_enforced() -> None:
    obj = shipped()
    entry(obj, "fail.")["failurePolicy"] = "Ignore"
    [problem] = check(obj, needs(shipped_config()))
    assert problem.name == P.CLASS_NOT_ENFORCED
    assert problem.message == (
        "enabled namespaces labelled amp.txn2.com/failure-class=Fail are sent by entry fail.mutate.amp.txn2.com, "
        "whose failurePolicy is Ignore while they chose Fail: when amp cannot be reached the API server applies "
        "Ignore to them"
    )


def test_a_deleted_class_entry_leaves_its_namespaces_uncalled() -> None:
    assert edited(lambda o: o["webhooks"].pop(1)) == [P.CLASS_NOT_CALLED]
    assert edited(lambda o: o["webhooks"].pop(0)) == [P.CLASS_NOT_CALLED, P.DEFAULT_ENTRY_MISSING]


def test_a_selector_without_the_class_expression_overlaps() -> None:
    def drop(o: dict[str, Any]) -> None:
        exprs = entry(o, "fail.")["namespaceSelector"]["matchExpressions"]
        exprs[:] = [e for e in exprs if e["key"] != "amp.txn2.com/failure-class"]

    assert edited(drop) == [P.ENTRIES_OVERLAP]


def test_a_selector_that_now_catches_kube_system() -> None:
    def open_up(o: dict[str, Any]) -> None:
        for e in entry(o, "ignore.")["namespaceSelector"]["matchExpressions"]:
            if e["key"] == "kubernetes.io/metadata.name":
                e["values"] = ["amp-system"]

    obj = shipped()
    open_up(obj)
    [problem] = check(obj, needs(shipped_config()))
    assert problem.name == P.SELECTS_PROTECTED
    assert "sends Pods of kube-system (a protected namespace)" in problem.message


def test_amp_own_namespace_must_be_excluded() -> None:
    def open_up(o: dict[str, Any]) -> None:
        for h in o["webhooks"]:
            for e in h["namespaceSelector"]["matchExpressions"]:
                if e["key"] == "kubernetes.io/metadata.name":
                    e["values"] = ["kube-system"]

    obj = shipped()
    open_up(obj)
    [problem] = check(obj, needs(shipped_config()))
    assert "amp-system (amp's own namespace)" in problem.message


def test_a_timeout_shorter_than_the_endpoints() -> None:
    obj = shipped()
    entry(obj, "fail.")["timeoutSeconds"] = 3
    problems = check(obj, needs(shipped_config()))
    assert names(problems) == [P.DEADLINE_DIFFERS, P.TIMEOUT_BELOW_ENDPOINTS]
    [short] = [p for p in problems if p.name == P.TIMEOUT_BELOW_ENDPOINTS]
    assert short.message == (
        "entry fail.mutate.amp.txn2.com: timeoutSeconds 3 less deadline.margin 0.5s leaves amp "
        "2.5s, less than endpoints.timeout 5s"
    )


def test_an_endpoint_override_longer_than_the_budget() -> None:
    config = shipped_config(**{"endpoints.overrides": [{"match": "http://slow.team.svc:*/*", "timeout": "9800ms"}]})
    problems = check(shipped(), needs(config))
    assert [p.name for p in problems] == [P.TIMEOUT_BELOW_ENDPOINTS] * 2  # one per entry
    assert all("endpoints.overrides[http://slow.team.svc:*/*].timeout 9.8s" in p.message for p in problems)


def test_rules_side_effects_path_versions_and_reinvocation() -> None:
    def rules(o: dict[str, Any]) -> None:
        entry(o, "fail.")["rules"][0]["operations"] = ["UPDATE"]

    assert edited(rules) == [P.RULES_EXTRA, P.RULES_MISSING]

    def wide(o: dict[str, Any]) -> None:
        entry(o, "ignore.")["rules"].append(
            {"operations": ["CREATE"], "apiGroups": ["apps"], "apiVersions": ["v1"], "resources": ["deployments"]}
        )

    assert edited(wide) == [P.RULES_EXTRA]

    def side(o: dict[str, Any]) -> None:
        entry(o, "ignore.")["sideEffects"] = "Some"

    assert edited(side) == [P.SIDE_EFFECTS]

    def path(o: dict[str, Any]) -> None:
        entry(o, "ignore.")["clientConfig"]["service"]["path"] = "/validate"

    assert edited(path) == [P.WRONG_PATH]

    def versions(o: dict[str, Any]) -> None:
        entry(o, "ignore.")["admissionReviewVersions"] = ["v2"]

    assert edited(versions) == [P.REVIEW_VERSIONS]

    def reinvocation(o: dict[str, Any]) -> None:
        entry(o, "ignore.")["reinvocationPolicy"] = "IfNeeded"

    assert edited(reinvocation) == [P.REINVOCATION_DIFFERS]


def test_ephemeral_containers_need_their_rule() -> None:
    config = shipped_config(ephemeral_containers=True)
    assert names(check(shipped(), needs(config))) == [P.RULES_MISSING]


def test_a_config_policy_the_default_entry_does_not_enforce() -> None:
    """With failure_policy Fail, namespaces without the label get Fail from amp, Ignore from the API server."""
    [problem] = check(shipped(), needs(shipped_config(failure_policy="Fail")))
    assert problem.name == P.CLASS_NOT_ENFORCED
    assert "without the label amp.txn2.com/failure-class" in problem.message


def test_auto_follows_an_entry_that_does_not_select_the_unlabelled() -> None:
    config = shipped_config(**{"kubernetes.webhook_name": "fail.mutate.amp.txn2.com"})
    assert names(check(shipped(), needs(config))) == [P.DEFAULT_ENTRY_DIFFERS]


def test_a_single_entry_registration_for_a_config_without_the_label() -> None:
    obj = shipped()
    single = obj["webhooks"][0]
    single["name"] = "mutate.amp.txn2.com"
    exprs = single["namespaceSelector"]["matchExpressions"]
    exprs[:] = [e for e in exprs if e["key"] != "amp.txn2.com/failure-class"]
    obj["webhooks"] = [single]
    config = shipped_config(
        **{"kubernetes.failure_class_label": None, "kubernetes.webhook_name": "mutate.amp.txn2.com"}
    )
    assert check(obj, needs(config)) == ()
    # the config with the label needs an entry per class
    assert P.CLASS_NOT_ENFORCED in names(
        check(obj, needs(shipped_config(**{"kubernetes.webhook_name": "mutate.amp.txn2.com"})))
    )


# ---------------------------------------------------------------- the caBundle


def bundle(*cas: Any) -> str:
    return base64.b64encode(b"".join(pem_cert(c) for c in cas)).decode()


def with_bundle(value: Any) -> dict[str, Any]:
    obj = shipped()
    for h in obj["webhooks"]:
        h["clientConfig"]["caBundle"] = value
    return obj


def test_the_ca_bundle_must_verify_the_served_certificate() -> None:
    ca, ca_key = make_ca("amp ca")
    other, _ = make_ca("someone else")
    leaf, _ = issue_cert(ca, ca_key, "amp", SERVICE_HOSTS)
    now = datetime.datetime.now(datetime.timezone.utc).timestamp()
    wanted = needs(shipped_config())
    assert check(with_bundle(bundle(ca)), wanted, [leaf], now) == ()
    # during a CA rotation both are in the bundle
    assert check(with_bundle(bundle(other, ca)), wanted, [leaf], now) == ()
    problems = check(with_bundle(bundle(other)), wanted, [leaf], now)
    assert names(problems) == [P.CA_BUNDLE_MISMATCH]
    assert "CN=someone else" in problems[0].message and f"serial {leaf.serial_number:#x}" in problems[0].message
    assert names(check(with_bundle(""), wanted, [leaf], now)) == [P.CA_BUNDLE_MISSING]
    assert names(check(with_bundle("bm90IGEgY2VydA=="), wanted, [leaf], now)) == [P.CA_BUNDLE_MISSING]
    # an expired CA verifies nothing
    later = now + 20 * 365 * 86400
    assert P.CA_BUNDLE_MISMATCH in names(check(with_bundle(bundle(ca)), wanted, [leaf], later))
    # without the served chain the caBundle is not judged
    assert check(with_bundle(bundle(other)), wanted) == ()


def test_the_served_certificate_must_name_the_service() -> None:
    ca, ca_key = make_ca("amp ca")
    leaf, _ = issue_cert(ca, ca_key, "amp", ["localhost"])
    problems = check(with_bundle(bundle(ca)), needs(shipped_config()), [leaf])
    assert names(problems) == [P.CERTIFICATE_NAME] and len(problems) == 2  # one per entry
    assert "does not name amp.amp-system.svc (its DNS names: localhost)" in problems[0].message


# ---------------------------------------------------------------- the daemon's report


def sample(metrics: Metrics, problem: str) -> Optional[float]:
    return metrics.registry.get_sample_value("amp_registration_problems", {"problem": problem})


def test_the_report_logs_once_per_change_and_sets_the_gauge() -> None:
    metrics = Metrics()
    report = RegistrationReport(needs(shipped_config()), metrics, Clock())
    assert {sample(metrics, p.value) for p in P} == {0.0}
    broken = shipped()
    entry(broken, "fail.")["failurePolicy"] = "Ignore"
    with capturedLogs() as events:
        report.seen(shipped())
        report.seen(broken)
        report.seen(copy.deepcopy(broken))
        report.seen(broken)
        report.seen(shipped())
    lines = [formatEvent(e) for e in events]
    assert len(lines) == 3, lines
    assert lines[0] == "MutatingWebhookConfiguration amp.txn2.com: no registration problem"  # the first check
    assert lines[1].startswith(
        "MutatingWebhookConfiguration amp.txn2.com: 1 registration problem(s): "
        "class-not-enforced: enabled namespaces labelled"
    )
    assert lines[2] == "MutatingWebhookConfiguration amp.txn2.com: no registration problem"
    assert sample(metrics, "class-not-enforced") == 0
    report.seen(broken)
    assert sample(metrics, "class-not-enforced") == 1
    report.seen(None)
    assert (sample(metrics, "class-not-enforced"), sample(metrics, "configuration-missing")) == (0, 1)


def test_the_report_checks_again_when_the_certificate_changes() -> None:
    ca, ca_key = make_ca("amp ca")
    new_ca, new_key = make_ca("amp ca 2")
    chain = [issue_cert(ca, ca_key, "amp", SERVICE_HOSTS)[0]]
    metrics = Metrics()
    clock = Clock()
    clock.advance(datetime.datetime.now(datetime.timezone.utc).timestamp())
    report = RegistrationReport(needs(shipped_config()), metrics, clock, chain=lambda: chain)
    assert report.certificate_changed() == ()  # nothing seen yet: nothing judged
    assert report.seen(with_bundle(bundle(ca))) == ()
    chain[:] = [issue_cert(new_ca, new_key, "amp", SERVICE_HOSTS)[0]]
    assert names(report.certificate_changed()) == [P.CA_BUNDLE_MISMATCH]
    assert sample(metrics, "ca-bundle-mismatch") == 2  # one per entry


def test_a_reloaded_config_is_checked_against_the_same_registration() -> None:
    metrics = Metrics()
    report = RegistrationReport(needs(shipped_config()), metrics, Clock())
    assert report.config_changed(shipped_config(**{"endpoints.timeout": "9800ms"})) == ()  # nothing seen yet
    assert names(report.seen(shipped())) == [P.TIMEOUT_BELOW_ENDPOINTS]
    assert report.config_changed(shipped_config()) == ()
    assert sample(metrics, "timeout-below-endpoints") == 0


# ---------------------------------------------------------------- amp check


class _Reactor:
    """What amp check asks of the reactor on a manifest: the time."""

    def seconds(self) -> float:
        return datetime.datetime.now(datetime.timezone.utc).timestamp()

    def getThreadPool(self) -> ThreadPool:  # pragma: no cover - not reached with --manifest
        raise AssertionError("no thread for a manifest")


def amp_check(*argv: str, stdin: str = "") -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    d = dispatch(["check", *argv], _Reactor(), stdin=io.StringIO(stdin), stdout=out, stderr=err)
    results: list[int] = []
    d.addCallback(results.append)
    return results[0], out.getvalue(), err.getvalue()


def rendered(obj: dict[str, Any]) -> str:
    """A rendered manifest as CI has it: amp's ConfigMap (amp.yaml) and the registration."""
    configmap = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "amp-config"},
        "data": {"amp.yaml": SHIPPED_CONFIG.read_text()},
    }
    return yaml.safe_dump_all([configmap, obj])


def test_amp_check_on_a_rendered_manifest(tmp_path: Path) -> None:
    status, out, err = amp_check("--manifest", "-", stdin=rendered(shipped()))
    assert (status, out, err) == (0, "MutatingWebhookConfiguration amp.txn2.com: no registration problem\n", "")
    broken = shipped()
    entry(broken, "ignore.")["timeoutSeconds"] = 2
    path = tmp_path / "rendered.yaml"
    path.write_text(rendered(broken))
    status, out, _ = amp_check("--manifest", str(path), "-o", "json")
    assert status == 1
    assert [p["problem"] for p in json.loads(out)["problems"]] == ["deadline-differs", "timeout-below-endpoints"]


def test_amp_check_with_the_served_certificate(tmp_path: Path) -> None:
    ca, ca_key = make_ca("amp ca")
    other, _ = make_ca("someone else")
    (tmp_path / "tls.crt").write_bytes(pem_cert(issue_cert(ca, ca_key, "amp", SERVICE_HOSTS)[0]))
    obj = with_bundle(bundle(other))
    status, out, _ = amp_check("--manifest", "-", "--cert", str(tmp_path / "tls.crt"), stdin=rendered(obj))
    assert status == 1
    assert out.count("ca-bundle-mismatch: entry ") == 2


def test_amp_check_usage_errors(tmp_path: Path) -> None:
    status, _, err = amp_check("--manifest", str(tmp_path / "missing.yaml"))
    assert status == 2 and err.startswith("amp check: ") and "missing.yaml" in err
    status, out, _ = amp_check("--manifest", "-", stdin="kind: ConfigMap\nmetadata: {name: x}\n")
    assert status == 1 and "configuration-missing" in out
    two = yaml.safe_dump_all([shipped(), {**shipped(), "metadata": {"name": "other"}}])
    status, _, err = amp_check("--manifest", "-", stdin=two)
    assert status == 2 and "hold 2 MutatingWebhookConfigurations (amp.txn2.com, other)" in err


def test_amp_explain_notes_the_registration_problems() -> None:
    """amp explain --cluster notes each problem of the configuration it read; none when it could not read it."""
    from amp.cli.explain import _UNREAD, registration_notes

    broken = shipped()
    entry(broken, "ignore.")["sideEffects"] = "Unknown"
    [note] = registration_notes(shipped_config(), broken)
    assert note.startswith("registration: side-effects: entry ignore.mutate.amp.txn2.com: sideEffects Unknown")
    assert registration_notes(shipped_config(), shipped()) == []
    assert registration_notes(shipped_config(), None)[0].startswith("registration: configuration-missing: ")
    assert registration_notes(shipped_config(), _UNREAD) == []
