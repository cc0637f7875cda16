"""
The pipe between amp and its recording writer process (pure): frames of
bytes toward the writer, short lines back.

Toward the writer, on its standard input, length-prefixed frames: four
bytes (big-endian) telling how many follow, a kind byte, then the body:

 - C{S}, the first frame: the settings (L{WriterSettings}, as JSON).
 - C{C}, one per review: three four-byte lengths (the head, the request
   body, the answer body), then the head (the small fields of the
   L{Capture}, a tuple in L{marshal}'s format), then the two bodies as amp
   holds them.

The head is built on the reactor thread for every review recorded:
L{marshal} does it in a fifth of the time C{json.dumps} takes (a typical
review's fields; bench/README.md, "Figures behind the code").  Its format is the interpreter's own and it is not meant
for data from elsewhere; here it only crosses a pipe from amp to a child
amp started with the same interpreter, and the writer checks the shape of
what it reads.

Back, on its standard output, one short line per burst of work:

 - C{R <written> <failed> <done> <state>}: lines written and failed since
   the last report, the bytes of reviews (request and answer bodies) it is
   done with, and the disk's state (empty while the disk takes lines, else
   what it says when it refuses them);
 - C{P <problem>}: one review was not recorded for a reason of its own (a
   line larger than a file, a review the writer could not encode), for the
   log.
"""

from __future__ import annotations

import json
import marshal
import struct
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence, Union

from amp.record._entry import Capture

__all__ = [
    "FrameError",
    "FrameReader",
    "LineReader",
    "Problem",
    "Report",
    "WriterSettings",
    "capture_frame",
    "decode_capture",
    "decode_report",
    "decode_settings",
    "problem_line",
    "report_line",
    "review_frame",
    "settings_frame",
]

SETTINGS = b"S"
CAPTURE = b"C"

#: The most bytes one frame may hold: a review (at most 3 MiB from the API
#: server, at most C{listen.max_body} amp reads) and amp's answer, with
#: room to spare.  A larger length is a broken pipe, not a review.
FRAME_LIMIT = 256 * 1024 * 1024

#: The most bytes of one line back before it ends: a report is short.
LINE_LIMIT = 64 * 1024

_LENGTH = struct.Struct(">I")
#: A capture frame's length, kind and the three lengths of its parts.
_CAPTURE_HEAD = struct.Struct(">IcIII")
_PARTS = struct.Struct(">III")


class FrameError(ValueError):
    """Bytes on the pipe that are not a frame of this module's."""


@dataclass(frozen=True)
class WriterSettings:
    """
    What one writer process is started with: the C{record} section's
    settings for its files, amp's bounds on what waits for it (in reviews
    and in bytes: it reports early when a quarter of either is done), and
    redaction's key and the annotations it keeps.
    """

    directory: str
    file_size: int
    max_size: int
    queue: int
    queue_bytes: int
    redact: bool
    key: bytes
    keep_prefixes: tuple[str, ...]
    keep_names: tuple[str, ...]


def settings_frame(settings: WriterSettings) -> bytes:
    """The first frame a writer reads."""
    body = json.dumps(
        {
            "directory": settings.directory,
            "file_size": settings.file_size,
            "max_size": settings.max_size,
            "queue": settings.queue,
            "queue_bytes": settings.queue_bytes,
            "redact": settings.redact,
            "key": settings.key.hex(),
            "keep_prefixes": list(settings.keep_prefixes),
            "keep_names": list(settings.keep_names),
        }
    ).encode()
    return _LENGTH.pack(1 + len(body)) + SETTINGS + body


def decode_settings(body: bytes) -> WriterSettings:
    try:
        data = json.loads(body)
        return WriterSettings(
            directory=str(data["directory"]),
            file_size=int(data["file_size"]),
            max_size=int(data["max_size"]),
            queue=int(data["queue"]),
            queue_bytes=int(data["queue_bytes"]),
            redact=bool(data["redact"]),
            key=bytes.fromhex(data["key"]),
            keep_prefixes=tuple(str(p) for p in data["keep_prefixes"]),
            keep_names=tuple(str(n) for n in data["keep_names"]),
        )
    except (ValueError, KeyError, TypeError) as e:
        raise FrameError(f"settings frame: {type(e).__name__}: {e}") from None


def review_frame(
    time: float,
    uid: str,
    namespace: str,
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    endpoints: Sequence[str],
    failure_policy: str,
    mode: str,
    request_body: bytes,
    answer_body: bytes,
    result: str,
    reason: str,
    trace_id: str = "",
) -> tuple[bytes, ...]:
    """
    The frame of one review (a L{Capture}'s fields), in four pieces for
    C{writeSequence}: the two bodies are passed on as they are, never
    copied into one string here.
    """
    head = marshal.dumps(
        (
            float(time),
            uid,
            namespace,
            dict(labels),
            dict(annotations),
            tuple(endpoints),
            str(failure_policy),
            str(mode),
            str(result),
            str(reason),
            str(trace_id),
        )
    )
    size = _CAPTURE_HEAD.size - _LENGTH.size + len(head) + len(request_body) + len(answer_body)
    return (
        _CAPTURE_HEAD.pack(size, CAPTURE, len(head), len(request_body), len(answer_body)),
        head,
        request_body,
        answer_body,
    )


def capture_frame(capture: Capture) -> tuple[bytes, ...]:
    """The frame of C{capture} (L{review_frame})."""
    c = capture
    return review_frame(
        c.time,
        c.uid,
        c.namespace,
        c.labels,
        c.annotations,
        c.endpoints,
        c.failure_policy,
        c.mode,
        c.request_body,
        c.answer_body,
        c.result,
        c.reason,
        c.trace_id,
    )


def _strings(value: Any) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise FrameError("capture frame: not a map of strings")
    return value


def decode_capture(body: bytes) -> Capture:
    """The L{Capture} of a C{C} frame's body (the kind byte excluded)."""
    if len(body) < _PARTS.size:
        raise FrameError("capture frame: too short")
    head_size, request_size, answer_size = _PARTS.unpack_from(body)
    at = _PARTS.size
    if at + head_size + request_size + answer_size != len(body):
        raise FrameError("capture frame: lengths do not add up")
    try:
        head = marshal.loads(body[at : at + head_size])
    except (ValueError, EOFError, TypeError) as e:
        raise FrameError(f"capture frame: {e}") from None
    if not isinstance(head, tuple) or len(head) != 11:
        raise FrameError("capture frame: the head is not eleven fields")
    time, uid, namespace, labels, annotations, endpoints, failure_policy, mode, result, reason, trace_id = head
    texts = (uid, namespace, failure_policy, mode, result, reason, trace_id)
    if (
        not isinstance(time, float)
        or not all(isinstance(t, str) for t in texts)
        or not isinstance(endpoints, tuple)
        or not all(isinstance(e, str) for e in endpoints)
    ):
        raise FrameError("capture frame: a field of the wrong type")
    at += head_size
    request = body[at : at + request_size]
    answer = body[at + request_size :]
    return Capture(
        time,
        uid,
        namespace,
        _strings(labels),
        _strings(annotations),
        endpoints,
        failure_policy,
        mode,
        request,
        answer,
        result,
        reason,
        trace_id,
    )


class FrameReader:
    """Cuts the bytes read from the pipe into frames, C{(kind, body)}."""

    def __init__(self, limit: int = FRAME_LIMIT) -> None:
        self._buffer = bytearray()
        self._limit = limit

    @property
    def buffered(self) -> int:
        """Bytes read that do not make a whole frame yet."""
        return len(self._buffer)

    def feed(self, data: bytes) -> list[tuple[bytes, bytes]]:
        """The frames C{data} completes; L{FrameError} for bytes that are no frame."""
        buffer = self._buffer
        buffer += data
        frames = []
        at, end = 0, len(buffer)
        while end - at >= 4:
            (size,) = _LENGTH.unpack_from(buffer, at)
            if not 1 <= size <= self._limit:
                raise FrameError(f"a frame of {size} bytes")
            if end - at - 4 < size:
                break
            frames.append((bytes(buffer[at + 4 : at + 5]), bytes(buffer[at + 5 : at + 4 + size])))
            at += 4 + size
        del buffer[:at]
        return frames


# ---------------------------------------------------------------- back


@dataclass(frozen=True)
class Report:
    """A burst of the writer's work (see the module docstring)."""

    written: int
    failed: int
    done: int
    state: str


@dataclass(frozen=True)
class Problem:
    """One review not recorded, for a reason of its own."""

    message: str


def _one_line(text: str) -> str:
    return " ".join(text.split())


def report_line(written: int, failed: int, done: int, state: str) -> bytes:
    return f"R {written} {failed} {done} {_one_line(state)}".encode("utf-8", "replace")[: LINE_LIMIT - 1] + b"\n"


def problem_line(message: str) -> bytes:
    return f"P {_one_line(message)}".encode("utf-8", "replace")[: LINE_LIMIT - 1] + b"\n"


def decode_report(line: bytes) -> Union[Report, Problem]:
    """A line back from the writer; L{FrameError} for one that is neither."""
    text = line.decode("utf-8", "replace").removesuffix("\n")
    if text.startswith("P "):
        return Problem(text[2:])
    parts = text.split(" ", 4)
    if len(parts) >= 4 and parts[0] == "R":
        try:
            return Report(int(parts[1]), int(parts[2]), int(parts[3]), parts[4] if len(parts) == 5 else "")
        except ValueError:
            pass
    raise FrameError(f"not a line of the writer's: {text[:80]!r}")


class LineReader:
    """Cuts the writer's output into lines; a line past L{LINE_LIMIT} is cut there."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> Iterable[bytes]:
        buffer = self._buffer + data
        *lines, rest = buffer.split(b"\n")
        if len(rest) >= LINE_LIMIT:
            lines.append(rest)
            rest = b""
        self._buffer = rest
        return lines
