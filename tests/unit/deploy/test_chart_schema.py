"""
Tests for the Helm chart's values.schema.json without helm: its C{config}
part is what L{amp.schema} generates from amp's config declaration (the
test fails on drift: run C{make schema}), every object in it is closed, and
it accepts and refuses what amp's own loader does.  tests/integration/deploy/test_chart.py
runs the same schema through helm.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import jsonschema
import pytest
import yaml

from amp.config import ConfigError, effective_config, load_config, parse_config
from amp.schema import config_schema, main
from tests.support.helpers import dev_tls

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "deploy" / "chart" / "amp"
SCHEMA = json.loads((CHART / "values.schema.json").read_text())
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())

#: Where the chart passes a Kubernetes object through as it is (the API
#: server checks it): the only objects without a closed list of keys.
PASS_THROUGH = {"/tolerations/items", "/affinity/nodeAffinity", "/affinity/podAffinity", "/affinity/podAntiAffinity"}


def objects(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema in C{schema} that admits an object, with its path."""
    kind = schema.get("type")
    if kind == "object" or (isinstance(kind, list) and "object" in kind):
        yield path, schema
    for name, sub in (schema.get("properties") or {}).items():
        yield from objects(sub, f"{path}/{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            yield from objects(schema[key], f"{path}/{key}")


def test_the_config_part_is_generated_from_amps_declaration() -> None:
    assert SCHEMA["properties"]["config"] == config_schema(), "run: make schema"
    assert main(["--check", str(CHART / "values.schema.json")]) == 0


def test_the_check_notices_drift(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    copy = dict(SCHEMA, properties={**SCHEMA["properties"], "config": {"type": "object"}})
    path = tmp_path / "values.schema.json"
    path.write_text(json.dumps(copy))
    assert main(["--check", str(path)]) == 1
    assert capsys.readouterr().err == (
        f"{path}: properties.config differs from amp's config declaration; run: python -m amp.schema --write {path}\n"
    )
    assert main(["--write", str(path)]) == 0
    assert main(["--check", str(path)]) == 0


def test_every_object_is_closed() -> None:
    jsonschema.Draft7Validator.check_schema(SCHEMA)
    open_ = [
        path for path, schema in objects(SCHEMA) if "additionalProperties" not in schema and path not in PASS_THROUGH
    ]
    assert open_ == []
    assert SCHEMA["additionalProperties"] is False


def test_the_default_values_are_valid() -> None:
    jsonschema.validate(VALUES, SCHEMA)


def errors(values: dict[str, Any]) -> list[str]:
    return [
        f"/{'/'.join(map(str, e.absolute_path))}: {e.message}"
        for e in jsonschema.Draft7Validator(SCHEMA).iter_errors(values)
    ]


@pytest.mark.parametrize(
    "values, where",
    [
        ({"replica": 3}, "/: Additional properties are not allowed ('replica' was unexpected)"),
        ({"config": {"endpoint": {"timeout": "3s"}}}, "/config: Additional properties are not allowed ('endpoint'"),
        ({"image": {"tga": "1"}}, "/image: Additional properties are not allowed"),
        ({"webhook": {"namespaceSelector": {"matchLabel": {}}}}, "/webhook/namespaceSelector: Additional properties"),
        ({"monitoring": {"serviceMonitor": {"intervall": "1m"}}}, "/monitoring/serviceMonitor: Additional properties"),
        ({"autoscaling": {"enabled": "yes"}}, "/autoscaling/enabled: 'yes' is not of type 'boolean'"),
    ],
)
def test_misspelt_values_are_refused_where_they_are(values: dict[str, Any], where: str) -> None:
    assert any(e.startswith(where) for e in errors({**VALUES, **values})), errors({**VALUES, **values})


def test_overrides_are_values() -> None:
    assert errors({**VALUES, "nameOverride": "mutator", "fullnameOverride": "foo"}) == []


def config_errors(config: dict[str, Any]) -> list[str]:
    return errors({**VALUES, "config": config})


def rich_config() -> dict[str, Any]:
    """Every section and key amp has, with a namespace and an override."""
    tls = dev_tls()
    return {
        "kubernetes": {"source": "static", "namespaces": {"a": {"labels": {"x": "y"}, "annotations": {"z": "w"}}}},
        "endpoints": {
            "overrides": [{"match": "http://*.svc:*/*", "timeout": "2s", "breaker": {"cooldown": "1s"}}],
            "client_cert": str(tls["cert"]),
            "client_key": str(tls["key"]),
            "deny_networks": ["metadata"],
        },
        "tls": {"client_ca": str(tls["cert"])},
    }


def test_every_key_amp_knows_is_in_the_schema() -> None:
    """
    The effective configuration names every key amp's loader has, defaults
    filled in (durations in seconds, sizes in bytes): the closed schema
    accepts all of it.
    """
    full = effective_config(parse_config(rich_config()))
    assert config_errors(full) == []
    assert config_errors(rich_config()) == []


def test_the_examples_config_is_valid() -> None:
    raw = yaml.safe_load((REPO / "etc" / "amp.yaml").read_text())
    load_config(str(REPO / "etc" / "amp.yaml"))
    assert config_errors(raw) == []


@pytest.mark.parametrize(
    "config",
    [
        {"endpoint": {"timeout": "3s"}},
        {"listen": {"port": "http"}},
        {"listen": {"port": 70000}},
        {"endpoints": {"timeout": "soon"}},
        {"endpoints": {"timeout": 0}},
        {"log": {"level": "verbose"}},
        {"workers": 0},
        {"tls": {"min_version": "1.1"}},
        {"failure_policy": "ignore"},
        {"endpoints": {"overrides": [{"timeout": "1s"}]}},
        {"endpoints": {"breaker": {"failure_ratio": 2}}},
        {"kubernetes": {"source": "static", "namespaces": {"a": {"label": {}}}}},
        {"patch": {"max_size": "3 parsecs"}},
        {"kubernetes": {"bypass": {"enable": True}}},
    ],
    ids=lambda c: json.dumps(c),
)
def test_the_schema_refuses_what_amp_refuses(config: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        parse_config(config)
    assert config_errors(config) != []
