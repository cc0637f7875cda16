"""
The templates of C{amp audit} through amp's own pipeline (reactor side):
the same parts as C{amp explain} (L{amp.cli.explain.review_round}: the
namespace, the route, the allow-list and address checks, TLS, the breaker,
the timeouts, the patch checks and the stamp), built once for the whole
audit, with calls of their own: at most C{concurrency} templates at a time
and at most C{rate} a second (L{Pacer}), so an audit of a large cluster
is a steady trickle at the endpoints, never a burst.

The audit runs as a command of its own, with its own L{EndpointClient}
and connection pools: it never takes a connection or a breaker's budget
from the replicas answering the API server.  A template that fails (the
endpoint down, a refused patch, a denial) is a L{Prediction} with an
error, for that workload only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from twisted.internet.defer import Deferred, DeferredSemaphore, inlineCallbacks
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import deferLater

from amp.admission import Admitter
from amp.breaker import BreakerRegistry
from amp.cli.audit_judge import Prediction
from amp.cli.audit_paths import touched_places
from amp.cli.explain import ExplainedNamespace, review_round
from amp.cli.workloads import InputError, pod_for
from amp.config import Config
from amp.deadline import review_budget
from amp.endpoint import Connector, EndpointClient
from amp.metrics import Metrics
from amp.namespaces import INamespaceSource
from amp.reasons import Result
from amp.trace import Called

if TYPE_CHECKING:
    from amp.reactors import IAmpReactor

__all__ = ["Pacer", "TemplatePipeline"]


class Pacer:
    """
    At most C{rate} starts a second on C{clock}: L{wait} fires when the
    next one may start (each a C{1/rate} after the one before).
    """

    def __init__(self, clock: IReactorTime, rate: float) -> None:
        self._clock = clock
        self._gap = 1.0 / rate
        self._next = 0.0

    def wait(self) -> Deferred[None]:
        now = self._clock.seconds()
        at = max(now, self._next)
        self._next = at + self._gap
        if at <= now:
            d: Deferred[None] = Deferred()
            d.callback(None)
            return d
        return deferLater(self._clock, at - now, lambda: None)


class _NoLog:
    """Where review_round looks for amp's log lines: none are collected."""

    lines: list[str] = []


class TemplatePipeline:
    """
    amp's review pipeline for the audit's templates, paced.

    @ivar calls: endpoint calls made so far.
    @ivar templates: templates reviewed so far.
    """

    def __init__(
        self,
        reactor: IAmpReactor,
        config: Config,
        namespaces: INamespaceSource,
        *,
        where: str,
        concurrency: int,
        rate: float,
        connector: Optional[Connector] = None,
    ) -> None:
        self._reactor = reactor
        self._config = config
        self._namespaces = namespaces
        self._where = where
        self._metrics = Metrics()
        self._client = EndpointClient(reactor, self._metrics, BreakerRegistry(reactor), connector=connector)
        self._admitters: dict[str, tuple[Admitter, ExplainedNamespace]] = {}
        self._semaphore = DeferredSemaphore(concurrency)
        self._pacer = Pacer(reactor, rate)
        deadline = config.deadline
        self._budget = review_budget(None, deadline.default_timeout, deadline.margin)
        self.calls = 0
        self.templates = 0

    def _admitter(self, namespace: str) -> tuple[Admitter, ExplainedNamespace]:
        if namespace not in self._admitters:
            source = ExplainedNamespace(self._namespaces, namespace, {}, {}, self._where)
            admitter = Admitter(self._config, source, self._client, self._reactor, self._metrics)
            self._admitters[namespace] = (admitter, source)
        return self._admitters[namespace]

    def predict_workload(self, namespace: str, obj: dict[str, Any]) -> Deferred[Prediction]:
        """What amp does now to the Pod C{obj} (a workload) would create; fires with a L{Prediction}."""
        kind = obj.get("kind")
        name = (obj.get("metadata") or {}).get("name")
        source = f"{kind} {name}'s template"
        try:
            pod = pod_for(obj, namespace, now=self._reactor.seconds()).pod
        except InputError as e:
            d: Deferred[Prediction] = Deferred()
            d.callback(Prediction(None, error=f"{source}: {e}", source=source))
            return d
        return self.predict_pod(namespace, pod, source)

    def predict_pod(self, namespace: str, pod: dict[str, Any], source: str) -> Deferred[Prediction]:
        """What amp does now to C{pod} (as the API server would send it); fires with a L{Prediction}."""
        return self._semaphore.run(self._paced, namespace, pod, source)

    @inlineCallbacks
    def _paced(self, namespace: str, pod: dict[str, Any], source: str) -> Any:
        yield self._pacer.wait()
        admitter, ns = self._admitter(namespace)
        try:
            round_ = yield review_round(admitter, self._reactor, ns, _NoLog(), pod, namespace, self._budget)
        except Exception as e:  # a bug must not end the audit of every other workload
            return Prediction(None, error=f"{source}: {type(e).__name__}: {e}", source=source)
        finally:
            self.templates += 1
        calls = list(round_.trace.of(Called))
        self.calls += len(calls)
        endpoints = tuple(c.endpoint for c in calls)
        if round_.result in (Result.PATCHED, Result.ALLOWED, Result.SKIPPED) and round_.pod is not None:
            places = touched_places(round_.request_pod, round_.pod)
            return Prediction(round_.pod, places, endpoints, source=source)
        what = f"{round_.result} ({round_.reason})" if round_.reason else str(round_.result)
        message = f": {round_.message}" if round_.message else ""
        return Prediction(None, endpoints=endpoints, error=f"amp's review of {source} {what}{message}", source=source)

    def close(self) -> Deferred[None]:
        return self._client.close()
