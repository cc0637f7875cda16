"""
Calling endpoints: one pooled HTTP client, per-endpoint timeouts, response
size limits, a concurrency cap and a circuit breaker per endpoint origin.

L{EndpointClient.call} POSTs the Pod and resolves to an
L{amp.reply.EndpointDecision}, or fails with L{EndpointFailure} whose
C{reason} is one of L{REASONS}: every way a call can go wrong has a name that
reaches the warning, the audit annotation, the deny message and the
C{amp_endpoint_requests_total{outcome}} label.

The client is Twisted's C{Agent} over one L{OriginPool}.  treq's
C{HTTPClient} is not used on this path: it re-parses the URL, runs a cookie
jar and transparently gunzips replies (an unbounded expansion before any size
check could see it) on every request, none of which amp wants.  Tests inject
an C{IAgent}, e.g. C{treq.testing.RequestTraversalAgent}.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from OpenSSL import SSL
from twisted.internet import error as ierror
from twisted.internet.defer import CancelledError, Deferred, TimeoutError as DeferredTimeout, succeed
from twisted.internet.endpoints import HostnameEndpoint, wrapClientTLS
from twisted.internet.interfaces import IReactorTime
from twisted.internet.protocol import Protocol
from twisted.internet.ssl import Certificate, PrivateCertificate, optionsForClientTLS
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.client import Agent, HTTPConnectionPool, ResponseDone, ResponseFailed, ResponseNeverReceived
from twisted.web.http import PotentialDataLoss
from twisted.web.http_headers import Headers
from twisted.web.iweb import IAgent, IAgentEndpointFactory, IBodyProducer
from zope.interface import implementer

from amp import __version__
from amp.breaker import BreakerRegistry
from amp.config import EndpointSettings
from amp.metrics import Metrics
from amp.reply import EndpointDecision, ReplyError, parse_reply
from amp.urls import EndpointURL

#: Every named failure of an endpoint call.
REASONS = (
    "timeout", "connection-refused", "connection-reset", "connection-failed", "tls-error",
    "redirect", "http-4xx", "http-5xx", "response-too-large", "invalid-json", "invalid-reply",
    "breaker-open", "concurrency-limit",
)

USER_AGENT = f"amp/{__version__}".encode("ascii")


class EndpointFailure(Exception):
    """
    An endpoint call that did not produce a usable reply.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


@implementer(IBodyProducer)
class BytesProducer:
    """
    A request body already in memory, written in one go (Twisted's
    C{FileBodyProducer} would pace it through the global cooperator).
    """

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


class _LimitedBody(Protocol):
    """
    Collect a response body, failing as soon as it passes C{limit} bytes.
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
            self._finished.errback(Failure(EndpointFailure(
                "response-too-large", f"reply is larger than the {self._limit} byte limit")))
            self.transport.stopProducing()
            return
        self._chunks.append(data)

    def connectionLost(self, reason: Failure = None) -> None:  # type: ignore[assignment]
        if self._finished.called:
            return
        if reason.check(ResponseDone, PotentialDataLoss):
            self._finished.callback(b"".join(self._chunks))
        else:
            self._finished.errback(reason)


def read_limited(response: Any, limit: int) -> Deferred:
    """
    The body of C{response}, or an L{EndpointFailure} past C{limit} bytes.
    Cancelling the result aborts the connection.
    """
    length = response.length
    if isinstance(length, int) and length > limit:
        response.deliverBody(Protocol())
        return _fail_now(EndpointFailure(
            "response-too-large", f"reply of {length} bytes is larger than the {limit} byte limit"))
    collector: _LimitedBody

    def cancel(d: Deferred) -> None:
        if collector.transport is not None:
            collector.transport.stopProducing()

    finished: Deferred = Deferred(cancel)
    collector = _LimitedBody(finished, limit)
    response.deliverBody(collector)
    return finished


def _fail_now(exc: Exception) -> Deferred:
    d: Deferred = Deferred()
    d.errback(Failure(exc))
    return d


class OriginPool(HTTPConnectionPool):
    """
    One connection pool for every endpoint, with per-origin limits: how many
    idle connections to keep and for how long comes from C{limits(key)},
    where C{key} is the Agent's C{(scheme, host, port)}.
    """

    retryAutomatically = False

    def __init__(self, reactor: Any, limits: Callable[[Any], tuple[int, float]]) -> None:
        super().__init__(reactor, persistent=True)
        self._limits = limits

    def _putConnection(self, key: Any, connection: Any) -> None:
        if connection.state != "QUIESCENT":
            connection.transport.loseConnection()
            return
        keep, idle = self._limits(key)
        connections = self._connections.setdefault(key, [])
        while len(connections) >= keep:
            dropped = connections.pop(0)
            dropped.transport.loseConnection()
            self._timeouts.pop(dropped).cancel()
        connections.append(connection)
        self._timeouts[connection] = self._reactor.callLater(idle, self._removeConnection, key, connection)

    def idle_connections(self) -> int:
        return sum(len(c) for c in self._connections.values())


def _client_tls(settings: EndpointSettings, host: str) -> Any:
    trust = None
    if settings.ca_bundle:
        with open(settings.ca_bundle, "rb") as f:
            trust = Certificate.loadPEM(f.read())
    client = None
    if settings.client_cert and settings.client_key:
        with open(settings.client_cert, "rb") as f:
            cert = f.read()
        with open(settings.client_key, "rb") as f:
            key = f.read()
        client = PrivateCertificate.loadPEM(cert + b"\n" + key)
    return optionsForClientTLS(host, trustRoot=trust, clientCertificate=client)


@implementer(IAgentEndpointFactory)
class _EndpointFactory:
    """
    Connections for one set of endpoint settings: connect timeout and, for
    https, the CA bundle and client certificate.
    """

    def __init__(self, reactor: Any, settings: EndpointSettings) -> None:
        self._reactor = reactor
        self._settings = settings
        self._tls: dict[str, Any] = {}

    def endpointForURI(self, uri: Any) -> Any:
        host = uri.host.decode("ascii")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        ep = HostnameEndpoint(self._reactor, host, uri.port, timeout=self._settings.connect_timeout)
        if uri.scheme == b"https":
            tls = self._tls.get(host)
            if tls is None:
                tls = self._tls[host] = _client_tls(self._settings, host)
            ep = wrapClientTLS(tls, ep)
        return ep


def classify(failure: Failure, timeout: float) -> EndpointFailure:
    """
    Name what went wrong with a call.
    """
    if failure.check(EndpointFailure):
        return failure.value
    if failure.check(CancelledError, DeferredTimeout, ierror.TimeoutError, ierror.ConnectingCancelledError):
        return EndpointFailure("timeout", f"no reply within {timeout:.3g}s")
    if failure.check(ierror.ConnectionRefusedError):
        return EndpointFailure("connection-refused", "connection refused")
    if failure.check(SSL.Error):
        return EndpointFailure("tls-error", f"TLS failed: {_first_line(failure.value)}")
    if failure.check(ResponseNeverReceived, ResponseFailed):
        inner = [r for r in failure.value.reasons if not r.check(CancelledError)]
        for r in inner:
            if r.check(SSL.Error):
                return EndpointFailure("tls-error", f"TLS failed: {_first_line(r.value)}")
        if not inner:
            return EndpointFailure("timeout", f"no reply within {timeout:.3g}s")
        return EndpointFailure("connection-reset", "connection closed before a full reply")
    if failure.check(ierror.ConnectionLost, ierror.ConnectionDone):
        return EndpointFailure("connection-reset", "connection closed before a full reply")
    if failure.check(ierror.DNSLookupError):
        return EndpointFailure("connection-failed", "host name did not resolve")
    if failure.check(ierror.ConnectError):
        return EndpointFailure("connection-failed", f"could not connect: {_first_line(failure.value)}")
    return EndpointFailure("connection-failed", _first_line(failure.value))


def _first_line(value: Any) -> str:
    text = str(value) or type(value).__name__
    return text.splitlines()[0][:100]


def _retriable(failure: Failure) -> bool:
    """
    Only failures where the endpoint cannot have seen the request.
    """
    return bool(failure.check(ierror.ConnectionRefusedError, ierror.ConnectError)) and not failure.check(
        ierror.TimeoutError, ierror.ConnectingCancelledError)


class EndpointClient:
    """
    The one client amp uses to call endpoints.

    @param agent: an C{IAgent} to use for every call instead of amp's own
        pooled agents (tests).
    """

    log = Logger()

    def __init__(
        self,
        reactor: IReactorTime,
        metrics: Metrics,
        breakers: BreakerRegistry,
        settings_for_origin: Callable[[str], EndpointSettings],
        agent: Optional[IAgent] = None,
    ) -> None:
        self._reactor = reactor
        self._metrics = metrics
        self._breakers = breakers
        self._settings_for_origin = settings_for_origin
        self._test_agent = agent
        self.pool = OriginPool(reactor, self._pool_limits)
        self._agents: dict[EndpointSettings, IAgent] = {}
        self._in_flight: dict[str, int] = {}

    def _pool_limits(self, key: Any) -> tuple[int, float]:
        scheme, host, port = key[:3]
        host = host.decode("ascii") if isinstance(host, bytes) else host
        host = f"[{host}]" if ":" in host and not host.startswith("[") else host
        settings = self._settings_for_origin(f"{scheme.decode('ascii')}://{host}:{port}")
        return settings.pool_size, settings.idle_timeout

    def _agent(self, settings: EndpointSettings) -> IAgent:
        if self._test_agent is not None:
            return self._test_agent
        agent = self._agents.get(settings)
        if agent is None:
            agent = Agent.usingEndpointFactory(self._reactor, _EndpointFactory(self._reactor, settings), self.pool)
            self._agents[settings] = agent
        return agent

    def in_flight(self, origin: str) -> int:
        return self._in_flight.get(origin, 0)

    def call(
        self, url: EndpointURL, settings: EndpointSettings, body: bytes, headers: dict[bytes, bytes], budget: float
    ) -> "Deferred[EndpointDecision]":
        """
        POST C{body} to C{url} and parse the reply, within
        C{min(settings.timeout, budget)} seconds.
        """
        origin = url.origin
        timeout = min(settings.timeout, budget)
        breaker = self._breakers.get(origin, settings.breaker)
        ticket = breaker.allow()
        if ticket is None:
            return self._refuse(origin, EndpointFailure(
                "breaker-open", f"circuit breaker open, next try in {breaker.reopens_in():.1f}s"))
        in_flight = self._in_flight.get(origin, 0)
        if in_flight >= settings.max_concurrent:
            breaker.release(ticket)
            return self._refuse(origin, EndpointFailure(
                "concurrency-limit", f"{in_flight} calls already in flight (max_concurrent)"))
        self._in_flight[origin] = in_flight + 1
        started = self._reactor.seconds()
        raw_headers = Headers({
            b"content-type": [b"application/json"],
            b"user-agent": [USER_AGENT],
            b"accept": [b"application/json"],
        })
        for k, v in headers.items():
            raw_headers.setRawHeaders(k, [v])
        target = url.url.encode("ascii")
        agent = self._agent(settings)
        retry = [settings.retry]

        def attempt() -> Deferred:
            return agent.request(b"POST", target, raw_headers, BytesProducer(body))

        def maybe_retry(failure: Failure) -> Any:
            if retry[0] and _retriable(failure) and self._reactor.seconds() - started < timeout * 0.5:
                retry[0] = False
                self.log.info("Retrying {endpoint} after {error}", endpoint=origin, error=_first_line(failure.value))
                return attempt().addErrback(maybe_retry)
            return failure

        def got_response(response: Any) -> Deferred:
            code = response.code
            if 200 <= code < 300:
                return read_limited(response, settings.max_response).addCallback(_parse)
            response.deliverBody(Protocol())
            if 300 <= code < 400:
                raise EndpointFailure("redirect", f"HTTP {code} redirect not followed")
            raise EndpointFailure("http-4xx" if code < 500 else "http-5xx", f"HTTP {code}")

        d = attempt().addErrback(maybe_retry).addCallback(got_response)
        d.addTimeout(timeout, self._reactor)

        def done(result: Any) -> Any:
            self._in_flight[origin] -= 1
            elapsed = self._reactor.seconds() - started
            self._metrics.endpoint_duration.labels(origin).observe(elapsed)
            if not isinstance(result, Failure):
                breaker.record_success(ticket)
                self._metrics.endpoint_requests.labels(origin, "ok").inc()
                return result
            failure = classify(result, timeout)
            self._metrics.endpoint_requests.labels(origin, failure.reason).inc()
            if result.check(CancelledError) or (result.check(DeferredTimeout) and timeout < settings.timeout):
                # amp gave up (the review's deadline, or the API server hung
                # up) before the endpoint's own timeout: nothing learned.
                breaker.release(ticket)
            else:
                breaker.record_failure(ticket)
            raise failure

        return d.addBoth(done)

    def _refuse(self, origin: str, failure: EndpointFailure) -> Deferred:
        self._metrics.endpoint_requests.labels(origin, failure.reason).inc()
        return _fail_now(failure)

    def close(self) -> Deferred:
        """
        Close every cached connection (service stop).
        """
        return self.pool.closeCachedConnections()


def _parse(body: bytes) -> EndpointDecision:
    try:
        return parse_reply(body)
    except ReplyError as e:
        raise EndpointFailure(e.reason, str(e)) from None
