"""
The checks the build runs on the source itself, as the suite runs them
(C{make test}; C{make check} runs the same three without pytest):

  - mypy, strict on C{amp/} with Twisted's zope interfaces understood
    (C{mypy.ini});
  - ruff's lint on the whole repository (C{ruff.toml});
  - ruff's format check on the whole repository.

Each runs as a subprocess from this Python's environment and must exit
cleanly; on failure the test shows what the tool found.  The three take
about 25 s together with a warm mypy cache (about a minute cold), so they
share one xdist group: one worker runs them, one after another, and
mypy's cache is written by one process only.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.xdist_group("static_checks")


def _root() -> Path:
    """The checkout: the nearest folder above this file that holds mypy.ini."""
    for folder in Path(__file__).resolve().parents:
        if (folder / "mypy.ini").is_file():
            return folder
    raise AssertionError(f"no mypy.ini above {__file__}")


ROOT = _root()


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *argv], cwd=ROOT, capture_output=True, text=True, timeout=600)


#: How much of a tool's findings a failure shows.
SHOWN = 30_000


def _assert_clean(what: str, done: subprocess.CompletedProcess[str]) -> None:
    if done.returncode == 0:
        return
    found = done.stdout + done.stderr
    if len(found) > SHOWN:
        found = f"{found[:SHOWN]}\n... ({len(found) - SHOWN} more characters; run it to see them all)"
    pytest.fail(f"{what} exited with {done.returncode}:\n{found}", pytrace=False)


def test_mypy_finds_no_error_in_amp() -> None:
    _assert_clean("mypy (mypy.ini: strict on amp/)", _run("mypy", "--config-file", "mypy.ini"))


def test_ruff_lint_finds_nothing() -> None:
    _assert_clean("ruff check .", _run("ruff", "check", "--no-cache", "."))


def test_ruff_format_leaves_every_file_as_it_is() -> None:
    _assert_clean("ruff format --check . (run `ruff format .` to fix)", _run("ruff", "format", "--check", "."))
