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
import json
import sys
from typing import Any, Optional, Sequence

from amp import config as c
from amp.config import Kind, declared_kinds

__all__ = ["config_schema", "main", "value_schema"]

Schema = dict[str, Any]

_STRINGS: Schema = {"type": "array", "items": {"type": "string", "minLength": 1}}
_STRING_MAP: Schema = {"type": ["object", "null"], "additionalProperties": {"type": "string"}}


def value_schema(kind: Kind) -> Schema:
    """
    The schema of the values of C{kind} (L{amp.config.Kind}: its name,
    choices, bounds and pattern).

    @raise ValueError: a kind this module does not know.
    """
    name = kind.name
    if name == "choice":
        if kind.choices == ("1.2", "1.3"):
            # The TLS version: YAML reads an unquoted 1.2 as a number.
            return {"enum": ["1.2", "1.3", 1.2, 1.3]}
        return {"enum": list(kind.choices)}
    if name in ("duration", "size"):
        schema: Schema = {"type": ["string", "integer" if name == "size" else "number"], "pattern": kind.pattern}
        schema["exclusiveMinimum" if kind.exclusive else "minimum"] = 0
        return schema
    if name == "integer":
        schema = {"type": "integer"}
        if kind.minimum is not None:
            schema["minimum"] = int(kind.minimum) + (1 if kind.exclusive else 0)
        return schema
    if name == "port":
        return {"type": "integer", "minimum": 0, "maximum": 65535}
    if name == "boolean":
        return {"type": "boolean"}
    if name == "string":
        return {"type": ["string", "null"] if kind.nullable else "string", "minLength": 1}
    if name == "ratio":
        return {"type": "number", "exclusiveMinimum": 0, "maximum": 1}
    if name == "share":
        return {"type": ["number", "null"], "minimum": 0, "maximum": 1}
    if name in ("list of strings", "list of URL patterns", "list of networks"):
        return dict(_STRINGS)
    if name == "list of JSON pointers":
        return {"type": "array", "items": {"type": "string", "pattern": "^(/.*)?$"}}
    if name == "mapping":
        return dict(_STRING_MAP)
    if name == "list of matchExpressions":
        return {
            "type": ["array", "null"],
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["key", "operator"],
                "properties": {
                    "key": {"type": "string", "minLength": 1},
                    "operator": {"enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
                    "values": dict(_STRINGS),
                },
            },
        }
    raise ValueError(f"no schema for values of kind {name!r}; say in amp.schema what it accepts")


def _closed(properties: dict[str, Schema]) -> Schema:
    return {"type": ["object", "null"], "additionalProperties": False, "properties": dict(sorted(properties.items()))}


def _section(cls: type, leave_out: Sequence[str] = ()) -> dict[str, Schema]:
    """The schema of every key section C{cls} declares itself (not its sections), by name."""
    return {name: value_schema(kind) for name, kind in declared_kinds(cls).items() if name not in leave_out}


def _endpoints() -> Schema:
    breaker = _closed(_section(c.BreakerConfig))
    # endpoints.max_buffered is one bound for every call: not an override's.
    settings = {**_section(c.EndpointSettings, ("max_buffered",)), "breaker": breaker}
    override = _closed({**settings, "match": {"type": "string", "minLength": 1}})
    override["required"] = ["match"]
    override["type"] = "object"
    kinds = declared_kinds(c.EndpointsConfig)
    return _closed(
        {
            **settings,
            "allow": value_schema(kinds["allow"]),
            "deny_networks": value_schema(kinds["deny_networks"]),
            "chain_limit": value_schema(kinds["chain_limit"]),
            "max_buffered": value_schema(declared_kinds(c.EndpointSettings)["max_buffered"]),
            "overrides": {"type": ["array", "null"], "items": override},
        }
    )


def _kubernetes() -> Schema:
    # A static namespace: its labels and annotations, strings each.
    namespace = _closed({"labels": dict(_STRING_MAP), "annotations": dict(_STRING_MAP)})
    return _closed(
        {
            **_section(c.KubernetesConfig, ("namespaces",)),
            "bypass": _closed(_section(c.BypassConfig)),
            "namespaces": {"type": ["object", "null"], "additionalProperties": namespace},
        }
    )


def config_schema() -> Schema:
    """
    The JSON Schema (draft 7) of amp's configuration file: every section
    and key amp's loader accepts, each object closed, each value's schema
    from its key's declaration (L{amp.config.KEYS}).
    """
    composite = {"endpoints": _endpoints, "kubernetes": _kubernetes}
    scalars = declared_kinds(c.Config)
    properties: dict[str, Schema] = {}
    defaults = c.Config()
    for name in (f.name for f in dataclasses.fields(c.Config)):
        if name in composite:
            properties[name] = composite[name]()
        elif name in scalars:
            properties[name] = value_schema(scalars[name])
        else:
            properties[name] = _closed(_section(type(getattr(defaults, name))))
    schema = _closed(properties)
    schema["description"] = (
        "amp's configuration (amp.yaml), generated from amp.config by "
        "`python -m amp.schema`: every key is in docs/config.md."
    )
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
            sys.stderr.write(
                f"{path}: properties.config differs from amp's config declaration; "
                f"run: python -m amp.schema --write {path}\n"
            )
            return 1
        return 0
    with open(path, "w", encoding="utf-8") as f:
        f.write(new)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
