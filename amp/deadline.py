"""
The review's one deadline (pure).

The API server tells a webhook how long it will wait with C{?timeout=10s}
on the URL.  The HTTP edge (L{amp.web}) turns that, less
C{deadline.margin}, into one absolute L{Deadline} on the reactor's clock,
once, when the request arrives; it travels down with the review.  One timer
enforces it: the review's L{amp.waiting.Waiting}, which both sides read
(the review, and every step it waits on: the namespace lookup, the endpoint
call, the canary's candidate).  Each step is given what is left of it
(L{Deadline.remaining}); the one timer is set for the earlier of the step's
own expiry and the deadline, and when the deadline passes the step in
progress is cut off the one way, its C{cancel()}.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from typing import Final, Optional

from amp.config import DeadlineConfig
from amp.memo import Memo

_TIMEOUT = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m)?$")
_TIMEOUT_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, None: 1.0}
#: The longest timeout the API server gives a webhook (timeoutSeconds is
#: 1..30): a larger ?timeout= is not the API server's, and is cut to this.
MAX_TIMEOUT = 30.0

#: Times are floats: a timer set for C{remaining(now)} fires at
#: C{now + (at - now)}, which can be C{at} less a rounding error.  Within
#: this many seconds of C{at}, the deadline has passed.
_SLACK = 1e-6


# Not frozen: a frozen dataclass's __init__ sets each field through
# object.__setattr__, several times the cost of a plain one (bench/README.md, "Figures behind the code");
# one is made for every review,
# and nothing changes it once made.
@dataclass(slots=True)
class Deadline:
    """
    When a review must be answered by, on the reactor's clock.

    @ivar at: the absolute time (C{IReactorTime.seconds()}).
    @ivar budget: the seconds the review had when it arrived (for messages).
    """

    at: float
    budget: float

    @classmethod
    def after(cls, now: float, budget: float) -> "Deadline":
        """
        The deadline C{budget} seconds after C{now}.
        """
        return cls(now + budget, budget)

    def remaining(self, now: float) -> float:
        """
        Seconds left at C{now}; never negative.
        """
        left = self.at - now
        return left if left > 0.0 else 0.0

    def passed(self, now: float) -> bool:
        """
        Whether the deadline has passed at C{now}.
        """
        return now >= self.at - _SLACK


def parse_timeout(value: Optional[str]) -> Optional[float]:
    """
    The API server's C{?timeout=10s} query value in seconds, or None.
    """
    if not value:
        return None
    known = _PARSED.get(value, _UNKNOWN)
    if known is not _UNKNOWN:
        return known
    m = _TIMEOUT.match(value.strip())
    if not m:
        seconds = None
    else:
        seconds = float(m.group(1)) * _TIMEOUT_UNITS[m.group(2)]
        # 400 digits make an infinite float: never an unbounded review.
        seconds = min(seconds, MAX_TIMEOUT) if seconds > 0 else None
    if len(value) <= 32:
        _PARSED[value] = seconds
    return seconds


#: Timeouts read already: an API server sends its webhook's one value.
_PARSED: Memo[str, Optional[float]] = Memo(256)


class _Missing(Enum):
    """Not read yet (an enum member, so that a type checker narrows C{is not _UNKNOWN})."""

    MISSING = 0


_UNKNOWN: Final = _Missing.MISSING


def review_budget(timeout: Optional[float], default_timeout: float, margin: float) -> float:
    """
    Seconds amp may spend on one review: the API server's timeout (or the
    configured default) less the safety margin, never less than a tenth of
    the timeout so a large margin cannot leave nothing.
    """
    total = timeout if timeout is not None else default_timeout
    return max(total - margin, total * 0.1)


def review_deadline(query: Optional[str], now: float, config: DeadlineConfig) -> Deadline:
    """
    The deadline of a review that arrived at C{now} with C{?timeout=query}
    (None when the query has none).
    """
    return Deadline.after(now, review_budget(parse_timeout(query), config.default_timeout, config.margin))
