"""
Log output: text lines, or one JSON object per line (C{log.format: json}).

Events come from C{twisted.logger}; the JSON form carries the event's
keyword fields (uid, namespace, pod, endpoint, result, duration_ms, ...) as
top-level keys beside C{time}, C{level}, C{logger} and C{message}.  Fields
that cannot be represented in JSON are written as their C{repr}; a failure
(C{log.failure}, or C{log.err} from legacy code) adds C{error} and
C{traceback}.  Every line is a complete JSON document, whatever the event
holds: newlines inside values are escaped and non-finite floats are written
as strings.

C{log.level} drops events below it.  Both can change while amp runs
(L{ConfigurableObserver}, on a config reload).  Twisted's per-connection chatter
("Starting factory ...", "Stopping factory ..." for every pooled endpoint
connection) is only written at C{log.level: debug}.
"""

from __future__ import annotations

import json
import math
import time
from functools import lru_cache
from string import Formatter
from threading import get_ident
from typing import IO, Any, Callable, Optional

import msgspec
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import (
    ILogObserver,
    LogEvent,
    Logger,
    LogLevel,
    formatEvent,
)
from twisted.python.failure import Failure
from zope.interface import implementer

_encode = msgspec.json.encode

_LEVELS = {"debug": LogLevel.debug, "info": LogLevel.info, "warn": LogLevel.warn, "error": LogLevel.error}

#: Formats of Twisted's own per-connection messages, written only at debug.
CHATTER_FORMATS = frozenset(
    {
        "Starting factory {factory!r}",
        "Stopping factory {factory!r}",
        "Starting protocol {protocol!r}",
        "Stopping protocol {protocol!r}",
    }
)

#: Keys of legacy (C{twisted.python.log}) events that carry nothing useful
#: beside the JSON line's own fields.
_LEGACY_NOISE = frozenset({"isError", "failure", "message", "time", "format"})


def _field(value: Any) -> Any:
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    if isinstance(value, (list, tuple)):
        return [_field(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _field(v) for k, v in value.items()}
    return repr(value)


@lru_cache(maxsize=256)
def _plain(fmt: str) -> bool:
    """
    Whether a log format uses only plain C{{name}} / C{{name:spec}}
    fields; one with more (calls, attributes, conversions, nested specs)
    goes through Twisted's own formatter.
    """
    try:
        parsed = list(Formatter().parse(fmt))
    except ValueError:
        return False
    return all(
        field is None or (field.isidentifier() and not conversion and "{" not in (spec or ""))
        for _, field, spec, conversion in parsed
    )


def format_event(event: LogEvent) -> str:
    """
    The event's message, as C{twisted.logger.formatEvent} would write it,
    without its general formatter's cost for the common plain formats
    (a quarter of a review's log line otherwise).
    """
    fmt = event.get("log_format")
    if not isinstance(fmt, str) or not _plain(fmt):
        return formatEvent(event)
    try:
        # Plain fields only (checked above): str.format_map formats each as
        # format(event[name], spec), as Twisted's formatter would.
        return fmt.format_map(event)
    except Exception:
        return formatEvent(event)


@lru_cache(maxsize=4)
def _second(second: int) -> str:
    """
    The UTC date and time of one whole second; cached, as every line within
    that second shares it (strftime is a large part of a log line's cost).
    """
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))


#: The last millisecond a line was stamped with, and its text: the lines of
#: the reviews answered in one turn share it.
_last_stamp: tuple[int, str] = (-1, "")


def _timestamp(when: float) -> str:
    global _last_stamp
    millisecond = int(when * 1000)
    last, text = _last_stamp
    if millisecond == last:
        return text
    second = millisecond // 1000
    text = f"{_second(second)}.{millisecond - second * 1000:03d}Z"
    _last_stamp = (millisecond, text)
    return text


_ALL_LEVELS = frozenset(LogLevel.iterconstants())


class HotPathLogger(Logger):
    """
    A C{Logger} for a line written for every review: its C{emit} does what
    Twisted's does, but checks that the level is one of L{LogLevel}'s with a
    set lookup, where Twisted's walks C{LogLevel}'s constants, sorted anew,
    on every event (a sixth of a review's log line).
    """

    def emit(self, level: LogLevel, format: Optional[str] = None, **kwargs: object) -> None:
        if level not in _ALL_LEVELS:
            # Twisted's own says what is wrong with it.
            return super().emit(level, format, **kwargs)
        kwargs.update(
            log_logger=self,
            log_level=level,
            log_namespace=self.namespace,
            log_source=self.source,
            log_format=format,
            log_time=time.time(),
        )
        if "log_trace" in kwargs:
            kwargs["log_trace"].append((self, self.observer))  # type: ignore[attr-defined]  # a list, by Twisted's contract
        self.observer(kwargs)


class _HeldLines:
    """
    Lines put off while lines are written together (L{lines_together}, the
    context manager this is), per output, to be written with one call and
    flushed once.  One object, its state a depth: the generator-based
    context manager it replaced cost more every reactor turn
    (bench/README.md, "Figures behind the code").

    The output's own buffering cannot be relied on for that: with
    C{PYTHONUNBUFFERED=1} (set in amp's container image, and common in
    others) every C{write} of a text stream is a system call, one per
    review's log line.
    """

    __slots__ = ("depth", "owed", "thread")

    def __init__(self) -> None:
        self.depth = 0
        #: The lines held for each output, by its (write, flush).
        self.owed: dict[tuple[Callable[[str], Any], Callable[[], Any]], list[str]] = {}
        #: The thread writing lines together (another writes at once).
        self.thread = 0

    def __enter__(self) -> None:
        if not self.depth:
            self.thread = get_ident()
        self.depth += 1

    def __exit__(self, *exc_info: object) -> None:
        self.depth -= 1
        if not self.depth:
            owed, self.owed = self.owed, {}
            for (write, flush), lines in owed.items():
                write(lines[0] if len(lines) == 1 else "".join(lines))
                flush()

    def write(self, out: tuple[Callable[[str], Any], Callable[[], Any]], line: str) -> None:
        """Write and flush C{line} now, or once the lines written together are done."""
        if not self.depth or get_ident() != self.thread:
            out[0](line)
            out[1]()
            return
        held = self.owed.get(out)
        if held is None:
            self.owed[out] = [line]
        else:
            held.append(line)


_held = _HeldLines()


def lines_together() -> _HeldLines:
    """
    Lines logged inside are written together, with one write and one
    flush per output at the end (for the reviews answered in one turn of
    the reactor).  Only for the reactor thread: a line from another
    thread is written at once, so it may come before lines of this
    thread's that were logged earlier but are still held.
    """
    return _held


@implementer(ILogObserver)
class TextLinesObserver:
    """
    Twisted's classic text lines (C{<time> [<namespace>#<level>] <message>}),
    with the time formatted once per second instead of once per line.
    """

    def __init__(self, out: IO[str]) -> None:
        self._out = (out.write, out.flush)

    def __call__(self, event: LogEvent) -> None:
        text = format_event(event)
        failure = event.get("log_failure")
        if isinstance(failure, Failure):
            text = f"{text}\n{failure.getTraceback()}"
        level = event.get("log_level")
        line = (
            f"{_timestamp(event.get('log_time', time.time()))} "
            f"[{event.get('log_namespace', '-')}#{level.name if level is not None else 'info'}] {text}\n"
        )
        if "\n" in text:
            line = line[:-1].replace("\n", "\n\t") + "\n"
        _held.write(self._out, line)


def event_as_json(event: LogEvent) -> str:
    """
    One log event as a single line of JSON.
    """
    level = event.get("log_level")
    out: dict[str, Any] = {
        "time": _timestamp(event.get("log_time", time.time())),
        "level": level.name if level is not None else "info",
        "logger": event.get("log_namespace", ""),
        "message": format_event(event),
    }
    for key, value in event.items():
        if key.startswith("log_") or key in out or key in _LEGACY_NOISE:
            continue
        if key == "system" and value == "-":
            continue
        out[key] = _field(value)
    failure = event.get("log_failure")
    if not isinstance(failure, Failure):
        failure = event.get("failure")
    if isinstance(failure, Failure):
        out["error"] = failure.getErrorMessage()
        out["traceback"] = failure.getTraceback()
    # In C: a third of a line's cost with json.dumps.  Every value is a
    # JSON value by now (_field): no NaN or Infinity reaches the encoder.
    try:
        return _encode(out).decode("utf-8")
    except UnicodeEncodeError:
        # A lone surrogate (from a file name, say): escaped as \udxxx.
        return json.dumps(out, separators=(",", ":"), allow_nan=False)


def _fallback(event: LogEvent, error: Exception) -> str:
    """
    The line written for an event that could not be turned into JSON.
    """
    level = event.get("log_level")
    return json.dumps(
        {
            "time": _timestamp(time.time()),
            "level": level.name if isinstance(level, LogLevel) else "info",
            "logger": str(event.get("log_namespace", "")),
            "message": "log event could not be written as JSON",
            "error": repr(error),
        },
        separators=(",", ":"),
    )


@implementer(ILogObserver)
class JSONLinesObserver:
    """
    Write each event as one JSON object and a newline.
    """

    def __init__(self, out: IO[str]) -> None:
        self._out = (out.write, out.flush)

    def __call__(self, event: LogEvent) -> None:
        try:
            line = event_as_json(event)
        except Exception as e:
            line = _fallback(event, e)
        _held.write(self._out, line + "\n")


@implementer(ILogObserver)
class _LevelFilter:
    """
    What C{FilteringLogObserver} with a C{LogLevelFilterPredicate} of one
    default level (and, above debug, without Twisted's per-connection chatter) lets through, decided
    with a set lookup: Twisted's predicate ranks levels through
    C{constantly}'s sorted constants on every event, a tenth of a review's
    log line.
    """

    def __init__(self, observer: ILogObserver, level: str) -> None:
        self._observer = observer
        lowest = _LEVELS[level]
        self._kept = frozenset(each for each in LogLevel.iterconstants() if each >= lowest)
        self._quiet = level != "debug"

    def __call__(self, event: LogEvent) -> None:
        level = event.get("log_level")
        if level not in self._kept or event.get("log_namespace") is None:
            return
        if self._quiet and level is LogLevel.info and event.get("log_format") in CHATTER_FORMATS:
            return
        self._observer(event)


def make_observer(fmt: str, level: str, out: IO[str]) -> ILogObserver:
    """
    The observer for C{log.format} (C{text} or C{json}) and C{log.level}
    (C{debug}, C{info}, C{warn} or C{error}), writing to C{out}.
    """
    return _LevelFilter(JSONLinesObserver(out) if fmt == "json" else TextLinesObserver(out), level)


@implementer(ILogObserver)
class ConfigurableObserver:
    """
    The observer for C{log.format} and C{log.level} that a config reload
    can change (L{configure}) while twistd keeps the same observer.
    """

    def __init__(self, fmt: str, level: str, out: IO[str]) -> None:
        self._out = out
        self.configure(fmt, level)

    def configure(self, fmt: str, level: str) -> None:
        """Write every event from now on in C{fmt}, dropping those below C{level}."""
        self.format = fmt
        self.level = level
        self._observer = make_observer(fmt, level, self._out)

    def __call__(self, event: LogEvent) -> None:
        self._observer(event)


class _Kind:
    """The state of one kind of repeated warning (see L{RepeatLimiter})."""

    __slots__ = ("summary", "logged", "suppressed", "flooding", "timer")

    def __init__(self, summary: str) -> None:
        self.summary = summary
        self.logged = 0
        self.suppressed = 0
        self.flooding = False
        self.timer: Optional[IDelayedCall] = None


class RepeatLimiter:
    """
    Keeps one kind of repeated line (a connection refused, a client timed
    out, a request refused) from flooding the log: in each interval of
    C{interval} seconds on the reactor's clock, the first C{burst} lines of
    a kind are written; the rest are counted, and one summary line with the
    count is written when the interval ends.  While a kind keeps coming,
    each later interval writes just its summary; an interval without any
    resets the kind, so its next line is written again.

    Callers count every event in their metrics themselves: only the log is
    limited.

    @param summaries: for each kind, the summary's subject, e.g.
        C{"connections refused over listen.max_connections"}; the summary
        reads C{"<count> more <subject> in the last <interval>s (...)"}.
    """

    def __init__(
        self, logger: Logger, clock: IReactorTime, summaries: dict[str, str], *, burst: int = 5, interval: float = 60.0
    ) -> None:
        self._logger = logger
        self._clock = clock
        self.burst = burst
        self.interval = interval
        self._kinds = {kind: _Kind(summary) for kind, summary in summaries.items()}

    def emit(self, kind: str, level: LogLevel, format: str, **fields: Any) -> None:
        """
        Write C{format} with C{fields} at C{level}, unless C{kind} has had
        its C{burst} lines in this interval.
        """
        state = self._kinds[kind]
        if state.timer is None:
            state.timer = self._clock.callLater(self.interval, self._interval_over, state)
        if state.flooding or state.logged >= self.burst:
            state.suppressed += 1
            return
        state.logged += 1
        self._logger.emit(level, format, **fields)

    def _interval_over(self, state: _Kind) -> None:
        state.timer = None
        state.logged = 0
        if not state.suppressed:
            state.flooding = False
            return
        self._summarise(state)
        state.flooding = True
        state.timer = self._clock.callLater(self.interval, self._interval_over, state)

    def _summarise(self, state: _Kind) -> None:
        self._logger.warn(
            "{count} more {subject} in the last {interval:g}s (only the first {burst} of a burst are logged)",
            count=state.suppressed,
            subject=state.summary,
            interval=self.interval,
            burst=self.burst,
        )
        state.suppressed = 0

    def flush(self) -> None:
        """
        Write the summaries of what is counted and not yet written, and stop
        every timer (the listener is stopping).
        """
        for state in self._kinds.values():
            if state.timer is not None:
                if state.timer.active():
                    state.timer.cancel()
                state.timer = None
            if state.suppressed:
                self._summarise(state)
            state.logged = 0
            state.flooding = False
