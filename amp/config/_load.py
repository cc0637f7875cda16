"""
amp's configuration: ``etc/amp.yaml`` in, frozen dataclasses out (pure).

L{parse_config} turns the parsed YAML document into a L{Config}, reading
each key with the parser its declaration (L{amp.config._sections}) names;
L{load_config} reads the file.  Every error is a L{ConfigError} whose
message starts with the dotted key that is wrong, e.g.
``endpoints.overrides[0].timeout: expected a duration like 250ms, 2s or 1m``.
"""

from __future__ import annotations

import dataclasses
from fnmatch import fnmatchcase
from typing import Any, Callable, ClassVar, Optional, Protocol, TypeVar

from amp.config._declare import parsers
from amp.config._sections import (
    AuditConfig,
    BreakerConfig,
    BypassConfig,
    Config,
    DeadlineConfig,
    EndpointOverride,
    EndpointsConfig,
    EndpointSettings,
    KubernetesConfig,
    ListenConfig,
    LogConfig,
    MetricsConfig,
    PatchConfig,
    RecordConfig,
    RegistrationConfig,
    StaticNamespace,
    TLSConfig,
    TracingConfig,
)
from amp.config._values import MAPPING
from amp.files import CONFIG_LIMIT, FileError, config_document, read_file
from amp.reasons import NamespaceSource
from amp.suggest import did_you_mean
from amp.urls import URLPattern


class ConfigError(ValueError):
    """
    The configuration is wrong; the message names the key and the problem.
    """


class _Dataclass(Protocol):
    """A config section: a dataclass."""

    __dataclass_fields__: ClassVar[dict[str, Any]]


_D = TypeVar("_D", bound=_Dataclass)


def _keyname(name: Any) -> str:
    """
    A key as it appears in an error message: as written, or quoted when it
    is empty, not a string, or would be confused with the message.
    """
    if isinstance(name, str) and name.strip() and ":" not in name and name == name.strip():
        return name
    return repr(name)


def _section(
    cls: type[_D],
    raw: Any,
    key: str,
    base: Optional[_D] = None,
    extra: tuple[str, ...] = (),
    exclude: tuple[str, ...] = (),
) -> _D:
    """
    Build dataclass C{cls} from mapping C{raw}, on top of C{base} (defaults),
    each key read by the parser of its declaration.  Keys in C{extra} are
    left for the caller; keys in C{exclude} are not keys here.
    """
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{key}: expected a mapping, got {type(raw).__name__}")
    readers = parsers(cls)
    values: dict[str, Any] = {}
    for name, value in raw.items():
        if name in extra:
            continue
        if name not in readers or name in exclude:
            known = sorted([n for n in readers if n not in exclude] + list(extra))
            raise ConfigError(
                f"{key}.{_keyname(name)}: unknown key{did_you_mean(str(name), known)} (known keys: {', '.join(known)})"
            )
        try:
            values[name] = readers[name](value)
        except ValueError as e:
            raise ConfigError(f"{key}.{name}: {e}") from None
    base = base if base is not None else cls()
    return dataclasses.replace(base, **values)


def _read(cls: type, name: str, raw: dict[str, Any], key: str) -> Any:
    """C{raw[name]} read by the parser of C{cls}'s declaration of C{name}."""
    try:
        return parsers(cls)[name](raw[name])
    except ValueError as e:
        raise ConfigError(f"{key}.{name}: {e}") from None


def _endpoint_settings(
    raw: dict[str, Any], key: str, base: EndpointSettings, extra: tuple[str, ...]
) -> EndpointSettings:
    # endpoints.max_buffered is one bound for every call: set at the top only.
    settings = _section(EndpointSettings, raw, key, base, extra=extra + ("breaker",), exclude=("max_buffered",))
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
        deny = _read(EndpointsConfig, "deny_networks", raw, key)
        # Carried in the settings, so every override inherits it and the
        # endpoint client has it wherever it has the settings.
        defaults = dataclasses.replace(defaults, deny_networks=deny)
    if "max_buffered" in raw:
        defaults = dataclasses.replace(defaults, max_buffered=_read(EndpointSettings, "max_buffered", raw, key))
    out = EndpointsConfig(defaults=defaults, deny_networks=defaults.deny_networks)
    if "chain_limit" in raw:
        out = dataclasses.replace(out, chain_limit=_read(EndpointsConfig, "chain_limit", raw, key))
    if "allow" in raw:
        out = dataclasses.replace(out, allow=_read(EndpointsConfig, "allow", raw, key))
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
                f"so breaker settings need a match whose path covers '/', not {pattern.path!r}"
            )
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
            first = str(sorted(unknown, key=str)[0])
            raise ConfigError(
                f"{nkey}.{first}: unknown key{did_you_mean(first, ('annotations', 'labels'))} "
                "(known keys: annotations, labels)"
            )
        parse_map = MAPPING.parse
        assert parse_map is not None  # a mapping's kind parses
        try:
            labels = parse_map(spec.get("labels"))
        except ValueError as e:
            raise ConfigError(f"{nkey}.labels: {e}") from None
        try:
            annotations = parse_map(spec.get("annotations"))
        except ValueError as e:
            raise ConfigError(f"{nkey}.annotations: {e}") from None
        namespaces[str(name)] = StaticNamespace(labels, annotations)
    kube = dataclasses.replace(kube, namespaces=namespaces, bypass=bypass)
    if kube.source == NamespaceSource.KUBECONFIG and not kube.kubeconfig:
        raise ConfigError(f"{key}.kubeconfig: required when kubernetes.source is kubeconfig")
    if kube.backoff_max < kube.backoff_initial:
        raise ConfigError(f"{key}.backoff_max: must be at least backoff_initial")
    if bypass.enabled:
        if kube.source == NamespaceSource.STATIC:
            raise ConfigError(f"{key}.bypass.enabled: needs kubernetes.source cluster or kubeconfig")
        if kube.per_review_get:
            raise ConfigError(f"{key}.bypass.enabled: needs the namespace watch (kubernetes.per_review_get: false)")
        if kube.source == NamespaceSource.KUBECONFIG and not (bypass.lease_namespace or kube.own_namespace):
            raise ConfigError(
                f"{key}.bypass.lease_namespace: required with kubernetes.source: kubeconfig "
                "unless kubernetes.own_namespace is set (in a cluster it defaults to amp's own "
                "namespace)"
            )
    return kube


def _record(raw: Any) -> RecordConfig:
    record = _section(RecordConfig, raw, "record")
    if record.file_size > record.max_size:
        raise ConfigError(
            f"record.file_size: {record.file_size} bytes is more than record.max_size "
            f"({record.max_size} bytes), the budget of every recording file together"
        )
    if not record.namespaces:
        raise ConfigError('record.namespaces: name at least one namespace, or "*" (all) or "annotated"')
    return record


def _tracing(raw: Any) -> TracingConfig:
    tracing = _section(TracingConfig, raw, "tracing")
    if tracing.batch > tracing.queue:
        raise ConfigError(
            f"tracing.batch: {tracing.batch} spans is more than tracing.queue ({tracing.queue}), "
            f"the spans that wait at most"
        )
    if tracing.endpoint is not None and not tracing.endpoint.startswith(("http://", "https://")):
        raise ConfigError(f"tracing.endpoint: expected an http:// or https:// URL, got {tracing.endpoint!r}")
    return tracing


def parse_config(raw: Any) -> Config:
    """
    Turn the parsed YAML document into a L{Config}.

    @raise ConfigError: naming the first wrong key.
    """
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"(top level): expected a mapping of sections, got {type(raw).__name__}")
    sections: dict[str, Callable[[Any], object]] = {
        "listen": lambda v: _section(ListenConfig, v, "listen"),
        "tls": lambda v: _section(TLSConfig, v, "tls"),
        "metrics": lambda v: _section(MetricsConfig, v, "metrics"),
        "kubernetes": _kubernetes,
        "endpoints": _endpoints,
        "deadline": lambda v: _section(DeadlineConfig, v, "deadline"),
        "patch": lambda v: _section(PatchConfig, v, "patch"),
        "log": lambda v: _section(LogConfig, v, "log"),
        "record": _record,
        "audit": lambda v: _section(AuditConfig, v, "audit"),
        "tracing": _tracing,
        "registration": lambda v: _section(RegistrationConfig, v, "registration"),
    }
    scalars = parsers(Config)
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
            known = sorted(list(sections) + list(scalars))
            raise ConfigError(
                f"{_keyname(name)}: unknown key{did_you_mean(str(name), known)} (known keys: {', '.join(known)})"
            )
    config = Config(**values)
    if config.kubernetes.source != NamespaceSource.STATIC and config.kubernetes.namespaces:
        raise ConfigError("kubernetes.namespaces: only used with kubernetes.source: static")
    if config.audit.continuous and config.kubernetes.source == NamespaceSource.STATIC:
        raise ConfigError(
            "audit.continuous: needs kubernetes.source cluster or kubeconfig (it lists the cluster's "
            "Pods and workloads)"
        )
    if config.kubernetes.bypass.enabled and not config.annotate_status:
        raise ConfigError(
            "kubernetes.bypass.enabled: needs amp's stamp on reviewed Pods (annotate_status: true); "
            "without it every Pod would look bypassed"
        )
    if config.registration.managed:
        _managed(config)
    return config


#: The shortest life of a serving certificate amp issues itself (registration.cert_validity).
MIN_CERT_VALIDITY = 30.0


def _managed(config: Config) -> None:
    """What the managed registration (C{registration.managed}) needs of the rest of the config."""
    kube = config.kubernetes
    if kube.source == NamespaceSource.STATIC:
        raise ConfigError("registration.managed: needs kubernetes.source cluster or kubeconfig")
    if not kube.webhook_configuration:
        raise ConfigError("registration.managed: needs kubernetes.webhook_configuration (the object amp applies)")
    if kube.source == NamespaceSource.KUBECONFIG and not kube.own_namespace:
        raise ConfigError(
            "registration.managed: needs kubernetes.own_namespace with kubernetes.source: kubeconfig "
            "(the Service's namespace and the Lease's)"
        )
    reg = config.registration
    if reg.cert_validity < MIN_CERT_VALIDITY:
        raise ConfigError(
            f"registration.cert_validity: {reg.cert_validity:g}s is shorter than "
            f"{MIN_CERT_VALIDITY:g}s: the certificate would be renewed before every replica read it"
        )
    if reg.ca_validity < 2 * reg.cert_validity:
        raise ConfigError(
            f"registration.ca_validity: {reg.ca_validity:g}s is shorter than twice "
            f"registration.cert_validity ({reg.cert_validity:g}s): a CA must outlive the certificates "
            "it issues through its rotation"
        )
    if reg.url is not None and not reg.url.startswith("https://"):
        raise ConfigError(f"registration.url: {reg.url!r} is no https:// URL (the API server calls webhooks over TLS)")
    timeout = config.deadline.default_timeout
    if timeout != int(timeout) or not 1 <= timeout <= 30:
        raise ConfigError(
            f"registration.managed: deadline.default_timeout {timeout:g}s is the entries' "
            "timeoutSeconds, which must be a whole number of seconds from 1 to 30"
        )


def load_config(path: str) -> Config:
    """
    Read and parse the YAML file at C{path} (L{amp.files.config_document}:
    at most L{amp.files.CONFIG_LIMIT} bytes, no anchors or aliases).

    @raise ConfigError: if the file cannot be read, is not YAML, or is wrong.
    """
    try:
        data, _ = read_file(path, path, CONFIG_LIMIT)
        raw = config_document(data, path)
    except FileError as e:
        raise ConfigError(f"(file): {e}") from None
    return parse_config(raw)


def command_config(path: Optional[str]) -> Config:
    """
    The configuration a command line names with C{--config} (amp's
    defaults without one); a L{ConfigError} that names the file.
    """
    if path is None:
        return Config()
    try:
        return load_config(path)
    except ConfigError as e:
        raise ConfigError(f"config {path}: {e}") from None
