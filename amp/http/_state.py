"""
The states of one webhook connection (L{amp.http.HTTPServerProtocol}) and
every transition between them, in one place (after h11's C{_state.py}).

A connection has two states, each one value:
  - L{Link}: where the connection is in its life, from the accept to
    C{connectionLost};
  - L{Receiving}: how much of the request now arriving has been read.

What is left beside them is not the connection's state but flow control
(the transport told amp to stop writing; amp told the transport to stop
reading: independent, every pair legal) and a guard against answering the
queue from inside itself.

A transition not in the tables is amp's bug: L{IllegalTransition} is
raised at once, naming both states, rather than a connection going on in a
combination nothing was written for.

Both are L{IntEnum}s ordered so that the connection's checks on the hot
path are one comparison: C{link >= Link.CLOSING} is "nothing more is
parsed", C{link >= Link.CLOSED} "nothing more is written".
"""

from __future__ import annotations

import math
from enum import IntEnum


class Link(IntEnum):
    """Where a connection is in its life."""

    #: Accepted and counted; no request received whole yet (the first
    #: request's read deadline runs from the accept; the drain waits for it).
    FRESH = 0
    #: At least one request received whole; reading and answering.
    OPEN = 1
    #: Nothing more is parsed (a refusal is queued, or an upgrade was
    #: received): the requests received are answered, then it is closed.
    CLOSING = 2
    #: amp closed or aborted it: nothing more is written; the client's
    #: input is read and dropped (the linger) until the transport goes.
    CLOSED = 3
    #: Refused at the accept (the listener draining, or
    #: C{listen.max_connections} open): never counted, aborted.
    REJECTED = 4
    #: C{connectionLost}: the end.
    LOST = 5


class Receiving(IntEnum):
    """How much of the request now arriving has been read."""

    #: No request is arriving (none begun, or the last one ended or refused).
    NOTHING = 0
    #: A request has begun: its request line is arriving.
    LINE = 1
    #: Its request line has ended: header fields are arriving.
    FIELDS = 2
    #: Its head is whole: the body (or a chunked body's trailers) is arriving.
    BODY = 3


#: Link: the states each may go to.  CLOSED -> CLOSED is an abort of a
#: connection already closing (the linger's end, the drain's time up).
LINK_NEXT: dict[Link, frozenset[Link]] = {
    Link.FRESH: frozenset({Link.OPEN, Link.CLOSING, Link.CLOSED, Link.REJECTED, Link.LOST}),
    Link.OPEN: frozenset({Link.CLOSING, Link.CLOSED, Link.LOST}),
    Link.CLOSING: frozenset({Link.CLOSED, Link.LOST}),
    Link.CLOSED: frozenset({Link.CLOSED, Link.LOST}),
    Link.REJECTED: frozenset({Link.LOST}),
    Link.LOST: frozenset(),
}

#: Receiving: the states each may go to.  Any state may go back to
#: NOTHING (the request ended, was refused, or the connection closed); LINE
#: goes to BODY directly when the whole head came in the read that began it.
RECEIVING_NEXT: dict[Receiving, frozenset[Receiving]] = {
    Receiving.NOTHING: frozenset({Receiving.NOTHING, Receiving.LINE}),
    Receiving.LINE: frozenset({Receiving.NOTHING, Receiving.FIELDS, Receiving.BODY}),
    Receiving.FIELDS: frozenset({Receiving.NOTHING, Receiving.BODY}),
    Receiving.BODY: frozenset({Receiving.NOTHING}),
}


class IllegalTransition(RuntimeError):
    """A connection was asked to go from one state to one its table does not allow."""

    def __init__(self, what: str, old: IntEnum, new: IntEnum) -> None:
        super().__init__(f"{what}: {old.name} -> {new.name} is not a transition of amp's")
        self.old = old
        self.new = new


def check_link(old: Link, new: Link) -> Link:
    """C{new}, if C{old} may go to it; else raise L{IllegalTransition}."""
    if new not in LINK_NEXT[old]:
        raise IllegalTransition("connection", old, new)
    return new


def check_receiving(old: Receiving, new: Receiving) -> Receiving:
    """C{new}, if C{old} may go to it; else raise L{IllegalTransition}."""
    if new not in RECEIVING_NEXT[old]:
        raise IllegalTransition("request arriving", old, new)
    return new


class Timer(IntEnum):
    """What the connection's one timer stands for (any may follow any)."""

    #: Nothing: the timer, if set, does nothing when it fires.
    NONE = 0
    #: C{listen.request_timeout}: the request arriving (or the first one to begin).
    READ = 1
    #: C{listen.idle_timeout}: nothing asked of amp.
    IDLE = 2
    #: L{amp.http._limits.CLOSE_GRACE}: the client has not taken amp's close.
    LINGER = 3


def delay_until(now: float, when: float) -> float:
    """
    A delay from C{now} that does not overshoot C{when} once added back
    (a timer must not fire after the deadline it stands for).
    """
    delay = when - now
    while delay > 0 and now + delay > when:
        delay = math.nextafter(delay, 0.0)
    return max(delay, 0.0)
