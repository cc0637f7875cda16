"""
One review, end to end: namespace -> route -> endpoint -> patch checks ->
answer, with every failure funnelled through L{Admitter._failed}, the one
place the failure policy is applied.

L{Admitter.review} always resolves (never fails) to the bytes of a
well-formed AdmissionReview answer, within the review's budget: a hung
namespace lookup or endpoint is cut off by the deadline and answered by the
failure policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from twisted.internet.defer import CancelledError, Deferred, maybeDeferred, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from amp.config import Config
from amp.endpoints import EndpointClient, EndpointFailure
from amp.metrics import Metrics
from amp.namespaces import UNKNOWN, INamespaceSource, NamespaceInfo, NamespaceLookupError
from amp.patch import PatchError, annotation_op, check_patch
from amp.policy import FAIL, SHADOW, Route, failure_policy, route, shown_url
from amp.reply import EndpointDecision
from amp.review import AdmissionRequest, clean_audit_annotations, clip, dumps, encode_response

AUDIT_ERROR_KEY = "error"
SKIPPED_ANNOTATION = "amp.txn2.com/skipped"


@dataclass(slots=True)
class Outcome:
    """
    What happened to one review, for the log line and the metrics.
    """

    result: str = "allowed"
    reason: str = ""
    endpoint: str = ""
    patch_size: int = 0
    shadow_patch_size: int = -1


class _Deadline(Exception):
    pass


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
        patch = config.patch
        self._patch_options = dict(
            denied=patch.denied_paths, allowed=patch.allowed_paths, repair=patch.repair,
            max_operations=patch.max_operations)

    # ------------------------------------------------------------ entry

    def review(self, req: AdmissionRequest, budget: float, *, validation: bool = False) -> "Deferred[tuple[bytes, Outcome]]":
        """
        Answer C{req} within C{budget} seconds.  Resolves to the answer's
        bytes and the L{Outcome}; never fails.
        """
        outcome = Outcome()
        if not req.is_pod_create:
            outcome.result = "skipped"
            return succeed((encode_response(req.api_version, req.uid), outcome))
        started = self._clock.seconds()
        ns = self._namespaces.cached(req.namespace)
        # maybeDeferred: an exception raised on the way (a bug, a broken
        # source or client) still ends in _internal_error and an answer.
        if ns is UNKNOWN:
            d = maybeDeferred(self._namespaces.fetch, req.namespace, budget)
            d.addCallback(lambda ns: self._routed(req, ns, outcome, started, budget, validation))
        else:
            d = maybeDeferred(self._routed, req, ns, outcome, started, budget, validation)
        if d.called and not d.paused:
            return d.addErrback(self._internal_error, req, outcome, validation)
        d.addTimeout(budget, self._clock, onTimeoutCancel=self._deadline)
        return d.addErrback(self._internal_error, req, outcome, validation)

    def _deadline(self, result: Any, timeout: float) -> Any:
        if isinstance(result, Failure):
            raise _Deadline(f"review deadline of {timeout:.3g}s passed")
        return result

    def _routed(
        self, req: AdmissionRequest, ns: Optional[NamespaceInfo], outcome: Outcome, started: float,
        budget: float, validation: bool,
    ) -> Deferred:
        r = route(ns, self.config, self._namespaces.cluster_failure_policy(), validation=validation,
                  cache=self._routes)
        if not r.enabled:
            outcome.result = "skipped"
            return succeed((encode_response(req.api_version, req.uid), outcome))
        if r.url is not None:
            outcome.endpoint = r.url.origin
        if r.error is not None:
            return succeed(self._failed(req, r, outcome, *r.error, validation=validation))
        if r.url is None:
            if validation:
                outcome.result = "skipped"
                return succeed((encode_response(req.api_version, req.uid), outcome))
            if self._has_validation_endpoint(ns):
                outcome.result = "skipped"
                return succeed((encode_response(req.api_version, req.uid), outcome))
            return succeed(self._failed(req, r, outcome, "no-endpoint",
                                        "namespace is enabled but has no endpoint annotation"))
        assert r.settings is not None
        remaining = budget - (self._clock.seconds() - started)
        headers = {
            b"x-amp-namespace": req.namespace.encode("utf-8"),
            b"x-amp-operation": req.operation.encode("ascii", "replace"),
            b"x-amp-uid": req.uid.encode("ascii", "replace"),
            b"x-amp-dry-run": b"true" if req.dry_run else b"false",
        }
        pod_json = req.object_json if req.object_json is not None else dumps(req.object)
        d = self._endpoints.call(r.url, r.settings, pod_json, headers, remaining)
        d.addCallbacks(
            self._answered, self._call_failed,
            callbackArgs=(req, r, outcome, validation), errbackArgs=(req, r, outcome, validation))
        return d

    def _has_validation_endpoint(self, ns: Optional[NamespaceInfo]) -> bool:
        return ns is not None and bool(ns.annotations.get(self.config.kubernetes.validation_annotation))

    # ------------------------------------------------------------ outcomes

    def _call_failed(
        self, failure: Failure, req: AdmissionRequest, r: Route, outcome: Outcome, validation: bool
    ) -> tuple:
        failure.trap(EndpointFailure)
        e = failure.value
        return self._failed(req, r, outcome, e.reason, e.message, validation=validation)

    def _answered(
        self, decision: EndpointDecision, req: AdmissionRequest, r: Route, outcome: Outcome, validation: bool
    ) -> tuple[bytes, Outcome]:
        audit, problems = clean_audit_annotations(decision.audit)
        warnings = [f"amp: {w}" for w in decision.warnings] + [f"amp: {p}" for p in problems]
        if r.mode == SHADOW:
            return self._shadow(decision, req, r, outcome)
        if not decision.allowed:
            outcome.result = "denied"
            outcome.reason = "endpoint-denied"
            message = decision.message or "denied by the endpoint without a message"
            return encode_response(
                req.api_version, req.uid, allowed=False, code=decision.code,
                message=clip(f"amp: endpoint {r.url.origin} denied the Pod: {message}", 1024),  # type: ignore[union-attr]
                warnings=warnings, audit=audit), outcome
        if validation or not decision.patch:
            return encode_response(req.api_version, req.uid, warnings=warnings, audit=audit), outcome
        try:
            checked = check_patch(req.object, decision.patch, **self._patch_options)
        except PatchError as e:
            return self._failed(req, r, outcome, e.reason, str(e))
        patch = dumps(checked.operations) if checked.operations else b""
        if len(patch) > self.config.patch.max_size:
            return self._failed(req, r, outcome, "patch-too-large",
                                f"patch of {len(patch)} bytes is over patch.max_size")
        if checked.repaired:
            self._metrics.patch_repairs.inc(checked.repaired)
        warnings.extend(f"amp: {w}" for w in checked.warnings)
        outcome.result = "patched" if patch else "allowed"
        outcome.patch_size = len(patch)
        return encode_response(req.api_version, req.uid, patch_bytes=patch or None, warnings=warnings,
                               audit=audit), outcome

    def _shadow(self, decision: EndpointDecision, req: AdmissionRequest, r: Route, outcome: Outcome) -> tuple:
        origin = r.url.origin  # type: ignore[union-attr]
        outcome.result = "shadow"
        try:
            checked = check_patch(req.object, decision.patch, **self._patch_options) if decision.allowed else None
        except PatchError as e:
            outcome.reason = e.reason
            self.log.info("Shadow patch from {endpoint} would fail: {reason}", endpoint=origin, reason=str(e))
        else:
            size = len(dumps(checked.operations)) if checked is not None else 0
            outcome.shadow_patch_size = size
            self._metrics.shadow_patches.labels(origin).inc()
            self.log.info(
                "Shadow mode: {endpoint} would have {verdict} pod {pod} in {namespace} ({ops} operations)",
                endpoint=origin, verdict="patched" if decision.allowed else "denied", pod=req.pod_name,
                namespace=req.namespace, ops=len(checked.operations) if checked is not None else 0)
        return encode_response(req.api_version, req.uid), outcome

    def _failed(
        self, req: AdmissionRequest, r: Route, outcome: Outcome, reason: str, message: str, *,
        validation: bool = False,
    ) -> tuple:
        """
        The failure policy: the one place every failure ends.

        Under C{Ignore} a mutation is stamped with the C{amp.txn2.com/skipped}
        annotation; a validation is not, because the API server rejects any
        patch from a validating webhook (and would then apply the webhook's
        own failurePolicy, typically C{Fail}).
        """
        # An unusable annotation is shown masked: it may hold credentials or
        # control characters, and it lands in warnings, audit and the Pod.
        where = r.url.origin if r.url is not None else (shown_url(r.raw_url) if r.raw_url else "(none)")
        outcome.reason = reason
        text = f"endpoint {where} failed ({reason}): {message}"
        if r.mode == SHADOW:
            outcome.result = "shadow"
            self.log.info("Shadow mode: {text}", text=text)
            return encode_response(req.api_version, req.uid), outcome
        if r.failure_policy == FAIL:
            outcome.result = "denied"
            return encode_response(
                req.api_version, req.uid, allowed=False, code=500, reason="InternalError",
                message=clip(f"amp: {text}; failure policy Fail denies the Pod", 1024)), outcome
        outcome.result = "ignored"
        patch: Optional[bytes] = None
        if self.config.annotate_skipped and not validation and isinstance(req.object, dict):
            ops = annotation_op(req.object, SKIPPED_ANNOTATION, clip(f"{reason}: {where}", 250))
            patch = dumps(ops)
        return encode_response(
            req.api_version, req.uid, patch_bytes=patch,
            warnings=[f"amp: {where} {reason}; Pod admitted unchanged"],
            audit={AUDIT_ERROR_KEY: clip(text, 1024)}), outcome

    def _internal_error(self, failure: Failure, req: AdmissionRequest, outcome: Outcome, validation: bool) -> tuple:
        """
        Deadline, or a bug: still a well-formed answer under the policy.
        """
        ns = self._namespaces.cached(req.namespace)
        ns = ns if isinstance(ns, NamespaceInfo) else None
        cluster_policy = self._namespaces.cluster_failure_policy()
        r = route(ns, self.config, cluster_policy, validation=validation)
        # A namespace still unknown here (its lookup failed or hung) has no
        # annotation to read: the configured policy applies, not a blanket Fail.
        policy = r.failure_policy if r.enabled else failure_policy(ns, self.config, cluster_policy)
        r = Route(True, policy, r.mode, r.url, r.raw_url)
        if failure.check(_Deadline):
            return self._failed(req, r, outcome, "deadline", failure.getErrorMessage(), validation=validation)
        if failure.check(NamespaceLookupError):
            return self._failed(req, r, outcome, "namespace-lookup", failure.getErrorMessage(),
                                validation=validation)
        if failure.check(CancelledError):
            # The API server hung up (see amp.web): nobody reads this answer,
            # and it is not an error of amp's.
            return self._failed(req, r, outcome, "cancelled", "the review was cancelled: the client went away",
                                validation=validation)
        self.log.failure("Internal error reviewing {uid}", failure, uid=req.uid)
        return self._failed(req, r, outcome, "internal-error", f"amp internal error: {failure.getErrorMessage()}",
                            validation=validation)
