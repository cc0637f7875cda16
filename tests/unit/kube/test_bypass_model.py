"""
A model check of the bypassed-Pod report: generated interleavings of
replicas starting, stopping cleanly, being killed (with their last request
landing or not), Lease hand-overs, namespaces created and enabled, Pods
created reviewed or bypassing amp, and time passing, on two or three
replicas that share one in-memory API server.

Each replica is the report's real wiring (L{amp.kube._report.BypassReport}:
the Lease loop, the reporter, the verdict and the Event) on a clock and a
thread pool of its own (tests/support/memory_kube_client.py), with the namespace cache and
the enablings it saw fed as the namespace source feeds them.  The model's
API server numbers every write (resourceVersions), stamps the times in whole
seconds as the real one does, keeps Events unique by name and the Lease with
resourceVersion conflicts; its Pod watch delivers a list at each term's start
and then every Pod created, to every replica that watches.

The API server may also refuse an Event's create (503), or time out
answering it, whether or not it created the Event.

It checks, after every step: no Pod has two Events, no Pod amp reviewed has
one, and a Pod that did not bypass amp has one only as "possibly bypassed",
created in the second its namespace was enabled.  At the end, once the API
server answers and a replica has led for a while, every bypassed Pod has
exactly one Event.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from amp.config import BypassConfig, KubernetesConfig
from amp.kube._bypass import RETRY_MAX, SETTLE
from amp.kube._events import Changed, Replaced
from amp.kube._keep import Keep, format_time
from amp.kube._report import BypassReport
from amp.kube._verdict import EnableRevisions
from amp.metrics import Metrics
from amp.namespaces import UNKNOWN
from tests.support.memory_kube_client import MemoryKube, ThreadReactor, api_error, namespace, pod

T0 = 1_767_225_600.0
LEASE = 3.0
STEP = 0.25
STATUS = "amp.txn2.com/status"
LABEL = "amp.txn2.com/enabled"
CONFIG = KubernetesConfig(
    source="kubeconfig",
    kubeconfig="/nonexistent",
    request_timeout=1.0,
    bypass=BypassConfig(enabled=True, lease_namespace="amp-system", horizon=3600.0, lease_duration=LEASE),
)


class _Bridge:
    def __init__(self, replica: "Replica", handler: Callable[[Any], None]) -> None:
        self.replica, self.handler = replica, handler

    def close(self) -> None:
        if self.replica.pod_watch is self:
            self.replica.pod_watch = None


class _PodClient:
    """The term's own client: the model delivers its watch."""

    def pod_metadata(self) -> None:
        return None

    def cut(self) -> None:
        pass

    def close(self) -> None:
        pass


class _Client:
    """
    A replica's view of the shared API server; fork() gives the Pod watch's
    client.  An Event's create answers as the cluster's C{event_answers}
    says: C{ok}; C{fail} (503, not created); C{lost} (created, but the
    answer times out); C{timeout} (not created, and the answer times out).
    """

    def __init__(self, cluster: "Cluster") -> None:
        self._cluster = cluster
        self._kube = cluster.kube

    def __getattr__(self, name: str) -> Any:
        return getattr(self._kube, name)

    def create_event(self, namespace: str, body: dict[str, Any], timeout: float) -> bool:
        answers = self._cluster.event_answers
        if answers == "fail":
            raise api_error(503)
        if answers == "timeout":
            raise TimeoutError("timed out")
        created = self._kube.create_event(namespace, body, timeout)
        if answers == "lost":
            raise TimeoutError("timed out")
        return created

    def fork(self) -> _PodClient:
        return _PodClient()


class Replica:
    """One amp process: its clock, thread pool, namespace cache and report."""

    def __init__(self, cluster: "Cluster", identity: str) -> None:
        self.cluster = cluster
        self.identity = identity
        self.reactor = ThreadReactor()
        self.reactor.advance(cluster.now)
        self.metrics = Metrics()
        self.keep = Keep(CONFIG)
        self.cache: dict[str, Any] = {}
        self.enables = EnableRevisions(CONFIG)
        self.pod_watch: Optional[_Bridge] = None
        self.report = self.make_report()
        self.namespaces_listed()
        self.report.start()

    def make_report(self) -> Any:
        return BypassReport(
            config=CONFIG,
            client=_Client(self.cluster),
            reactor=self.reactor,
            clock=self.reactor,
            metrics=self.metrics,
            identity=self.identity,
            namespaces=self,
            enables=self.enables,
            own_namespace="amp-system",
            lease_namespace="amp-system",
            watch=self.watch,
            wall=self.reactor.seconds,
        )

    @property
    def reporter(self) -> Any:
        return self.report.reporter

    def namespaces_listed(self) -> None:
        items = {name: self.keep.namespace(obj) for name, obj in self.cluster.namespaces.items()}
        self.enables.replaced(self.cache, items)
        self.cache = items
        self.reporter.namespaces_listed()

    def cached(self, name: str) -> Any:
        return self.cache.get(name, UNKNOWN)

    def watch(
        self,
        name: str,
        thread_name: str,
        lister: Any,
        *,
        parse: Callable[[Any], Any],
        handler: Callable[[Any], None],
        **options: Any,
    ) -> _Bridge:
        """A term's Pod watch starts: it lists every Pod, then follows."""
        bridge = self.pod_watch = _Bridge(self, handler)
        self.parse = parse
        kept = tuple(p for p in (parse(obj) for obj in self.cluster.pods) if p is not None)
        handler(Replaced(kept, str(self.cluster.rv)))
        return bridge

    # ------------------------------------------------------------ news from the API server

    def namespace_event(self, kind: str, obj: dict[str, Any]) -> None:
        info = self.keep.namespace(obj)
        rv = obj["metadata"]["resourceVersion"]
        self.enables.changed(kind, self.cache.get(info.name), info, rv)
        self.cache[info.name] = info

    def pod_created(self, obj: dict[str, Any]) -> None:
        if self.pod_watch is not None:
            kept = self.parse(obj)
            if kept is not None:
                self.pod_watch.handler(Changed("ADDED", kept, obj["metadata"]["resourceVersion"]))


class Cluster:
    """The model's API server and what really happened."""

    def __init__(self) -> None:
        self.now = T0
        self.rv = 100
        self.kube = MemoryKube()
        self.namespaces: dict[str, dict[str, Any]] = {}
        self.enabled_at: dict[str, tuple[int, int]] = {}  # name: (revision, second)
        self.pods: list[dict[str, Any]] = []
        self.truth: dict[str, tuple[bool, bool, str, int]] = {}  # uid: (bypassed, reviewed, namespace, second)
        self.event_answers = "ok"

    def write(self) -> str:
        self.rv += 1
        return str(self.rv)

    def second(self) -> int:
        return math.floor(self.now)


class BypassModel(RuleBasedStateMachine):
    Replica = Replica

    def __init__(self) -> None:
        super().__init__()
        self.cluster = Cluster()
        self.replicas: list[Replica] = []
        self.gone: list[Replica] = []
        self.started = 0

    # ------------------------------------------------------------ replicas

    @precondition(lambda self: len(self.replicas) < 3)
    @rule()
    def start(self) -> None:
        self.started += 1
        self.replicas.append(self.Replica(self.cluster, f"amp-{self.started}"))

    @precondition(lambda self: self.replicas)
    @rule(data=st.data())
    def stop_cleanly(self, data: st.DataObject) -> None:
        replica = self.replicas.pop(data.draw(st.integers(0, len(self.replicas) - 1)))
        replica.report.stop()
        replica.reactor.pool.run()
        self.gone.append(replica)

    @precondition(lambda self: self.replicas)
    @rule(data=st.data(), landed=st.booleans())
    def kill(self, data: st.DataObject, landed: bool) -> None:
        """SIGKILL: nothing more runs; requests already sent land or not."""
        replica = self.replicas.pop(data.draw(st.integers(0, len(self.replicas) - 1)))
        if landed:
            for _, func, args, kwargs in replica.reactor.pool.queue:
                try:
                    func(*args, **kwargs)
                except Exception:
                    pass
        replica.reactor.pool.queue.clear()
        replica.pod_watch = None
        self.gone.append(replica)

    # ------------------------------------------------------------ the cluster

    @precondition(lambda self: len(self.cluster.namespaces) < 3)
    @rule(enabled=st.booleans())
    def create_namespace(self, enabled: bool) -> None:
        cluster = self.cluster
        name = f"team-{len(cluster.namespaces)}"
        rv = cluster.write()
        obj = namespace(
            name, rv=rv, labels={LABEL: "true"} if enabled else {}, creationTimestamp=format_time(cluster.second())
        )
        if enabled:
            self._managed(obj)
            cluster.enabled_at[name] = (int(rv), cluster.second())
        cluster.namespaces[name] = obj
        for replica in self.replicas:
            replica.namespace_event("ADDED", obj)

    @precondition(lambda self: any(n not in self.cluster.enabled_at for n in self.cluster.namespaces))
    @rule(data=st.data())
    def enable_namespace(self, data: st.DataObject) -> None:
        cluster = self.cluster
        name = data.draw(st.sampled_from(sorted(n for n in cluster.namespaces if n not in cluster.enabled_at)))
        obj = cluster.namespaces[name]
        rv = cluster.write()
        obj["metadata"]["resourceVersion"] = rv
        obj["metadata"]["labels"][LABEL] = "true"
        self._managed(obj)
        cluster.enabled_at[name] = (int(rv), cluster.second())
        for replica in self.replicas:
            replica.namespace_event("MODIFIED", obj)

    def _managed(self, obj: dict[str, Any]) -> None:
        obj["metadata"]["managedFields"] = [
            {
                "manager": "gitops",
                "operation": "Update",
                "time": format_time(self.cluster.second()),
                "fieldsV1": {"f:metadata": {"f:labels": {f"f:{LABEL}": {}}}},
            }
        ]

    @precondition(lambda self: self.cluster.namespaces and len(self.cluster.pods) < 12)
    @rule(data=st.data(), amp_reachable=st.booleans())
    def create_pod(self, data: st.DataObject, amp_reachable: bool) -> None:
        cluster = self.cluster
        ns = data.draw(st.sampled_from(sorted(cluster.namespaces)))
        enabled = ns in cluster.enabled_at
        reviewed = enabled and amp_reachable
        name = f"p{len(cluster.pods)}"
        obj = pod(
            ns,
            name,
            format_time(cluster.second()),
            rv=cluster.write(),
            owner="ReplicaSet",
            annotations={STATUS: "mutated"} if reviewed else None,
        )
        cluster.truth[obj["metadata"]["uid"]] = (enabled and not reviewed, reviewed, ns, cluster.second())
        cluster.pods.append(obj)
        for replica in self.replicas:
            replica.pod_created(obj)

    @rule(answers=st.sampled_from(["ok", "ok", "fail", "lost", "timeout"]))
    def event_answers(self, answers: str) -> None:
        self.cluster.event_answers = answers

    @rule(seconds=st.sampled_from([0.1, 0.5, 1.0, 2.0, 5.0]))
    def wait(self, seconds: float) -> None:
        self.advance(seconds)

    def advance(self, seconds: float) -> None:
        end = self.cluster.now + seconds
        while self.cluster.now < end:
            step = min(STEP, end - self.cluster.now)
            self.cluster.now += step
            for replica in list(self.replicas):
                replica.reactor.pool.run()
                replica.reactor.advance(step)
                replica.reactor.pool.run()

    # ------------------------------------------------------------ what must hold

    def events(self) -> dict[str, list[dict[str, Any]]]:
        found: dict[str, list[dict[str, Any]]] = {}
        for _, body in self.cluster.kube.events:
            found.setdefault(body["involvedObject"]["uid"], []).append(body)
        return found

    @invariant()
    def at_most_one_event_and_none_unearned(self) -> None:
        for uid, bodies in self.events().items():
            bypassed, reviewed, ns, second = self.cluster.truth[uid]
            assert len(bodies) == 1, f"{len(bodies)} Events for Pod {uid}"
            assert not reviewed, f"an Event for Pod {uid}, which amp reviewed"
            if not bypassed:
                same_second = self.cluster.enabled_at.get(ns, (0, None))[1] == second
                assert same_second and "possibly" in bodies[0]["message"], (
                    f"Pod {uid} did not bypass amp: {bodies[0]['message']}"
                )

    def teardown(self) -> None:
        if not self.cluster.pods:
            return
        self.cluster.event_answers = "ok"
        if not self.replicas:
            self.start()
        self.advance(3 * LEASE + 3 * SETTLE + RETRY_MAX)
        events = self.events()
        for uid, (bypassed, *_) in self.cluster.truth.items():
            if bypassed:
                assert len(events.get(uid, ())) == 1, f"bypassed Pod {uid} has {len(events.get(uid, ()))} Events"
        self.at_most_one_event_and_none_unearned()


BypassModel.TestCase.settings = settings(
    max_examples=100, stateful_step_count=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

#: The model check, as a test of the suite.
BypassModelTests = BypassModel.TestCase
