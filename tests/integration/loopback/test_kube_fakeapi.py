"""
Integration tests for amp.kube: the namespace source with its real threads
and the real ``kubernetes`` client, against the fake API server of
``tests/support/fake_apiserver.py`` over loopback, on the real reactor.

No test polls: L{ObservedReactor} re-checks what a test waits for after
every call a thread hands to the reactor (a watch event, a thread-pool
result), and the fake server's own waits block on its condition variable
in a pool thread.  The unit tests in test_kube.py cover each rule of the
loop and the cache; these prove the pieces fit: wire format, resume,
relist, read timeouts, socket shutdown on stop.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any, Callable, Optional

from twisted.internet import reactor
from twisted.internet.defer import Deferred, inlineCallbacks, succeed
from twisted.internet.threads import deferToThread
from twisted.trial.unittest import TestCase

from amp.config import KubernetesConfig
from amp.kube import KubernetesNamespaceSource
from amp.metrics import Metrics
from amp.namespaces import UNKNOWN, NamespaceLookupError
from amp.policy import IGNORE
from tests.support.fake_apiserver import FakeKube

ENABLED = {"amp.txn2.com/enabled": "true"}
EP_A = "http://ep-a.team.svc:8080/mutate"
EP_B = "http://ep-b.team.svc:8080/mutate"
NS_PATH = "/api/v1/namespaces"
WAIT = 10.0


class ObservedReactor:
    """
    The real reactor, whose C{callFromThread} re-checks the conditions
    tests wait for (L{until}) after running each call.
    """

    def __init__(self, real: Any) -> None:
        self._real = real
        self._waiting: list[tuple[Callable[[], bool], Deferred]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def callFromThread(self, f: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        self._real.callFromThread(self._then_check, f, args, kwargs)

    def _then_check(self, f: Callable[..., Any], args: tuple, kwargs: dict) -> None:
        try:
            f(*args, **kwargs)
        finally:
            for entry in list(self._waiting):
                predicate, d = entry
                if predicate():
                    self._waiting.remove(entry)
                    d.callback(None)

    def until(self, predicate: Callable[[], bool], what: str) -> Deferred:
        """Fires once C{predicate()} holds after some thread's news; fails after L{WAIT}s."""
        if predicate():
            return succeed(None)
        d: Deferred = Deferred()
        entry = (predicate, d)
        self._waiting.append(entry)

        def give_up() -> None:
            if entry in self._waiting:
                self._waiting.remove(entry)
                d.errback(AssertionError(f"timed out after {WAIT}s waiting for {what}"))

        timer = self._real.callLater(WAIT, give_up)
        d.addBoth(lambda result: (timer.cancel() if timer.active() else None, result)[1])
        return d


def write_kubeconfig(path: str, url: str) -> None:
    with open(path, "w") as f:
        f.write(f"""\
apiVersion: v1
kind: Config
clusters: [{{name: fake, cluster: {{server: "{url}"}}}}]
users: [{{name: amp, user: {{token: fake-token}}}}]
contexts: [{{name: fake, context: {{cluster: fake, user: amp}}}}]
current-context: fake
""")


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


class FakeAPITestCase(TestCase):
    timeout = 30

    def setUp(self) -> None:
        self.reactor = ObservedReactor(reactor)
        self.tmp = tempfile.mkdtemp(prefix="amp-test-kube-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.kubeconfig = os.path.join(self.tmp, "kubeconfig")
        self.serve(FakeKube())

    def serve(self, fake: FakeKube) -> None:
        self.fake = fake.start()
        self.addCleanup(self._stop_fake, fake)
        write_kubeconfig(self.kubeconfig, self.fake.url)

    def _stop_fake(self, fake: FakeKube) -> None:
        fake.stop()
        self.assertEqual(fake.errors, [])

    def start(self, **overrides: Any) -> tuple[KubernetesNamespaceSource, Metrics]:
        values: dict[str, Any] = dict(
            source="kubeconfig",
            kubeconfig=self.kubeconfig,
            watch_timeout=30.0,
            request_timeout=2.0,
            backoff_initial=0.01,
            backoff_max=0.05,
            miss_timeout=2.0,
        )
        values.update(overrides)
        metrics = Metrics()
        source = KubernetesNamespaceSource(
            KubernetesConfig(**values), reactor=self.reactor, metrics=metrics, random=lambda: 0.5
        )
        source.startService()
        self.addCleanup(self._stop_source, source)
        return source, metrics

    def _stop_source(self, source: KubernetesNamespaceSource) -> Optional[Deferred]:
        return source.stopService() if source.running else None

    def until(self, predicate: Callable[[], bool], what: str = "the source to catch up") -> Deferred:
        return self.reactor.until(predicate, what)

    def in_thread(self, blocking: Callable[..., bool], *args: Any, **kwargs: Any) -> Deferred:
        """Wait on the fake server (it blocks on its condition) without blocking the reactor."""

        def check(ok: bool) -> None:
            self.assertTrue(ok, f"{blocking.__name__}{args} timed out")

        return deferToThread(blocking, *args, **kwargs).addCallback(check)

    def watch_requests(self) -> list[Any]:
        return [r for r in self.fake.requests if r.path == NS_PATH and r.query.get("watch") == "true"]

    def list_requests(self) -> list[Any]:
        return [r for r in self.fake.requests if r.path == NS_PATH and "watch" not in r.query]


class WatchTests(FakeAPITestCase):
    @inlineCallbacks
    def test_list_then_watch_keep_the_cache_current(self) -> Any:
        self.fake.add_namespace(
            "team-a",
            labels={**ENABLED, "team": "a"},
            annotations={"amp.txn2.com/ep": EP_A, "kubectl.kubernetes.io/last-applied-configuration": "{}"},
        )
        self.fake.add_namespace("team-b")
        source, metrics = self.start()
        yield self.until(lambda: source.readiness()[0], "the first list")
        self.assertEqual(source.count, 2)
        self.assertEqual(dict(source.cached("team-a").annotations), {"amp.txn2.com/ep": EP_A})
        self.assertEqual(
            source.cached("team-a").resource_version, self.fake.get_namespace("team-a")["metadata"]["resourceVersion"]
        )
        yield self.in_thread(self.fake.wait_for_watches, 1)
        [watch] = self.watch_requests()
        self.assertEqual(
            (watch.query["resourceVersion"], watch.query["allowWatchBookmarks"], watch.query["timeoutSeconds"]),
            (self.fake.resource_version, "true", "30"),
        )

        self.fake.update_namespace("team-a", labels=ENABLED, annotations={"amp.txn2.com/ep": EP_B})
        self.fake.add_namespace("team-c", labels=ENABLED)
        self.fake.delete_namespace("team-b")
        yield self.until(lambda: source.resource_version == self.fake.resource_version)
        self.assertEqual(source.cached("team-a").annotations["amp.txn2.com/ep"], EP_B)
        self.assertEqual(sorted(source._cache), ["team-a", "team-c"])
        self.assertEqual(
            [sample(metrics, "amp_namespace_events_total", type=t) for t in ("ADDED", "MODIFIED", "DELETED")], [1, 1, 1]
        )

    @inlineCallbacks
    def test_dropped_watch_resumes_from_the_last_bookmark_nothing_lost_or_doubled(self) -> Any:
        for name in ("a", "b", "c"):
            self.fake.add_namespace(name, labels=ENABLED)
        source, metrics = self.start()
        yield self.until(lambda: source.readiness()[0], "the first list")
        yield self.in_thread(self.fake.wait_for_watches, 1)
        # A change the namespace watch does not see moves the revision on;
        # the bookmark then carries a revision newer than any namespace event.
        self.fake.put_webhook_configuration("unrelated", [{"name": "x.example.com"}])
        bookmark_rv = self.fake.resource_version
        self.fake.bookmark()
        yield self.until(lambda: source.resource_version == bookmark_rv, "the bookmark")

        self.assertEqual(self.fake.drop_watches(), 1)
        self.fake.update_namespace("b", annotations={"amp.txn2.com/ep": EP_B})
        self.fake.add_namespace("d", labels=ENABLED)
        self.fake.delete_namespace("c")
        yield self.until(lambda: source.resource_version == self.fake.resource_version)
        self.assertEqual([w.query["resourceVersion"] for w in self.watch_requests()][1], bookmark_rv)
        self.assertEqual(sample(metrics, "amp_namespace_watch_restarts_total", reason="dropped"), 1)
        self.assertEqual(
            [
                sample(metrics, "amp_namespace_events_total", type=t)
                for t in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK")
            ],
            [1, 1, 1, 1],
        )
        self.assertEqual(len(self.list_requests()), 1)
        self.assertEqual(sorted(source._cache), ["a", "b", "d"])

    @inlineCallbacks
    def _expired_relists(self, expired_as: str) -> Any:
        self.serve(FakeKube(expired_as=expired_as))
        for name in ("a", "b", "c"):
            self.fake.add_namespace(name, labels=ENABLED)
        source, metrics = self.start()
        yield self.until(lambda: source.readiness()[0], "the first list")
        yield self.in_thread(self.fake.wait_for_watches, 1)
        # Hold the reconnect at the server while namespaces change and the
        # history the resume needs is compacted away.
        self.fake.set_delay(30, NS_PATH)
        self.fake.drop_watches()
        yield self.in_thread(self.fake.wait_for_requests, 2, NS_PATH, watch=True)
        self.fake.delete_namespace("c")
        self.fake.add_namespace("d")
        self.fake.expire_history()
        self.fake.set_delay(0)
        self.fake.release_delayed()

        yield self.until(lambda: source.cached("d") is not UNKNOWN, "the relist")
        self.assertEqual(sample(metrics, "amp_namespace_watch_restarts_total", reason="expired"), 1)
        self.assertEqual(sorted(source._cache), ["a", "b", "d"])
        # the deletion was never seen as an event: the relist replaced the cache
        self.assertEqual(sample(metrics, "amp_namespace_events_total", type="DELETED"), 0)
        self.assertEqual(len(self.list_requests()), 2)

    def test_expired_event_relists(self) -> Deferred:
        return self._expired_relists("event")

    def test_expired_http_answer_relists(self) -> Deferred:
        return self._expired_relists("http")

    @inlineCallbacks
    def test_silent_watch_is_restarted(self) -> Any:
        self.fake.add_namespace("a")
        # the server ends a watch after 1 s; a stream silent for 1 + 0.5 s is dead
        source, metrics = self.start(watch_timeout=1.0, request_timeout=0.5)
        yield self.until(lambda: source.readiness()[0], "the first list")
        yield self.in_thread(self.fake.wait_for_watches, 1)
        self.fake.set_delay(30, NS_PATH)
        self.fake.drop_watches()
        yield self.until(
            lambda: sample(metrics, "amp_namespace_watch_restarts_total", reason="stalled") >= 1, "the stalled restart"
        )
        self.assertIn("watch restarting after stalled", source.readiness()[1])
        self.fake.set_delay(0)
        self.fake.release_delayed()
        self.fake.update_namespace("a", annotations={"amp.txn2.com/ep": EP_A})
        yield self.until(lambda: source.cached("a").annotations.get("amp.txn2.com/ep") == EP_A)
        self.assertNotIn("restarting", source.readiness()[1])


class StopTests(FakeAPITestCase):
    @inlineCallbacks
    def _stops(self, source: KubernetesNamespaceSource) -> Any:
        [thread] = source.threads
        self.assertTrue(thread.is_alive())
        yield source.stopService()
        # every thread said it ended (stopService did not give up on it)
        yield deferToThread(thread.join, 5)
        self.assertFalse(thread.is_alive())
        yield self.in_thread(self.fake.wait_for_no_watches)
        self.assertEqual(source.readiness(), (False, "not started"))

    @inlineCallbacks
    def test_stop_while_watching(self) -> Any:
        self.fake.add_namespace("a")
        source, _ = self.start()
        yield self.until(lambda: source.readiness()[0], "the first list")
        yield self.in_thread(self.fake.wait_for_watches, 1)
        yield self._stops(source)

    @inlineCallbacks
    def test_stop_while_the_list_hangs(self) -> Any:
        self.fake.set_delay(30, NS_PATH)
        source, _ = self.start(request_timeout=30.0)
        yield self.in_thread(self.fake.wait_for_requests, 1, NS_PATH)
        yield self._stops(source)


class FetchTests(FakeAPITestCase):
    @inlineCallbacks
    def test_misses_get_through_the_thread_pool(self) -> Any:
        source, metrics = self.start(per_review_get=True)
        self.fake.add_namespace("team-a", labels=ENABLED, annotations={"amp.txn2.com/ep": EP_A})
        info = yield source.fetch("team-a", 2.0)
        self.assertEqual(info.annotations["amp.txn2.com/ep"], EP_A)
        self.assertIsNone((yield source.fetch("nope", 2.0)))
        self.fake.fail_next(1, status=500, path_prefix=NS_PATH + "/boom")
        failure = yield self.assertFailure(source.fetch("boom", 2.0), NamespaceLookupError)
        self.assertIn("HTTP 500", str(failure))
        self.assertEqual([self.fake.count(NS_PATH + "/" + n) for n in ("team-a", "nope", "boom")], [1, 1, 1])
        self.assertEqual(
            [sample(metrics, "amp_namespace_cache_misses_total", result=r) for r in ("found", "not-found", "error")],
            [1, 1, 1],
        )


class WebhookConfigurationTests(FakeAPITestCase):
    @inlineCallbacks
    def test_auto_failure_policy_follows_the_webhook_configuration(self) -> Any:
        self.fake.put_webhook_configuration(
            "amp",
            [
                {"name": "other.amp.txn2.com", "failurePolicy": "Fail"},
                {"name": "pods.amp.txn2.com", "failurePolicy": "Ignore"},
            ],
        )
        source, _ = self.start(webhook_configuration="amp", webhook_name="pods.amp.txn2.com")
        self.assertEqual(len(source.threads), 2)
        yield self.until(lambda: source.readiness()[0], "both lists")
        self.assertEqual(source.cluster_failure_policy(), IGNORE)
        mwc = [r for r in self.fake.requests if "mutatingwebhookconfigurations" in r.path]
        self.assertEqual(mwc[0].query["fieldSelector"], "metadata.name=amp")
        self.fake.delete_webhook_configuration("amp")
        yield self.until(lambda: source.cluster_failure_policy() is None)
        self.fake.put_webhook_configuration("amp", [{"name": "pods.amp.txn2.com", "failurePolicy": "Fail"}])
        yield self.until(lambda: source.cluster_failure_policy() == "Fail")
