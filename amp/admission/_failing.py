"""
How one review (L{amp.admission._review.Review}) names a step that failed
other than as an endpoint call (the deadline passed, the namespace lookup
failed, the step was cancelled, amp's bug), and how it answers when its
deadline passes during the chain: off its hot path.
"""

from __future__ import annotations

from twisted.internet.defer import CancelledError
from twisted.logger import Logger
from twisted.python.failure import Failure

from amp.admission._answering import Answering
from amp.admission._chain import Chain
from amp.admission_review import AdmissionRequest
from amp.answers import Answer
from amp.namespaces import NamespaceLookupError
from amp.policy import FAIL, SHADOW
from amp.reasons import Reason

CANCELLED = "the review was cancelled: the client went away"


def failure_named(
    failure: Failure, timed_out: bool, budget: float, req: AdmissionRequest, log: Logger
) -> tuple[Reason, str]:
    """
    The reason and message of a step that failed, other than as an endpoint
    call, in a review not cancelled by its client: the deadline passed, the
    namespace lookup failed, the step was cancelled, or amp's bug (logged).
    """
    if timed_out:
        return Reason.DEADLINE, f"review deadline of {budget:.3g}s passed"
    if failure.check(NamespaceLookupError):
        return Reason.NAMESPACE_LOOKUP, failure.getErrorMessage() or f"namespace {req.namespace}: the lookup failed"
    if failure.check(CancelledError):
        return Reason.CANCELLED, CANCELLED
    log.failure("Internal error reviewing {uid}", failure, uid=req.uid)
    error = failure.getErrorMessage() or getattr(failure.type, "__name__", "unknown error")
    return Reason.INTERNAL_ERROR, f"amp internal error: {error}"


def deadline_passed(answering: Answering, chain: Chain, reason: Reason, message: str, budget: float) -> Answer:
    """
    The answer of a review whose deadline passed while the chain's current
    endpoint was called (C{reason}, C{message}): the failure policy's, or,
    under Ignore, the chain's with that step and the ones after it skipped.
    """
    r = chain.route
    origin = r.steps[chain.index].name
    if r.failure_policy == FAIL or r.mode == SHADOW:
        return answering.failed(r, chain, reason, message, origin)
    # Under Ignore: this step and the ones after it are skipped; the
    # steps that answered keep their patches.
    chain.skip(origin, reason, message)
    while not chain.done:
        chain.skip(
            r.steps[chain.index].name, Reason.DEADLINE, f"review deadline of {budget:.3g}s passed before the call"
        )
    return answering.chain_done(chain)
