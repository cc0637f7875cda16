"""
Connections: one stock C{HTTPConnectionPool} and one C{Agent} per settings
profile, and the L{Profile} that is the agent's C{IAgentEndpointFactory}.

Everything amp needs for one value of L{EndpointSettings} (the pool with its
C{pool_size} and C{idle_timeout}, the connect endpoints with their connect
timeout, deny list and TLS options, the encoded URLs and fixed headers) is
built once, on the first call that uses those settings, and kept.  A
connection opened under one override's settings (its TLS client
certificate, say) is therefore never reused for a call made under another.

The pool is Twisted's own, configured through its public attributes:
C{maxPersistentPerHost = pool_size} idle connections per origin, each kept
C{cachedConnectionTimeout = idle_timeout} seconds, and
C{retryAutomatically = False} (amp's retry rules are its own, in
L{amp.endpoint._call}).  C{pool_size} bounds idle connections, not
concurrent ones: the bulkhead does that.  The one change is in the public
C{getConnection}: an idle connection that must not carry another request is
passed over, never handed out: one amp has started closing (a reply it
stopped reading whose last bytes still came in), or one whose last reply
ends it (HTTP/1.0, C{Connection: close}; the wrapper closes it as the reply
ends, but a call started from that reply's own callbacks comes first).  And
a call sent again because the endpoint closed its kept connection asks for
a new connection (L{NewConnectionKey}).

Every connection is wrapped in a L{GuardedConnection} on its way up from
the connect endpoint (L{GuardedEndpoint}): it bounds each reply's head
(the profile's C{max_response_header_size} and C{max_response_headers}),
and it is how the client counts the connections open and waits for them to
close.

A call is C{Agent.request} without parsing the URL again: the private
Twisted name C{Agent._requestWithEndpoint}, kept because it measurably
pays (L{Profile.request}).
"""

from __future__ import annotations

from typing import Any, Callable, Optional
from urllib.parse import quote

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IHostnameResolver, IProtocolFactory, IStreamClientEndpoint
from twisted.web.client import URI, Agent, HTTPConnectionPool
from twisted.web.http_headers import Headers
from twisted.web.iweb import IAgentEndpointFactory, IBodyProducer
from zope.interface import implementer

from amp import __version__
from amp.config import EndpointSettings
from amp.endpoint._connect import connect_endpoint, denied_literal
from amp.endpoint._failures import LocalFailure
from amp.endpoint._reading import GuardedConnection, GuardedFactory, HeadLimits, ReplyBudget
from amp.endpoint._types import IEndpointReactor
from amp.reasons import Reason
from amp.urls import EndpointURL

USER_AGENT = f"amp/{__version__}".encode("ascii")

# Printable ASCII stays as it is in a URL; anything else is percent-encoded.
_URL_SAFE = "".join(chr(c) for c in range(0x21, 0x7F))

_DEFAULT_PORTS = {b"http": 80, b"https": 443}

# Bound on the per-profile caches (encoded URLs, connect endpoints).
CACHE_LIMIT = 4096


class NewConnectionKey(tuple):
    """
    A pool key that asks L{ConnectionPool} for a new connection for the key
    it wraps (C{key[0]}), whatever idle connections the pool holds under
    that key; the pool keeps the connection under that key afterwards.
    """

    def __new__(cls, key: Any) -> "NewConnectionKey":
        return super().__new__(cls, (key,))


class ConnectionPool(HTTPConnectionPool):
    """
    Twisted's connection pool under one settings profile.
    """

    retryAutomatically = False

    def __init__(self, reactor: IEndpointReactor, settings: EndpointSettings) -> None:
        super().__init__(reactor, persistent=True)
        self.maxPersistentPerHost = settings.pool_size
        self.cachedConnectionTimeout = settings.idle_timeout

    def getConnection(self, key: Any, endpoint: IStreamClientEndpoint) -> Deferred:
        """
        As Twisted's, except that a connection that may not carry another
        request is not handed out (amp has started closing it: its response
        may have finished arriving after amp stopped reading it, which put
        it back in the pool; or its last reply ends it); and that a
        L{NewConnectionKey} key gets a new connection.
        """
        if isinstance(key, NewConnectionKey):
            # private: HTTPConnectionPool._newConnection, because the pool
            # has no public way to open a connection to an origin it holds
            # idle connections for; the call sent again after the endpoint
            # closed one must not take another that it may have closed too.
            return self._newConnection(key[0], endpoint)
        return super().getConnection(key, endpoint).addCallback(self._usable, key, endpoint)

    def _usable(self, connection: Any, key: Any, endpoint: IStreamClientEndpoint) -> Any:
        guard = connection.transport
        if not getattr(guard, "reusable", True):
            if not guard.disconnecting:
                guard.loseConnection()
            return self.getConnection(key, endpoint)
        return connection


@implementer(IStreamClientEndpoint)
class GuardedEndpoint:
    """
    A connect endpoint whose connections are wrapped in a
    L{GuardedConnection}; C{connect} fires with the HTTP protocol itself, as
    the pool expects.
    """

    def __init__(self, endpoint: IStreamClientEndpoint, limits: HeadLimits,
                 opened: Callable[[GuardedConnection], None], lost: Callable[[GuardedConnection], None]) -> None:
        self._endpoint = endpoint
        self._limits = limits
        self._opened = opened
        self._lost = lost

    def connect(self, protocolFactory: IProtocolFactory) -> Deferred:
        factory = GuardedFactory(protocolFactory, self._limits, self._opened, self._lost)
        return self._endpoint.connect(factory).addCallback(lambda guarded: guarded.http)


def host_header(scheme: bytes, host: bytes, port: int) -> bytes:
    """
    The Host header for C{host} and C{port}: the port only when it is not
    the scheme's default, an IPv6 address in brackets.
    """
    name = b"[" + host + b"]" if b":" in host else host
    return name if _DEFAULT_PORTS.get(scheme) == port else b"%s:%d" % (name, port)


class Target:
    """
    One endpoint URL under one profile, ready to send to: the encoded URL,
    the fixed request headers, and whether its host is a denied IP literal.

    @raise LocalFailure: C{connection-failed} when the host is not ASCII.
    """

    __slots__ = ("url", "uri", "key", "path", "headers", "denied")

    def __init__(self, url: EndpointURL, settings: EndpointSettings) -> None:
        try:
            host = url.host.encode("ascii")
        except UnicodeEncodeError:
            raise LocalFailure(
                Reason.CONNECTION_FAILED, f"host name {url.host!r} is not ASCII (use punycode)") from None
        scheme = url.scheme.encode("ascii")
        path = quote(url.path, safe=_URL_SAFE).encode("ascii")
        netloc = b"[" + host + b"]" if b":" in host else host
        self.url = b"%s://%s:%d%s" % (scheme, netloc, url.port, path)
        self.uri = URI.fromBytes(self.url)
        #: The pool key, as Agent.request computes it.
        self.key = (self.uri.scheme, self.uri.host, self.uri.port)
        #: The request line's target (C{URI.originForm} computes it anew on
        #: every read).
        self.path = self.uri.originForm
        self.headers = Headers({
            b"host": [host_header(scheme, host, url.port)],
            b"content-type": [b"application/json"],
            b"accept": [b"application/json"],
            b"user-agent": [USER_AGENT],
        })
        #: Why this target may not be called (an IP literal in a denied
        #: network), or None.  Host names are checked when they resolve.
        self.denied: Optional[str] = denied_literal(url.host, settings)


@implementer(IAgentEndpointFactory)
class Profile:
    """
    Everything built once for one value of L{EndpointSettings}: the pool,
    the agent over it, the connect endpoint per host, and encoded URLs.

    @param budget: the client's reply budget, which heads are taken from.
    @param opened: called with each new connection.
    @param lost: called with each connection that closed.
    """

    def __init__(
        self, reactor: IEndpointReactor, settings: EndpointSettings, resolver: Optional[IHostnameResolver],
        budget: ReplyBudget, opened: Callable[[GuardedConnection], None], lost: Callable[[GuardedConnection], None],
    ) -> None:
        self.settings = settings
        self._limits = HeadLimits(settings.max_response_header_size, settings.max_response_headers, budget)
        self._reactor = reactor
        self._resolver = resolver
        self._opened = opened
        self._lost = lost
        self.pool = ConnectionPool(reactor, settings)
        self.agent = Agent.usingEndpointFactory(reactor, self, self.pool)
        self._targets: dict[str, Target] = {}
        self._endpoints: dict[tuple[bytes, bytes, int], IStreamClientEndpoint] = {}

    def target(self, url: EndpointURL) -> Target:
        """
        The encoded form of C{url} (built once, reused).

        @raise LocalFailure: when it cannot be encoded.
        """
        t = self._targets.get(url.url)
        if t is None:
            t = Target(url, self.settings)
            if len(self._targets) >= CACHE_LIMIT:
                self._targets.clear()
            self._targets[url.url] = t
        return t

    def request(self, target: Target, headers: Headers, body: IBodyProducer, new: bool = False) -> Deferred:
        """
        POST C{body} to C{target} through the agent and the pool; with
        C{new}, on a new connection.

        This is C{Agent.request} with the URL parsed once per target instead
        of on every call: C{Agent._requestWithEndpoint}, the one private
        Twisted name amp uses.  It pays: C{python bench/endpoints.py
        --only-memory} (the client's own CPU per call, one pooled
        connection, no sockets) measured a median of 196 us per call through
        C{Agent.request} and 168 us through this (-15%), six interleaved
        runs each on the 2-CPU development machine.  C{Agent.request} does
        nothing else for amp: it checks the URL (built and checked here),
        parses it, asks C{endpointForURI}, computes the same pool key, and
        the request line's target (C{URI.originForm}, a C{urlunparse}).
        """
        key = NewConnectionKey(target.key) if new else target.key
        return self.agent._requestWithEndpoint(key, self.endpointForURI(target.uri), b"POST", target.uri,
                                               headers, body, target.path)

    def endpointForURI(self, uri: URI) -> IStreamClientEndpoint:
        """
        The connect endpoint for one host and port (built once, reused).

        @raise LocalFailure: when the TLS files do not load.
        """
        key = (uri.scheme, uri.host, uri.port)
        endpoint = self._endpoints.get(key)
        if endpoint is None:
            inner = connect_endpoint(self._reactor, self._resolver, self.settings, uri.scheme,
                                     uri.host.decode("ascii"), uri.port)
            endpoint = GuardedEndpoint(inner, self._limits, self._opened, self._lost)
            if len(self._endpoints) >= CACHE_LIMIT:
                self._endpoints.clear()
            self._endpoints[key] = endpoint
        return endpoint
