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

The endpoint may be a chain (L{amp.policy.Route.steps}): one loop
(L{_Review._call_next}) calls each in order with the Pod as the steps
before it left it, and their patches are composed into one
(L{amp.patch.compose}).  Pods that opt out, and Pods in amp's own or a
protected namespace, are answered unchanged before any lookup.  With
C{ephemeral_containers}, a C{pods/ephemeralcontainers} update is reviewed
like a creation, but may change only C{/spec/ephemeralContainers}.

Every answer is built by a named constructor of L{amp.answers}; every
failure ends in L{_Review._failed}, the one place the failure policy is
applied, with the L{Route} the review was on, and is logged at warning with
its whole message.  An endpoint call resolves to the reply and a handle
(L{amp.endpoint.Reply}); the review judges the reply (its patch checked and
dry-applied) and then settles the call with the verdict, so a reply amp
refuses is counted under its reason, not as C{ok}.  A namespace whose
failure-policy annotation amp cannot use is reported once per change.

The status stamp: every Pod reviewed on C{/mutate} in an enabled namespace
(not in shadow mode, unless C{annotate_status} is off) gets the annotation
L{STATUS_ANNOTATION} (L{amp.stamp}), in the same checked, dry-applied patch
as the endpoint's change, and loses the L{LEGACY_SKIPPED_ANNOTATION} of
earlier versions.  Each review tells L{amp.stamp.next_stamp} the outcome of
each endpoint it called (L{_Chain.outcomes}), merged with the stamp the
Pod came with, so after the API server reinvokes amp the stamp tells what
all rounds did; a value the endpoint's patch sets never survives.  A round
that changes nothing, the stamp included, answers with no patch at all.

Each decision is told to the review's trace (L{amp.trace}) as it is
taken: C{amp explain} gives a L{amp.trace.RecordedTrace}; the daemon's is
L{amp.trace.NO_TRACE}, which keeps nothing.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Sequence

from twisted.internet.defer import CancelledError, Deferred, succeed
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from amp import answers
from amp.answers import AUDIT_ERROR_KEY, Answer, Outcome, unheard
from amp.config import Config
from amp.deadline import Deadline, review_deadline
from amp.endpoint import OK, EndpointClient, EndpointFailure, Reply
from amp.metrics import Metrics
from amp.namespaces import UNKNOWN, INamespaceSource, NamespaceInfo, NamespaceLookupError
from amp.patch import CheckedPatch, PatchError, annotate, check_patch, compose, unchanged
from amp.canary import canary_plan
from amp.policy import FAIL, IGNORE, SHADOW, Route, failure_policy, route
from amp.reasons import Reason, Status
from amp.reply import EndpointDecision
from amp.rules import (
    CANARY_ANNOTATION, CANARY_PERCENT_ANNOTATION, CANARY_STEP_ANNOTATION, LEGACY_SKIPPED_ANNOTATION, STATUS_ANNOTATION,
    opted_out, own_pods_warning, protected_namespaces,
)
from amp.review import AUDIT_VALUE_LIMIT, AdmissionRequest, clean_audit_annotations, clip, dumps
from amp.stamp import next_stamp, pod_stamp
from amp.trace import (
    NO_TRACE, Answered, BudgetGiven, Called, IReviewTrace, Refused, Replied, Skipped, Stamped)

__all__ = [
    "AUDIT_ERROR_KEY", "LEGACY_SKIPPED_ANNOTATION", "STATUS_ANNOTATION", "Admitter", "Answer", "Outcome", "unheard",
]

_CANCELLED = "the review was cancelled: the client went away"

#: All a C{pods/ephemeralcontainers} update may change.
EPHEMERAL_CONTAINERS = "/spec/ephemeralContainers"

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
        recorder: Optional[Any] = None,
        canary: Optional[Any] = None,
    ) -> None:
        self.config = config
        #: Where reviews are offered for recording (L{amp.record.Recorder}), or None.
        self.recorder = recorder
        #: Runs candidates of namespaces with a canary (L{amp.canary.Canary}), or None.
        self.canary = canary
        #: Each canary's plan, by the annotations it comes from.
        self._canary_plans: dict[tuple, Any] = {}
        self._namespaces = namespaces
        self._endpoints = endpoints
        self._clock = clock
        self._metrics = metrics
        self._routes: dict[str, tuple] = {}
        #: The configuration problem last reported for each namespace.
        self._problems: dict[str, str] = {}
        self._protected = protected_namespaces(config.kubernetes)
        #: Protected namespaces amp has said it leaves alone (said once each).
        self._protected_told: set[str] = set()
        patch = config.patch
        self._patch_options = dict(
            denied=patch.denied_paths, allowed=patch.allowed_paths, repair=patch.repair,
            max_operations=patch.max_operations)

    def deadline(self, timeout: Optional[str], started: float) -> Deadline:
        """
        The one deadline of a review that arrived at C{started} asking for
        C{?timeout=timeout} (None: the request has none): the timeout, or
        C{deadline.default_timeout}, less C{deadline.margin}.
        """
        return review_deadline(timeout, started, self.config.deadline)

    def review(
        self, req: AdmissionRequest, deadline: Deadline, *, validation: bool = False,
        trace: Optional[IReviewTrace] = None,
    ) -> "Deferred[Answer]":
        """
        Answer C{req} before C{deadline}.  Resolves to an L{Answer}; never
        fails.  Cancelling the result (the client went away) answers at
        once, as C{cancelled}.  C{trace}, if given, is told each decision.
        """
        if trace is None:
            trace = NO_TRACE
        if not (req.is_pod_create or (self.config.ephemeral_containers and req.is_ephemeral_update)):
            return succeed(_told(trace, answers.skipped(req)))
        alone = self._left_alone(req)
        if alone is not None:
            return succeed(_told(trace, answers.skipped(req, reason=alone)))
        return _Review(self, req, deadline, validation, trace).start()

    def _compose_options(self, steps: int) -> dict[str, Any]:
        """L{compose}'s options for a chain of C{steps}: each may send C{patch.max_operations}."""
        options = self._patch_options
        return dict(denied=options["denied"], allowed=options["allowed"],
                    max_operations=options["max_operations"] * max(steps, 1))

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
                    "webhook configuration's namespaceSelector should exclude it", namespace=name)
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
        ns = self._namespaces.cached(own)
        warning = own_pods_warning(ns if isinstance(ns, NamespaceInfo) else None, self.config.kubernetes)
        if warning is not None:
            self.log.warn("{warning}", warning=warning)
        return warning

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

    def _plan_canary(self, ns: Optional[NamespaceInfo], r: Route) -> Any:
        """The namespace's canary plan (L{amp.canary.canary_plan}), kept per annotation values."""
        if ns is None or CANARY_ANNOTATION not in ns.annotations:
            return None
        key = (ns.annotations.get(CANARY_ANNOTATION), ns.annotations.get(CANARY_PERCENT_ANNOTATION),
               ns.annotations.get(CANARY_STEP_ANNOTATION), len(r.steps))
        plan = self._canary_plans.get(key)
        if plan is None:
            if len(self._canary_plans) >= _PROBLEMS_LIMIT:
                self._canary_plans.clear()
            plan = self._canary_plans[key] = canary_plan(ns, r, self.config)
        return plan

    def _has_validation_endpoint(self, ns: Optional[NamespaceInfo]) -> bool:
        return ns is not None and bool(ns.annotations.get(self.config.kubernetes.validation_annotation))


class _Review:
    """
    One review in progress: the step it waits on, the deadline's timer, the
    route once known.
    """

    __slots__ = ("_admitter", "_req", "_deadline", "_validation", "_route", "_pending", "_timer", "_ending",
                 "_done", "result", "_chain", "_trace", "_call_started", "_namespace", "_canary_plan", "_canary_run")

    log = Logger()

    def __init__(
        self, admitter: Admitter, req: AdmissionRequest, deadline: Deadline, validation: bool,
        trace: IReviewTrace = NO_TRACE,
    ) -> None:
        self._admitter = admitter
        self._trace = trace
        #: When the endpoint call in progress started (for the trace).
        self._call_started = 0.0
        self._req = req
        self._deadline = deadline
        self._validation = validation
        self._route: Optional[Route] = None
        #: The namespace as the review found it, once routed.
        self._namespace: Optional[NamespaceInfo] = None
        #: The namespace's canary (L{amp.canary.CanaryPlan}) and its run in progress.
        self._canary_plan: Any = None
        self._canary_run: Any = None
        #: The step waited on: a namespace lookup or an endpoint call.
        self._pending: Optional[Deferred] = None
        self._timer: Optional[IDelayedCall] = None
        #: Why the review is being ended early: DEADLINE or CANCELLED.
        self._ending: Optional[Reason] = None
        self._done = False
        #: The endpoint chain in progress, once routed.
        self._chain: Optional[_Chain] = None
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
            # The review was answered without this step; its result is
            # dropped (a reply is settled as it is: nobody judges it).
            if isinstance(result, Reply):
                result.settle(OK)
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
        trace = self._trace
        self._namespace = ns
        r = self._route = route(ns, a.config, a._namespaces.cluster_failure_policy(),
                                validation=self._validation, cache=a._routes, explain=trace.recording)
        if r.enabled:
            a._note_problem(req.namespace, r.policy_problem)
        for event in r.explanation:
            trace.record(event)
        if not r.enabled:
            return self._answer(answers.skipped(req))
        if r.error is not None:
            return self._answer(self._failed(*r.error))
        if not r.steps:
            if self._validation:
                return self._answer(answers.skipped(req))
            if a._has_validation_endpoint(ns):
                # Nothing to mutate, but the Pod was reviewed: stamped, so
                # it is not taken for one that bypassed amp.
                stamped = self._stamp(None, [(r.where, Status.UNCHANGED, "")])
                return self._answer(answers.skipped(req, patch=_patch_bytes(stamped)))
            return self._answer(self._failed(Reason.NO_ENDPOINT, "namespace is enabled but has no endpoint annotation"))
        if a.canary is not None and r.mode != SHADOW and not self._validation and not req.is_ephemeral_update:
            self._canary_plan = a._plan_canary(ns, r)
        self._chain = _Chain(r, unchanged(req.object))
        self._call_next()

    def _call_next(self) -> None:
        """
        Call the chain's next endpoint with the Pod as the steps before it
        left it, within what is left of the review's one deadline; or, when
        every step is done, answer.
        """
        chain = self._chain
        assert chain is not None
        if chain.index == len(chain.route.steps):
            return self._answer(self._chain_done())
        step = chain.route.steps[chain.index]
        req = self._req
        headers = {
            b"x-amp-namespace": req.namespace.encode("utf-8"),
            b"x-amp-operation": req.operation.encode("ascii", "replace"),
            b"x-amp-uid": req.uid.encode("ascii", "replace"),
            b"x-amp-dry-run": b"true" if req.dry_run else b"false",
        }
        if req.sub_resource:
            headers[b"x-amp-subresource"] = req.sub_resource.encode("ascii", "replace")
        if chain.pod.pod is req.object:
            pod_json = req.object_json if req.object_json is not None else dumps(req.object)
        else:
            pod_json = dumps(chain.pod.pod)
        now = self._call_started = self._admitter._clock.seconds()
        left = self._deadline.remaining(now)
        self._trace.record(BudgetGiven(seconds=round(left, 4), timeout=round(min(step.settings.timeout, left), 4),
                                       position=chain.index + 1, chain_length=len(chain.route.steps)))
        plan = self._canary_plan
        if plan is not None and plan.index == chain.index:
            a = self._admitter
            self._canary_run = a.canary.start(plan, req.namespace, req.uid, req.pod_name, step, chain.pod.pod,
                                              pod_json, headers, self._deadline, a._patch_options)
        self._wait(self._admitter._endpoints.ask(step.url, step.settings, pod_json, headers, self._deadline,
                                                 step.breaker),
                   self._replied)

    def _tell_canary(self, pod_after: Optional[dict] = None, skipped: bool = False) -> None:
        """Tell the canary in progress how the live step it stands beside ended."""
        run, self._canary_run = self._canary_run, None
        if run is not None:
            run.live_done(pod_after, skipped)

    def _judge(self, decision: EndpointDecision) -> Any:
        """
        The current step's patch checked and dry-applied to the Pod as the
        steps before left it; the L{PatchError} when amp refuses it; None
        when there is nothing to check (a deny, a validation, no patch).
        """
        chain = self._chain
        assert chain is not None
        if not decision.allowed or self._validation or not decision.patch:
            return None
        try:
            return check_patch(chain.pod.pod, decision.patch, **self._admitter._patch_options, trace=self._trace,
                               confined=EPHEMERAL_CONTAINERS if self._req.is_ephemeral_update else None)
        except PatchError as e:
            return e

    def _replied(self, reply: Reply) -> None:
        """
        The endpoint answered: judge its reply, settle the call with the
        verdict (L{OK} or the reason amp refuses the reply), then go on.
        """
        decision = reply.decision
        judged = None
        try:
            self._record_call(OK, "")
            self._trace.record(Replied(
                allowed=decision.allowed, operations=len(decision.patch), warnings=list(decision.warnings),
                code=None if decision.allowed else decision.code, message=decision.message))
            judged = self._judge(decision)
        finally:
            reply.settle(judged.reason if isinstance(judged, PatchError) else OK)
        self._decided(decision, judged)

    def _decided(self, decision: EndpointDecision, judged: Any) -> None:
        """
        Go on from the endpoint's C{decision} and amp's C{judged} verdict on
        its patch (see L{_judge}).
        """
        req = self._req
        chain = self._chain
        assert chain is not None
        origin = chain.route.steps[chain.index].name
        audit, problems = clean_audit_annotations(decision.audit)
        chain.told(origin, decision.warnings, problems, audit)
        if not decision.allowed:
            self._tell_canary(None)
            if chain.route.mode == SHADOW:
                return self._answer(self._shadow(chain, origin, denied=True))
            return self._answer(answers.denied(req, origin, decision.code, decision.message,
                                               warnings=chain.warnings, audit=chain.audit))
        if isinstance(judged, PatchError):
            self._trace.record(Refused(reason=judged.reason, message=str(judged)))
            return self._step_ended(judged.reason, str(judged))
        self._tell_canary(judged.pod if judged is not None else chain.pod.pod)
        changed = judged is not None and bool(judged.operations)
        if changed:
            chain.applied(judged)
        chain.ok(origin, changed)
        self._call_next()

    def _step_ended(self, reason: str, message: str) -> None:
        """
        The chain's current endpoint failed with C{reason}: under C{Ignore}
        (not in shadow mode) its step is skipped and the chain goes on with
        the Pod as it was; else the failure policy answers, naming it.
        """
        self._tell_canary(skipped=True)
        chain = self._chain
        assert chain is not None
        r = chain.route
        step = r.steps[chain.index]
        if r.failure_policy == FAIL or r.mode == SHADOW:
            return self._answer(self._failed(reason, message, step.name))
        self._trace.record(Skipped(endpoint=step.name, reason=reason, message=message))
        chain.skip(step.name, reason, message)
        self._call_next()

    def _chain_done(self) -> Answer:
        """
        The answer of a chain whose every step ran or was skipped: the
        steps' checked patches composed into one, checked as a whole and
        stamped; or, in shadow mode, the Pod as it came.
        """
        a = self._admitter
        req = self._req
        chain = self._chain
        assert chain is not None
        r = chain.route
        endpoint = ",".join(chain.called)
        if r.mode == SHADOW:
            return self._shadow(chain, endpoint)
        try:
            checked = compose(req.object, chain.patches, **a._compose_options(len(r.steps)))
        except PatchError as e:
            self._trace.record(Refused(reason=e.reason, message=f"the chain's patches together: {e}"))
            return self._failed(e.reason, f"the chain's patches together: {e}", endpoint)
        warnings = chain.warnings + [f"amp: {w}" for w in checked.warnings]
        if chain.skipped:
            return self._ignored_steps(chain, checked, warnings)
        if self._validation:
            return answers.allowed(req, endpoint, warnings=chain.warnings, audit=chain.audit)
        if not checked.operations:
            stamped = self._stamp(checked, chain.outcomes)
            return answers.allowed(req, endpoint, warnings=warnings, audit=chain.audit, patch=_patch_bytes(stamped))
        patch = dumps(self._stamp(checked, chain.outcomes).operations)
        if len(patch) > a.config.patch.max_size:
            message = f"patch of {len(patch)} bytes is over patch.max_size"
            self._trace.record(Refused(reason=Reason.PATCH_TOO_LARGE, message=message))
            return self._failed(Reason.PATCH_TOO_LARGE, message, endpoint)
        if checked.repaired:
            a._metrics.patch_repairs.inc(checked.repaired)
        return answers.patched(req, endpoint, patch, warnings=warnings, audit=chain.audit)

    def _ignored_steps(self, chain: "_Chain", checked: CheckedPatch, warnings: list[str]) -> Answer:
        """
        The answer of a chain with skipped steps (under C{Ignore}): the
        patches of the steps that succeeded, if any, and a stamp that lists
        what was skipped and why (C{skipped <reason> <endpoint>; mutated
        <endpoints>}, L{amp.stamp}).
        """
        a = self._admitter
        req = self._req
        first_origin, first_reason, _ = chain.skipped[0]
        text = "; ".join(f"endpoint {origin} failed ({reason}): {message}" for origin, reason, message in chain.skipped)
        for origin, reason, message in chain.skipped:
            self._log_failure(origin, reason, message, f"endpoint {origin} failed ({reason}): {message}", IGNORE,
                              "admits it without the endpoint's patch")
        done = " ".join(chain.answered)
        if checked.operations:
            patch = dumps(self._stamp(checked, chain.outcomes).operations)
            if len(patch) > a.config.patch.max_size:
                return self._failed(Reason.PATCH_TOO_LARGE, f"patch of {len(patch)} bytes is over patch.max_size",
                                    done)
            audit = dict(chain.audit)
            audit[AUDIT_ERROR_KEY] = clip(text, answers.MESSAGE_LIMIT)
            notes = [f"amp: {origin} {reason}; the chain went on without its patch"
                     for origin, reason, _ in chain.skipped]
            return answers.patched(req, ",".join(chain.called), patch, warnings=notes + warnings, audit=audit,
                                   reason=first_reason)
        try:
            patch = _patch_bytes(self._stamp(checked, chain.outcomes))
        except Exception:
            # A bug in stamping must not cost the answer.
            self.log.failure("Internal error stamping {uid}", uid=req.uid)
            patch = None
        where = " ".join(origin for origin, _, _ in chain.skipped)
        more = [f"amp: {origin} {reason}; admitted without the endpoint's patch"
                for origin, reason, _ in chain.skipped[1:]]
        return answers.ignored(req, first_origin, where, first_reason, text, patch=patch,
                               warnings=more + warnings)

    def _stamp(self, checked: Optional[CheckedPatch], outcomes: Sequence[tuple[str, Status, str]]) -> CheckedPatch:
        """
        C{checked} (by default: the Pod as it came) with amp's status
        annotation: the stamp the Pod came with merged with this round's
        C{outcomes} (L{next_stamp}), unless the review is a validation or
        C{annotate_status} is off.  The stamp is not written again when
        the Pod, as C{checked} leaves it, already has that value.
        """
        req = self._req
        if checked is None:
            checked = unchanged(req.object)
        if self._validation or req.is_ephemeral_update or not self._admitter.config.annotate_status:
            # An ephemeral container update may change nothing but
            # spec.ephemeralContainers: the Pod keeps its stamp from its
            # creation.
            return checked
        # Only a CREATE is stamped: the stamp it came with is an earlier
        # round's of this admission, or its author's (amp.stamp).
        value = next_stamp(pod_stamp(req.object), outcomes)
        written = pod_stamp(checked.pod) != value
        self._trace.record(Stamped(key=STATUS_ANNOTATION, value=value, written=written))
        changes: dict[str, Optional[str]] = {LEGACY_SKIPPED_ANNOTATION: None}
        if written:
            changes[STATUS_ANNOTATION] = value
        return annotate(checked, changes)

    def _shadow(self, chain: "_Chain", where: str, *, denied: bool = False) -> Answer:
        """
        Shadow mode, for the whole chain: the Pod is admitted as it came;
        what the chain would have done (denied, or its composed patch) is
        logged and counted.
        """
        a = self._admitter
        req = self._req
        try:
            checked = compose(req.object, chain.patches, **a._compose_options(len(chain.route.steps)))
        except PatchError as e:
            self.log.info("Shadow patch from {endpoint} would fail: {reason}", endpoint=where, reason=str(e))
            return answers.shadow(req, where, reason=e.reason)
        size = 0 if denied else len(dumps(checked.operations))
        a._metrics.shadow_patches.labels(where).inc()
        self.log.info(
            "Shadow mode: {endpoint} would have {verdict} pod {pod} in {namespace} ({ops} operations)",
            endpoint=where, verdict="denied" if denied else "patched", pod=req.pod_name,
            namespace=req.namespace, ops=0 if denied else len(checked.operations))
        return answers.shadow(req, where, shadow_patch_size=size)

    # ------------------------------------------------------------ ending

    def _answer(self, answer: Answer) -> None:
        if self._done:
            return
        _told(self._trace, answer)
        self._done = True
        self._pending = None
        timer, self._timer = self._timer, None
        if timer is not None and timer.active():
            timer.cancel()
        self._tell_canary(skipped=True)
        recorder = self._admitter.recorder
        if recorder is not None and self._route is not None and not self._validation:
            self._offer(recorder, answer)
        self.result.callback(answer)

    def _offer(self, recorder: Any, answer: Answer) -> None:
        """Offer the answered review for recording (never blocks or raises)."""
        try:
            ns, r, req, outcome = self._namespace, self._route, self._req, answer.outcome
            assert r is not None
            recorder.offer(
                self._admitter._clock.seconds(), req.uid, req.namespace,
                ns.annotations if ns is not None else {}, ns.labels if ns is not None else {},
                [step.name for step in r.steps], r.failure_policy, r.mode, req.body, answer.body,
                str(outcome.result), str(outcome.reason))
        except Exception:
            self.log.failure("Could not offer a review for recording")

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
        A step failed, was cancelled, or raised: name the reason; a failed
        endpoint of the chain ends in L{_step_ended} (or, once the
        deadline has passed, the rest of the chain is skipped); anything
        else is answered under the failure policy.
        """
        chain = self._chain
        calling = chain is not None and chain.index < len(chain.route.steps)
        if self._ending is Reason.CANCELLED:
            # The API server hung up (see amp.web): nobody reads this
            # answer, and it is not an error of amp's.
            reason, message = Reason.CANCELLED, _CANCELLED
        elif failure.check(EndpointFailure):
            # Including the call cut off by the review's deadline: C{timeout}.
            e = failure.value
            reason, message = e.reason, e.message
            if calling:
                self._record_call(reason, message)
            if calling and self._ending is None:
                return self._step_ended(reason, message)
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
        if calling and self._ending is Reason.DEADLINE:
            assert chain is not None
            r = chain.route
            origin = r.steps[chain.index].name
            if r.failure_policy == FAIL or r.mode == SHADOW:
                return self._answer(self._failed(reason, message, origin))
            # Under Ignore: this step and the ones after it are skipped; the
            # steps that answered keep their patches.
            chain.skip(origin, reason, message)
            while chain.index < len(r.steps):
                chain.skip(r.steps[chain.index].name, Reason.DEADLINE,
                           f"review deadline of {self._deadline.budget:.3g}s passed before the call")
            return self._answer(self._chain_done())
        self._answer(self._failed(reason, message))

    def _record_call(self, outcome: str, message: str) -> None:
        chain = self._chain
        assert chain is not None
        step = chain.route.steps[chain.index]
        seconds = self._admitter._clock.seconds() - self._call_started
        self._trace.record(Called(endpoint=step.name, url=step.url.url, outcome=outcome, seconds=round(seconds, 6),
                                  message=message))

    def _failed(self, reason: str, message: str, endpoint: Optional[str] = None) -> Answer:
        """
        The failure policy: the one place every failure ends.  C{endpoint}
        names the endpoint of the chain that failed; by default the route's
        endpoints (or its masked annotation).  The log says it at warning,
        with the whole message the C{Fail} policy would show.

        Under C{Ignore} a mutation is stamped C{skipped <reason>
        <endpoint>}; a validation is not, because the API server rejects any
        patch from a validating webhook (and would then apply the webhook's
        own failurePolicy, typically C{Fail}).
        """
        req = self._req
        r = self._route if self._route is not None else self._route_without_namespace()
        # An unusable annotation is shown masked: it may hold credentials or
        # control characters, and it lands in warnings, audit and the Pod.
        where = endpoint if endpoint is not None else r.where
        if endpoint is None:
            endpoint = ",".join(step.name for step in r.steps) or (r.url.origin if r.url is not None else "")
        text = f"endpoint {where} failed ({reason}): {message}"
        if r.mode == SHADOW:
            self.log.info("Shadow mode: {text}", text=text)
            return answers.shadow(req, endpoint, reason=reason)
        fail = r.failure_policy == FAIL
        self._log_failure(where, reason, message, text, r.failure_policy,
                          "denies the Pod" if fail else "admits it without the endpoint's patch")
        if fail:
            return answers.errored(req, endpoint, reason, text)
        try:
            patch = _patch_bytes(self._stamp(None, self._failed_outcomes(reason, r)))
        except Exception:
            # A bug in stamping must not cost the answer.
            self.log.failure("Internal error stamping {uid}", uid=req.uid)
            patch = None
        return answers.ignored(req, endpoint, where, reason, text, patch=patch)

    def _failed_outcomes(self, reason: str, r: Route) -> list[tuple[str, Status, str]]:
        """
        The stamp's outcomes of a review that failed as a whole with
        C{reason} under C{Ignore}: each endpoint of the chain is skipped
        for C{reason}, or for its own when its step was skipped already;
        without a chain, the route's endpoints (L{Route.where}).
        """
        chain = self._chain
        if chain is None:
            return [(name, Status.SKIPPED, reason) for name in r.where.split(" ")]
        own = {origin: why for origin, why, _ in chain.skipped}
        return [(step.name, Status.SKIPPED, own.get(step.name, reason)) for step in chain.route.steps]

    def _log_failure(self, where: str, reason: str, message: str, text: str, policy: str, effect: str) -> None:
        """
        Say in amp's log, at warning, that the review ended in the failure
        policy, with the whole (masked) message; a review the client gave
        up on, at info: nobody reads its answer.
        """
        req = self._req
        emit = self.log.info if reason == Reason.CANCELLED else self.log.warn
        emit("Review {uid} of {namespace}/{pod}: {text}; failure policy {policy} {effect}",
             uid=req.uid, namespace=req.namespace, pod=req.pod_name, endpoint=where, reason=reason,
             message=message, text=text, policy=policy, effect=effect)

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


class _Chain:
    """
    The endpoint chain of one review in progress: which step is next, the
    Pod as the steps so far left it, their checked patches, what they said
    (warnings, audit annotations, each naming its endpoint when the chain
    has more than one), which were skipped and why, and what each did for
    the status stamp.
    """

    __slots__ = ("route", "index", "pod", "patches", "warnings", "audit", "called", "answered", "skipped",
                 "outcomes")

    def __init__(self, route: Route, pod: CheckedPatch) -> None:
        self.route = route
        self.index = 0
        #: The Pod as the steps so far left it (C{pod.pod}).
        self.pod = pod
        self.patches: list[CheckedPatch] = []
        self.warnings: list[str] = []
        self.audit: dict[str, str] = {}
        #: Origins of the endpoints called (or skipped), in order.
        self.called: list[str] = []
        #: Origins of the endpoints that answered (not skipped).
        self.answered: list[str] = []
        #: C{(origin, reason, message)} of each skipped step.
        self.skipped: list[tuple[str, str, str]] = []
        #: C{(origin, status, reason)} of each step called (or skipped), for
        #: the status stamp (L{amp.stamp.next_stamp}).
        self.outcomes: list[tuple[str, Status, str]] = []

    def told(self, origin: str, warnings: Sequence[str], problems: Sequence[str], audit: Mapping[str, str]) -> None:
        """
        Keep what the endpoint at C{origin} said.  In a chain of more than
        one, each warning and audit value names its endpoint, and an audit
        key an earlier endpoint used is suffixed with the step's number.
        """
        if len(self.route.steps) == 1:
            self.warnings.extend(f"amp: {w}" for w in (*warnings, *problems))
            self.audit.update(audit)
            return
        self.warnings.extend(f"amp: {origin}: {w}" for w in (*warnings, *problems))
        for key, value in audit.items():
            if key in self.audit:
                key = f"{key}.{self.index + 1}"
            self.audit[key] = clip(f"{origin}: {value}", AUDIT_VALUE_LIMIT)

    def applied(self, checked: CheckedPatch) -> None:
        self.patches.append(checked)
        self.pod = checked

    def ok(self, origin: str, changed: bool) -> None:
        self.called.append(origin)
        self.answered.append(origin)
        self.outcomes.append((origin, Status.MUTATED if changed else Status.UNCHANGED, ""))
        self.index += 1

    def skip(self, origin: str, reason: str, message: str) -> None:
        self.called.append(origin)
        self.skipped.append((origin, reason, message))
        self.outcomes.append((origin, Status.SKIPPED, reason))
        self.index += 1


def _told(trace: IReviewTrace, answer: Answer) -> Answer:
    """
    Tell C{trace} the answer.
    """
    trace.record(Answered(answer.outcome.result, answer.outcome.reason, answer.body))
    return answer


def _patch_bytes(checked: CheckedPatch) -> Optional[bytes]:
    return dumps(checked.operations) if checked.operations else None
