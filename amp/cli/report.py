"""
How C{amp explain} prints an L{amp.cli.explain.Explanation} (pure): a
readable decision trace and a YAML diff of the Pod (L{render_text}), or one
JSON object (L{render_json}).
"""

from __future__ import annotations

import difflib
import json
from typing import Any, Mapping, Optional

import yaml

from amp.cli._explanation import Explanation, Round
from amp.cli.workloads import without_stamps
from amp.reasons import Result
from amp.trace import Step, TraceEvent

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
        "trace": [{"step": str(e.step), "at": round(e.at, 6), **e.fields} for e in r.trace.events],
        "log": r.log,
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
    if x.twice:
        doc["idempotent"] = x.idempotent
    if x.second is not None:
        doc["second"] = _round_json(x.second)
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


# ---------------------------------------------------------------- text


def pod_yaml(pod: Mapping[str, Any]) -> str:
    """
    The Pod as YAML, keys in their order, as C{kubectl get -o yaml} shows it.
    """
    return yaml.safe_dump(dict(pod), sort_keys=False, default_flow_style=False, allow_unicode=True, width=1 << 16)


def _diff(before: Mapping[str, Any], after: Mapping[str, Any], a: str, b: str) -> str:
    lines = difflib.unified_diff(pod_yaml(before).splitlines(keepends=True), pod_yaml(after).splitlines(keepends=True),
                                 fromfile=a, tofile=b)
    return "".join(lines)


def _pairs(mapping: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in mapping.items()) or "(none)"


def _ms(seconds: Optional[float]) -> str:
    if seconds is None:
        return "?"
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.3g}s"


def _event_lines(e: TraceEvent, recorded: Optional[str]) -> list[tuple[str, str]]:
    f = e.fields
    step = e.step
    if step == Step.NAMESPACE:
        if not f.get("found"):
            return [("namespace", f"{f['name']}: not found in {f['source']}")]
        out = [("namespace", f"{f['name']} (from {f['source']})"),
               ("", f"labels: {_pairs(f.get('labels') or {})}"),
               ("", f"annotations: {_pairs(f.get('annotations') or {})}")]
        if f.get("set_by_command_line"):
            out.append(("", "set by the command line: " + ", ".join(f["set_by_command_line"])))
        return out
    if step == Step.ROUTE:
        label = f"{f.get('label')}={f.get('value')}"
        if not f.get("enabled"):
            got = f.get("got")
            have = "is not set" if got is None else f"is {got!r}"
            return [("route", f"not enabled: amp acts only where {label}; the label {have}")]
        out = [("route", f"enabled ({label}), mode {f.get('mode')}")]
        steps = f.get("steps") or []
        if f.get("annotation") and len(steps) > 1:
            out.append(("endpoints", f"{' then '.join(steps)}: a chain of {len(steps)} (annotation {f['annotation']})"))
        elif f.get("annotation"):
            out.append(("endpoint", f"{f['url']} (annotation {f['annotation']})"))
        else:
            out.append(("endpoint", f"none: no annotation {' or '.join(f.get('annotations') or ())}"))
        return out
    if step == Step.ALLOW:
        if f.get("reason") == "bad-url":
            return [("allow", f"{f.get('url')}: unusable: {f.get('error')}")]
        if f.get("allowed"):
            return [("allow", f"{f['url']} matches endpoints.allow {f.get('pattern')}")]
        return [("allow", f"{f['url']} matches no endpoints.allow pattern ({', '.join(f.get('patterns') or ())})")]
    if step == Step.POLICY:
        return [("policy", f"{f.get('policy')}: {f.get('why')}")]
    if step == Step.BUDGET:
        text = f"{f['seconds']:.3g}s left of the review's deadline"
        if (f.get("chain_length") or 1) > 1:
            text = f"endpoint {f['position']} of {f['chain_length']}: " + text
        if f.get("timeout") is not None:
            text += f"; the call may take {f['timeout']:.3g}s (the endpoint's timeout, or what is left)"
        return [("budget", text)]
    if step == Step.CALL:
        text = f"POST {f.get('url')}: {f.get('outcome')} in {_ms(f.get('seconds'))}"
        if recorded:
            text = f"POST {f.get('url')}, answered with the recorded reply {recorded}: {f.get('outcome')}"
        if f.get("message"):
            text += f": {f['message']}"
        return [("call", text)]
    if step == Step.REPLY:
        n = f.get("operations", 0)
        if f.get("allowed"):
            text = f"allowed, {n} operation{'' if n == 1 else 's'}"
        else:
            text = f"denied ({f.get('code')}): {f.get('message') or '(no message)'}"
        out = [("reply", text)]
        out.extend(("", f"warning: {w}") for w in f.get("warnings") or ())
        return out
    if step == Step.OPERATION:
        frm = f" from {f['from_']}" if f.get("from_") else ""
        note = "  (inserted by amp: repair)" if f.get("repair") else ""
        index = "+" if f.get("index") is None else f["index"]
        return [("operation", f"{index} {f.get('op')} {f.get('path')}{frm}{note}")]
    if step == Step.REPAIR:
        return [("repair", str(f.get("message")))]
    if step == Step.CHECK:
        return [("refused", f"{f.get('reason')}: {f.get('message')}")]
    if step == Step.SKIP:
        return [("skipped", f"{f.get('endpoint')} ({f.get('reason')}): {f.get('message')}; under Ignore the chain "
                            "goes on without its patch")]
    if step == Step.ANSWER:
        text = str(f.get("result"))
        if f.get("reason"):
            text += f" ({f['reason']})"
        out = [("answer", text)]
        if f.get("message"):
            out.append(("", str(f["message"])))
        return out
    if step == Step.STAMP:
        return [("stamp", f"{f.get('key')}: {f.get('value')}")]
    return [(str(step), json.dumps(f, ensure_ascii=False))]


def _round_text(r: "Round", recorded: Optional[str]) -> list[str]:
    lines: list[str] = []
    for e in r.trace.events:
        for head, text in _event_lines(e, recorded):
            lines.append(f"{head:<{_WIDTH}}{text}".rstrip())
    for w in r.warnings:
        lines.append(f"{'warning':<{_WIDTH}}{w}")
    for k, v in r.audit.items():
        lines.append(f"{'audit':<{_WIDTH}}{k}: {v}")
    for line in r.log:
        lines.append(f"{'log':<{_WIDTH}}{line}")
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
    stamps = {str(f["key"]) for f in r.trace.steps(Step.STAMP)}
    if stamps and without_stamps(r.request_pod, stamps) == without_stamps(r.pod, stamps):
        return ["Only amp's status stamp changes:", diff.rstrip("\n")]
    return [diff.rstrip("\n")]



def render_text(x: "Explanation") -> str:
    """
    The decision trace, the warnings, audit annotations and log lines of
    the review, the Pod's diff, and the result with the exit status.
    """
    first = x.first
    name = _pod_name(first.request_pod)
    origin = f" (from {x.input.source})" if not x.input.source.startswith("Pod") else (
        " (from an AdmissionReview)" if "AdmissionReview" in x.input.source else "")
    lines = [f"Pod {name}{origin} in namespace {x.input.namespace}"]
    if x.cluster_policy:
        lines.append(f"failure_policy auto follows {x.cluster_policy}")
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
    elif x.twice:
        summary += "; idempotency not checked: the first review admitted no patch to review again"
    meaning = _EXIT_MEANING.get(status, "")
    if first.result == Result.SHADOW and status == 1:
        meaning = "shadow mode admits the Pod unchanged; in normal mode the failure policy would decide"
    elif first.result == "patched" and status == 1:
        meaning = "the failure policy decided: patched without a failed endpoint's patch"
    lines.append(f"{summary} -> exit {status}: {meaning}".rstrip(": "))
    return "\n".join(lines) + "\n"

