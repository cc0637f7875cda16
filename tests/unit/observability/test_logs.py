"""
Tests for amp's log output (L{amp.logs}): JSON lines that parse one per
line and carry the review fields, failures with their traceback, level
filtering, and the limit on repeated lines.  The per-review line of a real
review, which must never hold the Pod, is in
tests/integration/loopback/test_logs.py.
"""

from __future__ import annotations

import io
import json
import math
import threading
from typing import Any

import pytest
from twisted.internet.task import Clock
from twisted.logger import Logger, LogLevel, formatEvent
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase, TestCase

from amp.logs import RepeatLimiter, event_as_json, make_observer

REVIEW_FIELDS = ("uid", "namespace", "pod", "endpoint", "result", "reason", "duration_ms", "patch_size")


def lines_of(buf: io.StringIO) -> list[dict[str, Any]]:
    """Every line of C{buf} parsed as JSON (fails on any line that is not)."""
    text = buf.getvalue()
    assert text.endswith("\n") or not text
    return [json.loads(line) for line in text.splitlines()]


def logger(fmt: str = "json", level: str = "info", namespace: str = "amp.web.ReviewHandler") -> tuple:
    buf = io.StringIO()
    return Logger(namespace=namespace, observer=make_observer(fmt, level, buf)), buf


class JSONLineTests(TestCase):
    def test_review_fields_are_top_level_keys(self) -> None:
        """
        A review event becomes one JSON object with the time, level, logger,
        formatted message and every keyword field at the top level.
        """
        log, buf = logger()
        log.info(
            "review {uid} {namespace}/{pod} {result}",
            uid="u-1",
            namespace="team-a",
            pod="web-*",
            endpoint="http://ep.team-a.svc:8080",
            result="patched",
            reason="",
            duration_ms=12.5,
            patch_size=497,
        )
        [line] = lines_of(buf)
        self.assertEqual(line["message"], "review u-1 team-a/web-* patched")
        self.assertEqual(line["level"], "info")
        self.assertEqual(line["logger"], "amp.web.ReviewHandler")
        self.assertRegex(line["time"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
        self.assertEqual(
            {k: line[k] for k in REVIEW_FIELDS},
            {
                "uid": "u-1",
                "namespace": "team-a",
                "pod": "web-*",
                "endpoint": "http://ep.team-a.svc:8080",
                "result": "patched",
                "reason": "",
                "duration_ms": 12.5,
                "patch_size": 497,
            },
        )

    def test_one_line_per_event_whatever_the_values(self) -> None:
        """
        Newlines inside values, bytes, non-finite floats and objects that
        are not JSON still give exactly one parseable line per event.
        """
        log, buf = logger()
        log.info("first\nwith a newline {x}", x="a\nb")
        log.info("second", raw=b"\xffbytes", ratio=math.nan, big=math.inf, obj=object(), items=(1, "two"))
        log.warn("third", nested={"k": [1, {"v": None}]})
        log.info("fourth {path}", path="caf\udce9", huge=2**70)
        parsed = lines_of(buf)
        self.assertEqual(len(parsed), 4)
        self.assertEqual((parsed[3]["path"], parsed[3]["huge"]), ("caf\udce9", 2**70))
        self.assertEqual(parsed[3]["message"], "fourth caf\udce9")
        self.assertEqual(parsed[0]["x"], "a\nb")
        self.assertEqual(parsed[1]["raw"], "\\xffbytes")
        self.assertEqual(parsed[1]["ratio"], "nan")
        self.assertEqual(parsed[1]["big"], "inf")
        self.assertTrue(parsed[1]["obj"].startswith("<object object"))
        self.assertEqual(parsed[1]["items"], [1, "two"])
        self.assertEqual(parsed[2]["nested"], {"k": [1, {"v": None}]})
        self.assertEqual(parsed[2]["level"], "warn")

    def test_failure_carries_error_and_traceback(self) -> None:
        log, buf = logger()
        try:
            {}["missing"]
        except KeyError:
            log.failure("Internal error reviewing {uid}", uid="u-2")
        [line] = lines_of(buf)
        self.assertEqual(line["level"], "critical")
        self.assertEqual(line["uid"], "u-2")
        self.assertEqual(line["message"], "Internal error reviewing u-2")
        self.assertEqual(line["error"], "'missing'")
        self.assertIn("KeyError", line["traceback"])
        self.assertIn("test_failure_carries_error_and_traceback", line["traceback"])

    def test_legacy_error_event(self) -> None:
        """
        An error from C{twisted.python.log.err} (legacy code in Twisted)
        keeps its traceback and drops the legacy bookkeeping keys.
        """
        try:
            _ = 1 / 0
        except ZeroDivisionError:
            failure = Failure()
        event = {
            "system": "-",
            "failure": failure,
            "why": "oops",
            "isError": 1,
            "message": (),
            "time": 1.5,
            "log_time": 1.5,
            "log_text": "oops",
            "log_format": "{log_text}",
            "log_namespace": "log_legacy",
        }
        line = json.loads(event_as_json(event))
        self.assertEqual(line["message"], "oops")
        self.assertEqual(line["why"], "oops")
        self.assertIn("ZeroDivisionError", line["traceback"])
        self.assertEqual(line["time"], "1970-01-01T00:00:01.500Z")
        for gone in ("system", "failure", "isError"):
            self.assertNotIn(gone, line)

    def test_level_filtering(self) -> None:
        seen = {}
        for level in ("debug", "info", "warn", "error"):
            log, buf = logger(level=level)
            log.debug("d")
            log.info("i")
            log.warn("w")
            log.error("e")
            seen[level] = [line["message"] for line in lines_of(buf)]
        self.assertEqual(
            seen, {"debug": ["d", "i", "w", "e"], "info": ["i", "w", "e"], "warn": ["w", "e"], "error": ["e"]}
        )

    def test_connection_chatter_only_at_debug(self) -> None:
        """
        Twisted's "Starting factory" / "Stopping factory" lines (one per
        pooled endpoint connection) are dropped unless the level is debug.
        """
        for level, expected in (("info", []), ("debug", ["Starting factory 'pool'", "Stopping factory 'pool'"])):
            log, buf = logger(level=level, namespace="twisted.web.client._HTTP11ClientFactory")
            log.info("Starting factory {factory!r}", factory="pool")
            log.info("Stopping factory {factory!r}", factory="pool")
            self.assertEqual([line["message"] for line in lines_of(buf)], expected, level)

    def test_text_format(self) -> None:
        log, buf = logger(fmt="text")
        log.info("review {uid} {result}", uid="u-3", result="ignored")
        text = buf.getvalue()
        self.assertEqual(len(text.splitlines()), 1)
        self.assertIn("review u-3 ignored", text)
        self.assertIn("[amp.web.ReviewHandler#info]", text)
        self.assertFalse(text.lstrip().startswith("{"))


def test_text_lines_are_twisteds_classic_form() -> None:
    """
    Text logs keep Twisted's classic line (time, logger#level, message);
    a failure's traceback follows on indented lines.
    """
    import io

    from twisted.logger import LogLevel
    from twisted.python.failure import Failure

    from amp.logs import TextLinesObserver

    out = io.StringIO()
    observer = TextLinesObserver(out)
    observer(
        {
            "log_format": "review {uid} done",
            "uid": "u-1",
            "log_time": 1763735342.25,
            "log_namespace": "amp.web",
            "log_level": LogLevel.info,
        }
    )
    try:
        _ = 1 / 0
    except ZeroDivisionError:
        failure = Failure()
    observer(
        {
            "log_format": "boom",
            "log_time": 1763735343.0,
            "log_namespace": "amp.x",
            "log_level": LogLevel.critical,
            "log_failure": failure,
        }
    )
    first, *rest = out.getvalue().splitlines()
    assert first == "2025-11-21T14:29:02.250Z [amp.web#info] review u-1 done"
    assert rest[0] == "2025-11-21T14:29:03.000Z [amp.x#critical] boom"
    assert any("ZeroDivisionError" in line for line in rest[1:])
    assert all(line.startswith("\t") for line in rest[1:])


def test_fast_formatting_matches_twisteds() -> None:
    """
    amp's log observers format plain messages themselves (for speed); the
    text must be what twisted.logger.formatEvent gives, for every shape of
    format, including the ones handed back to Twisted.
    """
    from twisted.logger import formatEvent

    from amp.logs import format_event
    from amp.web import _REVIEW_LINE, _REVIEW_LINE_WITH_REASON

    fields = {
        "uid": "u-1",
        "namespace": "team-a",
        "pod": "p-*",
        "endpoint": "http://e:80",
        "result": "ignored",
        "reason": "timeout",
        "patch_size": 0,
        "duration_ms": 12.345,
        "a": {"k": 1},
        "x": 3,
        "y": "z",
    }
    formats = [
        _REVIEW_LINE,
        _REVIEW_LINE_WITH_REASON,
        "{a!r} x",
        "{a.k}",
        "{}",
        "plain {{braces}}",
        "{x:>5}|{y}",
        "{missing}",
        "{x:{y}}",
        "unclosed {",
        "{a}",
    ]
    for fmt in formats:
        event = dict(fields, log_format=fmt)
        assert format_event(event) == formatEvent(event), fmt
    assert format_event({"no": "format"}) == formatEvent({"no": "format"})


class RepeatLimiterTests(SynchronousTestCase):
    """
    L{RepeatLimiter} on a L{Clock}: the first few lines of a kind, then one
    summary with a count per interval.
    """

    def setUp(self) -> None:
        self.clock = Clock()
        self.events: list[dict[str, Any]] = []
        self.limiter = RepeatLimiter(
            Logger(observer=self.events.append),
            self.clock,
            {"refused": "connections refused", "other": "other things"},
            burst=3,
            interval=10.0,
        )

    def messages(self) -> list[str]:
        return [formatEvent(e) for e in self.events]

    def refuse(self, n: int) -> None:
        for i in range(n):
            self.limiter.emit("refused", LogLevel.warn, "Connection refused: {i}", i=i)

    def test_a_burst_logs_its_first_lines_then_one_summary_with_the_count(self) -> None:
        self.refuse(1500)
        self.assertEqual(self.messages(), ["Connection refused: 0", "Connection refused: 1", "Connection refused: 2"])
        self.clock.advance(9.9)
        self.assertEqual(len(self.events), 3)
        self.clock.advance(0.1)
        self.assertEqual(
            self.messages()[3:],
            ["1497 more connections refused in the last 10s (only the first 3 of a burst are logged)"],
        )
        self.assertEqual(self.events[3]["log_level"], LogLevel.warn)

    def test_a_flood_that_goes_on_writes_one_summary_per_interval(self) -> None:
        self.refuse(10)
        self.clock.advance(10)
        for _ in range(3):
            self.refuse(100)
            self.clock.advance(10)
        self.assertEqual(len(self.events), 3 + 4)
        self.assertEqual([e["count"] for e in self.events[3:]], [7, 100, 100, 100])

    def test_a_quiet_interval_resets_the_kind(self) -> None:
        self.refuse(5)
        self.clock.advance(10)  # summary of 2
        self.clock.advance(10)  # nothing came: reset
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.refuse(1)
        self.assertEqual(self.messages()[-1], "Connection refused: 0")

    def test_kinds_are_limited_apart(self) -> None:
        self.refuse(10)
        self.limiter.emit("other", LogLevel.info, "other {n}", n=1)
        self.assertEqual(self.messages()[-1], "other 1")

    def test_a_burst_under_the_limit_writes_no_summary(self) -> None:
        self.refuse(3)
        self.clock.advance(100)
        self.assertEqual(len(self.events), 3)

    def test_flush_writes_what_is_counted_and_stops_the_timers(self) -> None:
        self.refuse(8)
        self.limiter.flush()
        self.assertEqual(self.events[-1]["count"], 5)
        self.assertEqual(self.clock.getDelayedCalls(), [])


def test_the_hot_path_logger_emits_what_twisteds_does() -> None:
    """
    The review line's logger (amp.logs.HotPathLogger) gives observers the
    event Twisted's Logger gives, and refuses a level that is not one of
    LogLevel's the way Twisted's does.
    """
    from amp.logs import HotPathLogger

    theirs: list[dict[str, Any]] = []
    ours: list[dict[str, Any]] = []
    Logger(namespace="amp.web.ReviewHandler", observer=theirs.append).info("review {uid}", uid="u-1", n=2)
    HotPathLogger(namespace="amp.web.ReviewHandler", observer=ours.append).info("review {uid}", uid="u-1", n=2)
    [a], [b] = theirs, ours
    assert set(a) == set(b)
    for key in a:
        if key not in ("log_logger", "log_time"):
            assert a[key] == b[key], key
    assert formatEvent(a) == formatEvent(b) == "review u-1"
    bad_theirs: list[dict[str, Any]] = []
    bad_ours: list[dict[str, Any]] = []
    Logger(observer=bad_theirs.append).emit("loud", "x")  # type: ignore[arg-type]
    HotPathLogger(observer=bad_ours.append).emit("loud", "x")  # type: ignore[arg-type]
    assert [e["log_level"] for e in bad_ours] == [e["log_level"] for e in bad_theirs] == [LogLevel.critical]
    assert [e["log_format"] for e in bad_ours] == [e["log_format"] for e in bad_theirs]


class _CountingOut(io.StringIO):
    """A text output that counts its writes and flushes."""

    flushes = 0
    writes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        return super().write(text)

    def flush(self) -> None:
        self.flushes += 1
        super().flush()


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_lines_together_are_flushed_once_and_none_is_held_back(fmt: str) -> None:
    """
    Lines logged together (the reviews of one reactor turn) are all
    written with one write, flushed once at the end, in the order logged
    (an unbuffered output, as under PYTHONUNBUFFERED, makes a system call
    of every write); a line logged alone is written and flushed at once,
    and one from another thread while lines are held is not held.
    """
    from amp.logs import ConfigurableObserver, lines_together

    out = _CountingOut()
    log = Logger(observer=ConfigurableObserver(fmt, "info", out))
    with lines_together():
        with lines_together():
            for i in range(5):
                log.info("review {n}", n=i)
        assert (out.writes, out.flushes) == (0, 0)
        other = threading.Thread(target=lambda: log.info("from a watch thread"))
        other.start()
        other.join()
        assert (out.writes, out.flushes) == (1, 1)
        assert "from a watch thread" in out.getvalue()
    assert (out.writes, out.flushes) == (2, 2)
    reviews = [line for line in out.getvalue().splitlines() if "review " in line]
    assert [line.rsplit("review ", 1)[1][0] for line in reviews] == ["0", "1", "2", "3", "4"]
    log.info("alone")
    assert (out.writes, out.flushes) == (3, 3)
    assert out.getvalue().endswith("\n") and "alone" in out.getvalue().splitlines()[-1]


@pytest.mark.parametrize("when", [0.0, 0.9995, 1.0, 1700000000.123, 1700000000.1239, 1700000000.999, 1764260000.5])
def test_a_line_is_stamped_with_its_utc_millisecond(when: float) -> None:
    """
    The time of a line is its UTC time to the millisecond, whether or not
    the line before it was stamped in the same millisecond (remembered).
    """
    import datetime

    from amp.logs import _timestamp

    millisecond = int(when * 1000)
    second = datetime.datetime.fromtimestamp(millisecond // 1000, datetime.timezone.utc)
    expected = second.strftime("%Y-%m-%dT%H:%M:%S") + f".{millisecond % 1000:03d}Z"
    assert _timestamp(when) == expected
    assert _timestamp(when) == expected
    assert _timestamp(when + 0.0015) != expected
