"""
Bounding a reply's head while it streams in: L{HeadCounter}.

llhttp parses a head but bounds neither its size nor its number of header
lines, and httptools hands a header to Python only once its value has
ended: an endpoint streaming one endless header, or short header lines one
at a time, would be read until the call's timeout.  The counter sees each
read before the parser does and refuses a head over a limit at once, in
bytes (C{max_response_header_size}), lines (C{max_response_headers}) and
the length of one line (L{MAX_LINE}).  It only looks for line ends and the
blank line that ends a head; parsing is llhttp's.

It also holds the head's bytes from the client's L{ReplyBudget} until the
reply is over (L{HeadCounter.release}).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

#: The longest header line a reply may have, whatever the head's limit: a
#: line is held whole by the parser before amp sees it.
MAX_LINE = 16384


class ReplyBudget:
    """
    The bytes of endpoint replies amp holds at once, over every call, and
    the bound on them (C{endpoints.max_buffered}): heads while they stream
    in and until their reply is over, bodies until their call has ended.

    @ivar limit: the bound.
    @ivar held: bytes held now.
    @ivar peak: the most ever held at once.
    """

    __slots__ = ("limit", "held", "peak")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self.peak = 0

    def take(self, n: int) -> bool:
        """
        Hold C{n} more bytes, if that stays within the limit.
        """
        held = self.held + n
        if held > self.limit:
            return False
        self.held = held
        if held > self.peak:
            self.peak = held
        return True

    def give(self, n: int) -> None:
        """
        Hand back C{n} bytes taken before.
        """
        self.held -= n

    def full(self) -> str:
        """
        What to say when taking more would pass the bound.
        """
        return f"amp already holds {self.held} bytes of endpoint replies (endpoints.max_buffered: {self.limit})"


class Charge:
    """
    What one call holds of the L{ReplyBudget}: taken as its body arrives,
    handed back at once when the call ends (L{close}); nothing can be taken
    after that.
    """

    __slots__ = ("budget", "_held", "_closed")

    def __init__(self, budget: ReplyBudget) -> None:
        self.budget = budget
        self._held = 0
        self._closed = False

    def take(self, n: int) -> bool:
        if self._closed or not self.budget.take(n):
            return False
        self._held += n
        return True

    def close(self) -> None:
        self._closed = True
        held, self._held = self._held, 0
        if held:
            self.budget.give(held)


@dataclass(frozen=True)
class ReplyLimits:
    """
    Bounds on each reply of a connection.
    """

    #: C{max_response_header_size}: status line and header lines together,
    #: in bytes (1xx interim heads included).
    head_size: int
    #: C{max_response_headers}: header lines.
    head_count: int
    #: C{max_response}: the body, in bytes.
    body: int
    budget: ReplyBudget


class HeadCounter:
    """
    Counts one connection's reply heads; L{start} before each reply.

    L{count} returns None while the head is within its limits, or the
    message saying which limit it passed, or C{""} when taking its bytes
    would pass the reply budget.
    """

    __slots__ = ("_limits", "in_head", "ended_at", "_held", "_lines", "_line", "_line_start", "_at_status", "_interim")

    def __init__(self, limits: ReplyLimits) -> None:
        self._limits = limits
        #: A reply's head is being read.
        self.in_head = False
        #: Where in the bytes last counted the head ended (just after its
        #: blank line), or -1.
        self.ended_at = -1
        #: Bytes of the reply's head(s) so far, held from the budget.
        self._held = 0
        self._lines = 0
        self._line = 0
        self._line_start = bytearray()
        #: The next complete line is a status line.
        self._at_status = False
        self._interim = False

    def start(self) -> None:
        """
        A request went out: its reply's head starts with the next byte in.
        """
        self.release()
        self.in_head = True
        self.ended_at = -1
        self._lines = 0
        self._line = 0
        self._at_status = True
        self._interim = False
        if self._line_start:
            self._line_start = bytearray()

    def release(self) -> None:
        """
        The reply is over (or dropped): its head is no longer held.
        """
        if self._held:
            self._limits.budget.give(self._held)
            self._held = 0

    @property
    def size(self) -> int:
        """The bytes of the reply's head(s) counted so far."""
        return self._held

    @property
    def lines(self) -> int:
        """The header lines of the reply's final head counted so far."""
        return self._lines

    def count(self, data: bytes) -> Optional[str]:
        """
        Count the head bytes in C{data}, the next bytes of the reply.
        """
        if self._at_status and not self._line and self._whole_head(data):
            return None
        return self._scan(data)

    def _whole_head(self, data: bytes) -> bool:
        """
        The usual reply, counted in a few C calls: the whole head in the
        first bytes read, C{HTTP/1.x} and a final status code, within every
        limit.  True when it was; False leaves C{data} to L{_scan}, which
        handles everything else (and refuses what is over a limit).
        """
        blank = data.find(b"\n\r\n")
        if (
            blank < 0
            or not data.startswith(b"HTTP/1.")
            or data[9:10] == b"1"
            or not data[9:12].isdigit()
            or data[12:13] not in (b" ", b"\r")
            or data.find(b"\n\n", 0, blank) >= 0
        ):
            return False
        size = blank + 3
        limits = self._limits
        lines = data.count(b"\n", 0, size) - 2
        if size > limits.head_size or size > MAX_LINE or lines > limits.head_count:
            return False
        if not limits.budget.take(size):
            return False
        self._held = size
        self._lines = lines
        self.in_head = False
        self.ended_at = size
        return True

    def _scan(self, data: bytes) -> Optional[str]:
        limits = self._limits
        counted = 0
        pos = 0
        size = len(data)
        while pos < size:
            nl = data.find(b"\n", pos)
            end = size if nl < 0 else nl + 1
            piece = end - pos
            counted += piece
            self._line += piece
            # Kept of the line: all of a status line (its code decides
            # whether another head follows), enough of any other to tell
            # the blank line that ends a head.
            keep = MAX_LINE + 1 if self._at_status else 2
            if len(self._line_start) < keep:
                self._line_start += data[pos : min(end, pos + keep - len(self._line_start))]
            if self._held + counted > limits.head_size:
                return (
                    f"reply headers are larger than the {limits.head_size} byte limit "
                    f"(endpoints.max_response_header_size)"
                )
            if self._line > MAX_LINE:
                return f"a reply header line is longer than {MAX_LINE} bytes"
            pos = end
            if nl < 0:
                break
            line, self._line_start, self._line = self._line_start, bytearray(), 0
            if self._at_status:
                self._at_status = False
                self._interim = interim(bytes(line))
            elif line == b"\r\n" or line == b"\n":
                if self._interim:
                    # A 1xx head: the real one follows.
                    self._at_status = True
                    continue
                self.in_head = False
                self.ended_at = pos
                break
            else:
                self._lines += 1
                if self._lines > limits.head_count:
                    return f"reply has more than {limits.head_count} header lines (endpoints.max_response_headers)"
        if not limits.budget.take(counted):
            return ""
        self._held += counted
        return None


def interim(status_line: bytes) -> bool:
    """
    Whether a status line (with its line end) may be a 1xx interim reply,
    after which another head follows.  Read generously (the line end off,
    split on spaces, C{int()} of the second part: C{+100} and C{0100}
    count), so that no way of writing a 1xx code ends the count here; llhttp
    refuses those that are not three digits.
    """
    line = status_line[:-1] if status_line.endswith(b"\n") else status_line
    if line.endswith(b"\r"):
        line = line[:-1]
    parts = line.split(b" ", 2)
    if len(parts) < 2:
        return False
    try:
        code = int(parts[1])
    except ValueError:
        return False
    return 100 <= code < 200
