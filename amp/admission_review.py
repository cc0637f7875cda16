"""
AdmissionReview in and out (pure functions, no I/O).

amp answers in the same C{apiVersion} it was asked in
(C{admission.k8s.io/v1} or C{v1beta1}), always echoes C{request.uid}, and sends
C{patchType: JSONPatch} with a base64 patch only when there is a change.
Warnings are clipped to L{WARNING_LIMIT} characters each and
L{WARNINGS_TOTAL} in all, so the API server never truncates them itself.
The answer's side lives in L{amp.admission_response} (its names are
importable from here too); this module owns the request's.

A request body is refused with a 400 that names the problem when it is not
JSON an API server could have sent: nested deeper than L{MAX_DEPTH} (checked
without recursion before it is parsed; Python's C{json} would otherwise
raise C{RecursionError}), or holding C{NaN}, C{Infinity} or a number out of
range (L{parse_review} accepts integers that fit in 64 bits and finite
floats, as the API server's own decoder does), or a string that is not
valid Unicode (a lone surrogate escape anywhere in the body, named by its
path: msgspec refuses one even where it skips, the careful path names it,
L{amp.text}).

Decoding is done in C (msgspec): the review's fields amp reads, and
C{request.object} as its top-level members' raw bytes (forwarded to the
endpoint as the API server sent them), each decoded once: all at once, or
on the webhook's hot path only the metadata, the rest when read
(L{amp.podjson}; most patches touch only labels and annotations).  What
msgspec refuses, and a body
with nineteen digits in a row (an integer that may be out of 64-bit range,
which msgspec would read as a Python int), goes the careful way: Python's
C{json} with the API server's limits, which also writes the 400's message.
Either way the answer is the same (a property test holds them to it).
Answers are encoded with msgspec too (L{amp.admission_response}).
"""

from __future__ import annotations

import json
import math
from array import array
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any, Optional

import msgspec

from amp.admission_response import (
    AUDIT_VALUE_LIMIT,
    WARNING_LIMIT,
    WARNINGS_TOTAL,
    clean_audit_annotations,
    clip,
    clip_warnings,
    dumps,
    encode_response,
)
from amp.text import lone_surrogate, may_hold_surrogate

__all__ = [
    "API_VERSIONS",
    "AUDIT_VALUE_LIMIT",
    "MAX_DEPTH",
    "RAW_IN_METADATA",
    "WARNINGS_TOTAL",
    "WARNING_LIMIT",
    "AdmissionRequest",
    "ReviewError",
    "clean_audit_annotations",
    "clip",
    "clip_warnings",
    "decode_bounded",
    "dumps",
    "encode_response",
    "long_digits",
    "nesting_exceeds",
    "parse_review",
]

API_VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")

#: Compact UTF-8 JSON, encoded in C.
_encode = msgspec.json.encode

#: How deeply a review body may nest arrays and objects, the AdmissionReview
#: itself counting as one.  A Pod in a review is about 12 deep (the
#: deepest are node affinity terms); the API server's own decoder stops far
#: above this, and Python's would raise C{RecursionError} near 1000.
MAX_DEPTH = 100

#: The integers a review may hold: 64 bits, signed or not.
_INT_RANGE = (-(2**63), 2**64 - 1)


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
    #: The object's JSON as the API server sent it (each top-level member's
    #: bytes as they came, joined compactly), when it was decoded in C;
    #: forwarded to the endpoint as is.
    object_json: Optional[bytes] = None
    #: The whole AdmissionReview's bytes as the API server sent them (a
    #: reference, not a copy), for recording (L{amp.record}).
    body: Optional[bytes] = None

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

    #: L{pod_name}, once computed.
    _pod_name: Optional[str] = field(default=None, repr=False, compare=False)

    @property
    def pod_name(self) -> str:
        """
        The Pod's name, or its generateName with a trailing C{*}; Pods made by
        controllers have no name yet at admission.  Computed once: every
        log line, warning and decision of the review names the Pod.
        """
        name = self._pod_name
        if name is None:
            name = self._pod_name = self._name_of_pod()
        return name

    def _name_of_pod(self) -> str:
        meta = self.object.get("metadata") if isinstance(self.object, dict) else None
        if not isinstance(meta, dict):
            return self.name
        name = meta.get("name") or self.name
        if name:
            return str(name)
        generate = meta.get("generateName")
        return f"{generate}*" if generate else ""


class _NotJSON(ValueError):
    pass


def _no_constant(name: str) -> Any:
    raise _NotJSON(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NotJSON(f"number {text[:40]} is out of range")
    return value


def _bounded_int(text: str) -> int:
    if len(text) > 21:
        raise _NotJSON(f"number {text[:40]}... is out of range")
    value = int(text)
    if not _INT_RANGE[0] <= value <= _INT_RANGE[1]:
        raise _NotJSON(f"number {text} is out of range")
    return value


#: Decodes what an API server could have sent: no NaN or Infinity, numbers
#: in range.
_DECODER = json.JSONDecoder(parse_constant=_no_constant, parse_float=_finite_float, parse_int=_bounded_int)


def decode_bounded(text: str) -> Any:
    """
    JSON text decoded as the API server reads it: no C{NaN} or
    C{Infinity}, integers that fit in 64 bits, finite floats.  The caller
    checks the depth first (L{nesting_exceeds}).

    @raise ValueError: naming the problem (a C{json.JSONDecodeError}, with
        its line and column, when the text is not JSON at all).
    """
    return _DECODER.decode(text)


# For the depth check: brackets and quotes kept ({ and } as [ and ]), then
# each [ as +1 and each ] as -1.
_STRUCTURE = bytes(range(256)).translate(None, b'[]{}"')
_UNIFY = bytes.maketrans(b"{}", b"[]")
_STEPS = bytes.maketrans(b"[]", b"\x01\xff")
_CHUNK = 1 << 16
#: Bracket strings up to this long are peeled (cheap for real Pods, whose
#: depth is small); longer ones are counted.
_PEEL_MAX = 1 << 16


def nesting_exceeds(body: bytes, limit: int = MAX_DEPTH) -> bool:
    """
    Whether the JSON text C{body} nests arrays and objects more than
    C{limit} deep, found without parsing it and without recursion, in a few
    passes over the bytes that the C library makes: the brackets outside
    strings are kept, then innermost pairs are peeled off one level per
    pass.  Bytes that are not JSON get an answer about their brackets;
    parsing them then says what else is wrong.
    """
    first = body.find(b"\\")
    if first >= 0:
        # Escaped backslashes, then escaped quotes: every quote left
        # opens or closes a string.  Only between the first backslash and
        # the character after the last (an API server's managedFields,
        # where the escapes of a Pod usually are, are a part of it): the
        # replacements cost more per byte than anything else here.
        end = body.rfind(b"\\") + 2
        body = b"".join((body[:first], body[first:end].replace(b"\\\\", b"").replace(b'\\"', b""), body[end:]))
    structure = body.translate(_UNIFY, _STRUCTURE)
    brackets = structure.translate(None, b'"')
    if brackets.count(b"[") <= limit:
        return False
    if structure.count(b'""') * 2 == len(structure) - len(brackets):
        # Every run of quotes between two brackets is even: no string holds
        # a bracket (the first one inside a string would follow an odd run,
        # the complete strings since the bracket before it and its own
        # opening quote), so the quotes just go.  Counting is cheaper than
        # cutting out each pair.
        structure = brackets
    else:
        # Strings that hold brackets: keep what lies between them.
        structure = b"".join(structure.replace(b'""', b"").split(b'"')[::2])
    if len(structure) <= _PEEL_MAX:
        peeled = structure
        for _ in range(limit):
            shorter = peeled.replace(b"[]", b"")
            if not shorter:
                return False
            if len(shorter) == len(peeled):
                break  # unbalanced: counted below
            peeled = shorter
        else:
            if b"[]" in peeled:
                return True
    # Unbalanced or very large: the running depth, chunk by chunk, stopping
    # as soon as it passes the limit.
    depth = 0
    for start in range(0, len(structure), _CHUNK):
        steps = array("b", structure[start : start + _CHUNK].translate(_STEPS))
        if max(accumulate(steps, initial=depth)) > limit:
            return True
        depth += sum(steps)
    return False


class _FastKind(msgspec.Struct):
    group: Optional[str] = None
    version: Optional[str] = None
    kind: Optional[str] = None


class _FastRequest(msgspec.Struct):
    """
    C{AdmissionReview.request} as the fast path reads it: the fields amp
    uses, of the types an API server sends (anything else takes the careful
    path, which names what is wrong), and the object's top-level members
    kept as raw JSON.  No field holds a number: what msgspec skips over
    (C{userInfo}, C{oldObject}, ...) amp never reads.
    """

    uid: Optional[str] = None
    kind: Optional[_FastKind] = None
    operation: Optional[str] = None
    namespace: Optional[str] = None
    name: Optional[str] = None
    subResource: Optional[str] = None
    dryRun: Optional[bool] = None
    #: The object's top-level members, each kept as its raw JSON.
    object: Optional[dict[str, msgspec.Raw]] = None


class _FastReview(msgspec.Struct):
    apiVersion: Optional[str] = None
    kind: Optional[str] = None
    request: Optional[_FastRequest] = None


_fast_review = msgspec.json.Decoder(_FastReview).decode
_fast_any = msgspec.json.Decoder().decode
#: An object's members, each as its raw JSON (a ValidationError, which is a
#: DecodeError, when it is not an object).
_fast_members = msgspec.json.Decoder(dict[str, msgspec.Raw]).decode
_MANAGED_FIELDS = b'"managedFields"'
#: Metadata up to this long is decoded whole without looking for
#: managedFields: the search costs more than decoding a small one (and a
#: controller's managedFields alone are longer).
_SMALL_METADATA = 1024
#: Nineteen digits in a row may be an integer out of 64-bit range, which
#: msgspec reads as a Python int: such a body takes the careful path.  Found
#: with a translation (digits to 1, the rest to 0) and a search for 19 ones,
#: both in C: a regular expression takes an order of magnitude longer
#: (bench/README.md, "Figures behind the code").
_DIGITS_AS_ONES = bytes(0x31 if 0x30 <= c <= 0x39 else 0x30 for c in range(256))
_LONG_DIGITS = b"1" * 19


def _decode_fast(body: bytes, lazy: bool) -> Optional[tuple[_FastReview, Any, Optional[bytes]]]:
    """
    The review decoded in C (msgspec), the object as a dict of its
    top-level members with their raw JSON: decoded at once, or (C{lazy})
    only its C{metadata} (but its C{managedFields}), C{apiVersion} and
    C{kind}, the rest left to L{amp.podjson}; and the object's JSON for
    forwarding, its members' bytes as they came.  None when msgspec
    refuses the body, or what it decodes may hold what msgspec reads
    differently from what an API server sends (a long integer, which
    msgspec would read as a Python int): then the careful path below
    decides, and names what is wrong.
    Long integers are looked for in all of the body, or (C{lazy}) in the
    members decoded here: the fields of the request are typed and hold no
    number, and a raw member is checked when it is read.  msgspec refuses
    C{NaN}, C{Infinity}, numbers out of a double's range in what it
    decodes and invalid escapes everywhere; UTF-8 is checked here for the
    whole body (skipping over a raw member does not); the depth is
    checked before either path runs.
    """
    if not lazy and long_digits(body):
        return None
    if not body.isascii():
        try:
            body.decode("utf-8")
        except UnicodeDecodeError:
            return None
    try:
        review = _fast_review(body)
        request = review.request
        if request is None or request.object is None:
            return review, None, None
        members = request.object
        pod: dict[str, Any] = dict(members)
        for key, raw in members.items():
            if not lazy:
                pod[key] = _fast_any(raw)
            elif key in _EAGER:
                if len(raw) > 18:
                    # The bytes once, for both searches.
                    data = bytes(raw)
                    if long_digits(data):
                        return None
                    if key == "metadata" and len(data) > _SMALL_METADATA and _is_managed(data):
                        # A Pod from an API server: its managedFields stay
                        # raw, the metadata's other members are decoded one
                        # by one.
                        pod[key] = {
                            name: value if name in RAW_IN_METADATA else _fast_any(value)
                            for name, value in _fast_members(raw).items()
                        }
                        continue
                pod[key] = _fast_any(raw)
        return review, pod, _encode(members)
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
        # msgspec raises UnicodeDecodeError itself for invalid UTF-8 inside
        # a string; the careful path names it in the 400.
        return None


def _is_managed(metadata: bytes) -> bool:
    """
    Whether the raw JSON C{metadata} is an object that may hold
    managedFields (anything else is decoded whole, and what is wrong with
    it said there).
    """
    return metadata.startswith(b"{") and _MANAGED_FIELDS in metadata


def long_digits(text: Any) -> bool:
    """
    Whether the JSON C{text} (bytes, or a C{msgspec.Raw}) has nineteen
    digits in a row: a number there may be out of 64-bit range.
    """
    return _LONG_DIGITS in bytes(text).translate(_DIGITS_AS_ONES)


#: The members of a lazily decoded object that are decoded at once: what
#: every review reads (names, labels, annotations, the stamp).
_EAGER = frozenset({"metadata", "apiVersion", "kind"})
#: The members of a lazily decoded object's metadata that are kept raw
#: (L{amp.podjson}): what an API server fills in and amp does not read.
RAW_IN_METADATA = frozenset({"managedFields"})


def parse_review(body: bytes, *, lazy: bool = False) -> AdmissionRequest:
    """
    Parse an AdmissionReview request body.

    @param lazy: keep the object's members other than its metadata, and
        the metadata's C{managedFields}, as raw JSON (L{amp.podjson}),
        decoded when something reads them: the webhook's hot path.  A
        number out of range in such a member, or in a part of the review
        amp does not read (C{userInfo}, C{oldObject}),
        which an API server never sends, is not refused here then; in a
        member, it is when the member is read (L{amp.podjson.MemberError}).
    @raise ReviewError: 400 with a message that says what is wrong.
    """
    if nesting_exceeds(body):
        raise ReviewError(
            400, f"request body nests arrays and objects more than {MAX_DEPTH} deep; an AdmissionReview never does"
        )
    fast = _decode_fast(body, lazy)
    if fast is not None:
        review, pod, object_json = fast
        request = review.request
        if request is None:
            return _checked(review.apiVersion, review.kind, None, None, None)
        kind = request.kind
        fields = {
            "uid": request.uid,
            "operation": request.operation,
            "kind": None if kind is None else {"group": kind.group, "version": kind.version, "kind": kind.kind},
            "namespace": request.namespace,
            "name": request.name,
            "subResource": request.subResource,
            "dryRun": request.dryRun,
        }
        req = _checked(review.apiVersion, review.kind, fields, pod, object_json)
    else:
        req = _parse_careful(body)
    req.body = body
    return req


def _parse_careful(body: bytes) -> AdmissionRequest:
    """
    L{parse_review} with Python's C{json} and the API server's limits on
    numbers: for what msgspec refuses or may read differently, and what
    names the problem in a 400.
    """
    try:
        doc = _DECODER.decode(_text(body))
    except _NotJSON as e:
        raise ReviewError(400, f"request body is not JSON an API server sends: {e}") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise ReviewError(400, f"request body is not valid JSON: {e}") from None
    except RecursionError:
        # Not reached: nesting_exceeds() stops anything this deep.
        raise ReviewError(400, f"request body nests arrays and objects more than {MAX_DEPTH} deep") from None
    if not isinstance(doc, dict):
        raise ReviewError(400, "request body is not a JSON object (expected an AdmissionReview)")
    # msgspec refuses lone surrogates; Python's json reads them (L{amp.text}).
    surrogate = lone_surrogate(doc) if may_hold_surrogate(body) else None
    if surrogate is not None:
        raise ReviewError(
            400,
            f"request body holds a string that is not valid Unicode (a lone surrogate "
            f"escape) at {surrogate}; an API server never sends one",
        )
    request = doc.get("request")
    return _checked(
        doc.get("apiVersion"),
        doc.get("kind"),
        request if isinstance(request, dict) else None,
        request.get("object") if isinstance(request, dict) else None,
        None,
    )


def _checked(
    api_version: Any, kind_of_review: Any, request: Optional[dict[str, Any]], pod: Any, object_json: Optional[bytes]
) -> AdmissionRequest:
    """
    The fields amp uses, checked; C{object_json} is the object's JSON as
    it came, when it was kept.
    """
    if api_version not in API_VERSIONS:
        raise ReviewError(400, f"apiVersion {api_version!r} is not one of {', '.join(API_VERSIONS)}")
    if kind_of_review != "AdmissionReview":
        raise ReviewError(400, f"kind {kind_of_review!r} is not AdmissionReview")
    if request is None:
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
        object=pod,
        object_json=object_json if isinstance(pod, dict) else None,
    )


def _text(body: bytes) -> str:
    """
    C{body} as text, in the encodings JSON allows (what C{json.loads} does
    with bytes).
    """
    return body.decode(json.detect_encoding(body), "surrogatepass")
