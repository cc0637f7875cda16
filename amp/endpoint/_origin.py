"""
L{Origin}: what L{amp.endpoint._client.EndpointClient} keeps per endpoint
origin: its bulkhead and queue, its latency budget, its breaker thresholds
and its metric children.
"""

from __future__ import annotations

from typing import Any, Optional

from amp.bulkhead import Bulkhead
from amp.config import BreakerConfig, EndpointSettings
from amp.endpoint._call import Call
from amp.metrics import Metrics
from amp.reasons import Reason
from amp.shedding import LatencyBudget


class Origin:
    """
    Per-origin state: the bulkhead (calls in flight and the queue), the
    latency budget, breaker thresholds and metric children.
    """

    __slots__ = ("name", "bulkhead", "latency", "breaker_config", "outcomes", "duration", "_metrics")

    def __init__(self, name: str, breaker_config: BreakerConfig, metrics: Metrics) -> None:
        self.name = name
        self.bulkhead: Bulkhead[Call] = Bulkhead()
        #: The latency budget (L{amp.shedding}) when the origin's settings have one.
        self.latency: Optional[LatencyBudget] = None
        self.breaker_config = breaker_config
        self.outcomes: dict[str, Any] = {}
        self.duration = metrics.endpoint_duration.labels(name)
        self._metrics = metrics

    @property
    def in_flight(self) -> int:
        return self.bulkhead.in_flight

    def show_queue(self) -> None:
        """The queue's length, to its gauge (only when the queue changes)."""
        self._metrics.endpoint_queued.labels(self.name).set(self.bulkhead.queued)

    def refused(self, reason: str) -> None:
        """A call amp did not make for the bulkhead's queue or the latency budget."""
        if reason == Reason.LATENCY_BUDGET:
            self._metrics.endpoint_shed.labels(self.name).inc()
        else:
            self._metrics.endpoint_queue_refused.labels(self.name, reason).inc()

    def latency_for(self, settings: EndpointSettings) -> Optional[LatencyBudget]:
        """
        The origin's latency budget under C{settings}: None when they set
        none; a fresh one when they set another (a reload).
        """
        budget = settings.latency_budget
        current = self.latency
        if budget <= 0:
            if current is not None:
                self.latency = None
                self._metrics.endpoint_shedding.labels(self.name).set(0)
            return None
        if current is None or current.budget != budget or current.window != settings.latency_window:
            if current is not None and current.shedding:
                self._metrics.endpoint_shedding.labels(self.name).set(0)
            current = self.latency = LatencyBudget(budget, settings.latency_window)
        return current
