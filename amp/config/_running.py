"""
The configuration in force (pure): what a reload keeps (L{for_reload}),
its identity (L{config_digest}), how it is shown as a file would say it
(L{effective_config}, C{twistd amp --check}) and in one line
(L{config_summary}, logged at start-up).
"""

from __future__ import annotations

import dataclasses
import hashlib
import ipaddress
import json
import re
from typing import Any, Mapping

from amp.config._declare import Restart
from amp.config._sections import KEYS, Config, EndpointSettings
from amp.reasons import NamespaceSource
from amp.urls import URLPattern, shown_url

# ---------------------------------------------------------------- reloading

#: Keys only a restart can change (L{Restart.ALWAYS}): the listening
#: sockets, the files the serving certificate is loaded from and how, the
#: number of processes, where namespaces come from.
RESTART_ONLY = tuple(key.path for key in KEYS if key.restart is Restart.ALWAYS)

#: The keys of C{kubernetes} a running Kubernetes namespace source was
#: built from (its client, its watches and what it keeps of each
#: namespace; L{Restart.KUBERNETES}), a subsection as one: restart-only
#: unless the source is the static one, which is rebuilt from the new config.
_KUBERNETES_SOURCE_KEYS = tuple(
    dict.fromkeys(".".join(key.path.split(".")[:2]) for key in KEYS if key.restart is Restart.KUBERNETES)
)


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
    if running.kubernetes.source != NamespaceSource.STATIC:
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
    if isinstance(value, str):
        # A vocabulary's member (an enum) as its plain value.
        return str(value)
    if value is None or isinstance(value, (int, float, bool)):
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

#: A URL in a static namespace's annotation value.
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s,]*")


def _mask_url_secrets(value: str) -> str:
    """
    C{value} with every URL in it shown as amp shows endpoint URLs
    (L{amp.urls.shown_url}: no query, user information or fragment): an
    annotation naming an endpoint may carry them.
    """
    return _URL_IN_TEXT.sub(lambda m: shown_url(m.group()), value)


def _settings(settings: EndpointSettings) -> dict[str, Any]:
    out: dict[str, Any] = _canonical(settings)
    # Not a key of its own: endpoints.deny_networks, carried in every settings.
    del out["deny_networks"]
    return out


def effective_config(config: Config) -> dict[str, Any]:
    """
    C{config} as a configuration file would say it, every default filled
    in (durations in seconds, sizes in bytes): loading it gives C{config}
    back, except that URLs in static namespaces' annotation values are
    shown without their credentials and queries (L{amp.urls.shown_url}).  Paths are shown, never what the files
    hold.
    """
    out: dict[str, Any] = _canonical(config)
    endpoints = config.endpoints
    out["endpoints"] = {
        "allow": [p.text for p in endpoints.allow],
        "deny_networks": [str(n) for n in endpoints.deny_networks],
        "chain_limit": endpoints.chain_limit,
        **_settings(endpoints.defaults),
        # max_buffered is one bound for all calls: set at the top only.
        "overrides": [
            {"match": o.match.text, **{k: v for k, v in _settings(o.settings).items() if k != "max_buffered"}}
            for o in endpoints.overrides
        ],
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
    if kube.source == NamespaceSource.STATIC:
        source = f"static ({len(kube.namespaces)} namespaces)"
    else:
        how = "a GET per review" if kube.per_review_get else "watched"
        where = f"kubeconfig {kube.kubeconfig}" if kube.source == NamespaceSource.KUBECONFIG else "cluster"
        source = f"{where} (all namespaces, {how})"
    listen = config.listen
    return (
        f"listen {listen.interface}:{listen.port}, namespaces from {source}, "
        f"failure policy {config.failure_policy}, endpoints.allow {len(config.endpoints.allow)} patterns, "
        f"workers {config.workers}, config {config_digest(config)}"
    )
