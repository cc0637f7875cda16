"""
The last decisions amp took, for C{GET /debug/reviews} on the metrics port.

L{RecentDecisions} is a bounded ring buffer of L{Decision}s (pure: no
reactor, no I/O); the webhook's response path records one per review
(L{amp.web.ReviewHandler}), after the answer is written.  A decision
holds only what the review's log line holds: uid, time, namespace, Pod
name, endpoint origin, result, reason, the answer's message (already
masked, as in the Pod's warnings and audit annotation) and the duration;
never the Pod, its annotations' values or the patch.

L{RecentDecisionsResource} serves them as a JSON list, or JSON lines with
C{?format=jsonl}, newest last, filtered by the C{namespace}, C{pod} and
C{uid} query parameters.  A size of 0 (C{metrics.debug_reviews: 0}) keeps
nothing and answers 404.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import asdict, dataclass, replace
from typing import Any, Iterable, Optional

from twisted.web.resource import Resource
from twisted.web.server import Request

from amp.suggest import did_you_mean
from amp.timestamps import rfc3339


# Not frozen: a frozen dataclass's __init__ sets each field through
# object.__setattr__, several times the cost of a plain one (bench/README.md, "Figures behind the code");
# one is made for every review,
# and nothing changes it once made.
@dataclass(slots=True)
class Decision:
    """
    One review's decision, as C{/debug/reviews} shows it.

    @ivar time: when the answer was written (seconds since the epoch).
    @ivar endpoint: the endpoint's origin (or a chain's, comma-separated),
        or C{""}.
    @ivar message: what the answer said besides the result (a deny's or a
        failure's message), or C{""}.
    """

    uid: str
    time: float
    namespace: str
    pod: str
    endpoint: str
    result: str
    reason: str
    message: str
    duration_ms: float
    #: The canary's comparison (L{amp.canary}): same, differs, failed,
    #: skipped; C{""} when the review had none.
    canary: str = ""
    #: With C{canary: differs}, the JSON paths where the candidate's Pod differs.
    canary_paths: tuple[str, ...] = ()
    #: The review's trace (L{amp.tracing}: 32 hex digits), or C{""} when it was not traced.
    trace_id: str = ""

    def as_json(self) -> dict[str, Any]:
        """
        The decision as a JSON object: C{time} in RFC 3339 (UTC, to the
        millisecond), C{duration_ms} rounded to 0.1 ms; C{canary} and
        C{canary_paths} only for a review that had a canary, C{trace_id}
        only for a review that was traced.
        """
        out = asdict(self)
        out["time"] = rfc3339(self.time)
        out["duration_ms"] = round(self.duration_ms, 1)
        if not self.canary:
            del out["canary"], out["canary_paths"]
        else:
            out["canary_paths"] = list(self.canary_paths)
        if not self.trace_id:
            del out["trace_id"]
        return out


#: The most characters kept of a decision's uid, namespace, Pod name,
#: endpoint and reason (Kubernetes names are at most 253), and of its
#: message (amp's messages are clipped at 1024 already): a request can carry
#: any string, and the buffer's memory must stay bounded.
FIELD_LIMIT = 256
MESSAGE_LIMIT = 1024
#: The most canary paths kept per decision, and canary results kept for
#: decisions not recorded yet.
PATHS_LIMIT = 32
EARLY_LIMIT = 1024


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


class RecentDecisions:
    """
    The last C{size} decisions, oldest first; older ones are dropped.  Each
    field is clipped (L{FIELD_LIMIT}, L{MESSAGE_LIMIT}), so the memory held
    is bounded whatever the requests carried.
    """

    def __init__(self, size: int) -> None:
        self._decisions: deque[Decision] = deque(maxlen=max(size, 0))
        #: Canary results that came before their review's decision, by uid.
        self._early: dict[str, tuple[str, tuple[str, ...]]] = {}

    @property
    def size(self) -> int:
        """
        How many decisions are kept (0: none, and the endpoint is off).
        """
        return self._decisions.maxlen or 0

    def resize(self, size: int) -> None:
        """
        Keep C{size} decisions from now on, the newest of those held.
        """
        if size != self.size:
            self._decisions = deque(self._decisions, maxlen=max(size, 0))

    def record(self, decision: Decision) -> None:
        if not self._decisions.maxlen:
            return
        d = decision
        if self._early:
            canary = self._early.pop(_clip(d.uid, FIELD_LIMIT), None)
            if canary is not None:
                d = replace(d, canary=canary[0], canary_paths=canary[1])
        if max(len(d.uid), len(d.namespace), len(d.pod), len(d.endpoint), len(d.reason)) > FIELD_LIMIT or (
            len(d.message) > MESSAGE_LIMIT
        ):
            d = replace(
                d,
                uid=_clip(d.uid, FIELD_LIMIT),
                namespace=_clip(d.namespace, FIELD_LIMIT),
                pod=_clip(d.pod, FIELD_LIMIT),
                endpoint=_clip(d.endpoint, FIELD_LIMIT),
                reason=_clip(d.reason, FIELD_LIMIT),
                message=_clip(d.message, MESSAGE_LIMIT),
            )
        self._decisions.append(d)

    def annotate(self, uid: str, canary: str, paths: tuple[str, ...]) -> None:
        """
        Set a review's canary result, on its decision if it is held, else
        on the decision when it comes (the comparison can end before the
        answer is written).
        """
        if not self._decisions.maxlen:
            return
        paths = tuple(_clip(p, FIELD_LIMIT) for p in paths[:PATHS_LIMIT])
        for i in range(len(self._decisions) - 1, -1, -1):
            d = self._decisions[i]
            if d.uid == uid:
                self._decisions[i] = replace(d, canary=canary, canary_paths=paths)
                return
        if len(self._early) >= EARLY_LIMIT:
            self._early.pop(next(iter(self._early)))
        self._early[_clip(uid, FIELD_LIMIT)] = (canary, paths)

    def select(
        self,
        *,
        namespace: Optional[str] = None,
        pod: Optional[str] = None,
        uid: Optional[str] = None,
        trace_id: Optional[str] = None,
    ) -> list[Decision]:
        """
        The decisions held, oldest first, that match every filter given.
        """
        return [
            d
            for d in self._decisions
            if (namespace is None or d.namespace == namespace)
            and (pod is None or d.pod == pod)
            and (uid is None or d.uid == uid)
            and (trace_id is None or d.trace_id == trace_id)
        ]

    def __len__(self) -> int:
        return len(self._decisions)


def _arg(request: Request, name: bytes) -> Optional[str]:
    values = request.args.get(name)
    return values[0].decode("utf-8", "replace") if values else None


def _encode(decisions: Iterable[Decision], jsonl: bool) -> bytes:
    if jsonl:
        return b"".join(json.dumps(d.as_json(), separators=(",", ":")).encode("utf-8") + b"\n" for d in decisions)
    return json.dumps([d.as_json() for d in decisions], separators=(",", ":")).encode("utf-8") + b"\n"


#: The query parameters of C{/debug/reviews}; any other is refused (400),
#: so that a misspelt filter cannot return every review.
_PARAMETERS = (b"format", b"namespace", b"pod", b"uid", b"trace_id")


class RecentDecisionsResource(Resource):
    """
    C{GET /debug/reviews[?format=jsonl][&namespace=..][&pod=..][&uid=..][&trace_id=..]}.
    """

    isLeaf = True

    def __init__(self, recent: RecentDecisions) -> None:
        Resource.__init__(self)
        self._recent = recent

    def render_GET(self, request: Request) -> bytes:
        if not self._recent.size:
            request.setResponseCode(404)
            request.setHeader(b"content-type", b"text/plain; charset=utf-8")
            return b"/debug/reviews is off (metrics.debug_reviews: 0)\n"
        unknown = sorted(name.decode("utf-8", "replace") for name in request.args if name not in _PARAMETERS)
        if unknown:
            request.setResponseCode(400)
            request.setHeader(b"content-type", b"text/plain; charset=utf-8")
            known = ", ".join(p.decode() for p in _PARAMETERS)
            hint = did_you_mean(unknown[0], (p.decode() for p in _PARAMETERS))
            return f"{unknown[0]!r}: unknown parameter{hint} (known: {known})\n".encode("utf-8")
        fmt = _arg(request, b"format") or "json"
        if fmt not in ("json", "jsonl"):
            request.setResponseCode(400)
            request.setHeader(b"content-type", b"text/plain; charset=utf-8")
            return f"format: expected json or jsonl, got {fmt!r}\n".encode("utf-8")
        decisions = self._recent.select(
            namespace=_arg(request, b"namespace"),
            pod=_arg(request, b"pod"),
            uid=_arg(request, b"uid"),
            trace_id=_arg(request, b"trace_id"),
        )
        request.setHeader(b"content-type", b"application/x-ndjson" if fmt == "jsonl" else b"application/json")
        request.setHeader(b"cache-control", b"no-store")
        return _encode(decisions, fmt == "jsonl")
