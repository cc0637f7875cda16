"""
amp's own certificates in their Secret (amp.registration.SecretCertificates)
on a ThreadReactor (its Clock, a thread pool that runs when the test says)
with an in-memory Kubernetes: the Lease holder makes the Secret, every
replica serves its pair without a restart and reports it, the keeper is
told the new caBundle, and a CA rotation walks through both CAs in the
bundle to the new one alone, only after the cluster held both and every
replica served the new certificate.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any, Optional

import yaml
from twisted.trial.unittest import SynchronousTestCase

from amp.config import Config, parse_config
from amp.metrics import Metrics
from amp.registration import RegistrationKeeper, SecretCertificates
from amp.registration._pki import ROTATE_ANNOTATION, Held, fingerprint, issued_by, read_reports
from amp.registration._rotation import SETTLE
from amp.tls import ReloadingCertificate
from tests.support.memory_kube_client import MemoryKube, ThreadReactor

ROOT = Path(__file__).resolve().parents[3]
T0 = 1_767_225_600.0
NS, NAME = "amp-system", "amp-certificates"
INTERVAL = 1.0


def config() -> Config:
    raw = yaml.safe_load((ROOT / "deploy" / "base" / "amp.yaml").read_text())
    raw["registration"] = {
        "managed": True,
        "secret": NAME,
        "repair_interval": "1s",
        "ca_validity": "1h",
        "cert_validity": "10m",
    }
    raw.setdefault("tls", {})["reload_interval"] = f"{INTERVAL:g}s"
    return parse_config(raw)


class Replica:
    def __init__(self, reactor: ThreadReactor, kube: MemoryKube, name: str) -> None:
        self.certificate = ReloadingCertificate("Secret tls.crt", "Secret tls.key", clock=reactor, memory=True)
        self.metrics = Metrics()
        self.certs = SecretCertificates(
            config(),
            reactor=reactor,
            clock=reactor,
            certificate=self.certificate,
            client=kube,
            namespace=NS,
            identity=name,
            metrics=self.metrics,
        )
        self.told = 0
        self.certs.on_bundle.append(self.tell)

    def tell(self) -> None:
        self.told += 1

    @property
    def serving(self) -> Optional[str]:
        chain = self.certificate.chain
        return fingerprint(chain[0]) if chain else None


class SecretCertificatesTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.reactor = ThreadReactor()
        self.reactor.advance(T0)
        self.kube = MemoryKube()
        self.a = Replica(self.reactor, self.kube, "amp-a")
        self.b = Replica(self.reactor, self.kube, "amp-b")
        for r in (self.a, self.b):
            r.certs.startService()
            self.addCleanup(r.certs.stopService)

    def settle(self, seconds: float = 0.0, steps: int = 20) -> None:
        """Run the pool and the clock: C{seconds} in steps, every thread's work done between."""
        self.reactor.pool.run()
        for _ in range(steps):
            self.reactor.advance(seconds / steps if seconds else 0.05)
            self.reactor.pool.run()

    def held(self) -> Held:
        held = Held.read(self.kube.secrets[(NS, NAME)]["data"])
        assert held is not None
        return held

    def cluster_holds(self, held: Held) -> None:
        """The watch sees the webhook configuration with C{held}'s bundle in every entry."""
        bundle = base64.b64encode(held.bundle).decode()
        obj = {"webhooks": [{"name": n, "clientConfig": {"caBundle": bundle}} for n in ("fail.x", "ignore.x")]}
        for r in (self.a, self.b):
            r.certs.seen(obj)

    def test_no_replica_writes_until_one_holds_the_lease_then_every_replica_serves_what_it_made(self) -> None:
        self.settle(3)
        self.assertEqual(self.kube.secrets, {})
        self.assertFalse(self.a.certificate.loaded)
        self.assertEqual(self.a.certificate.readiness(), (False, "no TLS certificate loaded"))
        self.a.certs.start_term(self.kube)
        self.settle(3)
        held = self.held()
        self.assertEqual(self.kube.secrets[(NS, NAME)]["type"], "kubernetes.io/tls")
        self.assertEqual(len(held.cas), 1)
        assert held.cert is not None
        self.assertEqual(self.a.serving, fingerprint(held.cert))
        self.assertEqual(self.b.serving, fingerprint(held.cert))
        self.assertEqual((self.a.told, self.b.told), (1, 1))
        self.assertEqual(self.a.certs.bundle, held.bundle)
        reports = read_reports(self.kube.secrets[(NS, NAME)]["metadata"]["annotations"])
        self.assertEqual({r.fingerprint for r in reports.values()}, {fingerprint(held.cert)})
        self.assertEqual(len(reports), 2)
        # Nothing due: reads only, no more writes of the data.
        writes = self.kube.secret_writes.count("replace") + self.kube.secret_writes.count("create")
        self.settle(10)
        self.assertEqual(self.kube.secret_writes.count("replace") + self.kube.secret_writes.count("create"), writes)

    def test_a_ca_rotation_keeps_both_cas_until_every_replica_serves_the_new_certificate(self) -> None:
        self.a.certs.start_term(self.kube)
        self.settle(2)
        first = self.held()
        assert first.cert is not None
        self.cluster_holds(first)
        self.kube.annotate_secret(NS, NAME, {ROTATE_ANNOTATION: "now"}, 1)
        self.settle(2)
        two = self.held()
        self.assertEqual(len(two.cas), 2)
        self.assertEqual(two.cert, first.cert, "the serving certificate waits for the cluster to hold the new CA")
        self.assertNotIn(ROTATE_ANNOTATION, self.kube.secrets[(NS, NAME)]["metadata"]["annotations"])
        self.assertEqual(self.a.certs.bundle, two.bundle)
        self.assertEqual(self.a.metrics.registry.get_sample_value("amp_certificate_authorities"), 2)
        self.settle(SETTLE * 2)
        self.assertEqual(self.held().cert, first.cert)
        # The keeper applied the new bundle; the watch sees it.  b stops reading (a slow replica).
        self.cluster_holds(two)
        self.b.certs.stopService()
        self.settle(SETTLE / 2)
        self.assertEqual(self.held().cert, first.cert, "settling")
        self.settle(SETTLE)
        issued = self.held()
        assert issued.cert is not None
        self.assertTrue(issued_by(issued.cert, two.cas[1]))
        self.assertEqual(self.a.serving, fingerprint(issued.cert))
        # b still serves the old certificate (its report says so): the old CA stays.
        self.settle(10)
        self.assertEqual(len(self.held().cas), 2)
        self.assertEqual(self.b.serving, fingerprint(first.cert))
        self.b.certs.startService()
        self.settle(3)
        self.assertEqual(self.b.serving, fingerprint(issued.cert))
        self.assertEqual(self.held().cas, (two.cas[1],))
        steps = {
            s: self.a.metrics.registry.get_sample_value("amp_certificate_steps_total", {"step": s})
            for s in ("create", "add-ca", "issue", "retire-ca")
        }
        self.assertEqual(steps, {"create": 1, "add-ca": 1, "issue": 1, "retire-ca": 1})
        self.assertEqual(self.b.metrics.registry.get_sample_value("amp_certificate_steps_total", {"step": "issue"}), 0)
        self.assertEqual(self.b.metrics.registry.get_sample_value("amp_certificate_authorities"), 1)
        self.assertEqual(self.a.serving, fingerprint(issued.cert))

    def test_the_keeper_applies_the_bundle_of_the_secret(self) -> None:
        keeper = RegistrationKeeper(
            config(),
            reactor=self.reactor,
            clock=self.reactor,
            metrics=Metrics(),
            own_namespace=NS,
            bundle=lambda: self.a.certs.bundle,
            read=lambda path: self.fail("no CA file is read"),
        )
        self.a.certs.on_bundle.append(keeper.refresh)
        keeper.start_term(self.kube)
        self.settle(1)
        self.assertEqual(self.kube.applies, [], "no bundle yet: nothing applied")
        self.a.certs.start_term(self.kube)
        self.settle(3)
        applied = self.kube.applies[-1]
        bundle = {base64.b64decode(e["clientConfig"]["caBundle"]) for e in applied["webhooks"]}
        self.assertEqual(bundle, {self.held().bundle})

    def test_an_api_server_away_is_logged_and_retried(self) -> None:
        errors: list[Any] = []
        from twisted.logger import globalLogPublisher

        globalLogPublisher.addObserver(errors.append)
        self.addCleanup(globalLogPublisher.removeObserver, errors.append)
        self.kube.secret_error = OSError("connection refused")
        self.a.certs.start_term(self.kube)
        self.settle(5)
        warned = [
            e for e in errors if "connection refused" in str(e.get("error", "")) and e.get("log_source") is self.a.certs
        ]
        self.assertEqual(len(warned), 1, "one line per distinct error")
        self.kube.secret_error = None
        self.settle(3)
        self.assertIn((NS, NAME), self.kube.secrets)
        self.assertTrue(self.a.certificate.loaded)

    def test_winning_the_lease_during_a_read_acts_right_after_it_not_an_interval_later(self) -> None:
        self.reactor.advance(0)  # the first reads are in the pool, not done
        self.assertEqual(len(self.reactor.pool.queue), 2)
        self.a.certs.start_term(self.kube)
        self.reactor.advance(0)
        self.reactor.pool.run()  # the read ends (as a follower's: nothing written)
        self.reactor.advance(0.05)
        self.reactor.pool.run()
        self.assertIn((NS, NAME), self.kube.secrets)
