"""
Circuit breakers for endpoint origins (a pure state machine; time comes from an
injected clock, nothing here touches the reactor or the network).

One L{CircuitBreaker} guards one endpoint origin.  While it is open, reviews
for that origin go straight to the failure policy without a network call.
L{BreakerRegistry} holds one breaker per origin.

States::

    closed --(N consecutive failures, or failure ratio over the window)--> open
    open --(cool-down elapsed; noticed lazily on the next read)--> half_open
    half_open --(a trial succeeds)--> closed
    half_open --(a trial fails)--> open, with a longer cool-down

Tickets
=======

L{CircuitBreaker.allow} returns a L{Ticket} (truthy) when a call may go out and
C{None} when it may not.  The caller hands the ticket back with exactly one of
L{CircuitBreaker.record_success}, L{CircuitBreaker.record_failure} or
L{CircuitBreaker.release}.  A ticket remembers the state period in which it
was issued, so a result that arrives after the breaker has changed state (a
slow call allowed while closed finishing after the breaker opened, a late
trial after another trial already decided) is ignored: it neither closes,
re-opens, extends nor counts.  A ticket is good for one outcome; later ones
are ignored, and so are tickets issued by another breaker.

Outcomes
========

What counts as a failure is the caller's call; the intent is:

  - C{record_failure}: the endpoint showed it is unhealthy: connection refused
    or reset, TLS failure, the endpoint's own timeout, a 5xx answer, a reply
    that is too large or is not the endpoint protocol.
  - C{record_success}: the endpoint answered properly (its answer may still
    deny the Pod; that is business logic, not ill health).
  - C{release}: the call ended and nothing was learned about the endpoint:
    amp gave up for its own reasons (the review's deadline ran out before the
    endpoint's own timeout did, the API server hung up, amp is stopping, the
    call was never sent).  Nothing is counted; a half-open trial slot is freed
    so that the next review can run a trial.

A half-open breaker whose trial tickets are never handed back refuses calls
for good, so every ticket must reach one of the three.

The rolling window
==================

The failure ratio is computed over C{window} seconds held in 10 time buckets
of C{window / 10} seconds each, so memory does not grow with traffic.  A result
counts until its bucket falls out of the window: for at least C{window}
minus one bucket width and at most C{window} seconds.  The ratio is checked
when a failure is recorded, so the breaker trips on the failure that brings
the window to C{failure_ratio} with at least C{min_requests} results in it.
Released calls are not results.  The window, the consecutive-failure count
and the trip count are all cleared when the breaker closes.

Cool-down
=========

The n-th consecutive trip (without a close in between) keeps the breaker open
for C{cooldown * 2 ** (n - 1)} seconds, capped at C{max_cooldown}.  When a
C{random} callable (returning a float in [0, 1)) is given, up to 10% is added
on top so that replicas do not probe a recovering endpoint in lockstep; by
default there is no jitter.  If the clock steps backwards past the moment the
breaker opened, the cool-down is treated as over (one trial is cheap; a
breaker stuck open for the size of the clock step is not).
"""

from __future__ import annotations

from typing import Callable, Optional, Protocol

from twisted.logger import Logger

from amp.config import BreakerConfig
from amp.reasons import BreakerState

CLOSED, OPEN, HALF_OPEN = BreakerState.CLOSED, BreakerState.OPEN, BreakerState.HALF_OPEN

#: Number of time buckets in the rolling window.
BUCKETS = 10

#: Largest fraction of the cool-down added as jitter when a random source is given.
JITTER = 0.1

# 2.0 ** exponent overflows past ~1023; any cool-down is capped long before.
_MAX_EXPONENT = 64

log = Logger()


class SecondsClock(Protocol):
    """
    Anything that tells the time: a reactor or C{twisted.internet.task.Clock}.
    """

    def seconds(self) -> float: ...


class Ticket:
    """
    Permission for one call, from L{CircuitBreaker.allow}; hand it back with
    exactly one outcome.
    """

    __slots__ = ("_breaker", "_epoch", "_done")

    def __init__(self, breaker: CircuitBreaker, epoch: int) -> None:
        self._breaker = breaker
        self._epoch = epoch
        self._done = False

    def __repr__(self) -> str:
        return f"<Ticket epoch={self._epoch} done={self._done}>"


class CircuitBreaker:
    """
    The breaker for one endpoint origin.  See the module docstring.

    @param settings: thresholds and cool-downs.
    @param clock: provides C{seconds()}.
    @param on_change: called with the new state after every transition.
    @param random: optional source of jitter for the cool-down, returning a
        float in [0, 1).
    """

    def __init__(
        self,
        settings: BreakerConfig,
        clock: SecondsClock,
        on_change: Optional[Callable[[BreakerState], None]] = None,
        *,
        random: Optional[Callable[[], float]] = None,
    ) -> None:
        self._settings = settings
        self._clock = clock
        self._on_change = on_change
        self._random = random
        self._state = CLOSED
        # Bumped on every transition; a ticket from another epoch is stale.
        self._epoch = 0
        self._trips = 0
        self._open_since = 0.0
        self._open_until = 0.0
        self._trials = 0
        self._consecutive = 0
        self._width = settings.window / BUCKETS
        self._calls = [0] * BUCKETS
        self._fails = [0] * BUCKETS
        self._head: Optional[int] = None
        self._total_calls = 0
        self._total_fails = 0

    def __repr__(self) -> str:
        return f"<CircuitBreaker {self._state} trips={self._trips}>"

    @property
    def settings(self) -> BreakerConfig:
        return self._settings

    @property
    def state(self) -> BreakerState:
        """
        C{closed}, C{open} or C{half_open}.  Reading it moves an open breaker
        whose cool-down has passed to half-open.
        """
        if self._state == OPEN:
            self._cooled()
        return self._state

    @property
    def trips(self) -> int:
        """
        Trips since the breaker was last closed (drives cool-down growth).
        """
        return self._trips

    def reopens_in(self) -> float:
        """
        Seconds until an open breaker lets a trial through; 0 if not open.
        """
        if self.state != OPEN:
            return 0.0
        return max(0.0, self._open_until - self._clock.seconds())

    def allow(self) -> Optional[Ticket]:
        """
        May a call go out now?  A L{Ticket} if so, else C{None}.  In half-open
        this takes one of the C{half_open_requests} trial slots.
        """
        state = self._state
        if state == CLOSED:
            return Ticket(self, self._epoch)
        if state == OPEN and not self._cooled():
            return None
        if self._trials >= self._settings.half_open_requests:
            return None
        self._trials += 1
        return Ticket(self, self._epoch)

    def record_success(self, ticket: Ticket) -> None:
        """
        The call for C{ticket} showed the endpoint healthy.
        """
        if not self._redeem(ticket):
            return
        if self._state == CLOSED:
            self._consecutive = 0
            self._count(False)
        else:
            self._close()

    def record_failure(self, ticket: Ticket) -> None:
        """
        The call for C{ticket} showed the endpoint unhealthy.
        """
        if not self._redeem(ticket):
            return
        if self._state != CLOSED:
            self._open()
            return
        self._consecutive += 1
        calls, fails = self._count(True)
        s = self._settings
        if self._consecutive >= s.consecutive_failures or (
            calls >= s.min_requests and fails / calls >= s.failure_ratio
        ):
            self._open()

    def release(self, ticket: Ticket) -> None:
        """
        The call for C{ticket} ended without a verdict on the endpoint: count
        nothing, free its half-open trial slot.
        """
        if self._redeem(ticket) and self._state == HALF_OPEN:
            self._trials -= 1

    # ------------------------------------------------------------ internals

    def _redeem(self, ticket: Ticket) -> bool:
        """
        Use up C{ticket}; true if its outcome applies to the current state.
        """
        if ticket._done or ticket._breaker is not self:
            return False
        ticket._done = True
        return ticket._epoch == self._epoch

    def _cooled(self) -> bool:
        """
        For an open breaker: move to half-open if the cool-down is over.
        """
        now = self._clock.seconds()
        if now >= self._open_until or now < self._open_since:
            self._trials = 0
            self._transition(HALF_OPEN)
            return True
        return False

    def _count(self, failed: bool) -> tuple[int, int]:
        """
        Add one result to the rolling window; return (results, failures) in it.
        """
        index = int(self._clock.seconds() // self._width)
        head = self._head
        calls, fails = self._calls, self._fails
        if index != head:
            if head is None or index < head or index - head >= BUCKETS:
                self._clear_window()
            else:
                for i in range(head + 1, index + 1):
                    slot = i % BUCKETS
                    self._total_calls -= calls[slot]
                    self._total_fails -= fails[slot]
                    calls[slot] = fails[slot] = 0
            self._head = index
        slot = index % BUCKETS
        calls[slot] += 1
        self._total_calls += 1
        if failed:
            fails[slot] += 1
            self._total_fails += 1
        return self._total_calls, self._total_fails

    def _clear_window(self) -> None:
        for slot in range(BUCKETS):
            self._calls[slot] = self._fails[slot] = 0
        self._total_calls = self._total_fails = 0
        self._head = None

    def _open(self) -> None:
        s = self._settings
        self._trips += 1
        delay = min(s.cooldown * 2.0 ** min(self._trips - 1, _MAX_EXPONENT), s.max_cooldown)
        if self._random is not None:
            delay *= 1.0 + JITTER * self._random()
        now = self._clock.seconds()
        self._open_since = now
        self._open_until = now + delay
        self._transition(OPEN)

    def _close(self) -> None:
        self._trips = 0
        self._consecutive = 0
        self._trials = 0
        self._clear_window()
        self._transition(CLOSED)

    def _transition(self, state: BreakerState) -> None:
        self._state = state
        self._epoch += 1
        if self._on_change is not None:
            _notify(self._on_change, state)


def _notify(callback: Callable[..., None], *args: str) -> None:
    """
    Run a state-change callback; its failure is logged, never raised into the
    call path that caused the transition.
    """
    try:
        callback(*args)
    except Exception:
        log.failure("circuit breaker state-change callback failed for {args}", args=args)


class BreakerRegistry:
    """
    One L{CircuitBreaker} per endpoint origin, created on first use.

    @param clock: passed to every breaker.
    @param on_change: called with C{(origin, new_state)} on every transition
        of the current breaker for an origin.
    @param random: jitter source passed to every breaker.
    """

    def __init__(
        self,
        clock: SecondsClock,
        on_change: Optional[Callable[[str, BreakerState], None]] = None,
        *,
        random: Optional[Callable[[], float]] = None,
    ) -> None:
        self._clock = clock
        self._on_change = on_change
        self._random = random
        self._breakers: dict[str, CircuitBreaker] = {}

    def state_of(self, origin: str) -> Optional[BreakerState]:
        """The state of C{origin}'s breaker, or None when it has none yet."""
        breaker = self._breakers.get(origin)
        return breaker.state if breaker is not None else None

    def get(self, origin: str, settings: BreakerConfig) -> CircuitBreaker:
        """
        The breaker for C{origin}.  If C{settings} differ from the ones the
        current breaker was made with (a config reload), a fresh closed
        breaker replaces it: the old one's tickets are then stale and its
        transitions are no longer reported.  If the old one was not closed,
        C{on_change(origin, "closed")} reports the replacement.
        """
        old = self._breakers.get(origin)
        if old is not None and (old._settings is settings or old._settings == settings):
            return old
        callback = None
        if self._on_change is not None:
            callback = self._reporter(origin, self._on_change)
        breaker = CircuitBreaker(settings, self._clock, callback, random=self._random)
        self._breakers[origin] = breaker
        if old is not None:
            old._on_change = None
            if old._state != CLOSED and self._on_change is not None:
                _notify(self._on_change, origin, CLOSED)
        return breaker

    @staticmethod
    def _reporter(origin: str, on_change: Callable[[str, BreakerState], None]) -> Callable[[BreakerState], None]:
        def report(state: BreakerState) -> None:
            on_change(origin, state)

        return report
