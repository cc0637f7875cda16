"""
The latency budget of one endpoint origin: when its recent calls are slower
than C{endpoints.latency_budget}, new reviews stop waiting for it and apply
the failure policy at once (C{latency-budget}), while one probe call at a
time finds out whether it has recovered (a pure state machine: the caller
measures each call's seconds; nothing here reads a clock or touches the
reactor).

The objective
=============

The last C{window} calls that ended with a verdict on the endpoint (a
reply, a failure of the endpoint's, its own timeout, or the review's
deadline cutting the call off) are kept as one bit each: over the budget or
not.  Their 90th percentile (nearest rank) is over the budget exactly when
more than C{window - ceil(0.9 * window)} of them are (for the default window
of 20: 3 or more), and then the origin sheds.  A call counts only once it
has ended; a call amp gave up for its own reasons (the client went away, a
denied address) is no measure and counts nothing.  Until C{window} calls
have ended there is no verdict.

States::

    within --(the window's p90 over the budget)--> shedding
    shedding: one call at a time goes out as a probe; the others are shed
    shedding --(a probe ends within the budget)--> within, the window cleared
    shedding --(a probe ends over it)--> shedding; the next review probes

Tokens
======

L{LatencyBudget.allow} answers each new call: L{SHED} (do not call), or a
token to hand back with the call's seconds (L{LatencyBudget.observe}) or
without a measure (L{LatencyBudget.forget}), exactly once.  A token is the
state period the call was admitted in, or L{PROBE}: calls admitted before
a transition (slow calls still ending after the origin began shedding, or
after it recovered) neither count nor decide.
"""

from __future__ import annotations

from typing import Optional

#: L{LatencyBudget.allow}: do not call, shed.
SHED = -2
#: L{LatencyBudget.allow}: the probe call of a shedding origin.
PROBE = -1

#: The percentile of the objective.
PERCENTILE = 90


def over_allowed(window: int) -> int:
    """
    How many of C{window} calls may be over the budget with the window's
    nearest-rank 90th percentile still within it.
    """
    return window - (PERCENTILE * window + 99) // 100


class LatencyBudget:
    """
    The latency budget of one origin; see the module docstring.

    @param budget: seconds; a call that took longer is over it.
    @param window: the calls the objective is taken over.
    """

    __slots__ = (
        "budget",
        "window",
        "_allowed",
        "_bits",
        "_next",
        "_seen",
        "_over",
        "_shedding",
        "_probing",
        "_epoch",
        "shed",
    )

    def __init__(self, budget: float, window: int) -> None:
        if budget <= 0 or window < 1:
            raise ValueError("a latency budget needs a positive budget and window")
        self.budget = budget
        self.window = window
        self._allowed = over_allowed(window)
        self._bits = bytearray(window)
        self._next = 0
        self._seen = 0
        self._over = 0
        self._shedding = False
        self._probing = False
        self._epoch = 0
        #: Calls shed since the origin began shedding (for the message).
        self.shed = 0

    def __repr__(self) -> str:
        state = "shedding" if self._shedding else "within"
        return f"<LatencyBudget {state} {self._over}/{self._seen} over {self.budget}s>"

    @property
    def shedding(self) -> bool:
        """Whether new calls are shed (but for one probe at a time)."""
        return self._shedding

    @property
    def probing(self) -> bool:
        """Whether a probe call is out now."""
        return self._probing

    @property
    def over(self) -> int:
        """Calls over the budget among those in the window now."""
        return self._over

    @property
    def seen(self) -> int:
        """Calls in the window now (at most C{window})."""
        return self._seen

    def allow(self) -> int:
        """
        May a new call go out?  L{SHED} if not; else its token: L{PROBE}
        for the one probe of a shedding origin, or the current period.
        """
        if not self._shedding:
            return self._epoch
        if self._probing:
            self.shed += 1
            return SHED
        self._probing = True
        return PROBE

    def observe(self, token: int, seconds: float) -> Optional[bool]:
        """
        The call of C{token} ended after C{seconds}, a measure of the
        endpoint.  True when this began shedding, False when it ended it
        (the probe came back within the budget), else None.
        """
        if token == PROBE:
            if not self._probing:
                return None
            self._probing = False
            if seconds > self.budget:
                return None
            self._recover()
            return False
        if token != self._epoch or self._shedding:
            return None
        over = 1 if seconds > self.budget else 0
        bits = self._bits
        i = self._next
        if self._seen == self.window:
            self._over -= bits[i]
        else:
            self._seen += 1
        bits[i] = over
        self._over += over
        self._next = i + 1 if i + 1 < self.window else 0
        if self._seen == self.window and self._over > self._allowed:
            self._shedding = True
            self._epoch += 1
            self.shed = 0
            return True
        return None

    def forget(self, token: int) -> None:
        """
        The call of C{token} ended without a measure (amp gave up on it for
        its own reasons): it counts nothing; a probe's turn passes on.
        """
        if token == PROBE:
            self._probing = False

    def _recover(self) -> None:
        self._shedding = False
        self._epoch += 1
        self._bits = bytearray(self.window)
        self._next = self._seen = self._over = 0
