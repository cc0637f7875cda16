"""
How one connection (L{amp.http._server}) refuses, off its hot path: which
limit a head still arriving, or a chunked body's framing, is over; the
parser's error named; the refusal counted and warned of; and the answer
that refuses, written as one bytes join.
"""

from __future__ import annotations

from httptools import HttpParserCallbackError, HttpParserError
from twisted.logger import Logger, LogLevel
from twisted.python.failure import Failure

from amp.http._limits import MAX_HEAD_BYTES, MAX_LINE, status_line
from amp.http._request import IListener


def head_over(line: int, in_fields: bool) -> tuple[int, str]:
    """
    The refusal of a head still arriving, over a limit: its current line
    (C{line} bytes so far; a header line when C{in_fields}, else the request
    line), else the whole of it.
    """
    if line > MAX_LINE:
        if in_fields:
            return 431, f"a header line is over {MAX_LINE} bytes"
        return 414, f"request line is over {MAX_LINE} bytes"
    return 431, f"request headers are over {MAX_HEAD_BYTES} bytes"


def framing_over(framing: int, chunks: int) -> bool:
    """
    C{framing} bytes of chunk framing or trailers in C{chunks} chunks,
    which llhttp skips (chunk extensions) or httptools holds (trailers)
    without a limit, are over amp's: L{MAX_HEAD_BYTES} and 32 bytes per chunk.
    """
    return framing > MAX_HEAD_BYTES + 32 * chunks


def parser_error(e: HttpParserError, log: Logger) -> str:
    """The refusal's message for llhttp's error C{e}; one raised by amp's own callback is logged as amp's bug."""
    cause = e.__context__
    if isinstance(e, HttpParserCallbackError) and cause is not None:
        # Not the client's doing: one of the connection's callbacks.
        log.failure("amp internal error parsing a request", Failure(cause))
    reason = str(e) or type(e).__name__
    return f"request is not valid HTTP/1.1: {reason}"


def refused(factory: IListener, code: int, message: str) -> None:
    """A refusal counted (C{bad_requests}) and warned of (repeats limited)."""
    factory.metrics.bad_requests.labels(str(code)).inc()
    factory.warnings.emit(
        "timed-out" if code == 408 else "refused",
        LogLevel.warn,
        "Refused a request: {code} {message}",
        code=code,
        message=message,
    )


def refusal(code: int, message: str) -> bytes:
    """The answer that refuses with C{code} and C{message}, closing the connection."""
    body = message.encode("utf-8") + b"\n"
    return b"%sContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (
        status_line(code),
        len(body),
        body,
    )
