"""
bench/storm's scenarios and what one run of one measures.

A run is one scenario against one target in a namespace of its own:

  - C{scale-up}: a Deployment of no replicas scaled to N at once;
  - C{rolling}: a Deployment of R ready replicas given a new template (a
    rolling update: every Pod replaced, 25% surge);
  - C{jobs}: J Jobs created at once, until every one has succeeded;
  - C{slow}, C{fail}: the scale-up with amp's endpoint turning slow (each
    call then takes C{--slow} seconds, just under amp's endpoint timeout) or
    failing (HTTP 500) after half of the Pods.

What is measured comes from the API server's own metrics (exact sums and
counts of its webhook admission duration, its webhook rejection and
fail-open counts, its Pod create request duration), scraped before and
after the run and every second during it (the series of the picture), from
the controllers' outcome (wall time from the change until every replica is
ready or every Job done, polled every 0.1 s), from the Pods (status stamps)
and from amp (its CPU, its own latency histograms).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Optional

from bench.harness import say
from bench.storm_plane import STATUS, StormCluster, Target
from tests.e2e import workloads
from tests.support.prometheus import Scrape

SCENARIOS = ("scale-up", "rolling", "jobs", "slow", "fail")
#: The only series bench/storm reads, so a scrape is cheap to parse.
PREFIXES = (
    "apiserver_admission_webhook_",
    "apiserver_request_duration_seconds_count{",
    "apiserver_request_duration_seconds_sum{",
    "apiserver_admission_controller_admission_duration_seconds_",
    "apiserver_admission_step_admission_duration_seconds_",
)
POD_CREATE = ('resource="pods"', 'verb="POST"', 'subresource=""')
SETTLE = 600.0


def scrape(cluster: StormCluster) -> Scrape:
    """The API server's metrics that bench/storm reads (Pod creates only, of
    the request metrics)."""
    assert cluster.plane is not None
    text = cluster.plane.get("/metrics").decode()
    keep = [
        line
        for line in text.splitlines()
        if line.startswith(PREFIXES)
        and (not line.startswith("apiserver_request_") or all(p in line for p in POD_CREATE))
    ]
    return Scrape("\n".join(keep) + "\n")


class Sampler(threading.Thread):
    """Scrapes every C{interval} seconds: (seconds since start, Pod creates
    count and sum, the webhook's calls and sum)."""

    def __init__(self, cluster: StormCluster, webhook: Optional[str], interval: float = 1.0) -> None:
        super().__init__(name="storm-sampler", daemon=True)
        self.cluster, self.webhook, self.interval = cluster, webhook, interval
        self.points: list[tuple[float, float, float, float, float]] = []
        self._done = threading.Event()
        self.started = time.monotonic()

    def point(self) -> tuple[float, float, float, float, float]:
        s = scrape(self.cluster)
        base = "apiserver_admission_webhook_admission_duration_seconds"
        hook = {"name": self.webhook} if self.webhook else None
        return (
            time.monotonic() - self.started,
            s.total("apiserver_request_duration_seconds_count"),
            s.total("apiserver_request_duration_seconds_sum"),
            workloads.summed(s, base + "_count", hook) if hook else 0.0,
            workloads.summed(s, base + "_sum", hook) if hook else 0.0,
        )

    def run(self) -> None:
        while not self._done.is_set():
            try:
                self.points.append(self.point())
            except Exception as e:  # a missed sample is a gap in the picture, not a failed run
                say(f"sample failed: {e}")
            self._done.wait(self.interval)

    def finish(self) -> list[dict[str, Any]]:
        self._done.set()
        self.join()
        series = []
        for (_t0, c0, s0, w0, ws0), (t1, c1, s1, w1, ws1) in zip(self.points, self.points[1:]):
            series.append(
                {
                    "t": round(t1, 2),
                    "creates": c1 - c0,
                    "create_ms": round(1000 * (s1 - s0) / (c1 - c0), 2) if c1 > c0 else None,
                    "webhook_calls": w1 - w0,
                    "webhook_ms": round(1000 * (ws1 - ws0) / (w1 - w0), 2) if w1 > w0 else None,
                }
            )
        return series


def histogram_quantile(before: Scrape, after: Scrape, name: str, q: float, **labels: str) -> Optional[float]:
    """The q-quantile (ms) of a histogram's increase, linearly interpolated in its buckets."""
    bounds: dict[float, float] = {}
    for (n, ls), v in after.samples.items():
        d = dict(ls)
        if n == name + "_bucket" and labels.items() <= d.items() and d.get("le") != "+Inf":
            le = float(d["le"])
            b = before.total(name + "_bucket", **labels, le=d["le"])
            bounds[le] = bounds.get(le, 0.0) + v - b
    total = after.total(name + "_count", **labels) - before.total(name + "_count", **labels)
    if not total:
        return None
    rank, lower, below = q * total, 0.0, 0.0
    for le in sorted(bounds):
        if bounds[le] >= rank:
            inside = bounds[le] - below
            return 1000 * (lower + (le - lower) * ((rank - below) / inside if inside else 1.0))
        lower, below = le, bounds[le]
    return None


def _mean_ms(before: Scrape, after: Scrape, name: str, **labels: str) -> Optional[float]:
    count = after.total(name + "_count", **labels) - before.total(name + "_count", **labels)
    total = after.total(name + "_sum", **labels) - before.total(name + "_sum", **labels)
    return round(1000 * total / count, 3) if count else None


def amp_figures(target: Target, before: Scrape, after: Scrape, cpu: float, pods: int) -> dict[str, Any]:
    """amp's own view of a run: its answer latency and its endpoint calls."""
    review, call = "amp_admission_duration_seconds", "amp_endpoint_duration_seconds"
    results = {
        r: after.total("amp_admission_requests_total", result=r)
        - before.total("amp_admission_requests_total", result=r)
        for r in ("patched", "allowed", "ignored", "failed", "skipped")
    }
    return {
        "cpu_s": round(cpu, 3),
        "cpu_ms_per_pod": round(1000 * cpu / pods, 3) if pods else None,
        "answer_mean_ms": _mean_ms(before, after, review),
        "answer_p99_ms": histogram_quantile(before, after, review, 0.99),
        "endpoint_mean_ms": _mean_ms(before, after, call),
        "endpoint_p99_ms": histogram_quantile(before, after, call, 0.99),
        "results": {k: v for k, v in results.items() if v},
    }


def stamps(pods: list[dict[str, Any]]) -> dict[str, int]:
    """How many Pods carry each stamp (its first two words: C{skipped timeout}), C{(none)} for none."""
    found: dict[str, int] = {}
    for pod in pods:
        stamp = ((pod.get("metadata") or {}).get("annotations") or {}).get(STATUS)
        words = stamp.split() if stamp else ["(none)"]
        key = words[0] if words[0] != "skipped" else " ".join(words[:2])
        found[key] = found.get(key, 0) + 1
    return found


class Runner:
    """Runs scenarios against targets on one StormCluster."""

    def __init__(self, cluster: StormCluster, *, pods: int, rolling: int, jobs: int, slow: float) -> None:
        from kubernetes import client

        assert cluster.plane is not None
        self.cluster = cluster
        self.core = client.CoreV1Api(cluster.plane.admin_client())
        self.apps = client.AppsV1Api(cluster.plane.admin_client())
        self.batch = client.BatchV1Api(cluster.plane.admin_client())
        self.pods, self.rolling, self.jobs, self.slow = pods, rolling, jobs, slow
        self.serial = 0

    # -- scenarios: (setup, act) in a namespace; act returns the Pods the run made

    def _scale_up(self, ns: str) -> tuple[Callable[[], None], Callable[[], int]]:
        def setup() -> None:
            self.apps.create_namespaced_deployment(ns, workloads.deployment("web", 0))

        def act() -> int:
            workloads.scale(self.apps, ns, "web", self.pods)
            workloads.wait_rolled_out(self.apps, ns, "web", self.pods, SETTLE)
            return self.pods

        return setup, act

    def _rolling(self, ns: str) -> tuple[Callable[[], None], Callable[[], int]]:
        def setup() -> None:
            self.apps.create_namespaced_deployment(ns, workloads.deployment("web", self.rolling))
            workloads.wait_rolled_out(self.apps, ns, "web", self.rolling, SETTLE)

        def act() -> int:
            self.apps.patch_namespaced_deployment(
                "web",
                ns,
                {"spec": {"template": {"metadata": {"annotations": {"bench.amp.txn2.com/rollout": str(self.serial)}}}}},
            )
            workloads.wait_rolled_out(self.apps, ns, "web", self.rolling, SETTLE)
            return self.rolling

        return setup, act

    def _jobs(self, ns: str) -> tuple[Callable[[], None], Callable[[], int]]:
        def act() -> int:
            for i in range(self.jobs):
                self.batch.create_namespaced_job(ns, workloads.job(f"job-{i}"))
            from tests.support.waiting import poll_until

            poll_until(
                f"{self.jobs} Jobs to succeed",
                lambda: workloads.jobs_complete(self.batch, ns) == self.jobs or None,
                SETTLE,
                interval=0.1,
            )
            return self.jobs

        return (lambda: None), act

    # -- one run

    def run(self, scenario: str, target: Target, round_no: int) -> dict[str, Any]:
        assert self.cluster.plane is not None
        self.serial += 1
        ns = f"storm-{self.serial}-{scenario}-{target.name}"
        self.cluster.plane.create_namespace(ns, labels=target.labels or None, annotations=target.annotations or None)
        setup, act = {
            "scale-up": self._scale_up,
            "slow": self._scale_up,
            "fail": self._scale_up,
            "rolling": self._rolling,
            "jobs": self._jobs,
        }[scenario](ns)
        try:
            setup()
            if target.prepare is not None:
                target.prepare(ns)
            before = scrape(self.cluster)
            amp_before = target.amp_metrics() if target.amp else None
            cpu_before = target.cpu_seconds()
            sampler = Sampler(self.cluster, target.webhook)
            sampler.start()
            started = time.monotonic()
            made = act()
            ready_s = time.monotonic() - started
            series = sampler.finish()
            cpu = (target.cpu_seconds() or 0.0) - (cpu_before or 0.0)
            after = scrape(self.cluster)
            pods = workloads.pods(self.core, ns)
            result: dict[str, Any] = {
                "scenario": scenario,
                "target": target.name,
                "round": round_no,
                "pods": made,
                "ready_s": round(ready_s, 3),
                "creates": _counted(before, after),
                "stamps": stamps(pods),
                "series": series,
            }
            if target.webhook:
                seen = workloads.admission(before, after, target.webhook)
                result["webhook"] = {
                    "calls": seen.calls,
                    "mean_ms": round(seen.mean_ms, 3) if seen.mean_ms else None,
                    "within_ms": {f"{1000 * b:g}": v for b, v in seen.within.items()},
                    "rejections": seen.rejections,
                    "fail_open": seen.fail_open,
                }
            if amp_before is not None:
                result["amp"] = amp_figures(target, amp_before, target.amp_metrics(), cpu, made)
            say(
                f"{scenario} on {target.name} (round {round_no}): {made} Pods ready in {ready_s:.2f}s, "
                f"create mean {result['creates']['mean_ms']} ms, stamps {result['stamps']}"
                + (f", webhook mean {result['webhook']['mean_ms']} ms" if target.webhook else "")
            )
            return result
        finally:
            self.delete(ns)

    def delete(self, ns: str) -> None:
        """Delete the namespace (no Pod can be created in it from then on) and
        its Pods at once (grace 0), and wait until no Pod is left: the next
        run starts with nothing of this one's still being deleted."""
        from tests.support.waiting import poll_until

        workloads.remove_namespace(self.core, ns)
        poll_until(
            f"the Pods of namespace {ns} to be deleted",
            lambda: not self.core.list_namespaced_pod(ns, limit=1).items or None,
            SETTLE,
            interval=0.5,
        )


def _counted(before: Scrape, after: Scrape) -> dict[str, Any]:
    count = after.total("apiserver_request_duration_seconds_count") - before.total(
        "apiserver_request_duration_seconds_count"
    )
    total = after.total("apiserver_request_duration_seconds_sum") - before.total(
        "apiserver_request_duration_seconds_sum"
    )
    return {"count": count, "mean_ms": round(1000 * total / count, 3) if count else None}
