"""
The webhook's answers: C{/mutate} and C{/validate} (an AdmissionReview in,
an AdmissionReview out), C{/healthz} and C{/readyz}, as handlers of amp's
own HTTP listener (L{amp.http}), which receives each request whole, within
the limits of C{listen.*}, before a handler runs.

L{webhook_routes} maps each path to its handler; anything else is a plain
404 (L{not_found}).  Every answer here is plain text or JSON, never an HTML
page; a request that is not a valid AdmissionReview is a 400 or 415 naming
what is wrong, and the first few of those per interval are logged (the
listener's L{amp.logs.RepeatLimiter}).
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable, NamedTuple, Optional

from twisted.internet.interfaces import IReactorTime
from twisted.logger import LogLevel
from twisted.python.failure import Failure

from amp.admission import Admitter, Answer, Outcome, unheard
from amp.admission_review import AdmissionRequest, ReviewError, parse_review
from amp.http import Handler, Request, query_parameter
from amp.logs import HotPathLogger, lines_together
from amp.memo import Memo
from amp.metrics import Metrics
from amp.reasons import Result
from amp.recent import Decision, RecentDecisions
from amp.tracing import NO_TRACING, ReviewSpans, ReviewTracer

#: What the listener serves, for a request to any other path.
SERVED = "amp serves /mutate, /validate, /healthz and /readyz"

_JSON = b"application/json"
#: Distinct query strings whose timeout is remembered (a client choosing
#: its query cannot grow the memory: past this, the oldest is forgotten).
_QUERIES_KEPT = 64
_ALLOW_POST = b"Allow: POST\r\n"
_ALLOW_GET = b"Allow: GET, HEAD\r\n"


_REVIEW_LINE = "review {uid} {namespace}/{pod} {result} endpoint={endpoint} patch={patch_size}B in {duration_ms:.1f}ms"
_REVIEW_LINE_WITH_REASON = (
    "review {uid} {namespace}/{pod} {result} ({reason}) endpoint={endpoint} patch={patch_size}B in {duration_ms:.1f}ms"
)
# A traced review's line names its trace.
_TRACED_LINE = _REVIEW_LINE + " trace={trace_id}"
_TRACED_LINE_WITH_REASON = _REVIEW_LINE_WITH_REASON + " trace={trace_id}"


class _Accounted(NamedTuple):
    """What a review's log line and metrics name of it (L{ReviewHandler._account})."""

    uid: str
    namespace: str
    pod_name: str
    kind: str
    operation: str
    dry_run: bool


class ReviewHandler:
    """
    C{POST /mutate} or C{POST /validate}: an AdmissionReview in, an
    AdmissionReview out.  (Its name is the logger name of every review's
    log line, C{amp.web.ReviewHandler}, which log queries select on.)
    """

    log = HotPathLogger()

    def __init__(
        self,
        admitter: Admitter,
        clock: IReactorTime,
        metrics: Metrics,
        *,
        validation: bool,
        recent: Optional[RecentDecisions] = None,
    ) -> None:
        #: Where each decision is recorded for C{/debug/reviews}, if anywhere.
        self.recent = recent
        #: Reviews each request; replaced on a config reload (a review keeps
        #: the admitter, and so the config, it started with).
        self.admitter = admitter
        self._clock = clock
        self._metrics = metrics
        self._validation = validation
        #: Reviews answered whose log line and metrics are still to come:
        #: what they need of each review, not the review itself, so that
        #: its decoded Pod is freed when the answer is written (while still
        #: in the CPU's cache) rather than two turns later with the rest.
        self._unaccounted: list[tuple[_Accounted, Outcome, float, float, Optional[ReviewSpans]]] = []
        #: The timeout parameter of each query seen (L{_timeout_of}).
        self._timeouts: Memo[bytes, Optional[str]] = Memo(_QUERIES_KEPT)
        # The log line's method, bound once (each access to a Logger
        # through an instance makes a new Logger).
        self._info = self.log.info
        #: OpenTelemetry tracing (L{amp.tracing.Tracing}); off: L{NO_TRACING}.
        self.tracing: ReviewTracer = NO_TRACING

    def __call__(self, request: Request) -> None:
        if request.method != b"POST":
            request.plain(405, f"{request.path.decode('latin-1')} accepts only POST", _ALLOW_POST)
            return
        started = self._clock.seconds()
        content_type = request.content_type.split(b";", 1)[0].strip().lower()
        if content_type != _JSON:
            self._bad(request, 415, f"Content-Type must be application/json, got {content_type.decode('latin-1')!r}")
            return
        try:
            req = parse_review(request.body, lazy=True)
        except ReviewError as e:
            self._bad(request, e.code, e.message)
            return
        except RecursionError:
            self._bad(request, 400, "request body is nested too deeply to parse")
            return
        except Exception as e:
            # Whatever else the body makes the parser raise, it is the
            # body's fault: a 400 naming it, never a 500.
            self._bad(request, 400, f"request body is not a valid AdmissionReview ({type(e).__name__}: {str(e)[:200]})")
            return
        # The review's one deadline, computed here once and carried down.
        admitter = self.admitter
        query = request.query
        if query:
            try:
                timeout = self._timeouts[query]
            except KeyError:
                timeout = self._timeout_of(query)
        else:
            timeout = None
        deadline = admitter.deadline(timeout, started)
        tracing = self.tracing
        if tracing.enabled:
            spans = tracing.begin(request.traceparent, request.tracestate, started)
            request.review = admitter.review_into(
                partial(self._respond, request, req, started, spans),
                req,
                deadline,
                validation=self._validation,
                spans=spans,
            )
            return
        # The review while it waits (the listener cancels it if the client
        # goes away); None when it was answered at once.
        request.review = admitter.review_into(
            partial(self._respond, request, req, started, None), req, deadline, validation=self._validation
        )

    def _timeout_of(self, query: bytes) -> Optional[str]:
        """
        The C{timeout} parameter of a request's query, remembered: the API
        server sends the same query with every review.
        """
        value = query_parameter(query, b"timeout")
        timeout = value.decode("ascii", "replace") if value is not None else None
        self._timeouts[query] = timeout
        return timeout

    def _bad(self, request: Request, code: int, message: str) -> None:
        self._metrics.bad_requests.labels(str(code)).inc()
        request.server.warnings.emit("bad-reviews", LogLevel.info, "Bad AdmissionReview: {error}", error=message)
        request.plain(code, message)

    def _respond(
        self, request: Request, req: AdmissionRequest, started: float, spans: Optional[ReviewSpans], answer: Answer
    ) -> None:
        try:
            self._answer(request, req, started, spans, answer)
        except Exception:
            self._write_failed(Failure(), request)

    def _answer(
        self, request: Request, req: AdmissionRequest, started: float, spans: Optional[ReviewSpans], answer: Answer
    ) -> None:
        request.review = None
        if request.disconnected:
            # Answered as the client went away.
            answer = unheard(answer)
        elif spans is not None and spans.sampled:
            began = self._clock.seconds()
            request.respond(200, answer.body, _JSON)
            spans.answer_write = (began, self._clock.seconds())
        else:
            request.respond(200, answer.body, _JSON)
        outcome = answer.outcome
        answered = self._clock.seconds()
        # The answer is only in the transport's buffer until the reactor's
        # next I/O pass: do the accounting (log line, metrics) after that, two
        # turns later, so it never delays the answer; the reviews answered in
        # one turn are accounted together.
        unaccounted = self._unaccounted
        unaccounted.append(
            (
                _Accounted(req.uid, req.namespace, req.pod_name, req.kind, req.operation, req.dry_run),
                outcome,
                answered - started,
                answered,
                spans,
            )
        )
        if len(unaccounted) == 1:
            self._clock.callLater(0, self._clock.callLater, 0, self._account)

    def _account(self) -> None:
        unaccounted, self._unaccounted = self._unaccounted, []
        recent = self.recent
        count = self._metrics.count_review
        info = self._info
        # One write of the log for the lines of every review in this turn.
        with lines_together():
            for req, outcome, elapsed, answered, spans in unaccounted:
                if spans is not None and spans.sampled:
                    self._traced(req, outcome, elapsed, answered, spans)
                    continue
                if recent is not None:
                    recent.record(
                        Decision(
                            req.uid,
                            answered,
                            req.namespace,
                            req.pod_name,
                            outcome.endpoint,
                            str(outcome.result),
                            str(outcome.reason),
                            outcome.message,
                            elapsed * 1000,
                        )
                    )
                count(req.kind, req.operation, outcome.result, outcome.reason, elapsed)
                info(
                    _REVIEW_LINE_WITH_REASON if outcome.reason else _REVIEW_LINE,
                    uid=req.uid,
                    namespace=req.namespace,
                    pod=req.pod_name,
                    endpoint=outcome.endpoint or "-",
                    result=outcome.result,
                    reason=outcome.reason,
                    patch_size=outcome.patch_size,
                    duration_ms=elapsed * 1000,
                    dry_run=req.dry_run,
                    kind=req.kind,
                    operation=req.operation,
                )

    def _traced(self, req: _Accounted, outcome: Outcome, elapsed: float, answered: float, spans: ReviewSpans) -> None:
        """
        A traced review's accounting: its spans made and exported, and its
        trace id in the log line, C{/debug/reviews} and the latency
        histogram's exemplar.
        """
        trace_id = spans.trace_hex
        self.tracing.finish(
            spans, answered, review_attributes(req, outcome, self._validation, spans.stamp), review_error(outcome)
        )
        if self.recent is not None:
            self.recent.record(
                Decision(
                    req.uid,
                    answered,
                    req.namespace,
                    req.pod_name,
                    outcome.endpoint,
                    str(outcome.result),
                    str(outcome.reason),
                    outcome.message,
                    elapsed * 1000,
                    trace_id=trace_id,
                )
            )
        self._metrics.count_review(
            req.kind, req.operation, outcome.result, outcome.reason, elapsed, trace_id=trace_id, when=answered
        )
        self._info(
            _TRACED_LINE_WITH_REASON if outcome.reason else _TRACED_LINE,
            uid=req.uid,
            namespace=req.namespace,
            pod=req.pod_name,
            endpoint=outcome.endpoint or "-",
            result=outcome.result,
            reason=outcome.reason,
            patch_size=outcome.patch_size,
            duration_ms=elapsed * 1000,
            dry_run=req.dry_run,
            kind=req.kind,
            operation=req.operation,
            trace_id=trace_id,
        )

    def _write_failed(self, failure: Failure, request: Request) -> None:
        """
        A bug of amp's while answering (no input leads here): logged with
        its traceback, answered with amp's own plain 500, and the
        connection closed.
        """
        self.log.failure("Could not write an admission answer", failure)
        if not request.disconnected:
            request.keep_alive = False
            request.plain(500, "amp internal error")


def review_attributes(req: Any, outcome: Outcome, validation: bool, stamp: str = "") -> dict[str, Any]:
    """
    A review span's attributes: the semantic conventions' HTTP server and
    Kubernetes ones, and amp's own (result, reason, endpoint shown as amp
    shows URLs).  C{req}: the review's C{uid}, C{namespace}, C{pod_name},
    C{operation} and C{dry_run} (an L{AdmissionRequest} or what is kept of one).
    """
    route = "/validate" if validation else "/mutate"
    attributes: dict[str, Any] = {
        "http.request.method": "POST",
        "http.route": route,
        "url.path": route,
        "url.scheme": "https",
        "http.response.status_code": 200,
        "k8s.namespace.name": req.namespace,
        "k8s.pod.name": req.pod_name,
        "amp.review.uid": req.uid,
        "amp.review.operation": req.operation,
        "amp.review.dry_run": req.dry_run,
        "amp.result": str(outcome.result),
        "amp.patch.size": outcome.patch_size,
    }
    if outcome.reason:
        attributes["amp.reason"] = str(outcome.reason)
    if outcome.endpoint:
        attributes["amp.endpoint"] = outcome.endpoint
    if stamp:
        attributes["amp.stamp"] = stamp
    return attributes


def review_error(outcome: Outcome) -> Optional[str]:
    """A review span's error status: the reason (and message) of a review that failed, else None."""
    if outcome.result in (Result.FAILED, Result.IGNORED):
        reason = str(outcome.reason) or str(outcome.result)
        return f"{reason}: {outcome.message}" if outcome.message else reason
    return None


def health(request: Request) -> None:
    """
    C{GET /healthz}: the process is alive and its reactor turns.
    """
    if request.method not in (b"GET", b"HEAD"):
        request.plain(405, f"{request.path.decode('latin-1')} accepts only GET", _ALLOW_GET)
        return
    request.plain(200, "ok")


class ReadyHandler:
    """
    C{GET /readyz}: 200 when every check passes, else 503; the body lists
    each check and its detail.
    """

    def __init__(self, checks: dict[str, Callable[[], tuple[bool, str]]]) -> None:
        self._checks = checks

    def __call__(self, request: Request) -> None:
        if request.method not in (b"GET", b"HEAD"):
            request.plain(405, f"{request.path.decode('latin-1')} accepts only GET", _ALLOW_GET)
            return
        lines = []
        ready = True
        for name, check in self._checks.items():
            try:
                ok, detail = check()
            except Exception as e:
                ok, detail = False, f"check failed: {e}"
            ready = ready and ok
            lines.append(f"[{'+' if ok else '-'}] {name}: {detail}")
        lines.append("ready" if ready else "not ready")
        request.plain(200 if ready else 503, "\n".join(lines))


def not_found(request: Request) -> None:
    """Any path the listener does not serve: a plain 404 naming those it does."""
    request.plain(404, SERVED)


def webhook_routes(
    admitter: Admitter,
    clock: IReactorTime,
    metrics: Metrics,
    ready_checks: dict[str, Callable[[], tuple[bool, str]]],
    recent: Optional[RecentDecisions] = None,
) -> dict[bytes, Handler]:
    """
    The listener's routes: C{/mutate}, C{/validate}, C{/healthz}, C{/readyz}.
    """
    return {
        b"/mutate": ReviewHandler(admitter, clock, metrics, validation=False, recent=recent),
        b"/validate": ReviewHandler(admitter, clock, metrics, validation=True, recent=recent),
        b"/healthz": health,
        b"/readyz": ReadyHandler(ready_checks),
    }
