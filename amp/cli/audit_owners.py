"""
Which workload a running Pod belongs to, and what brings its Pods up to
date (pure).

A Pod's controller is its C{ownerReferences} entry with C{controller:
true}.  A ReplicaSet's Pods belong to the ReplicaSet's Deployment when it
has one (else to the ReplicaSet), a Job's to its CronJob when it has one
(else to the Job); a StatefulSet's and a DaemonSet's to them.  A Pod with
no controller, or whose controller is of a kind amp does not know or was
not found, is a bare Pod: its own workload.

L{Owners} is filled from the lists of ReplicaSets and Jobs of one
namespace, keeping only the names (what a Pod's owner chain needs); the
templates come from the workloads themselves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Optional

from amp.podjson import json_object

__all__ = ["Owners", "WorkloadKey", "controller_of", "restart_command"]

#: The kinds whose template amp audits, by the API group of their owner
#: references.
_KINDS = {
    ("apps", "Deployment"),
    ("apps", "StatefulSet"),
    ("apps", "DaemonSet"),
    ("apps", "ReplicaSet"),
    ("batch", "Job"),
    ("batch", "CronJob"),
}

#: The kinds whose Pods C{kubectl rollout restart} replaces.
_ROLLOUT = {"Deployment": "deployment", "StatefulSet": "statefulset", "DaemonSet": "daemonset"}


@dataclass(frozen=True, slots=True, order=True)
class WorkloadKey:
    """One workload of a namespace: C{kind} C{name} (C{Pod} for a bare Pod)."""

    namespace: str
    kind: str
    name: str

    def __str__(self) -> str:
        return f"{self.kind.lower()}/{self.name}"


def controller_of(obj: Any) -> Optional[tuple[str, str]]:
    """The (kind, name) of C{obj}'s controlling owner of a kind amp knows, or None."""
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    refs = meta.get("ownerReferences") if isinstance(meta, dict) else None
    if not isinstance(refs, list):
        return None
    for ref in refs:
        if not isinstance(ref, dict) or ref.get("controller") is not True:
            continue
        group = str(ref.get("apiVersion") or "").partition("/")[0]
        kind, name = ref.get("kind"), ref.get("name")
        if (group, kind) in _KINDS and isinstance(name, str) and name:
            return str(kind), name
        return None
    return None


class Owners:
    """
    The owner chains of one namespace: ReplicaSet -> Deployment, Job ->
    CronJob, and which workloads exist.
    """

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self._parent: dict[tuple[str, str], tuple[str, str]] = {}
        self._known: set[tuple[str, str]] = set()

    def add(self, kind: str, objects: Iterable[dict[str, Any]]) -> None:
        """Learn the objects of C{kind} (their names and controllers)."""
        for obj in objects:
            meta = obj.get("metadata") if isinstance(obj, dict) else None
            name = meta.get("name") if isinstance(meta, dict) else None
            if not isinstance(name, str):
                continue
            self._known.add((kind, name))
            parent = controller_of(obj)
            if parent is not None:
                self._parent[(kind, name)] = parent

    def workload_of(self, pod: dict[str, Any]) -> WorkloadKey:
        """The workload whose template C{pod} was made from (itself when bare)."""
        owner = controller_of(pod)
        if owner is None or owner not in self._known:
            meta = json_object(pod.get("metadata"))
            return WorkloadKey(self.namespace, "Pod", str(meta.get("name") or ""))
        parent = self._parent.get(owner)
        if (
            owner[0] in ("ReplicaSet", "Job")
            and parent is not None
            and parent in self._known
            and parent[0] == ("Deployment" if owner[0] == "ReplicaSet" else "CronJob")
        ):
            owner = parent
        return WorkloadKey(self.namespace, *owner)


def restart_command(workload: WorkloadKey, pods: Iterable[str] = ()) -> str:
    """
    The command that replaces C{workload}'s Pods with ones amp reviews now
    (C{pods}: the names of those to replace, for a bare ReplicaSet).
    """
    ns = workload.namespace
    if workload.kind in _ROLLOUT:
        return f"kubectl rollout restart {_ROLLOUT[workload.kind]}/{workload.name} -n {ns}"
    if workload.kind == "ReplicaSet":
        names = " ".join(sorted(pods)) or "<pods>"
        return f"kubectl delete pod {names} -n {ns}  # the ReplicaSet creates them again"
    if workload.kind == "Job":
        return f"kubectl get job {workload.name} -n {ns} -o yaml | kubectl replace --force -f -  # runs the Job again"
    if workload.kind == "CronJob":
        return f"kubectl create job --from=cronjob/{workload.name} {workload.name}-audit -n {ns}  # or the next run"
    # Not `kubectl replace --force` of the running Pod: it carries the old
    # mutation, which the endpoint would then find and keep.
    return f"kubectl delete pod {workload.name} -n {ns}  # then create it again from its manifest"
