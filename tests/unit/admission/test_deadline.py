"""
Tests for amp.deadline: the API server's C{?timeout=} turned once into the
review's absolute deadline, and what is left of it.
"""

from __future__ import annotations

from typing import Optional

import pytest

from amp.config import DeadlineConfig
from amp.deadline import Deadline, parse_timeout, review_budget, review_deadline


@pytest.mark.parametrize(
    "value, seconds",
    [("10s", 10.0), ("30s", 30.0), ("1.5s", 1.5), ("500ms", 0.5), ("10", 10.0), (" 10s ", 10.0)],
)
def test_parse_timeout(value: str, seconds: float) -> None:
    assert parse_timeout(value) == seconds


@pytest.mark.parametrize("value", ["2m", "31s", "9" * 400 + "s", "9" * 400 + "m"])
def test_a_timeout_longer_than_the_api_server_gives_is_cut_to_30s(value: str) -> None:
    """
    The API server's timeoutSeconds is at most 30: a longer ?timeout= (400
    digits make an infinite float) never makes a review unbounded.
    """
    assert parse_timeout(value) == 30.0


@pytest.mark.parametrize("value", [None, "", "abc", "10 s", "-1s", "0s", "0", "10h", "1e3s"])
def test_parse_timeout_ignores_what_it_cannot_read(value: Optional[str]) -> None:
    assert parse_timeout(value) is None


@pytest.mark.parametrize(
    "timeout, default, margin, budget",
    [
        (10.0, 10.0, 0.5, 9.5),
        (None, 10.0, 0.5, 9.5),
        (None, 4.0, 1.0, 3.0),
        (1.0, 10.0, 0.5, 0.5),
        (30.0, 10.0, 0.5, 29.5),
        # a margin as large as the timeout still leaves a tenth of it
        (1.0, 10.0, 2.0, 0.1),
        (2.0, 10.0, 2.0, 0.2),
    ],
)
def test_review_budget(timeout: Optional[float], default: float, margin: float, budget: float) -> None:
    assert review_budget(timeout, default, margin) == pytest.approx(budget)


def test_review_deadline_is_absolute_on_the_clock_it_was_given() -> None:
    deadline = review_deadline("10s", 1000.0, DeadlineConfig(default_timeout=30.0, margin=0.5))
    assert deadline == Deadline(1009.5, 9.5)
    assert review_deadline(None, 1000.0, DeadlineConfig(default_timeout=4.0, margin=1.0)) == Deadline(1003.0, 3.0)


def test_remaining_counts_down_and_stops_at_zero() -> None:
    deadline = Deadline.after(100.0, 2.0)
    assert deadline.remaining(100.0) == 2.0
    assert deadline.remaining(101.5) == pytest.approx(0.5)
    assert deadline.remaining(102.0) == 0.0
    assert deadline.remaining(250.0) == 0.0


def test_passed_at_the_deadline_even_after_rounding() -> None:
    """
    A timer set for C{remaining(now)} fires at C{now + (at - now)}, which
    float arithmetic can put a hair before C{at}: that is the deadline.
    """
    deadline = Deadline(3.264, 2.0)
    now = 0.752
    fired_at = now + deadline.remaining(now)
    assert fired_at < deadline.at
    assert deadline.passed(fired_at)
    assert not deadline.passed(deadline.at - 0.001)
    assert deadline.passed(deadline.at + 5)
