"""
The rules of a request's head that llhttp leaves to amp (pure): the Host
header field, the request target's form, and the transfer codings amp
reads.  Each returns what is wrong, for the listener's refusal, or None.

  - Host (RFC 9112 section 3.2): an HTTP/1.1 request without one, any
    request with more than one, or with a value that is not
    C{uri-host [":" port]} (RFC 3986) is refused with 400.  An empty
    value is valid (a target without an authority).
  - The target (section 3.2): origin form (C{/mutate?timeout=10s}) as the
    API server sends it, and absolute form (C{https://host:port/mutate}),
    which a server MUST accept (section 3.2.2): its path and query are
    read, its authority checked as a Host value and otherwise not used
    (amp serves every name it is reached by).  Another scheme is 400.
    Authority form (C{CONNECT host:port}) and C{*} are paths amp does
    not serve (404).
  - Transfer-Encoding (section 6.1, RFC 9110 section 5.5): the codings of
    every Transfer-Encoding field, read without the whitespace around
    them and without regard to case, must be C{chunked} alone.  A coding
    amp does not implement before a final chunked (C{gzip, chunked}) is
    501 (section 6.1), not read as if the body were plain; codings that
    do not end in one chunked (C{gzip}, C{chunked, gzip}) leave the body's
    end unknown: 400 (section 6.3).  Either closes the connection.
"""

from __future__ import annotations

import re
from typing import Optional

__all__ = ["absolute_target", "head_problem", "host_problem", "spaced", "transfer_coding_problem", "OWS"]

#: Optional whitespace around a field value (RFC 9110 section 5.6.3).
OWS = b" \t"

#: C{uri-host [":" port]}: an IP literal in brackets, or a reg-name (an
#: IPv4 address is one) of unreserved characters, sub-delims and
#: percent-escapes; then an optional port of digits.
_HOST = re.compile(rb"(?:\[[0-9A-Za-z:._~!$&'()*+,;=-]+\]|(?:[A-Za-z0-9._~!$&'()*+,;=-]|%[0-9A-Fa-f]{2})*)(?::[0-9]*)?")

#: A reg-name's characters without percent-escapes, and the port's colon.
_NAME_OR_COLON = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~!$&'()*+,;=:"

#: Tabs at a line's end, before its CR or LF (see L{spaced}).
_TRAILING_TABS = re.compile(rb"\t(?=[ \t]*\r?\n)")

#: The schemes of an absolute-form target amp answers.
_SCHEMES = (b"http://", b"https://")


def host_problem(value: bytes) -> Optional[str]:
    """
    What is wrong with a Host field's value (its surrounding whitespace
    ignored), or None.
    """
    value = value.strip(OWS)
    if not value.translate(None, _NAME_OR_COLON):
        # The usual value, checked in C: a name and perhaps a port.
        _, _, port = value.partition(b":")
        if not port or port.isdigit():
            return None
    elif _HOST.fullmatch(value) is not None:
        return None
    return f"Host {_shown(value)} is not a valid host[:port] (RFC 9112 section 3.2)"


def absolute_target(url: bytes) -> tuple[Optional[bytes], Optional[str]]:
    """
    An absolute-form target's path and query (from its first C{/} or
    C{?} after the authority; C{/} when it has none), or what is wrong
    with it.  Called for a target that holds C{://} and does not begin
    with C{/}.
    """
    lowered = url[:8].lower()
    scheme = next((s for s in _SCHEMES if lowered.startswith(s)), None)
    if scheme is None:
        return None, (f"request target {_shown(url)} is neither a path nor an http(s) URL (RFC 9112 section 3.2)")
    rest = url[len(scheme) :]
    cut = len(rest)
    for mark in (b"/", b"?", b"#"):
        at = rest.find(mark)
        if 0 <= at < cut:
            cut = at
    authority = rest[:cut]
    if not authority or b"@" in authority or _HOST.fullmatch(authority) is None:
        return None, f"request target {_shown(url)} has no valid host[:port] (RFC 9112 section 3.2.2)"
    target = rest[cut:]
    if not target.startswith(b"/"):
        target = b"/" + target
    return target, None


def transfer_coding_problem(value: bytes) -> Optional[tuple[int, str]]:
    """
    The status and message refusing the codings of the Transfer-Encoding
    fields C{value} (their values joined by commas), or None when it is
    C{chunked} alone.
    """
    # Empty list elements are ignored (RFC 9110 section 5.6.1.2).
    codings = [c for c in (c.strip(OWS).lower() for c in value.split(b",")) if c]
    if codings == [b"chunked"]:
        return None
    shown = ", ".join(c.decode("ascii", "replace") for c in codings)
    if codings[-1:] != [b"chunked"] or codings.count(b"chunked") > 1:
        # The body's end cannot be known (section 6.3): a 400 that closes.
        return 400, (
            f"request is not valid HTTP/1.1: Transfer-Encoding {shown!r}: chunked must be applied "
            f"once, last (RFC 9112 section 6.3)"
        )
    unknown = next(c for c in codings if c != b"chunked").decode("ascii", "replace")
    return 501, (
        f"Transfer-Encoding {shown!r}: amp does not implement the transfer coding {unknown!r}, "
        f"only chunked (RFC 9112 section 6.1)"
    )


def head_problem(hosts: int, host: bytes, te: Optional[bytes], http10: bool) -> Optional[tuple[int, str]]:
    """
    The refusal (status, message) of a head with C{hosts} Host fields
    (the last one's value C{host}) and the Transfer-Encoding C{te} (every
    field's value joined by commas, or None), or None when RFC 9112 allows
    it.
    """
    if hosts != 1:
        if hosts or not http10:
            return 400, (
                f"request is not valid HTTP/1.1: {hosts or 'no'} Host header fields, "
                f"exactly one is required (RFC 9112 section 3.2)"
            )
    else:
        problem = host_problem(host)
        if problem is not None:
            return 400, f"request is not valid HTTP/1.1: {problem}"
    if te is not None:
        return transfer_coding_problem(te)
    return None


def spaced(data: bytes) -> bytes:
    """
    C{data}, a read that began outside a body, with each tab at the end of
    one of its head's lines read as a space: whitespace after a field
    value is not part of it (RFC 9110 section 5.5), and llhttp takes
    trailing spaces but not tabs (C{chunked<TAB>} would not be chunked).
    The same length, so every count of the head stands; the body after
    the head's blank line is left as it is.
    """
    end = data.find(b"\r\n\r\n")
    end = len(data) if end < 0 else end + 2
    return _TRAILING_TABS.sub(b" ", data[:end]) + data[end:]


def _shown(value: bytes, limit: int = 80) -> str:
    """C{value} quoted for a message, printable, cut at C{limit} bytes."""
    text = repr(value[:limit])[1:]
    return text + ("..." if len(value) > limit else "")
