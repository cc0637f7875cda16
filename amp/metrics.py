"""
Prometheus metrics and the plain-HTTP ``/metrics`` resource.

Every component gets the one L{Metrics} object it reports to; each instance
has its own registry, so tests can make a fresh one and read it back.  The
C{endpoint} label is always an origin (C{scheme://host:port}), never a full
URL, so its cardinality is bounded by the number of endpoint services.

Label values with a fixed set (C{amp_tls_reloads_total{result}}) start at
zero, so that C{increase()} and C{rate()} see the first event.  The registry
also carries the process's own metrics (C{process_*}: CPU, resident memory,
open file descriptors), and no C{*_created} series.
``docs/metrics.md`` describes every metric and what to alert on.
"""

from __future__ import annotations

from abc import abstractmethod
from bisect import bisect_left
from typing import Any, Iterator, Optional, Sequence

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.openmetrics.exposition import CONTENT_TYPE_LATEST as OPENMETRICS_CONTENT_TYPE
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.registry import Collector
from prometheus_client.samples import Exemplar
from prometheus_client.utils import floatToGoString
from twisted.web.resource import Resource
from twisted.web.server import Request

from amp import __version__
from amp.reasons import BreakerState

#: Buckets for admission and endpoint latency: webhook budgets are
#: milliseconds to a few seconds.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

BREAKER_STATE_VALUES = {BreakerState.CLOSED: 0, BreakerState.HALF_OPEN: 1, BreakerState.OPEN: 2}

#: Values of C{amp_tls_reloads_total{result}}.
TLS_RELOAD_RESULTS = ("success", "error")

#: Values of C{amp_config_reloads_total{result}}.
CONFIG_RELOAD_RESULTS = ("success", "error")

#: Values of C{amp_recorded_reviews_total{result}}.
RECORD_RESULTS = ("written", "dropped", "failed")

#: Values of C{amp_trace_spans_dropped_total{reason}}.
TRACE_DROP_REASONS = ("queue_full", "export_failed")

#: Values of C{amp_connections_dropped_total{reason}}.
CONNECTION_DROP_REASONS = ("max-connections", "no-request", "shutting-down")


#: Operations C{amp_admission_requests_total{operation}} names; any other
#: is counted as C{other}.
OPERATIONS = frozenset({"CREATE", "UPDATE", "DELETE", "CONNECT"})
#: How many distinct request kinds C{amp_admission_requests_total{kind}}
#: names; later ones are counted as C{other}.  The kind comes from the
#: request, so a client must not be able to grow the registry without bound.
KIND_LIMIT = 16


def _label_key(
    name: str, labelnames: tuple[str, ...], values: tuple[object, ...], named: dict[str, object]
) -> tuple[str, ...]:
    """The label values of a child, given by position or by name, as strings."""
    if named:
        if values or set(named) != set(labelnames):
            raise ValueError(f"{name} takes the labels {', '.join(labelnames)}")
        values = tuple(named[label] for label in labelnames)
    if len(values) != len(labelnames):
        raise ValueError(f"{name} takes the labels {', '.join(labelnames)}")
    return tuple(str(v) for v in values)


class _Count:
    """One child of a L{HotCounter}: a plain number."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


class _Observed:
    """
    One child of a L{HotHistogram}: a count per bucket and the sum, and,
    once a traced observation came, the last one's exemplar per bucket.
    """

    __slots__ = ("_bounds", "counts", "sum", "exemplars")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        #: Observations per bucket, not cumulative; the last is +Inf's.
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        #: Per bucket, the last traced observation's (trace id, value,
        #: time), or None; None until the first (no cost untraced).
        self.exemplars: Optional[list[Optional[tuple[str, float, float]]]] = None

    def observe(self, value: float) -> None:
        # The first bound >= value: Prometheus buckets count value <= le.
        self.counts[bisect_left(self._bounds, value)] += 1
        self.sum += value

    def observe_traced(self, value: float, trace_id: str, when: float) -> None:
        """Observe C{value} of a traced review: its bucket's exemplar names the trace."""
        index = bisect_left(self._bounds, value)
        self.counts[index] += 1
        self.sum += value
        exemplars = self.exemplars
        if exemplars is None:
            exemplars = self.exemplars = [None] * len(self.counts)
        exemplars[index] = (trace_id, value, when)


class _HotFamily(Collector):
    """
    A metric of every review's path, in C{prometheus_client}'s exposition:
    its children are plain numbers, changed on the reactor thread, which
    is also where the registry is scraped (C{/metrics} is a twisted.web
    resource), so no lock is needed.  C{prometheus_client}'s own children
    take a lock per change (five times the cost of a plain number's;
    bench/README.md, "Figures behind the code"): a few per review, on the
    only thread that counts them.  Nothing but the reactor thread may change or scrape
    one.  A subclass says how a child is made (L{_child}).
    """

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], registry: CollectorRegistry) -> None:
        self._name = name
        self._documentation = documentation
        self._labelnames = tuple(labelnames)
        self._children: dict[tuple[str, ...], Any] = {}
        registry.register(self)

    @abstractmethod
    def _child(self) -> Any:
        """A new child: what one set of label values counts."""

    def labels(self, *values: Any, **named: Any) -> Any:
        """The child of these label values, by position or name (made empty the first time)."""
        key = _label_key(self._name, self._labelnames, values, named)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self._child()
        return child


class HotCounter(_HotFamily):
    """A counter of every review's path (L{_HotFamily})."""

    def _child(self) -> _Count:
        return _Count()

    def describe(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily(self._name, self._documentation, labels=self._labelnames)

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(self._name, self._documentation, labels=self._labelnames)
        for key, child in list(self._children.items()):
            family.add_metric(key, child.value)
        yield family


class HotHistogram(_HotFamily):
    """A histogram of every review's path (L{_HotFamily})."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        self._bounds = tuple(float(b) for b in buckets)
        self._les = [floatToGoString(b) for b in self._bounds] + ["+Inf"]
        super().__init__(name, documentation, labelnames, registry)
        if not self._labelnames:
            self._children[()] = self._child()

    def _child(self) -> _Observed:
        return _Observed(self._bounds)

    def observe(self, value: float) -> None:
        """Observe C{value} (a histogram without labels)."""
        self._children[()].observe(value)

    def observe_traced(self, value: float, trace_id: str, when: float) -> None:
        """Observe C{value} of trace C{trace_id}, its exemplar (a histogram without labels)."""
        self._children[()].observe_traced(value, trace_id, when)

    def describe(self) -> Iterator[HistogramMetricFamily]:
        yield HistogramMetricFamily(self._name, self._documentation, labels=self._labelnames)

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self._name, self._documentation, labels=self._labelnames)
        for key, child in list(self._children.items()):
            cumulative = 0
            buckets: list[tuple[str, float] | tuple[str, float, Exemplar]] = []
            exemplars = child.exemplars
            for i, (le, count) in enumerate(zip(self._les, child.counts)):
                cumulative += count
                exemplar = exemplars[i] if exemplars is not None else None
                if exemplar is None:
                    buckets.append((le, cumulative))
                else:
                    buckets.append((le, cumulative, Exemplar({"trace_id": exemplar[0]}, exemplar[1], exemplar[2])))
            family.add_metric(list(key), buckets, child.sum)
        yield family


class Metrics:
    """
    All of amp's metrics, in one registry.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        # A *_created series per counter and histogram child doubles what is
        # scraped and no alert or dashboard uses it.  (A switch of the
        # prometheus_client module, for every registry in the process.)
        disable_created_metrics()
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        ProcessCollector(registry=r)
        # The four metrics every review touches are amp's own (HotCounter,
        # HotHistogram): plain numbers on the reactor thread, no lock.
        self.admission_requests = HotCounter(
            "amp_admission_requests",
            "Admission reviews answered, by result and reason.",
            ["kind", "operation", "result", "reason"],
            registry=r,
        )
        self._review_counters: dict[tuple[str, str, str, str], Any] = {}
        self._review_kinds: set[str] = set()
        self.admission_duration = HotHistogram(
            "amp_admission_duration_seconds",
            "Time from request to answer for a review.",
            [],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.bad_requests = Counter(
            "amp_bad_requests", "Requests refused before review, by HTTP status.", ["code"], registry=r
        )
        self.endpoint_requests = HotCounter(
            "amp_endpoint_requests", "Endpoint calls by outcome.", ["endpoint", "outcome"], registry=r
        )
        self.endpoint_duration = HotHistogram(
            "amp_endpoint_duration_seconds", "Endpoint call latency.", ["endpoint"], buckets=LATENCY_BUCKETS, registry=r
        )
        self.breaker_state = Gauge(
            "amp_circuit_breaker_state",
            "Circuit breaker state: 0 closed, 1 half-open, 2 open.",
            ["endpoint"],
            registry=r,
        )
        self.endpoint_queued = Gauge(
            "amp_endpoint_queued",
            "Reviews waiting for a slot of the origin's max_concurrent calls.",
            ["endpoint"],
            registry=r,
        )
        self.endpoint_queue_refused = Counter(
            "amp_endpoint_queue_refused",
            "Calls not made because the origin's bulkhead was full, by reason.",
            ["endpoint", "reason"],
            registry=r,
        )
        self.endpoint_shed = Counter(
            "amp_endpoint_shed",
            "Reviews shed (failure policy at once) for the origin's latency budget.",
            ["endpoint"],
            registry=r,
        )
        self.endpoint_shedding = Gauge(
            "amp_endpoint_shedding",
            "1 while the origin is over its latency budget and sheds, else 0.",
            ["endpoint"],
            registry=r,
        )
        self.shadow_patches = Counter(
            "amp_shadow_patches", "Patches computed in shadow mode and not applied.", ["endpoint"], registry=r
        )
        self.patch_repairs = Counter(
            "amp_patch_repairs", "Operations amp inserted to create missing parents.", registry=r
        )
        self.namespace_cache_size = Gauge("amp_namespace_cache_namespaces", "Namespaces held in the cache.", registry=r)
        self.namespace_watch_restarts = Counter(
            "amp_namespace_watch_restarts", "Watch restarts, by reason.", ["reason"], registry=r
        )
        self.namespace_events = Counter("amp_namespace_events", "Watch events applied, by type.", ["type"], registry=r)
        self.namespace_problems = Counter(
            "amp_namespace_problems",
            "Unusable namespace configuration found, once per change of a namespace, by problem.",
            ["problem"],
            registry=r,
        )
        self.registration_problems = Gauge(
            "amp_registration_problems",
            "Problems of amp's MutatingWebhookConfiguration against what amp needs "
            "(amp.registration), by problem: how many now.",
            ["problem"],
            registry=r,
        )
        self.registration_repairs = Counter(
            "amp_registration_repairs",
            "Applies of the managed MutatingWebhookConfiguration that changed it "
            "(registration.managed), by the Lease holder.",
            registry=r,
        )
        self.certificate_steps = Counter(
            "amp_certificate_steps",
            "Changes the Lease holder made to amp's own certificates (registration.secret), by step.",
            ["step"],
            registry=r,
        )
        for step in ("create", "add-ca", "issue", "retire-ca"):
            self.certificate_steps.labels(step=step)
        self.certificate_authorities = Gauge(
            "amp_certificate_authorities",
            "CAs in the caBundle of amp's own Secret as this replica last read it (2 during a CA rotation).",
            registry=r,
        )
        self.namespace_misses = Counter(
            "amp_namespace_cache_misses", "Lookups the cache could not answer, by result.", ["result"], registry=r
        )
        self.bypassed_pods = Counter(
            "amp_bypassed_pods",
            "Pods created in an enabled namespace without amp's review (no status stamp).",
            ["namespace"],
            registry=r,
        )
        self.audit_pods = Gauge(
            "amp_audit_pods",
            "Pods by the continuous audit's last finding (only on the replica that audits).",
            ["namespace", "state"],
            registry=r,
        )
        self.audit_runs = Counter("amp_audit_runs", "Continuous audits, by result (ok, error).", ["result"], registry=r)
        self.tls_not_after = Gauge(
            "amp_tls_certificate_not_after_timestamp_seconds",
            "Expiry of the serving certificate (unix time).",
            registry=r,
        )
        self.tls_reloads = Counter("amp_tls_reloads", "Serving certificate reloads by result.", ["result"], registry=r)
        for result in TLS_RELOAD_RESULTS:
            self.tls_reloads.labels(result=result)
        self.open_connections = Gauge(
            "amp_open_connections", "Open client connections on the webhook listener.", registry=r
        )
        self.connections_dropped = Counter(
            "amp_connections_dropped", "Connections closed before any answer, by reason.", ["reason"], registry=r
        )
        for reason in CONNECTION_DROP_REASONS:
            self.connections_dropped.labels(reason=reason)
        self.config_reloads = Counter(
            "amp_config_reloads", "Config file reloads (file changed or SIGHUP) by result.", ["result"], registry=r
        )
        for result in CONFIG_RELOAD_RESULTS:
            self.config_reloads.labels(result=result)
        self.config_info = Gauge(
            "amp_config_info", "1 for the hash of the configuration in force.", ["hash"], registry=r
        )
        self.recorded_reviews = Counter(
            "amp_recorded_reviews",
            "Reviews offered for recording (record section), by result: written, "
            "dropped (what waits for the writer process was full) or failed (the disk refused, too large, or the "
            "writer ended before writing it).",
            ["result"],
            registry=r,
        )
        for result in RECORD_RESULTS:
            self.recorded_reviews.labels(result=result)
        self.record_writer_restarts = Counter(
            "amp_record_writer_restarts",
            "Times the recording's writer process ended without being asked and was started again.",
            registry=r,
        )
        self.canary_reviews = Counter(
            "amp_canary_reviews",
            "Reviews whose candidate endpoint (amp.txn2.com/canary) was compared with the "
            "live one, by namespace and result: same, differs, failed, skipped.",
            ["namespace", "result"],
            registry=r,
        )
        self.trace_spans_dropped = Counter(
            "amp_trace_spans_dropped",
            "Spans amp made and did not export (tracing section), by reason: "
            "queue_full (tracing.queue spans were waiting already) or export_failed (the collector is down, slow "
            "past tracing.export_timeout, or refused them).",
            ["reason"],
            registry=r,
        )
        for reason in TRACE_DROP_REASONS:
            self.trace_spans_dropped.labels(reason=reason)
        self.build_info = Gauge("amp_build_info", "1, labelled with amp's version.", ["version"], registry=r)
        self.build_info.labels(version=__version__).set(1)

    def count_review(
        self,
        kind: str,
        operation: str,
        result: str,
        reason: str,
        seconds: float,
        trace_id: Optional[str] = None,
        when: float = 0.0,
    ) -> None:
        """
        One review answered: C{amp_admission_requests_total} and
        C{amp_admission_duration_seconds}.  The counter's children are kept
        for the next review with the same labels (C{labels()} costs as
        much as the rest of the accounting).  A traced review (C{trace_id},
        answered at C{when}) is its latency bucket's exemplar.
        """
        child = self._review_counters.get((kind, operation, result, reason))
        if child is None:
            child = self._review_counter(kind, operation, result, reason)
        child.inc()
        if trace_id is None:
            self.admission_duration.observe(seconds)
        else:
            self.admission_duration.observe_traced(seconds, trace_id, when)

    def _review_counter(self, kind: str, operation: str, result: str, reason: str) -> Any:
        kinds = self._review_kinds
        if kind not in kinds and len(kinds) < KIND_LIMIT:
            kinds.add(kind)
        bounded = (kind if kind in kinds else "other", operation if operation in OPERATIONS else "other")
        child = self.admission_requests.labels(*bounded, result, reason)
        if bounded == (kind, operation):
            # Only bounded keys are kept: results and reasons are amp's own.
            self._review_counters[(kind, operation, result, reason)] = child
        return child

    def render(self, openmetrics: bool = False) -> bytes:
        """
        The registry in the Prometheus text exposition format, or in
        OpenMetrics' (which carries the latency histogram's exemplars).
        """
        text: bytes = generate_openmetrics(self.registry) if openmetrics else generate_latest(self.registry)
        return text


class MetricsResource(Resource):
    """
    C{GET /metrics} in the Prometheus text format, or in OpenMetrics' when
    the scraper accepts it (C{Accept: application/openmetrics-text}, as
    Prometheus sends): the format whose histograms carry exemplars.
    """

    isLeaf = True

    def __init__(self, metrics: Metrics) -> None:
        Resource.__init__(self)
        self._metrics = metrics

    def render_GET(self, request: Request) -> bytes:
        accept = request.getHeader(b"accept") or b""
        if b"application/openmetrics-text" in accept:
            request.setHeader(b"Content-Type", OPENMETRICS_CONTENT_TYPE.encode("ascii"))
            return self._metrics.render(openmetrics=True)
        request.setHeader(b"Content-Type", CONTENT_TYPE_LATEST.encode("ascii"))
        return self._metrics.render()
