"""
Tests for amp.breaker: the circuit breaker state machine and its registry,
driven by twisted.internet.task.Clock.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from twisted.internet.task import Clock

from amp.breaker import CLOSED, HALF_OPEN, OPEN, BreakerRegistry, CircuitBreaker
from amp.config import BreakerConfig

# Trips on consecutive failures only, unless a test lowers min_requests.
CONSECUTIVE = BreakerConfig(
    consecutive_failures=5,
    failure_ratio=0.5,
    window=30.0,
    min_requests=1000,
    cooldown=5.0,
    max_cooldown=120.0,
    half_open_requests=1,
)
# Trips on the failure ratio only.
RATIO = dataclasses.replace(CONSECUTIVE, consecutive_failures=1000, min_requests=10)


def make(config: BreakerConfig = CONSECUTIVE, **kwargs):
    clock = Clock()
    changes: list[str] = []
    breaker = CircuitBreaker(config, clock, changes.append, **kwargs)
    return breaker, clock, changes


def fail(breaker: CircuitBreaker, n: int = 1) -> None:
    for _ in range(n):
        ticket = breaker.allow()
        assert ticket
        breaker.record_failure(ticket)


def succeed(breaker: CircuitBreaker, n: int = 1) -> None:
    for _ in range(n):
        ticket = breaker.allow()
        assert ticket
        breaker.record_success(ticket)


def trip(breaker: CircuitBreaker) -> None:
    fail(breaker, breaker.settings.consecutive_failures)
    assert breaker.state == OPEN


# ------------------------------------------------------------ closed -> open


def test_new_breaker_is_closed_and_lets_calls_through():
    breaker, clock, changes = make()
    assert breaker.state == CLOSED
    assert breaker.trips == 0
    assert breaker.reopens_in() == 0.0
    succeed(breaker, 100)
    assert breaker.state == CLOSED
    assert changes == []


def test_trips_after_consecutive_failures():
    breaker, clock, changes = make()
    fail(breaker, 4)
    assert breaker.state == CLOSED
    assert changes == []
    fail(breaker)
    assert breaker.state == OPEN
    assert breaker.trips == 1
    assert changes == [OPEN]


def test_a_success_resets_the_consecutive_count():
    breaker, clock, changes = make()
    fail(breaker, 4)
    succeed(breaker)
    fail(breaker, 4)
    assert breaker.state == CLOSED
    fail(breaker)
    assert breaker.state == OPEN


def test_open_breaker_refuses_calls_without_changing_state():
    breaker, clock, changes = make()
    trip(breaker)
    for _ in range(10):
        assert breaker.allow() is None
    clock.advance(4.9)
    assert breaker.allow() is None
    assert breaker.state == OPEN
    assert changes == [OPEN]


# ------------------------------------------------------------ failure ratio


def test_ratio_trips_only_once_min_requests_are_in_the_window():
    breaker, clock, changes = make(RATIO)
    # 9 results, 5 failures (56%): too few results to judge.
    fail(breaker, 5)
    succeed(breaker, 4)
    assert breaker.state == CLOSED
    # The 10th result is a failure: 6/10 >= 0.5.
    fail(breaker)
    assert breaker.state == OPEN
    assert changes == [OPEN]


def test_ratio_below_threshold_does_not_trip_and_exact_threshold_does():
    breaker, clock, changes = make(RATIO)
    succeed(breaker, 6)
    fail(breaker, 4)  # 4/10
    assert breaker.state == CLOSED
    fail(breaker)  # 5/11
    assert breaker.state == CLOSED
    fail(breaker)  # 6/12 == 0.5
    assert breaker.state == OPEN


def test_successes_alone_never_trip_even_past_min_requests():
    breaker, clock, changes = make(dataclasses.replace(RATIO, failure_ratio=0.1))
    fail(breaker)
    succeed(breaker, 8)  # 1/9 failures, then successes push the count past min_requests
    succeed(breaker, 100)
    assert breaker.state == CLOSED


@pytest.mark.parametrize("later, tripped", [(29.9, True), (30.0, False), (1000.0, False)])
def test_old_failures_age_out_of_the_window(later, tripped):
    breaker, clock, changes = make(RATIO)
    fail(breaker, 9)
    assert breaker.state == CLOSED
    clock.advance(later)
    fail(breaker)
    assert (breaker.state == OPEN) is tripped


def test_window_slides_bucket_by_bucket():
    config = dataclasses.replace(RATIO, min_requests=6)
    breaker, clock, changes = make(config)
    fail(breaker, 5)  # t=0
    clock.advance(15)
    succeed(breaker, 2)  # t=15
    clock.advance(16)
    # t=31: the failures from t=0 are gone, the successes from t=15 remain.
    fail(breaker)  # 2 successes + 1 failure
    assert breaker.state == CLOSED
    fail(breaker, 2)  # 5 results
    assert breaker.state == CLOSED
    fail(breaker)  # 6 results, 4 failures
    assert breaker.state == OPEN


def test_window_keeps_exact_counts_over_many_windows():
    breaker, clock, changes = make(RATIO)
    fail(breaker, 5)  # t=0
    clock.advance(15)
    succeed(breaker)  # t=15
    clock.advance(16)
    succeed(breaker, 4)  # t=31: the t=0 failures have left
    clock.advance(14)
    succeed(breaker)  # t=45: the t=15 success has left
    clock.advance(16)
    # t=61: only the t=45 success is left; 9 failures make 10 results.
    fail(breaker, 8)
    assert breaker.state == CLOSED
    fail(breaker)
    assert breaker.state == OPEN


def test_released_calls_are_not_results():
    breaker, clock, changes = make(RATIO)
    fail(breaker, 5)
    for _ in range(20):
        breaker.release(breaker.allow())
    fail(breaker, 4)  # 9 results
    assert breaker.state == CLOSED
    fail(breaker)
    assert breaker.state == OPEN


def test_released_calls_do_not_reset_consecutive_failures():
    breaker, clock, changes = make()
    fail(breaker, 4)
    breaker.release(breaker.allow())
    fail(breaker)
    assert breaker.state == OPEN


# ------------------------------------------------------------ cool-down


def test_cooldown_timing_is_exact():
    breaker, clock, changes = make()
    clock.advance(100)
    trip(breaker)
    assert breaker.reopens_in() == 5.0
    clock.advance(3)
    assert breaker.reopens_in() == 2.0
    clock.advance(1.999)
    assert breaker.state == OPEN
    assert breaker.allow() is None
    clock.advance(0.001)
    assert breaker.state == HALF_OPEN
    assert breaker.reopens_in() == 0.0
    assert changes == [OPEN, HALF_OPEN]


def test_cooldown_grows_on_repeated_trips_up_to_the_cap():
    breaker, clock, changes = make()
    trip(breaker)
    seen = []
    for _ in range(8):
        delay = breaker.reopens_in()
        seen.append(delay)
        clock.advance(delay)
        fail(breaker)  # the half-open trial fails
        assert breaker.state == OPEN
    assert seen == [5.0, 10.0, 20.0, 40.0, 80.0, 120.0, 120.0, 120.0]
    assert breaker.trips == 9


def test_close_resets_cooldown_growth():
    breaker, clock, changes = make()
    trip(breaker)
    clock.advance(5)
    fail(breaker)
    assert breaker.reopens_in() == 10.0
    clock.advance(10)
    succeed(breaker)
    assert breaker.state == CLOSED
    assert breaker.trips == 0
    trip(breaker)
    assert breaker.trips == 1
    assert breaker.reopens_in() == 5.0


def test_jitter_adds_up_to_ten_percent_when_a_random_source_is_given():
    breaker, clock, changes = make(random=lambda: 0.5)
    trip(breaker)
    assert breaker.reopens_in() == pytest.approx(5.25)
    clock.advance(5.2)
    assert breaker.state == OPEN
    clock.advance(0.05)
    assert breaker.state == HALF_OPEN


def test_clock_stepping_back_ends_the_cooldown():
    class SteppableClock:
        now = 1000.0

        def seconds(self):
            return self.now

    clock = SteppableClock()
    breaker = CircuitBreaker(CONSECUTIVE, clock)
    trip(breaker)
    clock.now = 10.0
    assert breaker.state == HALF_OPEN


def test_clock_stepping_back_restarts_the_window():
    class SteppableClock:
        now = 1000.0

        def seconds(self):
            return self.now

    clock = SteppableClock()
    breaker = CircuitBreaker(RATIO, clock)
    fail(breaker, 9)
    clock.now = 10.0
    fail(breaker)  # the first 9 are forgotten, not counted forever
    assert breaker.state == CLOSED


# ------------------------------------------------------------ half-open


def test_half_open_allows_limited_concurrent_trials_and_release_frees_a_slot():
    breaker, clock, changes = make(dataclasses.replace(CONSECUTIVE, half_open_requests=2))
    trip(breaker)
    clock.advance(5)
    first, second = breaker.allow(), breaker.allow()
    assert first and second
    assert breaker.allow() is None
    breaker.release(first)
    assert breaker.state == HALF_OPEN
    third = breaker.allow()
    assert third
    assert breaker.allow() is None
    assert changes == [OPEN, HALF_OPEN]


def test_one_trial_success_closes_and_resets_everything():
    breaker, clock, changes = make(dataclasses.replace(CONSECUTIVE, half_open_requests=3))
    fail(breaker, 4)
    succeed(breaker)
    trip(breaker)
    clock.advance(5)
    a, b = breaker.allow(), breaker.allow()
    breaker.record_success(a)
    assert breaker.state == CLOSED
    assert breaker.trips == 0
    assert changes == [OPEN, HALF_OPEN, CLOSED]
    # The other trial finishing late, as a failure, changes nothing.
    breaker.record_failure(b)
    assert breaker.state == CLOSED
    # Counters start from zero: 4 failures do not trip, the 5th does.
    fail(breaker, 4)
    assert breaker.state == CLOSED
    fail(breaker)
    assert breaker.state == OPEN
    assert breaker.reopens_in() == 5.0


def test_trial_failure_reopens_and_other_trials_are_stale():
    breaker, clock, changes = make(dataclasses.replace(CONSECUTIVE, half_open_requests=2))
    trip(breaker)
    clock.advance(5)
    a, b = breaker.allow(), breaker.allow()
    breaker.record_failure(a)
    assert breaker.state == OPEN
    assert breaker.reopens_in() == 10.0
    breaker.record_success(b)  # decided already: does not close
    assert breaker.state == OPEN
    assert changes == [OPEN, HALF_OPEN, OPEN]


def test_released_trial_leaves_breaker_half_open_for_the_next_trial():
    breaker, clock, changes = make()
    trip(breaker)
    clock.advance(5)
    breaker.release(breaker.allow())
    assert breaker.state == HALF_OPEN
    assert breaker.trips == 1
    succeed(breaker)
    assert breaker.state == CLOSED


def test_half_open_without_traffic_stays_half_open():
    breaker, clock, changes = make()
    trip(breaker)
    clock.advance(1000)
    assert breaker.state == HALF_OPEN
    clock.advance(1000)
    assert breaker.state == HALF_OPEN
    assert changes == [OPEN, HALF_OPEN]


# ------------------------------------------------------------ late results


def test_late_success_while_open_does_not_close():
    breaker, clock, changes = make()
    slow = breaker.allow()
    trip(breaker)
    clock.advance(1)
    breaker.record_success(slow)
    assert breaker.state == OPEN
    assert breaker.reopens_in() == 4.0


def test_late_failure_while_open_does_not_extend_or_count_a_trip():
    breaker, clock, changes = make()
    slow = [breaker.allow() for _ in range(10)]
    trip(breaker)
    clock.advance(1)
    for ticket in slow:
        breaker.record_failure(ticket)
    assert breaker.state == OPEN
    assert breaker.reopens_in() == 4.0
    assert breaker.trips == 1
    assert changes == [OPEN]


def test_late_results_from_closed_do_not_decide_half_open():
    breaker, clock, changes = make()
    slow_ok, slow_bad, slow_gone = breaker.allow(), breaker.allow(), breaker.allow()
    trip(breaker)
    clock.advance(5)
    trial = breaker.allow()
    assert trial
    breaker.record_success(slow_ok)
    breaker.record_failure(slow_bad)
    breaker.release(slow_gone)  # must not free the trial's slot
    assert breaker.state == HALF_OPEN
    assert breaker.allow() is None
    breaker.record_success(trial)
    assert breaker.state == CLOSED
    assert changes == [OPEN, HALF_OPEN, CLOSED]


def test_late_failures_from_a_previous_closed_period_do_not_count():
    breaker, clock, changes = make()
    slow = [breaker.allow() for _ in range(5)]
    trip(breaker)
    clock.advance(5)
    succeed(breaker)
    assert breaker.state == CLOSED
    for ticket in slow:
        breaker.record_failure(ticket)
    assert breaker.state == CLOSED
    fail(breaker, 4)
    assert breaker.state == CLOSED


def test_a_ticket_counts_once():
    breaker, clock, changes = make()
    trip(breaker)
    clock.advance(5)
    ticket = breaker.allow()
    breaker.release(ticket)
    breaker.release(ticket)  # must not free a second slot
    assert breaker.allow()
    assert breaker.allow() is None
    breaker.record_failure(ticket)  # already released: ignored
    assert breaker.state == HALF_OPEN


def test_a_ticket_from_another_breaker_is_ignored():
    breaker, clock, changes = make()
    other, _, _ = make()
    foreign = other.allow()
    trip(breaker)
    clock.advance(5)
    assert breaker.allow()
    breaker.record_success(foreign)
    assert breaker.state == HALF_OPEN


# ------------------------------------------------------------ on_change


def test_on_change_reports_every_transition_in_order():
    breaker, clock, changes = make()
    trip(breaker)
    clock.advance(5)
    trial = breaker.allow()  # the move to half-open is noticed by allow() too
    assert changes == [OPEN, HALF_OPEN]
    breaker.record_failure(trial)
    clock.advance(10)
    succeed(breaker)
    trip(breaker)
    assert changes == [OPEN, HALF_OPEN, OPEN, HALF_OPEN, CLOSED, OPEN]


def test_a_failing_callback_does_not_break_the_breaker():
    clock = Clock()

    def explode(state):
        raise RuntimeError("gauge unavailable")

    breaker = CircuitBreaker(CONSECUTIVE, clock, explode)
    trip(breaker)
    assert breaker.allow() is None
    clock.advance(5)
    succeed(breaker)
    assert breaker.state == CLOSED


@hsettings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["allow", "allow", "allow", "fail", "fail", "ok", "release", "tick"]), st.integers(0, 7)
        ),
        min_size=50,
        max_size=200,
    ),
    limit=st.integers(1, 3),
)
def test_random_traffic_keeps_the_state_machine_legal(ops, limit):
    config = dataclasses.replace(
        CONSECUTIVE, consecutive_failures=3, min_requests=4, half_open_requests=limit, window=10.0
    )
    breaker, clock, changes = make(config)
    outstanding = []  # (ticket, the state period it was issued in)
    legal = {(CLOSED, OPEN), (OPEN, HALF_OPEN), (HALF_OPEN, OPEN), (HALF_OPEN, CLOSED)}
    for op, n in ops:
        if op == "allow":
            before = breaker.state
            period = len(changes)
            trials = sum(1 for _, p in outstanding if p == period)
            ticket = breaker.allow()
            if before == OPEN:
                assert ticket is None
            elif before == CLOSED:
                assert ticket
            else:
                # Half-open: a trial exactly while fewer than `limit` are out.
                assert bool(ticket) == (trials < limit)
            if ticket:
                outstanding.append((ticket, period))
        elif op == "tick":
            clock.advance(n)
        elif outstanding:
            ticket, _ = outstanding.pop(n % len(outstanding))
            {"ok": breaker.record_success, "fail": breaker.record_failure, "release": breaker.release}[op](ticket)
        state = breaker.state
        if state != OPEN:
            assert breaker.reopens_in() == 0.0
        else:
            assert 0 < breaker.reopens_in() <= config.max_cooldown
    previous = CLOSED
    for state in changes:
        assert (previous, state) in legal
        previous = state
    assert previous == breaker.state


# ------------------------------------------------------------ registry


def test_registry_makes_one_breaker_per_origin():
    reported = []
    registry = BreakerRegistry(Clock(), lambda origin, state: reported.append((origin, state)))
    a = registry.get("https://a.svc:443", CONSECUTIVE)
    assert registry.get("https://a.svc:443", CONSECUTIVE) is a
    assert registry.get("https://a.svc:443", dataclasses.replace(CONSECUTIVE)) is a  # equal settings
    b = registry.get("https://b.svc:443", CONSECUTIVE)
    assert b is not a
    trip(a)
    assert b.state == CLOSED
    assert reported == [("https://a.svc:443", OPEN)]


def test_registry_replaces_breaker_when_settings_change():
    clock = Clock()
    reported = []
    registry = BreakerRegistry(clock, lambda origin, state: reported.append((origin, state)))
    origin = "https://a.svc:443"
    old = registry.get(origin, CONSECUTIVE)
    slow = old.allow()
    trip(old)
    changed = dataclasses.replace(CONSECUTIVE, consecutive_failures=2)
    new = registry.get(origin, changed)
    assert new is not old
    assert new.state == CLOSED
    assert new.settings == changed
    assert registry.get(origin, changed) is new
    assert reported == [(origin, OPEN), (origin, CLOSED)]
    # The old breaker no longer reports, and its tickets do not touch the new one.
    clock.advance(5)
    assert old.state == HALF_OPEN
    new.record_failure(slow)
    assert reported == [(origin, OPEN), (origin, CLOSED)]
    fail(new, 2)
    assert reported == [(origin, OPEN), (origin, CLOSED), (origin, OPEN)]


def test_registry_replacing_a_closed_breaker_reports_nothing():
    reported = []
    registry = BreakerRegistry(Clock(), lambda origin, state: reported.append((origin, state)))
    registry.get("o", CONSECUTIVE)
    registry.get("o", dataclasses.replace(CONSECUTIVE, cooldown=1.0))
    assert reported == []


def test_registry_passes_jitter_source_to_breakers():
    registry = BreakerRegistry(Clock(), random=lambda: 0.99)
    breaker = registry.get("o", CONSECUTIVE)
    trip(breaker)
    assert breaker.reopens_in() == pytest.approx(5 * 1.099)


# ------------------------------------------------------------ purity


def test_importing_breaker_does_not_install_a_reactor():
    code = "import sys, amp.breaker; sys.exit('twisted.internet.reactor' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
