"""
The status stamp C{amp.txn2.com/status}: what amp did to the Pod across
all rounds of one admission, per endpoint (pure).

The API server may call amp more than once for one Pod creation: again
when something changed the Pod after amp (C{reinvocationPolicy:
IfNeeded}), and once per webhook entry that registers amp.  Each call is a
round; each round reads the stamp the Pod comes with (the earlier rounds'
value) and writes the merge of it and its own outcome per endpoint
(L{next_stamp}):

  - an endpoint whose patch was applied in any round stays C{mutated};
  - an endpoint whose last call failed under C{Ignore} is C{skipped
    <reason>}, and stays named under C{mutated} as well when an earlier
    round applied its patch (that change is on the Pod);
  - an endpoint no round changed the Pod for is C{unchanged};
  - endpoints this round did not call (another webhook entry's) keep what
    the stamp said of them.

The value is clauses separated by C{"; "}: each C{skipped <reason>} with
its endpoints, then C{mutated} and C{unchanged} with theirs (the last
round's endpoints first, in the order it called them); so its first
word is C{skipped} when any endpoint's last call failed, else C{mutated}
when any endpoint's patch was applied.  Endpoint names hold no whitespace
(L{amp.policy.Route.where}).

Only a CREATE's Pod is stamped, so the stamp it comes with is an earlier
round's of the same admission, or the author's: amp cannot tell them
apart, and reads both alike.  A round's own outcome always wins for the
endpoints it called, so no stamp the Pod comes with hides a failure of
this round.  A value, or a clause, amp cannot read is dropped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable, Optional

from amp.admission_review import clip
from amp.memo import Memo
from amp.reasons import Status
from amp.rules import STATUS_ANNOTATION

__all__ = ["STATUS_ANNOTATION", "STATUS_LIMIT", "Mark", "next_stamp", "parse_stamp", "pod_stamp", "render_stamp"]

#: The longest status annotation value.
STATUS_LIMIT = 250

#: How much of the stamp a Pod comes with is read: amp never writes more
#: than L{STATUS_LIMIT}; the rest of a longer value is the author's.
_READ_LIMIT = 4 * STATUS_LIMIT
#: A reason as the stamp spells it (L{amp.reasons.Reason}, or one a newer
#: amp knows).
_REASON = re.compile(r"[a-z0-9][a-z0-9-]*\Z")
_CLAUSES = "; "


@dataclass(frozen=True, slots=True)
class Mark:
    """
    What the rounds so far did with one endpoint.

    @ivar mutated: a round applied its patch.
    @ivar skipped: the reason its last call failed under C{Ignore}, or
        C{""} when that call succeeded.
    """

    mutated: bool = False
    skipped: str = ""

    def after(self, status: Status, reason: str = "") -> "Mark":
        """This mark after a round whose outcome for the endpoint is C{status} (and C{reason})."""
        if status == Status.MUTATED:
            return Mark(True)
        if status == Status.SKIPPED:
            return Mark(self.mutated, reason)
        return Mark(self.mutated)


def pod_stamp(pod: Any) -> Optional[str]:
    """The stamp C{pod} carries, or None."""
    metadata = pod.get("metadata") if type(pod) is dict else None
    annotations = metadata.get("annotations") if type(metadata) is dict else None
    value = annotations.get(STATUS_ANNOTATION) if type(annotations) is dict else None
    return value if type(value) is str else None


def parse_stamp(value: Optional[str]) -> dict[str, Mark]:
    """
    The marks of C{value}, in the order it names the endpoints; clauses
    that are not a status (a C{skipped} with its reason) and endpoints, and
    names with control characters, are dropped.  Never raises.
    """
    marks: dict[str, Mark] = {}
    if not value:
        return marks
    for clause in value[:_READ_LIMIT].split(_CLAUSES):
        words = clause.split()
        if not words or words[0] not in (Status.MUTATED, Status.UNCHANGED, Status.SKIPPED):
            continue
        reason = ""
        names = words[1:]
        if words[0] == Status.SKIPPED:
            if not names or not _REASON.match(names[0]):
                continue
            reason, names = names[0], names[1:]
        for name in names:
            if not name.isprintable():
                # Not a name amp gives (L{amp.policy.shown_url} escapes
                # these); it would reach terminals through amp explain.
                continue
            mark = marks.get(name, Mark())
            if words[0] == Status.MUTATED:
                marks[name] = Mark(True, mark.skipped)
            elif words[0] == Status.SKIPPED:
                marks[name] = Mark(mark.mutated, reason)
            else:
                marks[name] = mark
    return marks


def render_stamp(marks: dict[str, Mark]) -> str:
    """
    The stamp of C{marks}: C{skipped <reason>} clauses (in the order of
    their first endpoint), then C{mutated}, then C{unchanged}.
    """
    skipped: dict[str, list[str]] = {}
    mutated: list[str] = []
    unchanged: list[str] = []
    for name, mark in marks.items():
        if mark.skipped:
            skipped.setdefault(mark.skipped, []).append(name)
        if mark.mutated:
            mutated.append(name)
        elif not mark.skipped:
            unchanged.append(name)
    clauses = [" ".join((Status.SKIPPED, reason, *names)) for reason, names in skipped.items()]
    clauses += [
        " ".join((status, *names))
        for status, names in ((Status.MUTATED, mutated), (Status.UNCHANGED, unchanged))
        if names
    ]
    return _CLAUSES.join(clauses)


def next_stamp(incoming: Optional[str], outcomes: Iterable[tuple[str, Status, str]], limit: int = STATUS_LIMIT) -> str:
    """
    The stamp after a round: C{incoming} (the stamp the Pod came with)
    merged with this round's C{outcomes}, C{(endpoint, status, reason)}
    for each endpoint it called (or would have), in order.  The endpoints
    of this round come first, in its order, then the others the stamp
    named, in its order.  When the value is over C{limit}, endpoints this round did not call are left out, the
    last first; if it is still over, it is cut short.
    """
    key = (incoming, tuple(outcomes), limit)
    value = _NEXT.get(key)
    if value is None:
        value = _next_stamp(incoming, key[1], limit)
        if incoming is None or len(incoming) <= _READ_LIMIT:
            _NEXT[key] = value
    return value


#: Stamps computed already: a namespace's Pods come with the same stamp
#: (mostly none) and get the same outcomes, review after review.
_NEXT: Memo[tuple[Optional[str], tuple[tuple[str, Status, str], ...], int], str] = Memo(1024)


def _next_stamp(incoming: Optional[str], outcomes: Iterable[tuple[str, Status, str]], limit: int) -> str:
    earlier = parse_stamp(incoming)
    marks: dict[str, Mark] = {}
    for name, status, reason in outcomes:
        marks[name] = marks.get(name, earlier.pop(name, Mark())).after(status, reason)
    ours = set(marks)
    marks.update(earlier)
    value = render_stamp(marks)
    if len(value) > limit:
        for name in reversed([name for name in marks if name not in ours]):
            del marks[name]
            value = render_stamp(marks)
            if len(value) <= limit:
                break
    return clip(value, limit)
