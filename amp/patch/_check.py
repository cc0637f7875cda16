"""
L{check_patch}: one endpoint's patch checked against the Pod (pure):
its operations parsed, refused paths, the dry-apply with repair, the
patched Pod's sanity.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

from amp.patch._apply import Doc, Fail, apply_op, repair_parents
from amp.patch._ops import Op, PatchError, parse_ops
from amp.patch._paths import path_rules, refusal
from amp.patch._pod import ALL_PARTS, check_pod, parts_changed
from amp.pointer import json_type, parse_pointer
from amp.reasons import Reason
from amp.trace import NO_TRACE, IReviewTrace, OperationApplied, Repaired

DEFAULT_DENIED: tuple[str, ...] = ("/metadata/name", "/metadata/namespace", "/metadata/uid", "/status")

__all__ = ["ALL_PARTS", "DEFAULT_DENIED", "CheckedPatch", "check_patch", "unchanged"]


# Not frozen: a frozen dataclass's __init__ sets each field through
# object.__setattr__, several times the cost of a plain one (bench/README.md, "Figures behind the code");
# three are made for every review,
# and nothing changes it once made.
@dataclass(slots=True)
class CheckedPatch:
    """
    The result of L{check_patch}.

    @ivar operations: the patch to send to the API server, repaired; plain
        JSON lists and dicts with only C{op}, C{path}, C{value} and C{from}
        members; C{[]} when the patch changes nothing.
    @ivar repaired: how many operations amp inserted.
    @ivar warnings: short notes (under 120 characters each) about operations
        that are allowed but probably not what the endpoint meant.
    @ivar pod: the Pod after applying C{operations}.  It shares unchanged
        parts with the Pod given to L{check_patch}: treat it as read-only.
    """

    operations: list[dict[str, Any]]
    repaired: int
    warnings: tuple[str, ...]
    pod: dict[str, Any]


def check_patch(
    pod: dict[str, Any],
    ops: Any,
    *,
    denied: Sequence[str] = DEFAULT_DENIED,
    allowed: Sequence[str] = (),
    repair: bool = True,
    max_operations: int = 1000,
    trace: IReviewTrace = NO_TRACE,
    confined: Optional[str] = None,
) -> CheckedPatch:
    """
    Check an endpoint's patch against C{pod}, dry-apply it and repair it.

    @param pod: the Pod from the AdmissionReview (never mutated).
    @param ops: the decoded patch: a list of RFC 6902 operations.
    @param denied: JSON pointers the patch must not change (nor any ancestor
        of them, nor anything under them).
    @param allowed: JSON pointers under which changes are allowed even when
        C{denied} would refuse them.
    @param repair: insert C{add} operations for missing parents of an C{add}.
    @param max_operations: the most operations a patch may have.
    @param trace: told each operation that applies and each repair.
    @param confined: a JSON pointer every operation (its C{path}, and the
        C{from} of a C{move} or C{copy}) must be under, or None (the
        C{pods/ephemeralcontainers} subresource changes nothing else).
    @raise PatchError: the patch cannot be sent to the API server.
    @raise ValueError: C{denied} or C{allowed} holds a string that is not a
        JSON pointer.
    """
    parsed = parse_ops(ops, max_operations)
    if type(pod) is not dict:
        raise PatchError(Reason.INVALID_POD, f"the Pod must be a JSON object, not {json_type(pod)}")
    rules = path_rules(tuple(denied), tuple(allowed))

    if confined is not None:
        inside = parse_pointer(confined)
        for op in parsed:
            for which, tokens in (("path", op.tokens), ("from", op.ftokens)):
                if tokens is not None and op.op != "test" and tokens[: len(inside)] != inside:
                    raise PatchError(
                        Reason.REFUSED_PATH,
                        f"{op.label}: {which} is not under {confined}, the only part of the Pod this review may change",
                    )
    modifies = False
    for op in parsed:
        if op.op == "test":
            continue
        modifies = True
        why = refusal(op.tokens, rules)
        if why is not None:
            raise PatchError(Reason.REFUSED_PATH, f"{op.label}: path {why}")
        if op.op == "move":
            why = refusal(op.ftokens, rules)  # type: ignore[arg-type]  # a move has its from (parse_ops)
            if why is not None:
                raise PatchError(Reason.REFUSED_PATH, f"{op.label}: from {why}")

    doc = Doc(pod)
    operations: list[dict[str, Any]] = []
    repaired = 0
    recording = trace.recording
    for op in parsed:
        try:
            apply_op(doc, op)
        except Fail as fail:
            if op.op != "add" or fail.node is None:
                raise PatchError(Reason.APPLY_FAILED, f"{op.label}: {fail.message}") from None
            if not repair:
                raise PatchError(Reason.APPLY_FAILED, f"{op.label}: {fail.message} (patch.repair is off)") from None
            before = len(operations)
            try:
                repaired += repair_parents(doc, op, fail, rules, operations)
            except Fail as again:
                raise PatchError(Reason.APPLY_FAILED, f"{op.label}: {again.message}") from None
            _trace_repair(trace, op, fail, operations[before:])
        operations.append(op.out)
        if recording:
            trace.record(OperationApplied, index=op.index, op=op.op, path=op.path, from_=op.frm, repair=False)

    if not modifies:
        return unchanged(pod)
    check_pod(pod, doc.root, parts_changed(parsed))
    return CheckedPatch(operations, repaired, tuple(doc.warnings), doc.root)


def _trace_repair(trace: IReviewTrace, op: Op, fail: Fail, inserted: list[dict[str, Any]]) -> None:
    paths = ", ".join(i["path"] for i in inserted)
    trace.record(Repaired, index=op.index, message=f"{op.label}: {fail.message}; amp inserted add {paths}")
    for i in inserted:
        trace.record(OperationApplied, index=None, op=i["op"], path=i["path"], from_=None, repair=True)


def unchanged(pod: dict[str, Any]) -> CheckedPatch:
    """
    The L{CheckedPatch} of a patch that changes nothing: C{pod} as it is.
    """
    return CheckedPatch([], 0, (), pod)
