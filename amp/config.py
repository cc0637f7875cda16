"""
amp's configuration: ``etc/amp.yaml`` in, frozen dataclasses out (pure).

Every key has a default here, and ``docs/config.md`` lists the same keys with
the same defaults (a test keeps the two in step).

The file is reloaded while amp runs (L{amp.reload}); L{for_reload} keeps
the keys that only a restart can change at their running values and names
them, and L{config_digest} identifies the configuration in force.
L{effective_config} is the configuration in force as the file would say it
(C{twistd amp --check} prints it) and L{config_summary} its one-line
summary (logged at start-up).  Every error is a
L{ConfigError} whose message starts with the dotted key that is wrong, e.g.
``endpoints.overrides[0].timeout: expected a duration like 250ms, 2s or 1m``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import ipaddress
import json
import math
import re
from fnmatch import fnmatchcase
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

import yaml

from amp.pointer import parse_pointer
from amp.urls import URLPattern, EndpointURL, parse_networks


class ConfigError(ValueError):
    """
    The configuration is wrong; the message names the key and the problem.
    """


# ---------------------------------------------------------------- value parsers

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}
_SIZE = re.compile(r"^\s*(\d+)\s*(B|KiB|MiB|GiB|KB|MB|GB|k|K|M|G)?\s*$")
_SIZE_UNITS = {
    None: 1, "B": 1, "k": 1024, "K": 1024, "KiB": 1024, "KB": 1000,
    "M": 1024**2, "MiB": 1024**2, "MB": 1000**2, "G": 1024**3, "GiB": 1024**3, "GB": 1000**3,
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


def _positive(parse: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        v = parse(value)
        if v <= 0:
            raise ValueError(f"must be greater than zero, got {value!r}")
        return v

    return check


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


def _choice(*choices: str) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if value not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {value!r}")
        return value

    return check


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
    value = str(value)
    if value not in ("1.2", "1.3"):
        raise ValueError(f"expected 1.2 or 1.3, got {value!r}")
    return value


def _str_map(value: Any) -> Mapping[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"expected a mapping of strings, got {value!r}")
    for k, v in value.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise ValueError(f"{k!r}: keys and values must be strings (quote \"true\"), got {v!r}")
    return dict(value)


# ---------------------------------------------------------------- sections

@dataclass(frozen=True)
class ListenConfig:
    port: int = 8443
    interface: str = "0.0.0.0"
    max_body: int = 3 * 1024 * 1024
    max_connections: int = 1024
    request_timeout: float = 10.0
    idle_timeout: float = 60.0
    #: Bound of a graceful shutdown: just above the longest review budget
    #: (the API server's longest timeoutSeconds, 30s, less deadline.margin).
    drain_timeout: float = 30.0


@dataclass(frozen=True)
class TLSConfig:
    cert: str = "/etc/amp/tls/tls.crt"
    key: str = "/etc/amp/tls/tls.key"
    client_ca: Optional[str] = None
    min_version: str = "1.2"
    reload_interval: float = 5.0


@dataclass(frozen=True)
class MetricsConfig:
    port: int = 9090
    interface: str = "0.0.0.0"
    #: How many recent decisions C{GET /debug/reviews} serves (0: off).
    debug_reviews: int = 256


@dataclass(frozen=True)
class StaticNamespace:
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class BypassConfig:
    """C{kubernetes.bypass}: the report of Pods admitted without amp's review."""

    enabled: bool = False
    horizon: float = 3600.0
    lease_name: str = "amp-bypass-reporter"
    lease_namespace: Optional[str] = None
    lease_duration: float = 15.0


@dataclass(frozen=True)
class KubernetesConfig:
    source: str = "cluster"
    kubeconfig: Optional[str] = None
    context: Optional[str] = None
    namespaces: Mapping[str, StaticNamespace] = field(default_factory=dict)
    enabled_label: str = "amp.txn2.com/enabled"
    enabled_value: str = "true"
    endpoint_annotations: tuple[str, ...] = ("amp.txn2.com/ep", "mutation.amp.txn2.com/ep")
    validation_annotation: str = "validation.amp.txn2.com/ep"
    failure_policy_annotation: str = "amp.txn2.com/failure-policy"
    mode_annotation: str = "amp.txn2.com/mode"
    webhook_configuration: Optional[str] = None
    webhook_name: Optional[str] = None
    watch_timeout: float = 300.0
    request_timeout: float = 10.0
    backoff_initial: float = 0.5
    backoff_max: float = 30.0
    miss_timeout: float = 2.0
    miss_negative_ttl: float = 5.0
    per_review_get: bool = False
    #: amp's own namespace (None: read from the service account mount
    #: when amp runs in a cluster); amp never changes Pods there.
    own_namespace: Optional[str] = None
    #: Namespaces whose Pods amp never changes, besides its own.
    protected_namespaces: tuple[str, ...] = ("kube-system",)
    #: Let amp change Pods in its own and the protected namespaces.
    allow_protected_namespaces: bool = False
    #: A Pod whose C{enabled_label} has this value opts out of amp.
    opt_out_value: str = "false"
    bypass: BypassConfig = field(default_factory=BypassConfig)


@dataclass(frozen=True)
class BreakerConfig:
    consecutive_failures: int = 5
    failure_ratio: float = 0.5
    window: float = 30.0
    min_requests: int = 20
    cooldown: float = 5.0
    max_cooldown: float = 120.0
    half_open_requests: int = 1


@dataclass(frozen=True)
class EndpointSettings:
    """
    Effective settings for calls to one endpoint URL.
    """

    connect_timeout: float = 1.0
    timeout: float = 5.0
    max_response: int = 1024 * 1024
    max_response_header_size: int = 16 * 1024
    max_response_headers: int = 100
    pool_size: int = 32
    idle_timeout: float = 60.0
    max_concurrent: int = 64
    retry: bool = False
    ca_bundle: Optional[str] = None
    client_cert: Optional[str] = None
    client_key: Optional[str] = None
    breaker: BreakerConfig = field(default_factory=BreakerConfig)
    #: C{endpoints.deny_networks}, the same in the defaults and every
    #: override (an override cannot set it): the networks no address amp
    #: connects to for these settings may be in.
    deny_networks: tuple[Any, ...] = ()
    #: C{endpoints.max_buffered}, the same in the defaults and every
    #: override (an override cannot set it): bytes of endpoint replies held
    #: at once over every call.
    max_buffered: int = 32 * 1024 * 1024


@dataclass(frozen=True)
class EndpointOverride:
    match: URLPattern
    settings: EndpointSettings


@dataclass(frozen=True)
class EndpointsConfig:
    allow: tuple[URLPattern, ...] = (
        URLPattern.parse("http://*.svc:*/*"),
        URLPattern.parse("https://*.svc:*/*"),
        URLPattern.parse("http://*.svc.cluster.local:*/*"),
        URLPattern.parse("https://*.svc.cluster.local:*/*"),
    )
    deny_networks: tuple[Any, ...] = ()
    defaults: EndpointSettings = field(default_factory=EndpointSettings)
    overrides: tuple[EndpointOverride, ...] = ()
    #: The most endpoints one namespace's annotation may chain.
    chain_limit: int = 4

    def settings_for(self, url: EndpointURL) -> EndpointSettings:
        """
        The first matching override's settings, else the defaults.
        """
        for o in self.overrides:
            if o.match.matches(url):
                return o.settings
        return self.defaults

    def allowed(self, url: EndpointURL) -> bool:
        return any(p.matches(url) for p in self.allow)


@dataclass(frozen=True)
class DeadlineConfig:
    default_timeout: float = 10.0
    margin: float = 0.5


@dataclass(frozen=True)
class PatchConfig:
    denied_paths: tuple[str, ...] = ("/metadata/name", "/metadata/namespace", "/metadata/uid", "/status")
    allowed_paths: tuple[str, ...] = ()
    repair: bool = True
    max_size: int = 1024 * 1024
    max_operations: int = 1000


@dataclass(frozen=True)
class LogConfig:
    format: str = "text"
    level: str = "info"


@dataclass(frozen=True)
class Config:
    listen: ListenConfig = field(default_factory=ListenConfig)
    tls: TLSConfig = field(default_factory=TLSConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    kubernetes: KubernetesConfig = field(default_factory=KubernetesConfig)
    endpoints: EndpointsConfig = field(default_factory=EndpointsConfig)
    failure_policy: str = "auto"
    annotate_status: bool = True
    #: Also review C{pods/ephemeralcontainers} updates (C{kubectl debug}).
    ephemeral_containers: bool = False
    deadline: DeadlineConfig = field(default_factory=DeadlineConfig)
    patch: PatchConfig = field(default_factory=PatchConfig)
    log: LogConfig = field(default_factory=LogConfig)
    workers: int = 1
    reload_interval: float = 5.0


# ---------------------------------------------------------------- loading

_FIELDS: dict[type, dict[str, Callable[[Any], Any]]] = {
    ListenConfig: {
        "port": _port, "interface": _str, "max_body": _positive(parse_size),
        "max_connections": _positive(_int), "request_timeout": _positive(parse_duration),
        "idle_timeout": _positive(parse_duration), "drain_timeout": _positive(parse_duration),
    },
    TLSConfig: {
        "cert": _str, "key": _str, "client_ca": _opt_str, "min_version": _tls_version,
        "reload_interval": _positive(parse_duration),
    },
    MetricsConfig: {"port": _port, "interface": _str, "debug_reviews": _nonneg_int},
    KubernetesConfig: {
        "source": _choice("cluster", "kubeconfig", "static"), "kubeconfig": _opt_str, "context": _opt_str,
        "enabled_label": _str, "enabled_value": _str, "endpoint_annotations": _str_list,
        "validation_annotation": _str, "failure_policy_annotation": _str, "mode_annotation": _str,
        "webhook_configuration": _opt_str, "webhook_name": _opt_str,
        "watch_timeout": _positive(parse_duration), "request_timeout": _positive(parse_duration),
        "backoff_initial": _positive(parse_duration), "backoff_max": _positive(parse_duration),
        "miss_timeout": _positive(parse_duration), "miss_negative_ttl": parse_duration,
        "per_review_get": _bool, "own_namespace": _opt_str, "protected_namespaces": _str_list,
        "allow_protected_namespaces": _bool, "opt_out_value": _str,
    },
    BypassConfig: {
        "enabled": _bool, "horizon": _positive(parse_duration),
        "lease_name": _str, "lease_namespace": _opt_str, "lease_duration": _positive(parse_duration),
    },
    BreakerConfig: {
        "consecutive_failures": _positive(_int), "failure_ratio": _ratio, "window": _positive(parse_duration),
        "min_requests": _positive(_int), "cooldown": _positive(parse_duration),
        "max_cooldown": _positive(parse_duration), "half_open_requests": _positive(_int),
    },
    EndpointSettings: {
        "connect_timeout": _positive(parse_duration), "timeout": _positive(parse_duration),
        "max_response": _positive(parse_size), "max_response_header_size": _positive(parse_size),
        "max_response_headers": _positive(_int), "pool_size": _positive(_int),
        "idle_timeout": _positive(parse_duration), "max_concurrent": _positive(_int), "retry": _bool,
        "ca_bundle": _opt_str, "client_cert": _opt_str, "client_key": _opt_str,
    },
    DeadlineConfig: {"default_timeout": _positive(parse_duration), "margin": parse_duration},
    PatchConfig: {
        "denied_paths": _pointers, "allowed_paths": _pointers, "repair": _bool,
        "max_size": _positive(parse_size), "max_operations": _positive(_int),
    },
    LogConfig: {"format": _choice("text", "json"), "level": _choice("debug", "info", "warn", "error")},
}


def _keyname(name: Any) -> str:
    """
    A key as it appears in an error message: as written, or quoted when it
    is empty, not a string, or would be confused with the message.
    """
    if isinstance(name, str) and name.strip() and ":" not in name and name == name.strip():
        return name
    return repr(name)


def _section(cls: type, raw: Any, key: str, base: Any = None, extra: tuple[str, ...] = ()) -> Any:
    """
    Build dataclass C{cls} from mapping C{raw}, on top of C{base} (defaults).
    Keys in C{extra} are left for the caller.
    """
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{key}: expected a mapping, got {type(raw).__name__}")
    parsers = _FIELDS[cls]
    values = {}
    for name, value in raw.items():
        if name in extra:
            continue
        if name not in parsers:
            known = ", ".join(sorted(list(parsers) + list(extra)))
            raise ConfigError(f"{key}.{_keyname(name)}: unknown key (known keys: {known})")
        try:
            values[name] = parsers[name](value)
        except ValueError as e:
            raise ConfigError(f"{key}.{name}: {e}") from None
    base = base if base is not None else cls()
    return dataclasses.replace(base, **values)


def _endpoint_settings(raw: dict, key: str, base: EndpointSettings, extra: tuple[str, ...]) -> EndpointSettings:
    settings = _section(EndpointSettings, raw, key, base, extra=extra + ("breaker",))
    if "breaker" in raw:
        breaker = _section(BreakerConfig, raw["breaker"], f"{key}.breaker", base.breaker)
        settings = dataclasses.replace(settings, breaker=breaker)
    if (settings.client_cert is None) != (settings.client_key is None):
        raise ConfigError(f"{key}.client_cert: client_cert and client_key must be set together")
    if settings.breaker.max_cooldown < settings.breaker.cooldown:
        raise ConfigError(f"{key}.breaker.max_cooldown: must be at least breaker.cooldown")
    return settings


def _endpoints(raw: Any) -> EndpointsConfig:
    key = "endpoints"
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{key}: expected a mapping, got {type(raw).__name__}")
    own = ("allow", "deny_networks", "overrides", "chain_limit", "max_buffered")
    defaults = _endpoint_settings(raw, key, EndpointSettings(), own)
    if "deny_networks" in raw:
        try:
            deny = _networks(raw["deny_networks"])
        except ValueError as e:
            raise ConfigError(f"{key}.deny_networks: {e}") from None
        # Carried in the settings, so every override inherits it and the
        # endpoint client has it wherever it has the settings.
        defaults = dataclasses.replace(defaults, deny_networks=deny)
    if "max_buffered" in raw:
        try:
            defaults = dataclasses.replace(defaults, max_buffered=_positive(parse_size)(raw["max_buffered"]))
        except ValueError as e:
            raise ConfigError(f"{key}.max_buffered: {e}") from None
    out = EndpointsConfig(defaults=defaults, deny_networks=defaults.deny_networks)
    if "chain_limit" in raw:
        try:
            out = dataclasses.replace(out, chain_limit=_positive(_int)(raw["chain_limit"]))
        except ValueError as e:
            raise ConfigError(f"{key}.chain_limit: {e}") from None
    if "allow" in raw:
        try:
            out = dataclasses.replace(out, allow=_patterns(raw["allow"]))
        except ValueError as e:
            raise ConfigError(f"{key}.allow: {e}") from None
    overrides = raw.get("overrides") or []
    if not isinstance(overrides, list):
        raise ConfigError(f"{key}.overrides: expected a list of {{match: pattern, ...}}")
    compiled = []
    for i, item in enumerate(overrides):
        okey = f"{key}.overrides[{i}]"
        if not isinstance(item, dict) or "match" not in item:
            raise ConfigError(f"{okey}: expected a mapping with a 'match' URL pattern")
        try:
            pattern = URLPattern.parse(item["match"])
        except ValueError as e:
            raise ConfigError(f"{okey}.match: {e}") from None
        if "breaker" in item and not fnmatchcase("/", pattern.path):
            raise ConfigError(
                f"{okey}.breaker: a circuit breaker guards a whole endpoint origin (scheme://host:port), "
                f"so breaker settings need a match whose path covers '/', not {pattern.path!r}")
        compiled.append(EndpointOverride(pattern, _endpoint_settings(item, okey, defaults, ("match",))))
    return dataclasses.replace(out, overrides=tuple(compiled))


def _kubernetes(raw: Any) -> KubernetesConfig:
    key = "kubernetes"
    kube = _section(KubernetesConfig, raw, key, extra=("namespaces", "bypass"))
    bypass = _section(BypassConfig, (raw or {}).get("bypass"), f"{key}.bypass")
    namespaces = {}
    raw_ns = (raw or {}).get("namespaces") or {}
    if not isinstance(raw_ns, dict):
        raise ConfigError(f"{key}.namespaces: expected a mapping of namespace name to labels/annotations")
    for name, spec in raw_ns.items():
        nkey = f"{key}.namespaces.{name}"
        spec = spec or {}
        if not isinstance(spec, dict):
            raise ConfigError(f"{nkey}: expected a mapping with labels and annotations")
        unknown = set(spec) - {"labels", "annotations"}
        if unknown:
            raise ConfigError(f"{nkey}.{sorted(unknown)[0]}: unknown key (known keys: annotations, labels)")
        try:
            labels = _str_map(spec.get("labels"))
        except ValueError as e:
            raise ConfigError(f"{nkey}.labels: {e}") from None
        try:
            annotations = _str_map(spec.get("annotations"))
        except ValueError as e:
            raise ConfigError(f"{nkey}.annotations: {e}") from None
        namespaces[str(name)] = StaticNamespace(labels, annotations)
    kube = dataclasses.replace(kube, namespaces=namespaces, bypass=bypass)
    if kube.source == "kubeconfig" and not kube.kubeconfig:
        raise ConfigError(f"{key}.kubeconfig: required when kubernetes.source is kubeconfig")
    if kube.backoff_max < kube.backoff_initial:
        raise ConfigError(f"{key}.backoff_max: must be at least backoff_initial")
    if bypass.enabled:
        if kube.source == "static":
            raise ConfigError(f"{key}.bypass.enabled: needs kubernetes.source cluster or kubeconfig")
        if kube.per_review_get:
            raise ConfigError(f"{key}.bypass.enabled: needs the namespace watch (kubernetes.per_review_get: false)")
        if kube.source == "kubeconfig" and not (bypass.lease_namespace or kube.own_namespace):
            raise ConfigError(f"{key}.bypass.lease_namespace: required with kubernetes.source: kubeconfig "
                              "unless kubernetes.own_namespace is set (in a cluster it defaults to amp's own "
                              "namespace)")
    return kube


def parse_config(raw: Any) -> Config:
    """
    Turn the parsed YAML document into a L{Config}.

    @raise ConfigError: naming the first wrong key.
    """
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"(top level): expected a mapping of sections, got {type(raw).__name__}")
    sections = {
        "listen": lambda v: _section(ListenConfig, v, "listen"),
        "tls": lambda v: _section(TLSConfig, v, "tls"),
        "metrics": lambda v: _section(MetricsConfig, v, "metrics"),
        "kubernetes": _kubernetes,
        "endpoints": _endpoints,
        "deadline": lambda v: _section(DeadlineConfig, v, "deadline"),
        "patch": lambda v: _section(PatchConfig, v, "patch"),
        "log": lambda v: _section(LogConfig, v, "log"),
    }
    scalars: dict[str, Callable[[Any], Any]] = {
        "failure_policy": _choice("auto", "Ignore", "Fail"),
        "annotate_status": _bool,
        "ephemeral_containers": _bool,
        "workers": _positive(_int),
        "reload_interval": _positive(parse_duration),
    }
    values: dict[str, Any] = {}
    for key, value in raw.items():
        name = key
        if name == "annotate_skipped":
            # The key from before amp.txn2.com/status replaced
            # amp.txn2.com/skipped: false kept amp's annotation off Pods, and
            # still does.
            if "annotate_status" in raw:
                raise ConfigError("annotate_skipped: renamed to annotate_status; give only annotate_status")
            name = "annotate_status"
        if name in sections:
            values[name] = sections[name](value)
        elif name in scalars:
            try:
                values[name] = scalars[name](value)
            except ValueError as e:
                raise ConfigError(f"{key}: {e}") from None
        else:
            known = ", ".join(sorted(list(sections) + list(scalars)))
            raise ConfigError(f"{_keyname(name)}: unknown key (known keys: {known})")
    config = Config(**values)
    if config.kubernetes.source != "static" and config.kubernetes.namespaces:
        raise ConfigError("kubernetes.namespaces: only used with kubernetes.source: static")
    if config.kubernetes.bypass.enabled and not config.annotate_status:
        raise ConfigError("kubernetes.bypass.enabled: needs amp's stamp on reviewed Pods (annotate_status: true); "
                          "without it every Pod would look bypassed")
    return config


def load_config(path: str) -> Config:
    """
    Read and parse the YAML file at C{path}.

    @raise ConfigError: if the file cannot be read, is not YAML, or is wrong.
    """
    try:
        with open(path, "rb") as f:
            text = f.read()
    except OSError as e:
        raise ConfigError(f"(file): cannot read config file {path}: {e.strerror}") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"(file): {path} is not valid YAML: {_yaml_problem(e)}") from None
    return parse_config(raw)


def _yaml_problem(error: yaml.YAMLError) -> str:
    """
    A YAML error on one line: where, what, and in what (PyYAML's own text
    spans several lines with a copy of the offending line).
    """
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error)
    context = getattr(error, "context", None)
    text = f"line {mark.line + 1}, column {mark.column + 1}: {problem}" if mark is not None else problem
    if context:
        text += f" ({context})"
    return " ".join(text.split())


# ---------------------------------------------------------------- reloading

#: Keys only a restart can change: the listening sockets, the files the
#: serving certificate is loaded from and how, the number of processes.
RESTART_ONLY = (
    "listen.port", "listen.interface", "tls.cert", "tls.key", "tls.client_ca", "tls.min_version",
    "tls.reload_interval", "metrics.port", "metrics.interface", "workers", "kubernetes.source",
)

#: The keys of C{kubernetes} a running Kubernetes namespace source was
#: built from (its client, its watches and what it keeps of each
#: namespace): restart-only unless the source is the static one, which is
#: rebuilt from the new config.
_KUBERNETES_SOURCE_KEYS = tuple(
    f"kubernetes.{f.name}" for f in dataclasses.fields(KubernetesConfig) if f.name not in ("source", "namespaces"))


def _get(config: Config, dotted: str) -> Any:
    value: Any = config
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def _set(config: Any, dotted: str, value: Any) -> Any:
    head, _, rest = dotted.partition(".")
    if not rest:
        return dataclasses.replace(config, **{head: value})
    return dataclasses.replace(config, **{head: _set(getattr(config, head), rest, value)})


def for_reload(running: Config, new: Config) -> tuple[Config, list[str]]:
    """
    The configuration to put in force when C{new} is loaded while
    C{running} is: C{new} with every restart-only key that changed kept at
    its running value, and the names of those keys (in a stable order).
    """
    keys = list(RESTART_ONLY)
    if running.kubernetes.source != "static":
        keys += _KUBERNETES_SOURCE_KEYS
    kept = []
    effective = new
    for key in keys:
        old = _get(running, key)
        if _get(new, key) != old:
            kept.append(key)
            effective = _set(effective, key, old)
    return effective, kept


def _canonical(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _canonical(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, URLPattern):
        return value.text
    if isinstance(value, Mapping):
        return {str(k): _canonical(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, (ipaddress.IPv4Network, ipaddress.IPv6Network)):
        return str(value)
    raise TypeError(f"no canonical form for {type(value).__name__}")


def config_digest(config: Config) -> str:
    """
    A short hash of the configuration (every key's value, defaults
    included): equal for equal configurations, whatever the file's layout,
    comments or key order, so replicas running different configurations
    show different hashes.
    """
    text = json.dumps(_canonical(config), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


# ---------------------------------------------------------------- showing

#: The credentials and query of a URL in a static namespace's annotation.
_URL_SECRETS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/?#@\s,]*@|\?[^#\s,]*")


def _mask_url_secrets(value: str) -> str:
    """
    C{value} with any URL's credentials and query replaced by C{***}: an
    annotation naming an endpoint may carry them.
    """
    return _URL_SECRETS.sub(lambda m: f"{m.group('scheme')}***@" if m.group("scheme") else "?***", value)


def _settings(settings: EndpointSettings) -> dict[str, Any]:
    out = _canonical(settings)
    # Not a key of its own: endpoints.deny_networks, carried in every settings.
    del out["deny_networks"]
    return out


def effective_config(config: Config) -> dict[str, Any]:
    """
    C{config} as a configuration file would say it, every default filled
    in (durations in seconds, sizes in bytes): loading it gives C{config}
    back, except that credentials and queries in static namespaces'
    annotation values are masked.  Paths are shown, never what the files
    hold.
    """
    out = _canonical(config)
    endpoints = config.endpoints
    out["endpoints"] = {
        "allow": [p.text for p in endpoints.allow],
        "deny_networks": [str(n) for n in endpoints.deny_networks],
        "chain_limit": endpoints.chain_limit,
        **_settings(endpoints.defaults),
        # max_buffered is one bound for all calls: set at the top only.
        "overrides": [{"match": o.match.text, **{k: v for k, v in _settings(o.settings).items() if k != "max_buffered"}}
                      for o in endpoints.overrides],
    }
    for ns in out["kubernetes"]["namespaces"].values():
        ns["annotations"] = {k: _mask_url_secrets(v) for k, v in ns["annotations"].items()}
    return out


def config_summary(config: Config) -> str:
    """
    The configuration in one line: where amp listens, where namespaces come
    from, the failure policy, how many endpoint patterns are allowed and
    how many workers run.
    """
    kube = config.kubernetes
    if kube.source == "static":
        source = f"static ({len(kube.namespaces)} namespaces)"
    else:
        how = "a GET per review" if kube.per_review_get else "watched"
        where = f"kubeconfig {kube.kubeconfig}" if kube.source == "kubeconfig" else "cluster"
        source = f"{where} (all namespaces, {how})"
    listen = config.listen
    return (f"listen {listen.interface}:{listen.port}, namespaces from {source}, "
            f"failure policy {config.failure_policy}, endpoints.allow {len(config.endpoints.allow)} patterns, "
            f"workers {config.workers}, config {config_digest(config)}")
