"""
One endpoint call, from the request to a settled outcome: L{Call}.

A call is settled exactly once, by the first of: the reply (parsed, or a
named failure), the endpoint's own timer, or the caller cancelling it.
Settling records the outcome metric and the duration, frees the call's
bulkhead slot and hands its breaker ticket back:

  - C{record_success}: the endpoint answered with a usable reply;
  - C{record_failure}: the endpoint failed (L{classify} names how), its own
    timeout included;
  - C{release}: nothing was learned about the endpoint: the caller cancelled
    (outcome C{cancelled}), or amp gave up on its side (a L{LocalFailure}).

Whatever the request does after that is ignored.

One timer
=========

The call runs its own timer only when the endpoint's C{timeout} is shorter
than the time left before the review's deadline: then the endpoint's
timeout is the verdict, C{timeout}, and it counts against the breaker.
Otherwise the deadline's timer is the one timer, and it is the caller's
(L{amp.admission}, which owns the review's L{amp.deadline.Deadline}): the
caller cancels the call's Deferred when the deadline passes.  The call then
fails with C{timeout} (it had all the time there was) and hands its ticket
back: the review's deadline is not a verdict on the endpoint.  Cancelled
before the deadline (the API server hung up), the call ends as
C{cancelled}, also without a verdict.

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

from typing import TYPE_CHECKING, Any, Callable, Optional

from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.interfaces import IDelayedCall
from twisted.logger import Logger
from twisted.python.failure import Failure

from amp.breaker import CircuitBreaker, Ticket
from amp.config import EndpointSettings
from amp.deadline import Deadline
from amp.endpoint._failures import EXPECTED, EndpointFailure, LocalFailure, classify, first_line, retriable
from amp.endpoint._pool import Profile, Target
from amp.http import Charge, Reply
from amp.reasons import Reason
from amp.reply import EndpointDecision, ReplyError, parse_reply

if TYPE_CHECKING:
    from amp.endpoint._client import EndpointClient, Origin

log = Logger()


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
    One call: its timer (if it has one), its ticket, its place in the
    bulkhead.

    @param profile: the settings profile whose pools the call goes through.
    @param data: the whole request.
    @param timeout: the endpoint's own timeout when it is shorter than the
        caller's time left, else None (the caller's deadline rules).
    @param deadline: the review's deadline, which the caller enforces.
    @param allowed: the call's time: C{min(settings.timeout, remaining)}.
    @param check: given a usable reply, the reason amp refuses it, or None
        (see L{EndpointClient.call}).
    @param charge: what the call holds of the client's reply budget.
    """

    __slots__ = (
        "_client", "_origin", "_target", "_profile", "_settings", "_data", "_timeout",
        "_deadline", "_allowed", "_charge", "_breaker", "_ticket", "_started", "_timer", "_pending", "_retry",
        "_done", "_waiters", "_check", "result",
    )

    def __init__(
        self, client: "EndpointClient", origin: "Origin", target: Target, profile: Profile,
        settings: EndpointSettings, data: bytes, timeout: Optional[float], deadline: Deadline,
        allowed: float, charge: Charge, breaker: CircuitBreaker, ticket: Ticket,
        check: Optional[Callable[[EndpointDecision], Optional[str]]] = None,
    ) -> None:
        self._client = client
        self._origin = origin
        self._target = target
        self._profile = profile
        self._settings = settings
        self._data = data
        self._timeout = timeout
        self._deadline = deadline
        self._allowed = allowed
        self._charge = charge
        self._breaker = breaker
        self._ticket = ticket
        self._check = check
        self._retry = settings.retry
        self._done = False
        self._waiters: Optional[list[Deferred]] = None
        self._pending: Optional[Deferred] = None
        self._timer: Optional[IDelayedCall] = None
        self.result: Deferred = Deferred(self._cancelled)

    def start(self) -> Deferred:
        reactor = self._client.reactor
        self._started = reactor.seconds()
        if self._timeout is not None:
            self._timer = reactor.callLater(self._timeout, self._timed_out)
        d = self._send()
        d.addCallbacks(_answer, self._not_answered)
        self._pending = d
        d.addBoth(self._ended)
        return self.result

    def _send(self) -> Deferred:
        try:
            return self._profile.request(self._target, self._data, self._charge)
        except Exception:
            return fail()

    def _not_answered(self, failure: Failure) -> Any:
        if self._retry and not self._done and retriable(failure):
            self._retry = False
            if self._client.reactor.seconds() - self._started < self._allowed / 2:
                log.info("Retrying {endpoint} after {error}", endpoint=self._origin.name,
                         error=first_line(failure.value))
                return self._send().addCallback(_answer)
        return failure

    def _ended(self, result: Any) -> None:
        if self._done:
            # Settled already (timer or caller); this is the aborted request.
            return None
        if not isinstance(result, Failure):
            # The endpoint answered (a success for the breaker); amp may
            # still refuse what it said, and then the call is not "ok".
            outcome = "ok"
            if self._check is not None:
                try:
                    outcome = self._check(result) or "ok"
                except Exception:
                    log.failure("Could not check the reply of {endpoint}", endpoint=self._origin.name)
            self._settle(outcome, "success")
            self.result.callback(result)
            return None
        failure = classify(result, self._settings)
        if not result.check(*EXPECTED):
            log.failure("Unexpected error calling {endpoint}", result, endpoint=self._origin.name)
        self._settle(failure.reason, "release" if isinstance(failure, LocalFailure) else "failure")
        self.result.errback(Failure(failure))
        return None

    def _timed_out(self, own: bool = True) -> None:
        """
        No reply in the call's time: its own timeout (C{own}, a verdict on
        the endpoint) or the review's deadline (not one).
        """
        self._timer = None
        if self._done:
            return
        self._settle(Reason.TIMEOUT, "failure" if own else "release")
        self.result.errback(Failure(EndpointFailure(Reason.TIMEOUT, f"no reply within {self._allowed:.3g}s")))
        if self._pending is not None:
            self._pending.cancel()

    def _cancelled(self, result: Deferred) -> None:
        if self._done:
            return
        if self._deadline.passed(self._client.reactor.seconds()):
            # The review's deadline passed: the call had all its time.
            self._timed_out(own=False)
            return
        # The caller went away: not a verdict on the endpoint.
        # Deferred.cancel then fails the result with CancelledError.
        self._settle(Reason.CANCELLED, "release")
        if self._pending is not None:
            self._pending.cancel()

    def _settle(self, outcome: str, verdict: str) -> None:
        self._done = True
        # The reply is parsed (or dropped): its bytes are no longer held.
        self._charge.close()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._client._settled(self, self._origin, outcome, self._client.reactor.seconds() - self._started)
        if verdict == "success":
            self._breaker.record_success(self._ticket)
        elif verdict == "failure":
            self._breaker.record_failure(self._ticket)
        else:
            self._breaker.release(self._ticket)
        waiters, self._waiters = self._waiters, None
        for d in waiters or ():
            d.callback(None)

    def settled(self) -> Deferred:
        """
        A Deferred that fires when this call has ended.
        """
        if self._done:
            return succeed(None)
        d: Deferred = Deferred()
        if self._waiters is None:
            self._waiters = []
        self._waiters.append(d)
        return d
