"""
The endpoint chain of one review (L{Chain}): which step is next, the Pod as
the steps so far left it, their checked patches composed into one, what
they said and what each did; and amp's status stamp on the Pod
(L{Stamper}, L{amp.stamp}).
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from amp.admission_review import AUDIT_VALUE_LIMIT, AdmissionRequest, clip
from amp.patch import CheckedPatch, annotate, compose, unchanged
from amp.policy import Route
from amp.reasons import Reason, Status
from amp.rules import LEGACY_SKIPPED_ANNOTATION, STATUS_ANNOTATION
from amp.stamp import next_stamp, pod_stamp
from amp.trace import IReviewTrace, Stamped

#: What one round did with one endpoint, for the stamp: C{(endpoint,
#: status, reason)} (L{amp.stamp.next_stamp}).
Outcomes = Sequence[tuple[str, Status, str]]


class Chain:
    """
    The endpoint chain of one review in progress: which step is next, the
    Pod as the steps so far left it, their checked patches, what they said
    (warnings, audit annotations, each naming its endpoint when the chain
    has more than one), which were skipped and why, and what each did for
    the status stamp.
    """

    __slots__ = ("route", "index", "pod", "patches", "warnings", "audit", "called", "answered", "skipped", "outcomes")

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
        self.skipped: list[tuple[str, Reason, str]] = []
        #: C{(origin, status, reason)} of each step called (or skipped), for
        #: the status stamp (L{amp.stamp.next_stamp}).
        self.outcomes: list[tuple[str, Status, str]] = []

    @property
    def done(self) -> bool:
        """Every step ran or was skipped."""
        return self.index == len(self.route.steps)

    def told(self, origin: str, warnings: Sequence[str], problems: Sequence[str], audit: Mapping[str, str]) -> None:
        """
        Keep what the endpoint at C{origin} said.  In a chain of more than
        one, each warning and audit value names its endpoint, and an audit
        key an earlier endpoint used is suffixed with the step's number.
        """
        if len(self.route.steps) == 1:
            if warnings or problems:
                self.warnings.extend(f"amp: {w}" for w in (*warnings, *problems))
            if audit:
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

    def skip(self, origin: str, reason: Reason, message: str) -> None:
        self.called.append(origin)
        self.skipped.append((origin, reason, message))
        self.outcomes.append((origin, Status.SKIPPED, reason))
        self.index += 1

    def composed(self, pod: dict[str, Any], options: Mapping[str, object]) -> CheckedPatch:
        """
        The steps' checked patches as the one patch for C{pod} (the Pod as
        it came), checked as a whole (L{compose}).

        @raise amp.patch.PatchError: the whole does not check.
        """
        return compose(pod, self.patches, **options)  # type: ignore[arg-type]  # compose's keywords (Parts.compose_options)


class Stamper:
    """
    amp's status annotation on the Pod of one review (L{amp.stamp}): the
    stamp the Pod came with merged with this round's outcome per endpoint,
    in the same checked, dry-applied patch as the endpoint's change; the
    legacy annotation of earlier versions removed.  Nothing is stamped on a
    validation, an ephemeral container update, or with C{annotate_status}
    off.
    """

    __slots__ = ("_req", "_off", "_trace", "value")

    def __init__(self, req: AdmissionRequest, *, validation: bool, annotate_status: bool, trace: IReviewTrace) -> None:
        self._req = req
        # An ephemeral container update may change nothing but
        # spec.ephemeralContainers: the Pod keeps its stamp from its creation.
        self._off = validation or req.is_ephemeral_update or not annotate_status
        self._trace = trace
        #: The stamp last computed for the Pod (C{""}: none), for a trace.
        self.value = ""

    def stamp(self, checked: Optional[CheckedPatch], outcomes: Outcomes) -> CheckedPatch:
        """
        C{checked} (by default: the Pod as it came) with amp's status
        annotation: the stamp the Pod came with merged with this round's
        C{outcomes} (L{next_stamp}).  The stamp is not written again when
        the Pod, as C{checked} leaves it, already has that value.
        """
        req = self._req
        if checked is None:
            checked = unchanged(req.object)
        if self._off:
            return checked
        # Only a CREATE is stamped: the stamp it came with is an earlier
        # round's of this admission, or its author's (amp.stamp).
        value = self.value = next_stamp(pod_stamp(req.object), outcomes)
        written = pod_stamp(checked.pod) != value
        if self._trace.recording:
            self._trace.record(Stamped, key=STATUS_ANNOTATION, value=value, written=written)
        changes: dict[str, Optional[str]] = {LEGACY_SKIPPED_ANNOTATION: None}
        if written:
            changes[STATUS_ANNOTATION] = value
        return annotate(checked, changes)
