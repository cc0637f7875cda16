"""
Tests for amp.kube: the Kubernetes namespace source, driven by the real
``kubernetes`` client against the fake API server in ``fakekube.py`` over
loopback, on the real reactor.

Changes made on the fake server travel through the watch thread and
``callFromThread`` before the cache sees them, so tests wait for them with
L{wait_until}, which polls on the reactor with a hard timeout.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from typing import Any, Callable, Optional

from twisted.internet import reactor
from twisted.internet.defer import CancelledError, Deferred, gatherResults, inlineCallbacks
from twisted.internet.task import Clock, LoopingCall
from twisted.logger import globalLogPublisher
from twisted.trial.unittest import TestCase

from amp.config import Config, KubernetesConfig
from amp.kube import KubernetesNamespaceSource, backoff_delay, webhook_failure_policy
from amp.metrics import Metrics
from amp.namespaces import UNKNOWN, INamespaceSource, NamespaceLookupError
from amp.policy import FAIL, IGNORE, NamespaceInfo, failure_policy, route
from tests.fakekube import FakeKube

ENABLED = {"amp.txn2.com/enabled": "true"}
EP_A = "http://ep-a.team.svc:8080/mutate"
EP_B = "http://ep-b.team.svc:8080/mutate"
NS_PATH = "/api/v1/namespaces"
MWC_PATH = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"


def wait_until(predicate: Callable[[], bool], timeout: float = 5.0, what: str = "condition") -> Deferred:
    """
    Fires once C{predicate()} is true, checked every 10 ms on the reactor;
    fails with AssertionError after C{timeout} seconds.
    """
    deadline = reactor.seconds() + timeout

    def check() -> None:
        if predicate():
            loop.stop()
        elif reactor.seconds() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")

    loop = LoopingCall(check)
    return loop.start(0.01, now=True).addCallback(lambda _: None)


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


def events(metrics: Metrics, kind: str) -> float:
    return sample(metrics, "amp_namespace_events_total", type=kind)


def restarts(metrics: Metrics, reason: str) -> float:
    return sample(metrics, "amp_namespace_watch_restarts_total", reason=reason)


def misses(metrics: Metrics, result: str) -> float:
    return sample(metrics, "amp_namespace_cache_misses_total", result=result)


def write_kubeconfig(path: str, url: str) -> None:
    with open(path, "w") as f:
        f.write(f"""\
apiVersion: v1
kind: Config
clusters:
- name: fake
  cluster: {{server: "{url}"}}
users:
- name: amp
  user: {{token: fake-token}}
contexts:
- name: fake
  context: {{cluster: fake, user: amp}}
current-context: fake
""")


class SourceTestCase(TestCase):
    timeout = 15

    def setUp(self) -> None:
        self.fake = FakeKube().start()
        self.addCleanup(self._stop_fake)
        self.tmp = tempfile.mkdtemp(prefix="amp-test-kube-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.kubeconfig = os.path.join(self.tmp, "kubeconfig")
        write_kubeconfig(self.kubeconfig, self.fake.url)

    def _stop_fake(self) -> None:
        self.fake.stop()
        self.assertEqual(self.fake.errors, [])

    def kube_config(self, **overrides: Any) -> KubernetesConfig:
        values: dict[str, Any] = dict(
            source="kubeconfig", kubeconfig=self.kubeconfig, watch_timeout=30.0, request_timeout=2.0,
            backoff_initial=0.01, backoff_max=0.05, miss_timeout=2.0, miss_negative_ttl=5.0)
        values.update(overrides)
        return KubernetesConfig(**values)

    def start(self, clock: Optional[Clock] = None, random: Callable[[], float] = lambda: 0.5,
              **overrides: Any) -> tuple[KubernetesNamespaceSource, Metrics]:
        metrics = Metrics()
        source = KubernetesNamespaceSource(
            self.kube_config(**overrides), reactor=reactor, metrics=metrics, clock=clock, random=random)
        source.startService()
        self.addCleanup(self._stop_source, source)
        return source, metrics

    def _stop_source(self, source: KubernetesNamespaceSource) -> Optional[Deferred]:
        if source.running:
            return source.stopService()
        return None

    def listed(self, source: KubernetesNamespaceSource) -> Deferred:
        return wait_until(lambda: source.readiness()[0], what="the first list")

    def watching(self, n: int = 1) -> None:
        """Block (bounded) until the fake has n open watches."""
        self.assertTrue(self.fake.wait_for_watches(n, timeout=5))

    def watch_requests(self, path: str = NS_PATH) -> list[Any]:
        return [r for r in self.fake.requests if r.path == path and r.query.get("watch") == "true"]


# ------------------------------------------------------------ list, watch, readiness


class ListAndWatchTests(SourceTestCase):

    @inlineCallbacks
    def test_first_list_fills_cache_and_flips_readiness(self) -> Any:
        self.fake.add_namespace("team-a", labels={**ENABLED, "team": "a"}, annotations={
            "amp.txn2.com/ep": EP_A, "amp.txn2.com/failure-policy": "Ignore",
            "kubectl.kubernetes.io/last-applied-configuration": "{" + "x" * 500 + "}"})
        self.fake.add_namespace("team-b")
        self.fake.add_namespace("kube-system")
        source, metrics = self.start()
        self.assertTrue(INamespaceSource.providedBy(source))
        self.assertEqual(source.readiness(), (False, "waiting for the first namespace list"))
        self.assertIs(source.cached("team-a"), UNKNOWN)

        yield self.listed(source)

        ready, detail = source.readiness()
        self.assertTrue(ready)
        self.assertRegex(detail, r"^3 namespaces, last event \d+s ago$")
        self.assertEqual(source.count, 3)
        self.assertEqual(sample(metrics, "amp_namespace_cache_namespaces"), 3)
        info = source.cached("team-a")
        self.assertIsInstance(info, NamespaceInfo)
        # only what amp reads is kept
        self.assertEqual(dict(info.labels), ENABLED)
        self.assertEqual(dict(info.annotations), {"amp.txn2.com/ep": EP_A, "amp.txn2.com/failure-policy": "Ignore"})
        self.assertEqual(info.resource_version, self.fake.get_namespace("team-a")["metadata"]["resourceVersion"])
        self.assertEqual(dict(source.cached("team-b").annotations), {})
        self.assertIs(source.cached("never-seen"), UNKNOWN)
        # the watch starts from the list's resourceVersion, with bookmarks and both timeouts
        self.watching()
        lists = [r for r in self.fake.requests if r.path == NS_PATH and "watch" not in r.query]
        self.assertEqual(len(lists), 1)
        watch = self.watch_requests()[0]
        self.assertEqual(watch.query["resourceVersion"], self.fake.resource_version)
        self.assertEqual(watch.query["allowWatchBookmarks"], "true")
        self.assertEqual(watch.query["timeoutSeconds"], "30")

    @inlineCallbacks
    def test_annotation_change_reaches_cached_and_route(self) -> Any:
        self.fake.add_namespace("team-a", labels=ENABLED, annotations={"amp.txn2.com/ep": EP_A})
        source, metrics = self.start()
        config = Config(kubernetes=source._config)
        yield self.listed(source)
        self.assertEqual(route(source.cached("team-a"), config, None).raw_url, EP_A)
        self.watching()

        self.fake.update_namespace("team-a", annotations={"amp.txn2.com/ep": EP_B})
        yield wait_until(lambda: source.cached("team-a").annotations.get("amp.txn2.com/ep") == EP_B)
        decision = route(source.cached("team-a"), config, None)
        self.assertEqual(decision.raw_url, EP_B)
        self.assertEqual(decision.url.origin, "http://ep-b.team.svc:8080")

        self.fake.update_namespace("team-a", labels={})
        yield wait_until(lambda: not source.cached("team-a").labels)
        self.assertFalse(route(source.cached("team-a"), config, None).enabled)

        self.fake.add_namespace("team-new", labels=ENABLED, annotations={"amp.txn2.com/ep": EP_A})
        yield wait_until(lambda: source.cached("team-new") is not UNKNOWN)
        self.assertEqual(route(source.cached("team-new"), config, None).raw_url, EP_A)
        self.fake.delete_namespace("team-new")
        yield wait_until(lambda: source.cached("team-new") is UNKNOWN)
        self.assertEqual((events(metrics, "MODIFIED"), events(metrics, "ADDED"), events(metrics, "DELETED")),
                         (2, 1, 1))

    @inlineCallbacks
    def test_dropped_watch_resumes_from_last_bookmark_nothing_lost_or_doubled(self) -> Any:
        for name in ("a", "b", "c"):
            self.fake.add_namespace(name, labels=ENABLED)
        source, metrics = self.start(random=lambda: 0.0)
        yield self.listed(source)
        self.watching()
        self.fake.update_namespace("a", annotations={"amp.txn2.com/ep": EP_A})
        # A change the namespace watch does not see moves the revision on;
        # the bookmark then carries a revision newer than any namespace event.
        self.fake.put_webhook_configuration("unrelated", [{"name": "x.example.com"}])
        bookmark_rv = self.fake.resource_version
        self.fake.bookmark()
        yield wait_until(lambda: source.resource_version == bookmark_rv, what="the bookmark")
        self.assertEqual(events(metrics, "BOOKMARK"), 1)

        self.assertEqual(self.fake.drop_watches(), 1)
        self.fake.update_namespace("b", annotations={"amp.txn2.com/ep": EP_B})
        self.fake.add_namespace("d", labels=ENABLED)
        self.fake.delete_namespace("c")
        yield wait_until(lambda: source.cached("d") is not UNKNOWN and source.cached("c") is UNKNOWN)
        yield wait_until(lambda: source.resource_version == self.fake.resource_version)

        watches = self.watch_requests()
        self.assertEqual(len(watches), 2)
        self.assertEqual(watches[1].query["resourceVersion"], bookmark_rv)
        self.assertEqual(restarts(metrics, "dropped"), 1)
        # every change applied exactly once, and no relist
        self.assertEqual((events(metrics, "MODIFIED"), events(metrics, "ADDED"), events(metrics, "DELETED")),
                         (2, 1, 1))
        self.assertEqual(len([r for r in self.fake.requests if r.path == NS_PATH and "watch" not in r.query]), 1)
        self.assertEqual(source.cached("b").annotations["amp.txn2.com/ep"], EP_B)
        self.assertEqual(sorted(source._cache), ["a", "b", "d"])

    @inlineCallbacks
    def _expired_relists(self, expired_as: str) -> Any:
        self.fake.stop()
        self.fake = FakeKube(expired_as=expired_as).start()
        write_kubeconfig(self.kubeconfig, self.fake.url)
        for name in ("a", "b", "c"):
            self.fake.add_namespace(name, labels=ENABLED)
        source, metrics = self.start(random=lambda: 0.0)
        yield self.listed(source)
        self.watching()
        # Hold the reconnect at the server while namespaces change and the
        # history the resume needs is compacted away.
        self.fake.set_delay(0.5, NS_PATH)
        self.fake.drop_watches()
        self.assertTrue(self.fake.wait_for_requests(2, NS_PATH, watch=True))
        self.fake.set_delay(0)
        self.fake.delete_namespace("c")
        self.fake.add_namespace("d")
        self.fake.update_namespace("a", annotations={"amp.txn2.com/mode": "shadow"})
        self.fake.expire_history()

        yield wait_until(lambda: restarts(metrics, "expired") == 1, what="the 410")
        yield wait_until(lambda: source.cached("d") is not UNKNOWN, what="the relist")
        self.assertEqual(sorted(source._cache), ["a", "b", "d"])
        self.assertIs(source.cached("c"), UNKNOWN)
        self.assertEqual(source.cached("a").annotations, {"amp.txn2.com/mode": "shadow"})
        self.assertEqual(source.count, 3)
        self.assertEqual(sample(metrics, "amp_namespace_cache_namespaces"), 3)
        # the deletion was never seen as an event: the relist replaced the cache
        self.assertEqual(events(metrics, "DELETED"), 0)
        self.assertEqual(len([r for r in self.fake.requests if r.path == NS_PATH and "watch" not in r.query]), 2)
        self.watching()
        self.assertEqual(self.watch_requests()[-1].query["resourceVersion"], self.fake.resource_version)

    def test_expired_event_relists_and_drops_deleted_namespaces(self) -> Deferred:
        return self._expired_relists("event")

    def test_expired_http_answer_relists_and_drops_deleted_namespaces(self) -> Deferred:
        return self._expired_relists("http")

    @inlineCallbacks
    def test_silent_watch_is_restarted(self) -> Any:
        self.fake.add_namespace("a")
        # the server ends a watch after 1 s; a stream silent for 1 + 0.5 s is dead
        source, metrics = self.start(watch_timeout=1.0, request_timeout=0.5, random=lambda: 0.0)
        yield self.listed(source)
        self.watching()
        self.fake.set_delay(5.0, NS_PATH)
        self.fake.drop_watches()
        yield wait_until(lambda: restarts(metrics, "stalled") >= 1, what="the stalled restart")
        self.assertIn("watch restarting after stalled", source.readiness()[1])
        self.fake.set_delay(0)
        self.fake.update_namespace("a", annotations={"amp.txn2.com/ep": EP_A})
        yield wait_until(lambda: source.cached("a").annotations.get("amp.txn2.com/ep") == EP_A)
        # a live stream again: readiness no longer reports the restart
        self.assertNotIn("restarting", source.readiness()[1])

    @inlineCallbacks
    def test_server_timeout_restarts_the_watch_from_the_last_revision(self) -> Any:
        self.fake.add_namespace("a")
        source, metrics = self.start(watch_timeout=1.0, request_timeout=1.0)
        yield self.listed(source)
        self.fake.update_namespace("a", annotations={"amp.txn2.com/ep": EP_A})
        rv = self.fake.resource_version
        yield wait_until(lambda: len(self.watch_requests()) >= 2, what="a second watch")
        self.assertEqual(self.watch_requests()[1].query["resourceVersion"], rv)
        self.assertGreaterEqual(restarts(metrics, "timeout"), 1)
        ready, detail = source.readiness()
        self.assertTrue(ready)
        self.assertNotIn("restarting", detail)

    @inlineCallbacks
    def test_errors_back_off_exponentially_capped(self) -> Any:
        delays: list[float] = []

        def observe(event: dict) -> None:
            if event.get("log_namespace", "").startswith("amp.kube") and "delay" in event:
                delays.append(event["delay"])

        globalLogPublisher.addObserver(observe)
        self.addCleanup(globalLogPublisher.removeObserver, observe)
        self.fake.add_namespace("a")
        self.fake.fail_next(5, status=503, path_prefix=NS_PATH)
        source, metrics = self.start(backoff_initial=0.01, backoff_max=0.04, random=lambda: 1.0)
        self.assertFalse(source.readiness()[0])
        yield self.listed(source)
        self.assertEqual(delays, [0.01, 0.02, 0.04, 0.04, 0.04])
        self.assertEqual(restarts(metrics, "error"), 5)

    @inlineCallbacks
    def test_readiness_reports_why_the_first_list_fails(self) -> Any:
        self.fake.fail_next(1000, status=403, path_prefix=NS_PATH)
        source, metrics = self.start()
        yield wait_until(lambda: restarts(metrics, "error") >= 2)
        ready, detail = source.readiness()
        self.assertFalse(ready)
        self.assertIn("waiting for the first namespace list", detail)
        self.assertIn("HTTP 403", detail)


# ------------------------------------------------------------ stopping


class StopTests(SourceTestCase):

    @inlineCallbacks
    def _stops_within_a_second(self, source: KubernetesNamespaceSource) -> Any:
        [thread] = source.threads
        self.assertTrue(thread.is_alive())
        started = time.monotonic()
        yield source.stopService()
        elapsed = time.monotonic() - started
        self.assertFalse(thread.is_alive())
        self.assertLess(elapsed, 1.0)
        self.assertTrue(self.fake.wait_for_no_watches(2))

    @inlineCallbacks
    def test_stop_while_watching(self) -> Any:
        self.fake.add_namespace("a")
        source, _ = self.start()
        yield self.listed(source)
        self.watching()
        yield self._stops_within_a_second(source)
        self.assertIs(source.readiness()[0], False)

    @inlineCallbacks
    def test_stop_while_the_list_is_slow(self) -> Any:
        self.fake.set_delay(10.0, NS_PATH)
        source, _ = self.start(request_timeout=10.0)
        self.assertTrue(self.fake.wait_for_requests(1, NS_PATH))
        yield self._stops_within_a_second(source)

    @inlineCallbacks
    def test_stop_while_backing_off(self) -> Any:
        self.fake.fail_next(1000, status=500, path_prefix=NS_PATH)
        source, metrics = self.start(backoff_initial=30.0, backoff_max=30.0, random=lambda: 0.99)
        yield wait_until(lambda: restarts(metrics, "error") == 1)
        yield self._stops_within_a_second(source)

    @inlineCallbacks
    def test_stopped_source_answers_lookups_with_an_error(self) -> Any:
        self.fake.add_namespace("a")
        source, metrics = self.start()
        yield self.listed(source)
        yield source.stopService()
        self.assertTrue(self.fake.wait_for_no_watches(2))
        self.assertEqual(source.readiness(), (False, "not started"))
        yield self.assertFailure(source.fetch("b", 1.0), NamespaceLookupError)
        self.assertEqual(self.fake.count(NS_PATH + "/b"), 0)


# ------------------------------------------------------------ cache misses


class FetchTests(SourceTestCase):

    @inlineCallbacks
    def hold_watch(self, source: KubernetesNamespaceSource) -> Any:
        """
        List, then hold the watch's reconnect at the server for 3 s, so that
        namespaces created meanwhile are unknown to the cache.
        """
        yield self.listed(source)
        self.watching()
        self.fake.set_delay(3.0, NS_PATH)
        self.fake.drop_watches()
        self.assertTrue(self.fake.wait_for_requests(2, NS_PATH, watch=True))
        self.fake.set_delay(0)

    @inlineCallbacks
    def test_concurrent_misses_share_one_get(self) -> Any:
        source, metrics = self.start()
        yield self.hold_watch(source)
        self.fake.add_namespace("late", labels=ENABLED, annotations={"amp.txn2.com/ep": EP_A})
        self.assertIs(source.cached("late"), UNKNOWN)
        self.fake.set_delay(0.2, NS_PATH + "/late")

        waiters = [source.fetch("late", 2.0) for _ in range(5)]
        waiters[1].cancel()
        results = yield gatherResults([waiters[i] for i in (0, 2, 3, 4)])

        self.assertEqual(self.fake.count(NS_PATH + "/late"), 1)
        self.assertFailure(waiters[1], CancelledError)
        yield waiters[1]
        for info in results:
            self.assertEqual(info.name, "late")
            self.assertEqual(dict(info.annotations), {"amp.txn2.com/ep": EP_A})
        self.assertEqual(misses(metrics, "found"), 4)
        # the answer is cached: the next review needs no GET
        self.assertEqual(source.cached("late"), results[0])
        self.assertEqual(events(metrics, "ADDED"), 0)

    @inlineCallbacks
    def test_missing_namespace_is_remembered_for_the_ttl(self) -> Any:
        clock = Clock()
        source, metrics = self.start(clock=clock, miss_negative_ttl=5.0)
        yield self.listed(source)
        self.watching()

        self.assertIsNone((yield source.fetch("ghost", 2.0)))
        self.assertEqual(self.fake.count(NS_PATH + "/ghost"), 1)
        self.assertEqual(misses(metrics, "not-found"), 1)
        self.assertIsNone(source.cached("ghost"))
        clock.advance(4.9)
        self.assertIsNone(source.cached("ghost"))
        self.assertRegex(source.readiness()[1], r"last event 5s ago")
        clock.advance(0.2)
        self.assertIs(source.cached("ghost"), UNKNOWN)
        self.assertIsNone((yield source.fetch("ghost", 2.0)))
        self.assertEqual(self.fake.count(NS_PATH + "/ghost"), 2)

        # a namespace created meanwhile is known as soon as the watch says so
        self.assertIsNone(source.cached("ghost"))
        self.fake.add_namespace("ghost", labels=ENABLED)
        yield wait_until(lambda: source.cached("ghost") is not None)
        self.assertEqual(source.cached("ghost").name, "ghost")

    @inlineCallbacks
    def test_lookup_errors_fail_with_namespace_lookup_error(self) -> Any:
        source, metrics = self.start()
        yield self.hold_watch(source)
        self.fake.fail_next(1, status=500, path_prefix=NS_PATH + "/boom")
        failure = yield self.assertFailure(source.fetch("boom", 2.0), NamespaceLookupError)
        self.assertIn("HTTP 500", str(failure))
        self.assertIs(source.cached("boom"), UNKNOWN)
        self.assertEqual(misses(metrics, "error"), 1)

    @inlineCallbacks
    def test_slow_lookup_times_out_once_without_retries(self) -> Any:
        source, metrics = self.start()
        yield self.hold_watch(source)
        self.fake.add_namespace("slow")
        self.fake.set_delay(2.0, NS_PATH + "/slow")
        started = time.monotonic()
        yield self.assertFailure(source.fetch("slow", 0.3), NamespaceLookupError)
        self.assertLess(time.monotonic() - started, 1.0)
        self.assertEqual(self.fake.count(NS_PATH + "/slow"), 1)

    @inlineCallbacks
    def test_per_review_get_mode_gets_every_time(self) -> Any:
        self.fake.add_namespace("team-a", labels=ENABLED, annotations={"amp.txn2.com/ep": EP_A})
        source, metrics = self.start(per_review_get=True)
        self.assertEqual(source.threads, ())
        self.assertEqual(source.readiness(), (True, "per-review GET mode: no namespace cache"))
        self.assertIs(source.cached("team-a"), UNKNOWN)
        first, second = yield gatherResults([source.fetch("team-a", 2.0), source.fetch("team-a", 2.0)])
        self.assertEqual(first, second)
        self.assertEqual(first.annotations["amp.txn2.com/ep"], EP_A)
        self.assertIsNone((yield source.fetch("nope", 2.0)))
        self.assertIsNone((yield source.fetch("nope", 2.0)))
        self.assertEqual(self.fake.count(NS_PATH + "/team-a"), 2)
        self.assertEqual(self.fake.count(NS_PATH + "/nope"), 2)
        self.assertEqual(self.fake.count(NS_PATH, watch=True), 0)
        self.assertIs(source.cached("team-a"), UNKNOWN)
        self.assertEqual(misses(metrics, "found"), 2)


# ------------------------------------------------------------ configuration


class ConnectionTests(SourceTestCase):

    @inlineCallbacks
    def test_bad_kubeconfig_is_a_clear_readiness_error(self) -> Any:
        source, _ = self.start(kubeconfig=os.path.join(self.tmp, "missing"))
        ready, detail = source.readiness()
        self.assertFalse(ready)
        self.assertIn("cannot load the Kubernetes client configuration from kubeconfig", detail)
        self.assertEqual(source.threads, ())
        failure = yield self.assertFailure(source.fetch("a", 1.0), NamespaceLookupError)
        self.assertIn("cannot load", str(failure))

    def test_in_cluster_outside_a_cluster_is_a_clear_readiness_error(self) -> None:
        source, _ = self.start(source="cluster", kubeconfig=None)
        ready, detail = source.readiness()
        self.assertFalse(ready)
        self.assertIn("in-cluster service account", detail)

    @inlineCallbacks
    def test_kubeconfig_context_is_used(self) -> Any:
        other = FakeKube().start()
        self.addCleanup(other.stop)
        other.add_namespace("only-on-other")
        with open(self.kubeconfig, "w") as f:
            f.write(f"""\
apiVersion: v1
kind: Config
clusters:
- {{name: fake, cluster: {{server: "{self.fake.url}"}}}}
- {{name: other, cluster: {{server: "{other.url}"}}}}
users:
- {{name: amp, user: {{token: t}}}}
contexts:
- {{name: fake, context: {{cluster: fake, user: amp}}}}
- {{name: other, context: {{cluster: other, user: amp}}}}
current-context: fake
""")
        source, _ = self.start(context="other")
        yield self.listed(source)
        self.assertIsNot(source.cached("only-on-other"), UNKNOWN)
        self.assertEqual(self.fake.count(NS_PATH), 0)


# ------------------------------------------------------------ failure_policy: auto


class WebhookConfigurationTests(SourceTestCase):

    @inlineCallbacks
    def test_auto_failure_policy_follows_the_webhook_configuration(self) -> Any:
        self.fake.add_namespace("team-a", labels=ENABLED, annotations={"amp.txn2.com/ep": EP_A})
        self.fake.put_webhook_configuration("amp", [
            {"name": "other.amp.txn2.com", "failurePolicy": "Fail"},
            {"name": "pods.amp.txn2.com", "failurePolicy": "Ignore"},
        ])
        self.fake.set_delay(0.3, MWC_PATH)
        source, metrics = self.start(webhook_configuration="amp", webhook_name="pods.amp.txn2.com")
        self.assertEqual(len(source.threads), 2)
        config = Config(kubernetes=source._config, failure_policy="auto")
        yield wait_until(lambda: source.count == 1, what="the namespace list")
        ready, detail = source.readiness()
        self.assertFalse(ready)
        self.assertIn("waiting for the first list of MutatingWebhookConfiguration amp", detail)
        self.assertIsNone(source.cluster_failure_policy())
        self.fake.set_delay(0)

        yield self.listed(source)
        self.assertEqual(source.cluster_failure_policy(), IGNORE)
        self.assertEqual(failure_policy(source.cached("team-a"), config, source.cluster_failure_policy()), IGNORE)
        self.assertEqual(route(source.cached("team-a"), config, source.cluster_failure_policy()).failure_policy,
                         IGNORE)
        query = [r for r in self.fake.requests if r.path == MWC_PATH][0].query
        self.assertEqual(query["fieldSelector"], "metadata.name=amp")

        self.fake.put_webhook_configuration("amp", [{"name": "pods.amp.txn2.com", "failurePolicy": "Fail"}])
        yield wait_until(lambda: source.cluster_failure_policy() == FAIL)
        self.fake.put_webhook_configuration("someone-else", [{"name": "x", "failurePolicy": "Ignore"}])
        self.fake.delete_webhook_configuration("amp")
        yield wait_until(lambda: source.cluster_failure_policy() is None)
        self.assertEqual(failure_policy(source.cached("team-a"), config, source.cluster_failure_policy()), FAIL)
        self.fake.put_webhook_configuration("amp", [{"name": "pods.amp.txn2.com", "failurePolicy": "Ignore"}])
        yield wait_until(lambda: source.cluster_failure_policy() == IGNORE)
        # webhook events are not namespace events
        self.assertEqual(events(metrics, "ADDED") + events(metrics, "MODIFIED") + events(metrics, "DELETED"), 0)
        yield source.stopService()
        self.assertEqual([t for t in source.threads if t.is_alive()], [])

    def test_webhook_entry_selection(self) -> None:
        obj = {"webhooks": [{"name": "a", "failurePolicy": "Ignore"}, {"name": "b"}]}
        self.assertEqual(webhook_failure_policy(obj, None), IGNORE)
        self.assertEqual(webhook_failure_policy(obj, "a"), IGNORE)
        self.assertEqual(webhook_failure_policy(obj, "b"), FAIL)
        self.assertIsNone(webhook_failure_policy(obj, "c"))
        self.assertIsNone(webhook_failure_policy({"webhooks": []}, None))
        self.assertIsNone(webhook_failure_policy(None, None))


# ------------------------------------------------------------ backoff


def test_backoff_is_exponential_capped_and_fully_jittered() -> None:
    top = [backoff_delay(n, 0.5, 30.0, lambda: 1.0) for n in range(9)]
    assert top == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert [backoff_delay(n, 0.5, 30.0, lambda: 0.0) for n in range(9)] == [0.0] * 9
    assert backoff_delay(3, 0.5, 30.0, lambda: 0.25) == 1.0
    assert backoff_delay(10_000, 0.5, 30.0, lambda: 0.5) == 15.0

