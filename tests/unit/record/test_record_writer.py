"""
The recorder's pipe and its writer's loop, without a process or a reactor
(amp.record._pipe, amp.record._writer): frames toward the writer, report
lines back, and what the writer does with them.
"""

from __future__ import annotations

import json
import os
import stat
from typing import Any

import pytest

from amp.record import Redactor, decode_line, recording_files
from amp.record._pipe import (
    FRAME_LIMIT,
    LINE_LIMIT,
    FrameError,
    FrameReader,
    LineReader,
    Problem,
    Report,
    WriterSettings,
    capture_frame,
    decode_capture,
    decode_report,
    decode_settings,
    problem_line,
    report_line,
    settings_frame,
)
from amp.record._writer import REPORT_INTERVAL, WriterLoop
from tests.support.inline_writer import recorded_lines
from tests.unit.record.test_record import _capture


def writer_settings(tmp_path: Any, **kw: Any) -> WriterSettings:
    values: dict[str, Any] = dict(
        directory=str(tmp_path / "rec"),
        file_size=1024 * 1024,
        max_size=8 * 1024 * 1024,
        queue=1024,
        queue_bytes=4 * 1024 * 1024,
        redact=False,
        key=b"k" * 32,
        keep_prefixes=("amp.txn2.com/",),
        keep_names=("team.example/ep",),
    )
    values.update(kw)
    return WriterSettings(**values)


class Now:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


# ---------------------------------------------------------------- frames


def test_a_capture_frame_carries_the_bodies_and_the_small_fields() -> None:
    capture = _capture(labels={"a": "é"}, annotations={"x": "\ud800 lone"}, reason="timeout")
    pieces = capture_frame(capture)
    assert pieces[2] is capture.request_body and pieces[3] is capture.answer_body
    [(kind, body)] = FrameReader().feed(b"".join(pieces))
    assert kind == b"C" and decode_capture(body) == capture


def test_frames_are_cut_wherever_the_reads_end(tmp_path: Any) -> None:
    captures = [_capture(uid=f"u{i}", request_body=b"x" * i) for i in range(5)]
    stream = settings_frame(writer_settings(tmp_path)) + b"".join(b"".join(capture_frame(c)) for c in captures)
    reader = FrameReader()
    frames = []
    for i in range(0, len(stream), 7):
        frames.extend(reader.feed(stream[i : i + 7]))
    assert reader.buffered == 0
    assert decode_settings(frames[0][1]) == writer_settings(tmp_path)
    assert [decode_capture(body) for _, body in frames[1:]] == captures


@pytest.mark.parametrize("length", [0, FRAME_LIMIT + 1])
def test_a_length_no_frame_has_is_refused(length: int) -> None:
    with pytest.raises(FrameError):
        FrameReader().feed(length.to_bytes(4, "big") + b"C")


def test_a_capture_frame_whose_lengths_do_not_add_up_is_refused() -> None:
    head, _, _, _ = capture_frame(_capture())
    with pytest.raises(FrameError):
        decode_capture(head[5:] + b"[]")


def test_report_lines_round_trip_and_stay_one_line() -> None:
    assert decode_report(report_line(3, 1, 4096, "")) == Report(3, 1, 4096, "")
    assert decode_report(report_line(0, 2, 10, "OSError: [Errno 28] No space\nleft")) == Report(
        0, 2, 10, "OSError: [Errno 28] No space left"
    )
    assert decode_report(problem_line("too large\r\nreally")) == Problem("too large really")
    with pytest.raises(FrameError):
        decode_report(b"R three")


def test_lines_back_are_cut_at_newlines_and_bounded() -> None:
    reader = LineReader()
    assert list(reader.feed(b"R 1 0 5 \nR 2")) == [b"R 1 0 5 "]
    assert list(reader.feed(b" 0 6 \n")) == [b"R 2 0 6 "]
    [long] = reader.feed(b"P " + b"x" * LINE_LIMIT)
    assert len(long) == LINE_LIMIT + 2


# ---------------------------------------------------------------- the writer's loop


def feed_all(loop: WriterLoop, *frames: bytes) -> list[Any]:
    out = loop.feed(b"".join(frames)) + loop.flush()
    return [decode_report(line) for line in out.splitlines()]


def test_the_writer_writes_private_lines_and_reports_them(tmp_path: Any) -> None:
    loop = WriterLoop()
    captures = [_capture(uid=f"u{i}") for i in range(3)]
    reports = feed_all(loop, settings_frame(writer_settings(tmp_path)), *(b"".join(capture_frame(c)) for c in captures))
    size = sum(len(c.request_body) + len(c.answer_body) for c in captures)
    assert reports == [Report(3, 0, size, "")]
    assert [decode_line(line, "x").uid for line in recorded_lines(tmp_path)] == ["u0", "u1", "u2"]
    [name] = recording_files(str(tmp_path / "rec"))
    assert stat.S_IMODE(os.stat(name).st_mode) == 0o600
    assert decode_report(loop.finish()) == Report(0, 0, 0, "")


def test_writers_given_the_same_key_redact_to_the_same_markers(tmp_path: Any) -> None:
    capture = _capture(annotations={"amp.txn2.com/ep": "http://e/x", "team.example/ep": "kept", "secret": "hunter2"})
    markers = []
    for n in range(2):
        loop = WriterLoop()
        settings = writer_settings(tmp_path / str(n), redact=True)
        feed_all(loop, settings_frame(settings), b"".join(capture_frame(capture)))
        loop.finish()
        [line] = recorded_lines(tmp_path / str(n))
        annotations = json.loads(line)["namespace"]["annotations"]
        assert annotations["team.example/ep"] == "kept" and annotations["amp.txn2.com/ep"] == "http://e/x"
        markers.append(annotations["secret"])
    assert markers[0] == markers[1] == Redactor(key=b"k" * 32).marker("hunter2")


def test_a_report_waits_for_more_work_but_not_long(tmp_path: Any) -> None:
    now = Now()
    loop = WriterLoop(now=now)
    assert loop.due() is None
    assert loop.feed(settings_frame(writer_settings(tmp_path)) + b"".join(capture_frame(_capture()))) == b""
    assert loop.due() == pytest.approx(REPORT_INTERVAL)
    now.t += REPORT_INTERVAL / 2
    assert loop.feed(b"".join(capture_frame(_capture(uid="u2")))) == b""
    now.t += REPORT_INTERVAL / 2
    assert loop.due() == 0.0
    [report] = [decode_report(line) for line in loop.feed(b"").splitlines()]
    assert isinstance(report, Report) and report.written == 2
    assert loop.due() is None and loop.flush() == b""


def test_a_quarter_of_the_queue_done_is_reported_at_once(tmp_path: Any) -> None:
    loop = WriterLoop(now=Now())
    loop.feed(settings_frame(writer_settings(tmp_path, queue=8)))
    out = loop.feed(b"".join(b"".join(capture_frame(_capture(uid=f"u{i}"))) for i in range(5)))
    assert [decode_report(line).written for line in out.splitlines()] == [2, 2]  # type: ignore[union-attr]
    size = len(_capture().request_body) + len(_capture().answer_body)
    loop = WriterLoop(now=Now())
    loop.feed(settings_frame(writer_settings(tmp_path, queue_bytes=4 * size)))
    assert decode_report(loop.feed(b"".join(capture_frame(_capture())))).written == 1  # type: ignore[union-attr]


def test_a_change_of_the_disks_state_is_reported_at_once_and_once(tmp_path: Any) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    loop = WriterLoop(now=Now())
    loop.feed(settings_frame(writer_settings(tmp_path, directory=str(blocker / "rec"))))
    [first] = loop.feed(b"".join(capture_frame(_capture()))).splitlines()
    report = decode_report(first)
    assert isinstance(report, Report) and report.failed == 1 and "NotADirectoryError" in report.state
    assert loop.feed(b"".join(capture_frame(_capture()))) == b""  # the same state: no hurry
    assert decode_report(loop.finish()) == report  # the second one, in the last report


def test_a_review_the_writer_cannot_use_is_a_problem_line_not_a_state(tmp_path: Any) -> None:
    loop = WriterLoop(now=Now())
    loop.feed(settings_frame(writer_settings(tmp_path, file_size=1000, redact=True)))
    large = json.dumps({"request": {"object": {"spec": {"nodeName": "n" * 2000}}}}).encode()
    out = loop.feed(
        b"".join(capture_frame(_capture(request_body=b"[]"))) + b"".join(capture_frame(_capture(request_body=large)))
    )
    problems = [decode_report(line) for line in out.splitlines()]
    assert all(isinstance(p, Problem) for p in problems) and len(problems) == 2
    assert "larger than record.file_size" in problems[1].message  # type: ignore[union-attr]
    assert decode_report(loop.flush()) == Report(0, 2, 2 + len(large) + 2 * len(_capture().answer_body), "")


def test_a_capture_before_the_settings_or_a_second_settings_frame_ends_the_writer(tmp_path: Any) -> None:
    with pytest.raises(FrameError):
        WriterLoop().feed(b"".join(capture_frame(_capture())))
    loop = WriterLoop()
    with pytest.raises(FrameError):
        loop.feed(settings_frame(writer_settings(tmp_path)) * 2)
