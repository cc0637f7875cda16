"""
The namespace cache's misses (reactor side): L{CacheMisses}, the part of
L{amp.kube._source.KubernetesNamespaceSource} that answers for a name the
cache does not hold: the cache read itself (C{cached}, with the 404s
remembered briefly), and one bounded GET in the reactor's thread pool
(C{fetch}), shared by concurrent callers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

from twisted.internet.defer import CancelledError, Deferred, fail, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger
from twisted.python.failure import Failure

from amp.config import KubernetesConfig
from amp.kube._client import KubeClient, get_namespace
from amp.kube._keep import Keep
from amp.metrics import Metrics
from amp.namespaces import UNKNOWN, CachedAnswer, NamespaceInfo, NamespaceLookupError

if TYPE_CHECKING:
    from amp.reactors import IAmpReactor

_NEGATIVE_PRUNE_AT = 1024


@dataclass(eq=False)
class _Pending:
    """One GET in flight and the callers waiting for it."""

    waiters: list[Deferred[Optional[NamespaceInfo]]] = field(default_factory=list)
    superseded: bool = False


class CacheMisses:
    """
    The cache read and its misses, mixed into
    L{amp.kube._source.KubernetesNamespaceSource}, which owns the state
    declared here.
    """

    log: Logger
    client: Optional[KubeClient]
    _config: KubernetesConfig
    _reactor: IAmpReactor
    _clock: IReactorTime
    _metrics: Metrics
    _keep: Keep
    _cache: dict[str, NamespaceInfo]
    _negative: dict[str, float]
    _pending: dict[str, _Pending]
    _config_error: Optional[str]
    _run: Optional[Any]

    def cached(self, name: str) -> CachedAnswer:
        if self._config.per_review_get:
            return UNKNOWN
        info = self._cache.get(name)
        if info is not None:
            return info
        until = self._negative.get(name)
        if until is not None:
            if self._clock.seconds() < until:
                return None
            del self._negative[name]
        return UNKNOWN

    def fetch(self, name: str, timeout: float) -> "Deferred[Optional[NamespaceInfo]]":
        """
        One GET of the namespace, bounded by C{timeout} (and
        C{kubernetes.miss_timeout}), in the reactor's thread pool.  Callers
        asking for the same name meanwhile share it; each gets its own
        Deferred, so cancelling one leaves the others waiting.

        A caller that cancels its Deferred (the API server hung up) gets
        C{CancelledError}: it is counted as C{cancelled}, not as a failed
        lookup.

        @raise NamespaceLookupError: (in the Deferred) when the GET fails.
        """
        bound = max(0.001, min(timeout, self._config.miss_timeout))
        if self._config.per_review_get:
            d = self._get(name, bound)
            d.addCallbacks(self._counted, self._lookup_failed, errbackArgs=(name, 1))
            return d
        waiter: Deferred[Optional[NamespaceInfo]] = Deferred(self._cancelled)
        pending = self._pending.get(name)
        if pending is not None:
            pending.waiters.append(waiter)
            return waiter
        pending = self._pending[name] = _Pending([waiter])
        self._get(name, bound).addBoth(self._fetched, name, pending)
        return waiter

    def _get(self, name: str, timeout: float) -> Deferred[Optional[NamespaceInfo]]:
        client = self.client
        if client is None:
            detail = self._config_error or "the Kubernetes namespace source is not running"
            return fail(NamespaceLookupError(detail))
        if not name:
            return succeed(None)
        return deferToThreadPool(
            self._reactor,
            self._reactor.getThreadPool(),
            get_namespace,
            client,
            self._keep.namespace_body,
            name,
            timeout,
        )

    def _counted(self, info: Optional[NamespaceInfo]) -> Optional[NamespaceInfo]:
        self._metrics.namespace_misses.labels("found" if info is not None else "not-found").inc()
        return info

    def _cancelled(self, waiter: Deferred[Optional[NamespaceInfo]]) -> None:
        self._metrics.namespace_misses.labels("cancelled").inc()

    def _lookup_failed(self, failure: Failure, name: str, callers: int) -> Failure:
        if failure.check(CancelledError):
            # The caller gave up (per-review GET mode: its Deferred is the
            # GET's): not a failure of the lookup.
            self._metrics.namespace_misses.labels("cancelled").inc(callers)
            return failure
        self._metrics.namespace_misses.labels("error").inc(callers)
        error = failure.getErrorMessage() or type(failure.value).__name__
        self.log.warn("Namespace lookup for {namespace} failed: {error}", namespace=name, error=error)
        if not failure.check(NamespaceLookupError):
            return Failure(NamespaceLookupError(f"namespace {name}: {error}"))
        return failure

    def _fetched(self, result: Any, name: str, pending: _Pending) -> None:
        if self._pending.get(name) is pending:
            del self._pending[name]
        waiters = [w for w in pending.waiters if not w.called]
        if isinstance(result, Failure):
            result = self._lookup_failed(result, name, len(waiters))
            for waiter in waiters:
                waiter.errback(result)
            return
        info: Optional[NamespaceInfo] = result
        if pending.superseded and name in self._cache:
            # The watch saw this namespace change while the GET was out:
            # its view is the newer one.
            info = self._cache[name]
        elif not pending.superseded and self._run is not None:
            if info is not None:
                self._cache.setdefault(name, info)
                self._metrics.namespace_cache_size.set(len(self._cache))
            elif self._config.miss_negative_ttl > 0:
                self._remember_missing(name)
        label = "found" if info is not None else "not-found"
        self._metrics.namespace_misses.labels(label).inc(len(waiters))
        for waiter in waiters:
            waiter.callback(info)

    def _remember_missing(self, name: str) -> None:
        now = self._clock.seconds()
        if len(self._negative) >= _NEGATIVE_PRUNE_AT:
            for stale in [n for n, until in self._negative.items() if until <= now]:
                del self._negative[stale]
        self._negative[name] = now + self._config.miss_negative_ttl
