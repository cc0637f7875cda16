"""
What every review of one configuration shares (L{Parts}): the admitter
builds it once and hands it to each review, so a review reads no private
state of the admitter.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Protocol

from twisted.internet.interfaces import IReactorTime

from amp.canary import Canary, CanaryPlan, canary_plan
from amp.config import Config
from amp.endpoint import EndpointClient
from amp.memo import Memo
from amp.metrics import Metrics
from amp.namespaces import INamespaceSource, NamespaceInfo
from amp.policy import ResolvedChain, Route, route
from amp.record._entry import Capture
from amp.rules import CANARY_ANNOTATION, CANARY_PERCENT_ANNOTATION, CANARY_STEP_ANNOTATION

#: All a C{pods/ephemeralcontainers} update may change.
EPHEMERAL_CONTAINERS = "/spec/ephemeralContainers"

#: Distinct endpoint annotation values whose resolution is remembered
#: (L{amp.policy.route}'s cache).
_ANNOTATIONS_KEPT = 4096
#: Canary plans remembered (by the annotations they come from).
_PLANS_KEPT = 4096
#: Routes remembered (by namespace object, see L{Parts.route}).
_ROUTES_KEPT = 4096


class IRecorder(Protocol):
    """What a review needs of the recorder (L{amp.record.Recorder})."""

    @property
    def recording(self) -> bool:
        """Reviews are being recorded (else none is offered)."""

    def offer(self, capture: Capture) -> None:
        """Record this answered review if it is chosen; never blocks, never raises."""


@dataclass(frozen=True, eq=False)
class Parts:
    """
    The parts a review works with.

    @ivar routes: the route cache of the configuration (L{amp.policy.route}).
    @ivar note_problem: reports a namespace's unusable configuration, once
        per change (the admitter's).
    @ivar recorder: where reviews are offered for recording
        (L{amp.record.Recorder}), or None.
    @ivar canary: runs candidates of namespaces with a canary
        (L{amp.canary.Canary}), or None.
    """

    config: Config
    namespaces: INamespaceSource
    endpoints: EndpointClient
    clock: IReactorTime
    metrics: Metrics
    note_problem: Callable[[str, Optional[tuple[str, str]]], None]
    recorder: Optional[IRecorder] = None
    canary: Optional[Canary] = None
    routes: Memo[str, ResolvedChain] = field(default_factory=lambda: Memo(_ANNOTATIONS_KEPT))
    #: Each canary's plan, by the annotations it comes from.
    canary_plans: Memo[tuple[Optional[str], Optional[str], Optional[str], int], Optional[CanaryPlan]] = field(
        default_factory=lambda: Memo(_PLANS_KEPT)
    )
    #: The route of each namespace as the cache holds it (L{route}).
    routes_by_namespace: Memo[tuple[int, Optional[str], bool], tuple[Optional[NamespaceInfo], Route]] = field(
        default_factory=lambda: Memo(_ROUTES_KEPT)
    )
    #: L{amp.patch.check_patch}'s options from C{patch.*}.
    check_options: Mapping[str, Any] = field(init=False)

    def __post_init__(self) -> None:
        patch = self.config.patch
        # A frozen dataclass sets what it derives through object.__setattr__.
        object.__setattr__(
            self,
            "check_options",
            dict(
                denied=patch.denied_paths,
                allowed=patch.allowed_paths,
                repair=patch.repair,
                max_operations=patch.max_operations,
            ),
        )

    def route(self, ns: Optional[NamespaceInfo], *, validation: bool, explain: bool) -> Route:
        """
        L{amp.policy.route} for a review in C{ns}: remembered per namespace
        object, failure policy of amp's own webhook and kind of review, as
        a route is a function of those and the configuration alone (the
        cache replaces a namespace's object when it changes).  A route with
        its explanation is made anew.
        """
        cluster_policy = self.namespaces.cluster_failure_policy()
        if explain:
            return route(ns, self.config, cluster_policy, validation=validation, cache=self.routes, explain=True)
        key = (id(ns), cluster_policy, validation)
        known = self.routes_by_namespace.get(key)
        if known is not None and known[0] is ns:
            return known[1]
        r = route(ns, self.config, cluster_policy, validation=validation, cache=self.routes)
        self.routes_by_namespace[key] = (ns, r)
        return r

    def compose_options(self, steps: int) -> dict[str, Any]:
        """L{amp.patch.compose}'s options for a chain of C{steps}: each may send C{patch.max_operations}."""
        patch = self.config.patch
        return dict(
            denied=patch.denied_paths, allowed=patch.allowed_paths, max_operations=patch.max_operations * max(steps, 1)
        )

    def canary_plan(self, ns: Optional[NamespaceInfo], r: Route) -> Optional[CanaryPlan]:
        """The namespace's canary plan (L{amp.canary.canary_plan}), kept per annotation values."""
        if ns is None or CANARY_ANNOTATION not in ns.annotations:
            return None
        key = (
            ns.annotations.get(CANARY_ANNOTATION),
            ns.annotations.get(CANARY_PERCENT_ANNOTATION),
            ns.annotations.get(CANARY_STEP_ANNOTATION),
            len(r.steps),
        )
        plan = self.canary_plans.get(key)
        if plan is None:
            plan = self.canary_plans[key] = canary_plan(ns, r, self.config)
        return plan

    def has_validation_endpoint(self, ns: Optional[NamespaceInfo]) -> bool:
        return ns is not None and bool(ns.annotations.get(self.config.kubernetes.validation_annotation))
