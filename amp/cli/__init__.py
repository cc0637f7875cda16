"""
The C{amp} console script: C{amp explain} (L{amp.cli.explain}) runs amp's own
review pipeline on one Pod and prints the decision; C{amp replay}
(L{amp.cli.replay}) runs recorded reviews through it again and compares;
C{amp check} (L{amp.cli.check}) checks amp's webhook registration against
what its config needs; C{amp audit} (L{amp.cli.audit}) finds running Pods
whose mutation is stale, missing or failed.

L{main} is the only place here that uses the global reactor: it runs the
command under C{twisted.internet.task.react}.
"""

from __future__ import annotations

import sys
from typing import IO, TYPE_CHECKING, Any, Optional, Sequence

from amp import __version__

if TYPE_CHECKING:
    from amp.reactors import IAmpReactor

__all__ = ["main", "dispatch"]

USAGE = """\
usage: amp explain [options] FILE     review one Pod (or a workload's Pod template) as amp would
       amp replay [options] FILE...   recorded reviews through amp again, compared
       amp check --manifest FILE | --cluster   amp's webhook registration against its config
       amp audit [options]            running Pods whose mutation is stale, missing or failed
       amp --version

Run 'amp explain --help', 'amp replay --help', 'amp check --help' or 'amp audit --help' for the options.
"""


def dispatch(
    argv: Sequence[str],
    reactor: IAmpReactor,
    *,
    stdin: Any = None,
    stdout: Optional[IO[str]] = None,
    stderr: Optional[IO[str]] = None,
    log_publisher: Any = None,
) -> Any:
    """
    Run the command C{argv} names; a Deferred that fires with the exit status.
    """
    from twisted.internet.defer import succeed

    out = stdout if stdout is not None else sys.stdout
    err = stderr if stderr is not None else sys.stderr
    if argv and argv[0] == "explain":
        from amp.cli.explain import run

        return run(argv[1:], reactor, stdin=stdin, stdout=out, stderr=err, log_publisher=log_publisher)
    if argv and argv[0] == "replay":
        from amp.cli.replay import run as replay

        return replay(argv[1:], reactor, stdin=stdin, stdout=out, stderr=err)
    if argv and argv[0] == "check":
        from amp.cli.check import run as check

        return check(argv[1:], reactor, stdin=stdin, stdout=out, stderr=err)
    if argv and argv[0] == "audit":
        from amp.cli.audit import run as audit

        return audit(argv[1:], reactor, stdout=out, stderr=err)
    if argv and argv[0] == "--version":
        out.write(f"amp {__version__}\n")
        return succeed(0)
    if argv and argv[0] in ("-h", "--help"):
        out.write(USAGE)
        return succeed(0)
    from amp.text import terminal

    what = f"unknown command {terminal(repr(argv[0]))}" if argv else "no command given"
    err.write(f"amp: {what} (try 'amp explain --help')\n")
    return succeed(2)


def main(argv: Optional[Sequence[str]] = None) -> None:
    """
    The console script: C{amp explain ...}.  Exits with the command's status.
    """
    from twisted.internet.task import react
    from twisted.logger import globalLogPublisher

    args = list(sys.argv[1:] if argv is None else argv)

    def command(reactor: IAmpReactor) -> Any:
        return dispatch(args, reactor, log_publisher=globalLogPublisher).addCallback(_exit_with)

    react(command)


def _exit_with(status: int) -> None:
    if status:
        raise SystemExit(status)
