"""End-to-end: the bypassed-Pod report against a real kube-apiserver.

amp runs with the RBAC from ``deploy/`` (the session's ClusterRole, and here
the Lease Role of ``deploy/base/role.yaml`` in amp's own namespace), the
report on, and its webhook registered with ``failurePolicy: Ignore``.  While
amp is stopped the API server cannot reach it and admits Pods unchanged;
once amp is back, each of those Pods gets its ``AmpBypassed`` Event and is
counted, while the Pods amp reviewed (stamped), a Pod that opted out and a
Pod created before its namespace was enabled are not.  A second restart
reports only what was created during the second outage: no Pod twice.

The second scenario runs two replicas as an operator's week would: the
webhook unreachable while both run (Pods bypass amp in namespaces created or
enabled in the same second as the Pods), the Lease holder killed, then a
rolling restart of both; every bypassed Pod has one Event (``count`` 1),
the Pods amp mutated none.

The scenarios print the time from amp's restart to the first Event, and the
hand-over times: from the holder's kill, and from each clean stop, to the
next holder.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any, Callable, Optional

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from ..support.waiting import poll_until
from .amp_process import (
    ENABLED_LABEL,
    LOOPBACK,
    AmpInstance,
    AmpProcess,
    ExampleEndpoints,
    closed_port,
    free_port,
    pod_manifest,
    unique,
)
from .cluster import ControlPlane
from .conftest import LEASE_NAME

pytestmark = pytest.mark.e2e

REASON = "AmpBypassed"
WAIT = 30.0


@pytest.fixture
def core(control_plane: ControlPlane) -> client.CoreV1Api:
    return client.CoreV1Api(control_plane.admin_client())


@pytest.fixture
def reporting_amp(
    control_plane: ControlPlane,
    amp_kubeconfig: Path,
    example_endpoints: ExampleEndpoints,
    lease_rbac: str,
    tmp_path: Path,
) -> Callable[..., AmpInstance]:
    """Makes an amp instance with the report on (its Lease in ``lease_rbac``'s
    namespace, lasting ``lease_duration``), registered with ``failurePolicy:
    Ignore``; ``overrides`` as for ``AmpInstance``."""

    def make(instance: str, lease_duration: str, **overrides: Any) -> AmpInstance:
        bypass = {"enabled": True, "lease_namespace": lease_rbac, "lease_duration": lease_duration}
        return AmpInstance(
            control_plane,
            amp_kubeconfig,
            example_endpoints,
            tmp_path,
            instance,
            webhook_failure_policy="Ignore",
            overrides={**overrides, "kubernetes": {"bypass": bypass}},
        )

    return make


def bypass_events(core: client.CoreV1Api, namespace: str) -> dict[str, list[Any]]:
    """The AmpBypassed Events in ``namespace``, by Pod name."""
    found: dict[str, list[Any]] = {}
    for event in core.list_namespaced_event(namespace, field_selector=f"reason={REASON}").items:
        found.setdefault(event.involved_object.name, []).append(event)
    return found


def create(core: client.CoreV1Api, namespace: str, name: str, **kwargs: Any) -> dict[str, Any]:
    pod = core.create_namespaced_pod(namespace, pod_manifest(name, **kwargs))
    return pod.metadata.annotations or {}


def lease_holder(admin: Any, namespace: str) -> Optional[str]:
    try:
        lease = client.CoordinationV1Api(admin).read_namespaced_lease(LEASE_NAME, namespace)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return lease.spec.holder_identity or None


def test_pods_created_while_amp_was_down_are_reported_once_after_it_restarts(
    reporting_amp: Callable[..., AmpInstance], lease_rbac: str, core: client.CoreV1Api
) -> None:
    amp = reporting_amp("bypass", "6s", metrics={"port": free_port(), "interface": LOOPBACK})
    process = amp.process
    endpoint = amp.examples.url("user-env")
    # Enabled well before any Pod is created in it (amp's start takes
    # seconds): the report compares whole seconds.
    team = amp.namespace(unique("bypass"), endpoint)
    late = amp.namespace(unique("bypass-late"), endpoint, enabled=False)
    try:
        amp.start()

        first_holder = poll_until(
            "amp to take the Lease", lambda: lease_holder(amp.admin, lease_rbac), WAIT, details=process.describe
        )

        # amp up: it reviews (and stamps) this one; the other namespace is
        # not enabled yet, so nobody reviews its Pod
        reviewed = create(core, team, "reviewed")
        assert "amp.txn2.com/status" in reviewed, reviewed
        create(core, late, "before-enabling")

        # amp down: the API server fails open
        process.stop()
        assert process.stopped_cleanly(), process.describe()
        core.patch_namespace(late, {"metadata": {"labels": {ENABLED_LABEL: "true"}}})
        for name in ("bypassed-1", "bypassed-2"):
            assert "amp.txn2.com/status" not in create(core, team, name)
        create(core, team, "opted-out", labels={ENABLED_LABEL: "false"})

        restarted = time.monotonic()
        process.start()

        def reported() -> Optional[dict[str, list[Any]]]:
            events = bypass_events(core, team)
            return events if {"bypassed-1", "bypassed-2"} <= set(events) else None

        events = poll_until("the AmpBypassed Events", reported, WAIT, interval=0.05, details=process.describe)
        seconds = time.monotonic() - restarted
        print(f"\namp restart -> AmpBypassed Event on the bypassed Pods: {seconds:.2f}s")
        process.wait_healthy(process.port, "/readyz", process.client_context(), WAIT)

        assert sorted(events) == ["bypassed-1", "bypassed-2"], sorted(events)
        for name in ("bypassed-1", "bypassed-2"):
            [event] = events[name]
            assert (event.type, event.involved_object.kind, event.involved_object.namespace) == ("Warning", "Pod", team)
            assert "admitted without amp" in event.message and "Delete and create the Pod again" in event.message
        # created before the namespace was enabled: not reported, unless in
        # the same second, where amp cannot tell the order and says so
        before = core.read_namespaced_pod("before-enabling", late).metadata.creation_timestamp
        if int(before.timestamp()) < label_second(core, late):
            assert bypass_events(core, late) == {}
        else:
            [[event]] = bypass_events(core, late).values()
            assert "possibly admitted without amp" in event.message, event.message
        assert process.metric("amp_bypassed_pods_total", namespace=team) == 2
        log = process.log_text()
        assert f"Pod {team}/bypassed-1 was created without amp's review" in log
        assert f"{team}/reviewed was created" not in log and f"{team}/opted-out was created" not in log

        # A second outage: only what was created during it is reported,
        # by the next amp, which takes over the released Lease.
        process.stop()
        assert process.stopped_cleanly(), process.describe()
        create(core, team, "bypassed-3")
        process.start()
        events = poll_until(
            "the third Event",
            lambda: (e := bypass_events(core, team)) and ("bypassed-3" in e and e or None),
            WAIT,
            details=process.describe,
        )
        process.wait_healthy(process.port, "/readyz", process.client_context(), WAIT)
        assert {name: len(found) for name, found in events.items()} == {
            "bypassed-1": 1,
            "bypassed-2": 1,
            "bypassed-3": 1,
        }
        assert process.metric("amp_bypassed_pods_total", namespace=team) == 1
        second_holder = lease_holder(amp.admin, lease_rbac)
        assert second_holder is not None and second_holder != first_holder
    finally:
        status = amp.close()
        assert process.stopped_cleanly(), f"amp did not stop cleanly (status {status})\n{process.describe()}"


def label_second(core: client.CoreV1Api, namespace: str) -> int:
    """The whole second of the last write to the namespace's enable label (its managed fields)."""
    ns = core.read_namespace(namespace)
    times = [
        entry.time
        for entry in ns.metadata.managed_fields or ()
        if f"f:{ENABLED_LABEL}" in ((entry.fields_v1 or {}).get("f:metadata") or {}).get("f:labels", {})
    ]
    return int(max(times).timestamp())


def same_second_pods(core: client.CoreV1Api, make_namespace: Any, prefix: str, count: int) -> dict[str, list[str]]:
    """Namespaces enabled (by ``make_namespace``) and, in the same second,
    given ``count`` Pods; the Pods by namespace.  A try whose first Pod
    lands in the next second is kept (its Pods bypassed amp too) and
    followed by another."""
    made: dict[str, list[str]] = {}
    for _ in range(5):
        namespace = make_namespace(unique(prefix))
        names = [f"{prefix}-{i}" for i in range(count)]
        created = [core.create_namespaced_pod(namespace, pod_manifest(name)) for name in names]
        made[namespace] = names
        assert all("amp.txn2.com/status" not in (p.metadata.annotations or {}) for p in created)
        if int(created[0].metadata.creation_timestamp.timestamp()) == label_second(core, namespace):
            return made
    raise AssertionError(f"no namespace enabled in the same second as its first Pod in 5 tries: {made}")


def test_two_replicas_a_kill_and_a_rolling_restart_report_each_bypassed_pod_once(
    reporting_amp: Callable[..., AmpInstance], lease_rbac: str, core: client.CoreV1Api
) -> None:
    amp = reporting_amp("handover", "4s")
    config = dict(amp.process.config, listen={"port": free_port(), "interface": LOOPBACK})
    replicas = [amp.process, AmpProcess(f"{amp.process.name}-b", amp.workdir, config, amp.control_plane.ca_pem)]
    endpoint = amp.examples.url("user-env")
    team = amp.namespace(unique("handover"), endpoint)
    admin = amp.admin
    hooks = client.AdmissionregistrationV1Api(admin)

    def holder_process(identity: str) -> AmpProcess:
        [process] = [p for p in replicas if f"This replica ({identity}) now leads" in p.log_text()]
        return process

    def new_holder(old: str) -> str:
        return poll_until(
            "another replica to take the Lease",
            lambda: (h := lease_holder(admin, lease_rbac)) and h != old and h or None,
            WAIT,
            interval=0.05,
            details=lambda: "\n".join(p.describe() for p in replicas),
        )

    def enabled_namespace(name: str) -> str:
        return amp.namespace(name, endpoint)

    def enabled_later(name: str) -> str:
        amp.namespace(name, endpoint, enabled=False)
        core.patch_namespace(name, {"metadata": {"labels": {ENABLED_LABEL: "true"}}})
        return name

    try:
        amp.start()
        replicas[1].start_and_wait(WAIT)
        holder = poll_until(
            "a replica to take the Lease",
            lambda: lease_holder(admin, lease_rbac),
            WAIT,
            details=lambda: "\n".join(p.describe() for p in replicas),
        )
        mutated = create(core, team, "mutated")
        assert "amp.txn2.com/status" in mutated, mutated

        # amp unreachable while both replicas run: the API server fails open
        [hook] = hooks.read_mutating_webhook_configuration(amp.webhook_configuration_name).webhooks
        hooks.patch_mutating_webhook_configuration(
            amp.webhook_configuration_name,
            {"webhooks": [{"name": hook.name, "clientConfig": {"url": f"https://{LOOPBACK}:{closed_port()}/mutate"}}]},
        )
        poll_until(
            "the API server to fail open",
            lambda: (
                "amp.txn2.com/status"
                not in (
                    core.create_namespaced_pod(team, pod_manifest("probe"), dry_run="All").metadata.annotations or {}
                )
                or None
            ),
            WAIT,
        )

        # the holder watches: namespaces created enabled with their Pods in the same second
        bypassed = same_second_pods(core, enabled_namespace, "live", 2)
        expected = {ns: set(names) for ns, names in bypassed.items()}
        poll_until(
            "the holder's Events",
            lambda: all(names <= set(bypass_events(core, ns)) for ns, names in expected.items()) or None,
            WAIT,
            interval=0.05,
        )

        # the holder is killed; meanwhile more Pods bypass amp, in a namespace
        # created enabled and one enabled later, each in the same second
        killed = holder_process(holder)
        os.killpg(killed.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        killed.stop()
        created = same_second_pods(core, enabled_namespace, "gap", 2)
        enabled = same_second_pods(core, enabled_later, "late", 1)
        holder = new_holder(holder)
        takeover = time.monotonic() - killed_at
        for made in (created, enabled):
            expected.update({ns: set(names) for ns, names in made.items()})
        poll_until(
            "the new holder's Events",
            lambda: all(names <= set(bypass_events(core, ns)) for ns, names in expected.items()) or None,
            WAIT,
            interval=0.05,
        )
        reported = time.monotonic() - killed_at

        # the killed replica comes back; then a rolling restart of both,
        # the holder first: two clean hand-overs
        killed.start_and_wait(WAIT)
        clean: list[float] = []
        survivor = holder_process(holder)
        for process in (survivor, killed):
            stopped_at = time.monotonic()
            process.stop()
            assert process.stopped_cleanly(), process.describe()
            holder = new_holder(holder)
            clean.append(time.monotonic() - stopped_at)
            process.start_and_wait(WAIT)
        print(
            f"\nhand-over after the holder's kill: {takeover:.2f}s to the next holder, {reported:.2f}s to its "
            f"Events; after a clean stop: " + ", ".join(f"{t:.2f}s" for t in clean)
        )

        # a last bypassed Pod, seen after the new holder's list was judged
        [(sentinel_ns, _)] = list(created.items())[-1:]
        create(core, sentinel_ns, "sentinel")
        expected[sentinel_ns].add("sentinel")
        poll_until(
            "the last Event", lambda: "sentinel" in bypass_events(core, sentinel_ns) or None, WAIT, interval=0.05
        )

        for ns, names in expected.items():
            events = bypass_events(core, ns)
            assert set(events) == names, (ns, sorted(events))
            for name, found in events.items():
                assert [e.count for e in found] == [1], f"{ns}/{name}: {[(e.metadata.name, e.count) for e in found]}"
        for ns in bypassed:
            assert all("possibly" not in e.message for found in bypass_events(core, ns).values() for e in found)
        assert bypass_events(core, team) == {}
    finally:
        replicas[1].stop()
        amp.close()
