"""
Tests for amp.config: the issue's config works as written, every section's
defaults, and every malformed value fails with a message that starts with
the dotted key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from amp.config import (
    BreakerConfig,
    Config,
    ConfigError,
    DeadlineConfig,
    EndpointSettings,
    KubernetesConfig,
    ListenConfig,
    LogConfig,
    MetricsConfig,
    PatchConfig,
    TLSConfig,
    load_config,
    parse_config,
    parse_duration,
    parse_size,
)
from amp.urls import parse_endpoint_url

REPO = Path(__file__).resolve().parents[3]

ISSUE_CONFIG = """
listen: {port: 8443, interface: 127.0.0.1}
tls: {cert: dev-tls/tls.crt, key: dev-tls/tls.key}
kubernetes:
  source: static
  namespaces:
    team-a:
      labels: {amp.txn2.com/enabled: "true"}
      annotations: {amp.txn2.com/ep: "http://127.0.0.1:8090/user-env"}
endpoints:
  allow: ["http://127.0.0.1:*/*"]
  timeout: 2s
failure_policy: Ignore
"""


def test_issue_config_works_as_written(tmp_path: Path) -> None:
    path = tmp_path / "amp.yaml"
    path.write_text(ISSUE_CONFIG)
    config = load_config(str(path))
    assert (config.listen.port, config.listen.interface) == (8443, "127.0.0.1")
    assert (config.tls.cert, config.tls.key) == ("dev-tls/tls.crt", "dev-tls/tls.key")
    assert config.kubernetes.source == "static"
    team_a = config.kubernetes.namespaces["team-a"]
    assert team_a.labels == {"amp.txn2.com/enabled": "true"}
    assert team_a.annotations == {"amp.txn2.com/ep": "http://127.0.0.1:8090/user-env"}
    url = parse_endpoint_url("http://127.0.0.1:8090/user-env")
    assert config.endpoints.allowed(url)
    assert not config.endpoints.allowed(parse_endpoint_url("http://10.0.0.1:8090/user-env"))
    assert config.endpoints.defaults.timeout == 2.0
    assert config.endpoints.settings_for(url).timeout == 2.0
    assert config.failure_policy == "Ignore"
    # everything not given keeps its default
    assert config.listen.max_body == ListenConfig().max_body
    assert config.patch == PatchConfig()


def test_shipped_config_loads() -> None:
    config = load_config(str(REPO / "etc" / "amp.yaml"))
    assert config.kubernetes.source == "static"
    assert "team-a" in config.kubernetes.namespaces


# ---------------------------------------------------------------- defaults


@pytest.mark.parametrize("raw", [None, {}, {"listen": None, "tls": None, "endpoints": None, "kubernetes": None}])
def test_empty_config_is_all_defaults(raw: Any) -> None:
    assert parse_config(raw) == Config()


def test_defaults_of_every_section() -> None:
    c = Config()
    assert c.listen == ListenConfig(
        port=8443,
        interface="0.0.0.0",
        max_body=3 * 1024 * 1024,
        max_connections=1024,
        request_timeout=10.0,
        idle_timeout=60.0,
        drain_timeout=30.0,
    )
    assert c.tls == TLSConfig(
        cert="/etc/amp/tls/tls.crt", key="/etc/amp/tls/tls.key", client_ca=None, min_version="1.2", reload_interval=5.0
    )
    assert c.metrics == MetricsConfig(port=9090, interface="0.0.0.0", debug_reviews=256)
    k = c.kubernetes
    assert k.source == "cluster"
    assert k.namespaces == {}
    assert (k.enabled_label, k.enabled_value) == ("amp.txn2.com/enabled", "true")
    assert k.endpoint_annotations == ("amp.txn2.com/ep", "mutation.amp.txn2.com/ep")
    assert k.validation_annotation == "validation.amp.txn2.com/ep"
    assert k.failure_policy_annotation == "amp.txn2.com/failure-policy"
    assert k.mode_annotation == "amp.txn2.com/mode"
    assert k == KubernetesConfig()
    e = c.endpoints.defaults
    assert e == EndpointSettings(
        connect_timeout=1.0,
        timeout=5.0,
        max_response=1024 * 1024,
        pool_size=32,
        idle_timeout=60.0,
        max_concurrent=64,
        retry=False,
        ca_bundle=None,
        client_cert=None,
        client_key=None,
        breaker=BreakerConfig(),
    )
    assert BreakerConfig() == BreakerConfig(
        consecutive_failures=5,
        failure_ratio=0.5,
        window=30.0,
        min_requests=20,
        cooldown=5.0,
        max_cooldown=120.0,
        half_open_requests=1,
    )
    assert c.endpoints.overrides == ()
    assert c.endpoints.deny_networks == ()
    assert c.deadline == DeadlineConfig(default_timeout=10.0, margin=0.5)
    assert c.patch.denied_paths == ("/metadata/name", "/metadata/namespace", "/metadata/uid", "/status")
    assert (c.patch.allowed_paths, c.patch.repair, c.patch.max_size, c.patch.max_operations) == (
        (),
        True,
        1024 * 1024,
        1000,
    )
    assert c.log == LogConfig(format="text", level="info")
    assert (c.failure_policy, c.annotate_status, c.workers) == ("auto", True, 1)


def test_annotate_skipped_is_the_old_name_of_annotate_status() -> None:
    assert parse_config({"annotate_skipped": False}).annotate_status is False
    assert parse_config({"annotate_skipped": True}) == Config()


@pytest.mark.parametrize(
    "url, allowed",
    [
        ("http://ep.team-a.svc:8080/mutate", True),
        ("https://ep.team-a.svc/mutate", True),
        ("http://ep.team-a.svc.cluster.local:80/", True),
        ("http://127.0.0.1:8090/user-env", False),
        ("http://169.254.169.254/latest/meta-data", False),
        ("http://ep.team-a.svc.evil.example/", False),
    ],
)
def test_default_allow_list_is_in_cluster_services_only(url: str, allowed: bool) -> None:
    assert Config().endpoints.allowed(parse_endpoint_url(url)) is allowed


def test_overrides_take_the_first_match_and_inherit_the_defaults() -> None:
    config = parse_config(
        {
            "endpoints": {
                "timeout": "3s",
                "pool_size": 8,
                "breaker": {"cooldown": "7s"},
                "overrides": [
                    {"match": "http://slow.team-a.svc:*/*", "timeout": "9s", "breaker": {"consecutive_failures": 2}},
                    {"match": "http://*.svc:*/*", "timeout": "1s"},
                ],
            }
        }
    )
    slow = config.endpoints.settings_for(parse_endpoint_url("http://slow.team-a.svc:8080/m"))
    assert (slow.timeout, slow.pool_size) == (9.0, 8)
    assert (slow.breaker.consecutive_failures, slow.breaker.cooldown) == (2, 7.0)
    other = config.endpoints.settings_for(parse_endpoint_url("http://fast.team-a.svc:8080/m"))
    assert (other.timeout, other.pool_size) == (1.0, 8)
    rest = config.endpoints.settings_for(parse_endpoint_url("http://x.example:8080/m"))
    assert rest == config.endpoints.defaults
    assert rest.timeout == 3.0


def test_yaml_infinity_is_not_a_duration() -> None:
    with pytest.raises(ConfigError, match=r"^endpoints\.timeout: "):
        parse_config(yaml.safe_load("endpoints: {timeout: .inf}"))


def test_yaml_number_for_min_version_is_accepted() -> None:
    assert parse_config(yaml.safe_load("tls: {min_version: 1.3}")).tls.min_version == "1.3"


# ---------------------------------------------------------------- value parsers


@pytest.mark.parametrize(
    "value, seconds",
    [
        ("250ms", 0.25),
        ("2s", 2.0),
        ("1m", 60.0),
        ("1h", 3600.0),
        ("1.5s", 1.5),
        ("10", 10.0),
        (3, 3.0),
        (0.5, 0.5),
        (" 2s ", 2.0),
    ],
)
def test_parse_duration(value: Any, seconds: float) -> None:
    assert parse_duration(value) == seconds


@pytest.mark.parametrize(
    "value", ["2 seconds", "1m30s", "-1s", "s", "", True, None, [], -1, float("nan"), float("inf"), ".inf"]
)
def test_parse_duration_rejects(value: Any) -> None:
    with pytest.raises(ValueError):
        parse_duration(value)


@pytest.mark.parametrize(
    "value, size",
    [
        ("3MiB", 3 * 1024 * 1024),
        ("512KiB", 512 * 1024),
        ("1MB", 1000 * 1000),
        ("1G", 1024**3),
        (1048576, 1048576),
        ("100", 100),
        ("100B", 100),
    ],
)
def test_parse_size(value: Any, size: int) -> None:
    assert parse_size(value) == size


@pytest.mark.parametrize("value", ["3 megabytes", "1.5MiB", "-1", True, None, 1.5, -1])
def test_parse_size_rejects(value: Any) -> None:
    with pytest.raises(ValueError):
        parse_size(value)


# ---------------------------------------------------------------- errors name the key

NS = "kubernetes.namespaces.team-a"


def static(spec: Any) -> dict:
    return {"kubernetes": {"source": "static", "namespaces": {"team-a": spec}}}


ERRORS = [
    # (raw config, dotted key, fragment of the problem)
    ({"listen": {"port": "8443x"}}, "listen.port", "expected a whole number"),
    ({"listen": {"port": 70000}}, "listen.port", "expected a port number 0-65535"),
    ({"listen": {"port": True}}, "listen.port", "expected a whole number"),
    ({"listen": {"port": 8443.5}}, "listen.port", "expected a whole number"),
    (
        {"listen": {"prot": 8443}},
        "listen.prot",
        "unknown key (did you mean port?) (known keys: drain_timeout, idle_timeout, interface",
    ),
    ({"listen": {"interface": ""}}, "listen.interface", "non-empty string"),
    ({"listen": {"max_body": "3 megabytes"}}, "listen.max_body", "expected a size"),
    ({"listen": {"max_body": 0}}, "listen.max_body", "greater than zero"),
    ({"listen": {"max_connections": 0}}, "listen.max_connections", "greater than zero"),
    ({"listen": {"drain_timeout": 0}}, "listen.drain_timeout", "greater than zero"),
    ({"listen": {"request_timeout": "10 seconds"}}, "listen.request_timeout", "expected a duration"),
    ({"listen": {"request_timeout": 0}}, "listen.request_timeout", "greater than zero"),
    ({"listen": {"idle_timeout": float("nan")}}, "listen.idle_timeout", "expected a duration"),
    ({"endpoints": {"timeout": float("inf")}}, "endpoints.timeout", "expected a duration"),
    ({"listen": "8443"}, "listen", "expected a mapping"),
    ({"listen": [8443]}, "listen", "expected a mapping"),
    ({"tls": {"min_version": "1.1"}}, "tls.min_version", "expected 1.2 or 1.3"),
    ({"tls": {"cert": 5}}, "tls.cert", "non-empty string"),
    ({"tls": {"reload_interval": "0s"}}, "tls.reload_interval", "greater than zero"),
    ({"tls": {"ca": "x"}}, "tls.ca", "unknown key"),
    ({"metrics": {"port": -1}}, "metrics.port", "port number"),
    ({"metrics": {"debug_reviews": -1}}, "metrics.debug_reviews", "negative"),
    ({"metrics": {"debug_reviews": "lots"}}, "metrics.debug_reviews", "whole number"),
    ({"kubernetes": {"source": "etcd"}}, "kubernetes.source", "expected one of cluster, kubeconfig, static"),
    ({"kubernetes": {"source": "kubeconfig"}}, "kubernetes.kubeconfig", "required"),
    (
        {"kubernetes": {"endpoint_annotations": "amp.txn2.com/ep"}},
        "kubernetes.endpoint_annotations",
        "expected a list of strings",
    ),
    ({"kubernetes": {"endpoint_annotations": ["a", ""]}}, "kubernetes.endpoint_annotations", "item 1"),
    (
        {"kubernetes": {"backoff_initial": "10s", "backoff_max": "1s"}},
        "kubernetes.backoff_max",
        "at least backoff_initial",
    ),
    ({"kubernetes": {"per_review_get": "yes"}}, "kubernetes.per_review_get", "expected true or false"),
    ({"kubernetes": {"namespaces": {"team-a": {}}}}, "kubernetes.namespaces", "only used with"),
    ({"kubernetes": {"source": "static", "namespaces": ["team-a"]}}, "kubernetes.namespaces", "expected a mapping"),
    (static(["x"]), NS, "expected a mapping with labels and annotations"),
    (static({"lables": {}}), f"{NS}.lables", "unknown key (did you mean labels?)"),
    (static({"labels": {"amp.txn2.com/enabled": True}}), f"{NS}.labels", 'quote "true"'),
    (static({"labels": {"amp.txn2.com/enabled": 1}}), f"{NS}.labels", "keys and values must be strings"),
    (static({"annotations": {"amp.txn2.com/ep": None}}), f"{NS}.annotations", "keys and values must be strings"),
    (static({"labels": ["amp.txn2.com/enabled"]}), f"{NS}.labels", "expected a mapping of strings"),
    ({"endpoints": {"timeout": "fast"}}, "endpoints.timeout", "expected a duration"),
    ({"endpoints": {"max_response": -1}}, "endpoints.max_response", "must not be negative"),
    ({"endpoints": {"pool_size": 0}}, "endpoints.pool_size", "greater than zero"),
    ({"endpoints": {"retry": 1}}, "endpoints.retry", "expected true or false"),
    (
        {"endpoints": {"timeot": "1s"}},
        "endpoints.timeot",
        "unknown key (did you mean timeout?) (known keys: allow, breaker",
    ),
    ({"endpoints": {"allow": "http://127.0.0.1:*/*"}}, "endpoints.allow", "expected a list of strings"),
    ({"endpoints": {"allow": ["http://127.0.0.1:*/*", ""]}}, "endpoints.allow", "item 1"),
    ({"endpoints": {"allow": ["ftp://127.0.0.1/*"]}}, "endpoints.allow", "item 0: URL pattern 'ftp://127.0.0.1/*'"),
    ({"endpoints": {"allow": ["http://h:80800/*"]}}, "endpoints.allow", "port must be"),
    ({"endpoints": {"deny_networks": ["10.0.0.0/33"]}}, "endpoints.deny_networks", "item 0"),
    ({"endpoints": {"client_cert": "c.crt"}}, "endpoints.client_cert", "must be set together"),
    ({"endpoints": {"client_key": "c.key"}}, "endpoints.client_cert", "must be set together"),
    ({"endpoints": {"breaker": {"failure_ratio": 2}}}, "endpoints.breaker.failure_ratio", "(0, 1]"),
    (
        {"endpoints": {"breaker": {"cooldown": "10s", "max_cooldown": "1s"}}},
        "endpoints.breaker.max_cooldown",
        "at least breaker.cooldown",
    ),
    ({"endpoints": {"breaker": {"open": True}}}, "endpoints.breaker.open", "unknown key"),
    ({"endpoints": {"overrides": {"match": "x"}}}, "endpoints.overrides", "expected a list"),
    ({"endpoints": {"overrides": [{"timeout": "1s"}]}}, "endpoints.overrides[0]", "'match' URL pattern"),
    ({"endpoints": {"overrides": [{"match": "http://a:*/*"}, "x"]}}, "endpoints.overrides[1]", "'match'"),
    ({"endpoints": {"overrides": [{"match": "nope"}]}}, "endpoints.overrides[0].match", "scheme://"),
    (
        {"endpoints": {"overrides": [{"match": "http://a:*/*", "timeout": "x"}]}},
        "endpoints.overrides[0].timeout",
        "expected a duration",
    ),
    (
        {"endpoints": {"overrides": [{"match": "http://a:*/*", "allow": []}]}},
        "endpoints.overrides[0].allow",
        "unknown key",
    ),
    (
        {"endpoints": {"overrides": [{"match": "http://a:*/*", "client_key": "k"}]}},
        "endpoints.overrides[0].client_cert",
        "must be set together",
    ),
    (
        {"endpoints": {"overrides": [{"match": "http://a:*/*", "breaker": {"window": "soon"}}]}},
        "endpoints.overrides[0].breaker.window",
        "expected a duration",
    ),
    ({"deadline": {"margin": "-1s"}}, "deadline.margin", "expected a duration"),
    ({"deadline": {"default_timeout": 0}}, "deadline.default_timeout", "greater than zero"),
    ({"patch": {"repair": "yes"}}, "patch.repair", "expected true or false"),
    ({"patch": {"denied_paths": "/status"}}, "patch.denied_paths", "expected a list of strings"),
    ({"patch": {"max_size": "big"}}, "patch.max_size", "expected a size"),
    ({"log": {"format": "xml"}}, "log.format", "expected one of text, json"),
    ({"log": {"level": "verbose"}}, "log.level", "expected one of debug, info, warn, error"),
    ({"failure_policy": "ignore"}, "failure_policy", "expected one of auto, Ignore, Fail, got 'ignore'"),
    ({"annotate_skipped": "no"}, "annotate_skipped", "expected true or false"),
    ({"annotate_status": "no"}, "annotate_status", "expected true or false"),
    ({"annotate_status": False, "annotate_skipped": False}, "annotate_skipped", "renamed to annotate_status"),
    ({"workers": 0}, "workers", "greater than zero"),
    (
        {"listne": {}},
        "listne",
        "unknown key (did you mean listen?) (known keys: annotate_status, audit, deadline, endpoints",
    ),
    ({"zzz": {}}, "zzz", "unknown key (known keys: annotate_status,"),
]


@pytest.mark.parametrize("raw, key, fragment", ERRORS, ids=[f"{i}-{e[1]}" for i, e in enumerate(ERRORS)])
def test_errors_name_the_dotted_key(raw: dict, key: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_config(raw)
    message = str(e.value)
    assert message.startswith(key + ": "), message
    assert fragment in message, message


def test_top_level_must_be_a_mapping() -> None:
    with pytest.raises(ConfigError, match=r"^\(top level\): expected a mapping"):
        parse_config(["listen"])


def test_load_config_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as e:
        load_config(str(path))
    assert str(e.value) == f"(file): {path}: file not found"


def test_load_config_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is a directory"):
        load_config(str(tmp_path))


def test_load_config_invalid_yaml(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("listen: {port: 8443\ntls: [\n")
    with pytest.raises(ConfigError) as e:
        load_config(str(path))
    # libyaml's wording (PyYAML's own parser says "expected ..., but got ':'").
    assert str(e.value).startswith(f"(file): {path} is not valid YAML: line 2, column 4: ")
    assert str(e.value).endswith("expected ',' or '}' (while parsing a flow mapping)")


def test_load_config_reports_the_key_of_a_wrong_value(tmp_path: Path) -> None:
    path = tmp_path / "amp.yaml"
    path.write_text(ISSUE_CONFIG.replace("timeout: 2s", "timeout: 2 seconds"))
    with pytest.raises(ConfigError, match=r"^endpoints\.timeout: expected a duration"):
        load_config(str(path))


def test_empty_file_is_all_defaults(tmp_path: Path) -> None:
    path = tmp_path / "amp.yaml"
    path.write_text("# nothing\n")
    assert load_config(str(path)) == Config()


def test_breaker_settings_need_an_override_that_covers_the_origin() -> None:
    """
    A breaker guards a whole origin: breaker settings on a path-only
    override would silently not apply, so the config refuses them.
    """
    with pytest.raises(ConfigError, match=r"^endpoints\.overrides\[0\]\.breaker: .*covers '/'"):
        parse_config({"endpoints": {"overrides": [{"match": "http://a.svc:80/hang*", "breaker": {"cooldown": "1s"}}]}})
    config = parse_config({"endpoints": {"overrides": [{"match": "http://a.svc:80/*", "breaker": {"cooldown": "1s"}}]}})
    assert config.endpoints.overrides[0].settings.breaker.cooldown == 1.0


def test_effective_config_loads_back_to_the_same_config() -> None:
    from amp.config import effective_config

    raw = {
        "listen": {"port": 9443},
        "endpoints": {
            "timeout": "2s",
            "deny_networks": ["link-local", "10.0.0.0/8"],
            "chain_limit": 2,
            "overrides": [{"match": "https://*.svc:*/*", "max_response": "2MiB", "breaker": {"cooldown": "10s"}}],
        },
        "kubernetes": {"source": "static", "namespaces": {"a": {"labels": {"x": "y"}, "annotations": {"k": "v"}}}},
        "patch": {"denied_paths": ["/status"]},
        "metrics": {"debug_reviews": 0},
    }
    for config in (Config(), parse_config(raw)):
        shown = effective_config(config)
        assert parse_config(yaml.safe_load(yaml.safe_dump(shown))) == config


def test_effective_config_masks_credentials_in_annotation_values() -> None:
    from amp.config import effective_config

    config = parse_config(
        {
            "kubernetes": {
                "source": "static",
                "namespaces": {
                    "a": {
                        "annotations": {
                            "amp.txn2.com/ep": "https://me:pw@ep.team.svc:8443/m?key=abc,http://ep2.svc:80/x",
                            "plain": "no url here",
                        }
                    }
                },
            }
        }
    )
    annotations = effective_config(config)["kubernetes"]["namespaces"]["a"]["annotations"]
    assert annotations == {
        "amp.txn2.com/ep": "https://***@ep.team.svc:8443/m,http://ep2.svc:80/x",
        "plain": "no url here",
    }


def test_config_summary_names_what_an_operator_checks_first() -> None:
    from amp.config import config_digest, config_summary

    static = parse_config(
        {
            "listen": {"port": 9443, "interface": "127.0.0.1"},
            "failure_policy": "Fail",
            "workers": 2,
            "kubernetes": {"source": "static", "namespaces": {"a": {}, "b": {}}},
            "endpoints": {"allow": ["http://*.svc:*/*"]},
        }
    )
    assert config_summary(static) == (
        "listen 127.0.0.1:9443, namespaces from static (2 namespaces), failure policy Fail, "
        f"endpoints.allow 1 patterns, workers 2, config {config_digest(static)}"
    )
    assert "namespaces from cluster (all namespaces, watched)" in config_summary(Config())
