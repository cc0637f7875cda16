"""
Namespace + config -> what to do with a review (pure).

L{route} answers, for one namespace: is amp enabled there, which endpoint
(checked against the allow-list), with which settings, in which mode, and
under which failure policy.  Nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

from amp.config import BreakerConfig, Config, EndpointSettings
from amp.namespaces import NamespaceInfo
from amp.reasons import Reason
from amp.urls import BadURL, EndpointURL, parse_endpoint_url

IGNORE, FAIL = "Ignore", "Fail"
NORMAL, SHADOW = "normal", "shadow"


@dataclass(frozen=True, slots=True)
class Route:
    """
    The decision for one review's namespace.

    @ivar enabled: the namespace opted in; when false nothing else matters.
    @ivar url: the checked endpoint, or None.
    @ivar raw_url: the annotation's text.
    @ivar settings: the settings for calls to C{url}.
    @ivar breaker: the circuit breaker settings of C{url}'s origin (those of
        the origin's root URL, C{scheme://host:port/}: one breaker guards
        the whole origin).
    @ivar error: C{(reason, message)} when the endpoint cannot be used.
    @ivar policy_problem: why the namespace's failure-policy annotation was
        not used (a value that is not C{Ignore} or C{Fail}), or None.
    """

    enabled: bool
    failure_policy: str = FAIL
    mode: str = NORMAL
    url: Optional[EndpointURL] = None
    raw_url: str = ""
    settings: Optional[EndpointSettings] = None
    breaker: Optional[BreakerConfig] = None
    error: Optional[tuple[Reason, str]] = None
    policy_problem: Optional[str] = None

    @property
    def where(self) -> str:
        """
        The endpoint as amp names it in messages, warnings, audit and Pod
        annotations: its origin, the annotation's text masked
        (L{shown_url}) when it is not a usable URL, or C{(none)}.
        """
        if self.url is not None:
            return self.url.origin
        return shown_url(self.raw_url) if self.raw_url else "(none)"


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


def failure_policy_problem(ns: NamespaceInfo, config: Config, policy: str) -> Optional[str]:
    """
    Why the namespace's failure-policy annotation is not used, when it is
    set to something other than C{Ignore} or C{Fail} (the value shown
    escaped and cut short), and which C{policy} applies instead; else None.
    """
    key = config.kubernetes.failure_policy_annotation
    value = ns.annotations.get(key)
    if value is None or value in (IGNORE, FAIL):
        return None
    source = "the webhook's failurePolicy" if config.failure_policy == "auto" else "failure_policy"
    return (f"annotation {key}: {shown_url(repr(value), 40)} is not {IGNORE} or {FAIL}; "
            f"failure policy {policy} (from {source}) applies")


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
    problem = failure_policy_problem(ns, config, policy)
    mode = SHADOW if ns.annotations.get(kube.mode_annotation) == SHADOW else NORMAL
    if validation:
        raw = ns.annotations.get(kube.validation_annotation)
    else:
        raw = next((ns.annotations[a] for a in kube.endpoint_annotations if ns.annotations.get(a)), None)
    if not raw:
        return Route(enabled=True, failure_policy=policy, mode=mode, policy_problem=problem)
    resolved = cache.get(raw) if cache is not None else None
    if resolved is None:
        resolved = _resolve(raw, config)
        if cache is not None:
            if len(cache) >= _CACHE_LIMIT:
                cache.clear()
            cache[raw] = resolved
    url, settings, breaker, error = resolved
    return Route(True, policy, mode, url=url, raw_url=raw, settings=settings, breaker=breaker, error=error,
                 policy_problem=problem)


#: Distinct endpoint annotation values remembered by L{route}'s cache.
_CACHE_LIMIT = 4096


def _resolve(raw: str, config: Config) -> tuple[
    Optional[EndpointURL], Optional[EndpointSettings], Optional[BreakerConfig], Optional[tuple[Reason, str]]
]:
    try:
        url = parse_endpoint_url(raw)
    except BadURL as e:
        return None, None, None, (Reason.BAD_URL, str(e))
    endpoints = config.endpoints
    if not endpoints.allowed(url):
        return url, None, None, (Reason.NOT_ALLOWED, f"endpoint {url.origin} is not in endpoints.allow")
    root = replace(url, url=url.origin + "/", path="/")
    return url, endpoints.settings_for(url), endpoints.settings_for(root).breaker, None


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
