"""
Calling endpoints: one pooled HTTP client, per-endpoint timeouts, response
size limits, a concurrency cap and a circuit breaker per endpoint origin.

L{EndpointClient.call} POSTs the Pod and resolves to an
L{amp.reply.EndpointDecision}, or fails with L{EndpointFailure} whose
C{reason} is one of L{REASONS}: every way a call can go wrong has a name that
reaches the warning, the audit annotation, the deny message and the
C{amp_endpoint_requests_total{endpoint,outcome}} label (L{OUTCOMES}).

Connections
===========

Calls go out through Twisted's HTTP/1.1 client over one L{OriginPool}.  treq's
C{HTTPClient} is not used on this path: it re-parses the URL, runs a cookie
jar and transparently gunzips replies (an unbounded expansion before any size
check could see it) on every request, none of which amp wants.

Everything amp needs for one set of L{EndpointSettings} (the connect
endpoints with their connect timeout, the TLS options with the CA bundle and
client certificate, the parsed URLs) is built once, on the first call that
uses those settings, and kept.  The pool's key is C{(scheme, host, port,
settings profile)}: a connection opened with one override's TLS settings is
never reused for a call made under another.  Per key the pool keeps at most
C{pool_size} idle connections, each for at most C{idle_timeout} seconds, and
hands out the most recently used one first, so after a burst the surplus goes
idle and is closed.  C{pool_size} bounds idle connections, not concurrent
ones: the bulkhead does that.

Limits
======

  - A call has C{min(settings.timeout, time left before the review's
    deadline)} seconds, covering connect, TLS handshake, headers and body.
    Its own timer covers only C{settings.timeout}, when that ends first: the
    review's deadline belongs to the caller (L{amp.admission}), whose one
    timer cancels the call when it passes.  Either way the call fails with
    C{timeout} at that moment and its connection is aborted.
    C{connect_timeout} separately bounds the TCP connect.
  - Bulkhead: when C{max_concurrent} calls to the origin are in flight, the
    next fails at once with C{concurrency-limit} instead of queueing.
  - A reply over C{max_response} bytes fails with C{response-too-large}: at
    once when its Content-Length says so, else as soon as the body passes
    the limit; the connection is closed either way.  Non-2xx replies are not
    read: their connection is closed.  Redirects are never followed.

Circuit breaker
===============

One L{amp.breaker.CircuitBreaker} per origin, from the shared
L{BreakerRegistry}.  Its thresholds are the C{breaker} settings of the
origin's root URL C{scheme://host:port/} (an override with a path pattern
cannot give one origin two breakers).  While it is open, calls fail with
C{breaker-open} without touching the network.  Every failure of the endpoint
counts against it, including the endpoint's own timeout; a call that amp
ends early (the review's deadline is shorter than the endpoint's timeout,
the caller cancels) or that fails on amp's side (TLS files that do not load)
counts nothing and hands its ticket back.

Retries
=======

Off by default.  With C{retry: true} a call is retried once, and only when
the connection could not be made (refused or another connect error: the
endpoint cannot have seen the request), never after a timeout or after
anything was sent, and only within the first half of the call's time.

Connecting
==========

An IP literal is connected to directly.  A host name is resolved once per
new connection through the reactor's non-blocking C{IHostnameResolver}
(C{reactor.nameResolver}, or the client's C{resolver}); the addresses found
are checked, and the connection goes to exactly those addresses: through
C{HostnameEndpoint} handed a resolver that can only answer with them, so
nothing is looked up a second time between the check and the connect.  Its
attempt beat is 50 ms instead of the default 0.3 s, on which it also
notices that every address failed: with the default a refused connection
took 0.3 s to report.  https endpoints need TLS 1.2 or later and a
certificate for the host name (or IP) in the URL: TLS (SNI and the name
check) always uses the URL's host, never the address.  Their C{ca_bundle},
C{client_cert} and C{client_key} files are read again when they change
(looked at on new connections, at most every 10 s), so a rotated client
certificate needs no restart.

Denied addresses
================

C{settings.deny_networks} (C{endpoints.deny_networks}) lists networks amp
never connects to, whatever name leads there.  An IP literal in the URL is
checked once, when its target is built, and a call to a denied one fails at
once with C{denied-address}.  For a host name, every address the resolution
returns is checked, IPv4-mapped and NAT64 IPv6 addresses as the IPv4
address they carry; if any is denied the call fails with
C{denied-address} and nothing is connected to, not even an allowed address
of the same answer.  C{denied-address} is amp's policy, not the endpoint's
health: the breaker does not count it.

Pooled connections are reused without resolving again.  That is safe: a
pooled connection was made to an address checked against the deny list of
its pool key's settings, and that list cannot change for the key (the
settings object is part of the key, and the configuration is read once).
A name whose answer changes, including to a denied address (DNS
rebinding), therefore only reaches the new answer on a new connection,
whose resolution is checked.  Resolving per call instead would put a DNS
round trip (several, with a cluster's search domains) on every review.

Twisted internals
=================

The pool keys, LIFO reuse and connection tracking rest on
C{HTTPConnectionPool}'s C{_connections}/C{_timeouts}/C{_putConnection},
C{_HTTP11ClientFactory} and C{Agent._requestWithEndpoint}; the fixed request
headers are copied into C{Headers._rawHeaders}.  Connecting to checked
addresses rests on C{HostnameEndpoint} asking its reactor's
C{nameResolver} at connect time and connecting through that reactor.  The
tests pin all of it (C{test_ssrf.py} the last).

Shutdown
========

L{EndpointClient.close} stops keeping connections, waits for the calls in
flight (each is bounded by its timer), closes every idle connection and
fires once every connection that was open has closed.  Calls made after
that still work, on connections that are closed when they end.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Optional
from urllib.parse import quote

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from OpenSSL import SSL, crypto
from twisted.internet import error as ierror
from twisted.internet.abstract import isIPAddress, isIPv6Address
from twisted.internet.defer import CancelledError, Deferred, fail, gatherResults, succeed
from twisted.internet.address import IPv4Address, IPv6Address
from twisted.internet.endpoints import HostnameEndpoint, TCP4ClientEndpoint, TCP6ClientEndpoint, wrapClientTLS
from twisted.internet.interfaces import (
    IHostnameResolver,
    IHostResolution,
    IOpenSSLClientConnectionCreator,
    IReactorPluggableNameResolver,
    IReactorTime,
    IResolutionReceiver,
    IStreamClientEndpoint,
)
from twisted.internet.protocol import Protocol
from twisted.internet.ssl import Certificate, TLSVersion, optionsForClientTLS, trustRootFromCertificates
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web._newclient import HTTP11ClientProtocol
from twisted.web.client import (
    URI,
    Agent,
    HTTPConnectionPool,
    RequestGenerationFailed,
    RequestTransmissionFailed,
    ResponseDone,
    ResponseFailed,
    _HTTP11ClientFactory,
)
from twisted.web.http import PotentialDataLoss
from twisted.web.http_headers import Headers
from twisted.web.iweb import IAgent, IAgentEndpointFactory, IBodyProducer
from zope.interface import implementer

from amp import __version__
from amp.breaker import BreakerRegistry, CircuitBreaker, Ticket
from amp.config import BreakerConfig, EndpointSettings
from amp.deadline import Deadline
from amp.metrics import Metrics
from amp.reply import EndpointDecision, ReplyError, parse_reply
from amp.urls import EndpointURL, denied_network

try:
    from service_identity import VerificationError
except ImportError:  # pragma: no cover - service_identity is a dependency
    VerificationError = SSL.Error  # type: ignore[misc,assignment]

#: Every named failure of an endpoint call.
REASONS = (
    "timeout", "connection-refused", "connection-reset", "connection-failed", "denied-address", "tls-error",
    "redirect", "http-4xx", "http-5xx", "response-too-large", "invalid-json", "invalid-reply",
    "breaker-open", "concurrency-limit",
)

#: Values of the C{outcome} label of C{amp_endpoint_requests_total}: C{ok},
#: every reason, and C{cancelled} (the caller gave up before the call ended).
OUTCOMES = ("ok",) + REASONS + ("cancelled",)

USER_AGENT = f"amp/{__version__}".encode("ascii")

# Printable ASCII stays as it is in a URL; anything else is percent-encoded.
_URL_SAFE = "".join(chr(c) for c in range(0x21, 0x7F))

# Bounds on the per-client caches (settings objects, URLs).
_CACHE_LIMIT = 4096

# Seconds between looks at an https endpoint's TLS files (on new connections).
_TLS_RECHECK = 10.0

# HostnameEndpoint starts a connect to the next resolved address every this
# many seconds, and only notices that every attempt failed on that beat: its
# default (0.3s) would make a refused connection take 0.3s to report.  An IP
# literal skips resolution and connects directly.
_ATTEMPT_DELAY = 0.05

log = Logger()


class EndpointFailure(Exception):
    """
    An endpoint call that did not produce a usable reply.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


class _LocalFailure(EndpointFailure):
    """
    A failure on amp's side (TLS files that do not load, a URL amp cannot
    encode): named like the others, but it says nothing about the endpoint's
    health, so the breaker does not count it.
    """


@implementer(IBodyProducer)
class BytesProducer:
    """
    A request body already in memory, written in one go (Twisted's
    C{FileBodyProducer} would pace it through the global cooperator).
    """

    __slots__ = ("_body", "length")

    def __init__(self, body: bytes) -> None:
        self._body = body
        self.length = len(body)

    def startProducing(self, consumer: Any) -> Deferred:
        consumer.write(self._body)
        return succeed(None)

    def pauseProducing(self) -> None:
        pass

    def resumeProducing(self) -> None:
        pass

    def stopProducing(self) -> None:
        pass


# ---------------------------------------------------------------- reading replies


class _LimitedBody(Protocol):
    """
    Collect a response body, failing and closing the connection as soon as
    it passes C{limit} bytes.
    """

    def __init__(self, finished: Deferred, limit: int) -> None:
        self._finished = finished
        self._limit = limit
        self._chunks: list[bytes] = []
        self._size = 0

    def dataReceived(self, data: bytes) -> None:
        if self._finished.called:
            return
        self._size += len(data)
        if self._size > self._limit:
            self._chunks = []
            self.transport.loseConnection()
            self._finished.errback(Failure(EndpointFailure(
                "response-too-large", f"reply is larger than the {self._limit} byte limit")))
            return
        self._chunks.append(data)

    def connectionLost(self, reason: Failure = None) -> None:  # type: ignore[assignment]
        if self._finished.called:
            return
        if reason.check(ResponseDone, PotentialDataLoss):
            self._finished.callback(b"".join(self._chunks))
        else:
            self._finished.errback(reason)


class _Drop(Protocol):
    """
    Takes a response body only to close its connection (a no-op if the whole
    response has already arrived and the connection went back to the pool).
    """

    def connectionMade(self) -> None:
        self.transport.loseConnection()


def read_limited(response: Any, limit: int) -> Deferred:
    """
    The body of C{response}, or an L{EndpointFailure} past C{limit} bytes.
    Cancelling the result closes the connection.
    """
    length = response.length
    if isinstance(length, int) and length > limit:
        response.deliverBody(_Drop())
        return fail(EndpointFailure(
            "response-too-large", f"reply of {length} bytes is larger than the {limit} byte limit"))
    collector: _LimitedBody

    def cancel(d: Deferred) -> None:
        if collector.transport is not None:
            collector.transport.loseConnection()

    finished: Deferred = Deferred(cancel)
    collector = _LimitedBody(finished, limit)
    response.deliverBody(collector)
    return finished


# ---------------------------------------------------------------- the pool


class _PooledProtocol(HTTP11ClientProtocol):
    """
    An HTTP/1.1 client connection that tells its pool when it opens and
    closes, so that the pool can count and close every connection, not only
    the idle ones.
    """

    def __init__(self, quiescentCallback: Callable[[Any], None], pool: "OriginPool", key: Any) -> None:
        super().__init__(quiescentCallback)
        self._pool = pool
        self._key = key
        self._lost_waiters: Optional[list[Deferred]] = None

    def connectionMade(self) -> None:
        super().connectionMade()
        self._pool._opened(self)

    def connectionLost(self, reason: Failure = None) -> None:  # type: ignore[assignment]
        try:
            super().connectionLost(reason)
        finally:
            self._pool._lost(self)
            waiters, self._lost_waiters = self._lost_waiters, None
            for d in waiters or ():
                d.callback(None)

    def when_lost(self) -> Deferred:
        """
        A Deferred that fires once this connection has closed.
        """
        d: Deferred = Deferred()
        if self._lost_waiters is None:
            self._lost_waiters = []
        self._lost_waiters.append(d)
        return d


class _PooledFactory(_HTTP11ClientFactory):
    def __init__(self, pool: "OriginPool", key: Any) -> None:
        super().__init__(lambda connection: pool._putConnection(key, connection), repr(key[:3]))
        self._pool = pool
        self._key = key

    def buildProtocol(self, addr: Any) -> _PooledProtocol:
        return _PooledProtocol(self._quiescentCallback, self._pool, self._key)


class OriginPool(HTTPConnectionPool):
    """
    One connection pool for every endpoint.  Keys are C{(scheme, host, port,
    profile)} where C{profile.settings} is the L{EndpointSettings} the
    connection was opened under: per key, at most C{pool_size} idle
    connections are kept, each for at most C{idle_timeout} seconds.  The
    most recently used idle connection is handed out first.
    """

    retryAutomatically = False

    def __init__(self, reactor: Any) -> None:
        super().__init__(reactor, persistent=True)
        self._open: set[_PooledProtocol] = set()
        #: Connections opened since the pool was made.
        self.connections_opened = 0
        #: When true, connections are closed instead of kept.
        self.closing = False

    def getConnection(self, key: Any, endpoint: Any) -> Deferred:
        connections = self._connections.get(key)
        while connections:
            connection = connections.pop()
            self._timeouts.pop(connection).cancel()
            if connection.state == "QUIESCENT":
                return succeed(connection)
        return self._newConnection(key, endpoint)

    def _newConnection(self, key: Any, endpoint: Any) -> Deferred:
        return endpoint.connect(_PooledFactory(self, key))

    def _putConnection(self, key: Any, connection: Any) -> None:
        # A connection amp already started closing (a reply it stopped
        # reading) may still finish its response: do not keep it.
        if self.closing or connection.state != "QUIESCENT" or getattr(connection.transport, "disconnecting", False):
            connection.transport.loseConnection()
            return
        settings = key[3].settings
        connections = self._connections.setdefault(key, [])
        if len(connections) >= settings.pool_size:
            for dead in [c for c in connections if c.state != "QUIESCENT"]:
                connections.remove(dead)
                self._timeouts.pop(dead).cancel()
            while len(connections) >= settings.pool_size:
                dropped = connections.pop(0)
                self._timeouts.pop(dropped).cancel()
                dropped.transport.loseConnection()
        connections.append(connection)
        self._timeouts[connection] = self._reactor.callLater(
            settings.idle_timeout, self._removeConnection, key, connection)

    def _removeConnection(self, key: Any, connection: Any) -> None:
        # Forget it before closing it: a transport may report the loss at once.
        self._connections[key].remove(connection)
        del self._timeouts[connection]
        connection.transport.loseConnection()

    def closeCachedConnections(self) -> Deferred:
        connections, self._connections = self._connections, {}
        timeouts, self._timeouts = self._timeouts, {}
        for delayed in timeouts.values():
            delayed.cancel()
        return gatherResults([c.abort() for idle in connections.values() for c in idle]).addCallback(lambda _: None)

    def _opened(self, connection: _PooledProtocol) -> None:
        self._open.add(connection)
        self.connections_opened += 1

    def _lost(self, connection: _PooledProtocol) -> None:
        self._open.discard(connection)
        idle = self._connections.get(connection._key)
        if idle and connection in idle:
            idle.remove(connection)
            self._timeouts.pop(connection).cancel()

    def idle_connections(self) -> int:
        """
        Idle connections waiting in the pool.
        """
        return sum(len(c) for c in self._connections.values())

    def open_connections(self) -> int:
        """
        Connections open now, idle or busy.
        """
        return len(self._open)

    def shutdown(self) -> Deferred:
        """
        Stop keeping connections, close the idle ones, and fire once every
        connection open now has closed (busy ones close when their request
        ends).
        """
        self.closing = True
        waits = [c.when_lost() for c in list(self._open)]
        self.closeCachedConnections()
        return gatherResults(waits).addCallback(lambda _: None)


# ---------------------------------------------------------------- per-settings state


def _read_file(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise _LocalFailure("tls-error", f"cannot read {what} {path}: {e.strerror}") from None


def _client_tls(settings: EndpointSettings, host: str) -> Any:
    """
    TLS options for one endpoint host: verify the server against
    C{ca_bundle} (every certificate in it; the system's trust store when
    unset) and its name against C{host}, TLS 1.2 at least, and present
    C{client_cert} (leaf first, then any intermediates) with C{client_key}.

    @raise _LocalFailure: C{tls-error} when a file does not load.
    """
    trust = None
    if settings.ca_bundle:
        pem = _read_file(settings.ca_bundle, "ca_bundle")
        try:
            cas = x509.load_pem_x509_certificates(pem)
        except ValueError:
            raise _LocalFailure("tls-error", f"ca_bundle {settings.ca_bundle} holds no PEM certificate") from None
        trust = trustRootFromCertificates([Certificate(crypto.X509.from_cryptography(c)) for c in cas])
    extra: dict[str, Any] = {"raiseMinimumTo": TLSVersion.TLSv1_2}
    if settings.client_cert and settings.client_key:
        try:
            chain = x509.load_pem_x509_certificates(_read_file(settings.client_cert, "client_cert"))
        except ValueError:
            raise _LocalFailure(
                "tls-error", f"client_cert {settings.client_cert} holds no PEM certificate") from None
        try:
            key = serialization.load_pem_private_key(_read_file(settings.client_key, "client_key"), None)
        except (ValueError, TypeError):
            raise _LocalFailure(
                "tls-error", f"client_key {settings.client_key} is not an unencrypted PEM private key") from None
        public = serialization.PublicFormat.SubjectPublicKeyInfo
        if key.public_key().public_bytes(serialization.Encoding.DER, public) != chain[0].public_key().public_bytes(
                serialization.Encoding.DER, public):
            raise _LocalFailure(
                "tls-error", f"client_key {settings.client_key} does not belong to client_cert {settings.client_cert}")
        extra["privateKey"] = crypto.PKey.from_cryptography_key(key)  # type: ignore[arg-type]
        extra["certificate"] = crypto.X509.from_cryptography(chain[0])
        if len(chain) > 1:
            extra["extraCertChain"] = [crypto.X509.from_cryptography(c) for c in chain[1:]]
    return optionsForClientTLS(host, trustRoot=trust, extraCertificateOptions=extra)


def _stamp(paths: tuple[str, ...]) -> tuple[Any, ...]:
    """
    What identifies the current content of C{paths} (following symlinks, so
    that a Secret volume's C{..data} swap shows as a change).
    """
    out: list[Any] = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            out.append(None)
        else:
            out.append((st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(out)


@implementer(IOpenSSLClientConnectionCreator)
class _ReloadingClientTLS:
    """
    The client TLS options of one host, rebuilt when the C{ca_bundle},
    C{client_cert} or C{client_key} files change, so that a rotated client
    certificate is used without a restart.  The files are looked at only
    when a new connection is made, at most every L{_TLS_RECHECK} seconds; a
    set that does not load leaves the previous options in service.

    @raise _LocalFailure: from the constructor, when the files do not load.
    """

    def __init__(self, settings: EndpointSettings, host: str, clock: IReactorTime) -> None:
        self._settings = settings
        self._host = host
        self._clock = clock
        self._paths = tuple(p for p in (settings.ca_bundle, settings.client_cert, settings.client_key) if p)
        self._stamp = _stamp(self._paths)
        self._options = _client_tls(settings, host)
        self._checked = clock.seconds()

    def clientConnectionForTLS(self, tlsProtocol: Any) -> Any:
        now = self._clock.seconds()
        if self._paths and not 0 <= now - self._checked < _TLS_RECHECK:
            self._checked = now
            stamp = _stamp(self._paths)
            if stamp != self._stamp:
                try:
                    self._options = _client_tls(self._settings, self._host)
                except _LocalFailure as e:
                    log.warn("Keeping the TLS settings in use for {host}: {error}", host=self._host, error=e.message)
                else:
                    self._stamp = stamp
                    log.info("Loaded changed TLS files for {host}", host=self._host)
        return self._options.clientConnectionForTLS(tlsProtocol)


class DeniedAddress(_LocalFailure):
    """
    A host name resolved into C{endpoints.deny_networks}: nothing was
    connected to.  amp's policy, not the endpoint's health: not counted by
    the breaker.
    """

    def __init__(self, host: str, address: str, network: Any) -> None:
        super().__init__("denied-address", f"host {host} resolves to {address}, which is in "
                                           f"endpoints.deny_networks ({network})")
        self.host = host
        self.address = address


@implementer(IHostResolution)
class _Resolution:
    def __init__(self, name: str) -> None:
        self.name = name

    def cancel(self) -> None:
        pass


@implementer(IResolutionReceiver)
class _Addresses:
    """
    Collects one resolution's addresses; C{done} fires with them.
    """

    def __init__(self) -> None:
        self.addresses: list[Any] = []
        self.done: Deferred = Deferred()

    def resolutionBegan(self, resolution: IHostResolution) -> None:
        pass

    def addressResolved(self, address: Any) -> None:
        self.addresses.append(address)

    def resolutionComplete(self) -> None:
        self.done.callback(self.addresses)


@implementer(IHostnameResolver)
class _Answered:
    """
    A resolver that knows one answer, already checked: whatever name it is
    asked about, it reports exactly these addresses (with the asked port).
    """

    def __init__(self, addresses: list[Any]) -> None:
        self._addresses = addresses

    def resolveHostName(self, receiver: IResolutionReceiver, hostName: str, portNumber: int = 0,
                        addressTypes: Any = None, transportSemantics: str = "TCP") -> IHostResolution:
        resolution = _Resolution(hostName)
        receiver.resolutionBegan(resolution)
        for a in self._addresses:
            if isinstance(a, IPv6Address):
                receiver.addressResolved(IPv6Address("TCP", a.host, portNumber, a.flowInfo, a.scopeID))
            else:
                receiver.addressResolved(IPv4Address("TCP", a.host, portNumber))
        receiver.resolutionComplete()
        return resolution


@implementer(IReactorPluggableNameResolver)
class _AnsweredReactor:
    """
    The reactor, except that its name resolver is an L{_Answered}: what
    C{HostnameEndpoint} is built on, so that it connects to the checked
    addresses and cannot look the name up again.
    """

    def __init__(self, reactor: Any, addresses: list[Any]) -> None:
        self._reactor = reactor
        self.nameResolver = _Answered(addresses)

    def installNameResolver(self, resolver: IHostnameResolver) -> IHostnameResolver:
        raise TypeError("the answer of this reactor's resolver is fixed")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reactor, name)


def _is_ip(host: str) -> bool:
    try:
        denied_network(host, ())
    except ValueError:
        return False
    return True


@implementer(IStreamClientEndpoint)
class _CheckedHostEndpoint:
    """
    Connect to a host name: resolve it once, check every address against
    C{deny}, then connect to those addresses only (L{_AnsweredReactor}).

    @param resolver: an C{IHostnameResolver}, or None for the reactor's
        C{nameResolver} (looked up on each connect).
    """

    def __init__(self, reactor: Any, resolver: Optional[IHostnameResolver], host: str, port: int,
                 timeout: float, deny: tuple[Any, ...]) -> None:
        self._reactor = reactor
        self._resolver = resolver
        self._host = host
        self._port = port
        self._timeout = timeout
        self._deny = deny

    def connect(self, factory: Any) -> Deferred:
        receiver = _Addresses()
        resolver = self._resolver if self._resolver is not None else self._reactor.nameResolver
        resolver.resolveHostName(receiver, self._host, portNumber=self._port)
        # A cancel before the answer fails the Deferred; the late answer is
        # then dropped (a Deferred cancelled without a canceller ignores it).
        return receiver.done.addCallback(self._connect_checked, factory)

    def _connect_checked(self, addresses: list[Any], factory: Any) -> Deferred:
        addresses = [a for a in addresses if isinstance(a, (IPv4Address, IPv6Address)) and _is_ip(a.host)]
        if not addresses:
            raise ierror.DNSLookupError(f"no addresses for {self._host}")
        for a in addresses:
            net = denied_network(a.host, self._deny)
            if net is not None:
                log.warn("Not calling {host}: it resolves to {address}, in endpoints.deny_networks ({network})",
                         host=self._host, address=a.host, network=str(net))
                raise DeniedAddress(self._host, a.host, net)
        endpoint = HostnameEndpoint(_AnsweredReactor(self._reactor, addresses), self._host, self._port,
                                    timeout=self._timeout, attemptDelay=_ATTEMPT_DELAY)
        return endpoint.connect(factory)


class _Target:
    """
    One endpoint URL under one profile, ready to send to.
    """

    __slots__ = ("url", "uri", "path", "headers", "key", "scheme", "host", "port", "denied")

    def __init__(self, url: EndpointURL, profile: "_Profile") -> None:
        try:
            host_bytes = url.host.encode("ascii")
        except UnicodeEncodeError:
            raise _LocalFailure("connection-failed", f"host name {url.host!r} is not ASCII (use punycode)") from None
        scheme = url.scheme.encode("ascii")
        self.scheme, self.host, self.port = scheme, url.host, url.port
        self.path = quote(url.path, safe=_URL_SAFE).encode("ascii")
        netloc = b"[" + host_bytes + b"]" if b":" in host_bytes else host_bytes
        self.url = b"%s://%s:%d%s" % (scheme, netloc, url.port, self.path)
        self.uri = URI.fromBytes(self.url)
        self.headers = Headers({
            b"host": [profile.agent._computeHostValue(scheme, host_bytes, url.port)],
            b"content-type": [b"application/json"],
            b"accept": [b"application/json"],
            b"user-agent": [USER_AGENT],
        })._rawHeaders
        self.key = (scheme, host_bytes, url.port, profile)
        #: Why this target may not be called (an IP literal in a denied
        #: network), or None.  Host names are checked when they resolve.
        self.denied: Optional[str] = None
        if isIPAddress(url.host) or isIPv6Address(url.host):
            net = denied_network(url.host, profile.settings.deny_networks)
            if net is not None:
                self.denied = f"address {url.host} is in endpoints.deny_networks ({net})"


@implementer(IAgentEndpointFactory)
class _Profile:
    """
    Everything built once for one value of L{EndpointSettings}: the agent
    over the shared pool, connect endpoints (connect timeout, TLS options)
    per host, and parsed URLs.  Identity-hashed, so it is a cheap part of
    the pool key.
    """

    def __init__(
        self, reactor: Any, settings: EndpointSettings, pool: OriginPool,
        resolver: Optional[IHostnameResolver] = None,
    ) -> None:
        self.settings = settings
        self._reactor = reactor
        self._resolver = resolver
        self.agent = Agent.usingEndpointFactory(reactor, self, pool)
        self._targets: dict[str, _Target] = {}
        self._endpoints: dict[tuple[bytes, str, int], Any] = {}

    def target(self, url: EndpointURL) -> _Target:
        t = self._targets.get(url.url)
        if t is None:
            t = _Target(url, self)
            if len(self._targets) >= _CACHE_LIMIT:
                self._targets.clear()
            self._targets[url.url] = t
        return t

    def endpoint(self, scheme: bytes, host: str, port: int) -> Any:
        """
        The connect endpoint for one host and port (built once, reused):
        C{connect_timeout}, and for https the TLS options.

        @raise _LocalFailure: when the TLS files do not load.
        """
        k = (scheme, host, port)
        ep = self._endpoints.get(k)
        if ep is None:
            timeout = self.settings.connect_timeout
            if isIPAddress(host):
                ep = TCP4ClientEndpoint(self._reactor, host, port, timeout=timeout)
            elif isIPv6Address(host):
                ep = TCP6ClientEndpoint(self._reactor, host, port, timeout=timeout)
            else:
                ep = _CheckedHostEndpoint(self._reactor, self._resolver, host, port, timeout,
                                          self.settings.deny_networks)
            if scheme == b"https":
                ep = wrapClientTLS(_ReloadingClientTLS(self.settings, host, self._reactor), ep)
            self._endpoints[k] = ep
        return ep

    def endpointForURI(self, uri: Any) -> Any:
        """
        L{IAgentEndpointFactory}, for C{self.agent.request}; amp's own calls
        hand the agent the endpoint themselves.
        """
        return self.endpoint(uri.scheme, uri.host.decode("ascii").strip("[]"), uri.port)


class _Origin:
    """
    Per-origin state: calls in flight (the bulkhead), breaker thresholds and
    metric children.
    """

    __slots__ = ("name", "in_flight", "breaker_config", "outcomes", "duration")

    def __init__(self, name: str, breaker_config: BreakerConfig, metrics: Metrics) -> None:
        self.name = name
        self.in_flight = 0
        self.breaker_config = breaker_config
        self.outcomes: dict[str, Any] = {}
        self.duration = metrics.endpoint_duration.labels(name)


# ---------------------------------------------------------------- classifying failures


def classify(failure: Failure, settings: Optional[EndpointSettings] = None) -> EndpointFailure:
    """
    Name what went wrong with a call that ended in C{failure}.
    """
    if failure.check(EndpointFailure):
        return failure.value
    if failure.check(ierror.ConnectionRefusedError):
        return EndpointFailure("connection-refused", "connection refused")
    if failure.check(ierror.TimeoutError, ierror.TCPTimedOutError):
        within = f" within {settings.connect_timeout:.3g}s" if settings is not None else ""
        return EndpointFailure("timeout", f"could not connect{within}")
    tls = _tls_failure(failure)
    if tls is not None:
        return tls
    if failure.check(ResponseFailed, RequestGenerationFailed, RequestTransmissionFailed):
        inner = failure.value.reasons
        for r in inner:
            tls = _tls_failure(r)
            if tls is not None:
                return tls
        if inner and all(r.check(CancelledError) for r in inner):
            return EndpointFailure("timeout", "call cancelled before a reply")
        return EndpointFailure("connection-reset", "connection closed before a full reply")
    if failure.check(ierror.ConnectionLost, ierror.ConnectionDone):
        return EndpointFailure("connection-reset", "connection closed before a full reply")
    if failure.check(CancelledError, ierror.ConnectingCancelledError):
        return EndpointFailure("timeout", "call cancelled before a reply")
    if failure.check(ierror.DNSLookupError):
        return EndpointFailure("connection-failed", "host name did not resolve")
    if failure.check(ierror.ConnectError):
        return EndpointFailure("connection-failed", f"could not connect: {_first_line(failure.value)}")
    return EndpointFailure("connection-failed", _first_line(failure.value))


def _tls_failure(failure: Failure) -> Optional[EndpointFailure]:
    if failure.check(SSL.Error):
        return EndpointFailure("tls-error", f"TLS failed: {_ssl_text(failure.value)}")
    if failure.check(VerificationError):
        return EndpointFailure("tls-error", f"certificate does not match the host: {_first_line(failure.value)}")
    return None


def _ssl_text(value: Any) -> str:
    try:
        parts = [p[-1] for p in value.args[0] if p and p[-1]]
    except (IndexError, TypeError):
        parts = []
    return "; ".join(parts)[:100] if parts else _first_line(value)


def _first_line(value: Any) -> str:
    text = str(value) or type(value).__name__
    return text.splitlines()[0][:100]


def _retriable(failure: Failure) -> bool:
    """
    Only failures where the endpoint cannot have seen the request, and
    never a timeout.
    """
    return bool(failure.check(ierror.ConnectError)) and not failure.check(
        ierror.TimeoutError, ierror.TCPTimedOutError)


_EXPECTED = (
    EndpointFailure, ierror.ConnectError, ierror.ConnectionLost, ierror.ConnectionDone, ierror.DNSLookupError,
    ierror.ConnectingCancelledError, ResponseFailed, RequestGenerationFailed, RequestTransmissionFailed,
    CancelledError, SSL.Error, VerificationError,
)


# ---------------------------------------------------------------- one call


class _Call:
    """
    One call: its timer, its ticket, its place in the bulkhead.  Exactly one
    of success, failure, timeout or cancellation settles it; whatever the
    request does after that is ignored.
    """

    __slots__ = (
        "_client", "_origin", "_target", "_profile", "_settings", "_body", "_headers", "_timeout",
        "_deadline", "_breaker", "_ticket", "_started", "_timer", "_pending", "_retry", "_done", "_waiters",
        "_check", "result",
    )

    def __init__(
        self, client: "EndpointClient", origin: _Origin, target: _Target, profile: _Profile,
        settings: EndpointSettings, body: bytes, headers: Headers, timeout: float, deadline: Deadline,
        breaker: CircuitBreaker, ticket: Ticket, check: Optional[Callable[[EndpointDecision], Optional[str]]] = None,
    ) -> None:
        self._client = client
        self._origin = origin
        self._target = target
        self._profile = profile
        self._settings = settings
        self._body = body
        self._headers = headers
        self._timeout = timeout
        self._deadline = deadline
        self._check = check
        self._breaker = breaker
        self._ticket = ticket
        self._retry = settings.retry
        self._done = False
        self._waiters: Optional[list[Deferred]] = None
        self._pending: Optional[Deferred] = None
        self.result: Deferred = Deferred(self._cancelled)

    def start(self) -> Deferred:
        reactor = self._client._reactor
        self._started = reactor.seconds()
        # A timer for the endpoint's own timeout only, when it ends before
        # the review's deadline: that deadline is the caller's to enforce
        # (it cancels the call, see _cancelled).
        if self._timeout < self._deadline.remaining(self._started):
            self._timer = reactor.callLater(self._timeout, self._timed_out)
        else:
            self._timer = None
        d = self._send()
        d.addCallbacks(self._got_response, self._not_answered)
        self._pending = d
        d.addBoth(self._ended)
        return self.result

    def _send(self) -> Deferred:
        try:
            return self._client._send(self._profile, self._target, self._headers, self._body)
        except Exception:
            return fail()

    def _got_response(self, response: Any) -> Any:
        code = response.code
        if 200 <= code < 300:
            return read_limited(response, self._settings.max_response).addCallback(_parse)
        response.deliverBody(_Drop())
        if 300 <= code < 400:
            where = response.headers.getRawHeaders(b"location", [b""])[0].decode("latin-1")
            to = f" to {_first_line(where)}" if where else ""
            raise EndpointFailure("redirect", f"HTTP {code} redirect{to} not followed")
        if 400 <= code < 500:
            raise EndpointFailure("http-4xx", f"HTTP {code}")
        if 500 <= code < 600:
            raise EndpointFailure("http-5xx", f"HTTP {code}")
        raise EndpointFailure("invalid-reply", f"HTTP status {code} is not a reply")

    def _not_answered(self, failure: Failure) -> Any:
        if self._retry and not self._done and _retriable(failure):
            self._retry = False
            if self._client._reactor.seconds() - self._started < self._timeout / 2:
                log.info("Retrying {endpoint} after {error}", endpoint=self._origin.name,
                         error=_first_line(failure.value))
                return self._send().addCallback(self._got_response)
        return failure

    def _ended(self, result: Any) -> None:
        if self._done:
            # Settled already (timer or caller); this is the aborted request.
            return None
        if not isinstance(result, Failure):
            # The endpoint answered (a success for the breaker); amp may
            # still refuse what it said, and then the call is not "ok".
            outcome = "ok"
            if self._check is not None:
                try:
                    outcome = self._check(result) or "ok"
                except Exception:
                    log.failure("Could not check the reply of {endpoint}", endpoint=self._origin.name)
            self._settle(outcome, "success")
            self.result.callback(result)
            return None
        failure = classify(result, self._settings)
        if not result.check(*_EXPECTED):
            log.failure("Unexpected error calling {endpoint}", result, endpoint=self._origin.name)
        self._settle(failure.reason, "release" if isinstance(failure, _LocalFailure) else "failure")
        self.result.errback(Failure(failure))
        return None

    def _timed_out(self, own: bool = True) -> None:
        self._timer = None
        if self._done:
            return
        # The endpoint's own timeout is a verdict on the endpoint; the
        # review's deadline is not.
        self._settle("timeout", "failure" if own else "release")
        self.result.errback(Failure(EndpointFailure("timeout", f"no reply within {self._timeout:.3g}s")))
        if self._pending is not None:
            self._pending.cancel()

    def _cancelled(self, result: Deferred) -> None:
        if self._done:
            return
        if self._deadline.passed(self._client._reactor.seconds()):
            # The review's deadline passed: the call timed out.
            self._timed_out(own=False)
            return
        self._settle("cancelled", "release")
        if self._pending is not None:
            self._pending.cancel()

    def _settle(self, outcome: str, verdict: str) -> None:
        self._done = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        client = self._client
        origin = self._origin
        origin.in_flight -= 1
        client._live.discard(self)
        origin.duration.observe(client._reactor.seconds() - self._started)
        client._count(origin, outcome)
        if verdict == "success":
            self._breaker.record_success(self._ticket)
        elif verdict == "failure":
            self._breaker.record_failure(self._ticket)
        else:
            self._breaker.release(self._ticket)
        waiters, self._waiters = self._waiters, None
        for d in waiters or ():
            d.callback(None)

    def settled(self) -> Deferred:
        """
        A Deferred that fires when this call has ended.
        """
        if self._done:
            return succeed(None)
        d: Deferred = Deferred()
        if self._waiters is None:
            self._waiters = []
        self._waiters.append(d)
        return d


# ---------------------------------------------------------------- the client


class EndpointClient:
    """
    The one client amp uses to call endpoints.

    @param reactor: for connections and every timer.
    @param agent: an C{IAgent} to use for every call instead of amp's own
        pooled connections (tests).
    @param resolver: the C{IHostnameResolver} for endpoint host names;
        None: the reactor's C{nameResolver}.
    """

    def __init__(
        self,
        reactor: IReactorTime,
        metrics: Metrics,
        breakers: BreakerRegistry,
        agent: Optional[IAgent] = None,
        resolver: Optional[IHostnameResolver] = None,
    ) -> None:
        self._reactor = reactor
        self._resolver = resolver
        self._metrics = metrics
        self._breakers = breakers
        self._test_agent = agent
        self.pool = OriginPool(reactor)
        self._profiles: dict[EndpointSettings, _Profile] = {}
        self._by_id: dict[int, tuple[EndpointSettings, _Profile]] = {}
        self._origins: dict[str, _Origin] = {}
        self._live: set[_Call] = set()

    # ------------------------------------------------------------ state

    def in_flight(self, origin: str) -> int:
        """
        Calls to C{origin} in flight now.
        """
        o = self._origins.get(origin)
        return o.in_flight if o is not None else 0

    def _profile(self, settings: EndpointSettings) -> _Profile:
        entry = self._by_id.get(id(settings))
        if entry is not None and entry[0] is settings:
            return entry[1]
        profile = self._profiles.get(settings)
        if profile is None:
            profile = self._profiles[settings] = _Profile(self._reactor, settings, self.pool, self._resolver)
        if len(self._by_id) >= _CACHE_LIMIT:
            self._by_id.clear()
        self._by_id[id(settings)] = (settings, profile)
        return profile

    def _origin(self, name: str, breaker: BreakerConfig) -> _Origin:
        o = self._origins.get(name)
        if o is None:
            o = self._origins[name] = _Origin(name, breaker, self._metrics)
        return o

    def _breaker(self, origin: _Origin, settings: EndpointSettings) -> CircuitBreaker:
        # Always the origin's thresholds: the config refuses breaker
        # settings on overrides that do not cover the origin's root.
        return self._breakers.get(origin.name, origin.breaker_config)

    def _count(self, origin: _Origin, outcome: str) -> None:
        child = origin.outcomes.get(outcome)
        if child is None:
            child = origin.outcomes[outcome] = self._metrics.endpoint_requests.labels(origin.name, outcome)
        child.inc()

    # ------------------------------------------------------------ calls

    def call(
        self, url: EndpointURL, settings: EndpointSettings, body: bytes, headers: dict[bytes, bytes],
        deadline: Deadline, breaker_config: Optional[BreakerConfig] = None,
        check: Optional[Callable[[EndpointDecision], Optional[str]]] = None,
    ) -> "Deferred[EndpointDecision]":
        """
        POST C{body} to C{url} and parse the reply, within C{settings.timeout}
        and before C{deadline}.  Fails with L{EndpointFailure}.

        The caller owns C{deadline}: it cancels the result when the deadline
        passes, and the call then fails with C{timeout} (the breaker counts
        nothing: the review's deadline is not a verdict on the endpoint).
        Cancelled before, the call ends (the breaker counts nothing) and
        fails with C{CancelledError}.

        @param check: given a usable reply, the reason amp refuses it (its
            patch does not apply, is too large, ...) or None; the call is
            counted under that reason instead of C{ok}, and still resolves
            to the reply (the endpoint answered: a success for the breaker).
        @param breaker_config: the breaker settings of C{url}'s origin (those of
            its root URL, see L{amp.policy.Route.breaker}); by default
            C{settings.breaker}.  The first call to an origin sets them.
        """
        origin = self._origin(url.origin, breaker_config if breaker_config is not None else settings.breaker)
        breaker = self._breaker(origin, settings)
        ticket = breaker.allow()
        if ticket is None:
            return self._refuse(origin, "breaker-open",
                                f"circuit breaker open, next try in {breaker.reopens_in():.1f}s")
        if origin.in_flight >= settings.max_concurrent:
            breaker.release(ticket)
            return self._refuse(origin, "concurrency-limit",
                                f"{origin.in_flight} calls already in flight (max_concurrent)")
        budget = deadline.remaining(self._reactor.seconds())
        timeout = settings.timeout if settings.timeout < budget else budget
        if timeout <= 0:
            breaker.release(ticket)
            return self._refuse(origin, "timeout", "no time left in the review's deadline")
        # From here on the ticket must reach the breaker whatever happens.
        try:
            profile = self._profile(settings)
            target = profile.target(url)
            # The fixed headers were encoded once, with the target; only the
            # per-review ones are encoded (and sanitised) here.
            raw = Headers()
            raw._rawHeaders.update(target.headers)
            set_header = raw.setRawHeaders
            for k, v in headers.items():
                set_header(k, [v])
            if target.denied is not None:
                log.warn("Not calling {endpoint}: {message}", endpoint=origin.name, message=target.denied)
                raise _LocalFailure("denied-address", target.denied)
        except _LocalFailure as e:
            breaker.release(ticket)
            return self._refuse(origin, e.reason, e.message)
        except Exception:
            breaker.release(ticket)
            log.failure("Could not build the request to {endpoint}", endpoint=origin.name)
            return self._refuse(origin, "connection-failed", "amp could not build the request")
        c = _Call(self, origin, target, profile, settings, body, raw, timeout, deadline, breaker, ticket, check)
        origin.in_flight += 1
        self._live.add(c)
        return c.start()

    def _send(self, profile: _Profile, target: _Target, headers: Headers, body: bytes) -> Deferred:
        producer = BytesProducer(body)
        if self._test_agent is not None:
            return self._test_agent.request(b"POST", target.url, headers, producer)
        endpoint = profile.endpoint(target.scheme, target.host, target.port)
        return profile.agent._requestWithEndpoint(
            target.key, endpoint, b"POST", target.uri, headers, producer, target.path)

    def _refuse(self, origin: _Origin, reason: str, message: str) -> Deferred:
        self._count(origin, reason)
        return fail(EndpointFailure(reason, message))

    def close(self) -> Deferred:
        """
        Shut down: stop keeping connections, wait for the calls in flight,
        close every connection; fires when all that were open have closed.
        """
        self.pool.closing = True
        calls = [c.settled() for c in list(self._live)]
        return gatherResults(calls).addCallback(lambda _: self.pool.shutdown())


def _parse(body: bytes) -> EndpointDecision:
    try:
        return parse_reply(body)
    except ReplyError as e:
        raise EndpointFailure(e.reason, str(e)) from None
