"""
Whom amp acts on, and the annotations it writes (pure): the one home of
these rules, read by the review (L{amp.admission}), the route
(L{amp.policy}), the bypassed-Pod report (L{amp.kube}) and C{amp explain}.

amp reviews a Pod when its namespace carries the enable label with the
enabling value (L{is_enabled}), unless the namespace is amp's own or a
protected one (L{protected_namespaces}) or the Pod opted out
(L{opted_out}); in shadow mode (L{mode}) it calls the endpoint but changes
nothing.  Every Pod it reviews on C{/mutate} in an enabled namespace, not in
shadow mode, gets its status stamp (L{STATUS_ANNOTATION}); the stamp of
earlier versions (L{LEGACY_SKIPPED_ANNOTATION}) is removed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Optional, Protocol

from amp.reasons import Mode

if TYPE_CHECKING:
    from amp.config import KubernetesConfig

__all__ = [
    "CANARY_ANNOTATION",
    "CANARY_PERCENT_ANNOTATION",
    "CANARY_STEP_ANNOTATION",
    "NAMESPACE_FEATURE_ANNOTATIONS",
    "KnownNamespace",
    "Namespace",
    "RECORD_ANNOTATION",
    "LEGACY_SKIPPED_ANNOTATION",
    "STAMP_ANNOTATIONS",
    "STATUS_ANNOTATION",
    "is_enabled",
    "labels_opt_out",
    "mode",
    "opted_out",
    "own_pods_warning",
    "protected_namespaces",
]

#: The status stamp on every Pod amp reviews: C{<status> [<reason>] <endpoint>}.
STATUS_ANNOTATION = "amp.txn2.com/status"
#: The stamp of earlier versions (failures only), removed by every review.
LEGACY_SKIPPED_ANNOTATION = "amp.txn2.com/skipped"
#: amp's stamps: a Pod with either was reviewed.
STAMP_ANNOTATIONS = (STATUS_ANNOTATION, LEGACY_SKIPPED_ANNOTATION)

#: The namespace annotations of a canary (L{amp.canary}): the candidate
#: endpoint, the share of reviews it sees, the step of the chain it stands
#: beside.
CANARY_ANNOTATION = "amp.txn2.com/canary"
CANARY_PERCENT_ANNOTATION = "amp.txn2.com/canary-percent"
CANARY_STEP_ANNOTATION = "amp.txn2.com/canary-step"
#: The namespace annotation that chooses a namespace for recording with
#: C{record.namespaces: annotated} (L{amp.record}).
RECORD_ANNOTATION = "amp.txn2.com/record"
#: Namespace annotations of amp's features beyond routing, which the
#: namespace source keeps.
NAMESPACE_FEATURE_ANNOTATIONS = (
    CANARY_ANNOTATION,
    CANARY_PERCENT_ANNOTATION,
    CANARY_STEP_ANNOTATION,
    RECORD_ANNOTATION,
)


class Namespace(Protocol):
    """
    What the rules read of a namespace (L{amp.namespaces.NamespaceInfo} is
    one): the namespace sources build on the rules, so the rules name no
    source's type.
    """

    @property
    def name(self) -> str: ...

    @property
    def labels(self) -> Mapping[str, str]: ...

    @property
    def annotations(self) -> Mapping[str, str]: ...


class KnownNamespace(Namespace, Protocol):
    """A namespace as a source keeps it: with the near-miss hints it kept (L{amp.hints})."""

    @property
    def near_misses(self) -> tuple[str, ...]: ...


def is_enabled(ns: Optional[Namespace], kube: KubernetesConfig) -> bool:
    """Whether namespace C{ns} (None: it does not exist) opted in."""
    return ns is not None and ns.labels.get(kube.enabled_label) == kube.enabled_value


def mode(ns: Namespace, kube: KubernetesConfig) -> Mode:
    """The namespace's mode: C{shadow} when its mode annotation says so."""
    return Mode.SHADOW if ns.annotations.get(kube.mode_annotation) == Mode.SHADOW else Mode.NORMAL


def protected_namespaces(kube: KubernetesConfig, own_namespace: Optional[str] = None) -> frozenset[str]:
    """
    The namespaces whose Pods amp never changes: its own
    (C{own_namespace}, else C{kubernetes.own_namespace}) and
    C{kubernetes.protected_namespaces}; none when
    C{kubernetes.allow_protected_namespaces} is set.  A webhook that must
    answer before its own Pods (or kube-system's) can start would lock the
    cluster out of recovering.
    """
    if kube.allow_protected_namespaces:
        return frozenset()
    own = own_namespace or kube.own_namespace
    return frozenset((*((own,) if own else ()), *kube.protected_namespaces))


def labels_opt_out(labels: Any, kube: KubernetesConfig) -> bool:
    """Whether a Pod's C{labels} opt it out of amp (see L{opted_out})."""
    return type(labels) is dict and labels.get(kube.enabled_label) == kube.opt_out_value


def opted_out(pod: Any, kube: KubernetesConfig) -> bool:
    """
    Whether C{pod} opts out of amp: its enable label
    (C{kubernetes.enabled_label}) says C{kubernetes.opt_out_value}
    (C{amp.txn2.com/enabled: "false"}).
    """
    metadata = pod.get("metadata") if type(pod) is dict else None
    return labels_opt_out(metadata.get("labels") if type(metadata) is dict else None, kube)


def own_pods_warning(ns: Optional[Namespace], kube: KubernetesConfig) -> Optional[str]:
    """
    What to warn about at start-up when amp's own namespace C{ns} is
    enabled (its own Pods would be sent to it), or None.
    """
    if not is_enabled(ns, kube):
        return None
    assert ns is not None
    if ns.name in protected_namespaces(kube):
        return (
            f"amp's own namespace {ns.name} is enabled ({kube.enabled_label}); amp will not "
            "change its Pods (kubernetes.allow_protected_namespaces is off)"
        )
    return (
        f"amp's own namespace {ns.name} is enabled ({kube.enabled_label}) and "
        "kubernetes.allow_protected_namespaces is on: amp reviews its own Pods, so while no replica is ready "
        "new ones may not start"
    )


def stamps(annotations: Mapping[str, Any]) -> bool:
    """Whether a Pod's C{annotations} carry one of amp's stamps (it was reviewed)."""
    return any(stamp in annotations for stamp in STAMP_ANNOTATIONS)
