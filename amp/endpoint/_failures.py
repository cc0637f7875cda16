"""
Naming what went wrong with an endpoint call: L{EndpointFailure} and its
amp-side kind L{LocalFailure}, and L{classify}, which turns whatever a
request failed with (a connect error from Twisted, a reply refused by
L{amp.http}) into one of L{amp.reasons.ENDPOINT_REASONS}.
"""

from __future__ import annotations

from typing import Any, Optional

from OpenSSL import SSL
from twisted.internet import error as ierror
from twisted.internet.defer import CancelledError
from twisted.python.failure import Failure

from amp.config import EndpointSettings
from amp.http import BodyTooLarge, BufferFull, ConnectionClosed, HeadTooLarge, MalformedReply, ReplyFailed
from amp.reasons import Reason

try:
    from service_identity import VerificationError
except ImportError:  # pragma: no cover - service_identity is a dependency
    VerificationError = SSL.Error  # type: ignore[misc,assignment]  # a stand-in class, never raised


class EndpointFailure(Exception):
    """
    An endpoint call that did not produce a usable reply.

    @ivar reason: one of L{amp.reasons.ENDPOINT_REASONS}.
    @ivar message: what happened, for the warning, the audit annotation and
        the deny message.
    """

    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


class LocalFailure(EndpointFailure):
    """
    A failure on amp's side (TLS files that do not load, a URL amp cannot
    encode, an address amp's policy denies, amp's own memory budget): named
    like the others, but it says nothing about the endpoint's health, so the
    breaker does not count it.
    """


def first_line(value: Any) -> str:
    """
    The first line of C{str(value)}, at most 100 characters.
    """
    text = str(value) or type(value).__name__
    return text.splitlines()[0][:100]


def classify(failure: Failure, settings: Optional[EndpointSettings] = None) -> EndpointFailure:
    """
    Name what went wrong with a call that ended in C{failure}.  An
    L{EndpointFailure} is returned as it is, so that a L{LocalFailure} stays
    one.
    """
    value = failure.value
    if isinstance(value, EndpointFailure):
        return value
    if isinstance(value, ReplyFailed):
        return _reply_failure(value)
    if failure.check(ierror.ConnectionRefusedError):
        return EndpointFailure(Reason.CONNECTION_REFUSED, "connection refused")
    if failure.check(ierror.TimeoutError, ierror.TCPTimedOutError):
        within = f" within {settings.connect_timeout:.3g}s" if settings is not None else ""
        return EndpointFailure(Reason.TIMEOUT, f"could not connect{within}")
    tls = _tls_failure(failure)
    if tls is not None:
        return tls
    if failure.check(ierror.ConnectionLost, ierror.ConnectionDone):
        return EndpointFailure(Reason.CONNECTION_RESET, "connection closed before a full reply")
    if failure.check(CancelledError, ierror.ConnectingCancelledError):
        return EndpointFailure(Reason.TIMEOUT, "call cancelled before a reply")
    if failure.check(ierror.DNSLookupError):
        return EndpointFailure(Reason.CONNECTION_FAILED, "host name did not resolve")
    if failure.check(ierror.ConnectError):
        return EndpointFailure(Reason.CONNECTION_FAILED, f"could not connect: {first_line(failure.value)}")
    return EndpointFailure(Reason.CONNECTION_FAILED, first_line(failure.value))


def _reply_failure(e: ReplyFailed) -> EndpointFailure:
    """
    The name of a reply L{amp.http} refused, or of a connection that ended
    before a whole reply (a TLS failure is named as one).
    """
    if isinstance(e, HeadTooLarge):
        return EndpointFailure(Reason.RESPONSE_HEADERS_TOO_LARGE, e.message)
    if isinstance(e, BodyTooLarge):
        return EndpointFailure(Reason.RESPONSE_TOO_LARGE, e.message)
    if isinstance(e, BufferFull):
        # amp's own limit, reached by every call in flight together.
        return LocalFailure(Reason.REPLY_BUFFER_FULL, e.message)
    if isinstance(e, MalformedReply):
        return EndpointFailure(Reason.INVALID_REPLY, e.message)
    if isinstance(e, ConnectionClosed):
        tls = _tls_failure(e.reason)
        if tls is not None:
            return tls
    return EndpointFailure(Reason.CONNECTION_RESET, e.message)


def _tls_failure(failure: Failure) -> Optional[EndpointFailure]:
    if failure.check(SSL.Error):
        return EndpointFailure(Reason.TLS_ERROR, f"TLS failed: {_ssl_text(failure.value)}")
    if failure.check(VerificationError):
        return EndpointFailure(Reason.TLS_ERROR, f"certificate does not match the host: {first_line(failure.value)}")
    return None


def _ssl_text(value: Any) -> str:
    try:
        parts = [p[-1] for p in value.args[0] if p and p[-1]]
    except (IndexError, TypeError):
        parts = []
    return "; ".join(parts)[:100] if parts else first_line(value)


def retriable(failure: Failure) -> bool:
    """
    Whether a retry may follow C{failure}: only failures where the endpoint
    cannot have seen the request, and never a timeout.
    """
    return bool(failure.check(ierror.ConnectError)) and not failure.check(ierror.TimeoutError, ierror.TCPTimedOutError)


#: Failures a call can end in without anything being wrong in amp; anything
#: else is logged with its traceback.
EXPECTED = (
    EndpointFailure,
    ReplyFailed,
    ierror.ConnectError,
    ierror.ConnectionLost,
    ierror.ConnectionDone,
    ierror.DNSLookupError,
    ierror.ConnectingCancelledError,
    CancelledError,
    SSL.Error,
    VerificationError,
)
