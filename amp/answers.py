"""
Every answer amp gives to a review, through a few named constructors (pure).

Each constructor returns an L{Answer}: the bytes of the AdmissionReview
answer and the L{Outcome} that the review's log line and metrics report, so
that what the API server is told and what amp counts cannot drift apart.

  - L{skipped}: amp does not act on this review (not a Pod create, the
    namespace is not enabled or does not exist, nothing configured for it);
  - L{allowed}: the endpoint answered with no change;
  - L{patched}: the endpoint's checked patch is applied;
  - L{denied}: the endpoint denied the Pod;
  - L{ignored} and L{errored}: a failure under the C{Ignore} or C{Fail}
    policy, results C{ignored} and C{failed} (L{amp.admission} decides
    which: the failure policy is applied in one place);
  - L{shadow}: shadow mode, the Pod admitted as it is whatever happened;
  - L{unheard}: an answer the client went away before it got: counted as
    what it would have been, with the reason C{cancelled} when it had none.

An answer is not edited once built: its L{Outcome} is frozen.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable, Mapping, NamedTuple, Optional

from amp.admission_review import AdmissionRequest, clip, encode_response
from amp.reasons import Reason, Result

#: The key of amp's own audit annotation (shown by the API server as
#: C{<webhook name>/error}).
AUDIT_ERROR_KEY = "error"

#: The longest message amp puts in a deny or an audit annotation.
MESSAGE_LIMIT = 1024


# Not frozen: a frozen dataclass's __init__ sets each field through
# object.__setattr__, several times the cost of a plain one (bench/README.md, "Figures behind the code");
# one is made for every review,
# and nothing changes it once made.
@dataclass(slots=True)
class Outcome:
    """
    What happened to one review, for the log line and the metrics.

    @ivar reason: why the review did not end as the endpoint intended, or
        C{""}.
    @ivar endpoint: the endpoint's origin, or C{""} when there was none.
    @ivar patch_size: bytes of the patch sent to the API server.
    @ivar shadow_patch_size: in shadow mode, bytes of the patch that would
        have been sent; else -1.
    @ivar message: a deny's or a failure's message (masked, as the API
        server is told it), or C{""}.
    """

    result: Result = Result.ALLOWED
    reason: str = ""
    endpoint: str = ""
    patch_size: int = 0
    shadow_patch_size: int = -1
    message: str = ""


class Answer(NamedTuple):
    """
    An answer to one review: the AdmissionReview's bytes and its L{Outcome}.
    """

    body: bytes
    outcome: Outcome


def skipped(req: AdmissionRequest, *, patch: Optional[bytes] = None, reason: str = "") -> Answer:
    """
    amp does not act on this review: admitted as it is, nothing said; with
    C{patch}, only amp's status annotation (a namespace with a validation
    endpoint only, on C{/mutate}).  C{reason} (one of
    L{amp.reasons.SKIP_REASONS}) says why when it is not the obvious one.
    """
    return Answer(
        encode_response(req.api_version, req.uid, patch_bytes=patch),
        Outcome(Result.SKIPPED, reason, patch_size=len(patch) if patch else 0),
    )


def allowed(
    req: AdmissionRequest,
    endpoint: str,
    *,
    warnings: Iterable[str] = (),
    audit: Optional[Mapping[str, str]] = None,
    patch: Optional[bytes] = None,
) -> Answer:
    """
    The endpoint answered with no change (or allowed the Pod on
    C{/validate}); C{patch} holds amp's status annotation only.
    """
    return Answer(
        encode_response(req.api_version, req.uid, patch_bytes=patch, warnings=warnings, audit=audit),
        Outcome(Result.ALLOWED, endpoint=endpoint, patch_size=len(patch) if patch else 0),
    )


def patched(
    req: AdmissionRequest,
    endpoint: str,
    patch: bytes,
    *,
    warnings: Iterable[str] = (),
    audit: Optional[Mapping[str, str]] = None,
    reason: str = "",
) -> Answer:
    """
    The endpoint's patch (checked, dry-applied, serialised, with amp's
    status annotation) is applied; for a chain, the composed patch of its
    endpoints, and C{reason} the failure of the first step skipped under
    C{Ignore}, if any.
    """
    return Answer(
        encode_response(req.api_version, req.uid, patch_bytes=patch, warnings=warnings, audit=audit),
        Outcome(Result.PATCHED, reason, endpoint=endpoint, patch_size=len(patch)),
    )


def denied(
    req: AdmissionRequest,
    endpoint: str,
    code: int,
    message: str,
    *,
    warnings: Iterable[str] = (),
    audit: Optional[Mapping[str, str]] = None,
) -> Answer:
    """
    The endpoint denied the Pod (whatever the failure policy): C{code} and
    its message, with the endpoint named.
    """
    message = clip(
        f"amp: endpoint {endpoint} denied the Pod: {message or 'denied by the endpoint without a message'}",
        MESSAGE_LIMIT,
    )
    return Answer(
        encode_response(
            req.api_version, req.uid, allowed=False, code=code, message=message, warnings=warnings, audit=audit
        ),
        Outcome(Result.DENIED, Reason.ENDPOINT_DENIED, endpoint, message=message),
    )


def ignored(
    req: AdmissionRequest,
    endpoint: str,
    where: str,
    reason: Reason,
    text: str,
    *,
    patch: Optional[bytes] = None,
    warnings: Iterable[str] = (),
) -> Answer:
    """
    A failure under C{Ignore}: the Pod is admitted without the endpoint's
    patch, with a warning, amp's audit annotation (C{text}) and C{patch}
    (amp's status annotation, when it stamps one: then the Pod is not
    unchanged, and the warning does not say so); C{warnings} follow amp's
    (those of a chain's other endpoints).
    """
    return Answer(
        encode_response(
            req.api_version,
            req.uid,
            patch_bytes=patch,
            warnings=[f"amp: {where} {reason}; admitted without the endpoint's patch", *warnings],
            audit={AUDIT_ERROR_KEY: clip(text, MESSAGE_LIMIT)},
        ),
        Outcome(Result.IGNORED, reason, endpoint, len(patch) if patch else 0, message=clip(text, MESSAGE_LIMIT)),
    )


def errored(req: AdmissionRequest, endpoint: str, reason: Reason, text: str) -> Answer:
    """
    A failure under C{Fail}: the Pod is denied with C{500 InternalError}
    and C{text}.
    """
    message = clip(f"amp: {text}; failure policy Fail denies the Pod", MESSAGE_LIMIT)
    return Answer(
        encode_response(req.api_version, req.uid, allowed=False, code=500, reason="InternalError", message=message),
        Outcome(Result.FAILED, reason, endpoint, message=message),
    )


def shadow(req: AdmissionRequest, endpoint: str, *, reason: str = "", shadow_patch_size: int = -1) -> Answer:
    """
    Shadow mode: the Pod is admitted as it is, whatever the endpoint
    answered or however it failed; the outcome records what would have
    happened.
    """
    return Answer(
        encode_response(req.api_version, req.uid),
        Outcome(Result.SHADOW, reason, endpoint, shadow_patch_size=shadow_patch_size),
    )


def unheard(answer: Answer) -> Answer:
    """
    C{answer}, which the client went away before it got: the same bytes,
    counted as what it would have been, with the vocabulary's reason for a
    client that left when it had no reason of its own.
    """
    if answer.outcome.reason:
        return answer
    return Answer(answer.body, replace(answer.outcome, reason=Reason.CANCELLED))
