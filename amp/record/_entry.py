"""
One recorded review as one JSON line: what the recorder captures on the
reactor thread, how the writer process turns it into a line, and how replay
reads a line back (pure).

A line (format 1)::

    {"amp_recording": 1, "time": "2026-11-26T15:04:05.123Z", "uid": "...",
     "review": {...the AdmissionReview as the API server sent it...},
     "namespace": {"name": "...", "labels": {...}, "annotations": {...}},
     "route": {"endpoints": ["http://sidecar.inject:8080/inject"],
               "failure_policy": "Ignore", "mode": "normal"},
     "answer": {"result": "patched", "reason": "", "allowed": true,
                "patch": [...] or null, "stamp": "mutated http://..." or null,
                "warnings": [...], "message": ""},
     "redacted": false}

The route names endpoints as every output of amp does (origin and path,
L{amp.urls}); the namespace's annotations are kept as amp saw them, since
replay routes the review from them again (the recording is sensitive: see
docs/endpoints.md).  Capturing costs the reactor a tuple and a frame (the
small fields as JSON; the bodies are passed on as they are): the review's
and the answer's bytes are decoded, redacted and encoded in the writer
process (L{amp.record._writer}).
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from amp.files import FileError, parse_json
from amp.podjson import json_object
from amp.record._redact import Redactor
from amp.rules import STATUS_ANNOTATION
from amp.timestamps import rfc3339

__all__ = ["Capture", "RecordedReview", "RecordingError", "FORMAT", "encode_line", "decode_line", "stamp_of"]

#: The format of the lines this version writes and reads.
FORMAT = 1

#: The most bytes one recorded line may have when read back: a review is at
#: most 3 MiB on the API server's side, its answer's patch is capped by
#: C{patch.max_size}, and JSON escaping can grow either.
LINE_LIMIT = 16 * 1024 * 1024

#: How deep a recorded line may nest (a review's own limit, plus the
#: envelope's two levels).
DEPTH_LIMIT = 104


class RecordingError(ValueError):
    """A recorded line that cannot be used; the message says why."""


@dataclass(frozen=True, slots=True)
class Capture:
    """
    What the recorder takes of one review on the reactor thread: references
    only, no copying or encoding.

    @ivar request_body: the AdmissionReview's bytes as the API server sent them.
    @ivar answer_body: the AdmissionReview amp answered with.
    @ivar endpoints: the route's endpoints as amp shows them.
    """

    time: float
    uid: str
    namespace: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    endpoints: tuple[str, ...]
    failure_policy: str
    mode: str
    request_body: bytes
    answer_body: bytes
    result: str
    reason: str
    #: The review's trace (L{amp.tracing}), or C{""} when it was not traced.
    trace_id: str = ""


@dataclass(frozen=True, slots=True)
class RecordedReview:
    """
    One line of a recording, read back.

    @ivar where: C{file:line}, for messages.
    @ivar review: the AdmissionReview as recorded (a dict).
    @ivar patch: the recorded answer's JSON Patch, or None for none.
    """

    where: str
    time: str
    uid: str
    review: dict[str, Any]
    namespace: str
    labels: dict[str, str]
    annotations: dict[str, str]
    endpoints: tuple[str, ...]
    result: str
    reason: str
    allowed: bool
    patch: Optional[list[Any]]
    stamp: Optional[str]
    warnings: tuple[str, ...] = ()
    message: str = ""
    redacted: bool = False
    #: The failure policy the review was answered under (C{Ignore}/C{Fail}), or C{""}.
    failure_policy: str = ""
    #: The review's trace id, when it was traced, or C{""}.
    trace_id: str = ""

    @property
    def pod(self) -> Any:
        """The Pod the API server sent."""
        return (self.review.get("request") or {}).get("object")

    @property
    def pod_name(self) -> str:
        pod = self.pod if isinstance(self.pod, dict) else {}
        meta = json_object(pod.get("metadata"))
        return str(meta.get("name") or meta.get("generateName") or "")

    def review_bytes(self) -> bytes:
        """The AdmissionReview to send again."""
        return json.dumps(self.review, separators=(",", ":")).encode()


def stamp_of(patch: Optional[list[Any]]) -> Optional[str]:
    """The status stamp a patch writes, or None."""
    for op in patch or ():
        if not isinstance(op, dict) or op.get("op") not in ("add", "replace"):
            continue
        path = op.get("path")
        value = op.get("value")
        if path == "/metadata/annotations/amp.txn2.com~1status" and isinstance(value, str):
            return value
        if path == "/metadata/annotations" and isinstance(op.get("value"), dict):
            value = op["value"].get(STATUS_ANNOTATION)
            if isinstance(value, str):
                return value
    return None


def _answer(answer_body: bytes) -> dict[str, Any]:
    response = json.loads(answer_body).get("response") or {}
    patch: Optional[list[Any]] = None
    if response.get("patch"):
        patch = json.loads(base64.b64decode(response["patch"]))
    status = response.get("status") or {}
    return {
        "allowed": bool(response.get("allowed")),
        "patch": patch,
        "warnings": list(response.get("warnings") or ()),
        "message": str(status.get("message") or ""),
    }


def encode_line(capture: Capture, redactor: Optional[Redactor] = None) -> bytes:
    """
    The line for C{capture}, newline included (in the writer process).
    Raises C{ValueError} when either body is not the JSON amp handled.

    Without redaction, a review sent on one line (as the API server sends
    it: compact JSON, which amp's parser accepted) is written as its own
    bytes, not decoded and encoded again: the writer's CPU comes from the
    same cores as amp's.
    """
    raw = capture.request_body
    answer = _answer(capture.answer_body)
    annotations: Mapping[str, str] = capture.annotations
    review_json: bytes
    if redactor is None and b"\n" not in raw and b"\r" not in raw:
        review_json = raw.strip()
    else:
        review = json.loads(raw)
        if redactor is not None:
            request = dict(review.get("request") or {})
            for key in ("object", "oldObject"):
                if key in request:
                    request[key] = redactor.pod(request[key])
            review = dict(review, request=request)
            answer["patch"] = redactor.patch(answer["patch"])
            annotations = redactor.annotations(dict(annotations))
        review_json = json.dumps(review, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()
    line = {
        "amp_recording": FORMAT,
        "time": rfc3339(capture.time),
        "uid": capture.uid,
        "namespace": {"name": capture.namespace, "labels": dict(capture.labels), "annotations": dict(annotations)},
        "route": {"endpoints": list(capture.endpoints), "failure_policy": capture.failure_policy, "mode": capture.mode},
        "answer": {
            "result": capture.result,
            "reason": capture.reason,
            "allowed": answer["allowed"],
            "patch": answer["patch"],
            "stamp": stamp_of(answer["patch"]),
            "warnings": answer["warnings"],
            "message": answer["message"],
        },
        "redacted": redactor is not None,
    }
    if capture.trace_id:
        line["trace_id"] = capture.trace_id
    head = json.dumps(line, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()
    return head[:-1] + b',"review":' + review_json + b"}\n"


def _strings(value: Any, what: str, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise RecordingError(f"{where}: {what} is not a map of strings")
    return {str(k): v for k, v in value.items()}


def decode_line(line: bytes, where: str) -> RecordedReview:
    """
    Read one recorded line back; a L{RecordingError} that names C{where}
    and the problem when it cannot be used.
    """
    if len(line) > LINE_LIMIT:
        raise RecordingError(f"{where}: line is longer than {LINE_LIMIT} bytes")
    try:
        data = parse_json(line, "the line", DEPTH_LIMIT)
    except FileError as e:
        raise RecordingError(f"{where}: {e}") from None
    if not isinstance(data, dict) or data.get("amp_recording") != FORMAT:
        raise RecordingError(f"{where}: not a line of an amp recording (format {FORMAT})")
    review = data.get("review")
    if not isinstance(review, dict) or not isinstance(review.get("request"), dict):
        raise RecordingError(f"{where}: review.request is missing")
    try:
        namespace = data["namespace"]
        route = data.get("route") or {}
        answer = data["answer"]
        if not isinstance(namespace, dict) or not isinstance(answer, dict):
            raise RecordingError(f"{where}: namespace or answer is not an object")
        patch = answer.get("patch")
        if patch is not None and not isinstance(patch, list):
            raise RecordingError(f"{where}: answer.patch is not a list")
        return RecordedReview(
            where=where,
            time=str(data.get("time") or ""),
            uid=str(data.get("uid") or ""),
            review=review,
            namespace=str(namespace["name"]),
            labels=_strings(namespace.get("labels"), "namespace.labels", where),
            annotations=_strings(namespace.get("annotations"), "namespace.annotations", where),
            endpoints=tuple(str(e) for e in route.get("endpoints") or ()),
            result=str(answer["result"]),
            reason=str(answer.get("reason") or ""),
            allowed=bool(answer.get("allowed")),
            patch=patch,
            stamp=answer.get("stamp"),
            warnings=tuple(str(w) for w in answer.get("warnings") or ()),
            message=str(answer.get("message") or ""),
            redacted=bool(data.get("redacted")),
            failure_policy=str(route.get("failure_policy") or ""),
            trace_id=str(data.get("trace_id") or ""),
        )
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        if isinstance(e, RecordingError):
            raise
        raise RecordingError(f"{where}: missing or malformed field {e}") from None
