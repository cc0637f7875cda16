"""
Waiting for a step, the one way (pure apart from the clock passed in).

A review waits on one step at a time: the namespace lookup, an endpoint
call, the canary's candidate.  L{Waiting} holds the review's one
L{amp.deadline.Deadline} and the step in progress, and arms one timer for
the earlier of the step's own expiry and the deadline:

  - the step's own time passes first: the step is told (L{IStep.time_out}),
    fails on its own account, and tells its receiver;
  - the deadline passes first: the owner is told (the C{passed} callable),
    which ends the step through L{Waiting.cancel}, as it does when it gives
    up for any other reason (the API server went away).  That is the one
    way a step is cut off: its L{IStep.cancel}, after which the step tells
    its receiver (a timeout when the deadline has passed, else a
    cancellation).

A step says its expiry moved (an endpoint call that waited for a bulkhead
slot goes out: from its latest start to its own timeout) by telling its
receiver, who re-arms the timer (L{Waiting.arm}).

A step is anything with C{expires}, C{time_out()} and C{cancel()}
(L{IStep}): an endpoint call (L{amp.endpoint.Call}) is one, and a
Deferred is one through L{DeferredStep} (the namespace lookup: no time of
its own, cancelling it cancels the Deferred).
"""

from __future__ import annotations

from typing import Callable, Generic, Optional, TypeVar
from typing import Protocol as TypingProtocol

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.python.failure import Failure

from amp.deadline import Deadline

_T = TypeVar("_T")
_T_contra = TypeVar("_T_contra", contravariant=True)

#: A timer may fire this much before the time it was set for (floats).
_EARLY = 1e-6


class IStep(TypingProtocol):
    """One step a L{Waiting} waits on."""

    @property
    def expires(self) -> Optional[float]:
        """When the step's own time ends (the clock's time), or None: only the deadline ends it."""

    def time_out(self) -> None:
        """The step's own time (L{expires}) has passed: it fails on its own account and tells its receiver."""

    def cancel(self) -> None:
        """
        The step is cut off (the deadline passed, or its owner gave up): it
        ends and tells its receiver.  Nothing once it has ended.
        """


class IReceiver(TypingProtocol[_T_contra]):
    """Where a step's end goes: exactly one of these, once."""

    def replied(self, result: _T_contra) -> None:
        """The step's result."""

    def failed(self, failure: Failure) -> None:
        """The step failed, timed out or was cancelled."""


class Waiting:
    """
    The one deadline of a review and the one step it waits on, with one
    timer for whichever of the two ends first.

    @param clock: the reactor's clock (the timer).
    @param deadline: the review's deadline, which every step is given what
        is left of (L{Deadline.remaining}).
    @param passed: called when the deadline passes (the timer fired, no step
        expiry before it): the owner ends what it is doing, the step in
        progress through L{cancel}.
    @ivar step: the step waited on, or None.
    """

    __slots__ = ("_clock", "deadline", "step", "_timer", "_passed", "_closed")

    def __init__(self, clock: IReactorTime, deadline: Deadline, passed: Callable[[], None]) -> None:
        self._clock = clock
        self.deadline = deadline
        self.step: Optional[IStep] = None
        self._timer: Optional[IDelayedCall] = None
        self._passed = passed
        self._closed = False

    def wait(self, step: IStep) -> None:
        """Wait on C{step}: the timer set for its expiry or the deadline, whichever is earlier."""
        self.step = step
        self.arm()

    def arm(self) -> None:
        """
        Set the one timer for the earlier of the step's expiry and the
        deadline (the deadline when no step is waited on), moving it when
        it is set for another time.  Nothing once L{close}d.
        """
        if self._closed:
            return
        when = self.deadline.at
        step = self.step
        if step is not None:
            expires = step.expires
            if expires is not None and expires < when:
                when = expires
        clock = self._clock
        timer = self._timer
        if timer is None:
            self._timer = clock.callLater(max(0.0, when - clock.seconds()), self._fired)
        elif timer.getTime() != when:
            timer.reset(max(0.0, when - clock.seconds()))

    def done(self, step: object) -> None:
        """C{step} has ended (told its receiver): no longer waited on; the timer stays for the next step."""
        if self.step is step:
            self.step = None

    def _fired(self) -> None:
        self._timer = None
        step = self.step
        deadline = self.deadline
        now = self._clock.seconds()
        if step is not None:
            expires = step.expires
            if expires is not None and expires < deadline.at and expires <= now + _EARLY:
                # The step's own time, not the deadline: it fails on its own
                # account (its receiver told at once).
                self.step = None
                try:
                    step.time_out()
                finally:
                    # No next step armed the timer (or the step raised): the
                    # deadline still holds, unless the owner is done.
                    if self._timer is None:
                        self.arm()
                return
        if not deadline.passed(now):
            # Early (floats), or an expiry that moved without the owner
            # re-arming: the timer waits for the step's expiry or the
            # deadline instead.
            self.arm()
            return
        self._passed()

    def cancel(self) -> None:
        """
        End the step in progress now, the one way a step is cut off: its
        L{IStep.cancel}, which tells its receiver.
        """
        step, self.step = self.step, None
        if step is not None:
            step.cancel()

    def close(self) -> None:
        """The owner is done: the timer cancelled, nothing waited on, nothing armed again."""
        self._closed = True
        self.step = None
        timer, self._timer = self._timer, None
        if timer is not None and timer.active():
            timer.cancel()


class DeferredStep(Generic[_T]):
    """
    A Deferred as a step (the namespace lookup): no time of its own
    (C{expires} is None: the deadline ends it), L{cancel} cancels the
    Deferred, and its result is told to C{receiver} once, as an endpoint
    call tells its own.

    @ivar told: the receiver has been told (at once, when C{d} had fired).
    """

    __slots__ = ("_d", "_receiver", "told")

    #: No time of its own.
    expires: Optional[float] = None

    def __init__(self, d: Deferred[_T], receiver: IReceiver[_T]) -> None:
        self._receiver = receiver
        self.told = False
        self._d = d
        d.addCallbacks(self._replied, self._failed)

    def _replied(self, result: _T) -> None:
        self.told = True
        self._receiver.replied(result)

    def _failed(self, failure: Failure) -> None:
        self.told = True
        self._receiver.failed(failure)

    def time_out(self) -> None:
        """Never told: the step has no time of its own."""

    def cancel(self) -> None:
        """Cancel the Deferred: its receiver is told how it ended (a C{CancelledError} unless it says otherwise)."""
        self._d.cancel()
