"""
Naming what went wrong with an endpoint call: L{EndpointFailure} and its
amp-side kind L{LocalFailure}, and L{classify}, which turns whatever Twisted
failed a request with into one of L{amp.reasons.ENDPOINT_REASONS}; which
failures a call may be sent again after (L{retriable}, L{closed_while_idle}).
"""

from __future__ import annotations

from typing import Any, Optional

from OpenSSL import SSL
from twisted.internet import error as ierror
from twisted.internet.defer import CancelledError
from twisted.python.failure import Failure
from twisted.web.client import RequestGenerationFailed, RequestTransmissionFailed, ResponseFailed

from amp.config import EndpointSettings
from amp.reasons import Reason

try:
    from service_identity import VerificationError
except ImportError:  # pragma: no cover - service_identity is a dependency
    VerificationError = SSL.Error  # type: ignore[misc,assignment]


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
    L{EndpointFailure} found in it (also inside the reasons of a
    C{ResponseFailed}: a limit that closed the connection) is returned as it
    is, so that a L{LocalFailure} stays one.
    """
    if failure.check(EndpointFailure):
        return failure.value
    if failure.check(ierror.ConnectionRefusedError):
        return EndpointFailure(Reason.CONNECTION_REFUSED, "connection refused")
    if failure.check(ierror.TimeoutError, ierror.TCPTimedOutError):
        within = f" within {settings.connect_timeout:.3g}s" if settings is not None else ""
        return EndpointFailure(Reason.TIMEOUT, f"could not connect{within}")
    tls = _tls_failure(failure)
    if tls is not None:
        return tls
    if failure.check(ResponseFailed, RequestGenerationFailed, RequestTransmissionFailed):
        inner = failure.value.reasons
        for r in inner:
            if r.check(EndpointFailure):
                return r.value
            tls = _tls_failure(r)
            if tls is not None:
                return tls
        if inner and all(r.check(CancelledError) for r in inner):
            return EndpointFailure(Reason.TIMEOUT, "call cancelled before a reply")
        return EndpointFailure(Reason.CONNECTION_RESET, "connection closed before a full reply")
    if failure.check(ierror.ConnectionLost, ierror.ConnectionDone):
        return EndpointFailure(Reason.CONNECTION_RESET, "connection closed before a full reply")
    if failure.check(CancelledError, ierror.ConnectingCancelledError):
        return EndpointFailure(Reason.TIMEOUT, "call cancelled before a reply")
    if failure.check(ierror.DNSLookupError):
        return EndpointFailure(Reason.CONNECTION_FAILED, "host name did not resolve")
    if failure.check(ierror.ConnectError):
        return EndpointFailure(Reason.CONNECTION_FAILED, f"could not connect: {first_line(failure.value)}")
    return EndpointFailure(Reason.CONNECTION_FAILED, first_line(failure.value))


def _tls_failure(failure: Failure) -> Optional[EndpointFailure]:
    if failure.check(SSL.Error):
        return EndpointFailure(Reason.TLS_ERROR, f"TLS failed: {_ssl_text(failure.value)}")
    if failure.check(VerificationError):
        return EndpointFailure(Reason.TLS_ERROR,
                               f"certificate does not match the host: {first_line(failure.value)}")
    return None


def _ssl_text(value: Any) -> str:
    try:
        parts = [p[-1] for p in value.args[0] if p and p[-1]]
    except (IndexError, TypeError):
        parts = []
    return "; ".join(parts)[:100] if parts else first_line(value)


class ClosedWhileIdle(ierror.ConnectionClosed):
    """
    The endpoint closed a kept-alive connection amp had just sent a request
    on, before any byte of the reply: it closed the connection while it sat
    idle in the pool (its keep-alive timeout, a restart), and the request
    crossed the close.  The reason the connection was lost with, which
    Twisted's client wraps in C{ResponseNeverReceived} or
    C{RequestTransmissionFailed}.
    """

    def __init__(self, reason: Failure) -> None:
        super().__init__(f"kept-alive connection closed before a reply: {first_line(reason.value)}")
        self.reason = reason


def closed_while_idle(failure: Failure) -> bool:
    """
    Whether a call failed because the kept-alive connection it went out on
    had been closed by the endpoint (L{ClosedWhileIdle}): the call may be
    sent once more, on a new connection.
    """
    if failure.check(ClosedWhileIdle):
        return True
    return bool(failure.check(ResponseFailed, RequestTransmissionFailed)) and any(
        r.check(ClosedWhileIdle) for r in failure.value.reasons)


def retriable(failure: Failure) -> bool:
    """
    Whether a retry may follow C{failure}: only failures where the endpoint
    cannot have seen the request, and never a timeout.
    """
    return bool(failure.check(ierror.ConnectError)) and not failure.check(
        ierror.TimeoutError, ierror.TCPTimedOutError)


#: Failures a call can end in without anything being wrong in amp; anything
#: else is logged with its traceback.
EXPECTED = (
    EndpointFailure, ierror.ConnectError, ierror.ConnectionLost, ierror.ConnectionDone, ierror.DNSLookupError,
    ierror.ConnectingCancelledError, ResponseFailed, RequestGenerationFailed, RequestTransmissionFailed,
    CancelledError, SSL.Error, VerificationError,
)
