"""
The webhook's HTTP side: C{/mutate}, C{/validate}, C{/healthz}, C{/readyz},
and the limits twisted.web does not enforce by itself.

twisted.web neither caps request bodies nor bounds how long a client may take
to send one (its idle timer resets on every byte), and it spools large bodies
to temporary files.  L{WebhookSite} builds L{WebhookChannel}s that:
  - refuse a body over C{listen.max_body} with 413 as soon as the
    Content-Length (or the running count of a chunked body) says so, without
    buffering it;
  - give each request C{listen.request_timeout} from its first byte to its
    last, answering 408 and closing when it runs out; the first request's
    time starts when the connection is accepted, so a client that never
    finishes the TLS handshake or never sends a request is closed too;
  - close connections beyond C{listen.max_connections} at once;
  - refuse a request line over L{WebhookChannel.MAX_LENGTH} bytes (414), a
    header line over that, more than L{WebhookChannel.maxHeaders} header
    fields or more than L{WebhookChannel.totalHeadersSize} bytes of request
    line and headers (431) as soon as what has arrived says so, and answer
    any other malformed request with 400, always with a reason and
    C{Connection: close};
  - write the first few of each kind of repeated warning (connections
    refused, clients timed out, requests refused) and then one summary line
    with a count per interval (L{amp.logs.RepeatLimiter}); the metrics
    count every one;
  - after a refusal, read and drop what the client still sends for at most
    L{CLOSE_GRACE} seconds or L{LINGER_BYTES} bytes, then abort: a client
    that writes its whole body before reading gets its answer instead of a
    reset, and a client that never finishes the close cannot hold its slot.
    A connection that is closed for being idle gets the same grace
    (C{abortTimeout}) to take the close before it is aborted.

L{WebhookSite.drain} is the listener's part of a graceful shutdown (the
listening port is already closed): idle kept-alive connections are closed at
once, a connection with a request in progress gets its answer with
C{Connection: close} and is closed after it, a connection that has not sent
its first request yet (one accepted as the port closed, or just before) may
still send it within C{listen.request_timeout} of being accepted and is
answered the same way, and whatever is still open when the drain's time is
up is aborted.
"""

from __future__ import annotations

import io
from typing import Any, Callable, Optional

from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger, LogLevel
from twisted.python.failure import Failure
from twisted.web import http, pages, server
from twisted.web.resource import Resource

from amp.admission import Admitter, Answer, Outcome, unheard
from amp.logs import RepeatLimiter
from amp.metrics import Metrics
from amp.recent import Decision, RecentDecisions
from amp.review import AdmissionRequest, ReviewError, parse_review

_REASONS = {
    400: b"Bad Request", 408: b"Request Timeout", 413: b"Content Too Large", 414: b"URI Too Long",
    431: b"Request Header Fields Too Large",
}

#: Seconds a connection amp is closing may take to close: after a refusal,
#: the client's remaining input is read and dropped meanwhile; after an
#: idle timeout, the client must take the close.  Then it is aborted.
CLOSE_GRACE = 1.0

#: Bytes of input dropped after a refusal before the connection is aborted
#: without waiting for the rest of L{CLOSE_GRACE}.
LINGER_BYTES = 4 * 1024 * 1024

#: The listener's kinds of repeated warnings (L{amp.logs.RepeatLimiter}):
#: at most L{WARNING_BURST} lines of a kind per L{WARNING_INTERVAL} seconds,
#: then one summary line per interval.
WARNING_KINDS = {
    "connections-refused": "connections refused over listen.max_connections",
    "timed-out": "clients timed out (listen.request_timeout)",
    "refused": "requests refused before review (400, 413, 414, 431)",
    "bad-reviews": "requests that were not valid AdmissionReviews (400, 415)",
}
WARNING_BURST = 5
WARNING_INTERVAL = 60.0


class WebhookRequest(server.Request):
    """
    A request whose body is held in memory and capped.
    """

    logger = Logger()
    _received = 0
    _refused = False
    #: The review answering this request, cancelled if the client goes
    #: away before the answer (cheaper than a notifyFinish() Deferred).
    review: Optional[Deferred] = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Reviews are JSON: never run Twisted's form parsing (it parses the
        # Content-Type through the email package on every POST).
        self._parsePOSTFormSubmission = False

    def gotLength(self, length: Optional[int]) -> None:
        self.content = io.BytesIO()
        limit = self.channel.site.max_body
        if length is not None and length > limit:
            self._refused = True
            self.channel.refuse(413, f"request body of {length} bytes is over the {limit} byte limit (listen.max_body)")

    def handleContentChunk(self, data: bytes) -> None:
        if self._refused:
            return
        self._received += len(data)
        limit = self.channel.site.max_body
        if self._received > limit:
            self._refused = True
            self.channel.refuse(413, f"request body is over the {limit} byte limit (listen.max_body)")
            return
        self.content.write(data)

    def requestReceived(self, command: bytes, path: bytes, version: bytes) -> None:
        if self._refused:
            return
        super().requestReceived(command, path, version)

    def connectionLost(self, reason: Failure) -> None:
        """
        The client went away before the answer was written: stop the review
        (and its endpoint call).  Cancelling a review that has its answer
        already does nothing.
        """
        super().connectionLost(reason)
        review, self.review = self.review, None
        if review is not None:
            review.cancel()

    def processingFailed(self, reason: Failure) -> Failure:
        """
        A bug of amp's while rendering (no input leads here): logged with
        its traceback, answered with amp's own plain 500 instead of
        Twisted's HTML page, and the connection closed.
        """
        self.logger.failure("amp internal error answering {method} {path}", failure=reason,
                            method=self.method, path=self.path)
        if self.startedWriting:
            self.channel.loseConnection()
            return reason
        body = b"amp internal error\n"
        self.setResponseCode(http.INTERNAL_SERVER_ERROR)
        self.setHeader(b"content-type", b"text/plain; charset=utf-8")
        self.setHeader(b"content-length", b"%d" % len(body))
        self.setHeader(b"connection", b"close")
        self.channel.persistent = False
        self.write(body)
        self.finish()
        return reason


class WebhookChannel(http.HTTPChannel):
    """
    An HTTP/1.1 channel with a whole-request read deadline, a connection cap
    and an early refusal path.
    """

    #: Longest request line or header line.  The API server's are far
    #: shorter; Twisted's default (16 KiB) is twice this.
    MAX_LENGTH = 8192
    #: Most header fields in one request (Twisted's default is 500).
    maxHeaders = 100
    #: Most bytes of request line and headers together (Twisted's default).
    totalHeadersSize = 16384
    #: Seconds an idle connection being closed has to close (see CLOSE_GRACE).
    abortTimeout = CLOSE_GRACE

    _read_deadline: Any = None
    _linger: Any = None
    _closing = False
    _counted = False
    _dropped = 0
    #: Bytes of a request not yet fully received have arrived.
    _in_request = False
    #: The current request's first line has arrived.
    _request_line_seen = False
    #: No request has been received in full on this connection yet.
    _fresh = True

    def connectionMade(self) -> None:
        site: WebhookSite = self.site
        if site.draining:
            # Accepted just before the port closed: nothing of it was received.
            site.metrics.connections_dropped.labels("shutting-down").inc()
            self.transport.abortConnection()
            return
        if site.open_connections >= site.max_connections:
            site.metrics.connections_dropped.labels("max-connections").inc()
            site.warnings.emit("connections-refused", LogLevel.warn,
                               "Connection refused: {count} connections open (listen.max_connections)",
                               count=site.open_connections)
            self.transport.abortConnection()
            return
        site.open_connections += 1
        self._counted = True
        site.channels.add(self)
        site.metrics.open_connections.set(site.open_connections)
        if site.on_connections is not None:
            site.on_connections(site.open_connections)
        super().connectionMade()
        self._start_deadline()

    def checkPersistence(self, request: Any, version: bytes) -> bool:
        """
        While draining, every answer closes its connection.
        """
        if self.site.draining:
            request.responseHeaders.setRawHeaders(b"connection", [b"close"])
            return False
        return bool(super().checkPersistence(request, version))

    def drain(self) -> None:
        """
        The shutdown's part for this connection: a request in progress
        (received in part or whole, being answered) is answered with
        C{Connection: close} and the connection closed after it, and so is
        the first request of a connection that has not sent one yet (it
        was accepted to send one: closing it now would fail that review;
        the read deadline that started when it was accepted still bounds
        the wait).  An idle kept-alive connection is closed now, with the
        usual L{CLOSE_GRACE} to take it.
        """
        if self._closing or self.transport.disconnecting:
            return
        if self.requests:
            self.persistent = False
            for request in self.requests:
                if not request.startedWriting:
                    request.responseHeaders.setRawHeaders(b"connection", [b"close"])
            return
        if self._in_request or self._fresh:
            # Its request line has yet to arrive in full (HTTPChannel drops
            # a request line that arrives when it is not persistent); the
            # answer closes the connection (checkPersistence).
            return
        self._closing = True
        self._cancel_deadline()
        self._linger = self.site.reactor.callLater(CLOSE_GRACE, self._abort)
        self.loseConnection()

    def dataReceived(self, data: bytes) -> None:
        if self._closing:
            self._dropped += len(data)
            if self._dropped > LINGER_BYTES:
                self._abort()
            return
        self._in_request = True
        if self._read_deadline is None and not self._handlingRequest:
            self._start_deadline()
        super().dataReceived(data)

    def lineReceived(self, line: bytes) -> None:
        if self._closing:
            return
        if line:
            # Before the parser runs: a request that ends on this line
            # resets the flag for the next one.
            self._request_line_seen = True
        super().lineReceived(line)

    def lineLengthExceeded(self, line: bytes) -> None:
        """
        A line longer than L{MAX_LENGTH} without its end: refuse it now
        rather than buffer it (LineReceiver's default would close the
        transport directly, which a TLS transport defers while this channel
        is its producer).
        """
        if not self._request_line_seen:
            self.refuse(414, f"request line is over {self.MAX_LENGTH} bytes")
        else:
            self.refuse(431, f"a header line is over {self.MAX_LENGTH} bytes")

    def _respondToBadRequestAndDisconnect(self) -> None:
        """
        Twisted's answer to any request it cannot parse (a bare 400): name
        the header limits when that is what was hit.
        """
        if self._receivedHeaderSize > self.totalHeadersSize:
            self.refuse(431, f"request headers are over {self.totalHeadersSize} bytes")
        elif self._receivedHeaderCount > self.maxHeaders:
            self.refuse(431, f"more than {self.maxHeaders} header fields")
        else:
            self.refuse(400, "request is not valid HTTP/1.1")

    def _send100Continue(self) -> None:
        # A request refused on its Content-Length must not be told to go on.
        if not self._closing:
            super()._send100Continue()

    def allContentReceived(self) -> None:
        self._cancel_deadline()
        self._fresh = False
        self._in_request = False
        self._request_line_seen = False
        super().allContentReceived()

    def _start_deadline(self) -> None:
        self._read_deadline = self.site.reactor.callLater(self.site.request_timeout, self._read_timed_out)

    def _read_timed_out(self) -> None:
        self._read_deadline = None
        if not self._in_request:
            # Nothing to answer (possibly not even a finished TLS handshake,
            # so no way to send one): just close.
            self._closing = True
            self.site.metrics.connections_dropped.labels("no-request").inc()
            self.site.warnings.emit("timed-out", LogLevel.info, "Closed a connection that sent no request within "
                                    "{timeout:g}s (listen.request_timeout)", timeout=self.site.request_timeout)
            self.transport.abortConnection()
            return
        self.refuse(408, f"request not received within {self.site.request_timeout:g}s (listen.request_timeout)")

    def _cancel_deadline(self) -> None:
        if self._read_deadline is not None:
            if self._read_deadline.active():
                self._read_deadline.cancel()
            self._read_deadline = None

    def refuse(self, code: int, message: str) -> None:
        """
        Answer C{code} with C{message} and close.  Nothing more is parsed;
        what the client still sends is dropped for at most L{CLOSE_GRACE}
        seconds or L{LINGER_BYTES} bytes, then the connection is aborted.
        """
        if self._closing:
            return
        self._closing = True
        self._cancel_deadline()
        self._linger = self.site.reactor.callLater(CLOSE_GRACE, self._abort)
        self.site.metrics.bad_requests.labels(str(code)).inc()
        self.site.warnings.emit("timed-out" if code == 408 else "refused", LogLevel.warn,
                                "Refused a request: {code} {message}", code=code, message=message)
        body = message.encode("utf-8") + b"\n"
        self.transport.write(
            b"HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\n"
            b"Connection: close\r\n\r\n%s" % (code, _REASONS.get(code, b"Error"), len(body), body))
        self.setRawMode()
        # HTTPChannel.loseConnection, not the transport's: the channel is
        # registered as the transport's producer, and a TLS transport does
        # not close while a producer is registered.
        self.loseConnection()

    def _abort(self) -> None:
        if self._linger is None:
            return
        if self._linger.active():
            self._linger.cancel()
        self._linger = None
        self.transport.abortConnection()

    def connectionLost(self, reason: Failure) -> None:
        self._cancel_deadline()
        if self._linger is not None:
            if self._linger.active():
                self._linger.cancel()
            self._linger = None
        super().connectionLost(reason)
        if self._counted:
            self._counted = False
            site: WebhookSite = self.site
            site.open_connections -= 1
            site.metrics.open_connections.set(site.open_connections)
            if site.on_connections is not None:
                site.on_connections(site.open_connections)
            site.channel_closed(self)


class WebhookSite(server.Site):
    """
    The webhook listener's site: limits from C{listen.*}, no tracebacks to
    clients, no access log (each review logs one line of its own).
    """

    protocol = WebhookChannel
    requestFactory = WebhookRequest
    displayTracebacks = False
    logger = Logger()

    def __init__(
        self, resource: Resource, *, reactor: IReactorTime, metrics: Metrics, max_body: int,
        max_connections: int, request_timeout: float, idle_timeout: float,
        on_connections: Optional[Callable[[int], None]] = None,
    ) -> None:
        """
        @param on_connections: called with L{open_connections} every time
            it changes (with workers, L{amp.balance.WorkerListener} publishes
            it to the other workers).
        """
        super().__init__(resource, timeout=idle_timeout, reactor=reactor)
        self.metrics = metrics
        self.max_body = max_body
        self.max_connections = max_connections
        self.request_timeout = request_timeout
        #: Connections accepted and not refused, still open.
        self.open_connections = 0
        self.on_connections = on_connections
        #: The listener's repeated warnings, limited.
        self.warnings = RepeatLimiter(self.logger, reactor, WARNING_KINDS, burst=WARNING_BURST,
                                      interval=WARNING_INTERVAL)
        #: The connections counted in C{open_connections}.
        self.channels: set[WebhookChannel] = set()
        #: Set by L{drain}: every answer closes its connection, and a
        #: connection accepted now is closed at once.
        self.draining = False
        self._drained: Optional[Deferred[int]] = None
        self._drain_timer: Any = None

    def drain(self, timeout: float) -> "Deferred[int]":
        """
        Finish with every open connection (L{WebhookChannel.drain}): fires
        once all are closed, or after C{timeout} seconds, when those still
        open are aborted.  Fires with how many were aborted.  Call it once
        the listening port is closed.
        """
        self.draining = True
        if self._drained is not None:
            return self._drained
        for channel in list(self.channels):
            channel.drain()
        if not self.channels:
            return succeed(0)
        self._drained = Deferred()
        self._drain_timer = self.reactor.callLater(timeout, self._drain_timed_out, timeout)
        return self._drained

    def channel_closed(self, channel: WebhookChannel) -> None:
        self.channels.discard(channel)
        if self._drained is not None and not self.channels and self._drain_timer.active():
            self._drain_timer.cancel()
            self._drained.callback(0)

    def _drain_timed_out(self, timeout: float) -> None:
        left = list(self.channels)
        self.logger.warn(
            "Drain: {count} connections still open after {timeout:g}s (listen.drain_timeout), aborted",
            count=len(left), timeout=timeout)
        for channel in left:
            channel.transport.abortConnection()
        assert self._drained is not None
        self._drained.callback(len(left))

    def log(self, request: Any) -> None:  # type: ignore[override]
        """
        No access log line: reviews log their own.
        """

    def apply(self, listen: Any) -> None:
        """
        The limits of a reloaded C{listen} section, for every request and
        connection from now on (a connection's idle timeout is set when it
        is accepted).
        """
        self.max_body = listen.max_body
        self.max_connections = listen.max_connections
        self.request_timeout = listen.request_timeout
        self.timeOut = listen.idle_timeout

    def stopFactory(self) -> None:
        super().stopFactory()
        self.warnings.flush()


def _plain(request: server.Request, code: int, message: str) -> bytes:
    request.setResponseCode(code)
    request.setHeader(b"content-type", b"text/plain; charset=utf-8")
    return message.encode("utf-8") + b"\n"


_REVIEW_LINE = "review {uid} {namespace}/{pod} {result} endpoint={endpoint} patch={patch_size}B in {duration_ms:.1f}ms"
_REVIEW_LINE_WITH_REASON = (
    "review {uid} {namespace}/{pod} {result} ({reason}) endpoint={endpoint} patch={patch_size}B in {duration_ms:.1f}ms")


class AdmissionResource(Resource):
    """
    C{POST /mutate} or C{POST /validate}: an AdmissionReview in, an
    AdmissionReview out.
    """

    isLeaf = True
    log = Logger()

    def __init__(
        self, admitter: Admitter, clock: IReactorTime, metrics: Metrics, *, validation: bool,
        recent: Optional[RecentDecisions] = None,
    ) -> None:
        super().__init__()
        #: Where each decision is recorded for C{/debug/reviews}, if anywhere.
        self.recent = recent
        #: Reviews each request; replaced on a config reload (a review keeps
        #: the admitter, and so the config, it started with).
        self.admitter = admitter
        self._clock = clock
        self._metrics = metrics
        self._validation = validation
        #: Reviews answered whose log line and metrics are still to come.
        self._unaccounted: list[tuple[AdmissionRequest, Outcome, float, float]] = []

    def render(self, request: server.Request) -> Any:
        if request.method != b"POST":
            request.setHeader(b"allow", b"POST")
            return _plain(request, 405, f"{request.path.decode('latin-1')} accepts only POST")
        return self.render_POST(request)

    def render_POST(self, request: server.Request) -> Any:
        started = self._clock.seconds()
        content_type = (request.getHeader(b"content-type") or b"").split(b";", 1)[0].strip().lower()
        if content_type != b"application/json":
            return self._bad(request, 415, f"Content-Type must be application/json, got "
                                           f"{content_type.decode('latin-1')!r}")
        try:
            req = parse_review(request.content.getvalue())
        except ReviewError as e:
            return self._bad(request, e.code, e.message)
        except RecursionError:
            return self._bad(request, 400, "request body is nested too deeply to parse")
        except Exception as e:
            # Whatever else the body makes the parser raise, it is the
            # body's fault: a 400 naming it, never Twisted's 500 page.
            return self._bad(request, 400, f"request body is not a valid AdmissionReview "
                                           f"({type(e).__name__}: {str(e)[:200]})")
        # The review's one deadline, computed here once and carried down.
        admitter = self.admitter
        timeout = request.args.get(b"timeout")
        deadline = admitter.deadline(timeout[0].decode("ascii", "replace") if timeout else None, started)
        d = admitter.review(req, deadline, validation=self._validation)
        # Not "if not d.called": a review can be called already and still be
        # waiting on a chained Deferred (an endpoint call started from a
        # namespace fetch that answered at once); cancel() reaches it.
        request.review = d
        d.addCallback(self._respond, request, req, started).addErrback(self._write_failed, request)
        return server.NOT_DONE_YET

    def _bad(self, request: server.Request, code: int, message: str) -> bytes:
        self._metrics.bad_requests.labels(str(code)).inc()
        site: WebhookSite = request.channel.site
        site.warnings.emit("bad-reviews", LogLevel.info, "Bad AdmissionReview: {error}", error=message)
        return _plain(request, code, message)

    def _respond(self, answer: Answer, request: server.Request, req: AdmissionRequest, started: float) -> None:
        request.review = None
        if request._disconnected:
            # Answered as the client went away.
            answer = unheard(answer)
        else:
            request.setHeader(b"content-type", b"application/json")
            request.setHeader(b"content-length", b"%d" % len(answer.body))
            request.write(answer.body)
            request.finish()
        outcome = answer.outcome
        answered = self._clock.seconds()
        # The answer is only in the transport's buffer until the reactor's
        # next I/O pass: do the accounting (log line, metrics) after that, two
        # turns later, so it never delays the answer; the reviews answered in
        # one turn are accounted together.
        unaccounted = self._unaccounted
        unaccounted.append((req, outcome, answered - started, answered))
        if len(unaccounted) == 1:
            self._clock.callLater(0, self._clock.callLater, 0, self._account)

    def _account(self) -> None:
        unaccounted, self._unaccounted = self._unaccounted, []
        recent = self.recent
        count = self._metrics.count_review
        info = self.log.info
        for req, outcome, elapsed, answered in unaccounted:
            if recent is not None:
                recent.record(Decision(
                    req.uid, answered, req.namespace, req.pod_name, outcome.endpoint, str(outcome.result),
                    str(outcome.reason), outcome.message, elapsed * 1000))
            count(req.kind, req.operation, outcome.result, outcome.reason, elapsed)
            info(_REVIEW_LINE_WITH_REASON if outcome.reason else _REVIEW_LINE,
                 uid=req.uid, namespace=req.namespace, pod=req.pod_name, endpoint=outcome.endpoint or "-",
                 result=outcome.result, reason=outcome.reason, patch_size=outcome.patch_size,
                 duration_ms=elapsed * 1000, dry_run=req.dry_run, kind=req.kind, operation=req.operation)

    def _write_failed(self, failure: Failure, request: server.Request) -> None:
        self.log.failure("Could not write an admission answer", failure)
        if not request._disconnected and not request.finished:
            request.setResponseCode(500)
            request.finish()


class HealthResource(Resource):
    """
    C{GET /healthz}: the process is alive and its reactor turns.
    """

    isLeaf = True

    def render_GET(self, request: server.Request) -> bytes:
        return _plain(request, 200, "ok")


class ReadyResource(Resource):
    """
    C{GET /readyz}: 200 when every check passes, else 503; the body lists
    each check and its detail.
    """

    isLeaf = True

    def __init__(self, checks: dict[str, Callable[[], tuple[bool, str]]]) -> None:
        super().__init__()
        self._checks = checks

    def render_GET(self, request: server.Request) -> bytes:
        lines = []
        ready = True
        for name, check in self._checks.items():
            try:
                ok, detail = check()
            except Exception as e:
                ok, detail = False, f"check failed: {e}"
            ready = ready and ok
            lines.append(f"[{'+' if ok else '-'}] {name}: {detail}")
        lines.append("ready" if ready else "not ready")
        return _plain(request, 200 if ready else 503, "\n".join(lines))


class _Root(Resource):
    """
    The listener's root: known children, else a plain 404 (Resource's
    default page is a deprecated HTML error page).
    """

    def getChild(self, path: bytes, request: server.Request) -> Resource:
        return pages.notFound("Not Found", "amp serves /mutate, /validate, /healthz and /readyz")

    def render(self, request: server.Request) -> bytes:
        return _plain(request, 404, "amp serves /mutate, /validate, /healthz and /readyz")


def webhook_root(
    admitter: Admitter, clock: IReactorTime, metrics: Metrics, ready_checks: dict[str, Callable[[], tuple[bool, str]]],
    recent: Optional[RecentDecisions] = None,
) -> Resource:
    root = _Root()
    root.putChild(b"mutate", AdmissionResource(admitter, clock, metrics, validation=False, recent=recent))
    root.putChild(b"validate", AdmissionResource(admitter, clock, metrics, validation=True, recent=recent))
    root.putChild(b"healthz", HealthResource())
    root.putChild(b"readyz", ReadyResource(ready_checks))
    return root

