"""
Connections per settings profile: the L{Profile}, and the L{Target}, one
endpoint URL under it with its request head built once.

Everything amp needs for one value of L{EndpointSettings} (the reply
limits, one L{amp.http.OriginPool} per origin with its C{pool_size} and
C{idle_timeout}, the connect endpoints with their connect timeout, deny
list and TLS options, the encoded URLs and fixed headers) is built once, on
the first call that uses those settings, and kept.  A connection opened
under one override's settings (its TLS client certificate, say) is
therefore never reused for a call made under another.

C{pool_size} bounds idle connections, not concurrent ones: the bulkhead
does that.
"""

from __future__ import annotations

from typing import Callable, Optional
from urllib.parse import quote

from twisted.internet.interfaces import IHostnameResolver, IStreamClientEndpoint

from amp import __version__
from amp.config import EndpointSettings
from amp.endpoint._connect import connect_endpoint, denied_literal
from amp.endpoint._failures import LocalFailure
from amp.endpoint._types import IEndpointReactor
from amp.http import Charge, ClientConnection, Exchange, IReceiver, OriginPool, ReplyBudget, ReplyLimits
from amp.memo import Memo
from amp.reasons import Reason
from amp.urls import EndpointURL

USER_AGENT = f"amp/{__version__}".encode("ascii")

# Printable ASCII stays as it is in a URL; anything else is percent-encoded.
_URL_SAFE = "".join(chr(c) for c in range(0x21, 0x7F))

_DEFAULT_PORTS = {b"http": 80, b"https": 443}

# Bound on the per-profile memo of encoded URLs.
TARGETS_KEPT = 4096

#: Gives the connect endpoint for a scheme, host and port instead of amp's
#: own SSRF-checked TCP and TLS ones (in-memory replies: C{amp explain
#: --reply}, tests).
Connector = Callable[[bytes, str, int], IStreamClientEndpoint]


def host_header(scheme: bytes, host: bytes, port: int) -> bytes:
    """
    The Host header for C{host} and C{port}: the port only when it is not
    the scheme's default, an IPv6 address in brackets.
    """
    name = b"[" + host + b"]" if b":" in host else host
    return name if _DEFAULT_PORTS.get(scheme) == port else b"%s:%d" % (name, port)


class Target:
    """
    One endpoint URL under one profile, ready to send to: its origin's key,
    the request head's fixed part, and whether its host is a denied IP
    literal.

    @raise LocalFailure: C{connection-failed} when the host is not ASCII.
    """

    __slots__ = ("url", "scheme", "host", "port", "key", "head", "denied", "pool")

    def __init__(self, url: EndpointURL, settings: EndpointSettings) -> None:
        try:
            host = url.host.encode("ascii")
        except UnicodeEncodeError:
            raise LocalFailure(
                Reason.CONNECTION_FAILED, f"host name {url.host!r} is not ASCII (use punycode)"
            ) from None
        scheme = url.scheme.encode("ascii")
        path = quote(url.path, safe=_URL_SAFE).encode("ascii")
        netloc = b"[" + host + b"]" if b":" in host else host
        self.url = b"%s://%s:%d%s" % (scheme, netloc, url.port, path)
        self.scheme = scheme
        self.host = url.host
        self.port = url.port
        self.key = (scheme, host, url.port)
        #: The request line and the headers every call sends.
        self.head = (
            b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
            b"Accept: application/json\r\nUser-Agent: %s\r\n"
            % (path or b"/", host_header(scheme, host, url.port), USER_AGENT)
        )
        #: Why this target may not be called (an IP literal in a denied
        #: network), or None.  Host names are checked when they resolve.
        self.denied: Optional[str] = denied_literal(url.host, settings)
        #: Its origin's pool, once a call has asked for it.
        self.pool: Optional[OriginPool] = None


#: Header names as they are sent (C{x-amp-uid} -> C{X-Amp-Uid}), by the name
#: the caller gave; amp's own few, bounded all the same.
_NAMES: dict[bytes, bytes] = {}


def _canonical(name: bytes) -> bytes:
    """
    C{name} capitalized after each dash, as Twisted's client sent it (and
    as docs/endpoints.md shows): endpoints that compare names as they
    arrive see what they always saw.
    """
    canonical = b"-".join(part.capitalize() for part in name.split(b"-"))
    if len(_NAMES) < 64:
        _NAMES[name] = canonical
    return canonical


def request_bytes(target: Target, headers: dict[bytes, bytes], body: bytes, close: bool) -> bytes:
    """
    The whole request: C{target}'s head, the call's C{headers}, and
    C{body}; with C{close}, asking the endpoint to close the connection.

    @raise LocalFailure: a header that holds a line break (it would end
        the header early: what follows would be a header amp never meant).
    """
    parts: list[bytes] = []
    for name, value in headers.items():
        parts += (_NAMES.get(name) or _canonical(name), b": ", value, b"\r\n")
    fields = b"".join(parts)
    if fields.count(b"\n") != len(headers) or fields.count(b"\r") != len(headers):
        raise LocalFailure(Reason.CONNECTION_FAILED, "a request header holds a line break")
    return b"".join(
        (
            target.head,
            fields,
            b"Connection: close\r\n" if close else b"",
            b"Content-Length: %d\r\n\r\n" % len(body),
            body,
        )
    )


class Profile:
    """
    Everything built once for one value of L{EndpointSettings}: the reply
    limits, the pool per origin, and encoded URLs.

    @param budget: the client's reply budget, which replies are taken from.
    @param connector: the connect endpoints' source instead of amp's own,
        or None.
    @param opened: called with each new connection.
    @param lost: called with each connection that closed.
    """

    def __init__(
        self,
        reactor: IEndpointReactor,
        settings: EndpointSettings,
        resolver: Optional[IHostnameResolver],
        budget: ReplyBudget,
        connector: Optional[Connector],
        opened: Callable[[ClientConnection], None],
        lost: Callable[[ClientConnection], None],
    ) -> None:
        self.settings = settings
        self.limits = ReplyLimits(
            settings.max_response_header_size, settings.max_response_headers, settings.max_response, budget
        )
        self._reactor = reactor
        self._resolver = resolver
        self._connector = connector
        self._opened = opened
        self._lost = lost
        self._targets: Memo[str, Target] = Memo(TARGETS_KEPT)
        self.pools: dict[tuple[bytes, bytes, int], OriginPool] = {}
        #: New pools keep idle connections (False once the client closes).
        self.keep = True

    def target(self, url: EndpointURL) -> Target:
        """
        The encoded form of C{url} (built once, reused).

        @raise LocalFailure: when it cannot be encoded.
        """
        t = self._targets.get(url.url)
        if t is None:
            t = Target(url, self.settings)
            self._targets[url.url] = t
        return t

    def send(self, target: Target, data: bytes, charge: Charge, receiver: IReceiver) -> Exchange:
        """
        Send C{data} to C{target}'s origin through its pool, the outcome
        told to C{receiver} (L{OriginPool.send}).

        @raise LocalFailure: when the TLS files do not load.
        """
        pool = target.pool
        if pool is None:
            pool = target.pool = self._pool(target)
        return pool.send(data, charge, receiver)

    def _pool(self, target: Target) -> OriginPool:
        """
        The pool of C{target}'s origin (built once, reused).
        """
        pool = self.pools.get(target.key)
        if pool is None:
            endpoint: IStreamClientEndpoint
            if self._connector is not None:
                endpoint = self._connector(target.scheme, target.host, target.port)
            else:
                endpoint = connect_endpoint(
                    self._reactor, self._resolver, self.settings, target.scheme, target.host, target.port
                )
            settings = self.settings
            pool = OriginPool(
                self._reactor,
                endpoint,
                self.limits,
                settings.pool_size,
                settings.idle_timeout,
                self._opened,
                self._lost,
            )
            pool.keep = self.keep
            # Not bounded: the origins are those of the configuration.
            self.pools[target.key] = pool
        return pool
