"""
One endpoint step, run the one way a review and the canary both run it
(L{CallStep}): the call made (L{amp.endpoint.EndpointClient.call}),
waited on through its owner's L{amp.waiting.Waiting}, the reply judged
(L{judge}: its patch checked and dry-applied to the Pod as the steps before
left it, with L{amp.patch.check_patch}'s options and confinement), and the
call settled with the verdict (C{ok}, or the reason amp refused the
reply); the owner is told the decision and the verdict, or the failure
(L{IStepOwner}).

A review (L{amp.admission}) goes on with its chain from there; the canary
(L{amp.canary}) compares the candidate's Pod with the live one.  Neither
imports the other for it: this module imports neither.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Union
from typing import Protocol as TypingProtocol

from twisted.logger import Logger
from twisted.python.failure import Failure

from amp.endpoint import OK, Call, CallReply, EndpointClient, EndpointRequest
from amp.patch import CheckedPatch, PatchError, check_patch
from amp.reply import EndpointDecision
from amp.trace import NO_TRACE, IReviewTrace
from amp.waiting import Waiting

#: amp's verdict on a reply's patch: the checked patch, the L{PatchError}
#: when amp refuses it, or None when there is nothing to check (a deny, no
#: patch, a validation).
Judged = Optional[Union[CheckedPatch, PatchError]]

_log = Logger()


def judge(
    pod: dict[str, Any],
    decision: EndpointDecision,
    options: Mapping[str, Any],
    confined: Optional[str] = None,
    trace: IReviewTrace = NO_TRACE,
) -> Judged:
    """
    C{decision}'s patch checked and dry-applied to C{pod} (never changed)
    with L{amp.patch.check_patch}'s C{options}, every operation under
    C{confined} when it is not None; the L{PatchError} when amp refuses it;
    None when there is nothing to check (a deny, no patch).
    """
    if not decision.allowed or not decision.patch:
        return None
    try:
        return check_patch(pod, decision.patch, **options, trace=trace, confined=confined)
    except PatchError as e:
        return e


class IStepOwner(TypingProtocol):
    """Who runs a L{CallStep}, told how it ended."""

    def step_replied(self, call: Optional[Call], decision: EndpointDecision) -> bool:
        """
        The endpoint answered with C{decision}, not judged yet; False when
        the owner no longer wants it (it is then settled C{ok}, unjudged).
        """

    def step_judged(self, decision: EndpointDecision, judged: Judged) -> None:
        """The reply judged (L{Judged}) and its call settled with the verdict."""

    def step_failed(self, call: Optional[Call], failure: Failure) -> None:
        """
        No usable reply: an L{amp.endpoint.EndpointFailure} (a timeout when the
        deadline cut the call off), a C{CancelledError} when the owner gave up
        before it, or amp's own bug while judging (the call settled C{ok}).
        """


class CallStep:
    """
    Endpoint calls of one owner, one at a time: each made, waited on
    through the owner's L{Waiting}, its reply judged, its call settled, the
    owner told (L{IStepOwner}).  The step is the call's L{amp.endpoint.ICallReceiver}.

    @param options: L{amp.patch.check_patch}'s options (the config's).
    @param judges: whether replies' patches are checked (not for a
        validation review: its endpoints answer without one).
    @param confined: the JSON pointer every operation must be under, or None.
    @param trace: told each operation that applies and each repair.
    @ivar call: the call waited on, or None.
    """

    __slots__ = ("_owner", "_waiting", "_client", "_options", "_judges", "_confined", "_trace", "_pod", "call")

    def __init__(
        self,
        owner: IStepOwner,
        waiting: Waiting,
        client: EndpointClient,
        options: Mapping[str, Any],
        *,
        judges: bool = True,
        confined: Optional[str] = None,
        trace: IReviewTrace = NO_TRACE,
    ) -> None:
        self._owner = owner
        self._waiting = waiting
        self._client = client
        self._options = options
        self._judges = judges
        self._confined = confined
        self._trace = trace
        self._pod: dict[str, Any] = {}
        self.call: Optional[Call] = None

    def start(self, request: EndpointRequest, pod: dict[str, Any]) -> bool:
        """
        Call the endpoint with C{request}, its reply to be judged against
        C{pod}; whether the call is now waited on (False: it has ended
        already, and the owner has been told).
        """
        self._pod = pod
        call = self._client.call(request, self)
        if call is None or call.told:
            # Refused at once, or ended before the client returned (the owner
            # was told, and may have gone on to another call since).
            return False
        self.call = call
        self._waiting.wait(call)
        return True

    # ------------------------------------------------------------ ICallReceiver

    def replied(self, reply: CallReply) -> None:
        """The call answered: judge the reply, settle the call with the verdict, tell the owner."""
        call = self.call
        if call is not None:
            self.call = None
            self._waiting.done(call)
        owner = self._owner
        decision = reply.decision
        judged: Judged = None
        wanted = False
        try:
            wanted = owner.step_replied(call, decision)
            if wanted and self._judges:
                judged = judge(self._pod, decision, self._options, self._confined, self._trace)
        except Exception:
            # amp's bug: the endpoint answered; the owner is told the failure.
            broke = Failure()
            _settle(reply, OK)
            owner.step_failed(call, broke)
            return
        try:
            reply.settle(judged.reason if isinstance(judged, PatchError) else OK)
        except Exception:
            # amp's bug while settling (the breaker, the metrics, starting a
            # queued call): the review is still answered now, not at its
            # deadline, as the failure it is.
            if wanted:
                owner.step_failed(call, Failure())
            return
        if wanted:
            owner.step_judged(decision, judged)

    def failed(self, failure: Failure) -> None:
        """The call failed, timed out, or was cancelled."""
        call = self.call
        if call is not None:
            self.call = None
            self._waiting.done(call)
        self._owner.step_failed(call, failure)

    def started(self) -> None:
        """The call, which waited for a slot, goes out: the owner's one timer moves to its new expiry."""
        if self.call is not None:
            self._waiting.arm()


def _settle(reply: CallReply, outcome: str) -> None:
    """Settle C{reply} on a path that is already amp's failure: a second failure is logged, not raised."""
    try:
        reply.settle(outcome)
    except Exception:
        _log.failure("amp internal error settling an endpoint call")
