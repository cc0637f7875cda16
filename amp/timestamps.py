"""
How amp writes a moment (pure): RFC 3339 in UTC with milliseconds, in
C{/debug/reviews} (L{amp.recent}) and in the recording's lines
(L{amp.record}).  A module of its own so that the recording's writer
process, which needs only this of C{amp.recent}, does not import the web
server it serves from.
"""

from __future__ import annotations

from datetime import datetime, timezone

__all__ = ["rfc3339"]


def rfc3339(seconds: float) -> str:
    """
    C{seconds} since the epoch as an RFC 3339 UTC timestamp with
    milliseconds, e.g. C{2026-11-23T00:41:29.123Z}.
    """
    moment = datetime.fromtimestamp(seconds, tz=timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
