"""
The admitter (L{Admitter}): reviews Pods for C{/mutate} and C{/validate}
under one configuration; the entry of every review.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from amp import answers
from amp.admission._answering import told
from amp.admission._parts import IRecorder, Parts
from amp.admission._review import Review
from amp.admission_review import AdmissionRequest
from amp.answers import Answer
from amp.config import Config
from amp.deadline import Deadline, review_deadline
from amp.endpoint import EndpointClient
from amp.http import DeferredReceiver
from amp.memo import Memo
from amp.metrics import Metrics
from amp.namespaces import INamespaceSource, NamespaceInfo
from amp.reasons import Reason
from amp.rules import opted_out, own_pods_warning, protected_namespaces
from amp.trace import NO_TRACE, IReviewTrace
from amp.tracing import ReviewSpans

#: Namespaces whose last configuration problem is remembered.
_PROBLEMS_KEPT = 4096


class Admitter:
    """
    Reviews Pods for C{/mutate} and C{/validate}.
    """

    log = Logger()

    def __init__(
        self,
        config: Config,
        namespaces: INamespaceSource,
        endpoints: EndpointClient,
        clock: IReactorTime,
        metrics: Metrics,
        recorder: Optional[IRecorder] = None,
        canary: Optional[Any] = None,
    ) -> None:
        """
        @param recorder: where reviews are offered for recording
            (L{amp.record.Recorder}), or None.
        @param canary: runs candidates of namespaces with a canary
            (L{amp.canary.Canary}), or None.
        """
        self.config = config
        self._metrics = metrics
        #: What every review under this configuration works with.
        self._parts = Parts(config, namespaces, endpoints, clock, metrics, self._note_problem, recorder, canary)
        #: The configuration problem last reported for each namespace.
        self._problems: Memo[str, tuple[str, str]] = Memo(_PROBLEMS_KEPT)
        self._protected = protected_namespaces(config.kubernetes)
        #: Protected namespaces amp has said it leaves alone (said once each).
        self._protected_told: set[str] = set()

    def deadline(self, timeout: Optional[str], started: float) -> Deadline:
        """
        The one deadline of a review that arrived at C{started} asking for
        C{?timeout=timeout} (None: the request has none): the timeout, or
        C{deadline.default_timeout}, less C{deadline.margin}.
        """
        return review_deadline(timeout, started, self.config.deadline)

    def review(
        self,
        req: AdmissionRequest,
        deadline: Deadline,
        *,
        validation: bool = False,
        trace: Optional[IReviewTrace] = None,
        spans: Optional[ReviewSpans] = None,
    ) -> "Deferred[Answer]":
        """
        Answer C{req} before C{deadline}.  Resolves to an L{Answer}; never
        fails.  Cancelling the result (the client went away) answers at
        once, as C{cancelled}.  C{trace}, if given, is told each decision.
        """
        receiver: DeferredReceiver[Answer] = DeferredReceiver()
        receiver.cancels = self.review_into(
            receiver.replied, req, deadline, validation=validation, trace=trace, spans=spans
        )
        return receiver.result

    def review_into(
        self,
        answered: Callable[[Answer], None],
        req: AdmissionRequest,
        deadline: Deadline,
        *,
        validation: bool = False,
        trace: Optional[IReviewTrace] = None,
        spans: Optional[ReviewSpans] = None,
    ) -> Optional[Review]:
        """
        L{review}, its answer given to C{answered} (once, possibly before
        this returns): the webhook's way, without a Deferred.  Returns the
        L{Review} while it waits (its C{cancel} ends it at once, as
        C{cancelled}), None once answered.  C{answered} must not raise.
        C{spans}: the review's spans when it is traced (L{amp.tracing}).
        """
        if trace is None:
            trace = NO_TRACE
        if not (req.is_pod_create or (self.config.ephemeral_containers and req.is_ephemeral_update)):
            answered(told(trace, answers.skipped(req)))
            return None
        alone = self._left_alone(req)
        if alone is not None:
            answered(told(trace, answers.skipped(req, reason=alone)))
            return None
        review = Review(self._parts, req, deadline, validation, trace, answered, spans)
        review.start()
        return None if review.done else review

    def _left_alone(self, req: AdmissionRequest) -> Optional[Reason]:
        """
        Why amp does not act on C{req} at all, before any lookup or call:
        its namespace is protected (said once per namespace), or the Pod
        opted out.  None when amp acts.
        """
        name = req.namespace
        if name in self._protected:
            if name not in self._protected_told:
                self._protected_told.add(name)
                self.log.warn(
                    "Asked to review a Pod in {namespace}, amp's own or a protected namespace: amp leaves Pods "
                    "there unchanged (kubernetes.protected_namespaces, allow_protected_namespaces); the "
                    "webhook configuration's namespaceSelector should exclude it",
                    namespace=name,
                )
            return Reason.PROTECTED_NAMESPACE
        if opted_out(req.object, self.config.kubernetes):
            return Reason.OPTED_OUT
        return None

    def own_pods_warning(self) -> Optional[str]:
        """
        Warn (and return the warning) when amp's own namespace, as the
        namespace source knows it now, is enabled: amp's own Pods would be
        sent to it.  Called at start-up, once the source has its namespaces.
        """
        own = self.config.kubernetes.own_namespace
        if not own:
            return None
        ns = self._parts.namespaces.cached(own)
        warning = own_pods_warning(ns if isinstance(ns, NamespaceInfo) else None, self.config.kubernetes)
        if warning is not None:
            self.log.warn("{warning}", warning=warning)
        return warning

    def _note_problem(self, namespace: str, problem: Optional[tuple[str, str]]) -> None:
        """
        Report a namespace's unusable configuration, C{(problem, message)}
        (L{amp.policy.failure_policy_problem}), at warning and count it
        under C{problem}, once per change: again only when the problem
        differs from the last one reported for that namespace, or came back
        after it was fixed.
        """
        problems = self._problems
        if problem is None:
            if problems:
                problems.pop(namespace, None)
            return
        if problems.get(namespace) == problem:
            return
        problems[namespace] = problem
        kind, message = problem
        self.log.warn("Namespace {namespace}: {problem}", namespace=namespace, problem=message, kind=kind)
        self._metrics.namespace_problems.labels(kind).inc()
