"""
The managed registration (amp.registration.RegistrationKeeper), on a
ThreadReactor (its Clock and a thread pool that runs when the test says)
with an in-memory Kubernetes: only the Lease holder applies, each apply
runs in the pool, drift the watch sees is repaired at most once per
interval and counted, failures are retried with backoff and logged once,
and the namespace source runs the Lease for it.  The apply on the wire,
against the fake API server on loopback:
tests/integration/loopback/test_registration_keeper.py.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml
from kubernetes.client.exceptions import ApiException
from twisted.logger import LogLevel, globalLogPublisher
from twisted.trial.unittest import SynchronousTestCase

from amp.config import BypassConfig, Config, parse_config
from amp.kube import KubernetesNamespaceSource
from amp.metrics import Metrics
from amp.registration import RegistrationKeeper, desired
from amp_dev.devcert import make_ca, pem_cert
from tests.support.memory_kube_client import MemoryKube, ThreadReactor, Threads

ROOT = Path(__file__).resolve().parents[3]
SHIPPED_CONFIG = ROOT / "deploy" / "base" / "amp.yaml"
CA_FILE = "/etc/amp/tls/ca.crt"
T0 = 1_767_225_600.0
CA_PEM = pem_cert(make_ca("amp ca")[0])


def managed_config(**deadline: Any) -> Config:
    raw = yaml.safe_load(SHIPPED_CONFIG.read_text())
    raw["registration"] = {"managed": True, "repair_interval": "10s"}
    raw["kubernetes"].update(backoff_initial="1s", backoff_max="8s")
    raw.setdefault("deadline", {}).update(deadline)
    return parse_config(raw)


def repairs(metrics: Metrics) -> float:
    return metrics.registry.get_sample_value("amp_registration_repairs_total") or 0.0


class Logs:
    def __init__(self, case: SynchronousTestCase) -> None:
        self.events: list[dict[str, Any]] = []
        globalLogPublisher.addObserver(self.events.append)
        case.addCleanup(globalLogPublisher.removeObserver, self.events.append)

    def at(self, level: LogLevel) -> list[dict[str, Any]]:
        return [
            e
            for e in self.events
            if e.get("log_level") == level and e.get("log_namespace", "").startswith("amp.registration")
        ]


class KeeperTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.reactor = ThreadReactor()
        self.reactor.advance(T0)
        self.kube = MemoryKube()
        self.metrics = Metrics()
        self.ca = CA_PEM
        self.reads: list[str] = []
        self.logs = Logs(self)

    def read(self, path: str) -> bytes:
        self.reads.append(path)
        if isinstance(self.ca, BaseException):
            raise self.ca
        return self.ca

    def keeper(self, config: Config | None = None) -> RegistrationKeeper:
        return RegistrationKeeper(
            config or managed_config(),
            reactor=self.reactor,
            clock=self.reactor,
            metrics=self.metrics,
            own_namespace="amp-system",
            random=lambda: 0.5,
            read=self.read,
        )

    def want(self, config: Config | None = None) -> dict[str, Any]:
        return desired(config or managed_config(), self.ca, "amp-system")

    def test_only_the_lease_holder_applies_and_only_in_the_pool(self) -> None:
        keeper = self.keeper()
        keeper.seen(None)
        self.reactor.advance(60)
        self.assertEqual(self.reactor.pool.queue, [], "a follower applies nothing")
        keeper.start_term(self.kube)
        self.assertEqual(self.kube.applies, [], "nothing is applied on the reactor thread")
        self.assertEqual(self.reads, [], "the CA file is read in the thread")
        self.assertEqual(self.reactor.pool.run(), 1)
        self.assertEqual(self.kube.applies, [self.want()])
        self.assertEqual(self.reads, [CA_FILE])
        # the configuration did not exist: creating it is a repair
        self.assertEqual(repairs(self.metrics), 1)
        [warning] = self.logs.at(LogLevel.warn)
        self.assertEqual(warning["registration_repair"], "(missing)")
        # the watch's echo of the apply is no drift
        keeper.seen(self.kube.webhook_objects["amp.txn2.com"])
        self.reactor.advance(60)
        self.assertEqual(self.reactor.pool.run(), 0)
        self.assertEqual(repairs(self.metrics), 1)

    def test_an_unchanged_registration_is_applied_once_and_is_no_repair(self) -> None:
        keeper = self.keeper()
        # as the webhook watch keeps it (amp.kube._keep.WebhookSeen.obj): the entries only
        keeper.seen({"webhooks": self.want()["webhooks"]})
        keeper.start_term(self.kube)
        self.reactor.pool.run()
        self.assertEqual(len(self.kube.applies), 1)
        self.assertEqual(repairs(self.metrics), 0)
        self.assertEqual(self.logs.at(LogLevel.warn), [])

    def test_drift_is_repaired_at_most_once_per_interval_and_counted_once_each(self) -> None:
        keeper = self.keeper()
        keeper.seen(self.want())
        keeper.start_term(self.kube)
        self.reactor.pool.run()
        # a hand edit of the timeout, 2 s after the apply
        self.reactor.advance(2)
        edited = self.want()
        edited["webhooks"][1]["timeoutSeconds"] = 30
        keeper.seen(edited)
        keeper.seen(edited)
        self.assertEqual(self.reactor.pool.queue, [], "rate-limited: not before the interval")
        self.reactor.advance(7.9)
        self.assertEqual(self.reactor.pool.queue, [])
        self.reactor.advance(0.1)
        self.assertEqual(self.reactor.pool.run(), 1)
        self.assertEqual(self.kube.applies[-1], self.want())
        self.assertEqual(repairs(self.metrics), 1)
        [warning] = self.logs.at(LogLevel.warn)
        self.assertEqual(warning["registration_repair"], "webhooks[fail.mutate.amp.txn2.com].timeoutSeconds")
        # a tool fighting amp gets one apply per interval, each counted
        for _ in range(3):
            keeper.seen(edited)
            self.reactor.advance(10)
            self.assertEqual(self.reactor.pool.run(), 1)
        self.assertEqual(repairs(self.metrics), 4)
        self.assertEqual(len(self.kube.applies), 5)
        # a deleted configuration is applied again (where RBAC grants create: deploy/managed does not)
        keeper.seen(None)
        self.reactor.advance(10)
        self.reactor.pool.run()
        self.assertEqual(self.kube.webhook_objects["amp.txn2.com"], self.want())
        self.assertEqual(self.logs.at(LogLevel.warn)[-1]["registration_repair"], "(missing)")

    def test_an_edit_seen_while_applying_is_judged_against_what_was_applied(self) -> None:
        keeper = self.keeper()
        keeper.seen(self.want())
        keeper.start_term(self.kube)
        edited = self.want()
        edited["webhooks"][0]["namespaceSelector"]["matchExpressions"][0]["values"] = ["amp-system"]
        keeper.seen(edited)  # before the first apply has answered
        self.reactor.pool.run()
        self.reactor.advance(10)
        self.assertEqual(self.reactor.pool.run(), 1, "the edit is repaired after the interval")
        self.assertEqual(repairs(self.metrics), 1)

    def test_failures_are_retried_with_backoff_logged_once_and_never_stop_it(self) -> None:
        self.kube.apply_error = ApiException(status=403, reason="Forbidden")
        keeper = self.keeper()
        keeper.seen(self.want())
        keeper.start_term(self.kube)
        self.reactor.pool.run()
        # backoff: backoff_initial + jitter (0.5 of 1 s, then of 2 s, 4 s)
        for delay in (1.5, 2.0, 3.0):
            self.reactor.advance(delay - 0.01)
            self.assertEqual(self.reactor.pool.run(), 0)
            self.reactor.advance(0.01)
            self.assertEqual(self.reactor.pool.run(), 1)
        self.assertEqual(keeper.failures, 4)
        [warning] = self.logs.at(LogLevel.warn)
        self.assertIn("Forbidden", warning["error"])
        self.kube.apply_error = None
        self.reactor.advance(5)
        self.assertEqual(self.reactor.pool.run(), 1)
        self.assertEqual(keeper.failures, 0)
        self.assertEqual(self.kube.webhook_objects["amp.txn2.com"], self.want())
        self.assertTrue(any("applied again after" in e["log_format"] for e in self.logs.at(LogLevel.info)))

    def test_an_unreadable_ca_file_is_a_failure_retried(self) -> None:
        self.ca = FileNotFoundError(2, "No such file or directory")
        keeper = self.keeper()
        keeper.start_term(self.kube)
        self.reactor.pool.run()
        self.assertEqual(self.kube.applies, [])
        [warning] = self.logs.at(LogLevel.warn)
        self.assertIn("No such file", warning["error"])
        self.ca = CA_PEM
        self.reactor.advance(2)
        self.reactor.pool.run()
        self.assertEqual(self.kube.applies, [self.want()])

    def test_a_new_ca_or_config_is_applied(self) -> None:
        keeper = self.keeper()
        keeper.seen(self.want())
        keeper.start_term(self.kube)
        self.reactor.pool.run()
        self.ca = self.ca + pem_cert(make_ca("next ca")[0])
        keeper.refresh()
        self.reactor.advance(10)
        self.reactor.pool.run()
        self.assertEqual(self.kube.applies[-1], self.want())
        reloaded = managed_config(default_timeout="7s")
        keeper.config_changed(reloaded)
        self.reactor.advance(10)
        self.reactor.pool.run()
        self.assertEqual({e["timeoutSeconds"] for e in self.kube.applies[-1]["webhooks"]}, {7})

    def test_a_term_that_ends_applies_nothing_more(self) -> None:
        keeper = self.keeper()
        keeper.seen(self.want())
        keeper.start_term(self.kube)
        keeper.end_term()  # deposed while the apply is in the pool
        self.reactor.pool.run()
        keeper.seen(None)
        self.reactor.advance(60)
        self.assertEqual(self.reactor.pool.run(), 0)
        self.assertEqual(len(self.kube.applies), 1)
        self.assertEqual(repairs(self.metrics), 0, "a result of an ended term is not reported")


class SourceTermTests(SynchronousTestCase):
    """The namespace source runs the Lease for the managed registration, with or without the bypass report."""

    def test_the_lease_holder_applies_without_the_bypass_report(self) -> None:
        reactor = ThreadReactor()
        reactor.advance(T0)
        kube = MemoryKube()
        threads = Threads()
        config = managed_config()
        keeper = RegistrationKeeper(
            config,
            reactor=reactor,
            clock=reactor,
            metrics=Metrics(),
            own_namespace="amp-system",
            read=lambda path: CA_PEM,
        )
        kube_config = dataclasses.replace(
            config.kubernetes,
            source="kubeconfig",
            kubeconfig="/nonexistent",
            bypass=BypassConfig(enabled=False, lease_namespace="amp-system"),
        )
        source = KubernetesNamespaceSource(
            kube_config,
            reactor=reactor,
            client_factory=lambda c: kube,
            spawn=threads,
            identity="amp-0_abc",
            terms=[keeper],
        )
        source.startService()
        reactor.pool.run()  # the Lease is won, then the apply
        reactor.pool.run()
        self.assertEqual(kube.holder(), "amp-0_abc")
        self.assertEqual(kube.applies, [desired(config, CA_PEM, "amp-system")])
        self.assertNotIn("amp-pod-watch", [t.name for t in threads.started], "no Pod watch without the report")
        source.stopService()
        reactor.pool.run()
        threads.run_all()
        self.assertFalse(keeper.active)
