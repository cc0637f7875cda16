"""
The endpoint protocol's reply (pure).

An endpoint answers either with a bare JSON array of JSON Patch operations
(the Go amp's protocol) or with an object::

    {"patch": [...], "allowed": true, "status": {"code": 403, "message": "..."},
     "warnings": ["..."], "auditAnnotations": {"key": "value"}}

L{parse_reply} turns the bytes into an L{EndpointDecision} or raises
L{ReplyError} naming what is wrong.  Whether the patch applies is
L{amp.patch}'s business, not this module's.

What is not JSON is C{invalid-json}: besides what Python's C{json} refuses,
C{NaN} and C{Infinity} (which it accepts), numbers out of a double's range
(which it would read as infinity), and arrays and objects nested deeper than
L{MAX_DEPTH}.  Replies are decoded in C (msgspec, which refuses all of these
by itself); what it refuses is tried again with Python's C{json} (other
encodings JSON allows), so the verdict is unchanged; a string that is not
valid Unicode (a lone surrogate escape), which amp could not encode in its
answer, is C{invalid-json} naming where it is.  The depth is checked before parsing and without recursion
(L{amp.admission_review.nesting_exceeds}, the review's own check): Python's C{json} recurses once per level and fails
with C{RecursionError} near a thousand, and whatever walks the parsed reply
afterwards (patch checks, copies, encoding) recurses too.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

import msgspec

from amp.admission_review import nesting_exceeds
from amp.text import lone_surrogate, may_hold_surrogate

_OBJECT_KEYS = frozenset({"patch", "allowed", "status", "warnings", "auditAnnotations"})

#: The deepest nesting of arrays and objects a reply may have.  A Pod is
#: about ten levels deep at its deepest (spec, containers, an item, env, an
#: item, valueFrom, secretKeyRef), a reply wraps it in three more (the
#: object form, the patch, an operation): 100 leaves room for any real
#: reply, and is far below where Python's own recursion gives out.
MAX_DEPTH = 100


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"{text} is out of range")
    return value


class ReplyError(ValueError):
    """
    The endpoint's reply is not in the protocol; C{reason} is
    C{invalid-json} or C{invalid-reply}.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


# Not frozen: a frozen dataclass's __init__ sets each field through
# object.__setattr__, several times the cost of a plain one (bench/README.md, "Figures behind the code");
# one is made for every review,
# and nothing changes it once made.
@dataclass(slots=True)
class EndpointDecision:
    patch: list[Any] = field(default_factory=list)
    allowed: bool = True
    code: int = 403
    message: str = ""
    warnings: tuple[str, ...] = ()
    audit: Mapping[str, Any] = field(default_factory=dict)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return "string" if isinstance(value, str) else type(value).__name__


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_decode_fast = msgspec.json.Decoder().decode


def _decode(body: bytes) -> Any:
    """
    The reply's JSON: decoded in C (msgspec, which refuses C{NaN},
    C{Infinity} and numbers out of a double's range by itself); what
    msgspec refuses is tried again with Python's C{json}, which reads the
    other encodings JSON allows and lone surrogates, as before.
    """
    try:
        return _decode_fast(body)
    except (msgspec.DecodeError, RecursionError):
        doc = json.loads(body, parse_constant=_no_constants, parse_float=_finite)
    # msgspec refuses lone surrogates; Python's json reads them, and amp
    # could not encode its answer with one (L{amp.text}).
    surrogate = lone_surrogate(doc) if may_hold_surrogate(body) else None
    if surrogate is not None:
        raise ReplyError(
            "invalid-json",
            f"endpoint reply holds a string that is not valid Unicode (a lone surrogate escape) at {surrogate}",
        )
    return doc


def parse_reply(body: bytes) -> EndpointDecision:
    """
    Parse an endpoint's 2xx reply body.

    @raise ReplyError: when it is not JSON or not one of the two forms.
    """
    if not body.strip():
        raise ReplyError("invalid-json", "endpoint replied with an empty body (send [] for no change)")
    if nesting_exceeds(body, MAX_DEPTH):
        raise ReplyError("invalid-json", f"endpoint reply is nested deeper than {MAX_DEPTH} levels")
    try:
        doc = _decode(body)
    except ReplyError:
        raise
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise ReplyError("invalid-json", "endpoint reply is not JSON") from None
    if isinstance(doc, list):
        return EndpointDecision(patch=doc)
    if not isinstance(doc, dict):
        raise ReplyError(
            "invalid-reply",
            f"endpoint reply is a JSON {_json_type(doc)}, expected an array of patch operations or an object",
        )
    unknown = set(doc) - _OBJECT_KEYS
    if unknown:
        raise ReplyError("invalid-reply", f"endpoint reply has unknown key {sorted(unknown)[0]!r}")
    patch = doc.get("patch")
    if patch is None:
        patch = []
    if not isinstance(patch, list):
        raise ReplyError("invalid-reply", "endpoint reply 'patch' is not an array")
    allowed = doc.get("allowed", True)
    if not isinstance(allowed, bool):
        raise ReplyError("invalid-reply", "endpoint reply 'allowed' is not true or false")
    status = doc.get("status") or {}
    if not isinstance(status, dict):
        raise ReplyError("invalid-reply", "endpoint reply 'status' is not an object")
    code = status.get("code", 403)
    if isinstance(code, bool) or not isinstance(code, int) or not 400 <= code <= 599:
        code = 403
    message = status.get("message", "")
    if not isinstance(message, str):
        raise ReplyError("invalid-reply", "endpoint reply 'status.message' is not a string")
    warnings = doc.get("warnings") or []
    if not isinstance(warnings, list) or not all(isinstance(w, str) for w in warnings):
        raise ReplyError("invalid-reply", "endpoint reply 'warnings' is not an array of strings")
    audit = doc.get("auditAnnotations") or {}
    if not isinstance(audit, dict):
        raise ReplyError("invalid-reply", "endpoint reply 'auditAnnotations' is not an object")
    return EndpointDecision(patch, allowed, code, message, tuple(warnings), audit)
