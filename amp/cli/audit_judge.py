"""
What C{amp audit} says of each running Pod and each workload (pure).

A L{Prediction} is what amp's pipeline does now to a workload's template
(or a bare Pod's recorded review): the Pod it admits and the places its
endpoints decide (L{amp.cli.audit_paths}), or why it could not be told.
L{judge_pod} puts one running Pod in one L{PodState}:

  - C{opted-out}: the Pod opts out of amp (its enable label);
  - C{never-mutated}: no stamp: amp never reviewed it (bypassed, or
    created before amp or while amp's webhook was not called);
  - C{failed}: stamped C{skipped <reason>}: a failure under C{Ignore}
    admitted it without the endpoint's patch;
  - C{stale} or C{current}: whether it holds, at the places the endpoints
    decide, what they would give now;
  - C{unknown}: nothing to compare with (a bare Pod without a recorded
    review) or the pipeline could not say (the endpoint failed now).

L{WorkloadAudit} gathers a workload's Pods and says what brings them up to
date; L{exit_status} is the command's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Optional

from amp.cli.audit_owners import WorkloadKey, restart_command
from amp.cli.audit_paths import Place, compare
from amp.config import KubernetesConfig
from amp.poddiff import Difference
from amp.podjson import json_object
from amp.rules import LEGACY_SKIPPED_ANNOTATION, opted_out
from amp.stamp import parse_stamp, pod_stamp

__all__ = [
    "EXIT_ALL_CURRENT",
    "EXIT_NEEDS_ACTION",
    "EXIT_USAGE",
    "PodAudit",
    "PodState",
    "Prediction",
    "WorkloadAudit",
    "exit_status",
    "judge_pod",
    "needs_prediction",
    "running",
]

EXIT_ALL_CURRENT = 0
EXIT_NEEDS_ACTION = 1
EXIT_USAGE = 2


class PodState(str, Enum):
    CURRENT = "current"
    STALE = "stale"
    NEVER_MUTATED = "never-mutated"
    FAILED = "failed"
    OPTED_OUT = "opted-out"
    UNKNOWN = "unknown"

    def __str__(self) -> str:
        return self.value


#: The states a restart (or a fix, then a restart) would change.
NEEDS_ACTION = frozenset((PodState.STALE, PodState.NEVER_MUTATED, PodState.FAILED))


@dataclass(frozen=True)
class Prediction:
    """
    What amp's pipeline does now to a workload's template Pod.

    @ivar admitted: the Pod amp admits (None: it could not be told).
    @ivar places: where the endpoints' patch changed the template.
    @ivar endpoints: the endpoints that answered, as amp shows them.
    @ivar error: why the pipeline could not tell (the endpoint failed,
        denied, or the template is not usable); C{""} otherwise.
    @ivar source: what was reviewed (C{Deployment web's template}).
    """

    admitted: Optional[dict[str, Any]]
    places: tuple[Place, ...] = ()
    endpoints: tuple[str, ...] = ()
    error: str = ""
    source: str = ""


@dataclass(frozen=True)
class PodAudit:
    """One running Pod's state, with the differences of a stale one."""

    name: str
    state: PodState
    detail: str = ""
    differences: tuple[Difference, ...] = ()
    uid: str = ""


def needs_prediction(pod: dict[str, Any], kube: KubernetesConfig) -> bool:
    """Whether judging C{pod} needs its workload's L{Prediction} (it was reviewed and mutated or left unchanged)."""
    if opted_out(pod, kube):
        return False
    stamp = pod_stamp(pod)
    return stamp is not None and not any(mark.skipped for mark in parse_stamp(stamp).values())


def running(pod: dict[str, Any]) -> bool:
    """Whether C{pod} still runs or waits to (not finished, not being deleted)."""
    meta = json_object(pod.get("metadata"))
    status = json_object(pod.get("status"))
    return not meta.get("deletionTimestamp") and status.get("phase") not in ("Succeeded", "Failed")


def judge_pod(pod: dict[str, Any], prediction: Optional[Prediction], kube: KubernetesConfig) -> PodAudit:
    """The state of the running C{pod}, given what its workload's template gets now (None: nothing)."""
    meta = json_object(pod.get("metadata"))
    name = str(meta.get("name") or "")
    uid = str(meta.get("uid") or "")
    if opted_out(pod, kube):
        return PodAudit(name, PodState.OPTED_OUT, f"label {kube.enabled_label}={kube.opt_out_value}", uid=uid)
    stamp = pod_stamp(pod)
    annotations = json_object(meta.get("annotations"))
    if stamp is None:
        legacy = annotations.get(LEGACY_SKIPPED_ANNOTATION)
        if isinstance(legacy, str):
            return PodAudit(name, PodState.FAILED, f"skipped: {legacy}", uid=uid)
        return PodAudit(name, PodState.NEVER_MUTATED, "no amp.txn2.com/status stamp: amp did not review it", uid=uid)
    skipped = [(endpoint, mark.skipped) for endpoint, mark in parse_stamp(stamp).items() if mark.skipped]
    if skipped:
        detail = "; ".join(f"skipped {reason} {endpoint}" for endpoint, reason in skipped)
        return PodAudit(name, PodState.FAILED, detail, uid=uid)
    if prediction is None:
        return PodAudit(name, PodState.UNKNOWN, "a Pod without a workload, and no recorded review of it", uid=uid)
    if prediction.admitted is None:
        return PodAudit(name, PodState.UNKNOWN, prediction.error, uid=uid)
    differences = compare(pod, prediction.admitted, prediction.places)
    if differences:
        return PodAudit(name, PodState.STALE, f"{len(differences)} place(s) differ", differences, uid=uid)
    return PodAudit(name, PodState.CURRENT, uid=uid)


@dataclass
class WorkloadAudit:
    """A workload's Pods, judged, and what brings them up to date."""

    key: WorkloadKey
    prediction: Optional[Prediction] = None
    pods: list[PodAudit] = field(default_factory=list)

    def counts(self) -> dict[PodState, int]:
        out = {state: 0 for state in PodState}
        for pod in self.pods:
            out[pod.state] += 1
        return out

    @property
    def needs_action(self) -> bool:
        return any(p.state in NEEDS_ACTION for p in self.pods)

    @property
    def error(self) -> str:
        return self.prediction.error if self.prediction is not None else ""

    def command(self) -> str:
        """The command that brings the Pods up to date, or C{""} when none needs it."""
        if not self.needs_action:
            return ""
        names = [p.name for p in self.pods if p.state in NEEDS_ACTION]
        return restart_command(self.key, names)


def exit_status(workloads: list[WorkloadAudit]) -> int:
    """L{EXIT_NEEDS_ACTION} when a Pod is stale, never mutated or failed, or a workload could not be audited."""
    if any(w.needs_action or w.error for w in workloads):
        return EXIT_NEEDS_ACTION
    return EXIT_ALL_CURRENT
