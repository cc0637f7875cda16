"""
One review, end to end, one way: namespace -> route -> endpoint -> patch
checks -> answer.

L{Admitter.review} always resolves (never fails) to an L{Answer}, the bytes
of a well-formed AdmissionReview answer and its L{Outcome}, before the
review's L{amp.deadline.Deadline}, which the listener asks the admitter for
(L{Admitter.deadline}) and hands over.  The listener writes the answer as
it is; an answer the client went away before getting is L{unheard}.

The package follows C{amp.endpoint}: the public names are here, the
machinery in private modules beside it, one concern each, each calling
only the ones after it:

  - L{amp.admission._admitter}: L{Admitter}: one configuration's reviews:
    the Pods amp leaves alone (L{amp.rules}), a namespace's unusable
    configuration reported once, the review's deadline.
  - L{amp.admission._review}: one review's steps, its one timer and
    cancellation (L{amp.admission._review.Review}): the namespace lookup
    when the cache does not know the namespace, the route
    (L{amp.policy.route}), then each endpoint of the chain in order with
    the Pod as the steps before it left it; an endpoint call resolves to
    the reply and a settle handle (L{amp.endpoint.CallReply}): the review
    judges the reply's patch (L{amp.patch.check_patch}) and settles the
    call with the verdict, so a reply amp refuses is counted under its
    reason, not as C{ok}.
  - L{amp.admission._observing} and L{amp.admission._failing}: what a
    review tells its trace, spans, recorder and canary, and how it names
    a failed step: off its hot path.
  - L{amp.admission._chain}: the chain's state, its patches composed into
    one (L{amp.patch.compose}) and amp's status stamp on the Pod.
  - L{amp.admission._answering}: how a review ends: the answer of a chain,
    shadow mode, and the failure policy, the one place every failure ends,
    with the route the review was on, logged at warning with its whole
    message; every answer built by a named constructor of L{amp.answers}.
  - L{amp.admission._parts}: what every review of one configuration
    shares, handed to each (the review reads no private state of the
    admitter).

Pods that opt out, and Pods in amp's own or a protected namespace, are
answered unchanged before any lookup.  With C{ephemeral_containers}, a
C{pods/ephemeralcontainers} update is reviewed like a creation, but may
change only C{/spec/ephemeralContainers}.  A namespace whose failure-policy
annotation amp cannot use is reported once per change.

The status stamp: every Pod reviewed on C{/mutate} in an enabled namespace
(not in shadow mode, unless C{annotate_status} is off) gets the annotation
L{STATUS_ANNOTATION} (L{amp.stamp}), in the same checked, dry-applied patch
as the endpoint's change, and loses the L{LEGACY_SKIPPED_ANNOTATION} of
earlier versions.  Each review tells L{amp.stamp.next_stamp} the outcome of
each endpoint it called (L{amp.admission._chain.Chain.outcomes}), merged
with the stamp the Pod came with, so after the API server reinvokes amp the
stamp tells what all rounds did; a value the endpoint's patch sets never
survives.  A round that changes nothing, the stamp included, answers with
no patch at all.

Each decision is told to the review's trace (L{amp.trace}) as it is
taken: C{amp explain} gives a L{amp.trace.RecordedTrace}; the daemon's is
L{amp.trace.NO_TRACE}, which keeps nothing.
"""

from amp.admission._admitter import Admitter
from amp.answers import AUDIT_ERROR_KEY, Answer, Outcome, unheard
from amp.rules import LEGACY_SKIPPED_ANNOTATION, STATUS_ANNOTATION

__all__ = [
    "AUDIT_ERROR_KEY",
    "LEGACY_SKIPPED_ANNOTATION",
    "STATUS_ANNOTATION",
    "Admitter",
    "Answer",
    "Outcome",
    "unheard",
]
