"""
Near-miss hints: a key amp does not know, named with the closest one it
does ("did you mean"), so that a typo is not silent (pure).

Two uses:

  - labels and annotations in amp's own domain (C{amp.txn2.com/...} and
    its subdomains, as the configured keys name it) on a Namespace or a
    Pod: L{AmpKeys} says which are not keys amp reads.  The namespace
    sources keep the hints of each namespace (L{amp.namespaces.NamespaceInfo}
    C{near_misses}; the watch drops every other key) and report them once
    per change of a namespace (L{near_miss_news}); C{amp explain} prints
    them for the namespace and the Pod.
  - config keys: L{did_you_mean} is what L{amp.config} adds to an
    "unknown key" error.
"""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Optional

from amp.rules import NAMESPACE_FEATURE_ANNOTATIONS, STAMP_ANNOTATIONS

if TYPE_CHECKING:  # amp.config and amp.namespaces use this module: no import at run time
    from amp.config import KubernetesConfig
    from amp.namespaces import NamespaceInfo

__all__ = ["AmpKeys", "NAMESPACE_FEATURE_ANNOTATIONS", "NEAR_MISS_PROBLEM", "closest", "closest_label_key",
           "did_you_mean", "near_miss_news"]

#: C{amp_namespace_problems_total{problem}} of a namespace carrying a label
#: or annotation in amp's domain that amp does not read.
NEAR_MISS_PROBLEM = "unknown-key"



def closest(name: str, known: Iterable[str]) -> Optional[str]:
    """The known key most like C{name}, if one is close enough to be a typo of it."""
    found = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return found[0] if found else None


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """C{" (did you mean X?)"} for the closest known key, else the empty string."""
    match = closest(name, known)
    return f" (did you mean {match}?)" if match is not None else ""


def _abbreviates(short: str, long: str) -> bool:
    """Whether C{short} is C{long} shortened (C{ep} of C{endpoint}): its letters in order, the first first."""
    if not short or len(short) >= len(long) or short[0] != long[0]:
        return False
    rest = iter(long)
    return all(c in rest for c in short)


def closest_label_key(key: str, known: Iterable[str]) -> Optional[str]:
    """
    The known label or annotation key most like C{key}: the part after
    the C{/} compared (a shortening, C{ep} of C{endpoint}, counts as
    close), a different domain prefix counting against it.
    """
    prefix, _, name = key.rpartition("/")
    best, best_score = None, 0.5
    for candidate in known:
        cprefix, _, cname = candidate.rpartition("/")
        score = difflib.SequenceMatcher(None, name, cname).ratio()
        if _abbreviates(cname, name) or _abbreviates(name, cname):
            score = max(score, 0.8)
        if cprefix != prefix:
            score *= difflib.SequenceMatcher(None, prefix, cprefix).ratio()
        if score >= best_score and (best is None or score > best_score):
            best, best_score = candidate, score
    return best


class AmpKeys:
    """
    The labels and annotations amp reads on Namespaces and Pods for one
    C{kubernetes} config, and the domains they are in: the namespace watch
    keeps exactly C{namespace_labels} and C{namespace_annotations}.
    """

    def __init__(self, config: "KubernetesConfig") -> None:
        self.namespace_labels = tuple(dict.fromkeys(
            (config.enabled_label, *((config.failure_class_label,) if config.failure_class_label else ()))))
        self.namespace_annotations = tuple(dict.fromkeys((
            *config.endpoint_annotations, config.validation_annotation,
            config.failure_policy_annotation, config.mode_annotation, *NAMESPACE_FEATURE_ANNOTATIONS)))
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

    def near_misses(self, labels: Mapping[str, str], annotations: Mapping[str, str], pod: bool = False
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
        for kind, keys, known, other in (("label", labels, known_labels, known_annotations),
                                         ("annotation", annotations, known_annotations, known_labels)):
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


    def namespace_hints(self, info: "NamespaceInfo") -> list[str]:
        """
        A namespace's hints: those its source kept (the keys themselves may
        be gone) and those of the labels and annotations it has now.
        """
        return sorted({*info.near_misses, *self.near_misses(info.labels, info.annotations)})

    def pod_hints(self, pod: Mapping[str, Any]) -> list[str]:
        """A Pod's hints, each starting C{Pod: }."""
        meta = pod.get("metadata") or {}
        return [f"Pod: {hint}" for hint in self.near_misses(meta.get("labels") or {}, meta.get("annotations") or {},
                                                           pod=True)]


def near_miss_news(before: Optional[tuple[str, ...]], after: tuple[str, ...]) -> Optional[str]:
    """
    What to report when a namespace's hints go from C{before} (None: the
    namespace was not known) to C{after}: the hints on one line when there
    are any and they changed, else None.
    """
    if not after or after == before:
        return None
    return "; ".join(after)
