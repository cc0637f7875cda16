"""
How C{amp explain} prints an L{amp.cli.explain.Explanation} (pure): a
readable decision trace and a YAML diff of the Pod (L{render_text}), or one
JSON object (L{render_json}).

Every line of the text goes through L{amp.text.terminal}: a namespace, a
Pod's name, a key, a URL or an endpoint's message that holds an escape
sequence, a carriage return or a line break is shown escaped, never acted
on by the operator's terminal.  The JSON is ASCII (every other character
escaped by JSON itself).
"""

from __future__ import annotations

import difflib
import json
from typing import Any, Mapping, Optional

import yaml

from amp.cli._explanation import Explanation, Round
from amp.cli.workloads import without_stamps
from amp.reasons import Result
from amp.text import terminal
from amp.trace import (
    AllowChecked,
    Answered,
    BudgetGiven,
    Called,
    Event,
    NamespaceFound,
    OperationApplied,
    PolicyChosen,
    Refused,
    Repaired,
    Replied,
    RouteDecided,
    Skipped,
    Stamped,
)

__all__ = ["render_json", "render_text", "pod_yaml"]

_EXIT_MEANING = {
    0: "admitted as the endpoint intended",
    1: "the failure policy decided",
    3: "the endpoint denied the Pod",
    4: "not idempotent: a second review changes the Pod again",
}

_WIDTH = 11


# ---------------------------------------------------------------- JSON


def _round_json(r: "Round") -> dict[str, Any]:
    return {
        "result": r.result,
        "reason": r.reason,
        "message": r.message,
        "endpoint": r.endpoint,
        "patch": r.patch,
        "warnings": r.warnings,
        "audit_annotations": r.audit,
        "pod": r.pod,
        "trace": [{"step": str(e.step), "at": round(e.at, 6), **e.event.fields()} for e in r.trace.events],
        "log": r.log,
        "trace_id": r.trace_id,
    }


def render_json(x: "Explanation") -> str:
    """
    One JSON object: the first round's C{result}, C{reason}, C{message},
    C{patch}, C{warnings}, C{pod} (None when denied) and trace, the input,
    the exit status and, with C{--twice}, C{idempotent} and C{second}.
    """
    doc: dict[str, Any] = {
        "namespace": x.input.namespace,
        "input": x.input.source,
        "namespace_source": x.namespace_source,
        "recorded_reply": x.recorded,
        **_round_json(x.first),
        "exit_status": x.exit_status,
    }
    if x.cluster_policy:
        doc["cluster_failure_policy_source"] = x.cluster_policy
    if x.notes:
        doc["notes"] = x.notes
    if x.twice:
        doc["idempotent"] = x.idempotent
    if x.second is not None:
        doc["second"] = _round_json(x.second)
    return json.dumps(doc, indent=2, ensure_ascii=True) + "\n"


# ---------------------------------------------------------------- text


def pod_yaml(pod: Mapping[str, Any]) -> str:
    """
    The Pod as YAML, keys in their order, as C{kubectl get -o yaml} shows it.
    """
    return yaml.safe_dump(dict(pod), sort_keys=False, default_flow_style=False, allow_unicode=True, width=1 << 16)


def _diff(before: Mapping[str, Any], after: Mapping[str, Any], a: str, b: str) -> str:
    lines = difflib.unified_diff(
        pod_yaml(before).splitlines(keepends=True), pod_yaml(after).splitlines(keepends=True), fromfile=a, tofile=b
    )
    return "".join(lines)


def _pairs(mapping: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in mapping.items()) or "(none)"


def _ms(seconds: Optional[float]) -> str:
    if seconds is None:
        return "?"
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.3g}s"


def _event_lines(e: Event, recorded: Optional[str]) -> list[tuple[str, str]]:
    match e:
        case NamespaceFound(found=False):
            return [("namespace", f"{e.name}: not found in {e.source}")]
        case NamespaceFound():
            out = [
                ("namespace", f"{e.name} (from {e.source})"),
                ("", f"labels: {_pairs(e.labels)}"),
                ("", f"annotations: {_pairs(e.annotations)}"),
            ]
            if e.set_by_command_line:
                out.append(("", "set by the command line: " + ", ".join(e.set_by_command_line)))
            return out + [("", hint) for hint in e.near_misses]
        case RouteDecided():
            return _route_lines(e)
        case AllowChecked(reason="bad-url"):
            return [("allow", f"{e.url}: unusable: {e.error}")]
        case AllowChecked(allowed=True):
            return [("allow", f"{e.url} matches endpoints.allow {e.pattern}")]
        case AllowChecked():
            return [("allow", f"{e.url} matches no endpoints.allow pattern ({', '.join(e.patterns)})")]
        case PolicyChosen():
            return [("policy", f"{e.policy}: {e.why}")]
        case BudgetGiven():
            text = f"{e.seconds:.3g}s left of the review's deadline"
            if (e.chain_length or 1) > 1:
                text = f"endpoint {e.position} of {e.chain_length}: " + text
            if e.timeout is not None:
                text += f"; the call may take {e.timeout:.3g}s (the endpoint's timeout, or what is left)"
            out = [("budget", text)]
            if e.max_concurrent:
                out.append(
                    (
                        "",
                        f"past {e.max_concurrent} calls at once to the endpoint (endpoints.max_concurrent)"
                        f", a review waits for a slot until {e.min_call_time:.3g}s before its deadline "
                        "(queue-timeout)",
                    )
                )
            if e.latency_budget:
                out.append(
                    (
                        "",
                        f"latency budget {e.latency_budget:.3g}s: while the p90 of the endpoint's recent "
                        "calls is over it, reviews are shed (latency-budget), but for one probe at a time",
                    )
                )
            return out
        case Called():
            text = f"POST {e.url}: {e.outcome} in {_ms(e.seconds)}"
            if recorded:
                text = f"POST {e.url}, answered with the recorded reply {recorded}: {e.outcome}"
            if e.message:
                text += f": {e.message}"
            return [("call", text)]
        case Replied():
            n = e.operations
            if e.allowed:
                text = f"allowed, {n} operation{'' if n == 1 else 's'}"
            else:
                text = f"denied ({e.code}): {e.message or '(no message)'}"
            return [("reply", text)] + [("", f"warning: {w}") for w in e.warnings]
        case OperationApplied():
            frm = f" from {e.from_}" if e.from_ else ""
            note = "  (inserted by amp: repair)" if e.repair else ""
            index = "+" if e.index is None else e.index
            return [("operation", f"{index} {e.op} {e.path}{frm}{note}")]
        case Repaired():
            return [("repair", str(e.message))]
        case Refused():
            return [("refused", f"{e.reason}: {e.message}")]
        case Skipped():
            return [
                ("skipped", f"{e.endpoint} ({e.reason}): {e.message}; under Ignore the chain goes on without its patch")
            ]
        case Answered():
            fields = e.fields()
            text = str(e.result)
            if e.reason:
                text += f" ({e.reason})"
            return [("answer", text)] + ([("", str(fields["message"]))] if fields["message"] else [])
        case Stamped():
            kept = "" if e.written else " (the Pod has it already: not written again)"
            return [("stamp", f"{e.key}: {e.value}{kept}")]
    return [(str(e.step), json.dumps(e.fields(), ensure_ascii=False))]


def _route_lines(e: RouteDecided) -> list[tuple[str, str]]:
    label = f"{e.label}={e.value}"
    if not e.enabled:
        have = "is not set" if e.got is None else f"is {e.got!r}"
        return [("route", f"not enabled: amp acts only where {label}; the label {have}")]
    out = [("route", f"enabled ({label}), mode {e.mode}")]
    steps = e.steps
    if e.annotation and len(steps) > 1:
        out.append(("endpoints", f"{' then '.join(steps)}: a chain of {len(steps)} (annotation {e.annotation})"))
    elif e.annotation:
        out.append(("endpoint", f"{e.url} (annotation {e.annotation})"))
    else:
        out.append(("endpoint", f"none: no annotation {' or '.join(e.annotations)}"))
    return out


def _round_text(r: "Round", recorded: Optional[str]) -> list[str]:
    lines: list[str] = []
    for e in r.trace.events:
        for head, text in _event_lines(e.event, recorded):
            lines.append(f"{head:<{_WIDTH}}{text}".rstrip())
    for w in r.warnings:
        lines.append(f"{'warning':<{_WIDTH}}{w}")
    for k, v in r.audit.items():
        lines.append(f"{'audit':<{_WIDTH}}{k}: {v}")
    for line in r.log:
        for part in line.split("\n"):
            lines.append(f"{'log':<{_WIDTH}}{part}")
    return lines


def _pod_name(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    if meta.get("name"):
        return str(meta["name"])
    if meta.get("generateName"):
        return f"{meta['generateName']}*"
    return "(no name)"


def _pod_change(r: "Round", before: str, after: str) -> list[str]:
    if r.pod is None:
        return ["The Pod is not admitted."]
    diff = _diff(r.request_pod, r.pod, before, after)
    if not diff:
        return ["The Pod is admitted unchanged."]
    stamps = {e.key for e in r.trace.of(Stamped)}
    if stamps and without_stamps(r.request_pod, stamps) == without_stamps(r.pod, stamps):
        return ["Only amp's status stamp changes:", *diff.rstrip("\n").split("\n")]
    return diff.rstrip("\n").split("\n")


def render_text(x: "Explanation") -> str:
    """
    The decision trace, the warnings, audit annotations and log lines of
    the review, the Pod's diff, and the result with the exit status.
    """
    first = x.first
    name = _pod_name(first.request_pod)
    origin = (
        f" (from {x.input.source})"
        if not x.input.source.startswith("Pod")
        else (" (from an AdmissionReview)" if "AdmissionReview" in x.input.source else "")
    )
    lines = [f"Pod {name}{origin} in namespace {x.input.namespace}"]
    if x.cluster_policy:
        lines.append(f"failure_policy auto follows {x.cluster_policy}")
    lines += [f"note: {note}" for note in x.notes]
    lines.append("")
    lines.extend(_round_text(first, x.recorded))
    lines.append("")
    lines.extend(_pod_change(first, "Pod (as sent)", "Pod (as admitted)"))
    if x.second is not None:
        second = x.second
        lines += ["", "Second review, of the admitted Pod (--twice):", ""]
        lines.extend(_round_text(second, x.recorded))
        lines.append("")
        lines.extend(_pod_change(second, "Pod (after the first review)", "Pod (after the second review)"))
    status = x.exit_status
    lines.append("")
    summary = f"result: {first.result}" + (f" ({first.reason})" if first.reason else "")
    if x.idempotent is not None:
        summary += "; idempotent" if x.idempotent else "; NOT idempotent"
    elif x.second is not None:
        how = "was denied by the endpoint" if status == 3 else f"failed ({x.second.reason})"
        summary += f"; the second review {how}, so idempotency is not known"
    elif x.twice:
        summary += "; idempotency not checked: the first review admitted no patch to review again"
    meaning = _EXIT_MEANING.get(status, "")
    if x.second is not None and x.idempotent is None:
        meaning = f"{meaning} in the second review"
    elif first.result == Result.SHADOW and status == 1:
        meaning = "shadow mode admits the Pod unchanged; in normal mode the failure policy would decide"
    elif first.result == "patched" and status == 1:
        meaning = "the failure policy decided: patched without a failed endpoint's patch"
    lines.append(f"{summary} -> exit {status}: {meaning}".rstrip(": "))
    return "\n".join(map(terminal, lines)) + "\n"
