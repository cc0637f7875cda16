"""
Namespace + config -> what to do with a review (pure).

L{route} answers, for one namespace: is amp enabled there (L{amp.rules}),
which endpoints in which order (the chain, each checked against the
allow-list), with which settings, in which mode, and under which failure
policy.  Nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional, Sequence

from amp.config import BreakerConfig, Config, EndpointSettings
from amp.memo import Memo
from amp.namespaces import NamespaceInfo
from amp.reasons import FailurePolicy, Mode, Reason
from amp.rules import is_enabled
from amp.rules import mode as namespace_mode
from amp.trace import AllowChecked, Event, PolicyChosen, RouteDecided
from amp.urls import CHAIN_SEPARATORS, BadURL, EndpointURL, escaped, parse_endpoint_url, shown_url, step_names

IGNORE, FAIL = FailurePolicy.IGNORE, FailurePolicy.FAIL
#: Each failure policy by its value (a dict lookup: calling the enum costs
#: ten times as much, on every review).
_POLICIES = {policy.value: policy for policy in FailurePolicy}
#: The two failure classes a namespace may choose, by value.
_CLASSES = {IGNORE.value: IGNORE, FAIL.value: FAIL}
NORMAL, SHADOW = Mode.NORMAL, Mode.SHADOW


@dataclass(frozen=True, slots=True)
class EndpointStep:
    """
    One endpoint of a route's chain, checked against the allow-list.

    @ivar url: the endpoint.
    @ivar settings: the settings for calls to C{url}.
    @ivar breaker: the circuit breaker settings of C{url}'s origin (those of
        the origin's root URL, C{scheme://host:port/}: one breaker guards
        the whole origin).
    """

    url: EndpointURL
    settings: EndpointSettings
    breaker: BreakerConfig
    #: How amp names the step in every output (L{amp.urls.step_names}): its
    #: origin, or its origin and path when another step of the chain has
    #: the same origin, and its position when they differ only in query.
    name: str = ""

    @property
    def origin(self) -> str:
        return self.url.origin


@dataclass(frozen=True, slots=True)
class Route:
    """
    The decision for one review's namespace.

    @ivar enabled: the namespace opted in; when false nothing else matters.
    @ivar steps: the endpoints to call, in order (the chain), each checked;
        empty when there is none or when C{error} is set.
    @ivar url: the first endpoint, or, with C{error}, the URL that caused it
        when it parsed; else None.
    @ivar raw_url: the annotation's text.
    @ivar bad_url: with a C{bad-url} error, the piece of the annotation that
        is not a URL.
    @ivar error: C{(reason, message)} when the chain cannot be used.
    @ivar policy_problem: what is wrong with how the namespace chooses its
        failure class, C{(problem, message)} (L{failure_policy_problem}), or
        None.
    @ivar explanation: see L{route}'s C{explain}.
    """

    enabled: bool
    failure_policy: FailurePolicy = FAIL
    mode: Mode = NORMAL
    url: Optional[EndpointURL] = None
    raw_url: str = ""
    steps: tuple[EndpointStep, ...] = ()
    error: Optional[tuple[Reason, str]] = None
    bad_url: str = ""
    policy_problem: Optional[tuple[str, str]] = None
    #: With L{route}'s C{explain}: the decision and why, as the events
    #: C{amp explain} prints (route, allow-list, failure policy).
    explanation: tuple[Event, ...] = ()

    @property
    def settings(self) -> Optional[EndpointSettings]:
        """The first endpoint's settings, or None."""
        return self.steps[0].settings if self.steps else None

    @property
    def breaker(self) -> Optional[BreakerConfig]:
        """The first endpoint's origin's breaker settings, or None."""
        return self.steps[0].breaker if self.steps else None

    @property
    def where(self) -> str:
        """
        The endpoint(s) as amp names them in messages, warnings, audit and
        Pod annotations: the origins of the chain, space-separated; the
        URL that made the chain unusable; the annotation's text masked
        (L{shown_url}) when it is not a usable URL; or C{(none)}.
        """
        if self.steps:
            return " ".join(step.name for step in self.steps)
        if self.url is not None:
            return self.url.origin
        if self.bad_url:
            return shown_url(self.bad_url)
        return shown_url(self.raw_url) if self.raw_url else "(none)"


_NOT_ENABLED = Route(enabled=False)


def _valid(value: object) -> bool:
    return value in _CLASSES


def failure_policy(ns: Optional[NamespaceInfo], config: Config, cluster_policy: Optional[str]) -> FailurePolicy:
    """
    The namespace's failure class: its label C{kubernetes.failure_class_label}
    if valid, else (deprecated) its C{amp.txn2.com/failure-policy}
    annotation if valid, else the config's C{failure_policy}; C{auto}
    follows the cluster's MutatingWebhookConfiguration (C{cluster_policy})
    and falls back to C{Fail}, the Kubernetes default, while that is
    unknown.
    """
    if ns is not None:
        kube = config.kubernetes
        label = kube.failure_class_label
        if label is not None:
            choice = _CLASSES.get(ns.labels.get(label, ""))
            if choice is not None:
                return choice
        choice = _CLASSES.get(ns.annotations.get(kube.failure_policy_annotation, ""))
        if choice is not None:
            return choice
    if config.failure_policy == FailurePolicy.AUTO:
        return _POLICIES[cluster_policy] if cluster_policy in (IGNORE, FAIL) else FAIL
    return _POLICIES[config.failure_policy]


#: C{amp_namespace_problems_total{problem}} of each failure-class problem:
#: an unusable annotation value, an unusable label value, the class chosen
#: by the annotation only, and label and annotation that disagree.
FAILURE_POLICY_PROBLEM = "failure-policy"
FAILURE_CLASS_PROBLEM = "failure-class"
ANNOTATION_ONLY_PROBLEM = "failure-class-annotation"
DISAGREE_PROBLEM = "failure-class-disagrees"


def failure_policy_problem(ns: NamespaceInfo, config: Config, policy: str) -> Optional[tuple[str, str]]:
    """
    What is wrong with how namespace C{ns} chooses its failure class, as
    C{(problem, message)} (the message ends with the command that fixes
    it), or None: a label or annotation value other than C{Ignore} or
    C{Fail} (shown escaped and cut short; C{policy} applies instead), the
    class chosen by the deprecated annotation only (the API server, which
    reads labels only, does not apply it while amp cannot be reached), or a
    label and an annotation that disagree.
    """
    kube = config.kubernetes
    key = kube.failure_policy_annotation
    annotation = ns.annotations.get(key)
    label = kube.failure_class_label
    if label is None:
        if annotation is None or _valid(annotation):
            return None
        return FAILURE_POLICY_PROBLEM, _unusable("annotation", key, annotation, policy, config)
    value = ns.labels.get(label)
    if value is not None and not _valid(value):
        return FAILURE_CLASS_PROBLEM, (
            _unusable("label", label, value, policy, config)
            + f"; fix: kubectl label namespace {ns.name} {label}=Fail --overwrite (or =Ignore)"
        )
    if annotation is None:
        return None
    if value is None:
        if not _valid(annotation):
            return FAILURE_POLICY_PROBLEM, (
                _unusable("annotation", key, annotation, policy, config)
                + f"; fix: kubectl label namespace {ns.name} {label}=Fail (or =Ignore) "
                f"&& kubectl annotate namespace {ns.name} {key}-"
            )
        return ANNOTATION_ONLY_PROBLEM, (
            f"the deprecated annotation {key}={annotation} chooses amp's failure policy, but the API server reads "
            f"labels only: while amp cannot be reached it applies the webhook entry for namespaces without the label "
            f"{label}; fix: kubectl label namespace {ns.name} {label}={annotation} "
            f"&& kubectl annotate namespace {ns.name} {key}-"
        )
    if annotation != value:
        return DISAGREE_PROBLEM, (
            f"the label {label}={value} and the deprecated annotation {key}={escaped(repr(annotation), 40)} "
            f"disagree; amp and the API server follow the label ({value}); fix: kubectl annotate namespace "
            f"{ns.name} {key}-"
        )
    return None


def _unusable(kind: str, key: str, value: str, policy: str, config: Config) -> str:
    source = "the webhook's failurePolicy" if config.failure_policy == FailurePolicy.AUTO else "failure_policy"
    return (
        f"{kind} {key}: {escaped(repr(value), 40)} is not {IGNORE} or {FAIL}; "
        f"failure policy {policy} (from {source}) applies"
    )


def failure_policy_why(ns: Optional[NamespaceInfo], config: Config, cluster_policy: Optional[str]) -> tuple[str, str]:
    """
    L{failure_policy} and, in words, where it came from, with what is
    wrong in how the namespace chooses it and the command that fixes it
    (for C{amp explain}'s trace; the review path only needs the policy).
    """
    policy = failure_policy(ns, config, cluster_policy)
    kube = config.kubernetes
    key = kube.failure_policy_annotation
    label = kube.failure_class_label
    value = ns.annotations.get(key) if ns is not None else None
    class_value = ns.labels.get(label) if ns is not None and label is not None else None
    problem = failure_policy_problem(ns, config, policy) if ns is not None else None
    note = f" (problem {problem[0]}: {problem[1]})" if problem is not None else ""
    if _valid(class_value):
        return policy, f"the namespace's failure-class label {label}" + note
    if _valid(value):
        return policy, f"the namespace's annotation {key}" + note
    if label is not None:
        why = (
            f"the label {label}={class_value!r} is not Ignore or Fail, so "
            if class_value is not None
            else f"no label {label}, so "
        )
    else:
        why = ""
    why += (
        f"the annotation {key}={value!r} is not Ignore or Fail, so "
        if value is not None
        else (f"no annotation {key}, so " if label is None else "")
    )
    if config.failure_policy != FailurePolicy.AUTO:
        return policy, why + f"the config's failure_policy {config.failure_policy}" + note
    if cluster_policy in (IGNORE, FAIL):
        return policy, why + "failure_policy auto: the failurePolicy of amp's MutatingWebhookConfiguration" + note
    return policy, why + "failure_policy auto, and amp's MutatingWebhookConfiguration is not known: Fail" + note


def route(
    ns: Optional[NamespaceInfo],
    config: Config,
    cluster_policy: Optional[str],
    *,
    validation: bool = False,
    cache: Optional[Memo[str, ResolvedChain]] = None,
    explain: bool = False,
) -> Route:
    """
    Decide what to do for a review in namespace C{ns} (None: no such
    namespace).  C{validation} picks the validation endpoint annotation.
    C{cache}, a memo kept for one C{config}, remembers what each annotation
    value resolved to (parsed URL, allow-list verdict, settings), so the hot
    path does not parse the same URL for every review.  With C{explain},
    the route carries its own explanation (L{Route.explanation}).
    """
    kube = config.kubernetes
    keys = (kube.validation_annotation,) if validation else kube.endpoint_annotations
    if not is_enabled(ns, kube):
        return _explained(_NOT_ENABLED, ns, config, cluster_policy, keys, None) if explain else _NOT_ENABLED
    assert ns is not None
    policy = failure_policy(ns, config, cluster_policy)
    problem = failure_policy_problem(ns, config, policy)
    mode = namespace_mode(ns, kube)
    key = next((a for a in keys if ns.annotations.get(a)), None)
    if key is None:
        r = Route(enabled=True, failure_policy=policy, mode=mode, policy_problem=problem)
    else:
        raw = ns.annotations[key]
        resolved = cache.get(raw) if cache is not None else None
        if resolved is None:
            resolved = resolve_chain(raw, config)
            if cache is not None:
                cache[raw] = resolved
        steps, url, bad, error = resolved
        r = Route(
            True, policy, mode, url=url, raw_url=raw, steps=steps, error=error, bad_url=bad, policy_problem=problem
        )
    return _explained(r, ns, config, cluster_policy, keys, key) if explain else r


def chain_pieces(raw: str) -> list[str]:
    """The URLs of the endpoint annotation C{raw}, as written (unchecked)."""
    return [piece for piece in CHAIN_SEPARATORS.split(raw) if piece]


#: An annotation's chain resolved (L{resolve_chain}): its steps, its one URL,
#: what was wrong with it, and the reason and message of an unusable one.
ResolvedChain = tuple[tuple[EndpointStep, ...], Optional[EndpointURL], str, Optional[tuple[Reason, str]]]


def resolve_chain(raw: str, config: Config) -> ResolvedChain:
    """
    The endpoint annotation C{raw}, one URL or several separated by
    whitespace (a YAML block scalar with one URL per line reads naturally),
    as the chain to call in order: C{(steps, url, bad_url, error)}.  Every
    URL is checked (parsed, against C{endpoints.allow}) before any is
    called; the first that cannot be used fails the whole chain, as does a
    chain longer than C{endpoints.chain_limit}.
    """
    # Spaces and newlines only: any other whitespace or control character
    # stays in its piece, where the URL check refuses it by name.
    pieces = chain_pieces(raw) or [raw]
    limit = config.endpoints.chain_limit
    if len(pieces) > limit:
        return (
            (),
            None,
            "",
            (
                Reason.CHAIN_TOO_LONG,
                f"the endpoint annotation names {len(pieces)} endpoints, more than endpoints.chain_limit ({limit})",
            ),
        )
    for piece in pieces:
        # Before any parsing: a piece that still holds whitespace or a
        # control character (a CR, a tab, U+2028) is refused by name, as a
        # single URL would be, however the rest of it reads.
        if any(c.isspace() or not c.isprintable() for c in piece):
            return (), None, piece, (Reason.BAD_URL, "endpoint URL contains whitespace or control characters")
    endpoints = config.endpoints
    steps = []
    for piece in pieces:
        try:
            url = parse_endpoint_url(piece)
        except BadURL as e:
            return (), None, piece, (Reason.BAD_URL, str(e))
        if not endpoints.allowed(url):
            return (), url, "", (Reason.NOT_ALLOWED, f"endpoint {url.origin} is not in endpoints.allow")
        root = replace(url, url=url.origin + "/", path="/")
        steps.append(EndpointStep(url, endpoints.settings_for(url), endpoints.settings_for(root).breaker))
    names = step_names([step.url for step in steps])
    steps_tuple = tuple(replace(step, name=name) for step, name in zip(steps, names))
    return steps_tuple, steps_tuple[0].url, "", None


def _explained(
    r: Route,
    ns: Optional[NamespaceInfo],
    config: Config,
    cluster_policy: Optional[str],
    keys: Sequence[str],
    key: Optional[str],
) -> Route:
    """
    C{r} with its explanation: what L{route} decided for C{ns} and why, from
    what it decided with (the annotation C{key} it read of C{keys}, the
    allow-list, the failure policy and where it came from).
    """
    kube = config.kubernetes
    labels = ns.labels if ns is not None else {}
    events: list[Event] = [
        RouteDecided(
            enabled=r.enabled,
            label=kube.enabled_label,
            value=kube.enabled_value,
            got=labels.get(kube.enabled_label),
            exists=ns is not None,
            annotation=key,
            annotations=list(keys),
            url=shown_url(r.raw_url) if r.raw_url else "",
            mode=r.mode,
            steps=[step.name for step in r.steps],
        )
    ]
    if r.enabled:
        allow = config.endpoints.allow
        patterns = [p.text for p in allow]
        if r.error is not None and r.raw_url:
            reason, message = r.error
            if r.url is None:
                events.append(
                    AllowChecked(
                        url=shown_url(r.bad_url or r.raw_url),
                        allowed=False,
                        pattern=None,
                        reason=reason,
                        error=message,
                        patterns=patterns,
                    )
                )
            else:
                pattern = next((p.text for p in allow if p.matches(r.url)), None)
                events.append(
                    AllowChecked(
                        url=shown_url(r.url),
                        allowed=pattern is not None,
                        pattern=pattern,
                        reason=reason,
                        error=message,
                        patterns=patterns,
                    )
                )
        for step in r.steps:
            pattern = next((p.text for p in allow if p.matches(step.url)), None)
            events.append(
                AllowChecked(
                    url=shown_url(step.url),
                    allowed=pattern is not None,
                    pattern=pattern,
                    reason="",
                    error="",
                    patterns=patterns,
                )
            )
        _, why = failure_policy_why(ns, config, cluster_policy)
        events.append(PolicyChosen(policy=r.failure_policy, why=why))
    return replace(r, explanation=tuple(events))
