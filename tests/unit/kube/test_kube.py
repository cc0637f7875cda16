"""
Unit tests for amp.kube, without sockets, threads or time:

- the list/watch loop (L{amp.kube._watch.ListWatch}) run synchronously
  against a scripted list/watch (L{tests.support.memory_kube_client.ScriptedLister});
- the bridge, with a C{callFromThread} that queues or runs at once;
- the namespace source's reactor side, fed typed events through its
  bridges, with a C{Clock}, an in-memory client and a manual thread pool.

tests/integration/loopback/test_kube_fakeapi.py runs the whole thing with real threads and the
real client against the fake API server.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Iterable, Optional

from twisted.internet.defer import CancelledError
from twisted.logger import LogLevel, formatEvent, globalLogPublisher
from twisted.trial.unittest import SynchronousTestCase
from urllib3.exceptions import MaxRetryError, ProtocolError, ReadTimeoutError

from amp.config import Config, KubernetesConfig
from amp.kube import STOP_WAIT, KubernetesNamespaceSource, backoff_delay, webhook_failure_policy
from amp.kube._bridge import Bridge
from amp.kube._events import Bookmark, Changed, Crashed, Replaced, Restarting
from amp.kube._keep import Keep, WebhookSeen
from amp.kube._watch import ListWatch
from amp.metrics import Metrics
from amp.namespaces import UNKNOWN, INamespaceSource, NamespaceInfo, NamespaceLookupError
from amp.policy import FAIL, IGNORE, failure_policy, route
from tests.support.memory_kube_client import (
    MemoryKube,
    ScriptedLister,
    ThreadReactor,
    Threads,
    api_error,
    bookmark,
    event,
    expired_event,
    list_body,
    namespace,
)

ENABLED = {"amp.txn2.com/enabled": "true"}
EP_A = "http://ep-a.team.svc:8080/mutate"
EP_B = "http://ep-b.team.svc:8080/mutate"


def kube_config(**overrides: Any) -> KubernetesConfig:
    values: dict[str, Any] = dict(
        source="kubeconfig",
        kubeconfig="/nonexistent",
        watch_timeout=30.0,
        request_timeout=2.0,
        backoff_initial=1.0,
        backoff_max=8.0,
        miss_timeout=2.0,
        miss_negative_ttl=5.0,
    )
    values.update(overrides)
    return KubernetesConfig(**values)


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


class LogCapture:
    def __init__(self, case: SynchronousTestCase) -> None:
        self.events: list[dict[str, Any]] = []
        globalLogPublisher.addObserver(self.events.append)
        case.addCleanup(globalLogPublisher.removeObserver, self.events.append)

    def at(self, level: LogLevel) -> list[dict[str, Any]]:
        return [
            e for e in self.events if e.get("log_level") == level and e.get("log_namespace", "").startswith("amp.kube")
        ]


# ====================================================================== the thread side


class Monotonic:
    """A monotonic clock the script advances."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> Callable[[], None]:
        def step() -> None:
            self.now += seconds

        return step


class ListWatchTests(SynchronousTestCase):
    """
    The loop, run synchronously: each test scripts what the API server
    answers and reads what the loop emitted and how long it waited.
    """

    def setUp(self) -> None:
        self.stop = threading.Event()
        self.lister = ScriptedLister(self.stop)
        self.emitted: list[Any] = []
        self.waits: list[float] = []
        self.clock = Monotonic()
        self.keep = Keep(kube_config())

    def run_watch(
        self, random: Iterable[float] = (), wait: Optional[Callable[[float], Any]] = None, **options: Any
    ) -> ListWatch:
        values = iter(random)
        options.setdefault("parse", self.keep.namespace)
        options.setdefault("collect", self.keep.namespaces)
        watch = ListWatch(
            lister=self.lister,
            emit=self.emitted.append,
            stop=self.stop,
            config=kube_config(**options.pop("config", {})),
            random=lambda: next(values),
            monotonic=self.clock,
            wait=wait or self.waits.append,
            **options,
        )
        watch.run()
        return watch

    def timeout(self) -> Callable[[], None]:
        """A step: the server's own timeout passes (the stream then ends)."""
        return self.clock.advance(30)

    def restarts(self) -> list[Restarting]:
        return [e for e in self.emitted if isinstance(e, Restarting)]

    def test_lists_then_watches_from_the_list_version(self) -> None:
        self.lister.lists.append(list_body([namespace("a", "3", ENABLED), namespace("b", "4")], "10"))
        self.lister.watches.append(
            [
                event("ADDED", namespace("c", "11")),
                event("MODIFIED", namespace("a", "12", ENABLED, {"amp.txn2.com/ep": EP_A})),
                event("DELETED", namespace("b", "13")),
            ]
        )
        watch = self.run_watch()

        replaced, added, modified, deleted, restart = self.emitted
        self.assertEqual(restart, Restarting("timeout", "", 0.0))
        self.assertEqual(replaced.resource_version, "10")
        self.assertEqual(sorted(replaced.items), ["a", "b"])
        self.assertEqual(dict(replaced.items["a"].labels), ENABLED)
        self.assertEqual((added.kind, added.obj.name, added.resource_version), ("ADDED", "c", "11"))
        self.assertEqual((modified.kind, dict(modified.obj.annotations)), ("MODIFIED", {"amp.txn2.com/ep": EP_A}))
        self.assertEqual((deleted.kind, deleted.obj.name, deleted.resource_version), ("DELETED", "b", "13"))
        # one list; the watch asks for bookmarks from the list's version,
        # with the server's timeout and a read timeout longer than it
        [listed] = self.lister.requests("list")
        self.assertEqual(listed, {"limit": None, "continue": None, "timeout": (2.0, 2.0)})
        first = self.lister.requests("watch")[0]
        self.assertEqual(first, {"resource_version": "10", "timeout_seconds": 30, "timeout": (2.0, 32.0)})
        self.assertEqual(watch.resource_version, "13")
        self.assertTrue(all(s.closed for s in self.lister.streams))

    def test_server_timeout_resumes_from_the_last_event_at_once(self) -> None:
        self.lister.lists.append(list_body([], "10"))
        self.lister.watches.extend(
            [
                [event("ADDED", namespace("a", "11")), self.timeout()],
                [self.timeout()],
            ]
        )
        self.run_watch()
        self.assertEqual([w["resource_version"] for w in self.lister.requests("watch")], ["10", "11", "11"])
        self.assertEqual(self.restarts(), [Restarting("timeout", "", 0.0)] * 2)
        self.assertEqual(self.waits, [])
        self.assertEqual(len(self.lister.requests("list")), 1)

    def test_bookmark_moves_the_resume_point_of_a_dropped_stream(self) -> None:
        self.lister.lists.append(list_body([namespace("a", "5")], "10"))
        self.lister.watches.extend(
            [
                [event("MODIFIED", namespace("a", "11")), bookmark("20"), ProtocolError("Response ended prematurely")],
            ]
        )
        self.run_watch(random=[0.5])
        self.assertIn(Bookmark("20"), self.emitted)
        [restart] = self.restarts()
        self.assertEqual((restart.reason, restart.delay), ("dropped", 0.5))
        self.assertIn("ProtocolError: Response ended prematurely", restart.error)
        self.assertEqual([w["resource_version"] for w in self.lister.requests("watch")], ["10", "20"])
        self.assertEqual(len(self.lister.requests("list")), 1, "resumed, not relisted")

    def test_410_answer_to_the_watch_relists_at_once_then_backs_off(self) -> None:
        self.lister.lists.extend(
            [
                list_body([namespace("a", "5"), namespace("b", "6")], "10"),
                list_body([namespace("a", "5")], "30"),
                list_body([namespace("a", "5")], "31"),
            ]
        )
        self.lister.watches.extend([api_error(410), api_error(410), [self.timeout()]])
        self.run_watch(random=[0.25])

        lists = [e for e in self.emitted if isinstance(e, Replaced)]
        self.assertEqual(
            [(sorted(e.items), e.resource_version) for e in lists], [(["a", "b"], "10"), (["a"], "30"), (["a"], "31")]
        )
        first, second, _ = self.restarts()
        self.assertEqual((first.reason, first.error, first.delay), ("expired", "HTTP 410 Gone", 0.0))
        # a second 410 in a row is not retried at once
        self.assertEqual((second.reason, second.delay), ("expired", 0.25 * 2.0))
        self.assertEqual([w["resource_version"] for w in self.lister.requests("watch")][:3], ["10", "30", "31"])

    def test_410_error_event_relists(self) -> None:
        self.lister.lists.extend([list_body([namespace("a", "5")], "10"), list_body([], "40")])
        self.lister.watches.extend([[event("ADDED", namespace("b", "11")), expired_event()]])
        self.run_watch()
        restart = self.restarts()[0]
        self.assertEqual(restart, Restarting("expired", "Expired: too old resource version: 5 (8)", 0.0))
        self.assertEqual(len(self.lister.requests("list")), 2)
        self.assertEqual(
            self.emitted[-2:],
            [Restarting("expired", "Expired: too old resource version: 5 (8)", 0.0), Replaced({}, "40")],
        )
        self.assertEqual([w["resource_version"] for w in self.lister.requests("watch")], ["10", "40"])

    def test_other_error_event_backs_off_and_resumes_without_relisting(self) -> None:
        self.lister.lists.append(list_body([], "10"))
        failure = {
            "type": "ERROR",
            "object": {"kind": "Status", "code": 500, "reason": "InternalError", "message": "etcd is sad"},
        }
        self.lister.watches.extend([[event("ADDED", namespace("a", "11")), failure]])
        self.run_watch(random=[0.5])
        self.assertEqual(
            self.restarts(), [Restarting("error", "_WatchError: ERROR event 500 InternalError: etcd is sad", 0.5)]
        )
        self.assertEqual(self.waits, [0.5])
        self.assertEqual([w["resource_version"] for w in self.lister.requests("watch")], ["10", "11"])
        self.assertEqual(len(self.lister.requests("list")), 1)

    def test_backoff_is_exponential_capped_fully_jittered_and_reset_by_progress(self) -> None:
        self.lister.lists.extend([api_error(503)] * 5 + [list_body([], "10")])
        self.lister.watches.extend(
            [
                [event("ADDED", namespace("a", "11")), ProtocolError("cut")],
                ProtocolError("refused"),
            ]
        )
        # initial 1s, cap 8s: ceilings 1, 2, 4, 8, 8; then progress resets to 1, 2
        self.run_watch(random=[1.0, 0.5, 1.0, 0.25, 1.0, 1.0, 0.75])
        self.assertEqual(self.waits, [1.0, 1.0, 4.0, 2.0, 8.0, 1.0, 1.5])
        self.assertEqual([r.reason for r in self.restarts()], ["error"] * 5 + ["dropped", "error"])
        self.assertEqual(self.restarts()[0].error, "HTTP 503 Service Unavailable")

    def test_stalled_stream_restarts_from_the_last_version(self) -> None:
        self.lister.lists.append(list_body([], "10"))
        self.lister.watches.extend(
            [
                [event("ADDED", namespace("a", "11")), ReadTimeoutError(None, "/api/v1/namespaces", "Read timed out.")],
                MaxRetryError(None, "/api/v1/namespaces", ReadTimeoutError(None, "/", "Read timed out.")),
            ]
        )
        self.run_watch(random=[0.5, 0.5])
        first, second = self.restarts()
        self.assertEqual((first.reason, first.delay), ("stalled", 0.5))
        self.assertIn("ReadTimeoutError", first.error)
        self.assertEqual((second.reason, second.delay), ("stalled", 1.0))
        self.assertEqual([w["resource_version"] for w in self.lister.requests("watch")], ["10", "11", "11"])

    def test_a_stream_that_ends_at_once_without_events_backs_off(self) -> None:
        self.lister.lists.append(list_body([], "10"))
        self.lister.watches.extend([[], []])
        self.run_watch(random=[0.5, 0.5])
        self.assertEqual(
            self.restarts(),
            [
                Restarting("timeout", "the watch ended early without events", 0.5),
                Restarting("timeout", "the watch ended early without events", 1.0),
            ],
        )

    def test_unreadable_line_backs_off_and_resumes(self) -> None:
        self.lister.lists.append(list_body([], "10"))
        self.lister.watches.extend([[event("ADDED", namespace("a", "11")), b"{not json"]])
        self.run_watch(random=[0.5])
        [restart] = self.restarts()
        self.assertEqual(restart.reason, "error")
        self.assertIn("JSONDecodeError", restart.error)
        self.assertEqual(self.lister.requests("watch")[-1]["resource_version"], "11")

    def test_stop_mid_stream_ends_the_loop_without_a_restart(self) -> None:
        self.lister.lists.append(list_body([], "10"))
        self.lister.watches.extend(
            [
                [event("ADDED", namespace("a", "11")), self.stop.set, event("ADDED", namespace("b", "12"))],
            ]
        )
        self.run_watch()
        self.assertEqual([type(e) for e in self.emitted], [Replaced, Changed])
        self.assertEqual(len(self.lister.requests("watch")), 1)
        self.assertTrue(self.lister.streams[0].closed)

    def test_stop_while_backing_off_ends_the_loop(self) -> None:
        self.lister.lists.extend([api_error(500), list_body([], "10")])

        def wait(delay: float) -> None:
            self.waits.append(delay)
            self.stop.set()

        self.run_watch(random=[0.5], wait=wait)
        self.assertEqual(self.waits, [0.5])
        self.assertEqual(len(self.lister.calls), 1)

    def test_an_error_after_stop_is_not_reported(self) -> None:
        def failing() -> None:
            self.stop.set()
            raise OSError("socket shut down by stopService")

        self.lister.lists.append(list_body([], "10"))
        self.lister.watches.append([failing])
        self.run_watch()
        self.assertEqual(self.restarts(), [])

    def test_a_bug_in_the_loop_is_reported_as_crashed(self) -> None:
        self.lister.lists.append(api_error(500))

        def broken(delay: float) -> None:
            raise RuntimeError("bug")

        watch = ListWatch(
            lister=self.lister,
            parse=self.keep.namespace,
            emit=self.emitted.append,
            stop=self.stop,
            config=kube_config(),
            random=lambda: 0.5,
            wait=broken,
        )
        watch.run_guarded()
        self.assertEqual(self.emitted[-1], Crashed("RuntimeError: bug"))

    def test_pages_are_joined_and_an_expired_continue_token_relists(self) -> None:
        self.lister.lists.extend(
            [
                list_body([namespace("a", "1"), namespace("b", "2")], "10", continue_token="t1"),
                api_error(410),
                list_body([namespace("a", "1"), namespace("b", "2")], "20", continue_token="t2"),
                list_body([namespace("c", "3")], "20"),
            ]
        )
        self.run_watch(page_size=2)
        lists = [e for e in self.emitted if isinstance(e, Replaced)]
        self.assertEqual([(sorted(e.items), e.resource_version) for e in lists], [(["a", "b", "c"], "20")])
        self.assertEqual(
            [(r["limit"], r["continue"]) for r in self.lister.requests("list")],
            [(2, None), (2, "t1"), (2, None), (2, "t2")],
        )
        self.assertEqual(self.restarts()[0].reason, "expired")

    def test_only_wanted_kinds_and_kept_objects_are_emitted_but_all_move_the_version(self) -> None:
        def parse(obj: dict[str, Any]) -> Optional[str]:
            name = obj["metadata"]["name"]
            return None if name.startswith("skip") else name

        self.lister.lists.append(list_body([namespace("a", "1"), namespace("skip-1", "2")], "10"))
        self.lister.watches.extend(
            [
                [
                    event("ADDED", namespace("b", "11")),
                    event("ADDED", namespace("skip-2", "12")),
                    event("MODIFIED", namespace("b", "13")),
                    self.timeout(),
                ],
            ]
        )
        self.run_watch(parse=parse, collect=tuple, kinds={"ADDED"})
        self.assertEqual(self.emitted[0], Replaced(("a",), "10"))
        self.assertEqual([e for e in self.emitted if isinstance(e, Changed)], [Changed("ADDED", "b", "11")])
        self.assertEqual(self.lister.requests("watch")[-1]["resource_version"], "13")


def test_backoff_is_exponential_capped_and_fully_jittered() -> None:
    top = [backoff_delay(n, 0.5, 30.0, lambda: 1.0) for n in range(9)]
    assert top == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert [backoff_delay(n, 0.5, 30.0, lambda: 0.0) for n in range(9)] == [0.0] * 9
    assert backoff_delay(3, 0.5, 30.0, lambda: 0.25) == 1.0
    assert backoff_delay(10_000, 0.5, 30.0, lambda: 0.5) == 15.0


class KeepTests(SynchronousTestCase):
    def test_only_the_label_and_amps_annotations_are_kept(self) -> None:
        keep = Keep(kube_config())
        info = keep.namespace(
            namespace(
                "team-a",
                "7",
                {**ENABLED, "team": "a"},
                {
                    "amp.txn2.com/ep": EP_A,
                    "amp.txn2.com/failure-policy": "Ignore",
                    "kubectl.kubernetes.io/last-applied-configuration": "{" + "x" * 500 + "}",
                },
            )
        )
        self.assertIsInstance(info, NamespaceInfo)
        self.assertEqual((info.name, info.resource_version), ("team-a", "7"))
        self.assertEqual(dict(info.labels), ENABLED)
        self.assertEqual(dict(info.annotations), {"amp.txn2.com/ep": EP_A, "amp.txn2.com/failure-policy": "Ignore"})
        bare = keep.namespace(namespace("team-b"))
        self.assertEqual((dict(bare.labels), dict(bare.annotations)), ({}, {}))

    def test_webhook_entry_selection(self) -> None:
        obj = {"webhooks": [{"name": "a", "failurePolicy": "Ignore"}, {"name": "b"}]}
        self.assertEqual(webhook_failure_policy(obj, None), IGNORE)
        self.assertEqual(webhook_failure_policy(obj, "a"), IGNORE)
        self.assertEqual(webhook_failure_policy(obj, "b"), FAIL)
        self.assertIsNone(webhook_failure_policy(obj, "c"))
        self.assertIsNone(webhook_failure_policy({"webhooks": []}, None))
        self.assertIsNone(webhook_failure_policy(None, None))


# ====================================================================== the bridge


class BridgeTests(SynchronousTestCase):
    def test_events_reach_the_handler_only_through_call_from_thread_in_order(self) -> None:
        reactor = ThreadReactor(queue_from_threads=True)
        seen: list[Any] = []
        finished: list[bool] = []
        bridge = Bridge(reactor, seen.append, on_finished=lambda: finished.append(True))
        bridge(Replaced({}, "1"))
        bridge(Bookmark("2"))
        self.assertEqual(seen, [], "nothing runs in the calling thread")
        self.assertEqual(reactor.deliver(), 2)
        self.assertEqual(seen, [Replaced({}, "1"), Bookmark("2")])

    def test_closed_bridge_drops_news_in_flight_but_still_says_the_thread_ended(self) -> None:
        reactor = ThreadReactor(queue_from_threads=True)
        seen: list[Any] = []
        finished: list[bool] = []
        bridge = Bridge(reactor, seen.append, on_finished=lambda: finished.append(True))
        bridge(Bookmark("1"))
        bridge.close()
        bridge(Bookmark("2"))
        bridge.finished()
        reactor.deliver()
        self.assertEqual((seen, finished), ([], [True]))

    def test_events_are_immutable(self) -> None:
        from dataclasses import FrozenInstanceError

        with self.assertRaises(FrozenInstanceError):
            Bookmark("1").resource_version = "2"  # type: ignore[misc]


# ====================================================================== the reactor side


class SourceTestCase(SynchronousTestCase):
    """
    A source on a L{ThreadReactor}: watch threads are recorded, not
    started; tests send typed events through the source's own bridges.
    """

    def setUp(self) -> None:
        self.reactor = ThreadReactor()
        self.kube = MemoryKube()
        self.threads = Threads()
        self.metrics = Metrics()
        self.logs = LogCapture(self)
        self.first_lists: list[bool] = []

    def start(self, on_webhook: Optional[Callable[[Any], None]] = None, **overrides: Any) -> KubernetesNamespaceSource:
        source = KubernetesNamespaceSource(
            kube_config(**overrides),
            reactor=self.reactor,
            metrics=self.metrics,
            random=lambda: 0.5,
            on_first_list=lambda: self.first_lists.append(True),
            client_factory=lambda config: self.kube,
            spawn=self.threads,
            on_webhook=on_webhook,
        )
        source.startService()
        self.addCleanup(self._stop, source)
        return source

    def _stop(self, source: KubernetesNamespaceSource) -> None:
        if source.running:
            d = source.stopService()
            self.threads.run_all()
            if d is not None:
                self.successResultOf(d)

    def send(self, source: KubernetesNamespaceSource, *events: Any, kind: str = "namespaces") -> None:
        """What the watch thread of C{kind} would emit."""
        emit = source.watches[kind].emit
        for e in events:
            emit(e)

    def infos(self, *objs: dict[str, Any]) -> dict[str, NamespaceInfo]:
        keep = Keep(kube_config())
        return {o["metadata"]["name"]: keep.namespace(o) for o in objs}

    def info(self, name: str, rv: str = "1", **kwargs: Any) -> NamespaceInfo:
        return Keep(kube_config()).namespace(namespace(name, rv, **kwargs))

    def events(self, kind: str) -> float:
        return sample(self.metrics, "amp_namespace_events_total", type=kind)

    def misses(self, result: str) -> float:
        return sample(self.metrics, "amp_namespace_cache_misses_total", result=result)


class SourceWatchTests(SourceTestCase):
    def test_first_list_fills_the_cache_and_makes_it_ready(self) -> None:
        source = self.start()
        self.assertTrue(INamespaceSource.providedBy(source))
        self.assertEqual([t.name for t in self.threads.started], ["amp-namespace-watch"])
        self.assertEqual(source.readiness(), (False, "waiting for the first namespace list"))
        self.assertIs(source.cached("team-a"), UNKNOWN)

        self.reactor.advance(100)
        self.send(
            source,
            Replaced(
                self.infos(
                    namespace("team-a", "3", ENABLED, {"amp.txn2.com/ep": EP_A}),
                    namespace("team-b", "4"),
                    namespace("kube-system", "5"),
                ),
                "10",
            ),
        )
        self.reactor.advance(42)
        self.assertEqual(source.readiness(), (True, "3 namespaces, last event 42s ago"))
        self.assertEqual(source.count, 3)
        self.assertEqual(source.resource_version, "10")
        self.assertEqual(sample(self.metrics, "amp_namespace_cache_namespaces"), 3)
        self.assertEqual(source.cached("team-a").annotations, {"amp.txn2.com/ep": EP_A})
        self.assertIs(source.cached("never-seen"), UNKNOWN)
        self.assertEqual(self.first_lists, [True])
        [listed] = [e for e in self.logs.at(LogLevel.info) if "what" in e]
        self.assertEqual((listed["what"], listed["count"], listed["rv"]), ("Listed", 3, "10"))

    def test_events_change_what_route_decides(self) -> None:
        source = self.start()
        config = Config(kubernetes=kube_config())
        self.send(source, Replaced(self.infos(namespace("team-a", "3", ENABLED, {"amp.txn2.com/ep": EP_A})), "10"))
        self.assertEqual(route(source.cached("team-a"), config, None).raw_url, EP_A)

        self.send(
            source,
            Changed("MODIFIED", self.info("team-a", "11", labels=ENABLED, annotations={"amp.txn2.com/ep": EP_B}), "11"),
        )
        self.assertEqual(route(source.cached("team-a"), config, None).url.origin, "http://ep-b.team.svc:8080")
        self.send(source, Changed("MODIFIED", self.info("team-a", "12"), "12"))
        self.assertFalse(route(source.cached("team-a"), config, None).enabled)
        self.send(source, Changed("ADDED", self.info("team-new", "13", labels=ENABLED), "13"))
        self.assertEqual(source.cached("team-new").name, "team-new")
        self.send(source, Changed("DELETED", self.info("team-new", "14"), "14"))
        self.assertIs(source.cached("team-new"), UNKNOWN)
        self.assertEqual((self.events("MODIFIED"), self.events("ADDED"), self.events("DELETED")), (2, 1, 1))
        self.assertEqual((source.count, source.resource_version), (1, "14"))
        self.assertEqual(sample(self.metrics, "amp_namespace_cache_namespaces"), 1)

    def test_unknown_amp_keys_are_logged_and_counted_once_per_change(self) -> None:
        """
        A namespace's typo in amp's domain is one warning naming the closest
        key, and one count of amp_namespace_problems_total{problem="unknown-key"},
        when it appears or changes; not again for an unrelated change.
        """
        source = self.start()
        typo = {"amp.txn2.com/endpoint": EP_A}
        self.send(source, Replaced(self.infos(namespace("team-a", "3", ENABLED, typo), namespace("team-b", "4")), "10"))
        warnings = [formatEvent(e) for e in self.logs.at(LogLevel.warn)]
        self.assertEqual(
            warnings,
            ["Namespace team-a: annotation amp.txn2.com/endpoint is not read by amp (did you mean amp.txn2.com/ep?)"],
        )
        problems = lambda: sample(self.metrics, "amp_namespace_problems_total", problem="unknown-key")  # noqa: E731
        self.assertEqual(problems(), 1)
        self.send(
            source,
            Changed("MODIFIED", self.info("team-a", "11", labels=ENABLED, annotations={**typo, "other": "x"}), "11"),
        )
        self.send(source, Replaced(self.infos(namespace("team-a", "12", ENABLED, typo)), "12"))
        self.assertEqual(problems(), 1)
        self.send(source, Changed("MODIFIED", self.info("team-a", "13", labels={"amp.txn2.com/enable": "true"}), "13"))
        self.assertEqual(problems(), 2)
        self.assertIn(
            "label amp.txn2.com/enable is not read by amp (did you mean amp.txn2.com/enabled?)",
            formatEvent(self.logs.at(LogLevel.warn)[-1]),
        )
        self.assertEqual(source.cached("team-a").labels, {}, "the unknown keys themselves are not kept")

    def test_bookmark_moves_the_resource_version(self) -> None:
        source = self.start()
        self.send(source, Replaced({}, "10"), Bookmark("25"))
        self.assertEqual(source.resource_version, "25")
        self.assertEqual(self.events("BOOKMARK"), 1)

    def test_relist_replaces_the_cache(self) -> None:
        source = self.start(miss_negative_ttl=60.0)
        self.send(source, Replaced(self.infos(namespace("a"), namespace("b"), namespace("c")), "10"))
        self.assertIsNone(self.successResultOf(self._fetch(source, "d")))
        self.assertIsNone(source.cached("d"))
        self.send(source, Replaced(self.infos(namespace("a"), namespace("b", "20", ENABLED), namespace("d")), "30"))
        self.assertEqual(sorted(source._cache), ["a", "b", "d"])
        self.assertIs(source.cached("c"), UNKNOWN)
        self.assertEqual(source.cached("d").name, "d", "a namespace the relist found is no longer missing")
        self.assertEqual(dict(source.cached("b").labels), ENABLED)
        self.assertEqual(self.events("DELETED"), 0)
        self.assertEqual(self.first_lists, [True])
        self.assertEqual(self.logs.at(LogLevel.info)[-1]["what"], "Relisted")

    def _fetch(self, source: KubernetesNamespaceSource, name: str, timeout: float = 2.0) -> Any:
        d = source.fetch(name, timeout)
        self.reactor.pool.run()
        return d

    def test_restarts_show_in_readiness_metrics_and_the_log(self) -> None:
        source = self.start()
        self.send(source, Restarting("error", "HTTP 403 Forbidden", 0.5))
        self.assertEqual(
            source.readiness(),
            (False, "waiting for the first namespace list (last attempt: error: HTTP 403 Forbidden)"),
        )
        self.send(source, Replaced({}, "10"), Restarting("stalled", "ReadTimeoutError: read timed out", 1.5))
        ready, detail = source.readiness()
        self.assertTrue(ready)
        self.assertIn("watch restarting after stalled: ReadTimeoutError: read timed out", detail)
        [warning] = [e for e in self.logs.at(LogLevel.warn) if e.get("reason") == "stalled"]
        self.assertEqual((warning["what"], warning["delay"]), ("namespace", 1.5))
        # a live stream again: readiness no longer reports the restart
        self.send(source, Bookmark("11"))
        self.assertNotIn("restarting", source.readiness()[1])
        # the server's normal timeout is counted, not reported
        warnings = len(self.logs.at(LogLevel.warn))
        self.send(source, Restarting("timeout", "", 0.0))
        self.assertEqual(len(self.logs.at(LogLevel.warn)), warnings)
        self.assertNotIn("restarting", source.readiness()[1])
        for reason in ("error", "stalled", "timeout"):
            self.assertEqual(sample(self.metrics, "amp_namespace_watch_restarts_total", reason=reason), 1)

    def test_a_crashed_thread_shows_in_readiness(self) -> None:
        source = self.start()
        self.send(source, Crashed("RuntimeError: bug"))
        self.assertEqual(
            source.readiness(),
            (False, "waiting for the first namespace list (last attempt: watch thread failed: RuntimeError: bug)"),
        )
        [critical] = self.logs.at(LogLevel.critical)
        self.assertEqual(critical["error"], "RuntimeError: bug")

    def test_news_after_stop_is_dropped(self) -> None:
        source = self.start()
        bridge = source.watches["namespaces"].emit
        self.send(source, Replaced(self.infos(namespace("a")), "10"))
        d = source.stopService()
        bridge(Changed("DELETED", self.info("a"), "11"))
        self.assertEqual(self.events("DELETED"), 0)
        self.assertEqual(source.readiness(), (False, "not started"))
        self.threads.run_all()
        self.successResultOf(d)

    def test_stop_waits_for_every_thread_then_closes_the_client(self) -> None:
        source = self.start(webhook_configuration="amp")
        self.assertEqual(len(source.threads), 2)
        d = source.stopService()
        [watches] = self.kube.forks
        self.assertEqual(watches.cut_calls, 1, "the watches' sockets shut down at once to wake blocked reads")
        self.assertEqual(self.kube.cut_calls, 0, "calls in the thread pool are bounded; they may finish")
        self.assertNoResult(d)
        self.threads.started[0].run()
        self.assertNoResult(d)
        self.assertFalse(self.kube.closed or watches.closed)
        self.threads.started[1].run()
        self.successResultOf(d)
        self.assertTrue(self.kube.closed and watches.closed)
        self.assertEqual(self.kube.listers["namespaces"].calls, [], "a stopped thread makes no request")

    def test_stop_gives_up_on_a_stuck_thread(self) -> None:
        source = self.start()
        d = source.stopService()
        self.reactor.advance(STOP_WAIT - 0.1)
        self.assertNoResult(d)
        self.reactor.advance(0.1)
        self.successResultOf(d)
        self.assertFalse(self.kube.forks[0].closed, "a thread may still use the client")
        [warning] = self.logs.at(LogLevel.warn)
        self.assertEqual(warning["names"], "amp-namespace-watch")

    def test_unusable_client_configuration_is_a_readiness_error(self) -> None:
        def factory(config: KubernetesConfig) -> Any:
            raise FileNotFoundError("no such kubeconfig")

        source = KubernetesNamespaceSource(
            kube_config(kubeconfig="/etc/missing"), reactor=self.reactor, client_factory=factory, spawn=self.threads
        )
        source.startService()
        ready, detail = source.readiness()
        self.assertFalse(ready)
        self.assertEqual(
            detail,
            "cannot load the Kubernetes client configuration from kubeconfig /etc/missing: "
            "FileNotFoundError: no such kubeconfig",
        )
        self.assertEqual(source.threads, ())
        failure = self.failureResultOf(source.fetch("a", 1.0), NamespaceLookupError)
        self.assertIn("cannot load", str(failure.value))
        self.assertIsNone(source.stopService())

    def test_in_cluster_outside_a_cluster_is_a_readiness_error(self) -> None:
        source = KubernetesNamespaceSource(
            kube_config(source="cluster", kubeconfig=None), reactor=self.reactor, spawn=self.threads
        )
        source.startService()
        ready, detail = source.readiness()
        self.assertFalse(ready)
        self.assertIn("from in-cluster service account", detail)
        source.stopService()


class WebhookConfigurationTests(SourceTestCase):
    def test_auto_failure_policy_follows_the_webhook_configuration(self) -> None:
        source = self.start(webhook_configuration="amp", webhook_name="pods.amp.txn2.com")
        config = Config(kubernetes=kube_config(), failure_policy="auto")
        self.assertEqual([t.name for t in self.threads.started], ["amp-namespace-watch", "amp-webhook-watch"])
        self.send(source, Replaced(self.infos(namespace("team-a", labels=ENABLED)), "10"))
        ready, detail = source.readiness()
        self.assertFalse(ready)
        self.assertIn("waiting for the first list of MutatingWebhookConfiguration amp", detail)
        self.send(source, Restarting("error", "HTTP 403 Forbidden", 1.0), kind="webhook")
        self.assertIn("(last attempt: error: HTTP 403 Forbidden)", source.readiness()[1])
        self.assertEqual(sample(self.metrics, "amp_namespace_watch_restarts_total", reason="webhook-error"), 1)

        self.send(source, Replaced(WebhookSeen(IGNORE), "20"), kind="webhook")
        self.assertTrue(source.readiness()[0])
        self.assertEqual(source.cluster_failure_policy(), IGNORE)
        self.assertEqual(failure_policy(source.cached("team-a"), config, source.cluster_failure_policy()), IGNORE)
        self.send(source, Changed("MODIFIED", ("amp", WebhookSeen(FAIL)), "21"), kind="webhook")
        self.assertEqual(source.cluster_failure_policy(), FAIL)
        self.send(source, Changed("DELETED", ("amp", WebhookSeen(FAIL)), "22"), kind="webhook")
        self.assertIsNone(source.cluster_failure_policy())
        self.assertEqual(failure_policy(source.cached("team-a"), config, None), FAIL)
        # webhook events are not namespace events
        self.assertEqual(self.events("MODIFIED") + self.events("DELETED"), 0)

    def test_each_version_of_the_webhook_configuration_reaches_the_registration_check(self) -> None:
        """
        The registration check is told, on the reactor, every version the
        watch sees (the entries as listed or changed), and None when the
        configuration is deleted.
        """
        from amp.registration import RegistrationReport, needs

        report = RegistrationReport(
            needs(Config(kubernetes=kube_config(webhook_configuration="amp"))), self.metrics, self.reactor
        )
        seen: list[Any] = []

        def told(obj: Any) -> None:
            seen.append(obj)
            report.seen(obj)

        source = self.start(on_webhook=told, webhook_configuration="amp", webhook_name="pods.amp.txn2.com")
        entry = {"name": "pods.amp.txn2.com", "failurePolicy": "Ignore", "sideEffects": "Some"}
        self.send(source, Replaced(WebhookSeen(IGNORE, (entry,)), "20"), kind="webhook")
        self.send(
            source,
            Changed("MODIFIED", ("amp", WebhookSeen(FAIL, ({**entry, "failurePolicy": "Fail"},))), "21"),
            kind="webhook",
        )
        self.send(source, Changed("DELETED", ("amp", WebhookSeen(FAIL)), "22"), kind="webhook")
        self.assertEqual(seen, [{"webhooks": [entry]}, {"webhooks": [{**entry, "failurePolicy": "Fail"}]}, None])
        self.assertEqual([p.name.value for p in report.problems], ["configuration-missing"])
        self.assertEqual(sample(self.metrics, "amp_registration_problems", problem="configuration-missing"), 1)
        self.assertEqual(sample(self.metrics, "amp_registration_problems", problem="side-effects"), 0)
        # the source's readiness does not depend on the registration's problems
        self.send(source, Replaced(self.infos(namespace("team-a", labels=ENABLED)), "30"))
        self.assertTrue(source.readiness()[0])

    def test_the_webhook_list_keeps_only_the_named_configuration(self) -> None:
        stop = threading.Event()
        lister = ScriptedLister(
            stop,
            lists=[
                list_body(
                    [
                        {"metadata": {"name": "someone-else"}, "webhooks": [{"name": "x", "failurePolicy": "Fail"}]},
                        {
                            "metadata": {"name": "amp"},
                            "webhooks": [{"name": "pods.amp.txn2.com", "failurePolicy": "Ignore"}],
                        },
                    ],
                    "10",
                )
            ],
        )
        from amp.kube._keep import WebhookPolicy

        policy = WebhookPolicy("amp", "pods.amp.txn2.com")
        emitted: list[Any] = []
        ListWatch(
            lister=lister,
            parse=policy.parse,
            collect=policy.collect,
            emit=emitted.append,
            stop=stop,
            config=kube_config(),
            random=lambda: 0.0,
        ).run()
        self.assertEqual(
            emitted[0], Replaced(WebhookSeen(IGNORE, ({"name": "pods.amp.txn2.com", "failurePolicy": "Ignore"},)), "10")
        )


class FetchTests(SourceTestCase):
    """Cache misses: one GET in the thread pool, shared by its callers."""

    def listed(self, **overrides: Any) -> KubernetesNamespaceSource:
        source = self.start(**overrides)
        self.send(source, Replaced({}, "10"))
        return source

    def test_concurrent_misses_share_one_get(self) -> None:
        source = self.listed()
        self.kube.add_namespace("late", labels=ENABLED, annotations={"amp.txn2.com/ep": EP_A})
        waiters = [source.fetch("late", 1.5) for _ in range(5)]
        waiters[1].cancel()
        self.assertEqual(self.reactor.pool.run(), 1)
        self.assertEqual(self.kube.gets, [("late", 1.5)])
        self.failureResultOf(waiters[1], CancelledError)
        results = [self.successResultOf(waiters[i]) for i in (0, 2, 3, 4)]
        for info in results:
            self.assertEqual((info.name, dict(info.annotations)), ("late", {"amp.txn2.com/ep": EP_A}))
        self.assertEqual(self.misses("found"), 4)
        # the answer is cached: the next review needs no GET
        self.assertEqual(source.cached("late"), results[0])
        self.assertEqual(self.events("ADDED"), 0)

    def test_the_get_is_bounded_by_the_miss_timeout(self) -> None:
        source = self.listed(miss_timeout=0.5)
        source.fetch("a", 9.0)
        source.fetch("b", 0.2)
        self.reactor.pool.run()
        self.assertEqual(self.kube.gets, [("a", 0.5), ("b", 0.2)])

    def test_the_watch_view_wins_over_a_get_it_overtook(self) -> None:
        source = self.listed()
        self.kube.add_namespace("late", annotations={"amp.txn2.com/ep": EP_A})
        d = source.fetch("late", 2.0)
        self.send(source, Changed("ADDED", self.info("late", "12", annotations={"amp.txn2.com/ep": EP_B}), "12"))
        self.reactor.pool.run()
        self.assertEqual(self.successResultOf(d).annotations["amp.txn2.com/ep"], EP_B)
        self.assertEqual(source.cached("late").annotations["amp.txn2.com/ep"], EP_B)

    def test_missing_namespace_is_remembered_for_the_ttl(self) -> None:
        source = self.listed(miss_negative_ttl=5.0)
        d = source.fetch("ghost", 2.0)
        self.reactor.pool.run()
        self.assertIsNone(self.successResultOf(d))
        self.assertEqual(self.misses("not-found"), 1)
        self.assertIsNone(source.cached("ghost"))
        self.reactor.advance(4.9)
        self.assertIsNone(source.cached("ghost"))
        self.reactor.advance(0.2)
        self.assertIs(source.cached("ghost"), UNKNOWN)
        d = source.fetch("ghost", 2.0)
        self.reactor.pool.run()
        self.assertIsNone(self.successResultOf(d))
        self.assertEqual(len(self.kube.gets), 2)
        # a namespace created meanwhile is known as soon as the watch says so
        self.send(source, Changed("ADDED", self.info("ghost", labels=ENABLED), "20"))
        self.assertEqual(source.cached("ghost").name, "ghost")

    def test_lookup_errors_fail_with_namespace_lookup_error(self) -> None:
        source = self.listed()
        self.kube.errors["boom"] = api_error(500)
        d = source.fetch("boom", 2.0)
        self.reactor.pool.run()
        failure = self.failureResultOf(d, NamespaceLookupError)
        self.assertEqual(str(failure.value), "namespace boom: HTTP 500 Internal Server Error")
        self.assertIs(source.cached("boom"), UNKNOWN)
        self.assertEqual(self.misses("error"), 1)
        [warning] = self.logs.at(LogLevel.warn)
        self.assertEqual(warning["error"], "namespace boom: HTTP 500 Internal Server Error")

    def test_a_failure_without_a_message_is_still_named(self) -> None:
        source = self.listed()
        self.kube.errors["quiet"] = TimeoutError()
        d = source.fetch("quiet", 2.0)
        self.reactor.pool.run()
        self.assertEqual(str(self.failureResultOf(d, NamespaceLookupError).value), "namespace quiet: TimeoutError")
        [warning] = self.logs.at(LogLevel.warn)
        self.assertEqual(warning["error"], "namespace quiet: TimeoutError")

    def test_unreadable_answer_is_a_lookup_error(self) -> None:
        source = self.listed()
        self.kube.read_namespace = lambda name, timeout: b"{not json"  # type: ignore[method-assign]
        d = source.fetch("x", 2.0)
        self.reactor.pool.run()
        self.assertIn("namespace x: unreadable answer", str(self.failureResultOf(d, NamespaceLookupError).value))

    def test_per_review_get_mode_gets_every_time(self) -> None:
        self.kube.add_namespace("team-a", labels=ENABLED, annotations={"amp.txn2.com/ep": EP_A})
        source = self.start(per_review_get=True)
        self.assertEqual(source.threads, ())
        self.assertEqual(source.readiness(), (True, "per-review GET mode: no namespace cache"))
        self.assertIs(source.cached("team-a"), UNKNOWN)
        first, second, missing = source.fetch("team-a", 2.0), source.fetch("team-a", 2.0), source.fetch("nope", 2.0)
        self.reactor.pool.run()
        info = self.successResultOf(first)
        self.assertEqual(info, self.successResultOf(second))
        self.assertEqual(info.annotations["amp.txn2.com/ep"], EP_A)
        self.assertIsNone(self.successResultOf(missing))
        self.assertEqual([name for name, _ in self.kube.gets], ["team-a", "team-a", "nope"])
        self.assertIs(source.cached("team-a"), UNKNOWN)
        self.assertEqual((self.misses("found"), self.misses("not-found")), (2, 1))

    def test_stopped_source_answers_lookups_with_an_error(self) -> None:
        source = self.listed()
        d = source.stopService()
        self.threads.run_all()
        self.successResultOf(d)
        self.assertEqual(source.readiness(), (False, "not started"))
        self.failureResultOf(source.fetch("b", 1.0), NamespaceLookupError)
        self.assertEqual(self.kube.gets, [])
