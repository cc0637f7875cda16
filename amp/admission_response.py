"""
The AdmissionReview answer out (pure functions, no I/O): the response
amp sends (L{encode_response}: the same C{apiVersion} and C{uid}, a base64
JSONPatch only when there is a change), warnings clipped to
L{WARNING_LIMIT} characters each and L{WARNINGS_TOTAL} in all, the audit
annotations the API server accepts, and compact JSON as amp sends it
everywhere (L{dumps}).  The request side is L{amp.admission_review}.
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Mapping, Optional

import msgspec

#: The API server cuts warnings at 256 characters; amp keeps each one under
#: 120, well below that.
WARNING_LIMIT = 119
#: ... and at 4 KiB in total.
WARNINGS_TOTAL = 4000
#: Audit annotation keys are prefixed by the API server with the webhook name
#: and a slash, so ours must be a bare name part (no slash).
_AUDIT_KEY = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")
AUDIT_VALUE_LIMIT = 1024

#: Compact UTF-8 JSON, encoded in C.
_encode = msgspec.json.encode


def clip(text: str, limit: int = WARNING_LIMIT) -> str:
    """
    Shorten C{text} to at most C{limit} characters, on one line.
    """
    text = " ".join(str(text).split())
    if len(text) <= limit:
        return text
    return text[: limit - 3] + "..."


def clip_warnings(warnings: Iterable[str]) -> list[str]:
    """
    Clip each warning and keep the list under L{WARNINGS_TOTAL} characters.
    """
    out: list[str] = []
    total = 0
    for w in warnings:
        w = clip(w)
        if not w:
            continue
        if total + len(w) > WARNINGS_TOTAL:
            break
        out.append(w)
        total += len(w)
    return out


def clean_audit_annotations(annotations: Mapping[str, Any]) -> tuple[dict[str, str], list[str]]:
    """
    Keep the audit annotations the API server will accept; return them and
    a list of problems with the rest.
    """
    good: dict[str, str] = {}
    problems: list[str] = []
    for key, value in annotations.items():
        if not isinstance(key, str) or not _AUDIT_KEY.match(key):
            problems.append(f"audit annotation key {str(key)[:40]!r} dropped (must be a name without '/')")
            continue
        good[key] = clip(str(value), AUDIT_VALUE_LIMIT)
    return good, problems


def encode_response(
    request_api_version: str,
    uid: str,
    *,
    allowed: bool = True,
    patch: Optional[list[Any]] = None,
    patch_bytes: Optional[bytes] = None,
    warnings: Iterable[str] = (),
    audit: Optional[Mapping[str, str]] = None,
    code: int = 403,
    message: str = "",
    reason: str = "",
) -> bytes:
    """
    Serialise the AdmissionReview answer.

    C{patch} (a list of operations) or C{patch_bytes} (its JSON) is sent only
    when C{allowed} and non-empty.
    """
    response: dict[str, Any] = {"uid": uid, "allowed": allowed}
    if allowed:
        if patch_bytes is None and patch:
            patch_bytes = _encode(patch)
        if patch_bytes and patch_bytes != b"[]":
            response["patchType"] = "JSONPatch"
            # msgspec writes bytes as standard base64, padded: in C, with
            # no string between (half the time of base64 then a string;
            # bench/README.md, "Figures behind the code").
            response["patch"] = patch_bytes
    else:
        status: dict[str, Any] = {"status": "Failure", "code": code, "message": message}
        if reason:
            status["reason"] = reason
        response["status"] = status
    if warnings:
        clipped = clip_warnings(warnings)
        if clipped:
            response["warnings"] = clipped
    if audit:
        response["auditAnnotations"] = dict(audit)
    review = {"apiVersion": request_api_version, "kind": "AdmissionReview", "response": response}
    return _encode(review)


def dumps(value: Any) -> bytes:
    """
    Compact JSON, as amp sends it everywhere.
    """
    return _encode(value)
