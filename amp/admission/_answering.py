"""
How one review ends (L{Answering}): the answer of a chain whose steps all
ran, shadow mode, and the failure policy, the one place every failure
ends.  Every answer is built by a named constructor of L{amp.answers}.
"""

from __future__ import annotations

from typing import Optional

from twisted.logger import Logger

from amp import answers
from amp.admission._chain import Chain, Stamper
from amp.admission._parts import Parts
from amp.admission_review import AdmissionRequest, clip, dumps
from amp.answers import AUDIT_ERROR_KEY, Answer
from amp.namespaces import NamespaceInfo
from amp.patch import CheckedPatch, PatchError
from amp.policy import FAIL, IGNORE, SHADOW, Route, failure_policy, route
from amp.reasons import Reason, Status
from amp.trace import Answered, IReviewTrace, Refused


class Answering:
    """
    The answers of one review: what it tells the API server, logs and
    counts when it ends.

    @ivar stamper: amp's status annotation for this review's Pod.
    """

    __slots__ = ("_parts", "_req", "_validation", "_trace", "stamper")

    log = Logger()

    def __init__(self, parts: Parts, req: AdmissionRequest, validation: bool, trace: IReviewTrace) -> None:
        self._parts = parts
        self._req = req
        self._validation = validation
        self._trace = trace
        self.stamper = Stamper(req, validation=validation, annotate_status=parts.config.annotate_status, trace=trace)

    def chain_done(self, chain: Chain) -> Answer:
        """
        The answer of a chain whose every step ran or was skipped: the
        steps' checked patches composed into one, checked as a whole and
        stamped; or, in shadow mode, the Pod as it came.
        """
        req = self._req
        r = chain.route
        endpoint = ",".join(chain.called)
        if r.mode == SHADOW:
            return self.shadow(chain, endpoint)
        try:
            checked = chain.composed(req.object, self._parts.compose_options(len(r.steps)))
        except PatchError as e:
            self._trace.record(Refused, reason=e.reason, message=f"the chain's patches together: {e}")
            return self.failed(r, chain, e.reason, f"the chain's patches together: {e}", endpoint)
        warnings = chain.warnings + [f"amp: {w}" for w in checked.warnings]
        if chain.skipped:
            return self._ignored_steps(chain, checked, warnings)
        if self._validation:
            return answers.allowed(req, endpoint, warnings=chain.warnings, audit=chain.audit)
        stamp = self.stamper.stamp
        if not checked.operations:
            stamped = stamp(checked, chain.outcomes)
            return answers.allowed(req, endpoint, warnings=warnings, audit=chain.audit, patch=patch_bytes(stamped))
        patch = dumps(stamp(checked, chain.outcomes).operations)
        if len(patch) > self._parts.config.patch.max_size:
            message = f"patch of {len(patch)} bytes is over patch.max_size"
            self._trace.record(Refused, reason=Reason.PATCH_TOO_LARGE, message=message)
            return self.failed(r, chain, Reason.PATCH_TOO_LARGE, message, endpoint)
        if checked.repaired:
            self._parts.metrics.patch_repairs.inc(checked.repaired)
        return answers.patched(req, endpoint, patch, warnings=warnings, audit=chain.audit)

    def _ignored_steps(self, chain: Chain, checked: CheckedPatch, warnings: list[str]) -> Answer:
        """
        The answer of a chain with skipped steps (under C{Ignore}): the
        patches of the steps that succeeded, if any, and a stamp that lists
        what was skipped and why (C{skipped <reason> <endpoint>; mutated
        <endpoints>}, L{amp.stamp}).
        """
        req = self._req
        first_origin, first_reason, _ = chain.skipped[0]
        text = "; ".join(f"endpoint {origin} failed ({reason}): {message}" for origin, reason, message in chain.skipped)
        for origin, reason, message in chain.skipped:
            self._log_failure(
                origin,
                reason,
                message,
                f"endpoint {origin} failed ({reason}): {message}",
                IGNORE,
                "admits it without the endpoint's patch",
            )
        done = " ".join(chain.answered)
        patch: Optional[bytes]
        if checked.operations:
            patch = dumps(self.stamper.stamp(checked, chain.outcomes).operations)
            if len(patch) > self._parts.config.patch.max_size:
                return self.failed(
                    chain.route,
                    chain,
                    Reason.PATCH_TOO_LARGE,
                    f"patch of {len(patch)} bytes is over patch.max_size",
                    done,
                )
            audit = dict(chain.audit)
            audit[AUDIT_ERROR_KEY] = clip(text, answers.MESSAGE_LIMIT)
            notes = [
                f"amp: {origin} {reason}; the chain went on without its patch" for origin, reason, _ in chain.skipped
            ]
            return answers.patched(
                req, ",".join(chain.called), patch, warnings=notes + warnings, audit=audit, reason=first_reason
            )
        try:
            patch = patch_bytes(self.stamper.stamp(checked, chain.outcomes))
        except Exception:
            # A bug in stamping must not cost the answer.
            self.log.failure("Internal error stamping {uid}", uid=req.uid)
            patch = None
        where = " ".join(origin for origin, _, _ in chain.skipped)
        more = [
            f"amp: {origin} {reason}; admitted without the endpoint's patch" for origin, reason, _ in chain.skipped[1:]
        ]
        return answers.ignored(req, first_origin, where, first_reason, text, patch=patch, warnings=more + warnings)

    def shadow(self, chain: Chain, where: str, *, denied: bool = False) -> Answer:
        """
        Shadow mode, for the whole chain: the Pod is admitted as it came;
        what the chain would have done (denied, or its composed patch) is
        logged and counted.
        """
        req = self._req
        try:
            checked = chain.composed(req.object, self._parts.compose_options(len(chain.route.steps)))
        except PatchError as e:
            self.log.info("Shadow patch from {endpoint} would fail: {reason}", endpoint=where, reason=str(e))
            return answers.shadow(req, where, reason=e.reason)
        size = 0 if denied else len(dumps(checked.operations))
        self._parts.metrics.shadow_patches.labels(where).inc()
        self.log.info(
            "Shadow mode: {endpoint} would have {verdict} pod {pod} in {namespace} ({ops} operations)",
            endpoint=where,
            verdict="denied" if denied else "patched",
            pod=req.pod_name,
            namespace=req.namespace,
            ops=0 if denied else len(checked.operations),
        )
        return answers.shadow(req, where, shadow_patch_size=size)

    def failed(
        self, r: Optional[Route], chain: Optional[Chain], reason: Reason, message: str, endpoint: Optional[str] = None
    ) -> Answer:
        """
        The failure policy: the one place every failure ends, on route
        C{r} (None: the review failed before it had one) with the endpoint
        C{chain} in progress, if any.  C{endpoint}
        names the endpoint of the chain that failed; by default the route's
        endpoints (or its masked annotation).  The log says it at warning,
        with the whole message the C{Fail} policy would show.

        Under C{Ignore} a mutation is stamped C{skipped <reason>
        <endpoint>}; a validation is not, because the API server rejects any
        patch from a validating webhook (and would then apply the webhook's
        own failurePolicy, typically C{Fail}).
        """
        req = self._req
        if r is None:
            r = self._route_without_namespace()
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
        self._log_failure(
            where,
            reason,
            message,
            text,
            r.failure_policy,
            "denies the Pod" if fail else "admits it without the endpoint's patch",
        )
        if fail:
            return answers.errored(req, endpoint, reason, text)
        try:
            patch = patch_bytes(self.stamper.stamp(None, _failed_outcomes(reason, r, chain)))
        except Exception:
            # A bug in stamping must not cost the answer.
            self.log.failure("Internal error stamping {uid}", uid=req.uid)
            patch = None
        return answers.ignored(req, endpoint, where, reason, text, patch=patch)

    def _log_failure(self, where: str, reason: str, message: str, text: str, policy: str, effect: str) -> None:
        """
        Say in amp's log, at warning, that the review ended in the failure
        policy, with the whole (masked) message; a review the client gave
        up on, at info: nobody reads its answer.
        """
        req = self._req
        emit = self.log.info if reason == Reason.CANCELLED else self.log.warn
        emit(
            "Review {uid} of {namespace}/{pod}: {text}; failure policy {policy} {effect}",
            uid=req.uid,
            namespace=req.namespace,
            pod=req.pod_name,
            endpoint=where,
            reason=reason,
            message=message,
            text=text,
            policy=policy,
            effect=effect,
        )

    def _route_without_namespace(self) -> Route:
        """
        The route of a review that failed before it had one (its namespace
        lookup failed, hung or was cancelled): from what the cache knows
        now; a namespace still unknown has no annotation to read, so the
        configured policy applies, not a blanket C{Fail}.
        """
        parts = self._parts
        try:
            ns = parts.namespaces.cached(self._req.namespace)
            ns = ns if isinstance(ns, NamespaceInfo) else None
            cluster_policy = parts.namespaces.cluster_failure_policy()
            r = route(ns, parts.config, cluster_policy, validation=self._validation)
            return r if r.enabled else Route(True, failure_policy(ns, parts.config, cluster_policy))
        except Exception:
            self.log.failure("Internal error reviewing {uid}", uid=self._req.uid)
            return Route(True, failure_policy(None, parts.config, None))


def _failed_outcomes(reason: str, r: Route, chain: Optional[Chain]) -> list[tuple[str, Status, str]]:
    """
    The stamp's outcomes of a review that failed as a whole with C{reason}
    under C{Ignore}: each endpoint of the chain is skipped for C{reason},
    or for its own when its step was skipped already; without a chain, the
    route's endpoints (L{Route.where}).
    """
    if chain is None:
        return [(name, Status.SKIPPED, reason) for name in r.where.split(" ")]
    own = {origin: why for origin, why, _ in chain.skipped}
    return [(step.name, Status.SKIPPED, own.get(step.name, reason)) for step in chain.route.steps]


def told(trace: IReviewTrace, answer: Answer) -> Answer:
    """
    Tell C{trace} the answer.
    """
    if trace.recording:
        trace.record(Answered, result=answer.outcome.result, reason=answer.outcome.reason, body=answer.body)
    return answer


def patch_bytes(checked: CheckedPatch) -> Optional[bytes]:
    return dumps(checked.operations) if checked.operations else None
