"""
Log output: text lines, or one JSON object per line (C{log.format: json}).

Events come from C{twisted.logger}; the JSON form carries the event's
keyword fields (uid, namespace, pod, endpoint, result, duration_ms, ...) as
top-level keys beside C{time}, C{level}, C{logger} and C{message}.  Fields
that cannot be represented in JSON are written as their C{repr}.
"""

from __future__ import annotations

import json
import time
from typing import IO, Any, Callable

from twisted.logger import (
    FilteringLogObserver,
    ILogObserver,
    LogLevel,
    LogLevelFilterPredicate,
    formatEvent,
    textFileLogObserver,
)
from twisted.python.failure import Failure
from zope.interface import implementer

_LEVELS = {"debug": LogLevel.debug, "info": LogLevel.info, "warn": LogLevel.warn, "error": LogLevel.error}


def _field(value: Any) -> Any:
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, (list, tuple)):
        return [_field(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _field(v) for k, v in value.items()}
    return repr(value)


def event_as_json(event: dict) -> str:
    """
    One log event as a single line of JSON.
    """
    level = event.get("log_level")
    out: dict[str, Any] = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(event.get("log_time", time.time())))
        + f".{int((event.get('log_time', 0) % 1) * 1000):03d}Z",
        "level": level.name if level is not None else "info",
        "logger": event.get("log_namespace", ""),
        "message": formatEvent(event),
    }
    for key, value in event.items():
        if key.startswith("log_") or key in out or key == "format":
            continue
        out[key] = _field(value)
    failure = event.get("log_failure")
    if isinstance(failure, Failure):
        out["error"] = failure.getErrorMessage()
        out["traceback"] = failure.getTraceback()
    return json.dumps(out, separators=(",", ":"), ensure_ascii=False)


@implementer(ILogObserver)
class JSONLinesObserver:
    """
    Write each event as one JSON object and a newline.
    """

    def __init__(self, out: IO[str]) -> None:
        self._write: Callable[[str], Any] = out.write
        self._flush = out.flush

    def __call__(self, event: dict) -> None:
        self._write(event_as_json(event) + "\n")
        self._flush()


def make_observer(fmt: str, level: str, out: IO[str]) -> ILogObserver:
    """
    The observer for C{log.format} and C{log.level}, writing to C{out}.
    """
    base = JSONLinesObserver(out) if fmt == "json" else textFileLogObserver(out)
    return FilteringLogObserver(base, [LogLevelFilterPredicate(defaultLogLevel=_LEVELS[level])])
