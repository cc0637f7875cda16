"""
Tests for amp.hints: a label or annotation in amp's domain that amp does
not read is named with the closest key it does, on a Namespace and on a
Pod; a config key's closest known key.
"""

from __future__ import annotations

from amp.config import KubernetesConfig, StaticNamespace
from amp.hints import AmpKeys, near_miss_news
from amp.namespaces import StaticNamespaceSource
from amp.suggest import closest, did_you_mean

KEYS = AmpKeys(KubernetesConfig())


def test_the_issues_typos_are_named_with_the_key_meant() -> None:
    assert KEYS.near_misses({"amp.txn2.com/enable": "true"}, {"amp.txn2.com/endpoint": "http://x.svc:80/"}) == (
        "annotation amp.txn2.com/endpoint is not read by amp (did you mean amp.txn2.com/ep?)",
        "label amp.txn2.com/enable is not read by amp (did you mean amp.txn2.com/enabled?)",
    )


def test_known_and_foreign_keys_give_no_hint() -> None:
    labels = {"amp.txn2.com/enabled": "true", "app": "web", "example.com/amp": "x"}
    annotations = {
        "amp.txn2.com/ep": "u",
        "mutation.amp.txn2.com/ep": "u",
        "amp.txn2.com/failure-policy": "Fail",
        "amp.txn2.com/mode": "shadow",
        "validation.amp.txn2.com/ep": "u",
        "notamp.txn2.com/x": "y",
    }
    assert KEYS.near_misses(labels, annotations) == ()


def test_a_subdomain_and_a_misspelt_subdomain_are_amps() -> None:
    assert KEYS.near_misses({}, {"mutaton.amp.txn2.com/ep": "u"}) == (
        "annotation mutaton.amp.txn2.com/ep is not read by amp (did you mean mutation.amp.txn2.com/ep?)",
    )


def test_a_label_given_as_an_annotation_says_so() -> None:
    assert KEYS.near_misses({}, {"amp.txn2.com/enabled": "true"}) == (
        "annotation amp.txn2.com/enabled is not read by amp: it is a label",
    )


def test_a_key_like_none_amp_reads_is_named_without_a_guess() -> None:
    assert KEYS.near_misses({"amp.txn2.com/zzzzzz": "1"}, {}) == ("label amp.txn2.com/zzzzzz is not read by amp",)


def test_pod_keys_are_amps_stamps() -> None:
    assert KEYS.near_misses({}, {"amp.txn2.com/stauts": "x", "amp.txn2.com/status": "mutated"}, pod=True) == (
        "annotation amp.txn2.com/stauts is not read by amp (did you mean amp.txn2.com/status?)",
    )


def test_configured_keys_set_the_domain() -> None:
    keys = AmpKeys(
        KubernetesConfig(
            enabled_label="mutate.example.org/on",
            endpoint_annotations=("mutate.example.org/url",),
            validation_annotation="mutate.example.org/check",
            failure_policy_annotation="mutate.example.org/policy",
            mode_annotation="mutate.example.org/mode",
        )
    )
    # amp.txn2.com stays amp's: its status stamp on Pods is always amp.txn2.com/status.
    assert keys.domains == ("amp.txn2.com", "mutate.example.org")
    assert keys.near_misses({}, {"mutate.example.org/ulr": "x", "amp.txn2.com/ep": "x"}) == (
        "annotation amp.txn2.com/ep is not read by amp",
        "annotation mutate.example.org/ulr is not read by amp (did you mean mutate.example.org/url?)",
    )


def test_static_namespaces_carry_their_hints() -> None:
    source = StaticNamespaceSource(
        KubernetesConfig(
            source="static",
            namespaces={"a": StaticNamespace({"amp.txn2.com/enabled": "true"}, {"amp.txn2.com/endpoint": "u"})},
        )
    )
    info = source.cached("a")
    assert info.near_misses == ("annotation amp.txn2.com/endpoint is not read by amp (did you mean amp.txn2.com/ep?)",)


def test_news_only_when_the_hints_change() -> None:
    hints = ("label amp.txn2.com/enable is not read by amp",)
    assert near_miss_news(None, hints) == hints[0]
    assert near_miss_news(hints, hints) is None
    assert near_miss_news(hints, ()) is None
    assert near_miss_news((), hints + ("b",)) == f"{hints[0]}; b"


def test_config_keys() -> None:
    assert closest("prot", ["port", "interface"]) == "port"
    assert did_you_mean("timout", ["timeout", "retry"]) == " (did you mean timeout?)"
    assert did_you_mean("zzz", ["timeout", "retry"]) == ""


def test_static_namespaces_hints_are_logged_and_counted_at_start() -> None:
    from twisted.internet.task import Clock
    from twisted.logger import LogLevel, capturedLogs, formatEvent

    from amp.metrics import Metrics
    from amp.service import namespace_source
    from tests.support.helpers import make_config

    metrics = Metrics()
    config = make_config({"a": {"labels": {"amp.txn2.com/enable": "true"}}, "b": {}})
    with capturedLogs() as events:
        namespace_source(config, Clock(), metrics)
    warnings = [formatEvent(e) for e in events if e["log_level"] == LogLevel.warn]
    assert warnings == [
        "Namespace a: label amp.txn2.com/enable is not read by amp (did you mean amp.txn2.com/enabled?)"
    ]
    assert metrics.registry.get_sample_value("amp_namespace_problems_total", {"problem": "unknown-key"}) == 1
