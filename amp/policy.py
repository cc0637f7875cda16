"""
Namespace + config -> what to do with a review (pure).

L{route} answers, for one namespace: is amp enabled there, which endpoint
(checked against the allow-list), with which settings, in which mode, and
under which failure policy.  L{review_budget} turns the API server's
C{?timeout=} into the time amp may spend.  Nothing here does I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from amp.config import Config, EndpointSettings
from amp.namespaces import NamespaceInfo
from amp.urls import BadURL, EndpointURL, parse_endpoint_url

IGNORE, FAIL = "Ignore", "Fail"
NORMAL, SHADOW = "normal", "shadow"
#: Why a namespace's endpoint annotation cannot be used.
BAD_URL, NOT_ALLOWED = "bad-url", "not-allowed"
ROUTE_REASONS = (BAD_URL, NOT_ALLOWED)

_TIMEOUT = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m)?$")
_TIMEOUT_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, None: 1.0}


@dataclass(frozen=True, slots=True)
class Route:
    """
    The decision for one review's namespace.

    @ivar enabled: the namespace opted in; when false nothing else matters.
    @ivar url: the checked endpoint, or None.
    @ivar error: C{(reason, message)} when the endpoint cannot be used.
    """

    enabled: bool
    failure_policy: str = FAIL
    mode: str = NORMAL
    url: Optional[EndpointURL] = None
    raw_url: str = ""
    settings: Optional[EndpointSettings] = None
    error: Optional[tuple[str, str]] = None


_NOT_ENABLED = Route(enabled=False)


def failure_policy(ns: Optional[NamespaceInfo], config: Config, cluster_policy: Optional[str]) -> str:
    """
    The namespace's C{amp.txn2.com/failure-policy} annotation if valid, else
    the config's C{failure_policy}; C{auto} follows the cluster's
    MutatingWebhookConfiguration (C{cluster_policy}) and falls back to
    C{Fail}, the Kubernetes default, while that is unknown.
    """
    if ns is not None:
        value = ns.annotations.get(config.kubernetes.failure_policy_annotation)
        if value in (IGNORE, FAIL):
            return value
    if config.failure_policy == "auto":
        return cluster_policy if cluster_policy in (IGNORE, FAIL) else FAIL
    return config.failure_policy


def is_enabled(ns: Optional[NamespaceInfo], config: Config) -> bool:
    kube = config.kubernetes
    return ns is not None and ns.labels.get(kube.enabled_label) == kube.enabled_value


def route(
    ns: Optional[NamespaceInfo], config: Config, cluster_policy: Optional[str], *, validation: bool = False,
    cache: Optional[dict[str, tuple]] = None,
) -> Route:
    """
    Decide what to do for a review in namespace C{ns} (None: no such
    namespace).  C{validation} picks the validation endpoint annotation.
    C{cache}, a dict kept for one C{config}, remembers what each annotation
    value resolved to (parsed URL, allow-list verdict, settings), so the hot
    path does not parse the same URL for every review.
    """
    if not is_enabled(ns, config):
        return _NOT_ENABLED
    assert ns is not None
    kube = config.kubernetes
    policy = failure_policy(ns, config, cluster_policy)
    mode = SHADOW if ns.annotations.get(kube.mode_annotation) == SHADOW else NORMAL
    if validation:
        raw = ns.annotations.get(kube.validation_annotation)
    else:
        raw = next((ns.annotations[a] for a in kube.endpoint_annotations if ns.annotations.get(a)), None)
    if not raw:
        return Route(enabled=True, failure_policy=policy, mode=mode)
    resolved = cache.get(raw) if cache is not None else None
    if resolved is None:
        resolved = _resolve(raw, config)
        if cache is not None:
            if len(cache) >= _CACHE_LIMIT:
                cache.clear()
            cache[raw] = resolved
    url, settings, error = resolved
    return Route(True, policy, mode, url=url, raw_url=raw, settings=settings, error=error)


#: Distinct endpoint annotation values remembered by L{route}'s cache.
_CACHE_LIMIT = 4096


def _resolve(
    raw: str, config: Config
) -> tuple[Optional[EndpointURL], Optional[EndpointSettings], Optional[tuple[str, str]]]:
    try:
        url = parse_endpoint_url(raw)
    except BadURL as e:
        return None, None, (BAD_URL, str(e))
    if not config.endpoints.allowed(url):
        return url, None, (NOT_ALLOWED, f"endpoint {url.origin} is not in endpoints.allow")
    return url, config.endpoints.settings_for(url), None


def shown_url(raw: str, limit: int = 200) -> str:
    """
    An annotation's URL (C{Route.raw_url}) as amp may repeat it (in
    warnings, audit and Pod annotations, logs) when it is not a URL amp
    will call: credentials masked (C{http://***@host/}), anything but
    printable ASCII escaped (C{\\r}, C{\\x00}, C{\\u2028}), at most
    C{limit} characters.
    """
    text = raw.strip()
    scheme, sep, rest = text.partition("://")
    if not sep:
        scheme, rest = "", text
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    authority = rest[:end]
    if "@" in authority:
        text = f"{scheme}{sep}***@{authority.rsplit('@', 1)[1]}{rest[end:]}"
    out = "".join(c if 0x20 < ord(c) < 0x7F else (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")
                  for c in text)
    return out if len(out) <= limit else out[: limit - 3] + "..."


def parse_timeout(value: Optional[str]) -> Optional[float]:
    """
    The API server's C{?timeout=10s} query value in seconds, or None.
    """
    if not value:
        return None
    m = _TIMEOUT.match(value.strip())
    if not m:
        return None
    seconds = float(m.group(1)) * _TIMEOUT_UNITS[m.group(2)]
    return seconds if seconds > 0 else None


def review_budget(timeout: Optional[float], default_timeout: float, margin: float) -> float:
    """
    Seconds amp may spend on one review: the API server's timeout (or the
    configured default) less the safety margin, never less than a tenth of
    the timeout so a large margin cannot leave nothing.
    """
    total = timeout if timeout is not None else default_timeout
    return max(total - margin, total * 0.1)
