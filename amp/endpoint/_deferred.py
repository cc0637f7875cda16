"""
L{deferred_call}: an endpoint call as a Deferred of its decision, for
callers that are not a review (tests, benchmarks), waited on the one way a
review waits (L{amp.waiting.Waiting}).
"""

from __future__ import annotations

from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

from amp.endpoint._call import OK, CallReply
from amp.endpoint._client import EndpointClient
from amp.endpoint._request import EndpointRequest
from amp.reply import EndpointDecision
from amp.waiting import Waiting


class _DeferredCall:
    """The call's receiver and owner of its L{Waiting}: told its end, fires the Deferred."""

    __slots__ = ("result", "_waiting")

    def __init__(self, client: EndpointClient, request: EndpointRequest) -> None:
        self.result: Deferred[EndpointDecision] = Deferred(self._cancelled)
        waiting = self._waiting = Waiting(client.reactor, request.deadline, self._passed)
        call = client.call(request, self)
        if call is not None and not call.told:
            waiting.wait(call)

    def replied(self, reply: CallReply) -> None:
        self._waiting.close()
        reply.settle(OK)
        self.result.callback(reply.decision)

    def failed(self, failure: Failure) -> None:
        self._waiting.close()
        self.result.errback(failure)

    def started(self) -> None:
        self._waiting.arm()

    def _passed(self) -> None:
        # The deadline: the call ends as a timeout (no verdict on the endpoint).
        self._waiting.cancel()

    def _cancelled(self, result: Deferred[EndpointDecision]) -> None:
        # The caller gave up before the deadline: the call ends as cancelled.
        self._waiting.cancel()


def deferred_call(client: EndpointClient, request: EndpointRequest) -> Deferred[EndpointDecision]:
    """
    Call the endpoint (L{EndpointClient.call}) and resolve to its decision,
    the call counted C{ok}; or fail with the L{amp.endpoint.EndpointFailure}
    (a C{CancelledError} when the Deferred is cancelled before the deadline).
    The call's own timeout and C{request.deadline} are timed by one timer,
    as in a review; cancelling the Deferred is the call's L{Call.cancel}.
    """
    return _DeferredCall(client, request).result
