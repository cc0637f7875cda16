"""
Tests for amp.policy: which endpoint (with which settings and breaker),
which failure policy, which mode.
"""

from __future__ import annotations

from typing import Optional

import pytest

from amp.config import Config, parse_config
from amp.namespaces import NamespaceInfo
from amp.policy import FAIL, IGNORE, NORMAL, SHADOW, failure_policy, failure_policy_problem, failure_policy_why, route
from tests.support.helpers import make_config, namespace

ENABLED = {"amp.txn2.com/enabled": "true"}
EP = "http://127.0.0.1:8090/user-env"

CONFIG = parse_config(
    {
        "endpoints": {
            "allow": ["http://127.0.0.1:*/*", "http://*.svc:*/*"],
            "timeout": "2s",
            "overrides": [{"match": "http://slow.team-a.svc:*/*", "timeout": "8s"}],
        },
        "failure_policy": "Ignore",
    }
)


def ns(labels: Optional[dict] = None, **annotations: str) -> NamespaceInfo:
    return NamespaceInfo("team-a", ENABLED if labels is None else labels, annotations)


def with_ep(url: str = EP, **more: str) -> NamespaceInfo:
    return ns(**{"amp.txn2.com/ep": url}, **more)


# ---------------------------------------------------------------- route


@pytest.mark.parametrize(
    "namespace",
    [
        None,
        NamespaceInfo("team-a", {}, {"amp.txn2.com/ep": EP}),
        NamespaceInfo("team-a", {"amp.txn2.com/enabled": "false"}, {"amp.txn2.com/ep": EP}),
        NamespaceInfo("team-a", {"amp.txn2.com/enabled": "True"}, {"amp.txn2.com/ep": EP}),
        NamespaceInfo("team-a", {}, {"amp.txn2.com/enabled": "true", "amp.txn2.com/ep": EP}),
    ],
)
def test_not_enabled(namespace: Optional[NamespaceInfo]) -> None:
    r = route(namespace, CONFIG, None)
    assert not r.enabled
    assert r.url is None and r.error is None


def test_enabled_label_name_and_value_come_from_the_config() -> None:
    config = parse_config({"kubernetes": {"enabled_label": "example.com/amp", "enabled_value": "on"}})
    assert route(ns({"example.com/amp": "on"}), config, None).enabled
    assert not route(ns(), config, None).enabled


def test_enabled_without_an_endpoint() -> None:
    r = route(ns(), CONFIG, None)
    assert r.enabled
    assert r.url is None and r.error is None and r.settings is None
    assert r.failure_policy == IGNORE


@pytest.mark.parametrize("url", ["ftp://127.0.0.1/x", "http://user@127.0.0.1/x", "http://127.0.0.1/a b", "nope"])
def test_bad_url(url: str) -> None:
    r = route(with_ep(url), CONFIG, None)
    assert r.enabled
    assert r.url is None
    assert r.raw_url == url
    assert r.error is not None and r.error[0] == "bad-url"
    assert r.error[1].startswith("endpoint URL")


@pytest.mark.parametrize(
    "url",
    [
        "http://10.0.0.1:8090/x",
        "https://127.0.0.1:8443/x",
        "http://127.0.0.1.nip.io/x",
        "http://metadata.google.internal/",
    ],
)
def test_not_allowed(url: str) -> None:
    r = route(with_ep(url), CONFIG, None)
    assert r.error is not None and r.error[0] == "not-allowed"
    assert r.url is not None
    assert r.error[1] == f"endpoint {r.url.origin} is not in endpoints.allow"
    assert r.settings is None


def test_allowed_with_default_settings() -> None:
    r = route(with_ep(), CONFIG, None)
    assert r.enabled and r.error is None
    assert r.url is not None and r.url.origin == "http://127.0.0.1:8090"
    assert r.settings == CONFIG.endpoints.defaults
    assert r.settings is not None and r.settings.timeout == 2.0
    assert (r.failure_policy, r.mode) == (IGNORE, NORMAL)


def test_allowed_with_override_settings() -> None:
    r = route(with_ep("http://slow.team-a.svc:8080/m"), CONFIG, None)
    assert r.settings is not None and r.settings.timeout == 8.0


def test_breaker_settings_are_the_origins() -> None:
    """
    One breaker guards a whole origin: its settings are those of the
    origin's root URL, even where a path override gives the URL others.
    """
    config = parse_config(
        {
            "endpoints": {
                "allow": ["http://127.0.0.1:*/*"],
                "overrides": [
                    {"match": "http://127.0.0.1:*/slow", "timeout": "8s"},
                    {"match": "http://127.0.0.1:*/*", "breaker": {"consecutive_failures": 1}},
                ],
            },
        }
    )
    slow = route(with_ep("http://127.0.0.1:8090/slow"), config, None)
    assert slow.settings is not None and slow.settings.timeout == 8.0
    assert slow.settings.breaker.consecutive_failures == 5
    assert slow.breaker is not None and slow.breaker.consecutive_failures == 1
    other = route(with_ep("http://127.0.0.1:8090/other"), config, None)
    assert other.breaker == slow.breaker
    assert route(with_ep("http://10.0.0.1:80/"), config, None).breaker is None


def test_endpoint_annotations_in_order() -> None:
    go_amp = ns(**{"mutation.amp.txn2.com/ep": "http://127.0.0.1:1/go"})
    r = route(go_amp, CONFIG, None)
    assert r.url is not None and r.url.path == "/go"
    both = ns(**{"amp.txn2.com/ep": "http://127.0.0.1:1/amp", "mutation.amp.txn2.com/ep": "http://127.0.0.1:1/go"})
    r = route(both, CONFIG, None)
    assert r.url is not None and r.url.path == "/amp"
    empty_first = ns(**{"amp.txn2.com/ep": "", "mutation.amp.txn2.com/ep": "http://127.0.0.1:1/go"})
    r = route(empty_first, CONFIG, None)
    assert r.url is not None and r.url.path == "/go"


def test_validation_uses_its_own_annotation() -> None:
    namespace = ns(**{"amp.txn2.com/ep": "http://127.0.0.1:1/m", "validation.amp.txn2.com/ep": "http://127.0.0.1:1/v"})
    r = route(namespace, CONFIG, None, validation=True)
    assert r.url is not None and r.url.path == "/v"
    r = route(with_ep(), CONFIG, None, validation=True)
    assert r.enabled and r.url is None and r.error is None


@pytest.mark.parametrize("value, mode", [("shadow", SHADOW), ("normal", NORMAL), ("Shadow", NORMAL), ("", NORMAL)])
def test_mode(value: str, mode: str) -> None:
    r = route(with_ep(**{"amp.txn2.com/mode": value}), CONFIG, None)
    assert r.mode == mode


def test_mode_is_kept_on_errors() -> None:
    r = route(with_ep("ftp://x/", **{"amp.txn2.com/mode": "shadow"}), CONFIG, None)
    assert r.mode == SHADOW and r.error is not None


# ---------------------------------------------------------------- failure policy


def config_policy(value: str) -> Config:
    return parse_config({"failure_policy": value})


@pytest.mark.parametrize(
    "annotation, configured, cluster, expected",
    [
        # the namespace annotation wins
        ("Fail", "Ignore", "Ignore", FAIL),
        ("Ignore", "Fail", "Fail", IGNORE),
        ("Ignore", "auto", "Fail", IGNORE),
        # an invalid annotation is ignored
        ("ignore", "Ignore", None, IGNORE),
        ("fail", "Ignore", "Fail", IGNORE),
        # else the config
        (None, "Ignore", "Fail", IGNORE),
        (None, "Fail", "Ignore", FAIL),
        # auto follows the cluster's webhook configuration
        (None, "auto", "Ignore", IGNORE),
        (None, "auto", "Fail", FAIL),
        # ... and is Fail, the Kubernetes default, while that is unknown
        (None, "auto", None, FAIL),
        (None, "auto", "Weird", FAIL),
    ],
)
def test_failure_policy_precedence(
    annotation: Optional[str], configured: str, cluster: Optional[str], expected: str
) -> None:
    annotations = {} if annotation is None else {"amp.txn2.com/failure-policy": annotation}
    namespace = ns(**annotations)
    assert failure_policy(namespace, config_policy(configured), cluster) == expected
    assert route(namespace, config_policy(configured), cluster).failure_policy == expected


def test_failure_policy_without_a_namespace() -> None:
    assert failure_policy(None, config_policy("Ignore"), None) == IGNORE
    assert failure_policy(None, config_policy("auto"), "Ignore") == IGNORE
    assert failure_policy(None, config_policy("auto"), None) == FAIL


def test_failure_policy_annotation_name_comes_from_the_config() -> None:
    config = parse_config({"failure_policy": "Fail", "kubernetes": {"failure_policy_annotation": "example.com/fp"}})
    assert failure_policy(ns(**{"example.com/fp": "Ignore"}), config, None) == IGNORE
    assert failure_policy(ns(**{"amp.txn2.com/failure-policy": "Ignore"}), config, None) == FAIL


def test_route_cache_gives_the_same_decisions() -> None:
    """
    With a cache, each annotation value is resolved once and every decision
    (allowed, refused, bad URL) is the same as without it.
    """
    config = make_config(
        {
            "ok": namespace("http://127.0.0.1:8090/user-env"),
            "refused": namespace("http://10.1.2.3:80/"),
            "bad": namespace("gopher://x/"),
        }
    )
    cache: dict = {}
    for name in ("ok", "refused", "bad", "ok", "refused", "bad"):
        ns = NamespaceInfo(
            name, config.kubernetes.namespaces[name].labels, config.kubernetes.namespaces[name].annotations
        )
        assert route(ns, config, None, cache=cache) == route(ns, config, None)
    assert len(cache) == 3
    ns = NamespaceInfo("ok", config.kubernetes.namespaces["ok"].labels, config.kubernetes.namespaces["ok"].annotations)
    assert route(ns, config, None, cache=cache).url is route(ns, config, None, cache=cache).url


# ---------------------------------------------------------------- opt-out and self-protection


def test_protected_namespaces_are_amps_own_and_kube_system_by_default() -> None:
    from amp.rules import protected_namespaces

    assert protected_namespaces(parse_config({}).kubernetes) == {"kube-system"}
    own = parse_config({"kubernetes": {"own_namespace": "amp-system"}})
    assert protected_namespaces(own.kubernetes) == {"amp-system", "kube-system"}
    more = parse_config({"kubernetes": {"own_namespace": "amp-system", "protected_namespaces": ["infra"]}})
    assert protected_namespaces(more.kubernetes) == {"amp-system", "infra"}
    allowed = parse_config({"kubernetes": {"own_namespace": "amp-system", "allow_protected_namespaces": True}})
    assert protected_namespaces(allowed.kubernetes) == frozenset()


@pytest.mark.parametrize(
    "labels,out",
    [
        ({"amp.txn2.com/enabled": "false"}, True),
        ({"amp.txn2.com/enabled": "true"}, False),
        ({"amp.txn2.com/enabled": "False"}, False),
        ({}, False),
        (None, False),
    ],
)
def test_a_pod_opts_out_with_the_enable_label_set_to_false(labels: Optional[dict], out: bool) -> None:
    from amp.rules import opted_out

    metadata = {"name": "web"} if labels is None else {"name": "web", "labels": labels}
    assert opted_out({"metadata": metadata}, CONFIG.kubernetes) is out


@pytest.mark.parametrize("the_pod", [None, [], {"metadata": []}, {"metadata": {"labels": ["x"]}}])
def test_opt_out_reads_odd_pods_as_not_opted_out(the_pod: object) -> None:
    from amp.rules import opted_out

    assert opted_out(the_pod, CONFIG.kubernetes) is False


def test_opt_out_label_and_value_come_from_the_config() -> None:
    from amp.rules import opted_out

    config = parse_config({"kubernetes": {"enabled_label": "example.com/amp", "opt_out_value": "off"}})
    assert opted_out({"metadata": {"labels": {"example.com/amp": "off"}}}, config.kubernetes)
    assert not opted_out({"metadata": {"labels": {"amp.txn2.com/enabled": "false"}}}, config.kubernetes)


def test_own_pods_warning_only_for_an_enabled_own_namespace() -> None:
    from amp.rules import own_pods_warning

    config = parse_config({"kubernetes": {"own_namespace": "amp-system"}})
    enabled = NamespaceInfo("amp-system", ENABLED, {})
    assert own_pods_warning(None, config.kubernetes) is None
    assert own_pods_warning(NamespaceInfo("amp-system", {}, {}), config.kubernetes) is None
    warning = own_pods_warning(enabled, config.kubernetes)
    assert warning is not None and "amp-system" in warning and "will not change its Pods" in warning
    allowed = parse_config({"kubernetes": {"own_namespace": "amp-system", "allow_protected_namespaces": True}})
    warning = own_pods_warning(enabled, allowed.kubernetes)
    assert warning is not None and "reviews its own Pods" in warning


# ---------------------------------------------------------------- the failure-class label

CLASS = "amp.txn2.com/failure-class"
ANNOTATION = "amp.txn2.com/failure-policy"


def classed(label: Optional[str] = None, annotation: Optional[str] = None) -> NamespaceInfo:
    labels = dict(ENABLED)
    if label is not None:
        labels[CLASS] = label
    return NamespaceInfo("team-a", labels, {} if annotation is None else {ANNOTATION: annotation})


@pytest.mark.parametrize(
    "label, annotation, cluster, expected, problem",
    [
        # the label chooses, whatever the webhook's default entry says
        ("Fail", None, "Ignore", FAIL, None),
        ("Ignore", None, "Fail", IGNORE, None),
        # the label wins over the deprecated annotation, which is a problem when it disagrees
        ("Fail", "Ignore", "Ignore", FAIL, "failure-class-disagrees"),
        ("Ignore", "Ignore", "Fail", IGNORE, None),
        # the annotation alone still works for one release, as a problem
        (None, "Fail", "Ignore", FAIL, "failure-class-annotation"),
        # an unusable label falls back to the annotation, then to the webhook's default entry
        ("fail", None, "Ignore", IGNORE, "failure-class"),
        ("fail", "Fail", "Ignore", FAIL, "failure-class"),
        (None, "nope", "Ignore", IGNORE, "failure-policy"),
        (None, None, "Ignore", IGNORE, None),
        (None, None, None, FAIL, None),
    ],
)
def test_failure_class_label(
    label: Optional[str], annotation: Optional[str], cluster: Optional[str], expected: str, problem: Optional[str]
) -> None:
    """
    The failure-class label, which the shipped webhook entries select on,
    decides amp's failure policy too; the annotation is read when there is
    no usable label, and every way the two can mislead is a named problem.
    """
    namespace = classed(label, annotation)
    config = config_policy("auto")
    assert failure_policy(namespace, config, cluster) == expected
    r = route(namespace, config, cluster)
    assert r.failure_policy == expected
    assert (r.policy_problem[0] if r.policy_problem else None) == problem


def test_each_failure_class_problem_names_the_command_that_fixes_it() -> None:
    config = config_policy("auto")
    only = failure_policy_problem(classed(None, "Fail"), config, FAIL)
    assert only is not None
    assert f"kubectl label namespace team-a {CLASS}=Fail && kubectl annotate namespace team-a {ANNOTATION}-" in only[1]
    assert "the API server reads labels only" in only[1]
    disagree = failure_policy_problem(classed("Fail", "Ignore"), config, FAIL)
    assert disagree is not None and disagree[1].endswith(f"fix: kubectl annotate namespace team-a {ANNOTATION}-")
    bad = failure_policy_problem(classed("fial", None), config, IGNORE)
    assert bad is not None and f"kubectl label namespace team-a {CLASS}=Fail --overwrite" in bad[1]
    assert "'fial' is not Ignore or Fail; failure policy Ignore" in bad[1]


def test_without_a_failure_class_label_the_annotation_is_read_as_before() -> None:
    """C{kubernetes.failure_class_label: null} (a single-entry registration): no label, no annotation problem."""
    config = parse_config({"failure_policy": "auto", "kubernetes": {"failure_class_label": None}})
    namespace = classed("Fail", "Ignore")
    assert failure_policy(namespace, config, "Fail") == IGNORE
    assert failure_policy_problem(namespace, config, IGNORE) is None
    assert failure_policy_problem(classed(None, "x"), config, IGNORE)[0] == "failure-policy"  # type: ignore[index]


def test_explain_says_where_the_class_came_from_and_the_fix() -> None:
    policy, why = failure_policy_why(classed(None, "Fail"), config_policy("auto"), "Ignore")
    assert policy == FAIL
    assert why.startswith(f"the namespace's annotation {ANNOTATION} (problem failure-class-annotation:")
    policy, why = failure_policy_why(classed("Fail"), config_policy("auto"), "Ignore")
    assert (policy, why) == (FAIL, f"the namespace's failure-class label {CLASS}")
