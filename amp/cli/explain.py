"""
C{amp explain}: run amp's own review pipeline on one Pod and say what it
decided and why.

The Pod (or a workload's Pod template, see L{amp.cli.workloads}) becomes an
AdmissionReview, which goes through the daemon's own parts: the review
parser, the namespace source of the config (or the namespace the command
line describes), L{amp.admission.Admitter} with its route, allow-list,
failure policy and status stamp, L{amp.endpoint.EndpointClient} (a live
call, or the recorded reply of C{--reply} served in memory, see
L{amp.cli.replay}) and the patch checks.  Nothing here decides anything
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

import argparse
import base64
import dataclasses
import json
import os
import sys
import uuid
from dataclasses import dataclass, field
from typing import IO, Any, Mapping, Optional, Sequence

from twisted.application.service import Service
from twisted.internet.defer import Deferred, inlineCallbacks
from twisted.internet.threads import deferToThreadPool
from twisted.logger import ILogObserver, LogLevel, formatEvent
from zope.interface import implementer

from amp.admission import LEGACY_SKIPPED_ANNOTATION, STATUS_ANNOTATION, Admitter
from amp.breaker import BreakerRegistry
from amp.cli.replay import recorded_reply
from amp.cli.workloads import (
    InputError, PodInput, load_documents, names_namespace, pod_for, select_object, without_stamps)
from amp.config import Config, ConfigError, KubernetesConfig, load_config
from amp.deadline import Deadline, review_budget
from amp.endpoint import Connector, EndpointClient
from amp.files import INPUT_LIMIT, FileError, read_file, read_stream
from amp.hints import AmpKeys
from amp.metrics import Metrics
from amp.namespaces import UNKNOWN, CachedAnswer, INamespaceSource, NamespaceInfo, StaticNamespaceSource
from amp.patch import PatchError, check_patch
from amp.reasons import FAILURE_REASONS, Reason, Result
from amp.review import parse_review
from amp.trace import RecordedTrace, Step

__all__ = [
    "EXIT_ADMITTED", "EXIT_FAILURE_POLICY", "EXIT_USAGE", "EXIT_DENIED", "EXIT_NOT_IDEMPOTENT",
    "ExplainOptions", "Explanation", "Round", "UsageError", "exit_status", "explain", "run",
]

EXIT_ADMITTED = 0
EXIT_FAILURE_POLICY = 1
EXIT_USAGE = 2
EXIT_DENIED = 3
EXIT_NOT_IDEMPOTENT = 4

#: Annotations amp stamps on the Pods it reviews (left out when --twice
#: compares two rounds: they are amp's, not the endpoint's).
STAMP_ANNOTATIONS = frozenset((STATUS_ANNOTATION, LEGACY_SKIPPED_ANNOTATION))


class UsageError(Exception):
    """
    Bad usage or input: exit L{EXIT_USAGE} with this one-line message.
    """


# ---------------------------------------------------------------- options


@dataclass(frozen=True)
class ExplainOptions:
    """
    What to explain and how.

    @ivar config: amp's configuration (the defaults when no C{--config}).
    @ivar config_path: where it came from, for messages; None: defaults.
    @ivar labels: namespace labels to set (C{--set-label}), over the source's.
    @ivar annotations: namespace annotations to set (C{--set-annotation}).
    @ivar reply: the recorded endpoint reply (C{--reply}); None: call live.
    @ivar twice: review the admitted Pod again (C{--twice}).
    @ivar cluster: look the namespace up in the cluster (the config's
        source is not static, or there is no config and no C{--set-*}).
    """

    config: Config = field(default_factory=Config)
    config_path: Optional[str] = None
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    reply: Optional[bytes] = None
    reply_path: Optional[str] = None
    twice: bool = False
    cluster: bool = False


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
        self, inner: INamespaceSource, name: str, labels: Mapping[str, str], annotations: Mapping[str, str],
        where: str, cluster_policy: Optional[str] = None, keys: Optional[AmpKeys] = None,
    ) -> None:
        self._inner = inner
        self._keys = keys
        self._name = name
        self._labels = dict(labels)
        self._annotations = dict(annotations)
        self._where = where
        self._cluster_policy = cluster_policy
        self._known: CachedAnswer = UNKNOWN
        self.trace: Optional[RecordedTrace] = None

    @property
    def count(self) -> int:
        return 1

    def cached(self, name: str) -> CachedAnswer:
        if name != self._name:
            return self._inner.cached(name)
        if self._known is not UNKNOWN:
            return self._record(self._known, f"{self._where}, as in the first review")
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
        self._known = answer = self._merged(answer)
        return answer

    def _merged(self, answer: Any) -> Optional[NamespaceInfo]:
        if not (self._labels or self._annotations):
            return answer if isinstance(answer, NamespaceInfo) else None
        if isinstance(answer, NamespaceInfo):
            return dataclasses.replace(answer, labels={**answer.labels, **self._labels},
                                       annotations={**answer.annotations, **self._annotations})
        return NamespaceInfo(self._name, dict(self._labels), dict(self._annotations))

    def _record(self, answer: Optional[NamespaceInfo], where: str) -> Optional[NamespaceInfo]:
        if self.trace is not None:
            set_by = sorted([*(f"label {k}" for k in self._labels), *(f"annotation {k}" for k in self._annotations)])
            self.trace.record(
                Step.NAMESPACE, name=self._name, found=answer is not None, source=where,
                labels=dict(answer.labels) if answer is not None else {},
                annotations=dict(answer.annotations) if answer is not None else {},
                set_by_command_line=set_by,
                near_misses=self._keys.namespace_hints(answer) if answer is not None and self._keys else [])
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
    if source == "cluster" and not os.environ.get("KUBERNETES_SERVICE_HOST"):
        source = "kubeconfig"
    return dataclasses.replace(kube, source=source, per_review_get=True, webhook_configuration=None)


def _describe_cluster(kube: KubernetesConfig) -> str:
    if kube.source == "cluster":
        return "the cluster (in-cluster service account)"
    where = kube.kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
    return f"the cluster (kubeconfig {where}" + (f", context {kube.context})" if kube.context else ")")


def _webhook_policy(reactor: Any, kube: KubernetesConfig, name: str, webhook: Optional[str]) -> Deferred:
    """
    The C{failurePolicy} of amp's MutatingWebhookConfiguration C{name}
    (what C{failure_policy: auto} follows): one GET in the reactor's
    thread pool.  Fires with (policy or None, a note for the trace).
    """
    from amp.kube import load_client_configuration, webhook_failure_policy

    def get() -> tuple[Optional[str], str]:
        import kubernetes.client

        try:
            api = kubernetes.client.ApiClient(load_client_configuration(kube))
            adm = kubernetes.client.AdmissionregistrationV1Api(api)
            response = adm.read_mutating_webhook_configuration(
                name, _request_timeout=kube.request_timeout, _preload_content=False)
            policy = webhook_failure_policy(json.loads(response.data), webhook)
        except Exception as e:
            return None, f"MutatingWebhookConfiguration {name} could not be read: {_first_line(e)}"
        if policy is None:
            return None, f"MutatingWebhookConfiguration {name} has no webhook {webhook or ''}".rstrip()
        return policy, f"MutatingWebhookConfiguration {name}"

    return deferToThreadPool(reactor, reactor.getThreadPool(), get)


def _first_line(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0]


# ---------------------------------------------------------------- running


@implementer(ILogObserver)
class _LogLines:
    """
    amp's own log events (C{amp.*} namespaces, info and above), formatted.
    """

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, event: Mapping[str, Any]) -> None:
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
    meta = pod.get("metadata") if isinstance(pod.get("metadata"), dict) else {}
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
def _review(
    admitter: Admitter, clock: Any, source: ExplainedNamespace, log: _LogLines, pod: dict[str, Any],
    namespace: str, budget: float,
) -> Any:
    trace = RecordedTrace(clock.seconds)
    source.trace = trace
    start = len(log.lines)
    req = parse_review(_review_bytes(pod, namespace))
    body, outcome = yield admitter.review(req, Deadline.after(clock.seconds(), budget), trace=trace)
    answer = _decode(body)
    message = answer["message"] or answer["audit"].get("error", "")
    patch = answer["patch"]
    admitted = apply_answer_patch(pod, patch) if answer["allowed"] else None
    return Round(
        request_pod=pod, result=str(outcome.result), reason=str(outcome.reason), message=message,
        allowed=answer["allowed"], code=answer["code"], patch=patch, warnings=answer["warnings"],
        audit=answer["audit"], pod=admitted, endpoint=outcome.endpoint, trace=trace, log=log.lines[start:])


@inlineCallbacks
def explain(
    reactor: Any, options: ExplainOptions, pod_input: PodInput, *, connector: Optional[Connector] = None,
    log_publisher: Any = None, recorded: Optional[str] = None,
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
    inner: INamespaceSource
    if options.cluster:
        from amp.kube import KubernetesNamespaceSource

        kube = _cluster_kube(options)
        where = _describe_cluster(kube)
        inner = KubernetesNamespaceSource(kube, reactor=reactor, metrics=metrics)
        inner.startService()  # type: ignore[attr-defined]
        ok, detail = inner.readiness()
        if not ok:
            yield inner.stopService()  # type: ignore[attr-defined]
            raise UsageError(detail)
        full = config.kubernetes
        if config.failure_policy == "auto" and full.webhook_configuration:
            cluster_policy, policy_note = yield _webhook_policy(
                reactor, kube, full.webhook_configuration, full.webhook_name)
    elif options.config_path is not None and config.kubernetes.source == "static":
        inner = StaticNamespaceSource(config.kubernetes)
        where = f"kubernetes.namespaces of {options.config_path}"
    else:
        inner = StaticNamespaceSource(KubernetesConfig())
        where = "the command line"
    keys = AmpKeys(config.kubernetes)
    source = ExplainedNamespace(inner, namespace, options.labels, options.annotations, where, cluster_policy, keys)
    notes = keys.pod_hints(pod_input.pod)
    if pod_input.defaulted_namespace:
        notes.insert(0, f"no --namespace and {pod_input.source} names none: explained in namespace default")
    endpoint_client = EndpointClient(reactor, metrics, BreakerRegistry(reactor), connector=connector)
    admitter = Admitter(config, source, endpoint_client, reactor, metrics)
    deadline = config.deadline
    budget = review_budget(None, deadline.default_timeout, deadline.margin)
    log = _LogLines()
    if log_publisher is not None:
        log_publisher.addObserver(log)
    try:
        first = yield _review(admitter, reactor, source, log, pod_input.pod, namespace, budget)
        result = Explanation(pod_input, first, namespace_source=where, cluster_policy=policy_note,
                             twice=options.twice, recorded=recorded, notes=notes)
        if options.twice and first.pod is not None and first.result in (Result.PATCHED, Result.ALLOWED):
            second = yield _review(admitter, reactor, source, log, first.pod, namespace, budget)
            result.second = second
            if exit_status(second.result, second.reason) == EXIT_ADMITTED:
                stamps = STAMP_ANNOTATIONS | {str(e["key"]) for r in (first, second) for e in r.trace.steps(Step.STAMP)}
                result.idempotent = without_stamps(second.pod, stamps) == without_stamps(first.pod, stamps)
        return result
    finally:
        if log_publisher is not None:
            log_publisher.removeObserver(log)
        yield endpoint_client.close()
        if options.cluster:
            yield inner.stopService()  # type: ignore[attr-defined]


# ---------------------------------------------------------------- the command line


class _Exit(Exception):
    def __init__(self, status: int) -> None:
        self.status = status


class _Parser(argparse.ArgumentParser):
    """
    argparse that reports a usage error as one line (L{UsageError}) and
    writes help to the given stream instead of exiting the process.
    """

    def __init__(self, *args: Any, out: IO[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.out = out

    def error(self, message: str) -> Any:  # type: ignore[override]
        raise UsageError(f"{message} (see amp explain --help)")

    def print_help(self, file: Optional[IO[str]] = None) -> None:
        (file or self.out).write(self.format_help())

    def exit(self, status: int = 0, message: Optional[str] = None) -> Any:  # type: ignore[override]
        if message:
            raise UsageError(message.strip())
        raise _Exit(status)


DESCRIPTION = """\
Review one Pod with amp's own pipeline and say what amp would do and why:
the namespace, the endpoint and the allow-list, the failure policy, the
call, every patch operation, repair and check, the answer and the status
stamp, then the Pod before and after as a YAML diff.

FILE (or - for stdin) holds a Pod, or a Deployment, StatefulSet, DaemonSet,
ReplicaSet, Job or CronJob whose Pod template is reviewed as the Pod its
controller would create (YAML or JSON).

The namespace comes from amp's config (--config): its static namespaces, or
the cluster through the kubeconfig (one GET).  --set-label and
--set-annotation set the namespace's labels and annotations over that; with
no --config they describe the whole namespace, and no cluster is needed.
"""

EPILOG = """\
exit status:
  0  admitted as the endpoint intended (patched, allowed, or amp does not act)
  1  the failure policy decided (ignored, failed: denied because of a failure, or
     a chain patched without a failed endpoint's patch)
  2  bad usage or input
  3  the endpoint denied the Pod
  4  with --twice: a second review would change the Pod again (not idempotent);
     a second review that fails or is denied exits 1 or 3

example:
  amp explain deploy.yaml -n team-a --config etc/amp.yaml
  amp explain pod.yaml -n team-a --reply reply.json -o json \\
      --set-label amp.txn2.com/enabled=true \\
      --set-annotation amp.txn2.com/ep=http://injector.tools.svc:8080/mutate
"""


def _parser(out: IO[str]) -> _Parser:
    p = _Parser(prog="amp explain", description=DESCRIPTION, epilog=EPILOG, out=out,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", metavar="FILE", help="the Pod or workload, YAML or JSON; - reads stdin")
    p.add_argument("-n", "--namespace", help="the namespace (default: the object's own, else default)")
    p.add_argument("--config", metavar="FILE", help="amp's configuration (default: amp's defaults)")
    p.add_argument("--set-label", metavar="KEY=VALUE", action="append", default=[],
                   help="set a label of the namespace (repeatable)")
    p.add_argument("--set-annotation", metavar="KEY=VALUE", action="append", default=[],
                   help="set an annotation of the namespace (repeatable)")
    p.add_argument("--reply", metavar="FILE",
                   help="use this recorded endpoint reply (a JSON array of operations or the reply object) "
                        "instead of calling the endpoint")
    p.add_argument("--twice", action="store_true",
                   help="review the admitted Pod again, as the API server does when it reinvokes amp, and "
                        "report whether that changes it (idempotency); the status stamp tells both reviews")
    p.add_argument("-o", "--output", choices=("text", "json"), default="text", help="output format")
    return p


def _pairs(values: Sequence[str], flag: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for value in values:
        key, sep, v = value.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"{flag}: expected KEY=VALUE, got {value!r}")
        out[key.strip()] = v
    return out


def _read(path: str, what: str, stdin: Any) -> bytes:
    """
    The file at C{path} (C{-}: standard input), within
    L{amp.files.INPUT_LIMIT}.
    """
    try:
        if path == "-":
            return read_stream(stdin, f"{what} stdin", INPUT_LIMIT)
        return read_file(path, f"{what} {path}", INPUT_LIMIT)[0]
    except FileError as e:
        raise UsageError(str(e)) from None


def parse_command_line(argv: Sequence[str], stdin: Any, stdout: IO[str]) -> tuple[ExplainOptions, PodInput, str]:
    """
    Parse C{argv} (after C{explain}) and read the files it names: the
    options, the Pod to review and the output format.

    @raise UsageError: bad usage or input.
    """
    args = _parser(stdout).parse_args(list(argv))
    labels = _pairs(args.set_label, "--set-label")
    annotations = _pairs(args.set_annotation, "--set-annotation")
    config = Config()
    if args.config is not None:
        try:
            config = load_config(args.config)
        except ConfigError as e:
            raise UsageError(f"config {args.config}: {e}") from None
    reply = _read(args.reply, "reply", stdin) if args.reply is not None else None
    if args.reply == "-" and args.file == "-":
        raise UsageError("FILE and --reply cannot both be stdin")
    name = "stdin" if args.file == "-" else args.file
    data = _read(args.file, "input", stdin)
    try:
        obj = select_object(load_documents(data, name), name)
        pod_input = pod_for(obj, args.namespace)
        if args.namespace is None and not names_namespace(obj):
            pod_input = dataclasses.replace(pod_input, defaulted_namespace=True)
    except InputError as e:
        raise UsageError(str(e)) from None
    if args.config is not None:
        cluster = config.kubernetes.source != "static"
    else:
        cluster = not (labels or annotations)
    options = ExplainOptions(config=config, config_path=args.config, labels=labels, annotations=annotations,
                             reply=reply, reply_path=args.reply, twice=args.twice, cluster=cluster)
    return options, pod_input, args.output


@inlineCallbacks
def run(
    argv: Sequence[str], reactor: Any, *, stdin: Any = None, stdout: Optional[IO[str]] = None,
    stderr: Optional[IO[str]] = None, log_publisher: Any = None, connector: Optional[Connector] = None,
) -> Any:
    """
    C{amp explain ARGV}: explain, print, and fire with the exit status.
    Bad usage or input prints one line on C{stderr} and fires with
    L{EXIT_USAGE}.

    @param connector: the connect endpoints for the endpoint calls
        instead of amp's own (tests; C{--reply} brings its own).
    """
    from amp.cli.report import render_json, render_text

    stdin = stdin if stdin is not None else sys.stdin
    stdout = stdout if stdout is not None else sys.stdout
    stderr = stderr if stderr is not None else sys.stderr
    try:
        options, pod_input, output = parse_command_line(argv, stdin, stdout)
        if options.reply is not None:
            connector = recorded_reply(options.reply)
        explanation = yield explain(reactor, options, pod_input, connector=connector, log_publisher=log_publisher,
                                    recorded=options.reply_path)
    except _Exit as e:
        return e.status
    except UsageError as e:
        stderr.write(f"amp explain: {e}\n")
        return EXIT_USAGE
    stdout.write(render_json(explanation) if output == "json" else render_text(explanation))
    stdout.flush()
    return explanation.exit_status
