"""
The run of C{amp replay} (L{amp.cli.replay} is its command line): recorded
reviews through amp's own pipeline again, compared.

Each line of a recording (L{amp.record}) is reviewed by an L{Admitter}, the
daemon's own review core (the one C{amp explain} uses), against the
namespace as it was recorded, and the Pod it would admit is compared by
JSON path with:

 - by default, the Pod the recorded answer admitted (did the endpoint, or
   amp, change since the recording?);
 - with C{--against URL}, the Pod the review admits with the endpoint
   replaced by C{URL} (what will the candidate version change?).

C{--endpoint URL} replaces the recorded endpoint (the namespace's endpoint
annotation, a whole chain in annotation form) for both sides, e.g. the
endpoint under test on a loopback port in its CI; C{--against URL} then
replaces one step of that chain, the one a canary would stand in for
(C{amp.txn2.com/canary-step}, default 1).  Reviews run a few at a
time (C{--concurrency}), their report streamed in the recording's order;
a line that cannot be used, of whatever kind, is counted and named by its
C{file:line}, never fatal, and only the first few are kept to show: a
replay's memory does not grow with the recording.  amp's own status stamp is not compared (it names the
endpoint), the results are.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Optional

from twisted.application.service import Service
from twisted.internet.defer import Deferred, gatherResults, inlineCallbacks, succeed
from zope.interface import implementer

from amp.canary import CANARY_STEP_ANNOTATION
from amp.config import Config
from amp.namespaces import INamespaceSource, NamespaceInfo
from amp.poddiff import Difference, pod_differences
from amp.policy import chain_pieces
from amp.record._entry import LINE_LIMIT, RecordedReview, RecordingError, decode_line
from amp.rules import STAMP_ANNOTATIONS

if TYPE_CHECKING:
    from amp.endpoint import EndpointClient
    from amp.metrics import Metrics
    from amp.reactors import IAmpReactor

__all__ = [
    "ReplayOptions",
    "ReplayedReview",
    "ReplayReport",
    "read_recording",
    "replay",
    "Verdict",
    "UNREADABLE_SAMPLE",
]

#: Results that admit the Pod as the endpoint intended.
_ADMITTED_AS_INTENDED = frozenset({"patched", "allowed", "skipped"})


class Verdict:
    SAME = "same"
    DIFFERENT = "different"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class Side:
    """One side of a comparison: a result and the Pod it admits (None: denied)."""

    result: str
    reason: str
    pod: Optional[dict[str, Any]]
    message: str = ""


@dataclass(frozen=True, slots=True)
class ReplayedReview:
    recorded: RecordedReview
    verdict: str
    before: Side
    after: Side
    differences: tuple[Difference, ...] = ()

    @property
    def failed_reason(self) -> str:
        return self.after.reason or self.after.result

    def as_json(self) -> dict[str, Any]:
        r = self.recorded
        return {
            "where": r.where,
            "uid": r.uid,
            "namespace": r.namespace,
            "pod": r.pod_name,
            "verdict": self.verdict,
            "before": {"result": self.before.result, "reason": self.before.reason},
            "after": {"result": self.after.result, "reason": self.after.reason, "message": self.after.message},
            "differences": [d.as_json() for d in self.differences],
            **({"trace_id": r.trace_id} if r.trace_id else {}),
        }


#: How many unreadable lines a report keeps, to show; the rest are counted.
UNREADABLE_SAMPLE = 20


@dataclass
class ReplayReport:
    """
    What a replay found, in bounded memory: how many reviews were the
    same, different and failed (by reason), the reviews that are not the
    same (each with what names it and its differences, not its Pods) when
    no one takes them as they come (see L{replay}'s C{emit}), and the lines
    that could not be used: the first L{UNREADABLE_SAMPLE} of them, each
    naming its C{file:line}, and a count of all.
    """

    reviews: list[ReplayedReview] = field(default_factory=list)
    #: The first unreadable lines' messages (C{file:line: why}).
    unreadable: list[str] = field(default_factory=list)
    #: Every unreadable line, those in L{unreadable} included.
    unreadable_count: int = 0
    same: int = 0
    different: int = 0
    failed: int = 0
    failed_reasons: Counter[str] = field(default_factory=Counter)

    def add_unreadable(self, message: str) -> None:
        self.unreadable_count += 1
        if len(self.unreadable) < UNREADABLE_SAMPLE:
            self.unreadable.append(message)

    @property
    def unreadable_not_shown(self) -> int:
        """Unreadable lines counted but not kept in L{unreadable}."""
        return self.unreadable_count - len(self.unreadable)

    def add(self, review: ReplayedReview) -> None:
        """Count C{review} (the caller keeps it, or not)."""
        if review.verdict == Verdict.SAME:
            self.same += 1
        elif review.verdict == Verdict.DIFFERENT:
            self.different += 1
        else:
            self.failed += 1
            self.failed_reasons[review.failed_reason] += 1

    def counts(self) -> dict[str, int]:
        return {
            "reviews": self.same + self.different + self.failed + self.unreadable_count,
            "same": self.same,
            "different": self.different,
            "failed": self.failed,
            "unreadable": self.unreadable_count,
        }

    def failed_by_reason(self) -> dict[str, int]:
        return dict(sorted(self.failed_reasons.items()))

    @property
    def exit_status(self) -> int:
        return 0 if self.different == self.failed == self.unreadable_count == 0 else 1


@dataclass(frozen=True, slots=True)
class ReplayOptions:
    config: Config = field(default_factory=Config)
    endpoint: Optional[str] = None
    against: Optional[str] = None
    concurrency: int = 8
    timeout: float = 10.0


def read_recording(path: str, stream: Any) -> Iterator[RecordedReview | RecordingError]:
    """
    The reviews of one recording file, line by line (bounded: a line over
    the limit is named and skipped, never read whole); a L{RecordingError}
    in place of each line that cannot be used.
    """
    number = 0
    while True:
        line = stream.readline(LINE_LIMIT + 1)
        if not line:
            return
        number += 1
        where = f"{path}:{number}"
        if len(line) > LINE_LIMIT and not line.endswith(b"\n"):
            while line and not line.endswith(b"\n"):  # skip the rest of the line
                line = stream.readline(LINE_LIMIT + 1)
            yield RecordingError(f"{where}: line is longer than {LINE_LIMIT} bytes")
            continue
        if not line.strip():
            continue
        try:
            yield decode_line(line.rstrip(b"\r\n"), where)
        except RecordingError as e:
            yield e


@implementer(INamespaceSource)
class _RecordedNamespace(Service):
    """The one namespace a recorded review was reviewed in, as recorded."""

    count = 1

    def __init__(self, info: NamespaceInfo, failure_policy: Optional[str]) -> None:
        self._info = info
        self._policy = failure_policy

    def cached(self, name: str) -> Any:
        return self._info if name == self._info.name else None

    def fetch(self, name: str, timeout: float) -> "Deferred[Optional[NamespaceInfo]]":
        return succeed(self.cached(name))

    def readiness(self) -> tuple[bool, str]:
        return True, "recorded namespace"

    def cluster_failure_policy(self) -> Optional[str]:
        return self._policy


def _namespace(
    recorded: RecordedReview, config: Config, endpoint: Optional[str], against: Optional[str] = None
) -> NamespaceInfo:
    """
    The recorded namespace, its chain replaced by C{endpoint} (a chain in
    the annotation's form), then its step C{amp.txn2.com/canary-step}
    (default 1, as a canary's) replaced by C{against}.
    """
    annotations = dict(recorded.annotations)
    keys = config.kubernetes.endpoint_annotations
    present = [k for k in keys if k in annotations]
    chain = endpoint if endpoint is not None else (annotations[present[0]] if present else "")
    if against is not None:
        pieces = chain_pieces(chain)
        step = annotations.get(CANARY_STEP_ANNOTATION, "1")
        at = int(step) - 1 if step.isdigit() and 1 <= int(step) <= len(pieces) else 0
        pieces[at : at + 1] = [against]
        chain = " ".join(pieces)
    if endpoint is not None or against is not None:
        for k in present[1:]:
            del annotations[k]
        annotations[present[0] if present else keys[0]] = chain
    return NamespaceInfo(recorded.namespace, dict(recorded.labels), annotations)


class Replayer:
    """
    Reviews recorded reviews again with one endpoint client (its pools
    shared by every review) and compares.
    """

    def __init__(
        self, reactor: IAmpReactor, options: ReplayOptions, endpoint_client: EndpointClient, metrics: Metrics
    ) -> None:
        self._reactor = reactor
        self._options = options
        self._client = endpoint_client
        self._metrics = metrics

    @inlineCallbacks
    def _review(self, recorded: RecordedReview, endpoint: Optional[str], against: Optional[str] = None) -> Any:
        from amp.admission import Admitter
        from amp.admission_review import ReviewError, parse_review
        from amp.deadline import Deadline

        config = self._options.config
        info = _namespace(recorded, config, endpoint, against)
        source = _RecordedNamespace(info, _recorded_policy(recorded))
        admitter = Admitter(config, source, self._client, self._reactor, self._metrics)
        try:
            req = parse_review(recorded.review_bytes())
        except ReviewError as e:
            return Side("failed", "bad-review", None, str(e))
        body, outcome = yield admitter.review(req, Deadline.after(self._reactor.seconds(), self._options.timeout))
        response = json.loads(body)["response"]
        patch = json.loads(_b64(response["patch"])) if response.get("patch") else None
        pod = _admitted(recorded.pod, patch) if response.get("allowed") else None
        return Side(str(outcome.result), str(outcome.reason), pod, str(outcome.message))

    @inlineCallbacks
    def replay_one(self, recorded: RecordedReview) -> Any:
        options = self._options
        if options.against is None:
            before = Side(
                recorded.result,
                recorded.reason,
                _admitted(recorded.pod, recorded.patch) if recorded.allowed else None,
                recorded.message,
            )
        else:
            before = yield self._review(recorded, options.endpoint)
        after = yield self._review(recorded, options.endpoint, options.against)
        differences = pod_differences(before.pod, after.pod, ignore_annotations=STAMP_ANNOTATIONS)
        if (
            after.result not in _ADMITTED_AS_INTENDED
            and after.result != "denied"
            and (before.result != after.result or before.reason != after.reason)
        ):
            verdict = Verdict.FAILED
        elif differences or before.result != after.result:
            verdict = Verdict.DIFFERENT
        else:
            verdict = Verdict.SAME
        return ReplayedReview(recorded, verdict, before, after, differences)


def _recorded_policy(recorded: RecordedReview) -> Optional[str]:
    """The policy the review was answered under, for C{failure_policy: auto}."""
    return recorded.failure_policy if recorded.failure_policy in ("Ignore", "Fail") else None


def _b64(text: str) -> bytes:
    import base64

    return base64.b64decode(text)


def _admitted(pod: Any, patch: Optional[list[Any]]) -> Optional[dict[str, Any]]:
    from amp.patch import PatchError, check_patch

    if not isinstance(pod, dict):
        return None
    if not patch:
        return pod
    try:
        return check_patch(pod, patch, denied=(), repair=False, max_operations=len(patch)).pod
    except PatchError:
        return None


def _named_only(recorded: RecordedReview) -> RecordedReview:
    """C{recorded} with what names it (its line, uid, namespace, Pod name), not its Pod."""
    return dataclasses.replace(
        recorded,
        review={"request": {"object": {"metadata": {"name": recorded.pod_name}}}},
        labels={},
        annotations={},
        patch=None,
    )


def _slim(done: ReplayedReview) -> ReplayedReview:
    """C{done} with what names it and its differences, not its Pods."""
    return dataclasses.replace(
        done,
        recorded=_named_only(done.recorded),
        before=dataclasses.replace(done.before, pod=None),
        after=dataclasses.replace(done.after, pod=None),
    )


def replay(
    reactor: IAmpReactor,
    options: ReplayOptions,
    recordings: Iterable[RecordedReview | RecordingError],
    endpoint_client: EndpointClient,
    metrics: Metrics,
    progress: Any = None,
    emit: Optional[Callable[[ReplayedReview], None]] = None,
) -> "Deferred[ReplayReport]":
    """
    Replay C{recordings}, at most C{options.concurrency} reviews at a time,
    reading the next line only when a review finishes (a long recording is
    never held whole); fires with the L{ReplayReport}.

    Each review that is not the same goes, in the recordings' order, to
    C{emit} as soon as every review before it is done (the report keeps
    none then), or else into the report's C{reviews}: what names it and
    its differences, not its Pods.  Reviews done ahead of an earlier one
    still running wait for it, at most C{4 * concurrency} of them: no more
    lines are read meanwhile.  An unreadable line, and a line whose
    replay fails in a way amp did not foresee, is counted and named by its
    C{file:line} (L{ReplayReport.add_unreadable}), never fatal.
    """
    replayer = Replayer(reactor, options, endpoint_client, metrics)
    report = ReplayReport()
    source = iter(recordings)
    window = 4 * max(1, options.concurrency)
    finished: dict[int, Optional[ReplayedReview]] = {}
    waiting: list[Deferred[None]] = []
    state = {"taken": 0, "shown": 0}
    out = emit if emit is not None else report.reviews.append

    def take() -> Optional[RecordedReview]:
        for item in source:
            if not isinstance(item, RecordingError):
                return item
            report.add_unreadable(str(item))
            if progress is not None:
                progress()
        return None

    def show() -> None:
        while state["shown"] in finished:
            done = finished.pop(state["shown"])
            state["shown"] += 1
            if done is not None:
                out(done)
        while waiting:
            waiting.pop().callback(None)

    @inlineCallbacks
    def worker() -> Any:
        while True:
            while state["taken"] - state["shown"] >= window:
                wait: Deferred[None] = Deferred()
                waiting.append(wait)
                yield wait
            item = take()
            if item is None:
                return
            index = state["taken"]
            state["taken"] += 1
            try:
                done = yield replayer.replay_one(item)
            except Exception as e:
                # Not foreseen: still one line, named, never fatal.
                report.add_unreadable(f"{item.where}: cannot be replayed: {type(e).__name__}: {e}")
                finished[index] = None
            else:
                report.add(done)
                finished[index] = None if done.verdict == Verdict.SAME else _slim(done)
            show()
            if progress is not None:
                progress()

    workers = [worker() for _ in range(max(1, options.concurrency))]
    return gatherResults(workers, consumeErrors=True).addCallback(lambda _: report)
