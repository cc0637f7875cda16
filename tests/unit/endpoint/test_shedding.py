"""
Tests for amp.shedding: an origin's latency budget (the p90 of its last
calls against the budget, shedding, one probe at a time, recovery),
without a reactor; durations are given as numbers.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from amp.shedding import PROBE, SHED, LatencyBudget, over_allowed


def calls(budget: LatencyBudget, *seconds: float) -> list:
    return [budget.observe(budget.allow(), s) for s in seconds]


@given(st.integers(min_value=1, max_value=500))
def test_over_allowed_is_the_nearest_rank_p90(window: int) -> None:
    # With k of the window over the budget, the nearest-rank p90 (the value
    # at rank ceil(0.9 n) of the sorted window) is over it exactly when
    # k > over_allowed(window).
    rank = math.ceil(0.9 * window)
    for k in range(window + 1):
        values = sorted([0.0] * (window - k) + [1.0] * k)
        assert (values[rank - 1] > 0.5) == (k > over_allowed(window))


def test_no_verdict_before_the_window_is_full() -> None:
    b = LatencyBudget(0.1, 20)
    assert calls(b, *[5.0] * 19) == [None] * 19
    assert not b.shedding
    assert calls(b, 5.0) == [True]
    assert b.shedding


def test_two_slow_calls_in_twenty_are_within_the_p90() -> None:
    b = LatencyBudget(0.1, 20)
    calls(b, *([0.01] * 18 + [1.0, 1.0]))
    assert not b.shedding
    # A third one in the window is over it.
    assert calls(b, 1.0) == [True]


def test_old_calls_leave_the_window() -> None:
    b = LatencyBudget(0.1, 10)
    calls(b, 1.0, *[0.01] * 9)  # 1 of 10 over: within
    calls(b, *[0.01] * 5)  # the slow one has left the window
    calls(b, 1.0)  # 1 over again, not 2
    assert not b.shedding
    assert b.over == 1


def test_a_call_at_the_budget_is_within_it() -> None:
    b = LatencyBudget(0.1, 10)
    calls(b, *[0.1] * 10)
    assert not b.shedding


def test_shedding_lets_one_probe_out_at_a_time() -> None:
    b = LatencyBudget(0.1, 10)
    calls(b, *[1.0] * 10)
    probe = b.allow()
    assert probe == PROBE
    assert [b.allow() for _ in range(3)] == [SHED] * 3
    assert b.shed == 3
    # A slow probe: still shedding, the next new call probes.
    assert b.observe(probe, 0.5) is None
    assert b.shedding
    assert b.allow() == PROBE
    assert b.allow() == SHED


def test_a_probe_within_the_budget_ends_shedding_with_a_fresh_window() -> None:
    b = LatencyBudget(0.1, 10)
    calls(b, *[1.0] * 10)
    probe = b.allow()
    assert b.observe(probe, 0.05) is False
    assert not b.shedding
    assert b.seen == 0 and b.over == 0
    # A fresh window: one slow call is no verdict.
    assert calls(b, 1.0) == [None]


def test_a_probe_given_up_passes_its_turn() -> None:
    b = LatencyBudget(0.1, 10)
    calls(b, *[1.0] * 10)
    probe = b.allow()
    b.forget(probe)
    assert b.shedding
    assert b.allow() == PROBE


def test_calls_from_before_a_change_neither_count_nor_decide() -> None:
    b = LatencyBudget(0.1, 10)
    early = [b.allow() for _ in range(5)]
    calls(b, *[1.0] * 10)
    assert b.shedding
    # Slow calls admitted before shedding began end now: no effect.
    for token in early[:2]:
        assert b.observe(token, 0.01) is None
    assert b.shedding
    probe = b.allow()
    b.observe(probe, 0.01)
    assert not b.shedding
    # And those still out after it recovered do not count either.
    for token in early[2:]:
        assert b.observe(token, 9.0) is None
    assert b.seen == 0


def test_a_stale_probe_result_is_ignored() -> None:
    b = LatencyBudget(0.1, 10)
    assert b.observe(PROBE, 0.01) is None
    assert not b.shedding


@pytest.mark.parametrize("budget, window", [(0.0, 10), (-1.0, 10), (0.1, 0)])
def test_a_budget_needs_a_positive_budget_and_window(budget: float, window: int) -> None:
    with pytest.raises(ValueError):
        LatencyBudget(budget, window)


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["call", "probe-fast", "probe-slow", "probe-forget"]),
            st.floats(min_value=0.0, max_value=1.0),
        ),
        max_size=200,
    )
)
def test_at_most_one_probe_is_ever_out(steps: list) -> None:
    b = LatencyBudget(0.5, 5)
    out_probe = False
    for kind, seconds in steps:
        token = b.allow()
        if token == PROBE:
            assert not out_probe
            out_probe = True
            if kind == "probe-forget":
                b.forget(token)
            else:
                b.observe(token, 0.1 if kind == "probe-fast" else 0.9)
            out_probe = False
        elif token == SHED:
            assert b.shedding
        else:
            b.observe(token, seconds)
        assert b.seen <= b.window and 0 <= b.over <= b.seen
