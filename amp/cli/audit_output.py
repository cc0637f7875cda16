"""
C{amp audit}'s outputs (pure): a table for people, JSON for programs, and
C{wgpolicyk8s.io/v1alpha2} PolicyReports (one per namespace, a result per
workload) for the tools that already read policy reports.

Every string from the cluster (names, values, reasons) goes through
L{amp.text.terminal} in the table; JSON and YAML escape by their own
rules.
"""

from __future__ import annotations

import json
from typing import Any, Iterable

import yaml

from amp.cli.audit_judge import PodState, WorkloadAudit
from amp.poddiff import MISSING, Difference
from amp.text import terminal

__all__ = ["render_json", "render_policy_reports", "render_table", "policy_reports"]

#: The PolicyReport's policy name, and its source.
POLICY = "amp-mutation"
SOURCE = "amp audit"


def _value(value: Any) -> str:
    if value is MISSING:
        return "(absent)"
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return terminal(text, 160)


def difference_line(d: Difference) -> str:
    return f"{terminal(d.path or '/')}: {_value(d.before)} -> {_value(d.after)}"


def render_table(workloads: Iterable[WorkloadAudit], *, verbose: bool = False) -> str:
    """
    One line per workload (its Pods by state), then what differs on its
    stale Pods (each place once, with how many Pods), the states of the
    others that need action, and the command.
    """
    workloads = list(workloads)
    states = [s for s in PodState]
    header = ["NAMESPACE", "WORKLOAD", *(s.value.upper() for s in states)]
    rows = [[terminal(w.key.namespace), terminal(str(w.key)), *(str(w.counts()[s]) for s in states)] for w in workloads]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    out = ["  ".join(c.ljust(widths[i]) for i, c in enumerate(r)).rstrip() for r in [header, *rows]]
    details: list[str] = []
    for w in workloads:
        lines = _workload_details(w, verbose)
        if lines:
            details.append(f"{terminal(w.key.namespace)} {terminal(str(w.key))}:")
            details.extend(lines)
    if details:
        out.append("")
        out.extend(details)
    total = {s: sum(w.counts()[s] for w in workloads) for s in states}
    out.append("")
    out.append(
        f"{sum(total.values())} Pods in {len(workloads)} workloads: "
        + ", ".join(f"{n} {s.value}" for s, n in total.items() if n)
    )
    return "\n".join(out) + "\n"


def _workload_details(w: WorkloadAudit, verbose: bool) -> list[str]:
    lines: list[str] = []
    if w.error:
        lines.append(f"  could not audit: {terminal(w.error)}")
    seen: dict[str, list[str]] = {}
    for pod in w.pods:
        if pod.state == PodState.STALE:
            for d in pod.differences:
                seen.setdefault(difference_line(d), []).append(pod.name)
    for line, pods in seen.items():
        lines.append(f"  stale {len(pods)} Pod(s): {line}")
    for pod in w.pods:
        if pod.state in (PodState.NEVER_MUTATED, PodState.FAILED) or (verbose and pod.state != PodState.CURRENT):
            lines.append(f"  {pod.state.value} pod/{terminal(pod.name)}: {terminal(pod.detail)}")
        elif pod.state == PodState.UNKNOWN and not w.error:
            lines.append(f"  unknown pod/{terminal(pod.name)}: {terminal(pod.detail)}")
    command = w.command()
    if command:
        lines.append(f"  to update: {terminal(command)}")
    return lines


def as_json(w: WorkloadAudit) -> dict[str, Any]:
    p = w.prediction
    return {
        "namespace": w.key.namespace,
        "kind": w.key.kind,
        "name": w.key.name,
        "endpoints": list(p.endpoints) if p else [],
        "places": [str(place) for place in p.places] if p else [],
        "error": w.error or None,
        "counts": {s.value: n for s, n in w.counts().items()},
        "command": w.command() or None,
        "pods": [
            {
                "name": pod.name,
                "uid": pod.uid or None,
                "state": pod.state.value,
                "detail": pod.detail or None,
                "differences": [d.as_json() for d in pod.differences],
            }
            for pod in w.pods
        ],
    }


def render_json(workloads: Iterable[WorkloadAudit], *, endpoint_calls: int = 0, notes: Iterable[str] = ()) -> str:
    items = [as_json(w) for w in workloads]
    totals = {s.value: sum(i["counts"][s.value] for i in items) for s in PodState}
    return (
        json.dumps(
            {"workloads": items, "totals": totals, "endpoint_calls": endpoint_calls, "notes": list(notes)}, indent=2
        )
        + "\n"
    )


def _result(w: WorkloadAudit, timestamp: int) -> dict[str, Any]:
    counts = w.counts()
    if w.error:
        result, message = "error", f"could not audit: {w.error}"
    elif w.needs_action:
        result = "fail"
        parts = [
            f"{counts[s]} {s.value}" for s in (PodState.STALE, PodState.NEVER_MUTATED, PodState.FAILED) if counts[s]
        ]
        message = f"{', '.join(parts)} of {len(w.pods)} Pods; to update: {w.command()}"
    elif counts[PodState.CURRENT]:
        result, message = "pass", f"{counts[PodState.CURRENT]} Pods current"
    else:
        result, message = "skip", ", ".join(f"{n} {s.value}" for s, n in counts.items() if n) or "no Pods"
    group = {
        "Deployment": "apps/v1",
        "StatefulSet": "apps/v1",
        "DaemonSet": "apps/v1",
        "ReplicaSet": "apps/v1",
        "Job": "batch/v1",
        "CronJob": "batch/v1",
    }.get(w.key.kind, "v1")
    properties = {s.value: str(n) for s, n in counts.items() if n}
    stale = {difference_line(d) for pod in w.pods for d in pod.differences}
    if stale:
        properties["differences"] = "; ".join(sorted(stale))[:1000]
    return {
        "policy": POLICY,
        "rule": "up-to-date",
        "result": result,
        "message": message[:1000],
        "source": SOURCE,
        "scored": True,
        "severity": "medium" if result == "fail" else "info",
        "category": "mutation",
        "timestamp": {"seconds": timestamp, "nanos": 0},
        "resources": [{"apiVersion": group, "kind": w.key.kind, "name": w.key.name, "namespace": w.key.namespace}],
        "properties": properties,
    }


def policy_reports(workloads: Iterable[WorkloadAudit], timestamp: int) -> list[dict[str, Any]]:
    """One PolicyReport per namespace, a result per workload (C{timestamp}: seconds since the epoch)."""
    by_namespace: dict[str, list[dict[str, Any]]] = {}
    for w in workloads:
        by_namespace.setdefault(w.key.namespace, []).append(_result(w, timestamp))
    reports = []
    for namespace, results in sorted(by_namespace.items()):
        summary = {k: sum(1 for r in results if r["result"] == k) for k in ("pass", "fail", "warn", "error", "skip")}
        reports.append(
            {
                "apiVersion": "wgpolicyk8s.io/v1alpha2",
                "kind": "PolicyReport",
                "metadata": {
                    "name": "amp-audit",
                    "namespace": namespace,
                    "labels": {"app.kubernetes.io/managed-by": "amp"},
                },
                "summary": summary,
                "results": results,
            }
        )
    return reports


def render_policy_reports(workloads: Iterable[WorkloadAudit], timestamp: int) -> str:
    """The reports as YAML documents (for C{kubectl apply -f -})."""
    return yaml.safe_dump_all(policy_reports(workloads, timestamp), sort_keys=False)
