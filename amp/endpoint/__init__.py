"""
Calling endpoints: pooled HTTP/1.1 calls with per-endpoint timeouts, reply
limits, a concurrency cap and a circuit breaker per endpoint origin, to
addresses checked against C{endpoints.deny_networks}.

There is one way to call an endpoint: L{EndpointClient.call} takes an
L{EndpointRequest} (URL, settings, body, headers, the review's deadline,
the origin's breaker settings) and an L{ICallReceiver}, and returns the
L{Call}, which the caller waits on through its L{amp.waiting.Waiting} (the
call arms no timer of its own).  The receiver is told a L{CallReply}: the
endpoint's L{amp.reply.EndpointDecision} and the handle with which the
caller settles the call's outcome once it has judged the reply (C{ok}, or
the reason amp refuses it; L{amp.steps.CallStep} does that for a review and
for the canary); or the failure, an L{EndpointFailure} whose
C{reason} is one of L{amp.reasons.ENDPOINT_REASONS}: every way a call can go
wrong has a name that reaches the warning, the audit annotation, the deny
message and the C{amp_endpoint_requests_total{endpoint,outcome}} label
(L{amp.reasons.ENDPOINT_OUTCOMES}).

The public names are here, the machinery in private modules beside it, one
concern each:

  - L{amp.endpoint._client}: L{EndpointClient}: admitting a call (breaker,
    bulkhead, time left), building its request, shutting down.
  - L{amp.endpoint._origin}: the state kept per origin (L{amp.endpoint._origin.Origin}):
    bulkhead and queue, latency budget, breaker thresholds, metric children.
  - L{amp.endpoint._call}: one call's state machine: its expiry, retries,
    the reply's settle handle (L{CallReply}), settling the outcome, the metric
    and the breaker ticket exactly once, and telling its end to its
    L{ICallReceiver} (the review's L{amp.steps.CallStep} on the hot path).
  - L{amp.endpoint._request}: L{EndpointRequest}, what a caller asks for.
  - L{amp.endpoint._deferred}: L{deferred_call}, a call as a Deferred of its
    decision for callers that are not a review (tests, benchmarks), waited
    on through the same L{amp.waiting.Waiting}.
  - L{amp.endpoint._failures}: naming failures (L{classify}).
  - L{amp.endpoint._pool}: the L{amp.endpoint._pool.Profile} per settings
    value (reply limits, a pool per origin) and each URL's request head,
    built once.
  - L{amp.endpoint._connect}: SSRF-checked connecting (deny list, one
    resolution per new connection, connecting to the checked addresses).
  - L{amp.endpoint._tls}: client TLS, reloaded when its files change.
  - L{amp.endpoint._types}: the reactor the client needs (L{IEndpointReactor}).

The HTTP/1.1 is amp's own (L{amp.http}): requests built whole, replies
parsed by llhttp and read within their limits while they arrive, pooled
keep-alive connections per origin.  It does not re-parse URLs, keep
cookies or decode gzip (an unbounded expansion before any size check could
see it), and it follows no redirect.

Limits
======

  - Time: C{min(settings.timeout, time left before the review's
    deadline)}, covering connect, TLS handshake, headers and body.  The
    caller times it, with the one timer of its L{amp.waiting.Waiting}: set
    for the earlier of the call's own expiry (L{Call.expires}: its timeout,
    when C{settings.timeout} ends first; a C{timeout} then counts against
    the breaker) and the review's deadline (the call is cancelled:
    C{timeout}, not counted).  C{connect_timeout} separately bounds the
    TCP connect.
  - Bulkhead: when C{max_concurrent} calls to the origin are in flight, the
    next waits for a slot in the origin's queue (L{amp.bulkhead}), in
    arrival order, while its deadline leaves C{min_call_time} for the call
    (C{queue-timeout} after that; C{queue-full} past C{max_queued} waiting).
    Its breaker ticket and latency token are asked for when its slot comes.
  - Latency budget: while the origin's recent calls are over its
    C{latency_budget} (L{amp.shedding}), a new call fails at once with
    C{latency-budget}, but for one probe at a time.
  - A reply over C{max_response} bytes fails with C{response-too-large}: at
    once when its Content-Length says so, else as soon as the body passes
    the limit; the connection is closed either way.  Non-2xx replies are not
    read: their connection is closed.  Redirects are never followed.

Circuit breaker
===============

One L{amp.breaker.CircuitBreaker} per origin, from the shared
L{amp.breaker.BreakerRegistry}.  Its thresholds are the C{breaker} settings
of the origin's root URL C{scheme://host:port/} (an override with a path
pattern cannot give one origin two breakers).  While it is open, calls fail
with C{breaker-open} without touching the network.  Every failure of the
endpoint counts against it, including the endpoint's own timeout; a call
that amp ends early (the review's deadline, the caller cancels it) or that
fails on amp's side (TLS files that do not load, a denied address) counts
nothing and hands its ticket back.

Connections an endpoint ends
============================

A connection carries another call only when its reply allows it (RFC 9112
section 9.3, L{amp.http.ClientConnection}): never after an HTTP/1.0 reply
without C{Connection: keep-alive}, after C{Connection: close}, or after a
body that ended with the close.  A call that went out on a kept-alive
connection the endpoint had closed while it was idle, and that failed
before any byte of its reply, is sent once more on a new connection
(L{amp.http.OriginPool}).

Denied addresses and pooled connections
=======================================

Pooled connections are reused without resolving again.  That is safe: a
pooled connection was made to an address checked against the deny list of
its profile's settings, and that list cannot change for the profile (the
settings value is the profile's key, and the list is the same in every
override).  A name whose answer changes, including to a denied address (DNS
rebinding), therefore only reaches the new answer on a new connection, whose
resolution is checked.  Resolving per call instead would put a DNS round
trip (several, with a cluster's search domains) on every review.

Twisted
=======

Public APIs only: connect endpoints (C{HostnameEndpoint}, C{TCP4ClientEndpoint},
C{wrapClientTLS}), C{Protocol} and C{Factory}, the reactor's timers and
name resolver.  The connect endpoints can be swapped for in-memory ones
(L{Connector}: C{amp explain --reply}, tests); everything else runs as it
does over a socket.

Shutdown
========

L{EndpointClient.close} stops keeping connections, waits for the calls in
flight, closes every idle connection and fires once every connection that
was open has closed.  Calls made after that still work, on connections that
are closed when they end.
"""

from amp.endpoint._call import OK, Call, CallReply, ICallReceiver
from amp.endpoint._client import EndpointClient
from amp.endpoint._connect import DeniedAddress
from amp.endpoint._deferred import deferred_call
from amp.endpoint._failures import EndpointFailure
from amp.endpoint._pool import USER_AGENT, Connector
from amp.endpoint._request import EndpointRequest
from amp.endpoint._types import IEndpointReactor

__all__ = [
    "OK",
    "Call",
    "CallReply",
    "Connector",
    "EndpointClient",
    "EndpointRequest",
    "ICallReceiver",
    "EndpointFailure",
    "DeniedAddress",
    "IEndpointReactor",
    "USER_AGENT",
    "deferred_call",
]
