"""
L{EndpointClient}: the one client amp calls endpoints with; it admits calls
(breaker, latency budget, bulkhead and its queue, time left), builds their
requests, and closes.
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
from amp.endpoint._call import Call, CallGuard, CallRequest, ICallReceiver
from amp.endpoint._failures import EndpointFailure, LocalFailure
from amp.endpoint._origin import Origin
from amp.endpoint._pool import Connector, Profile, request_bytes
from amp.endpoint._request import EndpointRequest
from amp.endpoint._types import IEndpointReactor
from amp.http import Charge, ClientConnection, ReplyBudget
from amp.memo import Memo
from amp.metrics import Metrics
from amp.reasons import Reason, Verdict
from amp.shedding import SHED, LatencyBudget
from amp.urls import EndpointURL

# Bound on the memo of settings objects seen (by identity).
_SETTINGS_KEPT = 4096

log = Logger()


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
        self._by_id: Memo[int, tuple[EndpointSettings, Profile]] = Memo(_SETTINGS_KEPT)
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

    def queued(self, origin: str) -> int:
        """
        Calls to C{origin} waiting for a slot now.
        """
        o = self._origins.get(origin)
        return o.bulkhead.queued if o is not None else 0

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
                self.reactor,
                settings,
                self._resolver,
                self.budget,
                self._connector,
                self._connection_opened,
                self._connection_lost,
            )
            profile.keep = not self._closing
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

    def _settled(self, origin: Origin, call: Call, outcome: str, duration: float, verdict: Verdict) -> None:
        self._live.discard(call)
        self._count(origin, outcome)
        bulkhead = origin.bulkhead
        if call.queued:
            # It never held a slot: out of the queue (a no-op when the
            # queue handed it a slot it then refused).
            bulkhead.leave(call)
            if outcome in _REFUSALS:
                origin.refused(outcome)
            self._admit(origin)
            return
        bulkhead.release()
        origin.duration.observe(duration)
        guard = call.guard
        latency = guard.latency
        if latency is not None:
            self._measured(origin, latency, guard.token, outcome, duration, verdict)
        if bulkhead.waiters:
            self._admit(origin)

    def _measured(
        self, origin: Origin, latency: LatencyBudget, token: int, outcome: str, duration: float, verdict: Verdict
    ) -> None:
        """
        Tell the origin's latency budget how long a call took: a reply, a
        failure of the endpoint's, or a call the review's deadline cut off
        (C{timeout}) measure the endpoint; nothing else does.
        """
        if verdict is Verdict.RELEASE and outcome != Reason.TIMEOUT:
            latency.forget(token)
            return
        changed = latency.observe(token, duration)
        if changed is None or latency is not origin.latency:
            return
        self._metrics.endpoint_shedding.labels(origin.name).set(1 if changed else 0)
        if changed:
            log.warn(
                "Shedding {endpoint}: {over} of its last {window} calls took longer than its latency budget of"
                " {budget}s; new reviews get the failure policy (latency-budget) while one probe call at a "
                "time goes out",
                endpoint=origin.name,
                over=latency.over if latency.seen else latency.window,
                window=latency.window,
                budget=latency.budget,
            )
        else:
            log.info(
                "{endpoint} is within its latency budget again: a probe took {seconds:.3f}s (budget {budget}s);"
                " no longer shedding",
                endpoint=origin.name,
                seconds=duration,
                budget=latency.budget,
            )

    def _admit(self, origin: Origin) -> None:
        """Hand the origin's free slots to its waiters, in arrival order."""
        bulkhead = origin.bulkhead
        bulkhead.admit(partial(self._dequeued, origin))
        origin.show_queue()

    def _dequeued(self, origin: Origin, call: Call) -> None:
        """
        C{call} has left the queue holding a slot: it goes out, unless its
        time, its origin's breaker or its latency budget says otherwise now
        (then the slot goes on to the next waiter).
        """
        try:
            refusal = self._ready(origin, call)
        except Exception:
            log.failure("Could not start a call to {endpoint} that waited for a slot", endpoint=origin.name)
            refusal = (Reason.CONNECTION_FAILED, "amp could not start the call")
        if refusal is not None:
            origin.bulkhead.release()
            call.refuse(*refusal)
            return
        try:
            call.start()
        except Exception:
            log.failure("Could not start a call to {endpoint} that waited for a slot", endpoint=origin.name)

    def _ready(self, origin: Origin, call: Call) -> Optional[tuple[Reason, str]]:
        """
        Make a call that waited ready to go out (its ticket, its latency
        token, its time), or say why it may not.
        """
        request = call.request
        now = self.reactor.seconds()
        if call.expires is not None and now >= call.expires:
            return (
                Reason.QUEUE_TIMEOUT,
                f"waited {call.waited(now):.3g}s for a slot; too little time left for "
                "the call (endpoints.min_call_time)",
            )
        guard = call.guard
        breaker = guard.breaker
        ticket = breaker.allow()
        if ticket is None:
            return (Reason.BREAKER_OPEN, f"circuit breaker open, next try in {breaker.reopens_in():.1f}s")
        latency = origin.latency_for(request.settings)
        if latency is not None:
            token = latency.allow()
            if token == SHED:
                breaker.release(ticket)
                return (Reason.LATENCY_BUDGET, _shed_message(latency))
            guard.latency, guard.token = latency, token
        guard.ticket = ticket
        remaining = request.deadline.remaining(now)
        timeout = request.settings.timeout if request.settings.timeout < remaining else None
        request.timeout = timeout
        request.allowed = timeout if timeout is not None else remaining
        return None

    # ------------------------------------------------------------ calls

    def call(self, request: EndpointRequest, receiver: ICallReceiver) -> Optional[Call]:
        """
        POST C{request.body} to C{request.url} and parse the reply, within
        C{settings.timeout} and before C{request.deadline}; C{receiver} is
        told once (L{ICallReceiver}): the L{CallReply}, which the caller
        settles once it has judged it, or the failure, an L{EndpointFailure}
        (told before this returns when amp refuses the call at once: then
        the result is None).  The result is the L{Call}, which the caller
        waits on through its L{amp.waiting.Waiting}: the call arms no timer.

        The caller owns the deadline and times the call: when
        C{settings.timeout} ends first, the call's L{Call.expires} says when
        and the caller's timer calls its L{Call.time_out}: the call fails with
        C{timeout} (which counts against the breaker); otherwise the caller
        cancels the call (L{Call.cancel}) when the deadline passes: the call
        then fails with C{timeout} too, but the breaker counts nothing (the
        review's deadline is not a verdict on the endpoint).  Cancelled
        before the deadline (the API server went away), the call ends as
        C{cancelled}, the breaker counts nothing, and the receiver is told a
        C{CancelledError}.  A call that waits for a bulkhead slot has its
        latest start as its C{expires} (C{queue-timeout} then), and tells the
        receiver L{ICallReceiver.started} when it goes out.

        The caller settles the L{CallReply} with C{ok} or the reason amp
        refuses it (its patch is invalid, does not apply, ...): the call is
        counted under that outcome, and the endpoint answered either way (a
        success for its breaker).  Callers that want a Deferred of the
        decision use L{amp.endpoint.deferred_call}.
        """
        url = request.url
        settings = request.settings
        deadline = request.deadline
        breaker_config = request.breaker
        origin = self._origin(url.origin, breaker_config if breaker_config is not None else settings.breaker)
        breaker = self._breaker(origin)
        ticket = breaker.allow()
        if ticket is None:
            self._refuse(
                receiver, origin, Reason.BREAKER_OPEN, f"circuit breaker open, next try in {breaker.reopens_in():.1f}s"
            )
            return None
        latency = None if settings.latency_budget <= 0 and origin.latency is None else origin.latency_for(settings)
        token = 0
        if latency is not None:
            token = latency.allow()
            if token == SHED:
                breaker.release(ticket)
                self._refuse(receiver, origin, Reason.LATENCY_BUDGET, _shed_message(latency))
                return None
        now = self.reactor.seconds()
        remaining = deadline.remaining(now)
        if remaining <= 0:
            breaker.release(ticket)
            if latency is not None:
                latency.forget(token)
            self._refuse(receiver, origin, Reason.TIMEOUT, "no time left in the review's deadline")
            return None
        bulkhead = origin.bulkhead
        slot = bulkhead.enter(settings.max_concurrent)
        if not slot:
            # The call waits for a slot: it holds no ticket and no probe
            # meanwhile (both are asked for again when it gets one).
            breaker.release(ticket)
            if latency is not None:
                latency.forget(token)
            latest = deadline.at - settings.min_call_time
            if now >= latest:
                self._refuse(
                    receiver,
                    origin,
                    Reason.QUEUE_TIMEOUT,
                    (
                        f"{bulkhead.in_flight} calls in flight (endpoints.max_concurrent) and {remaining:.3g}s left, "
                        "too little to wait for a slot (endpoints.min_call_time)"
                    ),
                )
                return None
            if bulkhead.queued >= settings.max_queued:
                self._refuse(
                    receiver,
                    origin,
                    Reason.QUEUE_FULL,
                    (
                        f"{bulkhead.in_flight} calls in flight (endpoints.max_concurrent) and {bulkhead.queued} "
                        "waiting for a slot (endpoints.max_queued)"
                    ),
                )
                return None
        # A time of the call's own only when the endpoint's timeout ends
        # before the caller's deadline.
        timeout = settings.timeout if settings.timeout < remaining else None
        # From here on the ticket must reach the breaker whatever happens.
        try:
            profile = self._profile(settings)
            target = profile.target(url)
            data = request_bytes(target, request.headers, request.body, self._closing)
            if target.denied is not None:
                log.warn("Not calling {endpoint}: {message}", endpoint=origin.name, message=target.denied)
                raise LocalFailure(Reason.DENIED_ADDRESS, target.denied)
        except LocalFailure as e:
            self._unwind(origin, breaker, ticket, latency, token, slot)
            self._refuse(receiver, origin, e.reason, e.message)
            return None
        except Exception:
            self._unwind(origin, breaker, ticket, latency, token, slot)
            log.failure("Could not build the request to {endpoint}", endpoint=origin.name)
            self._refuse(receiver, origin, Reason.CONNECTION_FAILED, "amp could not build the request")
            return None
        # One bound for all calls; a reloaded configuration may change it.
        self.budget.limit = settings.max_buffered
        sending = CallRequest(
            origin.name,
            target,
            profile,
            settings,
            data,
            timeout,
            deadline,
            timeout if timeout is not None else remaining,
        )
        if not slot:
            c = Call(
                self.reactor,
                sending,
                CallGuard(Charge(self.budget), breaker, None),
                partial(self._settled, origin),
                receiver,
            )
            self._live.add(c)
            bulkhead.wait(c, settings.max_concurrent, settings.max_queued)
            c.queue(deadline.at - settings.min_call_time)
            origin.show_queue()
            return c
        guard = CallGuard(Charge(self.budget), breaker, ticket)
        if latency is not None:
            guard.latency, guard.token = latency, token
        c = Call(self.reactor, sending, guard, partial(self._settled, origin), receiver)
        self._live.add(c)
        c.start()
        return c

    def _unwind(
        self,
        origin: Origin,
        breaker: CircuitBreaker,
        ticket: Any,
        latency: Optional[LatencyBudget],
        token: int,
        slot: bool,
    ) -> None:
        """Give back what a call that will not be made took (a call refused before it was made)."""
        if slot:
            breaker.release(ticket)
            if latency is not None:
                latency.forget(token)
            origin.bulkhead.release()
            if origin.bulkhead.queued:
                self._admit(origin)

    def breaker_state(self, url: EndpointURL) -> Optional[str]:
        """The state of the breaker of C{url}'s origin (for a trace), or None before its first call."""
        return self._breakers.state_of(url.origin)

    def _refuse(self, receiver: ICallReceiver, origin: Origin, reason: Reason, message: str) -> None:
        self._count(origin, reason)
        if reason in _REFUSALS:
            origin.refused(reason)
        receiver.failed(Failure(EndpointFailure(reason, message)))

    # ------------------------------------------------------------ shutdown

    def close(self) -> Deferred[None]:
        """
        Shut down: stop keeping connections, wait for the calls in flight
        (each bounded by its caller's one timer: its own timeout or the deadline), close the
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

    def close_idle_connections(self) -> Deferred[None]:
        """
        Close every idle pooled connection; fires when they have closed.
        """
        return gatherResults(
            [pool.close_idle() for profile in list(self._profiles.values()) for pool in list(profile.pools.values())]
        ).addCallback(lambda _: None)

    def _close_connections(self, ignored: object) -> Deferred[None]:
        # Every call has ended: what is open is idle or closing.  Abort it
        # all rather than wait on peers to answer a graceful close.
        waits = [c.when_lost() for c in list(self._open)]
        self.close_idle_connections()
        for c in list(self._open):
            c.abort()
        return gatherResults(waits).addCallback(lambda _: None)


#: Refusals of amp's own limits, counted by reason besides the outcome.
_REFUSALS = frozenset({Reason.QUEUE_FULL, Reason.QUEUE_TIMEOUT, Reason.LATENCY_BUDGET})


def _shed_message(latency: LatencyBudget) -> str:
    return (
        f"shed: the endpoint's recent calls are over its latency budget of {latency.budget:.3g}s (p90 of the "
        f"last {latency.window}); one probe call at a time until one is back within it"
    )
