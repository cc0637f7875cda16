"""
L{EndpointClient}: the one client amp calls endpoints with; it admits calls
(breaker, bulkhead, time left), builds their requests, and closes.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Optional

from twisted.internet.defer import Deferred, gatherResults
from twisted.internet.interfaces import IHostnameResolver
from twisted.logger import Logger
from twisted.python.failure import Failure

from amp.breaker import BreakerRegistry, CircuitBreaker
from amp.config import BreakerConfig, EndpointSettings
from amp.deadline import Deadline
from amp.endpoint._call import OK, Call, CallGuard, CallReply, CallRequest, ICallReceiver
from amp.endpoint._failures import EndpointFailure, LocalFailure
from amp.endpoint._pool import Connector, Profile, request_bytes
from amp.endpoint._types import IEndpointReactor
from amp.http import Charge, ClientConnection, DeferredReceiver, ReplyBudget
from amp.metrics import Metrics
from amp.reasons import Reason
from amp.reply import EndpointDecision
from amp.urls import EndpointURL

# Bound on the cache of settings objects seen (by identity).
_CACHE_LIMIT = 4096

log = Logger()


class Origin:
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


class EndpointClient:
    """
    The one client amp uses to call endpoints.

    @param reactor: for connections and every timer.
    @param connector: gives the connect endpoint for a scheme, host and
        port instead of amp's own SSRF-checked TCP and TLS ones: replies
        served in memory (C{amp explain --reply}, tests).  Everything else
        (pooling, reading replies within their limits) is the same.
    @param resolver: the C{IHostnameResolver} for endpoint host names;
        None: the reactor's C{nameResolver}.
    """

    def __init__(
        self,
        reactor: IEndpointReactor,
        metrics: Metrics,
        breakers: BreakerRegistry,
        connector: Optional[Connector] = None,
        resolver: Optional[IHostnameResolver] = None,
    ) -> None:
        self.reactor = reactor
        self._resolver = resolver
        self._metrics = metrics
        self._breakers = breakers
        self._connector = connector
        self._profiles: dict[EndpointSettings, Profile] = {}
        self._by_id: dict[int, tuple[EndpointSettings, Profile]] = {}
        self._origins: dict[str, Origin] = {}
        self._live: set[Call] = set()
        self._open: set[ClientConnection] = set()
        self._closing = False
        #: Connections opened since the client was made.
        self.connections_opened = 0
        #: Bytes of endpoint replies held now, over every call, and their
        #: bound (C{endpoints.max_buffered}, from the settings of each call).
        self.budget = ReplyBudget(EndpointSettings().max_buffered)

    # ------------------------------------------------------------ state

    def in_flight(self, origin: str) -> int:
        """
        Calls to C{origin} in flight now.
        """
        o = self._origins.get(origin)
        return o.in_flight if o is not None else 0

    def open_connections(self) -> int:
        """
        Connections open now, idle or busy.
        """
        return len(self._open)

    def idle_connections(self) -> int:
        """
        Open connections with no request on them (the pooled ones).
        """
        return sum(pool.idle_count() for profile in self._profiles.values() for pool in profile.pools.values())

    def _connection_opened(self, connection: ClientConnection) -> None:
        self._open.add(connection)
        self.connections_opened += 1

    def _connection_lost(self, connection: ClientConnection) -> None:
        self._open.discard(connection)

    def _profile(self, settings: EndpointSettings) -> Profile:
        entry = self._by_id.get(id(settings))
        if entry is not None and entry[0] is settings:
            return entry[1]
        profile = self._profiles.get(settings)
        if profile is None:
            profile = self._profiles[settings] = Profile(
                self.reactor, settings, self._resolver, self.budget, self._connector, self._connection_opened,
                self._connection_lost)
            profile.keep = not self._closing
        if len(self._by_id) >= _CACHE_LIMIT:
            self._by_id.clear()
        self._by_id[id(settings)] = (settings, profile)
        return profile

    def _origin(self, name: str, breaker: BreakerConfig) -> Origin:
        o = self._origins.get(name)
        if o is None:
            o = self._origins[name] = Origin(name, breaker, self._metrics)
        return o

    def _breaker(self, origin: Origin) -> CircuitBreaker:
        # Always the origin's thresholds: the config refuses breaker
        # settings on overrides that do not cover the origin's root.
        return self._breakers.get(origin.name, origin.breaker_config)

    def _count(self, origin: Origin, outcome: str) -> None:
        child = origin.outcomes.get(outcome)
        if child is None:
            child = origin.outcomes[outcome] = self._metrics.endpoint_requests.labels(origin.name, outcome)
        child.inc()

    def _settled(self, origin: Origin, call: Call, outcome: str, duration: float) -> None:
        origin.in_flight -= 1
        self._live.discard(call)
        origin.duration.observe(duration)
        self._count(origin, outcome)

    # ------------------------------------------------------------ calls

    def call(
        self, url: EndpointURL, settings: EndpointSettings, body: bytes, headers: dict[bytes, bytes],
        deadline: Deadline, breaker_config: Optional[BreakerConfig] = None,
    ) -> "Deferred[EndpointDecision]":
        """
        L{ask}, the reply used as it is: resolves to the endpoint's
        L{EndpointDecision}, the call counted C{ok}.
        """
        return self.ask(url, settings, body, headers, deadline, breaker_config).addCallback(_used)

    def ask(
        self, url: EndpointURL, settings: EndpointSettings, body: bytes, headers: dict[bytes, bytes],
        deadline: Deadline, breaker_config: Optional[BreakerConfig] = None,
    ) -> "Deferred[CallReply]":
        """
        L{ask_into}, told to a Deferred: it resolves to the L{CallReply},
        or fails with L{EndpointFailure}; cancelling it is the call's
        L{Call.cancel}.
        """
        receiver = DeferredReceiver()
        receiver.cancels = self.ask_into(receiver, url, settings, body, headers, deadline, breaker_config)
        return receiver.result

    def ask_into(
        self, receiver: ICallReceiver, url: EndpointURL, settings: EndpointSettings, body: bytes,
        headers: dict[bytes, bytes], deadline: Deadline, breaker_config: Optional[BreakerConfig] = None,
        caller_times: bool = False,
    ) -> Optional[Call]:
        """
        POST C{body} to C{url} and parse the reply, within C{settings.timeout}
        and before C{deadline}; C{receiver} is told once (L{ICallReceiver}):
        the L{CallReply}, which the caller settles once it has judged it, or
        the failure, an L{EndpointFailure} (told before this returns when
        amp refuses the call at once: then the result is None).  The result
        is the L{Call}, which the caller may L{Call.cancel}.

        The caller owns C{deadline}: when C{settings.timeout} ends first, the
        call's own timer fails it with C{timeout} (which counts against the
        breaker); otherwise the caller's timer is the only one, and the
        caller cancels the call when the deadline passes: the call then
        fails with C{timeout} too, but the breaker counts nothing (the
        review's deadline is not a verdict on the endpoint).  Cancelled
        before the deadline (the API server went away), the call ends as
        C{cancelled}, the breaker counts nothing, and the result fails with
        C{CancelledError}.

        The caller settles the L{CallReply} with C{ok} or the reason amp
        refuses it (its patch is invalid, does not apply, ...): the call is
        counted under that outcome, and the endpoint answered either way (a
        success for its breaker).

        @param caller_times: the caller has a timer of its own and calls the
            call's C{time_out} at its C{expires} (when not None), the
            earlier of that and its own deadline: the call arms no timer.
        @param breaker_config: the breaker settings of C{url}'s origin (those
            of its root URL, see L{amp.policy.Route.breaker}); by default
            C{settings.breaker}.  The first call to an origin sets them.
        """
        origin = self._origin(url.origin, breaker_config if breaker_config is not None else settings.breaker)
        breaker = self._breaker(origin)
        ticket = breaker.allow()
        if ticket is None:
            return self._refuse(receiver, origin, Reason.BREAKER_OPEN,
                                f"circuit breaker open, next try in {breaker.reopens_in():.1f}s")
        if origin.in_flight >= settings.max_concurrent:
            breaker.release(ticket)
            return self._refuse(receiver, origin, Reason.CONCURRENCY_LIMIT,
                                f"{origin.in_flight} calls already in flight (max_concurrent)")
        remaining = deadline.remaining(self.reactor.seconds())
        if remaining <= 0:
            breaker.release(ticket)
            return self._refuse(receiver, origin, Reason.TIMEOUT, "no time left in the review's deadline")
        # A timer of the call's own only when the endpoint's timeout ends
        # before the caller's deadline: that deadline is the caller's timer.
        timeout = settings.timeout if settings.timeout < remaining else None
        # From here on the ticket must reach the breaker whatever happens.
        try:
            profile = self._profile(settings)
            target = profile.target(url)
            data = request_bytes(target, headers, body, self._closing)
            if target.denied is not None:
                log.warn("Not calling {endpoint}: {message}", endpoint=origin.name, message=target.denied)
                raise LocalFailure(Reason.DENIED_ADDRESS, target.denied)
        except LocalFailure as e:
            breaker.release(ticket)
            return self._refuse(receiver, origin, e.reason, e.message)
        except Exception:
            breaker.release(ticket)
            log.failure("Could not build the request to {endpoint}", endpoint=origin.name)
            return self._refuse(receiver, origin, Reason.CONNECTION_FAILED, "amp could not build the request")
        # One bound for all calls; a reloaded configuration may change it.
        self.budget.limit = settings.max_buffered
        request = CallRequest(origin.name, target, profile, settings, data, timeout, deadline,
                              timeout if timeout is not None else remaining)
        c = Call(self.reactor, request, CallGuard(Charge(self.budget), breaker, ticket), partial(self._settled, origin),
                 receiver, caller_times)
        origin.in_flight += 1
        self._live.add(c)
        c.start()
        return c

    def breaker_state(self, url: EndpointURL) -> Optional[str]:
        """The state of the breaker of C{url}'s origin (for a trace), or None before its first call."""
        return self._breakers.state_of(url.origin)

    def _refuse(self, receiver: ICallReceiver, origin: Origin, reason: Reason, message: str) -> None:
        self._count(origin, reason)
        receiver.failed(Failure(EndpointFailure(reason, message)))

    # ------------------------------------------------------------ shutdown

    def close(self) -> Deferred:
        """
        Shut down: stop keeping connections, wait for the calls in flight
        (each is bounded by its timer or its caller's deadline), close the
        idle connections; fires once every connection that was open has
        closed.  Calls made after that still work, on connections that are
        closed when they end.
        """
        self._closing = True
        for profile in self._profiles.values():
            profile.keep = False
            for pool in profile.pools.values():
                pool.keep = False
        calls = [c.settled() for c in list(self._live)]
        return gatherResults(calls).addCallback(self._close_connections)

    def close_idle_connections(self) -> Deferred:
        """
        Close every idle pooled connection; fires when they have closed.
        """
        return gatherResults([pool.close_idle() for profile in list(self._profiles.values())
                              for pool in list(profile.pools.values())]).addCallback(lambda _: None)

    def _close_connections(self, ignored: Any) -> Deferred:
        # Every call has ended: what is open is idle or closing.  Abort it
        # all rather than wait on peers to answer a graceful close.
        waits = [c.when_lost() for c in list(self._open)]
        self.close_idle_connections()
        for c in list(self._open):
            c.abort()
        return gatherResults(waits).addCallback(lambda _: None)


def _used(reply: CallReply) -> EndpointDecision:
    reply.settle(OK)
    return reply.decision
