"""
The decision trace of one review (pure): an optional observer that the review
pipeline tells each decision it takes, with the facts behind it.

The daemon passes no trace, and the pipeline then does nothing more than test
for C{None}.  C{amp explain} passes a L{RecordedTrace} and prints what it
collected: that is how it tells the story of the daemon's own decisions
instead of working them out again.

A trace is anything with a C{record(step, **fields)} method
(L{IReviewTrace}).  The steps and the fields each one carries:

  - C{namespace}: C{name}, C{found} (bool), C{source} (where it came from),
    C{labels}, C{annotations} (what amp keeps of them);
  - C{route}: C{enabled} (bool), C{label} and C{value} (the opt-in label
    and the value it needs), C{got} (the namespace's value), C{annotation}
    (the endpoint annotation used, or None), C{url} (its text, masked),
    C{mode}, C{steps} (the chain's endpoints, in order);
  - C{allow}, per endpoint of the chain: C{url}, C{allowed} (bool),
    C{pattern} (the matching C{endpoints.allow} pattern or None), and when
    the annotation cannot be used, C{reason} (C{bad-url}, C{not-allowed})
    and C{error} (the message);
  - C{policy}: C{policy} (C{Ignore}/C{Fail}), C{why};
  - C{budget}, before each call: C{seconds} (left for the review),
    C{timeout} (what the call may take), C{position} and C{chain_length}
    (its place in the chain);
  - C{call}: C{endpoint} (origin), C{url}, C{outcome} (C{ok} or a reason),
    C{seconds}, C{message};
  - C{reply}: C{allowed}, C{operations} (count), C{warnings}, C{code},
    C{message};
  - C{operation}: C{index}, C{op}, C{path}, C{from_} (or None), C{repair}
    (bool: inserted by amp to create a missing parent);
  - C{repair}: C{index} (of the endpoint's operation), C{message};
  - C{check}: C{reason}, C{message} (the patch was refused: the exact text
    the failure policy reports);
  - C{skip}: C{endpoint}, C{reason}, C{message} (under C{Ignore}, a failed
    endpoint of a chain is skipped and the chain goes on);
  - C{answer}: C{result}, C{reason}, C{message};
  - C{stamp}: C{key}, C{value} (the annotation amp puts on the Pod).

Field values are plain JSON values (strings, numbers, booleans, None, lists
and mappings of them), so a trace prints as text or JSON as it is.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Callable, Optional

from zope.interface import Interface, implementer


class Step(StrEnum):
    """
    The decisions of one review, in the order they are taken.
    """

    NAMESPACE = "namespace"
    ROUTE = "route"
    ALLOW = "allow"
    POLICY = "policy"
    BUDGET = "budget"
    CALL = "call"
    REPLY = "reply"
    OPERATION = "operation"
    REPAIR = "repair"
    CHECK = "check"
    SKIP = "skip"
    ANSWER = "answer"
    STAMP = "stamp"


class IReviewTrace(Interface):
    """
    Told each decision of one review.  Must not raise and must not block:
    it is called on the reactor thread, in the middle of the review.
    """

    def record(step: Step, **fields: Any) -> None:
        """
        One decision: C{step} and its facts (see the module docstring).
        """


@dataclass(frozen=True, slots=True)
class TraceEvent:
    """
    One recorded decision.

    @ivar at: seconds since the trace began, on the trace's clock.
    """

    step: Step
    fields: dict[str, Any]
    at: float = 0.0


@implementer(IReviewTrace)
@dataclass
class RecordedTrace:
    """
    A trace that keeps every event in order.

    @ivar seconds: the clock (C{IReactorTime.seconds}), or None to leave
        every event at 0.
    """

    seconds: Optional[Callable[[], float]] = None
    events: list[TraceEvent] = field(default_factory=list)
    _start: Optional[float] = None

    def record(self, step: Step, /, **fields: Any) -> None:
        at = 0.0
        if self.seconds is not None:
            now = self.seconds()
            if self._start is None:
                self._start = now
            at = now - self._start
        self.events.append(TraceEvent(Step(step), fields, at))

    def steps(self, step: Step) -> list[dict[str, Any]]:
        """
        The fields of every event of C{step}, in order.
        """
        return [e.fields for e in self.events if e.step == step]

    def first(self, step: Step) -> Optional[dict[str, Any]]:
        """
        The fields of the first event of C{step}, or None.
        """
        for e in self.events:
            if e.step == step:
                return e.fields
        return None


def answer_message(body: bytes) -> str:
    """
    What an AdmissionReview answer tells about a failure or a deny: the
    deny's message, or amp's audit annotation (the full text of a failure
    under C{Ignore}); C{""} when there is none.
    """
    response = json.loads(body).get("response") or {}
    status = response.get("status") or {}
    audit = response.get("auditAnnotations") or {}
    return str(status.get("message") or audit.get("error") or "")
