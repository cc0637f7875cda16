"""
The kinds of value a configuration key holds (pure): how each is parsed from
the YAML document and how a value of it is written back in a file (the
defaults in C{docs/config.md}, C{twistd amp --check}).

A L{Kind} is named for what the key holds (C{duration}, C{size},
C{integer}, ...), so a key's declaration says its type once and its parser
and the way its default is shown follow from it.
"""

from __future__ import annotations

import ipaddress
import math
import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Callable, Mapping, Optional

import yaml

from amp.pointer import parse_pointer
from amp.urls import URLPattern, parse_networks

__all__ = [
    "Kind",
    "parse_duration",
    "parse_size",
    "show_duration",
    "show_size",
    "BOOL",
    "DURATION",
    "EXPRESSIONS",
    "INT",
    "MAPPING",
    "NETWORKS",
    "NONNEG_INT",
    "OPT_STR",
    "POINTERS",
    "PORT",
    "POSITIVE_DURATION",
    "SHARE",
    "POSITIVE_INT",
    "POSITIVE_SIZE",
    "RATIO",
    "STR",
    "STR_LIST",
    "TLS_VERSION",
    "URL_PATTERNS",
    "choice",
    "OVERRIDES",
    "STATIC_NAMESPACES",
]

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}
_SIZE = re.compile(r"^\s*(\d+)\s*(B|KiB|MiB|GiB|KB|MB|GB|k|K|M|G)?\s*$")
_SIZE_UNITS = {
    None: 1,
    "B": 1,
    "k": 1024,
    "K": 1024,
    "KiB": 1024,
    "KB": 1000,
    "M": 1024**2,
    "MiB": 1024**2,
    "MB": 1000**2,
    "G": 1024**3,
    "GiB": 1024**3,
    "GB": 1000**3,
}


def parse_duration(value: Any) -> float:
    """
    C{250ms}, C{2s}, C{1m}, C{1h} or a bare number of seconds -> seconds.
    """
    if isinstance(value, bool):
        raise ValueError("expected a duration like 250ms, 2s or 1m")
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            raise ValueError(f"expected a duration like 250ms, 2s or 1m, got {value!r}")
        if value < 0:
            raise ValueError("must not be negative")
        return float(value)
    m = _DURATION.match(str(value)) if isinstance(value, str) else None
    if not m:
        raise ValueError(f"expected a duration like 250ms, 2s or 1m, got {value!r}")
    return float(m.group(1)) * _UNITS[m.group(2)]


def parse_size(value: Any) -> int:
    """
    C{3MiB}, C{512KiB}, C{1048576} -> bytes.
    """
    if isinstance(value, bool):
        raise ValueError("expected a size like 512KiB or 3MiB")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("must not be negative")
        return value
    m = _SIZE.match(value) if isinstance(value, str) else None
    if not m:
        raise ValueError(f"expected a size like 512KiB or 3MiB, got {value!r}")
    return int(m.group(1)) * _SIZE_UNITS[m.group(2)]


def show_duration(seconds: float) -> str:
    """
    Seconds as a duration is written: C{500ms}, C{10s}, C{60s}, C{2m}, C{1h}.
    """
    if seconds and seconds % 3600 == 0:
        return f"{int(seconds // 3600)}h"
    if seconds > 60 and seconds % 60 == 0:
        return f"{int(seconds // 60)}m"
    if seconds == int(seconds):
        return f"{int(seconds)}s"
    return f"{round(seconds * 1000):g}ms"


def show_size(size: int) -> str:
    """
    Bytes as a size is written: C{3MiB}, C{16KiB}, or a bare number.
    """
    for unit, factor in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if size and size % factor == 0:
            return f"{size // factor}{unit}"
    return str(size)


def _scalar(value: Any) -> str:
    """A scalar as YAML reads it back: quoted where it would read as another type."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        text = str(value)
        try:
            plain = bool(text) and yaml.safe_load(text) == text
        except yaml.YAMLError:
            plain = False
        return text if plain else f'"{text}"'
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _show_list(items: Any) -> str:
    return "[" + ", ".join(_scalar(getattr(item, "text", item)) for item in items) + "]"


@dataclass(frozen=True)
class Kind:
    """
    What a key holds.

    @ivar name: the type in words (C{duration}, C{size}, C{integer},
        C{port}, C{boolean}, C{string}, C{list of strings}, ...).
    @ivar parse: the YAML value -> the value amp keeps; raises
        C{ValueError} with the problem.  None for the keys the loader reads
        itself (their items are keyed: C{kubernetes.namespaces},
        C{endpoints.overrides}).
    @ivar show: a value -> as it is written in a file.
    @ivar choices: the values a C{choice} accepts, in order; else empty.
    @ivar nullable: C{null} is a value of its own (the key is off or
        unset).
    @ivar minimum: the least value a number accepts, if bounded; with
        C{exclusive}, values must be greater than it.
    @ivar maximum: the greatest value a number accepts, if bounded.
    @ivar pattern: the regular expression a value written as text must
        match (durations and sizes), if any.
    """

    name: str
    parse: Optional[Callable[[Any], Any]]
    show: Callable[[Any], str] = _scalar
    choices: tuple[str, ...] = ()
    nullable: bool = False
    minimum: Optional[float] = None
    exclusive: bool = False
    maximum: Optional[float] = None
    pattern: Optional[str] = None

    def positive(self) -> "Kind":
        """This kind, greater than zero."""
        parse = self.parse
        assert parse is not None

        def check(value: Any) -> Any:
            v = parse(value)
            if v <= 0:
                raise ValueError(f"must be greater than zero, got {value!r}")
            return v

        return Kind(self.name, check, self.show, minimum=0, exclusive=True, pattern=self.pattern)


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected a whole number, got {value!r}")
    return value


def _nonneg_int(value: Any) -> int:
    v = _int(value)
    if v < 0:
        raise ValueError(f"must not be negative, got {value!r}")
    return v


def _port(value: Any) -> int:
    v = _int(value)
    if not 0 <= v < 65536:
        raise ValueError(f"expected a port number 0-65535, got {value!r}")
    return v


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"expected true or false, got {value!r}")
    return value


def _str(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"expected a non-empty string, got {value!r}")
    return value


def _opt_str(value: Any) -> Optional[str]:
    return None if value is None else _str(value)


def _ratio(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ValueError(f"expected a number in (0, 1], got {value!r}")
    return float(value)


def _share(value: Any) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ValueError(f"expected a number in [0, 1] or null, got {value!r}")
    return float(value)


def _str_list(value: Any) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise ValueError(f"expected a list of strings, got {value!r}")
    for i, item in enumerate(value):
        if not isinstance(item, str) or not item:
            raise ValueError(f"item {i}: expected a non-empty string, got {item!r}")
    return tuple(value)


def _patterns(value: Any) -> tuple[URLPattern, ...]:
    items = _str_list(value)
    out = []
    for i, item in enumerate(items):
        try:
            out.append(URLPattern.parse(item))
        except ValueError as e:
            raise ValueError(f"item {i}: {e}") from None
    return tuple(out)


def _pointers(value: Any) -> tuple[str, ...]:
    items = _str_list(value)
    for i, item in enumerate(items):
        try:
            parse_pointer(item)
        except ValueError as e:
            raise ValueError(f"item {i}: {item!r} is not a JSON pointer ({e})") from None
    return items


def _networks(value: Any) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    """
    C{endpoints.deny_networks}: CIDRs and names (L{amp.urls.NAMED_NETWORKS}).
    """
    return parse_networks(_str_list(value))


def _tls_version(value: Any) -> str:
    text = str(value)
    if text not in ("1.2", "1.3"):
        raise ValueError(f"expected 1.2 or 1.3, got {text!r}")
    return text


def _str_map(value: Any) -> Mapping[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"expected a mapping of strings, got {value!r}")
    for k, v in value.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise ValueError(f'{k!r}: keys and values must be strings (quote "true"), got {v!r}')
    return dict(value)


_SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


def _expressions(value: Any) -> tuple[tuple[str, str, tuple[str, ...]], ...]:
    """A label selector's C{matchExpressions}: (key, operator, values) each."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ValueError(f"expected a list of matchExpressions ({{key, operator, values}}), got {value!r}")
    out = []
    for i, item in enumerate(value):
        if not isinstance(item, dict) or not isinstance(item.get("key"), str) or not item["key"]:
            raise ValueError(f"[{i}]: expected {{key, operator, values}} with a key, got {item!r}")
        unknown = sorted(set(item) - {"key", "operator", "values"})
        if unknown:
            raise ValueError(f"[{i}]: unknown field(s) {', '.join(map(str, unknown))} (key, operator, values)")
        operator = item.get("operator")
        if operator not in _SELECTOR_OPERATORS:
            raise ValueError(f"[{i}]: operator must be one of {', '.join(_SELECTOR_OPERATORS)}, got {operator!r}")
        values = item.get("values") or []
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise ValueError(f'[{i}]: values must be a list of strings (quote "true"), got {values!r}')
        if operator in ("In", "NotIn") and not values:
            raise ValueError(f"[{i}]: operator {operator} needs values")
        if operator in ("Exists", "DoesNotExist") and values:
            raise ValueError(f"[{i}]: operator {operator} takes no values")
        out.append((item["key"], operator, tuple(values)))
    return tuple(out)


def _show_expressions(value: Any) -> str:
    return (
        "["
        + ", ".join(
            "{key: %s, operator: %s%s}" % (_scalar(k), o, f", values: {_show_list(v)}" if v else "")
            for k, o, v in value
        )
        + "]"
    )


def _show_map(value: Mapping[Any, Any]) -> str:
    return "{}" if not value else "{" + ", ".join(f"{k}: {_scalar(v)}" for k, v in value.items()) + "}"


def choice(choices: type[StrEnum] | tuple[str, ...]) -> Kind:
    """
    One of C{choices} (the members of a L{StrEnum}, or strings); an enum's
    member is what amp keeps.
    """
    values = tuple(str(c) for c in choices)
    enum = choices if isinstance(choices, type) else None

    def check(value: Any) -> Any:
        if value not in values:
            raise ValueError(f"expected one of {', '.join(values)}, got {value!r}")
        return enum(value) if enum is not None else value

    return Kind("choice", check, choices=values)


DURATION = Kind("duration", parse_duration, show_duration, minimum=0, pattern=_DURATION.pattern)
POSITIVE_DURATION = DURATION.positive()
SIZE = Kind("size", parse_size, show_size, minimum=0, pattern=_SIZE.pattern)
POSITIVE_SIZE = SIZE.positive()
INT = Kind("integer", _int)
POSITIVE_INT = INT.positive()
NONNEG_INT = Kind("integer", _nonneg_int, minimum=0)
PORT = Kind("port", _port, minimum=0, maximum=65535)
BOOL = Kind("boolean", _bool)
STR = Kind("string", _str)
OPT_STR = Kind("string", _opt_str, nullable=True)
RATIO = Kind("ratio", _ratio, minimum=0, exclusive=True, maximum=1)
TLS_VERSION = Kind("choice", _tls_version, choices=("1.2", "1.3"))
#: A share in [0, 1], or null (left to the environment).
SHARE = Kind("share", _share, nullable=True, minimum=0, maximum=1)
STR_LIST = Kind("list of strings", _str_list, _show_list)
URL_PATTERNS = Kind("list of URL patterns", _patterns, _show_list)
POINTERS = Kind("list of JSON pointers", _pointers, _show_list)
NETWORKS = Kind("list of networks", _networks, _show_list)
MAPPING = Kind("mapping", _str_map, _show_map)
EXPRESSIONS = Kind("list of matchExpressions", _expressions, _show_expressions)
#: Namespace name -> labels and annotations (the static source).
STATIC_NAMESPACES = Kind("mapping of namespaces", None, _show_map)
#: C{{match: <URL pattern>, <setting>: <value>, ...}} items.
OVERRIDES = Kind("list of overrides", None, _show_list)
