"""
The continuous audit (C{audit.continuous}): when the Lease holder audits
(at once, on its interval, after changes at most once per C{min_interval},
one more run for pokes during a run), what it exposes
(C{amp_audit_pods{namespace,state}}, only while it holds the Lease), and
the namespace watch's cue, on a L{Clock}.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from amp.audit_loop import ContinuousAudit
from amp.cli.audit import AuditRun
from amp.cli.audit_judge import PodAudit, PodState, WorkloadAudit
from amp.cli.audit_owners import WorkloadKey
from amp.config import Config, ConfigError, parse_config
from amp.kube._events import Changed, Replaced
from amp.metrics import Metrics
from tests.unit.kube.test_kube import ENABLED, SourceTestCase, namespace

CONFIG = parse_config(
    {
        "kubernetes": {"source": "kubeconfig", "kubeconfig": "/k"},
        "audit": {"continuous": True, "interval": "10m", "min_interval": "1m"},
    }
)


class Elector:
    def __init__(self, elected: Any, deposed: Any) -> None:
        self.elected, self.deposed = elected, deposed
        self.started = self.stopped = False

    def start(self) -> None:
        self.started = True

    def stop(self) -> Deferred:
        self.stopped = True
        d: Deferred = Deferred()
        d.callback(None)
        return d


def finding(*pods: tuple[str, PodState]) -> AuditRun:
    workloads = []
    for ns, state in pods:
        w = WorkloadAudit(WorkloadKey(ns, "Deployment", "web"))
        w.pods.append(PodAudit("p", state))
        workloads.append(w)
    return AuditRun(workloads, [])


class ContinuousAuditTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.metrics = Metrics()
        self.runs: list[tuple[float, Deferred]] = []

        def run(config: Config) -> Deferred:
            d: Deferred = Deferred()
            self.runs.append((self.clock.seconds(), d))
            return d

        self.audit = ContinuousAudit(
            clock=self.clock, config=CONFIG, metrics=self.metrics, run_audit=run, elector_factory=Elector
        )
        self.audit.start()

    def gauge(self, namespace: str, state: str) -> Any:
        return self.metrics.registry.get_sample_value("amp_audit_pods", {"namespace": namespace, "state": state})

    def test_only_the_lease_holder_audits_at_once_then_on_its_interval(self) -> None:
        self.audit.poke("namespace x changed")
        self.clock.advance(3600)
        self.assertEqual(self.runs, [])
        self.audit.elector.elected()
        self.clock.advance(0)
        self.assertEqual([at for at, _ in self.runs], [3600])
        self.clock.advance(5)
        self.runs[0][1].callback(finding(("a", PodState.STALE), ("a", PodState.STALE), ("b", PodState.CURRENT)))
        self.assertEqual((self.gauge("a", "stale"), self.gauge("b", "current")), (2, 1))
        self.clock.advance(599)
        self.assertEqual(len(self.runs), 1)
        self.clock.advance(1)
        self.assertEqual([at for at, _ in self.runs], [3600, 4205])

    def test_changes_are_paced_and_pokes_during_a_run_make_one_more(self) -> None:
        self.audit.elector.elected()
        self.clock.advance(0)
        for _ in range(5):
            self.audit.poke("namespace x changed")
        self.runs[0][1].callback(finding())
        self.clock.advance(10)
        self.assertEqual(len(self.runs), 1)  # not before min_interval after the last start
        self.clock.advance(50)
        self.assertEqual([at for at, _ in self.runs], [0, 60])
        self.runs[1][1].callback(finding())
        self.audit.set_config(CONFIG)  # a reload: the next one as soon as the pace allows
        self.clock.advance(59)
        self.assertEqual(len(self.runs), 2)
        self.clock.advance(1)
        self.assertEqual([at for at, _ in self.runs], [0, 60, 120])

    def test_stepping_down_clears_the_gauge_and_the_schedule(self) -> None:
        self.audit.elector.elected()
        self.clock.advance(0)
        self.runs[0][1].callback(finding(("a", PodState.STALE)))
        self.assertEqual(self.gauge("a", "stale"), 1)
        self.audit.elector.deposed()
        self.assertIsNone(self.gauge("a", "stale"))
        self.clock.advance(3600)
        self.assertEqual(len(self.runs), 1)

    def test_a_series_leaves_when_its_count_is_none(self) -> None:
        self.audit.elector.elected()
        self.clock.advance(0)
        self.runs[0][1].callback(finding(("a", PodState.STALE)))
        self.clock.advance(600)
        self.runs[1][1].callback(finding(("a", PodState.CURRENT)))
        self.assertEqual((self.gauge("a", "stale"), self.gauge("a", "current")), (None, 1))

    def test_a_failed_audit_is_counted_and_tried_again(self) -> None:
        self.audit.elector.elected()
        self.clock.advance(0)
        self.runs[0][1].errback(RuntimeError("Pod list in namespace a: HTTP 403 Forbidden"))
        self.assertEqual(self.metrics.registry.get_sample_value("amp_audit_runs_total", {"result": "error"}), 1)
        self.clock.advance(600)
        self.assertEqual(len(self.runs), 2)

    def test_stop_steps_down(self) -> None:
        self.audit.elector.elected()
        self.successResultOf(self.audit.stop())
        self.assertTrue(self.audit.elector.stopped)
        self.assertFalse(self.audit.leader)


class ConfigTests(SynchronousTestCase):
    def test_continuous_needs_the_cluster(self) -> None:
        with self.assertRaises(ConfigError) as e:
            parse_config({"audit": {"continuous": True}, "kubernetes": {"source": "static"}})
        self.assertIn("audit.continuous: needs kubernetes.source", str(e.exception))


class NamespaceCueTests(SourceTestCase):
    def test_the_namespace_watch_tells_of_changed_endpoints(self) -> None:
        source = self.start()
        changed: list[str] = []
        source.on_namespace_changed = changed.append
        self.send(
            source, Replaced(self.infos(namespace("team-a", "3", ENABLED, {"amp.txn2.com/ep": "http://a/"})), "10")
        )
        self.send(
            source,
            Changed(
                "MODIFIED",
                self.info("team-a", "11", labels=ENABLED, annotations={"amp.txn2.com/ep": "http://a/"}),
                "11",
            ),
        )
        self.assertEqual(changed, [])  # nothing amp keeps changed
        self.send(
            source,
            Changed(
                "MODIFIED",
                self.info("team-a", "12", labels=ENABLED, annotations={"amp.txn2.com/ep": "http://b/"}),
                "12",
            ),
        )
        self.assertEqual(changed, ["team-a"])


class ServiceTests(SynchronousTestCase):
    def test_without_a_lease_namespace_the_audit_is_off_and_says_why(self) -> None:
        from twisted.logger import globalLogPublisher

        from amp.audit_loop import AuditService

        seen: list[str] = []

        def observe(event: dict) -> None:
            if event.get("log_namespace") == "amp.audit_loop.AuditService":
                from twisted.logger import formatEvent

                seen.append(formatEvent(event))

        globalLogPublisher.addObserver(observe)
        self.addCleanup(globalLogPublisher.removeObserver, observe)
        service = AuditService(CONFIG, Clock(), Metrics(), namespaces=object())
        service.startService()
        self.assertIsNone(service.audit)
        self.assertIsNone(service.stopService())
        self.assertEqual(len(seen), 1)
        self.assertIn("set kubernetes.bypass.lease_namespace", seen[0])
