"""
The webhook listener's fixed limits and the words it uses for them: the
longest request line and header line, the most header fields, the most
bytes of a request's head, the grace a connection amp closes has to close,
and the kinds of repeated warnings it limits.

The limits a config sets (C{listen.max_body}, C{listen.request_timeout},
C{listen.idle_timeout}, C{listen.max_connections}) live on the
L{amp.http.HTTPServerFactory}; these are the ones no config changes.
"""

from __future__ import annotations

from http import HTTPStatus

#: Longest request line or header line, in bytes.  The API server's are far
#: shorter.
MAX_LINE = 8192

#: Most header fields in one request.
MAX_HEADERS = 100

#: Most bytes of request line and headers together.
MAX_HEAD_BYTES = 16384

#: Seconds a connection amp is closing may take to close: after a refusal,
#: the client's remaining input is read and dropped meanwhile; after an
#: idle timeout, the client must take the close.  Then it is aborted.
CLOSE_GRACE = 1.0

#: Bytes of input dropped after a refusal before the connection is aborted
#: without waiting for the rest of L{CLOSE_GRACE}.
LINGER_BYTES = 4 * 1024 * 1024

#: The listener's kinds of repeated warnings (L{amp.logs.RepeatLimiter}):
#: at most L{WARNING_BURST} lines of a kind per L{WARNING_INTERVAL} seconds,
#: then one summary line per interval.
WARNING_KINDS = {
    "connections-refused": "connections refused over listen.max_connections",
    "timed-out": "clients timed out (listen.request_timeout)",
    "refused": "requests refused before review (400, 413, 414, 431, 501)",
    "bad-reviews": "requests that were not valid AdmissionReviews (400, 415)",
}
WARNING_BURST = 5
WARNING_INTERVAL = 60.0

#: The status line of every code, built once.
STATUS_LINES = {
    status.value: b"HTTP/1.1 %d %s\r\n" % (status.value, status.phrase.encode("ascii")) for status in HTTPStatus
}
# RFC 9110's name (older Pythons still say "Request Entity Too Large").
STATUS_LINES[413] = b"HTTP/1.1 413 Content Too Large\r\n"


def status_line(code: int) -> bytes:
    """
    C{HTTP/1.1 <code> <reason>\\r\\n}, for any code.
    """
    line = STATUS_LINES.get(code)
    if line is None:
        line = b"HTTP/1.1 %d Status\r\n" % code
    return line
