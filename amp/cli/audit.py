"""
C{amp audit}: is the fleet up to date with its endpoints?

For each namespace amp manages (or those named), the audit reads the
workloads (Deployments, StatefulSets, DaemonSets, Jobs, CronJobs, and
ReplicaSets and Jobs without an owner), then the Pods page by page; each
Pod is put with its workload (L{amp.cli.audit_owners}), the workload's
template goes once through amp's own pipeline
(L{amp.cli.audit_pipeline}, the code of C{amp explain}), and each Pod is
judged against it (L{amp.cli.audit_judge}) on the places the endpoints
decide.  Bare Pods are judged against their recorded review
(C{--recordings}), else reported C{unknown}.

Read-only in the cluster (lists only); the endpoint calls are paced by
their own concurrency and rate.  L{audit} is the library entry (the
reactor and the cluster's lists passed in); L{run} parses the command line
and prints; only the console script reaches for the global reactor.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from typing import IO, TYPE_CHECKING, Any, Callable, Optional, Sequence

from twisted.internet.defer import gatherResults, inlineCallbacks
from twisted.internet.threads import deferToThreadPool

from amp import rules
from amp.cli._command_line import Exit, UsageError, _Parser
from amp.cli.audit_cluster import ClusterError, PagedLists, kube_getter
from amp.cli.audit_judge import (
    EXIT_USAGE,
    PodAudit,
    Prediction,
    WorkloadAudit,
    exit_status,
    judge_pod,
    needs_prediction,
    running,
)
from amp.cli.audit_output import render_json, render_policy_reports, render_table
from amp.cli.audit_owners import Owners, WorkloadKey, controller_of
from amp.cli.audit_pipeline import TemplatePipeline
from amp.config import Config, ConfigError, KubernetesConfig, StaticNamespace, command_config
from amp.endpoint import Connector
from amp.namespaces import StaticNamespaceSource
from amp.podjson import json_object
from amp.reasons import Mode, NamespaceSource
from amp.text import terminal

if TYPE_CHECKING:
    from amp.reactors import IAmpReactor

__all__ = ["AuditOptions", "AuditRun", "audit", "run"]

#: The kinds listed before the Pods, parents first: a ReplicaSet or Job
#: whose parent was listed keeps no template of its own.
_WORKLOAD_KINDS = ("Deployment", "CronJob", "StatefulSet", "DaemonSet", "ReplicaSet", "Job")


@dataclasses.dataclass(frozen=True)
class AuditOptions:
    config: Config = dataclasses.field(default_factory=Config)
    namespaces: tuple[str, ...] = ()
    concurrency: int = 4
    rate: int = 10
    page_size: int = 500
    recordings: Optional[str] = None
    output: str = "table"
    verbose: bool = False


@dataclasses.dataclass
class AuditRun:
    """What an audit found, and what it cost."""

    workloads: list[WorkloadAudit]
    notes: list[str]
    endpoint_calls: int = 0
    templates: int = 0
    pods: int = 0

    @property
    def exit_status(self) -> int:
        return exit_status(self.workloads)


class Progress:
    """A one-line progress indicator on a terminal (C{stream}); nothing elsewhere."""

    def __init__(self, stream: Optional[IO[str]]) -> None:
        self._stream = stream if stream is not None and _isatty(stream) else None

    def show(self, text: str) -> None:
        if self._stream is not None:
            self._stream.write("\r\x1b[K" + text)
            self._stream.flush()

    def done(self) -> None:
        if self._stream is not None:
            self._stream.write("\r\x1b[K")
            self._stream.flush()


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def _audited_namespaces(
    listed: list[dict[str, Any]], wanted: tuple[str, ...], kube: KubernetesConfig, notes: list[str]
) -> dict[str, StaticNamespace]:
    """The namespaces to audit, from the enabled ones listed, with a note for each one named and passed over."""
    protected = rules.protected_namespaces(kube)
    enabled: dict[str, StaticNamespace] = {}
    for ns in listed:
        meta = json_object(ns.get("metadata"))
        name = meta.get("name")
        if isinstance(name, str):
            labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
            annotations = {str(k): str(v) for k, v in (meta.get("annotations") or {}).items()}
            enabled[name] = StaticNamespace(labels, annotations)
    out: dict[str, StaticNamespace] = {}
    for name in wanted or sorted(enabled):
        info = enabled.get(name)
        if info is None:
            notes.append(f"namespace {terminal(name)}: not enabled for amp ({kube.enabled_label}), passed over")
        elif name in protected:
            notes.append(f"namespace {terminal(name)}: protected (amp never changes its Pods), passed over")
        elif info.annotations.get(kube.mode_annotation) == Mode.SHADOW:
            notes.append(f"namespace {terminal(name)}: in shadow mode (amp changes and stamps nothing), passed over")
        else:
            out[name] = info
    return out


@inlineCallbacks
def audit(
    reactor: IAmpReactor,
    options: AuditOptions,
    lists: PagedLists,
    *,
    connector: Optional[Connector] = None,
    progress: Optional[Progress] = None,
    where: str = "the cluster",
    read_recordings: Optional[Callable[[str], Any]] = None,
    blocking: Optional[Callable[..., Any]] = None,
) -> Any:
    """
    Audit the namespaces of C{options}; fires with an L{AuditRun}.

    @param lists: the cluster's lists, paged.
    @param connector: the connect endpoints for the endpoint calls instead of amp's own (tests).
    @param read_recordings: reads a recording directory (blocking) into the bare Pods' recorded Pods.
    @param blocking: runs a blocking call off the reactor thread, a Deferred
        of its result (default: the reactor's thread pool).
    """
    config = options.config
    kube = config.kubernetes
    progress = progress or Progress(None)
    notes: list[str] = []
    listed = yield lists.all_items("Namespace", None, f"{kube.enabled_label}={kube.enabled_value}")
    namespaces = _audited_namespaces(listed, options.namespaces, kube, notes)
    if blocking is None:
        blocking = lambda f, *a: deferToThreadPool(reactor, reactor.getThreadPool(), f, *a)  # noqa: E731
    recorded: dict[tuple[str, str], dict[str, Any]] = {}
    if options.recordings is not None and read_recordings is not None:
        recorded, problems = yield blocking(read_recordings, options.recordings)
        notes.extend(problems[:20])
    source = StaticNamespaceSource(dataclasses.replace(kube, namespaces=namespaces))
    pipeline = TemplatePipeline(
        reactor, config, source, where=where, concurrency=options.concurrency, rate=options.rate, connector=connector
    )
    result = AuditRun([], notes)
    try:
        for namespace in namespaces:
            done = yield _audit_namespace(namespace, lists, pipeline, kube, recorded, result, progress, blocking)
            result.workloads.extend(done)
    finally:
        progress.done()
        yield pipeline.close()
    result.endpoint_calls = pipeline.calls
    result.templates = pipeline.templates
    return result


@inlineCallbacks
def _audit_namespace(
    namespace: str,
    lists: PagedLists,
    pipeline: TemplatePipeline,
    kube: KubernetesConfig,
    recorded: dict[tuple[str, str], dict[str, Any]],
    result: AuditRun,
    progress: Progress,
    blocking: Callable[..., Any],
) -> Any:
    owners = Owners(namespace)
    templates: dict[tuple[str, str], dict[str, Any]] = {}
    parents: set[tuple[str, str]] = set()
    for kind in _WORKLOAD_KINDS:
        items = yield lists.all_items(kind, namespace)
        owners.add(kind, items)
        for obj in items:
            name = obj["metadata"].get("name")
            if kind in ("Deployment", "CronJob"):
                parents.add((kind, name))
            if controller_of(obj) not in parents:
                templates[(kind, name)] = obj
    workloads: dict[WorkloadKey, WorkloadAudit] = {}
    predictions: dict[WorkloadKey, Any] = {}

    def predict(key: WorkloadKey) -> Any:
        if key.kind == "Pod":
            pod = recorded.get((namespace, key.name))
            if pod is None:
                return None
            return pipeline.predict_pod(namespace, pod, f"Pod {key.name}'s recorded review")
        obj = templates.get((key.kind, key.name))
        if obj is None:  # listed as an owner but without a template kept (cannot happen for known kinds)
            return Prediction(None, error=f"{key.kind} {key.name} was not listed")
        return pipeline.predict_workload(namespace, obj)

    @inlineCallbacks
    def on_page(pods: list[dict[str, Any]]) -> Any:
        page = [(pod, owners.workload_of(pod)) for pod in pods if running(pod)]
        waiting = []
        for pod, key in page:
            if key not in predictions and needs_prediction(pod, kube):
                predictions[key] = d = predict(key)
                if d is not None and not isinstance(d, Prediction):
                    waiting.append(d.addCallback(lambda p, key=key: predictions.__setitem__(key, p)))
        if waiting:
            yield gatherResults(waiting, consumeErrors=True)
        known = {key: p for key, p in predictions.items() if isinstance(p, Prediction)}
        # Comparing is CPU: off the reactor thread, which may be answering reviews.
        judged = yield blocking(_judge_page, page, known, kube)
        for key, audited in judged:
            w = workloads.get(key)
            if w is None:
                w = workloads[key] = WorkloadAudit(key)
            if w.prediction is None:
                w.prediction = known.get(key)
            w.pods.append(audited)
            result.pods += 1
        progress.show(
            f"amp audit: namespace {terminal(namespace, 60)}: {result.pods} Pods, "
            f"{pipeline.templates} templates, {pipeline.calls} endpoint calls"
        )

    yield lists.each_page("Pod", namespace, on_page)
    return sorted(workloads.values(), key=lambda w: w.key)


def _judge_page(
    page: list[tuple[dict[str, Any], WorkloadKey]], predictions: dict[WorkloadKey, Prediction], kube: KubernetesConfig
) -> list[tuple[WorkloadKey, PodAudit]]:
    """Each Pod of a page judged (pure; run in a thread)."""
    return [(key, judge_pod(pod, predictions.get(key), kube)) for pod, key in page]


# ---------------------------------------------------------------- the command


DESCRIPTION = """\
Find the running Pods whose mutation is stale, missing or failed.

For each namespace amp manages (or those named with -n), each workload's Pod
template (Deployment, StatefulSet, DaemonSet, Job, CronJob, a ReplicaSet
without a Deployment) goes once through amp's own pipeline against the
endpoints configured now, as amp explain does, and each running Pod is
compared with it only on the places the endpoints' patch touches: fields
the API server or other admission plugins set never count.

Each Pod is current, stale (each differing place: now -> what the endpoint
would give), never-mutated (no amp stamp), failed (stamped skipped),
opted-out, or unknown (a bare Pod with no recorded review, --recordings);
each workload that needs it gets the command that brings it up to date.

Read-only: the audit only lists objects (in pages), with the kubeconfig of
--config (or --kubeconfig).  The endpoint calls go through amp's allow-list,
address checks, TLS, breaker and timeouts, at most --concurrency at a time
and --rate a second.
"""

EPILOG = """\
exit status:
  0  every Pod is current (or opted out, or unknown)
  1  a Pod is stale, never mutated or failed, or a workload could not be audited
  2  bad usage or input

example:
  amp audit --config /etc/amp/amp.yaml -A
  amp audit -n team-a -n team-b -o json
  amp audit -A -o policyreport | kubectl apply -f -
"""


def command_line_parser(out: IO[str]) -> _Parser:
    p = _Parser(
        prog="amp audit",
        description=DESCRIPTION,
        epilog=EPILOG,
        out=out,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("-n", "--namespace", action="append", default=[], help="a namespace to audit (repeatable)")
    p.add_argument(
        "-A", "--all-namespaces", action="store_true", help="every namespace amp manages (the default without -n)"
    )
    p.add_argument("--config", metavar="FILE", help="amp's configuration (default: amp's defaults)")
    p.add_argument(
        "--kubeconfig", metavar="FILE", help="the kubeconfig (default: the config's, $KUBECONFIG, ~/.kube/config)"
    )
    p.add_argument("--context", help="the kubeconfig's context")
    p.add_argument("--concurrency", type=int, help="templates reviewed at once (default: audit.concurrency)")
    p.add_argument("--rate", type=int, help="templates reviewed per second at most (default: audit.rate)")
    p.add_argument("--page-size", type=int, help="objects per list request (default: audit.page_size)")
    p.add_argument(
        "--recordings", metavar="DIR", help="amp's recordings: bare Pods are compared with their recorded review"
    )
    p.add_argument("-o", "--output", choices=("table", "json", "policyreport"), default="table")
    p.add_argument("-v", "--verbose", action="store_true", help="list every Pod that is not current")
    return p


def parse_command_line(argv: Sequence[str], stdout: IO[str]) -> AuditOptions:
    args = command_line_parser(stdout).parse_args(list(argv))
    if args.all_namespaces and args.namespace:
        raise UsageError("give -A or -n, not both (see amp audit --help)")
    try:
        config = command_config(args.config)
    except ConfigError as e:
        raise UsageError(str(e)) from None
    kube = config.kubernetes
    if args.kubeconfig or args.context:
        kube = dataclasses.replace(
            kube,
            source=NamespaceSource.KUBECONFIG,
            kubeconfig=args.kubeconfig or kube.kubeconfig,
            context=args.context or kube.context,
        )
    elif kube.source == NamespaceSource.STATIC:
        raise UsageError("amp audit reads the cluster: the config's kubernetes.source is static; give --kubeconfig")
    elif kube.source == NamespaceSource.CLUSTER and not os.environ.get("KUBERNETES_SERVICE_HOST"):
        kube = dataclasses.replace(kube, source=NamespaceSource.KUBECONFIG)
    config = dataclasses.replace(config, kubernetes=kube)
    for flag, value in (("--concurrency", args.concurrency), ("--rate", args.rate), ("--page-size", args.page_size)):
        if value is not None and value < 1:
            raise UsageError(f"{flag}: must be at least 1, got {value}")
    return AuditOptions(
        config=config,
        namespaces=tuple(dict.fromkeys(args.namespace)),
        concurrency=args.concurrency or config.audit.concurrency,
        rate=args.rate or config.audit.rate,
        page_size=args.page_size or config.audit.page_size,
        recordings=args.recordings,
        output=args.output,
        verbose=args.verbose,
    )


def render(found: AuditRun, options: AuditOptions, now: float) -> str:
    if options.output == "json":
        return render_json(found.workloads, endpoint_calls=found.endpoint_calls, notes=found.notes)
    if options.output == "policyreport":
        return render_policy_reports(found.workloads, int(now))
    text = render_table(found.workloads, verbose=options.verbose)
    notes = "".join(f"note: {n}\n" for n in found.notes)
    return notes + text + f"{found.templates} templates reviewed, {found.endpoint_calls} endpoint calls\n"


@inlineCallbacks
def run(
    argv: Sequence[str],
    reactor: IAmpReactor,
    *,
    stdout: Optional[IO[str]] = None,
    stderr: Optional[IO[str]] = None,
    connector: Optional[Connector] = None,
    lists: Optional[PagedLists] = None,
    blocking: Optional[Callable[..., Any]] = None,
) -> Any:
    """
    C{amp audit ARGV}: audit, print, and fire with the exit status.

    @param lists: the cluster's lists (tests); else the kubeconfig's.
    """
    from amp.cli.audit_recordings import bare_pod_reviews

    stdout = stdout if stdout is not None else sys.stdout
    stderr = stderr if stderr is not None else sys.stderr
    client = None
    try:
        options = parse_command_line(argv, stdout)
        if lists is None:
            from amp.kube import KubeClient

            kube = options.config.kubernetes
            try:
                client = yield deferToThreadPool(reactor, reactor.getThreadPool(), KubeClient.from_config, kube)
            except Exception as e:
                raise UsageError(f"cannot use the kubeconfig: {str(e).strip() or type(e).__name__}") from None
            lists = PagedLists(kube_getter(client, kube.request_timeout), options.page_size, reactor)
        found = yield audit(
            reactor,
            options,
            lists,
            connector=connector,
            progress=Progress(stderr),
            read_recordings=bare_pod_reviews,
            blocking=blocking,
        )
    except Exit as e:
        return e.status
    except (UsageError, ClusterError) as e:
        stderr.write(f"amp audit: {terminal(str(e))}\n")
        return EXIT_USAGE
    finally:
        if client is not None:
            client.close()
    stdout.write(render(found, options, time.time()))
    stdout.flush()
    return found.exit_status
