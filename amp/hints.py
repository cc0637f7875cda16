"""
Near-miss hints on Namespaces and Pods: a label or annotation in amp's own
domain (C{amp.txn2.com/...} and its subdomains, as the configured keys name
it) that amp does not read, named with the closest key it does, so that a
typo is not silent (pure).

L{AmpKeys} says which keys amp reads and which are near misses.  The
namespace sources keep the hints of each namespace
(L{amp.namespaces.NamespaceInfo} C{near_misses}; the watch drops every
other key) and report them once per change of a namespace
(L{near_miss_news}); C{amp explain} prints them for the namespace and the
Pod.  The generic "did you mean" is L{amp.suggest}'s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Optional

from amp.rules import NAMESPACE_FEATURE_ANNOTATIONS, STAMP_ANNOTATIONS, KnownNamespace
from amp.suggest import closest_label_key

if TYPE_CHECKING:
    from amp.config import KubernetesConfig

__all__ = ["AmpKeys", "NAMESPACE_FEATURE_ANNOTATIONS", "NEAR_MISS_PROBLEM", "near_miss_news"]

#: C{amp_namespace_problems_total{problem}} of a namespace carrying a label
#: or annotation in amp's domain that amp does not read.
NEAR_MISS_PROBLEM = "unknown-key"


class AmpKeys:
    """
    The labels and annotations amp reads on Namespaces and Pods for one
    C{kubernetes} config, and the domains they are in: the namespace watch
    keeps exactly C{namespace_labels} and C{namespace_annotations}.
    """

    def __init__(self, config: "KubernetesConfig") -> None:
        self.namespace_labels = tuple(
            dict.fromkeys(
                (config.enabled_label, *((config.failure_class_label,) if config.failure_class_label else ()))
            )
        )
        self.namespace_annotations = tuple(
            dict.fromkeys(
                (
                    *config.endpoint_annotations,
                    config.validation_annotation,
                    config.failure_policy_annotation,
                    config.mode_annotation,
                    *NAMESPACE_FEATURE_ANNOTATIONS,
                )
            )
        )
        self.pod_labels = (config.enabled_label,)
        self.pod_annotations = STAMP_ANNOTATIONS
        every = (*self.namespace_labels, *self.namespace_annotations, *self.pod_annotations)
        prefixes = {key.partition("/")[0] for key in every if "/" in key}
        # amp.txn2.com from amp.txn2.com, mutation.amp.txn2.com, ...: the
        # shortest prefix that the others end with.
        self.domains = tuple(sorted(p for p in prefixes if not any(p.endswith("." + q) for q in prefixes)))

    def ours(self, key: str) -> bool:
        """Whether C{key} is in amp's domain (or a subdomain of it)."""
        prefix, slash, _ = key.partition("/")
        return bool(slash) and any(prefix == d or prefix.endswith("." + d) for d in self.domains)

    def near_misses(
        self, labels: Mapping[str, str], annotations: Mapping[str, str], pod: bool = False
    ) -> tuple[str, ...]:
        """
        One hint per label or annotation in amp's domain that amp does not
        read on a Namespace (or a Pod), e.g. C{annotation
        amp.txn2.com/endpoint is not read by amp (did you mean
        amp.txn2.com/ep?)}; sorted, empty when there is none.
        """
        known_labels = self.pod_labels if pod else self.namespace_labels
        known_annotations = self.pod_annotations if pod else self.namespace_annotations
        hints = []
        for kind, keys, known, other in (
            ("label", labels, known_labels, known_annotations),
            ("annotation", annotations, known_annotations, known_labels),
        ):
            for key in keys:
                if not isinstance(key, str) or key in known or not self.ours(key):
                    continue
                if key in other:
                    other_kind = "an annotation" if kind == "label" else "a label"
                    hints.append(f"{kind} {key} is not read by amp: it is {other_kind}")
                else:
                    match = closest_label_key(key, known)
                    hints.append(f"{kind} {key} is not read by amp" + (f" (did you mean {match}?)" if match else ""))
        return tuple(sorted(hints))

    def namespace_hints(self, info: KnownNamespace) -> list[str]:
        """
        A namespace's hints: those its source kept (the keys themselves may
        be gone) and those of the labels and annotations it has now.
        """
        return sorted({*info.near_misses, *self.near_misses(info.labels, info.annotations)})

    def pod_hints(self, pod: Mapping[str, Any]) -> list[str]:
        """A Pod's hints, each starting C{Pod: }."""
        meta = pod.get("metadata") or {}
        return [
            f"Pod: {hint}"
            for hint in self.near_misses(meta.get("labels") or {}, meta.get("annotations") or {}, pod=True)
        ]


def near_miss_news(before: Optional[tuple[str, ...]], after: tuple[str, ...]) -> Optional[str]:
    """
    What to report when a namespace's hints go from C{before} (None: the
    namespace was not known) to C{after}: the hints on one line when there
    are any and they changed, else None.
    """
    if not after or after == before:
        return None
    return "; ".join(after)
