"""
The decision trace of one review (pure): what the review pipeline tells of
each decision it takes, as typed events with the facts behind it.

Every part of the pipeline is handed a trace (L{IReviewTrace}) and tells
it each decision: the kind of event (one frozen class per decision,
L{Event} and its kinds below) and its facts.  The daemon's trace is
L{NO_TRACE}, which keeps nothing and builds no event; C{amp explain} passes
a L{RecordedTrace}, which builds and keeps each, and prints what it
collected (L{amp.cli.report} dispatches on the event's type): that is how
it tells the story of the daemon's own decisions instead of working them
out again.  Facts that cost something to gather, on every call of a
review's hot path (the budget, the call's time, the reply's summary, each
operation applied) or once (the route's explanation), are only gathered
when the trace is L{IReviewTrace.recording}: gathering them on every
review would cost the daemon's reviews what only C{amp explain} reads
(bench/README.md, "Figures behind the code").

The events, in the order a review takes its decisions (L{Step}):
L{NamespaceFound}, L{RouteDecided}, L{AllowChecked} (per endpoint of the
chain), L{PolicyChosen}, then per endpoint L{BudgetGiven}, L{Called},
L{Replied}, L{OperationApplied} and L{Repaired} (per operation of its
patch), L{Refused} or L{Skipped}; then L{Stamped} and L{Answered}.
L{Event.fields} is an event's facts as plain JSON values (strings,
numbers, booleans, None, lists and mappings of them), in a stable order,
so a trace prints as text or JSON as it is.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Callable, ClassVar, Mapping, Optional, Sequence, TypeVar

from zope.interface import Attribute, Interface, implementer

__all__ = [
    "NO_TRACE",
    "AllowChecked",
    "Answered",
    "BudgetGiven",
    "Called",
    "Event",
    "IReviewTrace",
    "NamespaceFound",
    "NoTrace",
    "OperationApplied",
    "PolicyChosen",
    "RecordedEvent",
    "RecordedTrace",
    "Refused",
    "Repaired",
    "Replied",
    "RouteDecided",
    "Skipped",
    "Stamped",
    "Step",
    "answer_message",
]


class Step(StrEnum):
    """
    The decisions of one review, in the order they are taken: each
    L{Event} kind's name in a printed trace.
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


@dataclass(frozen=True, slots=True)
class Event:
    """
    One decision of a review.  Each kind names its L{Step}.
    """

    step: ClassVar[Step]

    def fields(self) -> dict[str, Any]:
        """The event's facts, by name, in declaration order."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


@dataclass(frozen=True, slots=True)
class NamespaceFound(Event):
    """
    The review's namespace: C{found} or not in C{source} (where it came
    from), with the C{labels} and C{annotations} amp keeps of it and what
    the command line set over them (C{amp explain}) and the hints of its
    labels and annotations in amp's domain that amp does not read.
    """

    step = Step.NAMESPACE
    name: str
    found: bool
    source: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    set_by_command_line: Sequence[str] = ()
    near_misses: Sequence[str] = ()


@dataclass(frozen=True, slots=True)
class RouteDecided(Event):
    """
    Whether amp acts in the namespace: C{enabled}; the opt-in C{label} and
    the C{value} it needs, and the namespace's value (C{got}); the endpoint
    C{annotation} used (or None) of those read (C{annotations}), its C{url}
    (masked), the C{mode} and the chain's endpoints in order (C{steps}).
    """

    step = Step.ROUTE
    enabled: bool
    label: str
    value: str
    got: Optional[str]
    exists: bool
    annotation: Optional[str]
    annotations: Sequence[str]
    url: str
    mode: str
    steps: Sequence[str]


@dataclass(frozen=True, slots=True)
class AllowChecked(Event):
    """
    One endpoint of the chain against C{endpoints.allow}: C{allowed}, the
    matching C{pattern} (or None); when the annotation cannot be used, the
    C{reason} (C{bad-url}, C{not-allowed}) and the C{error}.
    """

    step = Step.ALLOW
    url: str
    allowed: bool
    pattern: Optional[str]
    reason: str
    error: str
    patterns: Sequence[str]


@dataclass(frozen=True, slots=True)
class PolicyChosen(Event):
    """The failure C{policy} that applies, and C{why}, in words."""

    step = Step.POLICY
    policy: str
    why: str


@dataclass(frozen=True, slots=True)
class BudgetGiven(Event):
    """
    Before a call: C{seconds} left for the review, the C{timeout} the call
    may take, and its C{position} in a chain of C{chain_length}; the
    endpoint's C{max_concurrent} calls at once (a review beyond them waits
    until C{min_call_time} before its deadline) and its C{latency_budget}
    (0: none).
    """

    step = Step.BUDGET
    seconds: float
    timeout: float
    position: int
    chain_length: int
    max_concurrent: int = 0
    min_call_time: float = 0.0
    latency_budget: float = 0.0


@dataclass(frozen=True, slots=True)
class Called(Event):
    """
    An endpoint call ended: its C{outcome} (C{ok} or a reason) after
    C{seconds}, and the failure's C{message}.
    """

    step = Step.CALL
    endpoint: str
    url: str
    outcome: str
    seconds: float
    message: str


@dataclass(frozen=True, slots=True)
class Replied(Event):
    """
    The endpoint's reply: C{allowed}, how many C{operations}, its
    C{warnings}, and a deny's C{code} and C{message}.
    """

    step = Step.REPLY
    allowed: bool
    operations: int
    warnings: Sequence[str]
    code: Optional[int]
    message: str


@dataclass(frozen=True, slots=True)
class OperationApplied(Event):
    """
    One operation of a patch applied in the dry-run: the endpoint's
    operation C{index} (None for one amp inserted, C{repair}).
    """

    step = Step.OPERATION
    index: Optional[int]
    op: str
    path: str
    from_: Optional[str]
    repair: bool


@dataclass(frozen=True, slots=True)
class Repaired(Event):
    """amp inserted what the endpoint's operation C{index} needed."""

    step = Step.REPAIR
    index: int
    message: str


@dataclass(frozen=True, slots=True)
class Refused(Event):
    """
    amp refused the patch: the C{reason} and the exact C{message} the
    failure policy reports.
    """

    step = Step.CHECK
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class Skipped(Event):
    """Under C{Ignore}, a failed endpoint of a chain is skipped and the chain goes on."""

    step = Step.SKIP
    endpoint: str
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class Stamped(Event):
    """
    The annotation C{key} amp puts on the Pod, and its C{value}; not
    C{written} when the Pod has that value already.
    """

    step = Step.STAMP
    key: str
    value: str
    written: bool = True


@dataclass(frozen=True, slots=True)
class Answered(Event):
    """
    The answer: its C{result} and C{reason}; C{body} is the answer itself,
    and its C{message} (L{answer_message}) is read from it only when the
    event is shown.
    """

    step = Step.ANSWER
    result: str
    reason: str
    body: bytes = field(repr=False)

    def fields(self) -> dict[str, Any]:
        return {"result": self.result, "reason": self.reason, "message": answer_message(self.body)}


E = TypeVar("E", bound=Event)


class IReviewTrace(Interface):
    """
    Told each decision of one review.  Must not raise and must not block:
    it is called on the reactor thread, in the middle of the review.
    """

    recording = Attribute("Whether events are kept: the facts only a kept event needs are gathered only then.")

    def record(kind: type[Event], /, **facts: Any) -> None:
        """
        One decision: its kind of event and the event's facts (a trace
        that keeps it makes C{kind(**facts)}).
        """

    def extend(events: Sequence[Event]) -> None:
        """
        Decisions already made into events, in order.
        """


@implementer(IReviewTrace)
class NoTrace:
    """
    The daemon's trace: keeps nothing.
    """

    __slots__ = ()
    recording = False

    def record(self, kind: type[Event], /, **facts: Any) -> None:
        pass

    def extend(self, events: Sequence[Event]) -> None:
        pass


#: The trace of a review nobody explains.
NO_TRACE = NoTrace()


@dataclass(frozen=True, slots=True)
class RecordedEvent:
    """
    One recorded decision.

    @ivar at: seconds since the trace began, on the trace's clock.
    """

    event: Event
    at: float = 0.0

    @property
    def step(self) -> Step:
        return self.event.step


@implementer(IReviewTrace)
@dataclass
class RecordedTrace:
    """
    A trace that keeps every event in order.

    @ivar seconds: the clock (C{IReactorTime.seconds}), or None to leave
        every event at 0.
    """

    seconds: Optional[Callable[[], float]] = None
    events: list[RecordedEvent] = field(default_factory=list)
    _start: Optional[float] = None
    recording: ClassVar[bool] = True

    def record(self, kind: type[Event], /, **facts: Any) -> None:
        self.extend((kind(**facts),))

    def extend(self, events: Sequence[Event]) -> None:
        at = 0.0
        if self.seconds is not None:
            now = self.seconds()
            if self._start is None:
                self._start = now
            at = now - self._start
        self.events.extend(RecordedEvent(event, at) for event in events)

    def of(self, kind: type[E]) -> list[E]:
        """
        Every event of C{kind}, in order.
        """
        return [e.event for e in self.events if isinstance(e.event, kind)]

    def steps(self, step: Step) -> list[dict[str, Any]]:
        """
        The facts of every event of C{step}, in order.
        """
        return [e.event.fields() for e in self.events if e.step == step]


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
