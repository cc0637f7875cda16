"""
The benchmark's profile summary (bench.profile_summary.summarise_collapsed): its
rows of where the time goes stand for functions on a review's path, and
count the stacks that pass through them.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

import pytest

from bench import bodies
from bench.profile_summary import BREAKDOWN, summarise_collapsed
from bench.review_path import ReviewPath, check_answer, request_pieces

_NAMED = [(label, name) for label, _, names in BREAKDOWN for name in names]


def _resolve(name: str) -> Any:
    module, qualname = name.split(":")
    found: Any = importlib.import_module(module)
    for attribute in qualname.split("."):
        found = getattr(found, attribute)
    return inspect.unwrap(found)


def _frame(name: str) -> str:
    """The frame py-spy writes for C{name}: its qualified name, its file's absolute path and a line."""
    code = _resolve(name).__code__
    return f"{code.co_qualname} ({code.co_filename}:{code.co_firstlineno})"


@pytest.fixture(scope="module")
def on_the_path() -> set[CodeType]:
    """The code run by one typical review through amp's listener, admitter and client (in memory)."""
    path = ReviewPath()
    pieces = request_pieces(bodies.review_body("typical", "bench"))
    check_answer(path.review(pieces))
    ran: set[CodeType] = set()

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            ran.add(frame.f_code)

    sys.setprofile(profile)
    try:
        answer = path.review(pieces)
    finally:
        sys.setprofile(None)
    check_answer(answer)
    return ran


@pytest.mark.parametrize("label, name", _NAMED, ids=[n for _, n in _NAMED])
def test_each_row_stands_for_a_function_on_a_reviews_path(
    on_the_path: set[CodeType],
    tmp_path: Path,
    label: str,
    name: str,
) -> None:
    """A function renamed, or no longer on the path, fails here instead of leaving its row at 0%."""
    assert _resolve(name).__code__ in on_the_path, f"{name} ({label!r}) does not run in a typical review"
    collapsed = tmp_path / "profile.txt"
    collapsed.write_text(f"process 1;thread 1;{_frame(name)} 1\n")
    rows = {row["part"]: row["total_pct"] for row in summarise_collapsed(str(collapsed))["breakdown"]}
    assert rows[label] == 100.0, f"{label!r} does not count a sample in {name}"


def test_a_stack_counts_for_every_row_it_passes_through_and_no_other(tmp_path: Path) -> None:
    call = _frame("amp.endpoint._client:EndpointClient.call")
    check = _frame("amp.patch._check:check_patch")
    on_header = _frame("amp.http._client:ClientConnection.on_header")
    collapsed = tmp_path / "profile.txt"
    collapsed.write_text(
        f"process 1;thread 1;run (twisted/internet/base.py:1);{call};write (x.py:2) 3\n"
        f"process 1;thread 1;run (twisted/internet/base.py:1);{on_header} 1\n"
        f"process 1;thread 1;run (twisted/internet/base.py:1);{check};apply (y.py:3) 4\n"
        "process 1;thread 1;run (twisted/internet/base.py:1) 2\n"
    )
    rows = {row["part"]: row["total_pct"] for row in summarise_collapsed(str(collapsed))["breakdown"]}
    assert rows["endpoint call set-up (amp.endpoint.EndpointClient.call)"] == 30.0
    assert rows["the endpoint's reply read (amp.http's client llhttp callbacks and head count)"] == 10.0
    assert rows["patch checks (amp.patch.check_patch)"] == 40.0
    assert rows["AdmissionReview parsing (amp.admission_review.parse_review)"] == 0.0
