"""
The command line of C{amp explain} (L{parse_command_line}): its options, the
files it names read with a size cap, and usage errors as one line
(L{UsageError}).
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from typing import IO, Any, Mapping, NoReturn, Optional, Protocol, Sequence

from amp.cli.workloads import InputError, PodInput, load_documents, names_namespace, pod_for, select_object
from amp.config import Config, ConfigError, command_config
from amp.files import INPUT_LIMIT, FileError, read_file, read_stream
from amp.reasons import NamespaceSource


class UsageError(Exception):
    """
    Bad usage or input: exit L{EXIT_USAGE} with this one-line message.
    """


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


class Exit(Exception):
    def __init__(self, status: int) -> None:
        self.status = status


class TextOut(Protocol):
    """Where help is written (what argparse's print_help takes)."""

    def write(self, text: str, /) -> object:
        """Write C{text}."""


class _Parser(argparse.ArgumentParser):
    """
    argparse that reports a usage error as one line (L{UsageError}) and
    writes help to the given stream instead of exiting the process.
    """

    def __init__(self, *args: Any, out: IO[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.out = out

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see {self.prog} --help)")

    def print_help(self, file: Optional[TextOut] = None) -> None:
        (file or self.out).write(self.format_help())

    def exit(self, status: int = 0, message: Optional[str] = None) -> NoReturn:
        if message:
            raise UsageError(message.strip())
        raise Exit(status)


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


def command_line_parser(out: IO[str]) -> _Parser:
    p = _Parser(
        prog="amp explain",
        description=DESCRIPTION,
        epilog=EPILOG,
        out=out,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("file", metavar="FILE", help="the Pod or workload, YAML or JSON; - reads stdin")
    p.add_argument("-n", "--namespace", help="the namespace (default: the object's own, else default)")
    p.add_argument("--config", metavar="FILE", help="amp's configuration (default: amp's defaults)")
    p.add_argument(
        "--set-label",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="set a label of the namespace (repeatable)",
    )
    p.add_argument(
        "--set-annotation",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="set an annotation of the namespace (repeatable)",
    )
    p.add_argument(
        "--reply",
        metavar="FILE",
        help="use this recorded endpoint reply (a JSON array of operations or the reply object) "
        "instead of calling the endpoint",
    )
    p.add_argument(
        "--twice",
        action="store_true",
        help="review the admitted Pod again, as the API server does when it reinvokes amp, and "
        "report whether that changes it (idempotency); the status stamp tells both reviews",
    )
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
    args = command_line_parser(stdout).parse_args(list(argv))
    labels = _pairs(args.set_label, "--set-label")
    annotations = _pairs(args.set_annotation, "--set-annotation")
    try:
        config = command_config(args.config)
    except ConfigError as e:
        raise UsageError(str(e)) from None
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
        cluster = config.kubernetes.source != NamespaceSource.STATIC
    else:
        cluster = not (labels or annotations)
    options = ExplainOptions(
        config=config,
        config_path=args.config,
        labels=labels,
        annotations=annotations,
        reply=reply,
        reply_path=args.reply,
        twice=args.twice,
        cluster=cluster,
    )
    return options, pod_input, args.output
