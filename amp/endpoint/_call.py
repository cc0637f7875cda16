"""
One endpoint call, from the request to a settled outcome: L{Call}.

A call is settled exactly once, by the first of: a failure (a named one,
or the endpoint's own timeout), the caller cancelling it, or, once the call
has resolved to a usable reply (L{CallReply}), the caller settling it with
the reply's outcome (C{ok}, or the reason amp refused the reply) after it
judged the reply.  Settling records the outcome metric and the duration,
frees the call's bulkhead slot and hands its breaker ticket back:

  - C{record_success}: the endpoint answered with a usable reply;
  - C{record_failure}: the endpoint failed (L{classify} names how), its own
    timeout included;
  - C{release}: nothing was learned about the endpoint: the caller cancelled
    (outcome C{cancelled}), or amp gave up on its side (a L{LocalFailure}).

Whatever the request does after that is ignored.

Waiting for a slot
==================

A call made while its origin's bulkhead is full waits in the origin's
queue (L{Call.queue}), in arrival order, until a slot frees (L{Call.start},
from the client), or until its latest start, the review's deadline less
C{min_call_time}: then it fails with C{queue-timeout}.  While it waits,
L{Call.expires} is that latest start, which the caller's one timer times
exactly as it times the call's own timeout; cancelled while it waits, it
leaves the queue at once.  A
waiting call holds no breaker ticket and no slot, and counts no duration.

One timer, the caller's
=======================

A call arms no timer: its caller waits on it through its
L{amp.waiting.Waiting}, whose one timer is set for the earlier of the
call's L{Call.expires} and the review's deadline.  The call has a time of
its own (L{Call.expires} not None) only when the endpoint's C{timeout} is
shorter than the time left before the deadline: the caller's timer then
calls L{Call.time_out} at it, and the endpoint's timeout is the verdict,
C{timeout}, counted against the breaker.  A call that waited for a slot
and goes out tells its receiver (L{ICallReceiver.started}), as that moves
its expiry from its latest start to its own timeout.  Otherwise the
deadline ends the call: the caller cancels it (L{Call.cancel}) when the
deadline passes, and it fails with C{timeout} (it had all the time there
was) and hands its ticket back: the review's deadline is not a verdict on
the endpoint.  Cancelled before the deadline (the API server hung up), the
call ends as C{cancelled}, also without a verdict.

Retries
=======

Off by default.  With C{retry: true} a call is retried once, and only when
the connection could not be made (refused or another connect error: the
endpoint cannot have seen the request), never after a timeout or after
anything was sent, and only within the first half of the call's time.
Apart from that, and whatever C{retry} says, the pool sends a request again
once when the reused idle connection it went out on closed before any
byte of a reply (L{amp.http._pool}): that is within the call, not a retry
of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional
from typing import Protocol as TypingProtocol

from twisted.internet.defer import CancelledError, Deferred, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from amp.breaker import CircuitBreaker, Ticket
from amp.config import EndpointSettings
from amp.deadline import Deadline
from amp.endpoint._failures import EXPECTED, EndpointFailure, LocalFailure, classify, first_line, retriable
from amp.endpoint._pool import Profile, Target
from amp.http import Charge, Exchange, Reply
from amp.reasons import Reason, Verdict
from amp.reply import EndpointDecision, ReplyError, parse_reply
from amp.shedding import LatencyBudget

log = Logger()

#: The outcome of a call whose reply amp used.
OK = "ok"


@dataclass(frozen=True, slots=True, eq=False)
class CallReply:
    """
    What a call resolves to when the endpoint answered with a usable reply:
    the C{decision}, and C{settle}, which the caller calls exactly once,
    with the call's outcome once it has judged the decision: L{OK}, or the
    reason amp refused the reply (its patch does not check, see
    L{amp.reasons.REFUSED_REPLY_REASONS}).  Until then the call holds its
    place in flight.  Either way the endpoint answered: a success for its
    breaker.
    """

    decision: EndpointDecision
    settle: Callable[[str], None]


class ICallReceiver(TypingProtocol):
    """
    Where one call's end goes (L{Call}): exactly one of L{replied} and
    L{failed}, once (the names of L{amp.waiting.IReceiver}'s); and
    L{started} when a call that waited for a slot goes out.
    """

    def replied(self, reply: CallReply) -> None:
        """The endpoint answered with a usable reply; settle it once judged."""

    def failed(self, failure: Failure) -> None:
        """No usable reply: an L{EndpointFailure}, or C{CancelledError}."""

    def started(self) -> None:
        """
        The call, which waited for a slot, goes out now: its L{Call.expires}
        is its own timeout from now (or None).  The caller's timer, set for
        its latest start, is set for that (L{amp.waiting.Waiting.arm});
        told before anything is sent, so the call may still end (and be
        told) right after.
        """


# Not frozen: a frozen dataclass of many fields costs a microsecond a call
# (object.__setattr__ per field); nothing changes these once made.
@dataclass(slots=True)
class CallRequest:
    """
    What one call sends, where, and in how much time.

    @ivar name: the endpoint as amp names it (its origin), for the log.
    @ivar profile: the settings profile whose pools the call goes through.
    @ivar data: the whole request.
    @ivar timeout: the endpoint's own timeout when it is shorter than the
        caller's time left, else None (the caller's deadline rules).
    @ivar deadline: the review's deadline, which the caller enforces.
    @ivar allowed: the call's time: C{min(settings.timeout, remaining)}.
    """

    name: str
    target: Target
    profile: Profile
    settings: EndpointSettings
    data: bytes
    timeout: Optional[float]
    deadline: Deadline
    allowed: float


@dataclass(slots=True)
class CallGuard:
    """
    What a call holds until it is settled: its share of the client's reply
    budget (C{charge}), its origin breaker's C{ticket} (None while it
    waits for a slot), and its origin's latency budget with the call's
    token (L{amp.shedding}; None when the origin has none).
    """

    charge: Charge
    breaker: CircuitBreaker
    ticket: Optional[Ticket]
    latency: Optional[LatencyBudget] = None
    token: int = 0


def _answer(reply: Reply) -> EndpointDecision:
    """
    What a reply means: a 2xx reply's body (read within C{max_response}
    and amp's reply budget) parsed; any other status fails with its name,
    its body unread and its connection closed.  Redirects are never
    followed.
    """
    code = reply.code
    if reply.body is not None:
        try:
            return parse_reply(reply.body)
        except ReplyError as e:
            raise EndpointFailure(Reason(e.reason), str(e)) from None
    if 300 <= code < 400:
        where = (reply.location or b"").decode("latin-1")
        to = f" to {first_line(where)}" if where else ""
        raise EndpointFailure(Reason.REDIRECT, f"HTTP {code} redirect{to} not followed")
    if 400 <= code < 500:
        raise EndpointFailure(Reason.HTTP_4XX, f"HTTP {code}")
    if 500 <= code < 600:
        raise EndpointFailure(Reason.HTTP_5XX, f"HTTP {code}")
    raise EndpointFailure(Reason.INVALID_REPLY, f"HTTP status {code} is not a reply")


class Call:
    """
    One call: its expiry (if it has one), its ticket, its place in the
    bulkhead.

    @param reactor: the clock (the call's durations and expiry).
    @param settled: told C{(call, outcome, seconds, verdict)} once, when
        the call is settled (the client's bulkhead, latency budget and
        metrics); L{queued} tells whether it held a slot.
    @param receiver: told how the call ended, once (L{ICallReceiver}):
        a L{CallReply}, or the failure (L{EndpointFailure}; a
        C{CancelledError} when L{cancel}led before the deadline).
    """

    __slots__ = (
        "_reactor",
        "_request",
        "guard",
        "_on_settled",
        "_started",
        "_pending",
        "_retry",
        "_replied",
        "_done",
        "_waiters",
        "_receiver",
        "told",
        "expires",
        "queued",
        "exchange",
    )

    def __init__(
        self,
        reactor: IReactorTime,
        request: CallRequest,
        guard: CallGuard,
        settled: Callable[["Call", str, float, Verdict], None],
        receiver: "ICallReceiver",
    ) -> None:
        self._reactor = reactor
        self._request = request
        #: What the call holds (the client sets its ticket when a slot frees).
        self.guard = guard
        self._on_settled = settled
        self._retry = request.settings.retry
        #: The call resolved to a reply: only its caller settles it now.
        self._replied = False
        self._done = False
        self._waiters: Optional[list[Deferred[None]]] = None
        #: The request through the pool, until its outcome came.
        self._pending: Optional[Exchange] = None
        self._receiver = receiver
        #: The receiver was told how the call ended.
        self.told = False
        #: When the call's own time ends (the reactor's clock): its timeout,
        #: or its latest start while it waits for a slot; None when it has
        #: none (the caller's deadline comes first).  The caller's timer
        #: calls L{time_out} at it.
        self.expires: Optional[float] = None
        #: The last request through the pool (its connection's reuse and
        #: resends, for a trace), once sent.
        self.exchange: Optional[Exchange] = None
        #: The call waits in its origin's queue for a slot (L{queue}).
        self.queued = False

    @property
    def request(self) -> CallRequest:
        """What the call sends (the client sets its time when a slot frees)."""
        return self._request

    def queue(self, latest: float) -> None:
        """
        The call waits for a slot of its origin's bulkhead until C{latest}
        (the reactor's clock), its L{expires} meanwhile; then it fails with
        C{queue-timeout}.
        """
        self.queued = True
        self._started = self._reactor.seconds()
        self.expires = latest

    def waited(self, now: float) -> float:
        """Seconds the call has waited in the queue at C{now} (while it waits)."""
        return now - self._started

    def refuse(self, reason: Reason, message: str) -> None:
        """
        amp will not make the call after all (its origin's breaker opened or
        it began shedding while the call waited, ...): it fails with
        C{reason}, nothing sent.  Nothing after it has started or ended.
        """
        if self._done or not self.queued:
            return
        self._settle(reason, Verdict.RELEASE)
        self._tell_failure(Failure(EndpointFailure(reason, message)))

    def _queue_timed_out(self) -> None:
        if self._done or not self.queued:
            return
        now = self._reactor.seconds()
        left = self._request.deadline.remaining(now)
        self.refuse(
            Reason.QUEUE_TIMEOUT,
            f"waited {now - self._started:.3g}s for a slot (endpoints.max_concurrent "
            f"calls in flight); {left:.3g}s left is too little for the call "
            f"(endpoints.min_call_time)",
        )

    def start(self) -> None:
        """
        Send the request (its slot, ticket and time are the client's to
        give); a call that waited for a slot tells its receiver first
        (L{ICallReceiver.started}): its L{expires} moved.
        """
        waited = self.queued
        self._started = self._reactor.seconds()
        timeout = self._request.timeout
        self.expires = self._started + timeout if timeout is not None else None
        if waited:
            self.queued = False
            self._receiver.started()
        self._send()

    def _send(self) -> None:
        """
        Send the request through the pool; its outcome comes to L{replied}
        or L{failed} (the call is the exchange's receiver: no Deferred
        between the connection and the call).
        """
        request = self._request
        try:
            exchange = request.profile.send(request.target, request.data, self.guard.charge, self)
        except Exception:
            self.failed(Failure())
            return
        self.exchange = exchange
        if not exchange.finished:
            # Told nothing yet (a failure to connect at once is told before
            # send returns, and may have sent the request again).
            self._pending = exchange

    def replied(self, reply: Reply) -> None:
        """The exchange's reply (L{amp.http.IReceiver}): what it means, or why amp cannot use it."""
        self._pending = None
        try:
            decision = _answer(reply)
        except Exception:
            self._ended(Failure())
        else:
            self._ended(decision)

    def failed(self, failure: Failure) -> None:
        """No reply (L{amp.http.IReceiver}): retried once when allowed, else the call fails."""
        self._pending = None
        if self._retry and not self._done and retriable(failure):
            self._retry = False
            if self._reactor.seconds() - self._started < self._request.allowed / 2:
                log.info(
                    "Retrying {endpoint} after {error}", endpoint=self._request.name, error=first_line(failure.value)
                )
                self._send()
                return
        self._ended(failure)

    def _ended(self, result: Any) -> None:
        if self._done:
            # Settled already (timer or caller); this is the aborted request.
            return None
        if not isinstance(result, Failure):
            # The endpoint answered (a success for the breaker); amp may
            # still refuse what it said, which its caller tells by settling.
            self._replied = True
            self.told = True
            self._receiver.replied(CallReply(result, self.settle))
            return None
        failure = classify(result, self._request.settings)
        if not result.check(*EXPECTED):
            log.failure("Unexpected error calling {endpoint}", result, endpoint=self._request.name)
        self._settle(failure.reason, Verdict.RELEASE if isinstance(failure, LocalFailure) else Verdict.FAILURE)
        self._tell_failure(Failure(failure))
        return None

    def _tell_failure(self, failure: Failure) -> None:
        if not self.told:
            self.told = True
            self._receiver.failed(failure)

    def settle(self, outcome: str) -> None:
        """
        The caller's verdict on the reply the call resolved to: L{OK} or the
        reason amp refused it.  Only the first settling counts.
        """
        if self._replied and not self._done:
            self._settle(outcome, Verdict.SUCCESS)

    def time_out(self) -> None:
        """
        The call's own timeout has passed (L{expires}), told by the caller
        that times it: a C{timeout}, counted against the breaker.  Nothing
        after the call has ended or replied.  Waiting for a slot, its latest
        start has passed: C{queue-timeout}.
        """
        if self.queued:
            self._queue_timed_out()
        else:
            self._timed_out()

    def _timed_out(self, own: bool = True) -> None:
        """
        No reply in the call's time: its own timeout (C{own}, a verdict on
        the endpoint) or the review's deadline (not one).
        """
        if self._done or self._replied:
            return
        self._settle(Reason.TIMEOUT, Verdict.FAILURE if own else Verdict.RELEASE)
        self._tell_failure(Failure(EndpointFailure(Reason.TIMEOUT, f"no reply within {self._request.allowed:.3g}s")))
        self._cancel_exchange()

    def cancel(self) -> None:
        """
        The caller gives up on the call: when the review's deadline has
        passed, it fails with C{timeout} (not a verdict on the endpoint);
        before, it ends as C{cancelled} and fails with C{CancelledError}.
        Nothing after it has ended or replied.
        """
        self._cancelled()
        if not self._replied:
            self._tell_failure(Failure(CancelledError()))

    def _cancelled(self) -> None:
        if self._done or self._replied:
            return
        if self.queued:
            # Out of the queue at once: the review's deadline left no room
            # for the call (queue-timeout), or the review was cancelled.
            if self._request.deadline.passed(self._reactor.seconds()):
                self._queue_timed_out()
            else:
                self._settle(Reason.CANCELLED, Verdict.RELEASE)
            return
        if self._request.deadline.passed(self._reactor.seconds()):
            # The review's deadline passed: the call had all its time.
            self._timed_out(own=False)
            return
        # The caller went away: not a verdict on the endpoint.
        self._settle(Reason.CANCELLED, Verdict.RELEASE)
        self._cancel_exchange()

    def _cancel_exchange(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.cancel()

    def _settle(self, outcome: str, verdict: Verdict) -> None:
        self._done = True
        guard = self.guard
        # The reply is parsed (or dropped): its bytes are no longer held.
        guard.charge.close()
        # The breaker hears the verdict before the slot is freed: a call
        # that waited for it asks a breaker that knows.
        ticket = guard.ticket
        if ticket is None:
            pass
        elif verdict is Verdict.SUCCESS:
            guard.breaker.record_success(ticket)
        elif verdict is Verdict.FAILURE:
            guard.breaker.record_failure(ticket)
        else:
            guard.breaker.release(ticket)
        self._on_settled(self, outcome, self._reactor.seconds() - self._started, verdict)
        waiters, self._waiters = self._waiters, None
        for d in waiters or ():
            d.callback(None)

    def settled(self) -> Deferred[None]:
        """
        A Deferred that fires when this call has ended.
        """
        if self._done:
            return succeed(None)
        d: Deferred[None] = Deferred()
        if self._waiters is None:
            self._waiters = []
        self._waiters.append(d)
        return d
