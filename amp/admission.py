"""
One review, end to end: namespace -> route -> endpoint -> patch checks ->
answer.

L{Admitter.review} always resolves (never fails) to an L{Answer}, the bytes
of a well-formed AdmissionReview answer and its L{Outcome}, before the
review's L{Deadline}.  Each review waits on one step at a time (the
namespace lookup when the cache does not know the namespace, then the
endpoint call), gives each step what is left of the deadline, and owns the
one timer that enforces it: when the deadline passes, or the client goes
away (the review's Deferred is cancelled), the step in progress is
cancelled and the review is answered at once.

Every answer is built by a named constructor of L{amp.answers}; every
failure ends in L{_Review._failed}, the one place the failure policy is
applied, with the L{Route} the review was on, and logged there at warning
with its whole message.  The endpoint's reply is judged (patch checks,
dry-apply, size) before the endpoint client counts the call, so a reply amp
refuses is counted under its reason, not as C{ok}.  A namespace whose
failure-policy annotation amp cannot use is reported once per change.

The status stamp: every Pod reviewed on C{/mutate} in an enabled namespace
(not in shadow mode, unless C{annotate_status} is off) gets the annotation
L{STATUS_ANNOTATION}, C{<status> [<reason>] <endpoint>} (L{Status}), in the
same checked, dry-applied patch as the endpoint's change, and loses the
L{LEGACY_SKIPPED_ANNOTATION} of earlier versions.  Every review overwrites
it, so after the API server reinvokes amp it tells what the last round did;
no value set by the Pod's author or the endpoint survives.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from twisted.internet.defer import CancelledError, Deferred, succeed
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from amp import answers
from amp.answers import AUDIT_ERROR_KEY, Answer, Outcome
from amp.config import Config
from amp.deadline import Deadline
from amp.endpoints import EndpointClient, EndpointFailure
from amp.metrics import Metrics
from amp.namespaces import UNKNOWN, INamespaceSource, NamespaceInfo, NamespaceLookupError
from amp.patch import CheckedPatch, PatchError, annotate, check_patch, unchanged
from amp.policy import FAIL, SHADOW, Route, failure_policy, route
from amp.reasons import Reason, Status
from amp.reply import EndpointDecision
from amp.review import AdmissionRequest, clean_audit_annotations, clip, dumps

__all__ = ["AUDIT_ERROR_KEY", "LEGACY_SKIPPED_ANNOTATION", "STATUS_ANNOTATION", "Admitter", "Answer", "Outcome"]

#: What amp did with the Pod in its last review (see the module docstring).
STATUS_ANNOTATION = "amp.txn2.com/status"
#: Earlier versions' mark of a Pod admitted after a failure; amp removes it.
LEGACY_SKIPPED_ANNOTATION = "amp.txn2.com/skipped"
#: The longest status annotation value.
STATUS_LIMIT = 250

_CANCELLED = "the review was cancelled: the client went away"

#: Namespaces whose last configuration problem is remembered.
_PROBLEMS_LIMIT = 4096
#: C{amp_namespace_problems_total{problem}} of an unusable failure-policy
#: annotation.
FAILURE_POLICY_PROBLEM = "failure-policy"


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
    ) -> None:
        self.config = config
        self._namespaces = namespaces
        self._endpoints = endpoints
        self._clock = clock
        self._metrics = metrics
        self._routes: dict[str, tuple] = {}
        #: The configuration problem last reported for each namespace.
        self._problems: dict[str, str] = {}
        patch = config.patch
        self._patch_options = dict(
            denied=patch.denied_paths, allowed=patch.allowed_paths, repair=patch.repair,
            max_operations=patch.max_operations)

    def review(self, req: AdmissionRequest, deadline: Deadline, *, validation: bool = False) -> "Deferred[Answer]":
        """
        Answer C{req} before C{deadline}.  Resolves to an L{Answer}; never
        fails.  Cancelling the result (the client went away) answers at
        once, as C{cancelled}.
        """
        if not req.is_pod_create:
            return succeed(answers.skipped(req))
        return _Review(self, req, deadline, validation).start()

    def _note_problem(self, namespace: str, problem: Optional[str]) -> None:
        """
        Report a namespace's unusable configuration at warning and count
        it, once per change: again only when the problem differs from the
        last one reported for that namespace, or came back after it was
        fixed.
        """
        problems = self._problems
        if problem is None:
            if problems:
                problems.pop(namespace, None)
            return
        if problems.get(namespace) == problem:
            return
        if len(problems) >= _PROBLEMS_LIMIT:
            problems.clear()
        problems[namespace] = problem
        self.log.warn("Namespace {namespace}: {problem}", namespace=namespace, problem=problem)
        self._metrics.namespace_problems.labels(FAILURE_POLICY_PROBLEM).inc()

    def _has_validation_endpoint(self, ns: Optional[NamespaceInfo]) -> bool:
        return ns is not None and bool(ns.annotations.get(self.config.kubernetes.validation_annotation))


class _Review:
    """
    One review in progress: the step it waits on, the deadline's timer, the
    route once known.
    """

    __slots__ = ("_admitter", "_req", "_deadline", "_validation", "_route", "_pending", "_timer", "_ending",
                 "_done", "_verdict", "result")

    log = Logger()

    def __init__(self, admitter: Admitter, req: AdmissionRequest, deadline: Deadline, validation: bool) -> None:
        self._admitter = admitter
        self._req = req
        self._deadline = deadline
        self._validation = validation
        self._route: Optional[Route] = None
        #: The step waited on: a namespace lookup or an endpoint call.
        self._pending: Optional[Deferred] = None
        self._timer: Optional[IDelayedCall] = None
        #: Why the review is being ended early: DEADLINE or CANCELLED.
        self._ending: Optional[Reason] = None
        self._done = False
        #: What amp made of the endpoint's reply (see _judge).
        self._verdict: Optional[_Verdict] = None
        self.result: Deferred[Answer] = Deferred(self._cancel)

    # ------------------------------------------------------------ steps

    def start(self) -> "Deferred[Answer]":
        a = self._admitter
        namespaces = a._namespaces
        name = self._req.namespace
        try:
            ns = namespaces.cached(name)
            if ns is UNKNOWN:
                self._wait(namespaces.fetch(name, self._deadline.remaining(a._clock.seconds())), self._routed)
            else:
                self._routed(ns)
        except Exception:
            # A bug, a broken source or client: still an answer.
            self._step_failed(Failure())
        return self.result

    def _wait(self, d: Deferred, then: Callable[[Any], None]) -> None:
        """
        Wait for C{d}, then pass its result to C{then}; arm the deadline's
        timer if it is not armed yet and C{d} has not fired already.
        """
        self._pending = d
        d.addBoth(self._resume, d, then)
        if self._pending is d and self._timer is None:
            clock = self._admitter._clock
            self._timer = clock.callLater(self._deadline.remaining(clock.seconds()), self._expired)

    def _resume(self, result: Any, d: Deferred, then: Callable[[Any], None]) -> None:
        if self._pending is not d:
            # The review was answered without this step; its result is dropped.
            return None
        self._pending = None
        try:
            if isinstance(result, Failure):
                self._step_failed(result)
            else:
                then(result)
        except Exception:
            self._step_failed(Failure())
        return None

    def _routed(self, ns: Optional[NamespaceInfo]) -> None:
        a = self._admitter
        req = self._req
        r = self._route = route(ns, a.config, a._namespaces.cluster_failure_policy(),
                                validation=self._validation, cache=a._routes)
        if r.enabled:
            a._note_problem(req.namespace, r.policy_problem)
        if not r.enabled:
            return self._answer(answers.skipped(req))
        if r.error is not None:
            return self._answer(self._failed(*r.error))
        if r.url is None:
            if self._validation:
                return self._answer(answers.skipped(req))
            if a._has_validation_endpoint(ns):
                # Nothing to mutate, but the Pod was reviewed: stamped, so
                # it is not taken for one that bypassed amp.
                stamped = self._stamp(None, Status.UNCHANGED, r.where)
                return self._answer(answers.skipped(req, patch=_patch_bytes(stamped)))
            return self._answer(self._failed(Reason.NO_ENDPOINT, "namespace is enabled but has no endpoint annotation"))
        assert r.settings is not None
        headers = {
            b"x-amp-namespace": req.namespace.encode("utf-8"),
            b"x-amp-operation": req.operation.encode("ascii", "replace"),
            b"x-amp-uid": req.uid.encode("ascii", "replace"),
            b"x-amp-dry-run": b"true" if req.dry_run else b"false",
        }
        pod_json = req.object_json if req.object_json is not None else dumps(req.object)
        self._wait(a._endpoints.call(r.url, r.settings, pod_json, headers, self._deadline, r.breaker,
                                     check=self._check_reply),
                   self._decided)

    def _check_reply(self, decision: EndpointDecision) -> Optional[str]:
        """
        The endpoint client's check of a usable reply, before it counts the
        call: the reason amp refuses the reply, or None.  The verdict is
        kept for L{_decided}.
        """
        verdict = self._verdict = self._judge(decision)
        return verdict.refusal[0] if verdict.refusal is not None else None

    def _judge(self, decision: EndpointDecision) -> "_Verdict":
        """
        What amp makes of the endpoint's reply: the checked patch and the
        patch to send (with the status stamp), or why amp refuses it.
        """
        a = self._admitter
        req = self._req
        r = self._route
        assert r is not None and r.url is not None
        if not decision.allowed or self._validation:
            return _Verdict()
        try:
            checked = (check_patch(req.object, decision.patch, **a._patch_options) if decision.patch
                       else unchanged(req.object))
        except PatchError as e:
            return _Verdict(refusal=(e.reason, str(e)))
        if r.mode == SHADOW:
            return _Verdict(checked)
        if not checked.operations:
            return _Verdict(checked, _patch_bytes(self._stamp(checked, Status.UNCHANGED, r.url.origin)))
        patch = dumps(self._stamp(checked, Status.MUTATED, r.url.origin).operations)
        if len(patch) > a.config.patch.max_size:
            return _Verdict(checked, refusal=(Reason.PATCH_TOO_LARGE,
                                              f"patch of {len(patch)} bytes is over patch.max_size"))
        return _Verdict(checked, patch)

    def _decided(self, decision: EndpointDecision) -> None:
        a = self._admitter
        req = self._req
        r = self._route
        assert r is not None and r.url is not None
        origin = r.url.origin
        # Judged already, unless the client did not run the check.
        verdict = self._verdict if self._verdict is not None else self._judge(decision)
        if r.mode == SHADOW:
            return self._answer(self._shadow(decision, origin, verdict))
        audit, problems = clean_audit_annotations(decision.audit)
        warnings = [f"amp: {w}" for w in decision.warnings] + [f"amp: {p}" for p in problems]
        if not decision.allowed:
            return self._answer(answers.denied(req, origin, decision.code, decision.message, warnings=warnings,
                                               audit=audit))
        if verdict.refusal is not None:
            return self._answer(self._failed(*verdict.refusal))
        checked = verdict.checked
        if checked is None or not checked.operations:
            # A validation, or no change (the patch is the stamp alone).
            return self._answer(answers.allowed(req, origin, warnings=warnings, audit=audit, patch=verdict.patch))
        assert verdict.patch is not None
        if checked.repaired:
            a._metrics.patch_repairs.inc(checked.repaired)
        warnings.extend(f"amp: {w}" for w in checked.warnings)
        self._answer(answers.patched(req, origin, verdict.patch, warnings=warnings, audit=audit))

    def _stamp(self, checked: Optional[CheckedPatch], status: Status, *words: str) -> CheckedPatch:
        """
        C{checked} (by default: the Pod as it came) with amp's status
        annotation, C{status} then C{words}, unless the review is a
        validation or C{annotate_status} is off.
        """
        req = self._req
        if checked is None:
            checked = unchanged(req.object)
        if self._validation or not self._admitter.config.annotate_status:
            return checked
        value = clip(" ".join((status, *words)), STATUS_LIMIT)
        return annotate(checked, {LEGACY_SKIPPED_ANNOTATION: None, STATUS_ANNOTATION: value})

    def _shadow(self, decision: EndpointDecision, origin: str, verdict: "_Verdict") -> Answer:
        a = self._admitter
        req = self._req
        if verdict.refusal is not None:
            reason, message = verdict.refusal
            self.log.info("Shadow patch from {endpoint} would fail: {reason}", endpoint=origin, reason=message)
            return answers.shadow(req, origin, reason=reason)
        checked = verdict.checked
        size = len(dumps(checked.operations)) if checked is not None else 0
        a._metrics.shadow_patches.labels(origin).inc()
        self.log.info(
            "Shadow mode: {endpoint} would have {verdict} pod {pod} in {namespace} ({ops} operations)",
            endpoint=origin, verdict="patched" if decision.allowed else "denied", pod=req.pod_name,
            namespace=req.namespace, ops=len(checked.operations) if checked is not None else 0)
        return answers.shadow(req, origin, shadow_patch_size=size)

    # ------------------------------------------------------------ ending

    def _answer(self, answer: Answer) -> None:
        if self._done:
            return
        self._done = True
        self._pending = None
        timer, self._timer = self._timer, None
        if timer is not None and timer.active():
            timer.cancel()
        self.result.callback(answer)

    def _expired(self) -> None:
        self._timer = None
        self._end(Reason.DEADLINE)

    def _cancel(self, result: Deferred) -> None:
        self._end(Reason.CANCELLED)

    def _end(self, why: Reason) -> None:
        """
        End the review now (its deadline passed, or the client went away):
        cancel the step in progress, which then ends through L{_resume}.
        """
        if self._done:
            return
        self._ending = why
        pending = self._pending
        if pending is not None:
            pending.cancel()
        if not self._done:
            # The step did not end when cancelled: answer without it.
            self._pending = None
            self._step_failed(Failure(CancelledError()))

    def _step_failed(self, failure: Failure) -> None:
        """
        A step failed, was cancelled, or raised: name the reason and answer
        under the failure policy.
        """
        if self._ending is Reason.CANCELLED:
            # The API server hung up (see amp.web): nobody reads this
            # answer, and it is not an error of amp's.
            reason, message = Reason.CANCELLED, _CANCELLED
        elif failure.check(EndpointFailure):
            # Including the call cut off by the review's deadline: C{timeout}.
            e = failure.value
            reason, message = e.reason, e.message
        elif self._ending is Reason.DEADLINE:
            reason, message = Reason.DEADLINE, f"review deadline of {self._deadline.budget:.3g}s passed"
        elif failure.check(NamespaceLookupError):
            reason = Reason.NAMESPACE_LOOKUP
            message = failure.getErrorMessage() or f"namespace {self._req.namespace}: the lookup failed"
        elif failure.check(CancelledError):
            reason, message = Reason.CANCELLED, _CANCELLED
        else:
            self.log.failure("Internal error reviewing {uid}", failure, uid=self._req.uid)
            error = failure.getErrorMessage() or getattr(failure.type, "__name__", "unknown error")
            reason, message = Reason.INTERNAL_ERROR, f"amp internal error: {error}"
        self._answer(self._failed(reason, message))

    def _failed(self, reason: str, message: str) -> Answer:
        """
        The failure policy: the one place every failure ends.

        Under C{Ignore} a mutation is stamped C{skipped <reason>
        <endpoint>}; a validation is not, because the API server rejects any
        patch from a validating webhook (and would then apply the webhook's
        own failurePolicy, typically C{Fail}).

        The log says it at warning, with the whole message the C{Fail}
        policy would show (a review the client gave up on, at info: nobody
        reads its answer).
        """
        req = self._req
        r = self._route if self._route is not None else self._route_without_namespace()
        # An unusable annotation is shown masked: it may hold credentials or
        # control characters, and it lands in warnings, audit, the Pod and
        # the log.
        where = r.where
        endpoint = r.url.origin if r.url is not None else ""
        text = f"endpoint {where} failed ({reason}): {message}"
        if r.mode == SHADOW:
            self.log.info("Shadow mode: {text}", text=text)
            return answers.shadow(req, endpoint, reason=reason)
        fail = r.failure_policy == FAIL
        emit = self.log.info if reason == Reason.CANCELLED else self.log.warn
        emit("Review {uid} of {namespace}/{pod}: {text}; failure policy {policy} {effect}",
             uid=req.uid, namespace=req.namespace, pod=req.pod_name, endpoint=where, reason=reason,
             message=message, text=text, policy=r.failure_policy,
             effect="denies the Pod" if fail else "admits it without the endpoint's patch")
        if fail:
            return answers.errored(req, endpoint, reason, text)
        try:
            patch = _patch_bytes(self._stamp(None, Status.SKIPPED, reason, where))
        except Exception:
            # A bug in stamping must not cost the answer.
            self.log.failure("Internal error stamping {uid}", uid=req.uid)
            patch = None
        return answers.ignored(req, endpoint, where, reason, text, patch=patch)

    def _route_without_namespace(self) -> Route:
        """
        The route of a review that failed before it had one (its namespace
        lookup failed, hung or was cancelled): from what the cache knows
        now; a namespace still unknown has no annotation to read, so the
        configured policy applies, not a blanket C{Fail}.
        """
        a = self._admitter
        try:
            ns = a._namespaces.cached(self._req.namespace)
            ns = ns if isinstance(ns, NamespaceInfo) else None
            cluster_policy = a._namespaces.cluster_failure_policy()
            r = route(ns, a.config, cluster_policy, validation=self._validation)
            return r if r.enabled else Route(True, failure_policy(ns, a.config, cluster_policy))
        except Exception:
            self.log.failure("Internal error reviewing {uid}", uid=self._req.uid)
            return Route(True, failure_policy(None, a.config, None))


def _patch_bytes(checked: CheckedPatch) -> Optional[bytes]:
    return dumps(checked.operations) if checked.operations else None


@dataclass(slots=True)
class _Verdict:
    """
    What amp makes of an endpoint's usable reply.

    @ivar checked: the endpoint's patch, checked and dry-applied (None for
        a deny or a validation).
    @ivar patch: the patch to send: the endpoint's and the status stamp.
    @ivar refusal: C{(reason, message)} when amp refuses the reply.
    """

    checked: Optional[CheckedPatch] = None
    patch: Optional[bytes] = None
    refusal: Optional[tuple[Reason, str]] = None
