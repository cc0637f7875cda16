"""
The states of one review in progress (L{amp.admission._review.Review}) and
every transition between them, in one place (pure).

A review works without waiting (routing, judging a reply, answering) until
a step makes it wait: the namespace lookup, or an endpoint call.  The step
it waits on ends (the review works on) or is cut off: the deadline passed,
or the client went away; the step in progress is then cancelled and the
review answered.  Once answered, nothing changes it: a step that ends late
is dropped (a reply settled as it is).

What the review waits on is its L{amp.waiting.Waiting}'s step (the
namespace lookup, an endpoint L{amp.endpoint.Call}), set exactly while the
state says so (LOOKING_UP, CALLING).
A transition not in L{REVIEW_NEXT} is amp's bug: L{check_review} raises
L{IllegalReviewTransition}, which the review logs as a failure, still
answering.
"""

from __future__ import annotations

from enum import Enum


class ReviewState(Enum):
    """Where a review is."""

    #: Working, waiting on nothing: started, routing, judging a reply, going on.
    WORKING = "working"
    #: Waiting on the namespace lookup (the cache did not know the namespace).
    LOOKING_UP = "looking up"
    #: Waiting on an endpoint call of the chain.
    CALLING = "calling"
    #: The deadline passed: the step in progress is cancelled, the answer follows.
    TIMED_OUT = "timed out"
    #: The client went away: the step in progress is cancelled, the answer follows.
    CANCELLED = "cancelled"
    #: Answered: the end.
    ANSWERED = "answered"


#: The states each may go to.
REVIEW_NEXT: dict[ReviewState, frozenset[ReviewState]] = {
    ReviewState.WORKING: frozenset(
        {
            ReviewState.LOOKING_UP,
            ReviewState.CALLING,
            ReviewState.TIMED_OUT,
            ReviewState.CANCELLED,
            ReviewState.ANSWERED,
        }
    ),
    ReviewState.LOOKING_UP: frozenset({ReviewState.WORKING, ReviewState.TIMED_OUT, ReviewState.CANCELLED}),
    ReviewState.CALLING: frozenset({ReviewState.WORKING, ReviewState.TIMED_OUT, ReviewState.CANCELLED}),
    ReviewState.TIMED_OUT: frozenset({ReviewState.ANSWERED}),
    ReviewState.CANCELLED: frozenset({ReviewState.ANSWERED}),
    ReviewState.ANSWERED: frozenset(),
}

#: The states in which the review is being ended early.
ENDING = frozenset({ReviewState.TIMED_OUT, ReviewState.CANCELLED})


class IllegalReviewTransition(RuntimeError):
    """A review was asked to go from one state to one L{REVIEW_NEXT} does not allow."""

    def __init__(self, old: ReviewState, new: ReviewState) -> None:
        super().__init__(f"review: {old.name} -> {new.name} is not a transition of amp's")
        self.old = old
        self.new = new


def check_review(old: ReviewState, new: ReviewState) -> ReviewState:
    """C{new}, if C{old} may go to it; else raise L{IllegalReviewTransition}."""
    if new not in REVIEW_NEXT[old]:
        raise IllegalReviewTransition(old, new)
    return new
