"""
Where amp learns about namespaces: what it keeps of one (L{NamespaceInfo}),
the L{INamespaceSource} interface, and the static source.

The hot path asks L{INamespaceSource.cached} first, which answers from memory
on the reactor thread; only when that says L{UNKNOWN} does it call
L{INamespaceSource.fetch}.  L{StaticNamespaceSource} serves namespaces from
the config so amp runs without a cluster; the Kubernetes source is in
L{amp.kube}.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Final, Literal, Mapping, Optional, Union

from twisted.application.service import Service
from twisted.internet.defer import Deferred, succeed
from zope.interface import Attribute, Interface, implementer

from amp.config import KubernetesConfig
from amp.hints import AmpKeys


@dataclass(frozen=True, slots=True)
class NamespaceInfo:
    """
    What amp keeps of a Namespace: its name, labels, annotations and
    resourceVersion.  The watched source keeps only the labels and
    annotations amp reads, never whole objects.

    @ivar enabled_since: for a namespace opted in, when the enable label
        was last set (seconds since the epoch, from the API server's
        managed fields; whole seconds); None when unknown or not opted in.
        The bypassed-Pod report uses it to leave alone Pods created before
        the namespace opted in.
    """

    name: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    resource_version: str = ""
    enabled_since: Optional[float] = None
    #: Labels and annotations in amp's domain that amp does not read, each
    #: named with the closest key it does (L{amp.hints}); kept although
    #: the keys themselves are dropped.
    near_misses: tuple[str, ...] = ()


class _Unknown(Enum):
    """The one value of L{UNKNOWN} (an enum, so that a type checker narrows C{is UNKNOWN})."""

    UNKNOWN = "UNKNOWN"

    def __repr__(self) -> str:
        return "UNKNOWN"


#: L{INamespaceSource.cached} has no answer: call L{INamespaceSource.fetch}.
UNKNOWN: Final = _Unknown.UNKNOWN

CachedAnswer = Union[NamespaceInfo, None, Literal[_Unknown.UNKNOWN]]


class NamespaceLookupError(Exception):
    """
    L{INamespaceSource.fetch} could not tell whether the namespace exists
    (the API server failed, timed out or could not be reached, or the source
    is not configured).  The review path answers it with the failure policy.
    """


class INamespaceSource(Interface):
    """
    Namespaces by name, for the review path.  Implementations are services.
    """

    def cached(name: str) -> CachedAnswer:
        """
        The namespace from memory: a L{NamespaceInfo}, None (known not to
        exist), or L{UNKNOWN}.  Never blocks.
        """

    def fetch(name: str, timeout: float) -> "Deferred[Optional[NamespaceInfo]]":
        """
        Look the namespace up at the source, within C{timeout} seconds.
        Concurrent fetches of one name share one lookup.  Fires with None
        when the namespace does not exist; fails with
        L{NamespaceLookupError} when that cannot be known.
        """

    def readiness() -> tuple[bool, str]:
        """
        Whether the source has synced, and a human detail.
        """

    def cluster_failure_policy() -> Optional[str]:
        """
        The failurePolicy of amp's own MutatingWebhookConfiguration, if
        watched and known; else None.
        """

    count = Attribute("Number of namespaces held.")


@implementer(INamespaceSource)
class StaticNamespaceSource(Service):
    """
    Namespaces listed in the config (C{kubernetes.namespaces}); always ready.
    """

    def __init__(self, config: KubernetesConfig) -> None:
        keys = AmpKeys(config)
        self._namespaces = {
            name: NamespaceInfo(
                name,
                dict(spec.labels),
                dict(spec.annotations),
                near_misses=keys.near_misses(spec.labels, spec.annotations),
            )
            for name, spec in config.namespaces.items()
        }

    @property
    def count(self) -> int:
        return len(self._namespaces)

    def cached(self, name: str) -> CachedAnswer:
        return self._namespaces.get(name)

    def fetch(self, name: str, timeout: float) -> "Deferred[Optional[NamespaceInfo]]":
        return succeed(self._namespaces.get(name))

    def readiness(self) -> tuple[bool, str]:
        return True, f"static namespaces: {len(self._namespaces)}"

    def cluster_failure_policy(self) -> Optional[str]:
        return None
