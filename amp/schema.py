"""
amp's configuration as a JSON Schema, generated from the declaration in
L{amp.config} (every key's parser), for the Helm chart's
C{values.schema.json} (its C{config} part): the chart refuses what amp would
refuse at start-up, e.g. C{--set config.endpoint.timeout=3s} (no such key)
or C{config.listen.port=http}.

    python -m amp.schema                    print the config schema
    python -m amp.schema --write FILE       set FILE's properties.config to it
    python -m amp.schema --check FILE       exit 1 if FILE's differs

(C{make schema} writes the chart's.)  Every object is closed
(C{additionalProperties: false}); a value's schema comes from its parser,
so a parser this module does not know is an error here, not a silently open
key.  Checks that need more than one key (C{client_cert} with
C{client_key}, C{backoff_max} at least C{backoff_initial}) stay amp's own.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import sys
from typing import Any, Callable, Optional, Sequence

from amp import config as c

__all__ = ["config_schema", "main"]

Schema = dict[str, Any]


def _number_or_text(pattern: str, integer: bool = False) -> Schema:
    return {"type": ["string", "integer" if integer else "number"], "pattern": pattern, "minimum": 0}


def _base() -> dict[Callable[[Any], Any], Schema]:
    """The schema of each plain parser of amp.config."""
    strings = {"type": "array", "items": {"type": "string", "minLength": 1}}
    return {
        c.parse_duration: _number_or_text(c._DURATION.pattern),
        c.parse_size: _number_or_text(c._SIZE.pattern, integer=True),
        c._int: {"type": "integer"},
        c._nonneg_int: {"type": "integer", "minimum": 0},
        c._port: {"type": "integer", "minimum": 0, "maximum": 65535},
        c._bool: {"type": "boolean"},
        c._str: {"type": "string", "minLength": 1},
        c._opt_str: {"type": ["string", "null"], "minLength": 1},
        c._ratio: {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        c._tls_version: {"enum": ["1.2", "1.3", 1.2, 1.3]},
        c._str_list: strings,
        c._patterns: strings,
        c._pointers: {"type": "array", "items": {"type": "string", "pattern": "^(/.*)?$"}},
        c._networks: strings,
        c._str_map: {"type": ["object", "null"], "additionalProperties": {"type": "string"}},
    }


def value_schema(parse: Callable[[Any], Any]) -> Schema:
    """
    The schema of the values C{parse} accepts: a plain parser's, or that of
    C{_positive(p)} (above zero) and C{_choice(...)} (one of).

    @raise ValueError: a parser this module does not know.
    """
    base = _base()
    if parse in base:
        return dict(base[parse])
    closure = inspect.getclosurevars(parse).nonlocals
    if "choices" in closure:
        return {"enum": list(closure["choices"])}
    if "parse" in closure:
        inner = value_schema(closure["parse"])
        if inner.get("type") == "integer":
            inner["minimum"] = 1
        else:
            inner.pop("minimum", None)
            inner["exclusiveMinimum"] = 0
        return inner
    raise ValueError(f"no schema for the parser {parse.__qualname__}; say in amp.schema what it accepts")


def _closed(properties: dict[str, Schema]) -> Schema:
    return {"type": ["object", "null"], "additionalProperties": False,
            "properties": dict(sorted(properties.items()))}


def _section(cls: type, leave_out: Sequence[str] = ()) -> dict[str, Schema]:
    return {name: value_schema(parse) for name, parse in c._FIELDS[cls].items() if name not in leave_out}


def _endpoints() -> Schema:
    breaker = _closed(_section(c.BreakerConfig))
    settings = {**_section(c.EndpointSettings), "breaker": breaker}
    override = _closed({**settings, "match": {"type": "string", "minLength": 1}})
    override["required"] = ["match"]
    override["type"] = "object"
    return _closed({
        **settings,
        "allow": value_schema(c._patterns),
        "deny_networks": value_schema(c._networks),
        "chain_limit": value_schema(c._positive(c._int)),
        "max_buffered": value_schema(c._positive(c.parse_size)),
        "overrides": {"type": ["array", "null"], "items": override},
    })


def _kubernetes() -> Schema:
    namespace = _closed({"labels": value_schema(c._str_map), "annotations": value_schema(c._str_map)})
    return _closed({
        **_section(c.KubernetesConfig),
        "bypass": _closed(_section(c.BypassConfig)),
        "namespaces": {"type": ["object", "null"], "additionalProperties": namespace},
    })


def config_schema() -> Schema:
    """
    The JSON Schema (draft 7) of amp's configuration file: every section
    and key amp's loader accepts, each object closed.
    """
    composite = {"endpoints": _endpoints, "kubernetes": _kubernetes}
    properties: dict[str, Schema] = {}
    for f in dataclasses.fields(c.Config):
        if f.name in composite:
            properties[f.name] = composite[f.name]()
        elif f.name in c._SCALARS:
            properties[f.name] = value_schema(c._SCALARS[f.name])
        else:
            cls = type(getattr(c.Config(), f.name))
            properties[f.name] = _closed(_section(cls))
    schema = _closed(properties)
    schema["description"] = ("amp's configuration (amp.yaml), generated from amp.config by "
                             "`python -m amp.schema`: every key is in docs/config.md.")
    return schema


def _with_config(path: str, schema: Schema) -> tuple[str, str]:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    doc = json.loads(text)
    doc["properties"]["config"] = schema
    return text, json.dumps(doc, indent=2) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m amp.schema", description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", metavar="FILE", help="set FILE's properties.config (a chart's values.schema.json)")
    group.add_argument("--check", metavar="FILE", help="exit 1 if FILE's properties.config is not the generated one")
    args = parser.parse_args(argv)
    schema = config_schema()
    if args.write is None and args.check is None:
        sys.stdout.write(json.dumps(schema, indent=2) + "\n")
        return 0
    path = args.write or args.check
    old, new = _with_config(path, schema)
    if args.check is not None:
        if old != new:
            sys.stderr.write(f"{path}: properties.config differs from amp's config declaration; "
                             f"run: python -m amp.schema --write {path}\n")
            return 1
        return 0
    with open(path, "w", encoding="utf-8") as f:
        f.write(new)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
