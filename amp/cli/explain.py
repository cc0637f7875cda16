"""
C{amp explain}: run amp's own review pipeline on one Pod and say what it
decided and why.

The Pod (or a workload's Pod template, see L{amp.cli.workloads}) becomes an
AdmissionReview, which goes through the daemon's own parts: the review
parser, the namespace source of the config (or the namespace the command
line describes), L{amp.admission.Admitter} with its route, allow-list,
failure policy and status stamp, L{amp.endpoint.EndpointClient} (a live
call, or the recorded reply of C{--reply} served in memory, see
L{amp.cli.recorded_reply}) and the patch checks.  Nothing here decides anything
about the review: it collects the decisions (L{amp.trace}), the answer and
amp's log lines, and prints them.

Exit statuses: L{EXIT_ADMITTED} when the Pod is admitted as the endpoint
intended (patched, allowed, or amp does not act on it),
L{EXIT_FAILURE_POLICY} when a failure was decided by the failure policy,
L{EXIT_DENIED} when the endpoint denied the Pod, L{EXIT_USAGE} for bad
usage or input (one line on stderr), L{EXIT_NOT_IDEMPOTENT} when
C{--twice} finds that a second review would change the Pod again (a second
review that fails or is denied exits as the failure or the deny).

L{explain} is the library entry (the reactor passed in); L{run} parses a
command line and prints; only L{main} reaches for the global reactor.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import sys
import uuid
from typing import IO, TYPE_CHECKING, Any, Mapping, Optional, Protocol, Sequence, cast

from twisted.application.service import Service
from twisted.internet.defer import Deferred, inlineCallbacks
from twisted.internet.interfaces import IReactorTime
from twisted.internet.threads import deferToThreadPool
from twisted.logger import ILogObserver, LogEvent, LogLevel, formatEvent
from zope.interface import implementer

from amp import rules
from amp.admission import Admitter
from amp.admission_review import parse_review
from amp.breaker import BreakerRegistry
from amp.cli._command_line import Exit, ExplainOptions, UsageError, command_line_parser, parse_command_line
from amp.cli._explanation import (
    EXIT_ADMITTED,
    EXIT_DENIED,
    EXIT_FAILURE_POLICY,
    EXIT_NOT_IDEMPOTENT,
    EXIT_USAGE,
    Explanation,
    Round,
    exit_status,
)
from amp.cli.recorded_reply import recorded_reply
from amp.cli.report import render_json, render_text
from amp.cli.workloads import PodInput, without_stamps
from amp.config import Config, KubernetesConfig
from amp.deadline import Deadline, review_budget
from amp.endpoint import Connector, EndpointClient
from amp.hints import AmpKeys
from amp.metrics import Metrics
from amp.namespaces import UNKNOWN, CachedAnswer, INamespaceSource, NamespaceInfo, StaticNamespaceSource
from amp.patch import PatchError, check_patch
from amp.podjson import json_object
from amp.reasons import FailurePolicy, NamespaceSource, Result
from amp.text import terminal
from amp.trace import NO_TRACE, IReviewTrace, NamespaceFound, RecordedTrace, Stamped
from amp.tracing import Ids, ReviewSpans, Tracing

if TYPE_CHECKING:
    from amp.reactors import IAmpReactor

__all__ = [
    "EXIT_ADMITTED",
    "EXIT_FAILURE_POLICY",
    "EXIT_USAGE",
    "EXIT_DENIED",
    "EXIT_NOT_IDEMPOTENT",
    "ExplainOptions",
    "Explanation",
    "Round",
    "UsageError",
    "command_line_parser",
    "exit_status",
    "explain",
    "parse_command_line",
    "review_round",
    "run",
]

#: Annotations amp stamps on the Pods it reviews (left out when --twice
#: compares two rounds: they are amp's, not the endpoint's).
STAMP_ANNOTATIONS = frozenset(rules.STAMP_ANNOTATIONS)


# ---------------------------------------------------------------- the namespace


@implementer(INamespaceSource)
class ExplainedNamespace(Service):
    """
    The namespace source of one explanation: C{inner} (amp's static or
    Kubernetes source) with the command line's labels and annotations set
    over what it answers for C{name}.  The first answer is kept, so a
    second round does not look the namespace up again.  Each answer is
    recorded in C{trace} (a C{namespace} step).
    """

    def __init__(
        self,
        inner: INamespaceSource,
        name: str,
        labels: Mapping[str, str],
        annotations: Mapping[str, str],
        where: str,
        cluster_policy: Optional[str] = None,
        keys: Optional[AmpKeys] = None,
    ) -> None:
        self._inner = inner
        self._keys = keys
        self._name = name
        self._labels = dict(labels)
        self._annotations = dict(annotations)
        self._where = where
        self._cluster_policy = cluster_policy
        self._known: CachedAnswer = UNKNOWN
        self.trace: IReviewTrace = NO_TRACE

    @property
    def count(self) -> int:
        return 1

    def cached(self, name: str) -> CachedAnswer:
        if name != self._name:
            return self._inner.cached(name)
        known = self._known
        if known is None or isinstance(known, NamespaceInfo):
            return self._record(known, f"{self._where}, as in the first review")
        answer = self._inner.cached(name)
        if answer is UNKNOWN:
            return UNKNOWN
        return self._record(self._overlay(answer), self._where)

    def fetch(self, name: str, timeout: float) -> "Deferred[Optional[NamespaceInfo]]":
        d = self._inner.fetch(name, timeout)
        if name == self._name:
            d.addCallback(lambda answer: self._record(self._overlay(answer), self._where + " (one GET)"))
        return d

    def readiness(self) -> tuple[bool, str]:
        return self._inner.readiness()

    def cluster_failure_policy(self) -> Optional[str]:
        return self._cluster_policy

    def _overlay(self, answer: Any) -> Optional[NamespaceInfo]:
        merged = self._merged(answer)
        self._known = merged
        return merged

    def _merged(self, answer: Any) -> Optional[NamespaceInfo]:
        if not (self._labels or self._annotations):
            return answer if isinstance(answer, NamespaceInfo) else None
        if isinstance(answer, NamespaceInfo):
            return dataclasses.replace(
                answer,
                labels={**answer.labels, **self._labels},
                annotations={**answer.annotations, **self._annotations},
            )
        return NamespaceInfo(self._name, dict(self._labels), dict(self._annotations))

    def _record(self, answer: Optional[NamespaceInfo], where: str) -> Optional[NamespaceInfo]:
        set_by = sorted([*(f"label {k}" for k in self._labels), *(f"annotation {k}" for k in self._annotations)])
        self.trace.record(
            NamespaceFound,
            name=self._name,
            found=answer is not None,
            source=where,
            labels=dict(answer.labels) if answer is not None else {},
            annotations=dict(answer.annotations) if answer is not None else {},
            set_by_command_line=set_by,
            near_misses=self._keys.namespace_hints(answer) if answer is not None and self._keys else [],
        )
        return answer


def _cluster_kube(options: ExplainOptions) -> KubernetesConfig:
    """
    The C{kubernetes} section to look namespaces up in the cluster with:
    one GET per lookup (no watch), and outside a Pod the kubeconfig
    (C{$KUBECONFIG} or C{~/.kube/config}) in place of the in-cluster
    service account.
    """
    kube = options.config.kubernetes
    source = kube.source
    if source == NamespaceSource.CLUSTER and not os.environ.get("KUBERNETES_SERVICE_HOST"):
        source = NamespaceSource.KUBECONFIG
    return dataclasses.replace(kube, source=source, per_review_get=True, webhook_configuration=None)


def _describe_cluster(kube: KubernetesConfig) -> str:
    if kube.source == NamespaceSource.CLUSTER:
        return "the cluster (in-cluster service account)"
    where = kube.kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
    return f"the cluster (kubeconfig {where}" + (f", context {kube.context})" if kube.context else ")")


def _webhook_policy(
    reactor: IAmpReactor, kube: KubernetesConfig, name: str, webhook: Optional[str]
) -> Deferred[tuple[Optional[str], str, Any]]:
    """
    The C{failurePolicy} of amp's MutatingWebhookConfiguration C{name}
    (what C{failure_policy: auto} follows): one GET in the reactor's
    thread pool.  Fires with (policy or None, a note for the trace, the
    configuration: None when it does not exist, L{_UNREAD} when it could
    not be read).
    """
    from amp.kube import load_client_configuration, webhook_failure_policy

    def get() -> tuple[Optional[str], str, Any]:
        import kubernetes.client
        import urllib3

        try:
            api = kubernetes.client.ApiClient(load_client_configuration(kube))
            adm = kubernetes.client.AdmissionregistrationV1Api(api)
            # _preload_content=False: the raw urllib3 response, not the model the client's annotation names.
            response = cast(
                urllib3.BaseHTTPResponse,
                adm.read_mutating_webhook_configuration(
                    name, _request_timeout=kube.request_timeout, _preload_content=False
                ),
            )
            obj = json.loads(response.data)
            policy = webhook_failure_policy(obj, webhook)
        except Exception as e:
            missing = getattr(e, "status", None) == 404
            return (
                None,
                f"MutatingWebhookConfiguration {name} could not be read: {_first_line(e)}",
                (None if missing else _UNREAD),
            )
        if policy is None:
            return None, f"MutatingWebhookConfiguration {name} has no webhook {webhook or ''}".rstrip(), obj
        return policy, f"MutatingWebhookConfiguration {name}", obj

    return deferToThreadPool(reactor, reactor.getThreadPool(), get)


#: The webhook configuration could not be read (so it is not judged).
_UNREAD = object()


def registration_notes(config: Config, obj: Any) -> list[str]:
    """The registration's problems (L{amp.registration.check}), as C{amp explain}'s notes."""
    if obj is _UNREAD:
        return []
    from amp.registration import check, needs

    return [f"registration: {problem}" for problem in check(obj, needs(config))]


def _first_line(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0]


# ---------------------------------------------------------------- running


class CollectedLines(Protocol):
    """Where amp's log lines are collected, for L{review_round}."""

    @property
    def lines(self) -> list[str]:
        """The lines so far, oldest first."""


@implementer(ILogObserver)
class _LogLines:
    """
    amp's own log events (C{amp.*} namespaces, info and above), formatted.
    """

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, event: LogEvent) -> None:
        namespace = str(event.get("log_namespace", ""))
        level = event.get("log_level")
        if not namespace.startswith("amp.") or level is None or level < LogLevel.info:
            return
        if "factory" in event:
            # A connection factory's start and stop notices, not a decision.
            return
        text = formatEvent(event)
        if event.get("log_failure") is not None:
            text += f": {event['log_failure'].getErrorMessage()}"
        self.lines.append(f"{level.name}: {text}")


def _review_bytes(pod: dict[str, Any], namespace: str, dry_run: bool = True) -> bytes:
    """
    The AdmissionReview the API server would send for creating C{pod}.
    """
    meta = json_object(pod.get("metadata"))
    request = {
        "uid": str(uuid.uuid4()),
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
        "requestResource": {"group": "", "version": "v1", "resource": "pods"},
        "name": meta.get("name") or "",
        "namespace": namespace,
        "operation": "CREATE",
        "userInfo": {"username": "amp-explain"},
        "object": pod,
        "oldObject": None,
        "dryRun": dry_run,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
    }
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    return json.dumps(review).encode("utf-8")


def apply_answer_patch(pod: dict[str, Any], patch: list[dict[str, Any]]) -> dict[str, Any]:
    """
    C{pod} with the patch amp answered applied, by amp's own patch code
    (with no path refused: the patch passed amp's checks already).
    """
    if not patch:
        return pod
    try:
        return check_patch(pod, patch, denied=(), repair=False, max_operations=len(patch)).pod
    except PatchError as e:
        raise RuntimeError(f"amp's answer does not apply to the Pod: {e}") from None


def _decode(body: bytes) -> dict[str, Any]:
    response = json.loads(body)["response"]
    patch = json.loads(base64.b64decode(response["patch"])) if response.get("patch") else []
    status = response.get("status") or {}
    return {
        "allowed": bool(response.get("allowed")),
        "patch": patch,
        "warnings": list(response.get("warnings") or ()),
        "audit": dict(response.get("auditAnnotations") or {}),
        "message": str(status.get("message") or ""),
        "code": status.get("code"),
    }


@inlineCallbacks
def review_round(
    admitter: Admitter,
    clock: IReactorTime,
    source: ExplainedNamespace,
    log: CollectedLines,
    pod: dict[str, Any],
    namespace: str,
    budget: float,
    tracing: Optional[Tracing] = None,
) -> Any:
    """
    One review of C{pod} in C{namespace} through C{admitter}; fires with
    its L{Round} (C{log}: where amp's log lines are being collected).
    """
    trace = RecordedTrace(clock.seconds)
    source.trace = trace
    start = len(log.lines)
    req = parse_review(_review_bytes(pod, namespace))
    # A trace of its own: the endpoint is sent its traceparent, and an
    # endpoint that traces can be found by the trace id printed.
    ids = Ids()
    started = clock.seconds()
    spans = ReviewSpans(ids, None, ids.trace_id(), started)
    body, outcome = yield admitter.review(req, Deadline.after(started, budget), trace=trace, spans=spans)
    if tracing is not None:
        from amp.web import review_attributes, review_error

        tracing.finish(
            spans, clock.seconds(), review_attributes(req, outcome, False, spans.stamp), review_error(outcome)
        )
    answer = _decode(body)
    message = answer["message"] or answer["audit"].get("error", "")
    patch = answer["patch"]
    admitted = apply_answer_patch(pod, patch) if answer["allowed"] else None
    return Round(
        request_pod=pod,
        result=str(outcome.result),
        reason=str(outcome.reason),
        message=message,
        allowed=answer["allowed"],
        code=answer["code"],
        patch=patch,
        warnings=answer["warnings"],
        audit=answer["audit"],
        pod=admitted,
        endpoint=outcome.endpoint,
        trace=trace,
        log=log.lines[start:],
        trace_id=spans.trace_hex,
    )


@inlineCallbacks
def explain(
    reactor: IAmpReactor,
    options: ExplainOptions,
    pod_input: PodInput,
    *,
    connector: Optional[Connector] = None,
    log_publisher: Any = None,
    recorded: Optional[str] = None,
) -> Any:
    """
    Review C{pod_input} as amp would; fires with an L{Explanation}.

    @param reactor: for the endpoint client, the timers and, when the
        namespace comes from the cluster, the thread pool of its GET.
    @param connector: the connect endpoints the endpoint client uses
        instead of its own (C{--reply} passes the recorded reply's).
    @param log_publisher: where amp's log events go (the global publisher
        under the console script); they are collected while reviewing.
    @param recorded: where the reply C{connector} serves was recorded (for the
        trace), when it is a recorded reply.
    """
    config = options.config
    metrics = Metrics()
    namespace = pod_input.namespace
    cluster_policy: Optional[str] = None
    policy_note = ""
    cluster_notes: list[str] = []
    inner: INamespaceSource
    if options.cluster:
        from amp.kube import KubernetesNamespaceSource

        kube = _cluster_kube(options)
        where = _describe_cluster(kube)
        inner = KubernetesNamespaceSource(kube, reactor=reactor, metrics=metrics)
        inner.startService()
        ok, detail = inner.readiness()
        if not ok:
            yield inner.stopService()
            raise UsageError(detail)
        full = config.kubernetes
        if full.webhook_configuration:
            policy, note, registration = yield _webhook_policy(
                reactor, kube, full.webhook_configuration, full.webhook_name
            )
            if config.failure_policy == FailurePolicy.AUTO:
                cluster_policy, policy_note = policy, note
            cluster_notes = registration_notes(config, registration)
    elif options.config_path is not None and config.kubernetes.source == NamespaceSource.STATIC:
        inner = StaticNamespaceSource(config.kubernetes)
        where = f"kubernetes.namespaces of {options.config_path}"
    else:
        inner = StaticNamespaceSource(KubernetesConfig())
        where = "the command line"
    keys = AmpKeys(config.kubernetes)
    source = ExplainedNamespace(inner, namespace, options.labels, options.annotations, where, cluster_policy, keys)
    notes = keys.pod_hints(pod_input.pod) + cluster_notes
    if pod_input.defaulted_namespace:
        notes.insert(0, f"no --namespace and {pod_input.source} names none: explained in namespace default")
    endpoint_client = EndpointClient(reactor, metrics, BreakerRegistry(reactor), connector=connector)
    admitter = Admitter(config, source, endpoint_client, reactor, metrics)
    deadline = config.deadline
    budget = review_budget(None, deadline.default_timeout, deadline.margin)
    log = _LogLines()
    if log_publisher is not None:
        log_publisher.addObserver(log)
    # With tracing on in the config, the review's spans are exported as the daemon's are.
    tracing = Tracing(config.tracing, reactor, lambda count, reason: None) if config.tracing.enabled else None
    try:
        first = yield review_round(admitter, reactor, source, log, pod_input.pod, namespace, budget, tracing)
        result = Explanation(
            pod_input,
            first,
            namespace_source=where,
            cluster_policy=policy_note,
            twice=options.twice,
            recorded=recorded,
            notes=notes,
        )
        if options.twice and first.pod is not None and first.result in (Result.PATCHED, Result.ALLOWED):
            second = yield review_round(admitter, reactor, source, log, first.pod, namespace, budget, tracing)
            result.second = second
            if exit_status(second.result, second.reason) == EXIT_ADMITTED:
                stamps = STAMP_ANNOTATIONS | {e.key for r in (first, second) for e in r.trace.of(Stamped)}
                result.idempotent = without_stamps(second.pod, stamps) == without_stamps(first.pod, stamps)
        return result
    finally:
        if log_publisher is not None:
            log_publisher.removeObserver(log)
        yield endpoint_client.close()
        if tracing is not None:
            yield tracing.stopService()
        if options.cluster:
            yield inner.stopService()


@inlineCallbacks
def run(
    argv: Sequence[str],
    reactor: IAmpReactor,
    *,
    stdin: Any = None,
    stdout: Optional[IO[str]] = None,
    stderr: Optional[IO[str]] = None,
    log_publisher: Any = None,
    connector: Optional[Connector] = None,
) -> Any:
    """
    C{amp explain ARGV}: explain, print, and fire with the exit status.
    Bad usage or input prints one line on C{stderr} and fires with
    L{EXIT_USAGE}.

    @param connector: the connect endpoints for the endpoint calls
        instead of amp's own (tests; C{--reply} brings its own).
    """
    stdin = stdin if stdin is not None else sys.stdin
    stdout = stdout if stdout is not None else sys.stdout
    stderr = stderr if stderr is not None else sys.stderr
    try:
        options, pod_input, output = parse_command_line(argv, stdin, stdout)
        if options.reply is not None:
            connector = recorded_reply(options.reply)
        explanation = yield explain(
            reactor, options, pod_input, connector=connector, log_publisher=log_publisher, recorded=options.reply_path
        )
    except Exit as e:
        return e.status
    except UsageError as e:
        stderr.write(f"amp explain: {terminal(e)}\n")
        return EXIT_USAGE
    stdout.write(render_json(explanation) if output == "json" else render_text(explanation))
    stdout.flush()
    return explanation.exit_status
