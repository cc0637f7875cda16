"""
The C{amp replay} command line: arguments, reading the recordings, the
progress bar, and the report (text or JSON).  L{amp.cli.replay_run} does the
replaying.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from typing import IO, Any, Iterator, NoReturn, Optional, Sequence

from twisted.internet.defer import FirstError, inlineCallbacks

from amp.cli._command_line import TextOut
from amp.cli.replay_run import ReplayedReview, ReplayOptions, ReplayReport, Verdict, read_recording, replay
from amp.poddiff import MISSING, Difference
from amp.record._entry import RecordedReview, RecordingError
from amp.text import terminal

__all__ = ["run", "EXIT_USAGE"]

EXIT_USAGE = 2

DESCRIPTION = """\
Replay recorded reviews (amp's record section writes them) through amp's own
review pipeline and compare the Pods they admit: by default the answer now
with the recorded answer; with --against URL, the endpoint (recorded, or
--endpoint) with the candidate at URL.  amp's status stamp is not compared.
"""

EPILOG = """\
exit status:
  0  every review admits the same Pod with the same result
  1  a review differs, or failed (timeout, refused patch, ...)
  2  bad usage or input (an unreadable file; a malformed line is named,
     counted and skipped, and makes the exit status 2 at the end)

examples:
  amp replay recorded.jsonl --endpoint http://127.0.0.1:8080/inject --config ci/amp.yaml
  amp replay recorded.jsonl --against http://injector-canary.tools.svc:8080/inject -o json
"""


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, out: IO[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._out = out

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)

    def print_help(self, file: Optional[TextOut] = None) -> None:
        super().print_help(self._out)

    def exit(self, status: int = 0, message: Optional[str] = None) -> NoReturn:
        raise _Exit(status)


class _Exit(Exception):
    def __init__(self, status: int) -> None:
        self.status = status


def _parser(out: IO[str]) -> _Parser:
    p = _Parser(
        prog="amp replay",
        description=DESCRIPTION,
        epilog=EPILOG,
        out=out,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("files", metavar="FILE", nargs="+", help="recording files (JSON lines); - reads stdin")
    p.add_argument(
        "--endpoint", metavar="URL", help="call URL (or a chain, 'URL URL...') instead of the recorded endpoint"
    )
    p.add_argument(
        "--against",
        metavar="URL",
        help="compare with the endpoint at URL instead of the recording "
        "(in a chain, in place of the step amp.txn2.com/canary-step names, default 1)",
    )
    p.add_argument(
        "--config", metavar="FILE", help="amp's configuration (allow-list, patch rules; default: amp's defaults)"
    )
    p.add_argument("--concurrency", type=int, default=8, help="reviews at a time (default 8)")
    p.add_argument("-o", "--output", choices=("text", "json"), default="text", help="output format")
    return p


def _options(args: argparse.Namespace) -> ReplayOptions:
    from amp.config import ConfigError, command_config
    from amp.policy import chain_pieces
    from amp.urls import BadURL, parse_endpoint_url

    try:
        config = command_config(args.config)
    except ConfigError as e:
        raise UsageError(str(e)) from None
    for flag in ("endpoint", "against"):
        value = getattr(args, flag)
        if value is None:
            continue
        # --endpoint may be a chain, in the endpoint annotation's form.
        pieces = chain_pieces(value) if flag == "endpoint" else [value]
        for piece in pieces or [value]:
            try:
                parse_endpoint_url(piece)
            except BadURL as e:
                raise UsageError(f"--{flag}: {e}") from None
    if args.concurrency < 1:
        raise UsageError("--concurrency must be at least 1")
    return ReplayOptions(
        config=config,
        endpoint=args.endpoint,
        against=args.against,
        concurrency=args.concurrency,
        timeout=config.deadline.default_timeout,
    )


def _recordings(paths: Sequence[str], stdin: Any) -> Iterator[RecordedReview | RecordingError]:
    for path in paths:
        if path == "-":
            yield from read_recording("stdin", getattr(stdin, "buffer", stdin))
            continue
        with open(path, "rb") as stream:
            yield from read_recording(path, stream)


def _count_lines(paths: Sequence[str]) -> Optional[int]:
    """The lines of every file (each is read: one that cannot be is found now); None with stdin."""
    total = 0
    for path in paths:
        if path == "-":
            continue
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                total += chunk.count(b"\n")
    return None if "-" in paths else total


class _Progress:
    """A one-line progress bar on a terminal; nothing elsewhere."""

    def __init__(self, stream: IO[str], total: Optional[int]) -> None:
        self._stream = stream
        self._total = total
        self._done = 0

    def __call__(self) -> None:
        self._done += 1
        if self._total:
            width = 30
            filled = width * self._done // max(self._total, 1)
            self._stream.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {self._done}/{self._total}")
        else:
            self._stream.write(f"\rreplayed {self._done}")
        self._stream.flush()

    def clear(self) -> None:
        """Take the bar off its line (a report line is written next)."""
        if self._done:
            self._stream.write("\r\033[K")
            self._stream.flush()

    close = clear


def _show(value: Any) -> str:
    if value is MISSING:
        return "(absent)"
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 120 else text[:117] + "..."


def _difference(d: Difference) -> str:
    return f"    {d.path or '/'}: {_show(d.before)} -> {_show(d.after)}"


def review_lines(r: ReplayedReview) -> list[str]:
    """The text report's lines for one review that is not the same."""
    rec = r.recorded
    who = f"{rec.namespace}/{rec.pod_name or '?'} ({rec.where})"
    if rec.trace_id:
        # The recorded review's trace: where its time went, then.
        who += f" trace={rec.trace_id}"
    lines: list[str] = []
    if r.verdict == Verdict.DIFFERENT:
        lines.append(f"different  {who}")
        if (r.before.result, r.before.reason) != (r.after.result, r.after.reason):
            lines.append(
                f"    result: {r.before.result} {r.before.reason}".rstrip()
                + f" -> {r.after.result} {r.after.reason}".rstrip()
            )
        lines.extend(_difference(d) for d in r.differences)
    elif r.verdict == Verdict.FAILED:
        lines.append(
            f"failed     {who}: {r.after.reason or r.after.result}"
            + (f": {r.after.message}" if r.after.message else "")
        )
    return lines


def summary_lines(report: ReplayReport, against: Optional[str]) -> list[str]:
    """The text report's closing lines: the unreadable lines kept, how many more, and the counts."""
    from amp.urls import shown_url

    counts = report.counts()
    compared = f"against {shown_url(against)}" if against else "against the recorded answers"
    failed = report.failed_by_reason()
    failed_text = f" ({', '.join(f'{k}: {v}' for k, v in failed.items())})" if failed else ""
    lines = [f"unreadable {problem}" for problem in report.unreadable]
    if report.unreadable_not_shown:
        lines.append(
            f"unreadable ... and {report.unreadable_not_shown} more lines (the first "
            f"{len(report.unreadable)} are shown)"
        )
    lines.append(
        f"replayed {counts['reviews']} reviews {compared}: {counts['same']} same, "
        f"{counts['different']} different, {counts['failed']} failed{failed_text}, "
        f"{counts['unreadable']} unreadable"
    )
    return lines


def render_text(report: ReplayReport, against: Optional[str]) -> str:
    """The whole text report of a finished replay (its reviews kept in C{report.reviews})."""
    lines = [line for r in report.reviews for line in review_lines(r)] + summary_lines(report, against)
    return "".join(f"{terminal(line)}\n" for line in lines)


def render_json(report: ReplayReport) -> str:
    """The whole JSON report of a finished replay (its reviews kept in C{report.reviews})."""
    stream = io.StringIO()
    sink = _JSONSink(stream)
    for r in report.reviews:
        sink(r)
    sink.close(report)
    return stream.getvalue()


class _TextSink:
    """Writes each review's lines as it comes, escaped for a terminal; the summary at the end."""

    def __init__(self, stream: IO[str], against: Optional[str], progress: Optional[_Progress]) -> None:
        self.stream = stream
        self._against = against
        self._progress = progress

    def __call__(self, r: ReplayedReview) -> None:
        if self._progress is not None:
            self._progress.clear()
        self.stream.write("".join(f"{terminal(line)}\n" for line in review_lines(r)))
        self.stream.flush()

    def close(self, report: ReplayReport) -> None:
        self.stream.write("".join(f"{terminal(line)}\n" for line in summary_lines(report, self._against)))


class _JSONSink:
    """
    One JSON object, written as the replay goes: each review as it comes
    into C{reviews}, then the unreadable lines kept, how many were not
    kept, the counts (C{summary}) and the failures by reason.  ASCII.
    """

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self._first = True
        stream.write('{\n  "reviews": [')

    def __call__(self, r: ReplayedReview) -> None:
        self.stream.write(("\n    " if self._first else ",\n    ") + json.dumps(r.as_json()))
        self._first = False
        self.stream.flush()

    def close(self, report: ReplayReport) -> None:
        tail = {
            "unreadable": report.unreadable,
            "unreadable_not_shown": report.unreadable_not_shown,
            "summary": report.counts(),
            "failed_by_reason": report.failed_by_reason(),
        }
        members = json.dumps(tail, indent=2)[1:-2]  # without the braces
        self.stream.write(("],\n" if self._first else "\n  ],\n") + members.lstrip("\n") + "\n}\n")


@inlineCallbacks
def run(
    argv: Sequence[str],
    reactor: Any,
    *,
    stdin: Any = None,
    stdout: Optional[IO[str]] = None,
    stderr: Optional[IO[str]] = None,
    endpoint_client: Any = None,
) -> Any:
    """
    C{amp replay ARGV}: replay, print, and fire with the exit status.
    """
    from amp.breaker import BreakerRegistry
    from amp.endpoint import EndpointClient
    from amp.metrics import Metrics

    stdin = stdin if stdin is not None else sys.stdin
    stdout = stdout if stdout is not None else sys.stdout
    stderr = stderr if stderr is not None else sys.stderr
    try:
        args = _parser(stdout).parse_args(list(argv))
        options = _options(args)
        try:
            total = _count_lines(args.files)
        except OSError as e:
            raise UsageError(f"cannot read {e.filename}: {e.strerror}") from None
    except _Exit as e:
        return e.status
    except UsageError as e:
        stderr.write(f"amp replay: {terminal(e)}\n")
        return EXIT_USAGE
    metrics = Metrics()
    client = (
        endpoint_client if endpoint_client is not None else EndpointClient(reactor, metrics, BreakerRegistry(reactor))
    )
    progress = _Progress(stderr, total) if getattr(stderr, "isatty", lambda: False)() else None
    sink: Any = _JSONSink(stdout) if args.output == "json" else _TextSink(stdout, args.against, progress)
    try:
        report = yield replay(reactor, options, _recordings(args.files, stdin), client, metrics, progress, emit=sink)
    except FirstError as e:
        # A file that could not be read after all (a worker reading it failed).
        error = e.subFailure.value
        if not isinstance(error, OSError):
            raise
        stderr.write(f"amp replay: cannot read {terminal(error.filename)}: {error.strerror}\n")
        return EXIT_USAGE
    finally:
        if progress is not None:
            progress.close()
        if endpoint_client is None:
            yield client.close()
    sink.close(report)
    stdout.flush()
    if report.unreadable_count:
        return EXIT_USAGE
    return report.exit_status
