"""
The one vocabulary of outcomes: every result a review can have and every
reason a review, an endpoint call or a patch can fail with (pure); and the
other closed vocabularies amp's parts share (failure policies, modes,
namespace sources, breaker states, the verdict a call leaves on its
endpoint).

Metrics labels, warnings, audit annotations, the status stamp, the log line,
the docs and the tests all use these names; nothing else spells them.  Each
member is a C{str} (L{enum.StrEnum}), so it formats as its value in messages
and label values, and a member compares equal to its value.
"""

from __future__ import annotations

from enum import StrEnum


class Result(StrEnum):
    """
    What amp did with one review (C{result} in the log line, the metrics
    and C{/debug/reviews}).
    """

    #: The endpoint's patch was applied.
    PATCHED = "patched"
    #: The endpoint answered with no change (or validation allowed the Pod).
    ALLOWED = "allowed"
    #: A failure under the C{Ignore} policy: the Pod was admitted without the endpoint's patch.
    IGNORED = "ignored"
    #: The endpoint denied the Pod (its decision, whatever the failure policy).
    DENIED = "denied"
    #: A failure under the C{Fail} policy: amp denied the Pod because the
    #: review could not be completed.
    FAILED = "failed"
    #: amp does not act on this review (not a Pod create, namespace not enabled).
    SKIPPED = "skipped"
    #: Shadow mode: the endpoint was called and its answer recorded, not used.
    SHADOW = "shadow"


class Status(StrEnum):
    """
    What amp did with an endpoint, in the C{amp.txn2.com/status}
    annotation it stamps on every Pod it reviews on C{/mutate} in an
    enabled namespace (L{amp.stamp}: across the rounds of one admission).
    """

    #: A round applied the endpoint's patch.
    MUTATED = "mutated"
    #: No round changed the Pod for the endpoint: it answered with no
    #: change (or the namespace has no mutation endpoint, only a
    #: validation one).
    UNCHANGED = "unchanged"
    #: A failure under the C{Ignore} policy: the endpoint's last call
    #: failed, its patch was not applied; the reason follows.
    SKIPPED = "skipped"


class Reason(StrEnum):
    """
    Why a review did not end as the endpoint intended.
    """

    # -- the namespace's configuration (policy)
    NO_ENDPOINT = "no-endpoint"
    BAD_URL = "bad-url"
    NOT_ALLOWED = "not-allowed"
    CHAIN_TOO_LONG = "chain-too-long"

    # -- the endpoint call
    TIMEOUT = "timeout"
    CONNECTION_REFUSED = "connection-refused"
    CONNECTION_RESET = "connection-reset"
    CONNECTION_FAILED = "connection-failed"
    DENIED_ADDRESS = "denied-address"
    TLS_ERROR = "tls-error"
    REDIRECT = "redirect"
    HTTP_4XX = "http-4xx"
    HTTP_5XX = "http-5xx"
    RESPONSE_TOO_LARGE = "response-too-large"
    RESPONSE_HEADERS_TOO_LARGE = "response-headers-too-large"
    REPLY_BUFFER_FULL = "reply-buffer-full"
    INVALID_JSON = "invalid-json"
    INVALID_REPLY = "invalid-reply"
    BREAKER_OPEN = "breaker-open"
    #: The origin's C{max_concurrent} calls were in flight and C{max_queued} reviews waited already.
    QUEUE_FULL = "queue-full"
    #: The review waited for a slot until its deadline left less than C{min_call_time} for the call.
    QUEUE_TIMEOUT = "queue-timeout"
    #: The origin's recent calls are over its C{latency_budget}: shed, not called.
    LATENCY_BUDGET = "latency-budget"

    # -- the endpoint's patch
    INVALID_PATCH = "invalid-patch"
    REFUSED_PATH = "refused-path"
    APPLY_FAILED = "apply-failed"
    TOO_MANY_OPERATIONS = "too-many-operations"
    INVALID_POD = "invalid-pod"
    PATCH_TOO_LARGE = "patch-too-large"

    # -- the endpoint's decision
    ENDPOINT_DENIED = "endpoint-denied"

    # -- why amp leaves a Pod alone without asking an endpoint (not failures)
    OPTED_OUT = "opted-out"
    PROTECTED_NAMESPACE = "protected-namespace"

    # -- the review as a whole
    DEADLINE = "deadline"
    CANCELLED = "cancelled"
    NAMESPACE_LOOKUP = "namespace-lookup"
    INTERNAL_ERROR = "internal-error"


#: Failures of the namespace's endpoint configuration (found before any call).
ROUTE_REASONS = frozenset({Reason.NO_ENDPOINT, Reason.BAD_URL, Reason.NOT_ALLOWED, Reason.CHAIN_TOO_LONG})

#: Named failures of one endpoint call.
ENDPOINT_REASONS = frozenset(
    {
        Reason.TIMEOUT,
        Reason.CONNECTION_REFUSED,
        Reason.CONNECTION_RESET,
        Reason.CONNECTION_FAILED,
        Reason.DENIED_ADDRESS,
        Reason.TLS_ERROR,
        Reason.REDIRECT,
        Reason.HTTP_4XX,
        Reason.HTTP_5XX,
        Reason.RESPONSE_TOO_LARGE,
        Reason.RESPONSE_HEADERS_TOO_LARGE,
        Reason.REPLY_BUFFER_FULL,
        Reason.INVALID_JSON,
        Reason.INVALID_REPLY,
        Reason.BREAKER_OPEN,
        Reason.QUEUE_FULL,
        Reason.QUEUE_TIMEOUT,
        Reason.LATENCY_BUDGET,
    }
)

#: Why amp refused an endpoint's patch.
PATCH_REASONS = frozenset(
    {
        Reason.INVALID_PATCH,
        Reason.REFUSED_PATH,
        Reason.APPLY_FAILED,
        Reason.TOO_MANY_OPERATIONS,
        Reason.INVALID_POD,
        Reason.PATCH_TOO_LARGE,
    }
)

#: Why amp did not act on a Pod it was asked about (the Pod opted out with
#: the enable label, or it is in amp's own or a protected namespace).
SKIP_REASONS = frozenset({Reason.OPTED_OUT, Reason.PROTECTED_NAMESPACE})

#: Failures of the review as a whole, whatever the endpoint did.
REVIEW_REASONS = frozenset({Reason.DEADLINE, Reason.CANCELLED, Reason.NAMESPACE_LOOKUP, Reason.INTERNAL_ERROR})

#: Every reason that ends in the failure policy (everything but a deliberate deny).
FAILURE_REASONS = ROUTE_REASONS | ENDPOINT_REASONS | PATCH_REASONS | REVIEW_REASONS

#: Why amp refused the patch of a reply an endpoint gave, known when the
#: call is counted (the size limit applies to the answer's whole patch, later).
REFUSED_REPLY_REASONS = PATCH_REASONS - {Reason.PATCH_TOO_LARGE}

#: Values of C{amp_endpoint_requests_total{outcome}}: C{ok}, every endpoint
#: reason, the reason amp refused a reply the endpoint gave, and
#: C{cancelled} (the caller gave up before the call ended).
ENDPOINT_OUTCOMES = (
    ("ok",) + tuple(sorted(ENDPOINT_REASONS)) + tuple(sorted(REFUSED_REPLY_REASONS)) + (Reason.CANCELLED.value,)
)


class FailurePolicy(StrEnum):
    """
    What amp does when a review cannot be completed (C{failure_policy},
    the namespace's failure-policy annotation, the webhook's
    C{failurePolicy}).
    """

    #: Config only: follow the C{failurePolicy} of amp's own
    #: MutatingWebhookConfiguration (C{Fail} while it is unknown).
    AUTO = "auto"
    #: Admit the Pod unchanged, with a warning and an audit annotation.
    IGNORE = "Ignore"
    #: Deny the Pod with a clear message.
    FAIL = "Fail"


class Mode(StrEnum):
    """
    How amp uses an endpoint's answer in a namespace (its mode annotation).
    """

    #: The answer is applied.
    NORMAL = "normal"
    #: The endpoint is called and its answer checked, never applied.
    SHADOW = "shadow"


class NamespaceSource(StrEnum):
    """
    Where namespaces come from (C{kubernetes.source}).
    """

    #: The in-cluster service account.
    CLUSTER = "cluster"
    #: The kubeconfig file of C{kubernetes.kubeconfig}.
    KUBECONFIG = "kubeconfig"
    #: No API server: the namespaces of C{kubernetes.namespaces}.
    STATIC = "static"


class BreakerState(StrEnum):
    """
    The state of an endpoint origin's circuit breaker
    (C{amp_circuit_breaker_state}, the log).
    """

    CLOSED = "closed"
    HALF_OPEN = "half_open"
    OPEN = "open"


class Verdict(StrEnum):
    """
    What one settled endpoint call tells its origin's circuit breaker.
    """

    #: The endpoint answered with a usable reply.
    SUCCESS = "success"
    #: The endpoint failed, its own timeout included.
    FAILURE = "failure"
    #: Nothing was learned about the endpoint (cancelled, amp's own limit
    #: or the review's deadline): the breaker counts nothing.
    RELEASE = "release"
