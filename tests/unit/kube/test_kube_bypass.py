"""
Unit tests for the bypassed-Pod report: what the Pod watch keeps, every
rule of the report, the Lease that picks the one reporting replica, and the
namespace source that wires them together, on a C{Clock} with an in-memory
Kubernetes (tests/support/memory_kube_client.py).  tests/e2e/test_bypass.py runs the same
against a real API server.
"""

from __future__ import annotations

import threading
from typing import Any, Optional

from twisted.internet.defer import CancelledError
from twisted.logger import LogLevel
from twisted.trial.unittest import SynchronousTestCase

from amp.config import BypassConfig, KubernetesConfig
from amp.kube import KubernetesNamespaceSource
from amp.kube._bypass import MAX_QUEUED_EVENTS, RETRY_FIRST, SETTLE, BypassReporter
from amp.kube._client import KubeClient
from amp.kube._events import Changed, Replaced, Restarting
from amp.kube._keep import Keep, PodKeep, PodSeen, format_time, parse_time
from amp.kube._lease import LeaseElector
from amp.kube._verdict import Enabled, EnableRevisions, Judge, Verdict, event_name
from amp.kube._watch import ListWatch
from amp.metrics import Metrics
from amp.namespaces import UNKNOWN, NamespaceInfo
from tests.support.memory_kube_client import (
    MemoryKube,
    ScriptedLister,
    ThreadReactor,
    Threads,
    api_error,
    event,
    list_body,
    namespace,
    pod,
)
from tests.unit.kube.test_kube import LogCapture, sample

ENABLED = {"amp.txn2.com/enabled": "true"}
#: 2026-01-01T00:00:00Z, the tests' "now" when they start.
T0 = 1_767_225_600.0
HOUR = 3600.0


def at(seconds: float) -> str:
    """The API server's timestamp of T0 + seconds."""
    return format_time(T0 + seconds)


def kube_config(kube: Optional[dict[str, Any]] = None, **bypass: Any) -> KubernetesConfig:
    values: dict[str, Any] = dict(enabled=True, lease_namespace="amp-system", horizon=HOUR)
    values.update(bypass)
    return KubernetesConfig(
        source="kubeconfig",
        kubeconfig="/nonexistent",
        request_timeout=2.0,
        bypass=BypassConfig(**values),
        **(kube or {}),
    )


def enabled_ns(name: str, since: Optional[float] = -HOUR, **annotations: str) -> NamespaceInfo:
    """An enabled namespace whose label was set at T0 + since."""
    return NamespaceInfo(name, ENABLED, annotations, "1", None if since is None else T0 + since)


def seen(
    namespace: str, name: str, created: float, controller: str = "ReplicaSet", revision: Optional[int] = None
) -> PodSeen:
    return PodSeen(namespace, name, f"uid-{namespace}-{name}", T0 + created, controller, revision)


# ====================================================================== what the threads keep


class KeepTests(SynchronousTestCase):
    def managed(self, *entries: tuple[str, list[str]]) -> list[dict[str, Any]]:
        return [
            {
                "manager": f"m{i}",
                "operation": "Update",
                "time": when,
                "fieldsV1": {"f:metadata": {"f:labels": {f"f:{label}": {} for label in labels}}},
            }
            for i, (when, labels) in enumerate(entries)
        ]

    def test_enabled_since_is_when_the_label_was_last_written(self) -> None:
        keep = Keep(kube_config())
        obj = namespace(
            "team-a",
            labels=ENABLED,
            creationTimestamp=at(-100),
            managedFields=self.managed(
                (at(-100), ["kubernetes.io/metadata.name"]),
                (at(-50), ["amp.txn2.com/enabled", "team"]),
                (at(-70), ["amp.txn2.com/enabled"]),
            ),
        )
        self.assertEqual(keep.namespace(obj).enabled_since, T0 - 50)

    def test_enabled_since_is_unknown_without_a_managed_field_or_when_not_enabled(self) -> None:
        keep = Keep(kube_config())
        self.assertIsNone(keep.namespace(namespace("a", labels=ENABLED)).enabled_since)
        disabled = namespace(
            "b",
            labels={"amp.txn2.com/enabled": "false"},
            managedFields=self.managed((at(-50), ["amp.txn2.com/enabled"])),
        )
        self.assertIsNone(keep.namespace(disabled).enabled_since)

    def test_a_pod_is_kept_only_when_it_could_have_bypassed_amp(self) -> None:
        keep = PodKeep(kube_config(), cutoff=lambda: T0 - HOUR)
        kept = keep.pod(pod("team-a", "web-1", at(-10), owner="ReplicaSet", labels={"app": "web"}))
        self.assertEqual(kept, PodSeen("team-a", "web-1", "uid-team-a-web-1", T0 - 10, "ReplicaSet", 1))
        self.assertIsNone(keep.pod(pod("team-a", "web-1", at(-10), rv="opaque")).revision)
        self.assertEqual(keep.pod(pod("team-a", "bare", at(-10))).controller, "")
        for dropped in (
            pod("team-a", "reviewed", at(-10), annotations={"amp.txn2.com/status": "mutated http://ep"}),
            pod("team-a", "legacy", at(-10), annotations={"amp.txn2.com/skipped": "http-5xx: http://ep"}),
            pod("team-a", "opted-out", at(-10), labels={"amp.txn2.com/enabled": "false"}),
            pod("team-a", "leaving", at(-10), deletionTimestamp=at(-1)),
            pod("team-a", "old", at(-HOUR - 1)),
            pod("team-a", "no-time", ""),
        ):
            self.assertIsNone(keep.pod(dropped), dropped["metadata"]["name"])

    def test_the_pod_watch_asks_for_metadata_only(self) -> None:
        calls: list[tuple[str, str, list, str]] = []

        class Client:
            def request(self, method: str, path: str, *, query: Any, accept: str, timeout: Any) -> bytes:
                calls.append((method, path, list(query), accept))
                return b"{}"

            def open(self, method: str, path: str, *, query: Any, accept: str, timeout: Any) -> Any:
                calls.append((method, path, list(query), accept))
                return None

        lister = KubeClient.pod_metadata(Client())  # type: ignore[arg-type]
        lister.list(limit=500, continue_token="c1", timeout=(1.0, 1.0))
        lister.watch(resource_version="7", timeout_seconds=30, timeout=(1.0, 31.0))
        self.assertEqual(
            calls,
            [
                (
                    "GET",
                    "/api/v1/pods",
                    [("limit", "500"), ("continue", "c1")],
                    "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1",
                ),
                (
                    "GET",
                    "/api/v1/pods",
                    [
                        ("watch", "true"),
                        ("resourceVersion", "7"),
                        ("allowWatchBookmarks", "true"),
                        ("timeoutSeconds", "30"),
                    ],
                    "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1",
                ),
            ],
        )

    def test_the_pod_watch_loop_keeps_only_candidates(self) -> None:
        stop = threading.Event()
        lister = ScriptedLister(
            stop,
            lists=[
                list_body(
                    [
                        pod("a", "bypassed", at(-10)),
                        pod("a", "reviewed", at(-10), annotations={"amp.txn2.com/status": "x"}),
                    ],
                    "10",
                )
            ],
            watches=[
                [
                    event("ADDED", pod("a", "new", at(0), rv="11")),
                    event("MODIFIED", pod("a", "new", at(0), rv="12")),
                    event("DELETED", pod("a", "bypassed", at(-10), rv="13")),
                ]
            ],
        )
        emitted: list[Any] = []
        keep = PodKeep(kube_config(), cutoff=lambda: T0 - HOUR)
        ListWatch(
            lister=lister,
            parse=keep.pod,
            emit=emitted.append,
            stop=stop,
            config=kube_config(),
            random=lambda: 0.0,
            kinds=("ADDED", "DELETED"),
            page_size=500,
        ).run()
        self.assertEqual(emitted[0], Replaced((seen("a", "bypassed", -10, "", 1),), "10"))
        self.assertEqual(
            emitted[1:3],
            [
                Changed("ADDED", seen("a", "new", 0, "", 11), "11"),
                Changed("DELETED", seen("a", "bypassed", -10, "", 13), "13"),
            ],
        )


# ====================================================================== the report


class Namespaces:
    """The namespace cache, as the reporter sees it."""

    def __init__(self, *infos: NamespaceInfo) -> None:
        self.infos = {i.name: i for i in infos}

    def cached(self, name: str) -> Any:
        return self.infos.get(name, UNKNOWN)


class PendingPool:
    """post_event that succeeds or fails when the test says."""

    def __init__(self) -> None:
        from twisted.internet.defer import Deferred

        self.Deferred = Deferred
        self.posted: list[tuple[str, dict[str, Any], Any]] = []

    def __call__(self, namespace: str, body: dict[str, Any]) -> Any:
        d = self.Deferred()
        self.posted.append((namespace, body, d))
        return d


class ReporterTestCase(SynchronousTestCase):
    def setUp(self) -> None:
        from twisted.internet.task import Clock

        self.clock = Clock()
        self.clock.advance(T0)
        self.metrics = Metrics()
        self.kube = MemoryKube()
        self.logs = LogCapture(self)
        self.config: dict[str, Any] = {}
        self.namespaces = Namespaces(
            enabled_ns("team-a"),
            enabled_ns("team-b"),
            enabled_ns("late-enabled", since=-30),
            enabled_ns("unknown-since", since=None),
            enabled_ns("shadowed", **{"amp.txn2.com/mode": "shadow"}),
            NamespaceInfo("plain", {}, {}),
            enabled_ns("kube-system"),
            enabled_ns("amp-system"),
        )
        self.enables: dict[str, Enabled] = {}

    def reporter(self, post_event: Any = None, identity: str = "amp-0_abc", **bypass: Any) -> BypassReporter:
        reporter = BypassReporter(
            config=kube_config(self.config, **bypass),
            namespaces=self.namespaces,
            clock=self.clock,
            metrics=self.metrics,
            post_event=post_event or self.post,
            own_namespace="amp-system",
            identity=identity,
            enables=self.enables.get,
        )
        reporter.start_term()
        reporter.namespaces_listed()
        return reporter

    def post(self, namespace: str, body: dict[str, Any]) -> Any:
        from twisted.internet.defer import succeed

        return succeed(self.kube.create_event(namespace, body, 1.0))

    def settle(self) -> None:
        self.clock.advance(SETTLE)

    def counted(self, namespace: str) -> float:
        return sample(self.metrics, "amp_bypassed_pods_total", namespace=namespace)

    def reported(self) -> list[str]:
        return [f"{ns}/{body['involvedObject']['name']}" for ns, body in self.kube.events]


class ReportTests(ReporterTestCase):
    def test_a_bypassed_pod_is_counted_logged_and_gets_an_event(self) -> None:
        reporter = self.reporter()
        reporter.news(Changed("ADDED", seen("team-a", "web-1", -5), "11"))
        self.assertEqual(self.kube.events, [], "judged only once settled")
        self.settle()

        self.assertEqual(self.counted("team-a"), 1)
        [warning] = [e for e in self.logs.at(LogLevel.warn) if e.get("pod")]
        self.assertEqual((warning["namespace"], warning["pod"]), ("team-a", "web-1"))
        [(namespace, body)] = self.kube.events
        self.assertEqual(namespace, "team-a")
        self.assertEqual((body["type"], body["reason"], body["count"]), ("Warning", "AmpBypassed", 1))
        self.assertEqual(
            body["involvedObject"],
            {"apiVersion": "v1", "kind": "Pod", "namespace": "team-a", "name": "web-1", "uid": "uid-team-a-web-1"},
        )
        self.assertEqual(body["metadata"]["namespace"], "team-a")
        self.assertEqual(body["metadata"]["name"], "web-1.amp-bypassed.uid-team-a-web-1")
        self.assertIn("admitted without amp", body["message"])
        self.assertIn("Delete the Pod so that its ReplicaSet recreates it through amp", body["message"])
        self.assertEqual((body["source"], body["reportingInstance"]), ({"component": "amp"}, "amp-0_abc"))
        self.assertEqual(body["firstTimestamp"], at(SETTLE))

    def test_a_pod_without_a_controller_is_told_to_be_recreated(self) -> None:
        reporter = self.reporter()
        reporter.news(Changed("ADDED", seen("team-a", "bare", -5, controller=""), "11"))
        self.settle()
        self.assertIn("Delete and create the Pod again so that amp reviews it", self.kube.events[0][1]["message"])

    def test_pods_that_did_not_bypass_amp_are_never_reported(self) -> None:
        reporter = self.reporter()
        reporter.news(
            Replaced(
                (
                    seen("late-enabled", "before-enabling", -31),
                    seen("shadowed", "p", -5),
                    seen("plain", "not-enabled", -5),
                    seen("kube-system", "p", -5),
                    seen("amp-system", "amp-itself", -5),
                    seen("gone", "namespace-unknown", -5),
                    seen("team-a", "older-than-the-horizon", -HOUR - 1),
                    seen("late-enabled", "after-enabling", -29),
                ),
                "10",
            )
        )
        self.settle()
        self.assertEqual(self.reported(), ["late-enabled/after-enabling"])
        self.assertEqual(
            sum(
                s.value
                for m in self.metrics.registry.collect()
                if m.name == "amp_bypassed_pods"
                for s in m.samples
                if s.name.endswith("_total")
            ),
            1,
        )

    def test_where_the_order_cannot_be_told_the_pod_is_possibly_bypassed(self) -> None:
        reporter = self.reporter()
        reporter.news(
            Replaced((seen("late-enabled", "same-second-as-enabling", -30), seen("unknown-since", "p", -5)), "10")
        )
        self.settle()
        self.assertEqual(self.reported(), ["late-enabled/same-second-as-enabling", "unknown-since/p"])
        same, unknown = (body["message"] for _, body in self.kube.events)
        self.assertIn("possibly admitted without amp", same)
        self.assertIn("created in the same second as its namespace was enabled", same)
        self.assertIn("do not say when it was enabled", unknown)
        warnings = [e for e in self.logs.at(LogLevel.warn) if e.get("pod")]
        self.assertEqual([w["verdict"] for w in warnings], ["same-second", "enable-time-unknown"])
        self.assertIn("possibly created without amp's review", warnings[0]["log_format"])
        self.assertEqual(self.counted("late-enabled") + self.counted("unknown-since"), 2)

    def test_the_namespaces_amp_does_not_act_on_follow_its_configuration(self) -> None:
        self.config = {"protected_namespaces": ("team-b",)}
        reporter = self.reporter()
        reporter.news(
            Replaced((seen("kube-system", "p", -5), seen("team-b", "p", -5), seen("amp-system", "p", -5)), "10")
        )
        self.assertEqual(self.reported(), ["kube-system/p"])
        self.config = {"allow_protected_namespaces": True}
        reporter = self.reporter()
        reporter.news(Replaced((seen("kube-system", "q", -5), seen("amp-system", "q", -5)), "10"))
        self.assertEqual(self.reported(), ["kube-system/p", "kube-system/q", "amp-system/q"])

    def test_the_horizon_is_checked_when_the_pod_is_judged(self) -> None:
        reporter = self.reporter(horizon=60.0)
        reporter.news(Replaced((seen("team-a", "old", -61), seen("team-a", "recent", -59)), "10"))
        self.settle()
        self.assertEqual(self.reported(), ["team-a/recent"])

    def test_no_pod_is_reported_twice(self) -> None:
        reporter = self.reporter()
        pods = (seen("team-a", "p1", -5), seen("team-b", "p2", -4))
        reporter.news(Replaced(pods, "10"))
        self.settle()
        # a relist (410), a term that ends and starts again, a replayed event
        reporter.news(Replaced(pods, "20"))
        reporter.end_term()
        reporter.start_term()
        reporter.news(Changed("ADDED", pods[0], "21"))
        self.settle()
        self.assertEqual(self.reported(), ["team-a/p1", "team-b/p2"])
        self.assertEqual(self.counted("team-a") + self.counted("team-b"), 2)

    def test_a_namespace_enabled_just_before_its_pod_is_seen_in_time(self) -> None:
        reporter = self.reporter()
        reporter.news(Changed("ADDED", seen("brand-new", "p", 0), "11"))
        # the namespace watch, a separate stream, delivers the namespace a moment later
        self.clock.advance(SETTLE / 2)
        self.namespaces.infos["brand-new"] = enabled_ns("brand-new", since=-2)
        self.clock.advance(SETTLE / 2)
        self.assertEqual(self.reported(), ["brand-new/p"])

    def test_a_listed_pod_older_than_the_namespace_list_is_judged_at_once(self) -> None:
        reporter = self.reporter()  # the namespace list landed at T0
        reporter.news(Replaced((seen("team-a", "older", -2), seen("team-a", "newer", 0)), "10"))
        self.assertEqual(self.reported(), ["team-a/older"])
        self.settle()
        self.assertEqual(self.reported(), ["team-a/older", "team-a/newer"])

    def test_pods_wait_for_the_first_namespace_list(self) -> None:
        reporter = BypassReporter(
            config=kube_config(),
            namespaces=self.namespaces,
            clock=self.clock,
            metrics=self.metrics,
            post_event=self.post,
            own_namespace="amp-system",
            identity="amp-0",
        )
        reporter.start_term()
        reporter.news(Replaced((seen("team-a", "p", -5),), "10"))
        self.settle()
        self.assertEqual(self.reported(), [])
        reporter.namespaces_listed()
        self.assertEqual(self.reported(), ["team-a/p"])

    def test_a_pod_deleted_before_it_is_judged_is_not_reported(self) -> None:
        reporter = self.reporter()
        reporter.news(Changed("ADDED", seen("team-a", "short-lived", -1), "11"))
        reporter.news(Changed("DELETED", seen("team-a", "short-lived", -1), "12"))
        self.settle()
        self.assertEqual(self.reported(), [])

    def test_nothing_is_reported_outside_a_term(self) -> None:
        reporter = self.reporter()
        reporter.news(Changed("ADDED", seen("team-a", "pending", -1), "11"))
        reporter.end_term()
        reporter.news(Changed("ADDED", seen("team-a", "after", -1), "12"))
        self.settle()
        self.assertEqual(self.reported(), [])

    def test_the_pod_watch_restarts_are_logged(self) -> None:
        reporter = self.reporter()
        reporter.news(Restarting("expired", "HTTP 410 Gone", 0.0))
        reporter.news(Restarting("timeout", "", 0.0))
        [warning] = self.logs.at(LogLevel.warn)
        self.assertEqual((warning["reason"], warning["error"]), ("expired", "HTTP 410 Gone"))

    def test_memory_of_reported_pods_is_bounded_by_the_horizon(self) -> None:
        reporter = self.reporter(horizon=60.0)
        for i in range(1100):
            reporter.news(Changed("ADDED", seen("team-a", f"early-{i}", -10 + i * 0.001), str(i)))
        self.settle()
        self.assertEqual((len(self.reported()), reporter.remembered), (1100, 1100))
        # an hour later, a thousand more: the first ones can no longer be
        # reported again (older than the horizon), so they are forgotten
        self.clock.advance(HOUR)
        for i in range(1100):
            reporter.news(Changed("ADDED", seen("team-a", f"late-{i}", HOUR + i * 0.001), str(i)))
        self.settle()
        self.assertEqual(len(self.reported()), 2200)
        self.assertLessEqual(reporter.remembered, 1100)

    def test_events_are_sent_one_at_a_time_and_a_refused_one_is_logged(self) -> None:
        from kubernetes.client.exceptions import ApiException

        pool = PendingPool()
        reporter = self.reporter(post_event=pool)
        reporter.news(Replaced((seen("team-a", "p1", -5), seen("team-a", "p2", -5)), "10"))
        self.settle()
        self.assertEqual(len(pool.posted), 1, "one Event in flight at a time")
        pool.posted[0][2].errback(ApiException(status=403, reason="Forbidden"))
        self.assertEqual(len(pool.posted), 2)
        pool.posted[1][2].callback(True)
        [failed] = [e for e in self.logs.at(LogLevel.warn) if "error" in e]
        self.assertEqual((failed["pod"], failed["error"]), ("p1", "HTTP 403 Forbidden"))
        self.assertEqual(self.counted("team-a"), 2, "reported in the log and the counter without its Event")
        self.clock.advance(HOUR / 2)
        self.assertEqual(len(pool.posted), 2, "a refusal is not tried again")

    def test_an_event_that_failed_is_tried_again_and_counted_once(self) -> None:
        pool = PendingPool()
        reporter = self.reporter(post_event=pool)
        reporter.news(Replaced((seen("team-a", "p1", -5), seen("team-a", "p2", -5)), "10"))
        self.settle()
        pool.posted[0][2].errback(TimeoutError("timed out"))
        self.assertEqual((len(pool.posted), self.counted("team-a")), (1, 0))
        self.clock.advance(RETRY_FIRST)
        self.assertEqual(len(pool.posted), 2)
        # the first attempt did reach the API server after all: 409 now
        pool.posted[1][2].callback(False)
        self.assertEqual(self.counted("team-a"), 1, "its Event is this replica's")
        # an answer (503) says it was not created: a 409 later is another replica's Event
        for attempt in (2, 3):
            pool.posted[attempt][2].errback(api_error(503))
            self.clock.advance(RETRY_FIRST)
        self.assertEqual(len(pool.posted), 4, "the delay doubles after each failure")
        self.clock.advance(RETRY_FIRST)
        pool.posted[4][2].callback(False)
        self.assertEqual(self.counted("team-a"), 1)
        self.assertEqual([body["involvedObject"]["name"] for _, body, _ in pool.posted], ["p1", "p1", "p2", "p2", "p2"])

    def test_events_waiting_are_bounded(self) -> None:
        pool = PendingPool()
        reporter = self.reporter(post_event=pool)
        reporter.news(Replaced(tuple(seen("team-a", f"p{i}", -5) for i in range(MAX_QUEUED_EVENTS + 3)), "10"))
        self.settle()
        self.assertEqual(reporter.queued, MAX_QUEUED_EVENTS, "and one in flight")
        self.assertEqual(len([e for e in self.logs.at(LogLevel.warn) if "count" in e]), 2)
        for _ in range(MAX_QUEUED_EVENTS + 1):
            pool.posted[-1][2].callback(True)
        self.assertEqual(self.counted("team-a"), MAX_QUEUED_EVENTS + 1)
        # the next list judges the others again
        reporter.news(Replaced(tuple(seen("team-a", f"p{i}", -5) for i in range(MAX_QUEUED_EVENTS + 3)), "11"))
        for _ in range(2):
            pool.posted[-1][2].callback(True)
        self.assertEqual(self.counted("team-a"), MAX_QUEUED_EVENTS + 3)


class OrderTests(ReporterTestCase):
    """A Pod and its namespace's enabling, ordered to the write where the API server allows it."""

    def judge(
        self, pod: PodSeen, ns: NamespaceInfo, enabled: Optional[Enabled] = None, exact: bool = True
    ) -> Optional[Verdict]:
        return Judge(kube_config(), "amp-system")(pod, ns, enabled, exact=exact, now=T0)

    def test_the_seconds_decide_when_they_differ(self) -> None:
        ns = enabled_ns("team-a", since=-30)
        self.assertEqual(self.judge(seen("team-a", "p", -29), ns), Verdict.BYPASSED)
        self.assertIsNone(self.judge(seen("team-a", "p", -31), ns))
        self.assertEqual(self.judge(seen("team-a", "p", -30), ns), Verdict.SAME_SECOND)

    def test_in_the_same_second_the_revisions_decide(self) -> None:
        ns = enabled_ns("team-a", since=-30)
        after, before = (PodSeen("team-a", "p", "u", T0 - 30, "", rv) for rv in (101, 99))
        enabled = Enabled(100, at_creation=False)
        self.assertEqual(self.judge(after, ns, enabled), Verdict.BYPASSED)
        self.assertIsNone(self.judge(before, ns, enabled))
        # a listed Pod's revision is that of its last change: only "before" is certain
        self.assertIsNone(self.judge(before, ns, enabled, exact=False))
        self.assertEqual(self.judge(after, ns, enabled, exact=False), Verdict.SAME_SECOND)
        # the enable time's second is its owner's last write, which may be later
        self.assertEqual(self.judge(PodSeen("team-a", "p", "u", T0 - 31, "", 101), ns, enabled), Verdict.BYPASSED)

    def test_a_namespace_seen_created_enabled_came_before_all_its_pods(self) -> None:
        ns = enabled_ns("team-a", since=-30)
        created = Enabled(100, at_creation=True)
        for seen in (PodSeen("team-a", "p", "u", T0 - 30, "", 500), PodSeen("team-a", "p", "u", T0 - 30)):
            self.assertEqual(self.judge(seen, ns, created, exact=False), Verdict.BYPASSED)

    def test_the_namespace_watch_records_what_it_saw_enable(self) -> None:
        enables = EnableRevisions(kube_config())
        plain = NamespaceInfo("b", {}, {}, "5")
        enables.changed("ADDED", None, enabled_ns("a"), "7")
        enables.changed("ADDED", None, plain, "5")
        self.assertEqual((enables.get("a"), enables.get("b")), (Enabled(7, True), None))
        enables.changed("MODIFIED", plain, NamespaceInfo("b", ENABLED, {}, "9"), "9")
        enables.changed(
            "MODIFIED", NamespaceInfo("b", ENABLED, {}, "9"), NamespaceInfo("b", ENABLED, {"x": "y"}, "10"), "10"
        )
        self.assertEqual(enables.get("b"), Enabled(9, False), "a later change is not the enabling")
        enables.changed("MODIFIED", enabled_ns("a"), NamespaceInfo("a", {}, {}, "11"), "11")
        self.assertIsNone(enables.get("a"), "disabled")
        # a relist keeps what did not change unseen
        enables.changed("ADDED", None, NamespaceInfo("c", ENABLED, {}, "12"), "12")
        enables.replaced(
            {"b": NamespaceInfo("b", ENABLED, {}, "10"), "c": NamespaceInfo("c", ENABLED, {}, "12")},
            {"b": NamespaceInfo("b", ENABLED, {}, "13"), "c": NamespaceInfo("c", ENABLED, {}, "12")},
        )
        self.assertEqual((enables.get("b"), enables.get("c")), (None, Enabled(12, True)))

    def test_the_reporter_orders_added_pods_by_revision(self) -> None:
        self.enables["late-enabled"] = Enabled(100, at_creation=False)
        reporter = self.reporter()
        reporter.news(Changed("ADDED", PodSeen("late-enabled", "after", "u1", T0 - 30, "", 101), "101"))
        reporter.news(Changed("ADDED", PodSeen("late-enabled", "before", "u2", T0 - 30, "", 99), "99"))
        reporter.news(Replaced((PodSeen("late-enabled", "listed", "u3", T0 - 30, "", 102),), "102"))
        self.settle()
        messages = {body["involvedObject"]["name"]: body["message"] for _, body in self.kube.events}
        self.assertEqual(sorted(messages), ["after", "listed"])
        self.assertIn("possibly", messages["listed"])
        self.assertNotIn("possibly", messages["after"])

    def test_the_event_name_is_one_per_pod_and_valid(self) -> None:
        import re

        dns = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
        uid = "3f1c2a9e-6d7b-4f3e-9a51-0c2b8d7e6f10"
        long = PodSeen("a", "x" * 188 + "-.y" + "z" * 60, uid, T0)
        odd = PodSeen("a", "web", "Not A Label!", T0)
        for seen in (long, odd, PodSeen("a", "web-1", uid, T0)):
            name = event_name(seen)
            self.assertTrue(dns.match(name) and len(name) <= 253, name)
        self.assertEqual(event_name(PodSeen("a", "web-1", uid, T0)), f"web-1.amp-bypassed.{uid}")
        self.assertNotEqual(
            event_name(PodSeen("a", "web-1", uid.replace("3", "4"), T0)), event_name(PodSeen("a", "web-1", uid, T0))
        )


class HandOverTests(ReporterTestCase):
    """The Event is the record: whoever reports next finds it."""

    def test_the_next_reporter_reports_none_of_what_the_last_one_did(self) -> None:
        pods = (seen("team-a", "p1", -20), seen("team-b", "p2", -10))
        first = self.reporter(identity="amp-0")
        first.news(Replaced(pods, "10"))
        self.settle()
        first.end_term()
        second = self.reporter(identity="amp-1")
        second.news(Replaced((*pods, seen("team-a", "p3", -5)), "20"))
        self.settle()
        self.assertEqual(self.reported(), ["team-a/p1", "team-b/p2", "team-a/p3"])
        self.assertEqual([body["reportingInstance"] for _, body in self.kube.events], ["amp-0", "amp-0", "amp-1"])
        self.assertEqual(self.counted("team-a") + self.counted("team-b"), 3)

    def test_an_event_sent_by_a_reporter_killed_before_the_answer_is_not_sent_twice(self) -> None:
        pool = PendingPool()
        killed = self.reporter(post_event=pool, identity="amp-0")
        killed.news(Replaced((seen("team-a", "p1", -20),), "10"))
        [(namespace, body, _never_answered)] = pool.posted
        self.kube.create_event(namespace, body, 1.0)  # it reached the API server
        survivor = self.reporter(identity="amp-1")
        survivor.news(Replaced((seen("team-a", "p1", -20),), "20"))
        self.assertEqual([b["reportingInstance"] for _, b in self.kube.events], ["amp-0"])
        self.assertEqual(self.counted("team-a"), 0, "the log line and count died with the process")

    def test_two_reporters_that_overlap_create_one_event(self) -> None:
        a, b = PendingPool(), PendingPool()
        self.reporter(post_event=a, identity="amp-0").news(Replaced((seen("team-a", "p1", -20),), "10"))
        self.reporter(post_event=b, identity="amp-1").news(Replaced((seen("team-a", "p1", -20),), "10"))
        for pool in (b, a):
            [(namespace, body, d)] = pool.posted
            d.callback(self.kube.create_event(namespace, body, 1.0))
        self.assertEqual([b["reportingInstance"] for _, b in self.kube.events], ["amp-1"])
        self.assertEqual(self.counted("team-a"), 1)


# ====================================================================== the Lease


class LeaseTests(SynchronousTestCase):
    """Two replicas against one in-memory API server, on one Clock."""

    DURATION = 15.0

    def setUp(self) -> None:
        self.reactor = ThreadReactor()
        self.reactor.advance(T0)
        self.kube = MemoryKube()
        self.log: list[str] = []

    def elector(self, identity: str) -> LeaseElector:
        elector = LeaseElector(
            client=self.kube,
            reactor=self.reactor,
            clock=self.reactor,
            namespace="amp-system",
            name="amp-bypass-reporter",
            identity=identity,
            duration=self.DURATION,
            request_timeout=2.0,
            on_elected=lambda: self.log.append(f"{identity} elected"),
            on_deposed=lambda: self.log.append(f"{identity} deposed"),
        )
        self.addCleanup(elector.stop)
        return elector

    def step(self, seconds: float) -> None:
        """Let time pass in small steps, running the API calls as they come."""
        end = self.reactor.seconds() + seconds
        while self.reactor.seconds() < end:
            self.reactor.pool.run()
            self.reactor.advance(min(0.5, end - self.reactor.seconds()))
        self.reactor.pool.run()

    def leaders(self, *electors: LeaseElector) -> list[str]:
        return [e.identity for e in electors if e.leader]

    def test_the_first_replica_leads_and_the_other_follows(self) -> None:
        a, b = self.elector("a"), self.elector("b")
        a.start()
        b.start()
        self.reactor.pool.run()
        self.assertEqual(self.leaders(a, b), ["a"])
        self.assertEqual(self.log, ["a elected"])
        lease = self.kube.leases[("amp-system", "amp-bypass-reporter")]
        self.assertEqual((lease["spec"]["holderIdentity"], lease["spec"]["leaseDurationSeconds"]), ("a", 15))
        self.assertEqual(lease["spec"]["acquireTime"], format_time(T0, micro=True))
        # the leader renews every third of the duration; the follower never takes over
        self.step(60)
        self.assertEqual(self.leaders(a, b), ["a"])
        lease = self.kube.leases[("amp-system", "amp-bypass-reporter")]
        self.assertGreaterEqual(parse_time(lease["spec"]["renewTime"]), T0 + 60 - self.DURATION / 3)
        self.assertEqual(self.log, ["a elected"])

    def test_a_silent_leader_is_replaced_within_the_lease_duration_and_never_overlaps(self) -> None:
        a, b = self.elector("a"), self.elector("b")
        a.start()
        self.step(6)
        b.start()
        self.step(6)
        self.assertEqual(self.leaders(a, b), ["a"])
        last_renewal = parse_time(self.kube.leases[("amp-system", "amp-bypass-reporter")]["spec"]["renewTime"])
        # a's process hangs: it makes no more API calls (b's still work)
        a._client = _Unreachable()
        overlap = False
        while not b.leader:
            self.step(0.5)
            overlap = overlap or (a.leader and b.leader)
            self.assertLess(self.reactor.seconds(), last_renewal + 2 * self.DURATION, "b never took over")
        self.assertFalse(overlap)
        self.assertLessEqual(self.reactor.seconds() - last_renewal, self.DURATION + b.retry)
        self.assertEqual(self.log, ["a elected", "a deposed", "b elected"])
        lease = self.kube.leases[("amp-system", "amp-bypass-reporter")]
        self.assertEqual((lease["spec"]["holderIdentity"], lease["spec"]["leaseTransitions"]), ("b", 1))

    def test_a_leader_that_cannot_renew_steps_down(self) -> None:
        a = self.elector("a")
        a.start()
        self.step(1)
        self.kube.lease_error = api_error(503)
        self.step(a.renew_deadline)
        self.assertEqual(self.log, ["a elected", "a deposed"])
        self.kube.lease_error = None
        self.step(a.retry)
        self.assertTrue(a.leader, "it takes its own Lease back")

    def test_stopping_releases_the_lease_to_the_next_replica(self) -> None:
        a, b = self.elector("a"), self.elector("b")
        a.start()
        self.step(1)
        b.start()
        self.step(1)
        d = a.stop()
        self.reactor.pool.run()
        self.successResultOf(d)
        self.assertIsNone(self.kube.holder())
        self.step(b.retry)
        self.assertEqual(self.leaders(a, b), ["b"])

    def test_two_replicas_racing_for_a_new_lease_elect_one(self) -> None:
        a, b = self.elector("a"), self.elector("b")
        a.start()
        b.start()
        # both read "no Lease" before either creates it
        self.assertEqual([c for c, _ in self.kube.lease_calls], [])
        self.reactor.pool.run()
        self.assertEqual(self.leaders(a, b), ["a"])
        self.assertEqual([c for c, _ in self.kube.lease_calls], ["read", "read", "create", "create"])
        self.step(30)
        self.assertEqual(self.leaders(a, b), ["a"])

    def test_api_errors_are_logged_once_per_kind(self) -> None:
        logs = LogCapture(self)
        self.kube.lease_error = api_error(403, "Forbidden")
        a = self.elector("a")
        a.start()
        self.step(20)
        self.assertFalse(a.leader)
        warnings = [e for e in logs.at(LogLevel.warn) if "error" in e]
        self.assertEqual([w["error"] for w in warnings], ["HTTP 403 Forbidden"])


class _Unreachable:
    """A client whose every call fails, as when the process can no longer reach the API server."""

    def __getattr__(self, name: str) -> Any:
        def fail(*args: Any) -> Any:
            raise api_error(503)

        return fail


# ====================================================================== wiring in the source


class SourceBypassTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.reactor = ThreadReactor()
        self.reactor.advance(T0)
        self.kube = MemoryKube()
        self.threads = Threads()
        self.metrics = Metrics()

    def start(self, **bypass: Any) -> KubernetesNamespaceSource:
        source = KubernetesNamespaceSource(
            kube_config(**bypass),
            reactor=self.reactor,
            metrics=self.metrics,
            random=lambda: 0.5,
            client_factory=lambda config: self.kube,
            spawn=self.threads,
            identity="amp-0_abc",
            wall=self.reactor.seconds,
        )
        source.startService()
        return source

    def namespaces(self, source: KubernetesNamespaceSource) -> None:
        keep = Keep(kube_config())
        obj = namespace(
            "team-a",
            labels=ENABLED,
            managedFields=[
                {
                    "manager": "kubectl",
                    "operation": "Update",
                    "time": at(-HOUR),
                    "fieldsV1": {"f:metadata": {"f:labels": {"f:amp.txn2.com/enabled": {}}}},
                }
            ],
        )
        source.watches["namespaces"].emit(Replaced({"team-a": keep.namespace(obj)}, "10"))

    def test_the_leader_watches_pods_and_reports_until_it_stops(self) -> None:
        source = self.start()
        self.assertEqual([t.name for t in self.threads.started], ["amp-namespace-watch"])
        self.namespaces(source)
        self.reactor.pool.run()
        self.assertEqual(self.kube.holder(), "amp-0_abc")
        self.assertEqual([t.name for t in self.threads.started], ["amp-namespace-watch", "amp-pod-watch"])
        watches, pod_watch = self.kube.forks
        self.assertIsNot(watches, pod_watch, "the Pod watch has a client of its own")

        pods = self.kube.listers["pods"]
        pods.stop = source.watches["pods"].stopping
        pods.lists.append(
            list_body(
                [
                    pod("team-a", "bypassed", at(-5), owner="ReplicaSet"),
                    pod("team-a", "reviewed", at(-5), annotations={"amp.txn2.com/status": "x"}),
                ],
                "20",
            )
        )
        self.threads.named("amp-pod-watch").run()
        self.assertEqual(pods.requests("list")[0]["limit"], 500)
        self.reactor.advance(SETTLE)
        self.reactor.pool.run()
        self.assertEqual([body["involvedObject"]["name"] for _, body in self.kube.events], ["bypassed"])
        self.assertEqual(sample(self.metrics, "amp_bypassed_pods_total", namespace="team-a"), 1)

        # stopping releases the Lease with the report's progress, after the threads end
        d = source.stopService()
        self.reactor.pool.run()
        self.threads.run_all()
        self.successResultOf(d)
        self.assertIsNone(self.kube.holder(), "released, though the watches' sockets were shut down")
        self.assertTrue(self.kube.closed and all(fork.closed for fork in self.kube.forks))

    def test_a_replica_that_steps_down_stops_its_pod_watch(self) -> None:
        source = self.start()
        self.namespaces(source)
        self.reactor.pool.run()
        pod_watch = source.watches["pods"]
        self.kube.lease_error = api_error(503)
        for _ in range(20):
            self.reactor.advance(1)
            self.reactor.pool.run()
        self.assertFalse(source.elector.leader)
        self.assertEqual(self.kube.forks[1].cut_calls, 1, "the Pod watch's sockets are shut down")
        self.assertEqual(self.kube.forks[0].cut_calls, 0, "the namespace watch goes on")
        # news still in flight from the old term is dropped
        pod_watch.emit(Replaced((seen("team-a", "late", -1),), "30"))
        self.reactor.advance(SETTLE)
        self.assertEqual(self.kube.events, [])
        source.stopService()
        self.threads.run_all()

    def test_a_namespace_seen_created_enabled_orders_its_pods_to_the_write(self) -> None:
        source = self.start()
        keep = Keep(kube_config())
        enabled_now = [
            {
                "manager": "gitops",
                "operation": "Update",
                "time": at(0),
                "fieldsV1": {"f:metadata": {"f:labels": {"f:amp.txn2.com/enabled": {}}}},
            }
        ]
        listed = namespace("listed", rv="9", labels=ENABLED, managedFields=enabled_now)
        source.watches["namespaces"].emit(Replaced({"listed": keep.namespace(listed)}, "10"))
        self.reactor.pool.run()
        created = namespace("created", rv="30", labels=ENABLED, managedFields=enabled_now)
        source.watches["namespaces"].emit(Changed("ADDED", keep.namespace(created), "30"))
        # both Pods in the second their namespace was enabled
        pods = source.watches["pods"]
        pods.emit(Changed("ADDED", PodSeen("created", "web", "u1", T0, "ReplicaSet", 31), "31"))
        pods.emit(Changed("ADDED", PodSeen("listed", "web", "u2", T0, "ReplicaSet", 32), "32"))
        self.reactor.advance(SETTLE)
        self.reactor.pool.run()
        messages = {body["involvedObject"]["namespace"]: body["message"] for _, body in self.kube.events}
        self.assertTrue(messages["created"].startswith("Pod was admitted without amp"), messages["created"])
        self.assertTrue(messages["listed"].startswith("Pod was possibly admitted without amp"), messages["listed"])
        source.stopService()
        self.reactor.pool.run()
        self.threads.run_all()

    def test_a_lookup_cancelled_by_the_caller_is_cancelled_not_a_failure(self) -> None:
        logs = LogCapture(self)
        for per_review_get in (False, True):
            source = KubernetesNamespaceSource(
                KubernetesConfig(source="kubeconfig", kubeconfig="/x", per_review_get=per_review_get),
                reactor=self.reactor,
                metrics=self.metrics,
                client_factory=lambda config: self.kube,
                spawn=self.threads,
            )
            source.startService()
            d = source.fetch("team-a", 2.0)
            d.cancel()
            self.failureResultOf(d, CancelledError)
            self.reactor.pool.run()
            source.stopService()
            self.threads.run_all()
        self.assertEqual(sample(self.metrics, "amp_namespace_cache_misses_total", result="cancelled"), 2)
        self.assertEqual(sample(self.metrics, "amp_namespace_cache_misses_total", result="error"), 0)
        self.assertEqual(logs.at(LogLevel.warn), [])

    def test_without_its_namespace_outside_a_cluster_the_report_is_off(self) -> None:
        logs = LogCapture(self)
        config = KubernetesConfig(source="kubeconfig", kubeconfig="/x", bypass=BypassConfig(enabled=True))
        source = KubernetesNamespaceSource(
            config, reactor=self.reactor, client_factory=lambda c: self.kube, spawn=self.threads
        )
        source.startService()
        self.assertIsNone(source.elector)
        [error] = logs.at(LogLevel.error)
        self.assertIn("kubernetes.bypass.lease_namespace", error["log_format"])
        source.stopService()
        self.threads.run_all()
