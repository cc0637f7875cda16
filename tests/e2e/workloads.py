"""Workloads for the control plane with controllers, and what to read off
them: the manifests of Deployments and Jobs whose Pods kwok's fake nodes
run, waiting for their controllers' outcome (every replica ready, every Job
complete), every Pod's amp status stamp, and the API server's own admission
and request metrics.

Shared by the end-to-end storm tests and ``bench/storm``. Blocking (the
official Kubernetes client); waits poll with a deadline (``tests.support.waiting``).
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from typing import Any, Callable, Iterable, Optional

from ..support.prometheus import Scrape
from ..support.waiting import poll_until
from .amp_process import LoopbackServer
from .controllers import TOLERATION

IMAGE = "registry.invalid/app:1"
STATUS_ANNOTATION = "amp.txn2.com/status"


def pod_template(
    app: str, *, image: str = IMAGE, annotations: Optional[dict[str, str]] = None, restart_policy: str = "Always"
) -> dict[str, Any]:
    """A Pod template with one container that kwok's fake nodes accept."""
    metadata: dict[str, Any] = {"labels": {"app": app}}
    if annotations:
        metadata["annotations"] = annotations
    return {
        "metadata": metadata,
        "spec": {
            "containers": [{"name": "app", "image": image}],
            "tolerations": [TOLERATION],
            "nodeSelector": {"type": "kwok"},
            "restartPolicy": restart_policy,
            "terminationGracePeriodSeconds": 0,
        },
    }


def deployment(
    name: str, replicas: int, *, image: str = IMAGE, max_surge: Any = "25%", max_unavailable: Any = "25%"
) -> dict[str, Any]:
    """A Deployment of ``replicas`` Pods labelled ``app: <name>``."""
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": max_surge, "maxUnavailable": max_unavailable},
            },
            "template": pod_template(name, image=image),
        },
    }


def job(name: str) -> dict[str, Any]:
    """A Job of one Pod (kwok completes it once it runs)."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "completions": 1,
            "parallelism": 1,
            "backoffLimit": 0,
            "template": pod_template(name, restart_policy="Never"),
        },
    }


def ready_replicas(apps: Any, namespace: str, name: str) -> int:
    """The Deployment's ready replicas now."""
    return apps.read_namespaced_deployment_status(name, namespace).status.ready_replicas or 0


def scale(apps: Any, namespace: str, name: str, replicas: int) -> None:
    apps.patch_namespaced_deployment_scale(name, namespace, {"spec": {"replicas": replicas}})


def rolled_out(apps: Any, namespace: str, name: str, replicas: int) -> bool:
    """Every replica is of the current template and ready, and no other is left."""
    d = apps.read_namespaced_deployment_status(name, namespace)
    s = d.status
    return bool(
        (s.observed_generation or 0) >= (d.metadata.generation or 0)
        and (s.updated_replicas or 0) == replicas
        and (s.ready_replicas or 0) == replicas
        and (s.replicas or 0) == replicas
        and (s.available_replicas or 0) == replicas
    )


def wait_rolled_out(
    apps: Any, namespace: str, name: str, replicas: int, timeout: float, details: Optional[Callable[[], str]] = None
) -> None:
    poll_until(
        f"Deployment {namespace}/{name} to have {replicas} ready replicas of its template",
        lambda: True if rolled_out(apps, namespace, name, replicas) else None,
        timeout,
        interval=0.1,
        details=details,
    )


def jobs_complete(batch: Any, namespace: str) -> int:
    """How many Jobs in ``namespace`` have succeeded."""
    return sum(1 for j in batch.list_namespaced_job(namespace).items if (j.status.succeeded or 0) >= 1)


def pods(core: Any, namespace: str, selector: Optional[str] = None) -> list[dict[str, Any]]:
    """Every Pod in ``namespace`` (as plain JSON, which is quicker than the client's models)."""
    response = core.list_namespaced_pod(namespace, label_selector=selector or "", _preload_content=False)
    return list(json.loads(response.data)["items"])


def remove_namespace(core: Any, namespace: str) -> None:
    """Delete ``namespace`` (nothing can be created in it from then on) and
    its Pods at once (grace 0, as no kubelet would finish them)."""
    core.delete_namespace(namespace)
    core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)


def stamp(pod: dict[str, Any]) -> Optional[str]:
    """amp's status stamp on a Pod, or None."""
    return ((pod.get("metadata") or {}).get("annotations") or {}).get(STATUS_ANNOTATION)


def has_env(pod: dict[str, Any], name: str) -> bool:
    """Whether every container of the Pod has the variable ``name``."""
    containers = (pod.get("spec") or {}).get("containers") or []
    return bool(containers) and all(any(e.get("name") == name for e in c.get("env") or []) for c in containers)


def env_count(pod: dict[str, Any], name: str) -> int:
    """How often ``name`` appears in the Pod's first container's env (2 would be a double mutation)."""
    containers = (pod.get("spec") or {}).get("containers") or []
    return sum(1 for e in (containers[0].get("env") or []) if e.get("name") == name) if containers else 0


def is_ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


# ------------------------------------------------------------ API server metrics


@dataclasses.dataclass(frozen=True)
class Admission:
    """The API server's own account of one webhook between two scrapes.

    ``calls`` and ``seconds`` are the exact count and sum of
    ``apiserver_admission_webhook_admission_duration_seconds``;
    ``within`` maps each bucket bound (5, 25, 100, 500 ms ...) to the calls
    that took at most that long; ``rejections`` and ``fail_open`` are the
    webhook's rejection and fail-open counts.
    """

    calls: float
    seconds: float
    within: dict[float, float]
    rejections: float
    fail_open: float

    @property
    def mean_ms(self) -> Optional[float]:
        return 1000 * self.seconds / self.calls if self.calls else None


@dataclasses.dataclass(frozen=True)
class Requests:
    """Pod creates as the API server timed them between two scrapes
    (``apiserver_request_duration_seconds``, verb POST, resource pods)."""

    count: float
    seconds: float

    @property
    def mean_ms(self) -> Optional[float]:
        return 1000 * self.seconds / self.count if self.count else None


def summed(scrape: Scrape, metric: str, labels: dict[str, str]) -> float:
    """The sum of every sample of ``metric`` whose labels include ``labels``
    (which may hold ``name``, as the API server's webhook metrics do)."""
    wanted = labels.items()
    return sum(v for (n, ls), v in scrape.samples.items() if n == metric and wanted <= ls)


def counted(scrape: Scrape, counter: str, labels: dict[str, str]) -> float:
    """The sum of the counter ``counter`` (as the API server names it) over
    the series whose labels include ``labels``.

    The text parser names every sample of a counter ``<family>_total``,
    whatever the exposition wrote: the API server's
    ``apiserver_admission_webhook_fail_open_count`` is read back as
    ``apiserver_admission_webhook_fail_open_count_total``, so its samples are
    taken from the family, never by the exposition's name."""
    family = scrape.families.get(counter[: -len("_total")] if counter.endswith("_total") else counter)
    if family is None or family.type != "counter":
        return 0.0
    wanted = labels.items()
    return sum(s.value for s in family.samples if s.name.endswith("_total") and wanted <= s.labels.items())


def _webhook_samples(scrape: Scrape, metric: str, webhook: str) -> Iterable[tuple[dict[str, str], float]]:
    return [(dict(ls), v) for (n, ls), v in scrape.samples.items() if n == metric and ("name", webhook) in ls]


def admission(before: Scrape, after: Scrape, webhook: str) -> Admission:
    """What the API server counted for ``webhook`` (its ``name``) from ``before`` to ``after``."""
    base = "apiserver_admission_webhook_admission_duration_seconds"

    def delta(metric: str, **labels: str) -> float:
        wanted = {"name": webhook, **labels}
        return summed(after, metric, wanted) - summed(before, metric, wanted)

    def counter_delta(counter: str) -> float:
        wanted = {"name": webhook}
        return counted(after, counter, wanted) - counted(before, counter, wanted)

    bounds = sorted(
        {
            float(ls["le"])
            for ls, _ in _webhook_samples(after, base + "_bucket", webhook)
            if ls.get("le") not in (None, "+Inf")
        }
    )
    return Admission(
        calls=delta(base + "_count"),
        seconds=delta(base + "_sum"),
        within={b: delta(base + "_bucket", le=_le(after, base, webhook, b)) for b in bounds},
        rejections=counter_delta("apiserver_admission_webhook_rejection_count"),
        fail_open=counter_delta("apiserver_admission_webhook_fail_open_count"),
    )


def _le(scrape: Scrape, base: str, webhook: str, bound: float) -> str:
    """The ``le`` label text the API server uses for ``bound``."""
    for ls, _ in _webhook_samples(scrape, base + "_bucket", webhook):
        if ls.get("le") not in (None, "+Inf") and float(ls["le"]) == bound:
            return ls["le"]
    return repr(bound)


def pod_creates(before: Scrape, after: Scrape) -> Requests:
    """Pod creates the API server served from ``before`` to ``after``."""
    base = "apiserver_request_duration_seconds"
    labels = {"verb": "POST", "resource": "pods", "subresource": ""}
    return Requests(
        count=after.total(base + "_count", **labels) - before.total(base + "_count", **labels),
        seconds=after.total(base + "_sum", **labels) - before.total(base + "_sum", **labels),
    )


# ------------------------------------------------------------ an endpoint that turns


class TurningEndpoint(LoopbackServer):
    """An amp endpoint (threaded, in this process) that answers its first
    ``healthy_calls`` calls at once with a patch adding the variable
    ``variable`` to the first container, and then turns:

    - ``hold``: every later call is held until ``recover()`` (at most
      ``delay`` seconds), longer than amp's endpoint timeout;
    - ``slow``: every later call is answered after ``delay`` seconds;
    - ``fail``: every later call is answered with HTTP 500.

    After ``recover()`` it answers at once again. ``calls`` counts calls.
    """

    def __init__(self, healthy_calls: int, variable: str, *, mode: str = "hold", delay: float = 60.0) -> None:
        super().__init__("turning-endpoint")
        if mode not in ("hold", "slow", "fail"):
            raise ValueError(f"mode must be hold, slow or fail, not {mode!r}")
        self._server.handle_error = lambda request, address: None  # amp hung up on a held call
        self.patch = json.dumps(
            [{"op": "add", "path": "/spec/containers/0/env", "value": [{"name": variable, "value": "storm"}]}]
        ).encode()
        self.healthy_calls = healthy_calls
        self.mode = mode
        self.delay = delay
        self.calls = 0
        self._recovered = threading.Event()

    def answer(self, path: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
        with self._lock:
            self.calls += 1
            turned = self.calls > self.healthy_calls and not self._recovered.is_set()
        if turned and self.mode == "fail":
            return 500, b'{"error": "turned"}'
        if turned and self.mode == "hold":
            self._recovered.wait(self.delay)
        elif turned:
            time.sleep(self.delay)  # the endpoint's own slowness, in its request thread
        return 200, self.patch

    def recover(self) -> None:
        self._recovered.set()

    def reset(self) -> None:
        """Healthy again for ``healthy_calls`` calls, then turning as before."""
        with self._lock:
            self.calls = 0
            self._recovered.clear()
