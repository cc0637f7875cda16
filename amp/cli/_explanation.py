"""
What C{amp explain} found (L{Explanation}: one or two L{Round}s of review)
and the exit status it leads to; L{amp.cli.explain} collects it and
L{amp.cli.report} prints it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from amp.cli.workloads import PodInput
from amp.reasons import FAILURE_REASONS, Reason, Result
from amp.trace import RecordedTrace

EXIT_ADMITTED = 0
EXIT_FAILURE_POLICY = 1
EXIT_USAGE = 2
EXIT_DENIED = 3
EXIT_NOT_IDEMPOTENT = 4


@dataclass
class Round:
    """
    One review of the Pod: the decision and what it did to the Pod.

    @ivar request_pod: the Pod sent for review.
    @ivar pod: the Pod as admitted (C{request_pod} with C{patch} applied),
        or None when it was denied.
    @ivar patch: the JSON Patch amp sends the API server (C{[]} for none).
    @ivar log: amp's log lines written during the review.
    """

    request_pod: dict[str, Any]
    result: str
    reason: str
    message: str
    allowed: bool
    code: Optional[int]
    patch: list[dict[str, Any]]
    warnings: list[str]
    audit: dict[str, str]
    pod: Optional[dict[str, Any]]
    endpoint: str
    trace: RecordedTrace
    log: list[str] = field(default_factory=list)
    #: The W3C trace id of this review: sent to the endpoint in
    #: C{traceparent}, and exported when the config traces.
    trace_id: str = ""


@dataclass
class Explanation:
    """
    What amp explain found: the input, the first round and, with
    C{--twice}, the second and whether the endpoint is idempotent (None
    when the first round admitted nothing to review again, or the second
    did not admit the Pod: then its status is the exit status).
    """

    input: PodInput
    first: Round
    second: Optional[Round] = None
    idempotent: Optional[bool] = None
    namespace_source: str = ""
    #: Where C{failure_policy: auto} read the cluster's policy, if it did.
    cluster_policy: str = ""
    #: C{--twice} was asked for.
    twice: bool = False
    #: The file of the recorded reply the endpoint calls were answered
    #: with, if they were.
    recorded: Optional[str] = None
    #: What the reader should know about the input: the namespace amp
    #: fell back to, the Pod's labels and annotations amp does not read.
    notes: list[str] = field(default_factory=list)

    @property
    def exit_status(self) -> int:
        status = exit_status(self.first.result, self.first.reason)
        if status == EXIT_ADMITTED and self.second is not None:
            status = exit_status(self.second.result, self.second.reason)
        return EXIT_NOT_IDEMPOTENT if status == EXIT_ADMITTED and self.idempotent is False else status


def exit_status(result: str, reason: str) -> int:
    """
    The exit status for a review that ended in C{result} for C{reason}.
    """
    if reason == Reason.ENDPOINT_DENIED:
        return EXIT_DENIED
    if reason in FAILURE_REASONS:
        # Including a chain patched without a failed endpoint's patch.
        return EXIT_FAILURE_POLICY
    if result in (Result.PATCHED, Result.ALLOWED, Result.SKIPPED, Result.SHADOW):
        return EXIT_ADMITTED
    return EXIT_FAILURE_POLICY
