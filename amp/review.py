"""
AdmissionReview in and out (pure functions, no I/O).

amp answers in the same C{apiVersion} it was asked in
(C{admission.k8s.io/v1} or C{v1beta1}), always echoes C{request.uid}, and sends
C{patchType: JSONPatch} with a base64 patch only when there is a change.
Warnings are clipped to L{WARNING_LIMIT} characters each and
L{WARNINGS_TOTAL} in all, so the API server never truncates them itself.
"""

from __future__ import annotations

import base64
import json
import os
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional

API_VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")

#: The API server cuts warnings at 256 characters; amp keeps each one under
#: 120, well below that.
WARNING_LIMIT = 119
#: ... and at 4 KiB in total.
WARNINGS_TOTAL = 4000
#: Audit annotation keys are prefixed by the API server with the webhook name
#: and a slash, so ours must be a bare name part (no slash).
_AUDIT_KEY = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")
AUDIT_VALUE_LIMIT = 1024

_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


class ReviewError(Exception):
    """
    A request amp cannot review; C{code} is the HTTP status to answer with.
    """

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(slots=True)
class AdmissionRequest:
    """
    The parts of C{AdmissionReview.request} that amp uses.
    """

    api_version: str
    uid: str
    group: str
    version: str
    kind: str
    operation: str
    namespace: str
    name: str
    sub_resource: str
    dry_run: bool
    object: Any
    #: The object's JSON exactly as the API server sent it, when it could be
    #: cut out of the body; forwarded to the endpoint as is.
    object_json: Optional[bytes] = None

    @property
    def is_pod_create(self) -> bool:
        return (
            self.kind == "Pod"
            and self.group == ""
            and self.operation == "CREATE"
            and not self.sub_resource
            and isinstance(self.object, dict)
        )

    @property
    def is_ephemeral_update(self) -> bool:
        """
        A Pod UPDATE through the C{pods/ephemeralcontainers} subresource
        (C{kubectl debug}): only C{spec.ephemeralContainers} may change.
        """
        return (
            self.kind == "Pod"
            and self.group == ""
            and self.operation == "UPDATE"
            and self.sub_resource == "ephemeralcontainers"
            and isinstance(self.object, dict)
        )

    @property
    def pod_name(self) -> str:
        """
        The Pod's name, or its generateName with a trailing C{*}; Pods made by
        controllers have no name yet at admission.
        """
        meta = self.object.get("metadata") if isinstance(self.object, dict) else None
        if not isinstance(meta, dict):
            return self.name
        name = meta.get("name") or self.name
        if name:
            return str(name)
        generate = meta.get("generateName")
        return f"{generate}*" if generate else ""


_scan_once = json.JSONDecoder().scan_once
_KEY_COLON = re.compile(r'"object"[ \t\n\r]*:[ \t\n\r]*')
#: Stands in for request.object while the rest of the review is parsed;
#: a NUL and a per-process token, so no real review contains it.
_SENTINEL = f"\x00amp-object-{os.urandom(8).hex()}"
_SENTINEL_JSON = json.dumps(_SENTINEL)


def _split_object(body: bytes) -> Optional[tuple[dict, bytes]]:
    """
    Parse the review and cut C{request.object}'s JSON out of C{body}, for
    forwarding without serialising the Pod again (for large Pods that costs
    as much as parsing it).  The object is parsed once, the rest of the
    review once with a sentinel in the object's place; the sentinel landing
    at C{request.object} proves the cut was the right one.  None when
    anything is unusual: the caller then parses the whole body the plain
    way, which also produces the error messages.
    """
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return None
    pos = 0
    for _ in range(3):
        m = _KEY_COLON.search(text, pos)
        if m is None:
            return None
        start = m.end()
        try:
            value, end = _scan_once(text, start)
            doc = json.loads(text[:start] + _SENTINEL_JSON + text[end:])
        except (StopIteration, ValueError):
            return None
        request = doc.get("request") if isinstance(doc, dict) else None
        if isinstance(request, dict) and request.get("object") == _SENTINEL:
            request["object"] = value
            raw = body[start:end] if body.isascii() else text[start:end].encode("utf-8")
            return doc, raw
        pos = m.start() + 1
    return None


def parse_review(body: bytes) -> AdmissionRequest:
    """
    Parse an AdmissionReview request body.

    @raise ReviewError: 400 with a message that says what is wrong.
    """
    split = _split_object(body)
    if split is not None:
        doc, object_json = split
    else:
        object_json = None
        try:
            doc = json.loads(body)
        except (ValueError, UnicodeDecodeError) as e:
            raise ReviewError(400, f"request body is not valid JSON: {e}") from None
    if not isinstance(doc, dict):
        raise ReviewError(400, "request body is not a JSON object (expected an AdmissionReview)")
    api_version = doc.get("apiVersion")
    if api_version not in API_VERSIONS:
        raise ReviewError(400, f"apiVersion {api_version!r} is not one of {', '.join(API_VERSIONS)}")
    if doc.get("kind") != "AdmissionReview":
        raise ReviewError(400, f"kind {doc.get('kind')!r} is not AdmissionReview")
    request = doc.get("request")
    if not isinstance(request, dict):
        raise ReviewError(400, "AdmissionReview has no request object")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise ReviewError(400, "AdmissionReview request.uid is missing or not a string")
    kind = request.get("kind")
    if not isinstance(kind, dict):
        raise ReviewError(400, "AdmissionReview request.kind is missing or not an object")
    operation = request.get("operation")
    if not isinstance(operation, str):
        raise ReviewError(400, "AdmissionReview request.operation is missing or not a string")
    namespace = request.get("namespace") or ""
    if not isinstance(namespace, str):
        raise ReviewError(400, "AdmissionReview request.namespace is not a string")
    dry_run = request.get("dryRun") or False
    if not isinstance(dry_run, bool):
        raise ReviewError(400, "AdmissionReview request.dryRun is not a boolean")
    return AdmissionRequest(
        api_version=api_version,
        uid=uid,
        group=str(kind.get("group") or ""),
        version=str(kind.get("version") or ""),
        kind=str(kind.get("kind") or ""),
        operation=operation,
        namespace=namespace,
        name=str(request.get("name") or ""),
        sub_resource=str(request.get("subResource") or ""),
        dry_run=dry_run,
        object=request.get("object"),
        object_json=object_json if isinstance(request.get("object"), dict) else None,
    )


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
    patch: Optional[list] = None,
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
            patch_bytes = _dumps(patch).encode("utf-8")
        if patch_bytes and patch_bytes != b"[]":
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(patch_bytes).decode("ascii")
    else:
        status: dict[str, Any] = {"status": "Failure", "code": code, "message": message}
        if reason:
            status["reason"] = reason
        response["status"] = status
    clipped = clip_warnings(warnings)
    if clipped:
        response["warnings"] = clipped
    if audit:
        response["auditAnnotations"] = dict(audit)
    review = {"apiVersion": request_api_version, "kind": "AdmissionReview", "response": response}
    return _dumps(review).encode("utf-8")


def dumps(value: Any) -> bytes:
    """
    Compact JSON, as amp sends it everywhere.
    """
    return _dumps(value).encode("utf-8")
