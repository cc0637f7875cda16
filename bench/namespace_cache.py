"""
Measure the Kubernetes namespace cache (amp.kube) on loopback, against the
fake API server from tests/support/fake_apiserver.py:

  - memory held by the cache for N namespaces (tracemalloc), against keeping
    the parsed JSON objects or the kubernetes client's models;
  - time from start to the first list landing in the cache;
  - events applied per second through the whole bridge (fake server ->
    watch thread -> callFromThread -> cache), live and when a resumed watch
    replays a backlog, and the cost of each stage on its own;
  - the time of one cached() lookup.

Usage: python bench/namespace_cache.py [--namespaces 10000] [--events 20000]
Prints a table; nothing leaves 127.0.0.1.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import tempfile
import threading
import time
import tracemalloc
from typing import Any, Callable

import kubernetes.client
from twisted.internet.defer import Deferred, inlineCallbacks
from twisted.internet.task import react

from amp.config import KubernetesConfig
from amp.kube import KubernetesNamespaceSource
from amp.kube._events import Changed, WatchEvent
from amp.kube._keep import Keep
from amp.metrics import Metrics
from tests.support.fake_apiserver import FakeKube
from tests.support.waiting import wait_until

NS_PATH = "/api/v1/namespaces"
LAST_APPLIED = json.dumps(
    {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "labels": {"team": "x", "env": "prod", "cost-center": "1234"},
            "annotations": {"owner": "someone@example.com", "description": "a namespace " * 20},
        },
    }
)


def populate(fake: FakeKube, n: int) -> None:
    """n namespaces shaped like a real cluster's: a few labels, some
    annotations amp ignores (half carry a kubectl last-applied copy), one in
    ten enabled for amp with an endpoint."""
    for i in range(n):
        labels = {"team": f"team-{i % 97}", "env": ("prod", "staging", "dev")[i % 3]}
        annotations = {"owner": f"owner-{i % 211}@example.com"}
        if i % 2 == 0:
            annotations["kubectl.kubernetes.io/last-applied-configuration"] = LAST_APPLIED
        if i % 10 == 0:
            labels["amp.txn2.com/enabled"] = "true"
            annotations["amp.txn2.com/ep"] = f"http://ep-{i % 7}.amp-endpoints.svc:8080/mutate"
        fake.add_namespace(f"ns-{i:05d}", labels=labels, annotations=annotations)


def list_body(fake: FakeKube) -> bytes:
    import http.client

    connection = http.client.HTTPConnection("127.0.0.1", fake.port, timeout=30)
    try:
        connection.request("GET", NS_PATH)
        return connection.getresponse().read()
    finally:
        connection.close()


def traced(make: Callable[[], Any]) -> tuple[Any, int]:
    """What make() returns and the bytes it still holds once built."""
    gc.collect()
    tracemalloc.start()
    try:
        value = make()
        gc.collect()
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    return value, held


def memory(fake: FakeKube, keep: Keep) -> list[tuple[str, str]]:
    body = list_body(fake)
    n = len(json.loads(body)["items"])
    cache, cache_bytes = traced(lambda: keep.namespaces(keep.namespace(o) for o in json.loads(body)["items"]))
    assert len(cache) == n
    del cache
    raw, raw_bytes = traced(lambda: json.loads(body))
    del raw
    api = kubernetes.client.ApiClient(kubernetes.client.Configuration())
    text = body.decode("utf-8")
    models, model_bytes = traced(lambda: api.deserialize(text, "V1NamespaceList", "application/json"))
    del models
    api.close()
    mib = 1024 * 1024
    return [
        (f"list body on the wire ({n} namespaces)", f"{len(body) / mib:.2f} MiB"),
        ("cache (amp.kube: label + amp annotations)", f"{cache_bytes / mib:.2f} MiB  ({cache_bytes / n:.0f} B/ns)"),
        ("  vs. parsed JSON objects", f"{raw_bytes / mib:.2f} MiB  ({raw_bytes / n:.0f} B/ns)"),
        ("  vs. kubernetes client models", f"{model_bytes / mib:.2f} MiB  ({model_bytes / n:.0f} B/ns)"),
    ]


class CountingSource(KubernetesNamespaceSource):
    """Counts applied watch events and fires a Deferred at a target."""

    applied = 0
    target = 0
    reached: Deferred | None = None
    first_at = 0.0

    def _namespace_news(self, event: WatchEvent) -> None:
        super()._namespace_news(event)
        if isinstance(event, Changed):
            self.applied += 1
            if not self.first_at:
                self.first_at = time.perf_counter()
            if self.reached is not None and self.applied >= self.target:
                d, self.reached = self.reached, None
                d.callback(time.perf_counter())

    def expect(self, more: int) -> Deferred:
        self.target = self.applied + more
        self.first_at = 0.0
        self.reached = Deferred()
        return self.reached


def in_thread(reactor: Any, work: Callable[[], Any]) -> Deferred:
    d: Deferred = Deferred()

    def run() -> None:
        result = work()
        reactor.callFromThread(d.callback, result)

    threading.Thread(target=run, daemon=True).start()
    return d


def updates(fake: FakeKube, names: list[str], m: int) -> Callable[[], float]:
    def work() -> float:
        started = time.perf_counter()
        for i in range(m):
            name = names[i % len(names)]
            fake.update_namespace(name, annotations={"amp.txn2.com/ep": f"http://ep-{i}.x.svc:80/m"})
        return time.perf_counter() - started

    return work


def stages(keep: Keep, source: KubernetesNamespaceSource, fake: FakeKube, m: int) -> list[tuple[str, str]]:
    """Each stage alone: parsing an event line in the thread, applying it on the reactor."""
    obj = fake.get_namespace("ns-00000")
    line = json.dumps({"type": "MODIFIED", "object": obj}).encode()
    started = time.perf_counter()
    for _ in range(m):
        event = json.loads(line)
        keep.namespace(event["object"])
    parse = (time.perf_counter() - started) / m
    info = keep.namespace(obj)
    started = time.perf_counter()
    for _ in range(m):
        source._namespace_news(Changed("MODIFIED", info, info.resource_version))
    apply = (time.perf_counter() - started) / m
    return [
        ("  thread: parse one event line", f"{parse * 1e6:.1f} us  ({1 / parse:,.0f}/s)"),
        ("  reactor: apply one event", f"{apply * 1e6:.1f} us  ({1 / apply:,.0f}/s)"),
    ]


def lookups(source: KubernetesNamespaceSource, names: list[str], rounds: int) -> list[tuple[str, str]]:
    cached = source.cached
    out = []
    for label, keys in (("cached() hit", names), ("cached() unknown name", [f"x-{n}" for n in names])):
        started = time.perf_counter()
        for _ in range(rounds):
            for k in keys:
                cached(k)
        per = (time.perf_counter() - started) / (rounds * len(keys))
        out.append((label, f"{per * 1e9:.0f} ns"))
    return out


@inlineCallbacks
def main(reactor: Any, options: argparse.Namespace) -> Any:
    rows: list[tuple[str, str]] = []
    fake = FakeKube(request_log_limit=1000).start()
    tmp = tempfile.mkdtemp(prefix="amp-bench-")
    kubeconfig = os.path.join(tmp, "kubeconfig")
    with open(kubeconfig, "w") as f:
        f.write(f"""apiVersion: v1
kind: Config
clusters: [{{name: fake, cluster: {{server: "{fake.url}"}}}}]
users: [{{name: amp, user: {{token: t}}}}]
contexts: [{{name: fake, context: {{cluster: fake, user: amp}}}}]
current-context: fake
""")
    config = KubernetesConfig(source="kubeconfig", kubeconfig=kubeconfig, watch_timeout=600.0)
    keep = Keep(config)
    source = CountingSource(config, reactor=reactor, metrics=Metrics())
    try:
        started = time.perf_counter()
        populate(fake, options.namespaces)
        rows.append(("create namespaces on the fake server", f"{time.perf_counter() - started:.2f} s"))
        rows += memory(fake, keep)

        started = time.perf_counter()
        source.startService()
        yield wait_until(lambda: source.readiness()[0], 60, "the first list", clock=reactor)
        rows.append(("start -> first list in the cache (ready)", f"{time.perf_counter() - started:.2f} s"))
        yield wait_until(lambda: fake.open_watches() == 1, 10, "the watch", clock=reactor)
        names = sorted(source._cache)

        m = options.events
        done = source.expect(m)
        started = time.perf_counter()
        produce = yield in_thread(reactor, updates(fake, names, m))
        finished = yield done
        live = finished - started
        rows.append(
            (
                f"live: {m} updates, server commit -> cache",
                f"{m / live:,.0f} events/s  (server alone commits {m / produce:,.0f}/s)",
            )
        )

        # backlog: hold the resumed watch at the server while changes pile up
        hold = produce * 2 + 1.0
        watches = fake.count(NS_PATH, watch=True)
        fake.set_delay(hold, NS_PATH)
        fake.drop_watches()
        yield in_thread(reactor, lambda: fake.wait_for_requests(watches + 1, NS_PATH, watch=True, timeout=10))
        fake.set_delay(0)
        done = source.expect(m)
        committed = yield in_thread(reactor, updates(fake, names, m))
        assert source.applied == source.target - m, "the watch resumed before the backlog was complete"
        finished = yield done
        rows.append(
            (
                f"backlog: resumed watch replays {m} events",
                f"{m / (finished - source.first_at):,.0f} events/s  (held {hold:.1f}s, commit took {committed:.1f}s)",
            )
        )
        rows += stages(keep, source, fake, 20000)
        rows += lookups(source, names, options.rounds)
        rows.append(("namespaces held", f"{source.count}"))
    finally:
        if source.running:
            yield source.stopService()
        fake.stop()
    width = max(len(r[0]) for r in rows)
    print(f"{'measure':<{width}}  value")
    print(f"{'-' * width}  {'-' * 40}")
    for label, value in rows:
        print(f"{label:<{width}}  {value}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--namespaces", type=int, default=10_000)
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=20)
    opts = parser.parse_args()
    react(lambda reactor: main(reactor, opts))
