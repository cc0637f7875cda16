"""
W3C Trace Context (pure): the C{traceparent} header read and written, the
C{tracestate} header kept as it came within its limits, and the sampling
decision of a review (parent-based, with a ratio for the traces amp starts).

What is malformed is ignored, as the specification says: a review whose
C{traceparent} cannot be read starts a trace of its own, and a
C{tracestate} that is too long or carries bad characters is dropped.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Optional

_HEX = frozenset(b"0123456789abcdef")
#: The C{tracestate} header amp passes on at most (the specification's 32
#: members of at most 256 bytes each, and the 512 bytes a vendor must keep).
MAX_TRACESTATE = 512
#: The lower 64 bits of a trace id, which the ratio compares (as the
#: OpenTelemetry SDK's C{TraceIdRatioBased} does, so amp and an SDK
#: sampling at the same ratio make the same decision for a trace).
_LOW = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class Parent:
    """
    The caller's span, from its C{traceparent} (and C{tracestate}).

    @ivar trace_id: 128 bits, never zero.
    @ivar span_id: 64 bits, never zero.
    @ivar sampled: the caller's C{sampled} flag.
    @ivar tracestate: the C{tracestate} header as it came, or C{b""}.
    """

    trace_id: int
    span_id: int
    sampled: bool
    tracestate: bytes = b""


def parse_traceparent(value: Optional[bytes], tracestate: Optional[bytes] = None) -> Optional[Parent]:
    """
    The caller's span from a C{traceparent} header's C{value}; None when it
    is absent or malformed (version C{ff}, a wrong length, upper-case or
    other non-hex digits, an all-zero id).  A later version's header is
    read by its first four fields, as the specification asks.
    """
    if not value:
        return None
    value = value.strip()
    if len(value) < 55 or value[2:3] != b"-" or value[35:36] != b"-" or value[52:53] != b"-":
        return None
    version, trace, span, flags = value[:2], value[3:35], value[36:52], value[53:55]
    if not _HEX.issuperset(version + trace + span + flags) or version == b"ff":
        return None
    if version == b"00" and len(value) != 55:
        return None
    if len(value) > 55 and value[55:56] != b"-":
        return None
    trace_id, span_id = int(trace, 16), int(span, 16)
    if not trace_id or not span_id:
        return None
    return Parent(trace_id, span_id, bool(int(flags, 16) & 1), clean_tracestate(tracestate))


def clean_tracestate(value: Optional[bytes]) -> bytes:
    """C{tracestate} as it came when it is within its limits, else C{b""}."""
    if not value or len(value) > MAX_TRACESTATE:
        return b""
    if any(c < 0x20 or c > 0x7E for c in value):
        return b""
    return value.strip()


def format_traceparent(trace_id: int, span_id: int, sampled: bool) -> bytes:
    """The C{traceparent} header naming span C{span_id} of trace C{trace_id}."""
    return b"00-%032x-%016x-%s" % (trace_id, span_id, b"01" if sampled else b"00")


def trace_id_hex(trace_id: int) -> str:
    """A trace id as it is written everywhere (32 lower-case hex digits)."""
    return "%032x" % trace_id


def sampled_by_ratio(trace_id: int, ratio: float) -> bool:
    """Whether a trace amp starts (or one whose caller does not decide) is sampled at C{ratio}."""
    return (trace_id & _LOW) < round(ratio * (1 << 64))


@dataclass(frozen=True, slots=True)
class Sampler:
    """
    How a review is sampled: C{parent_based} follows the caller's
    C{sampled} flag when there is a caller; else (and for every review
    when not parent-based) the trace id is compared with C{ratio}.
    """

    ratio: float
    parent_based: bool = True

    def decide(self, parent: Optional[Parent], trace_id: int) -> bool:
        if parent is not None and self.parent_based:
            return parent.sampled
        return sampled_by_ratio(trace_id, self.ratio)


class Ids:
    """
    Random trace and span ids (never zero), from a generator of amp's own
    so that tests can seed it.
    """

    __slots__ = ("_bits",)

    def __init__(self, rng: Optional[random.Random] = None) -> None:
        self._bits = (rng or random.Random()).getrandbits

    def trace_id(self) -> int:
        bits = self._bits
        while True:
            value = bits(128)
            if value:
                return value

    def span_id(self) -> int:
        bits = self._bits
        while True:
            value = bits(64)
            if value:
                return value
