"""
HTTP for amp endpoints: everything an endpoint needs that is not its
business logic.

This module owns reading the Pod amp POSTs (with a body cap, 400 on
anything that is not a JSON object), calling the endpoint's handler,
writing its reply as JSON, logging one line per request (path, namespace,
operation, uid, result; never the Pod), a span per request continuing amp's
trace when tracing is configured (``amp_examples.tracing``), ``GET /healthz``, and running
endpoints from the command line (``python -m amp_examples.<program>``) or
under ``twistd`` (``amp_examples.server``).

A handler is ``handler(pod, call)``: ``pod`` is the Pod as amp sent it (a
dict) and ``call`` the ``X-Amp-*`` headers (``Call``). It returns one of

- a list of RFC 6902 operations (amp's bare-array protocol; ``[]`` is "no
  change"),
- a dict in amp's object form (``patch``, ``allowed``, ``status``,
  ``warnings``, ``auditAnnotations``),
- an ``Answer``: a raw HTTP status and body (for endpoints that show how
  amp handles a broken one),
- or a Deferred of any of those, for handlers that do I/O.

A handler that raises ValueError gets a 400 naming the problem.
"""

from __future__ import annotations

import io
import json
import sys
from dataclasses import dataclass
from typing import Any, Callable, Mapping, NoReturn, Union

from twisted.application import strports
from twisted.application.service import IService
from twisted.internet import defer
from twisted.internet.endpoints import quoteStringArgument, serverFromString
from twisted.internet.error import CannotListenError
from twisted.internet.task import react
from twisted.logger import Logger, globalLogBeginner, textFileLogObserver
from twisted.python import usage
from twisted.python.failure import Failure
from twisted.web import http, pages, server
from twisted.web.resource import Resource

from amp_examples import tracing

log = Logger()

MAX_BODY = 4 * 1024 * 1024
JSON_TYPE = b"application/json"

Pod = dict[str, Any]


@dataclass(frozen=True)
class Call:
    """What amp says about the review in its ``X-Amp-*`` headers."""

    namespace: str = ""
    operation: str = ""
    uid: str = ""
    dry_run: bool = False
    #: ``ephemeralcontainers`` for ``kubectl debug`` (an UPDATE through
    #: that subresource, where only spec.ephemeralContainers may change).
    subresource: str = ""

    @classmethod
    def from_request(cls, request: server.Request) -> "Call":
        def header(name: bytes, limit: int) -> str:
            return (request.getHeader(name) or b"").decode("latin-1")[:limit]

        return cls(
            namespace=header(b"x-amp-namespace", 253),
            operation=header(b"x-amp-operation", 32),
            uid=header(b"x-amp-uid", 64),
            dry_run=header(b"x-amp-dry-run", 8).lower() == "true",
            subresource=header(b"x-amp-subresource", 64),
        )


@dataclass(frozen=True)
class Answer:
    """A raw HTTP answer: ``code``, ``body``, and the word logged as the result."""

    code: int
    body: bytes
    result: str
    content_type: bytes = JSON_TYPE


Reply = Union[list[Any], dict[str, Any], Answer]
Handler = Callable[[Pod, Call], Union[Reply, "defer.Deferred[Reply]"]]


def _json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode("utf-8")


def _result_of(reply: list[Any] | dict[str, Any]) -> tuple[str, int]:
    """A short result word and the number of patch operations, for the log line."""
    if isinstance(reply, list):
        return ("patched" if reply else "unchanged"), len(reply)
    if reply.get("allowed") is False:
        return "denied", 0
    ops = len(reply.get("patch") or [])
    return ("patched" if ops else "unchanged"), ops


class CappedRequest(server.Request):
    """
    A request that stops buffering its body once it exceeds ``max_body``
    bytes (checked against Content-Length up front and against the bytes
    actually received), so an oversized upload cannot fill memory or disk.
    The resource then answers 413.
    """

    max_body: int = MAX_BODY
    body_too_large: bool = False
    _received: int = 0

    def gotLength(self, length: int | None) -> None:
        if length is not None and length > self.max_body:
            self.body_too_large = True
            self.content = io.BytesIO()
            return
        super().gotLength(length)

    def handleContentChunk(self, data: bytes) -> None:
        if self.body_too_large:
            return
        self._received += len(data)
        if self._received > self.max_body:
            self.body_too_large = True
            self.content = io.BytesIO()
            return
        super().handleContentChunk(data)


def capped_request_factory(max_body: int) -> type[CappedRequest]:
    """A CappedRequest class with its own body limit, for ``Site(requestFactory=...)``."""
    return type("CappedRequest", (CappedRequest,), {"max_body": max_body})


class PodEndpoint(Resource):
    """
    One endpoint: parse the POSTed Pod, call ``handler(pod, call)``, answer.

    Oversized bodies get 413, bodies that are not a JSON object 400, a
    handler's ValueError 400, any other exception 500 (logged). When the
    client hangs up first, a pending Deferred from the handler is cancelled.
    """

    isLeaf = True

    def __init__(self, handler: Handler, max_body: int = MAX_BODY) -> None:
        super().__init__()
        self.handler = handler
        self.max_body = max_body

    def _log(self, request: server.Request, call: Call, result: str, status: int, ops: int = 0) -> None:
        log.info(
            "{method} {path} namespace={namespace} operation={operation} uid={uid} "
            "result={result} status={status} ops={ops}",
            method=request.method.decode("latin-1"),
            path=request.path.decode("latin-1"),
            namespace=call.namespace,
            operation=call.operation,
            uid=call.uid,
            result=result,
            status=status,
            ops=ops,
        )

    def _send(self, request: server.Request, call: Call, answer: Answer, ops: int = 0) -> bytes:
        self._log(request, call, answer.result, answer.code, ops)
        tracing.end_span(getattr(request, "span", None), answer.code, answer.result)
        request.setResponseCode(answer.code)
        request.setHeader(b"content-type", answer.content_type)
        request.setHeader(b"cache-control", b"no-store")
        return answer.body

    def _error(self, request: server.Request, call: Call, code: int, message: str, result: str) -> bytes:
        return self._send(request, call, Answer(code, _json({"error": message}), result))

    def render(self, request: server.Request) -> bytes | int:
        call = Call.from_request(request)
        # The span of this request, amp's call span its parent (when tracing is configured).
        request.span = tracing.start_span(request)  # type: ignore[attr-defined]
        if request.method != b"POST":
            request.setHeader(b"allow", b"POST")
            return self._error(request, call, http.NOT_ALLOWED, "only POST is allowed", "method-not-allowed")
        if getattr(request, "body_too_large", False):
            return self._error(request, call, http.REQUEST_ENTITY_TOO_LARGE, "request body too large", "too-large")
        body = request.content.read(self.max_body + 1) if request.content is not None else b""
        if len(body) > self.max_body:
            return self._error(request, call, http.REQUEST_ENTITY_TOO_LARGE, "request body too large", "too-large")
        try:
            pod = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            return self._error(request, call, http.BAD_REQUEST, "request body is not JSON", "bad-request")
        if not isinstance(pod, dict):
            return self._error(request, call, http.BAD_REQUEST, "request body is not a JSON object", "bad-request")

        d = defer.maybeDeferred(self.handler, pod, call)
        if d.called:
            # The common case: a synchronous handler; answer without a round trip.
            outcome: list[Any] = []
            d.addBoth(outcome.append)
            return self._answer(request, call, outcome[0])
        gone: list[Failure] = []
        request.notifyFinish().addErrback(lambda reason: (gone.append(reason), d.cancel()))
        d.addBoth(self._finish_later, request, call, gone)
        return server.NOT_DONE_YET

    def _answer(self, request: server.Request, call: Call, outcome: Reply | Failure) -> bytes:
        if isinstance(outcome, Failure):
            if outcome.check(ValueError):
                message = f"cannot handle this pod: {outcome.value}"
                return self._error(request, call, http.BAD_REQUEST, message, "bad-request")
            log.failure("handler for {path} failed", outcome, path=request.path.decode("latin-1"))
            return self._error(request, call, http.INTERNAL_SERVER_ERROR, "endpoint failed", "handler-error")
        if isinstance(outcome, Answer):
            return self._send(request, call, outcome)
        result, ops = _result_of(outcome)
        return self._send(request, call, Answer(http.OK, _json(outcome), result), ops)

    def _finish_later(self, outcome: Reply | Failure, request: server.Request, call: Call, gone: list[Failure]) -> None:
        if gone:
            self._log(request, call, "client-gone", 0)
            tracing.end_span(getattr(request, "span", None), 499, "client-gone")
            return
        body = self._answer(request, call, outcome)
        request.setHeader(b"content-length", b"%d" % len(body))
        request.write(body)
        request.finish()


class Healthz(Resource):
    """``GET /healthz``: ``ok``."""

    isLeaf = True

    def render_GET(self, request: server.Request) -> bytes:
        request.setHeader(b"content-type", b"text/plain")
        return b"ok\n"


class _Root(Resource):
    """Known endpoints, else a plain 404 (Resource's default page is a deprecated HTML error page)."""

    def getChild(self, path: bytes, request: Any) -> Resource:
        return pages.notFound("Not Found", "no such endpoint")


def build_root(handlers: Mapping[str, Handler], max_body: int = MAX_BODY) -> Resource:
    """A resource tree with one ``PodEndpoint`` per ``/<path>`` of ``handlers``, plus ``/healthz``."""
    root = _Root()
    for path, handler in handlers.items():
        root.putChild(path.encode("ascii"), PodEndpoint(handler, max_body))
    root.putChild(b"healthz", Healthz())
    return root


def build_site(root: Resource, max_body: int = MAX_BODY, reactor: Any = None) -> server.Site:
    """
    A Site over ``root`` whose requests cap their bodies at ``max_body``.

    ``reactor`` drives the idle-connection timeouts (the global reactor if None).
    """
    site = server.Site(
        root,
        requestFactory=capped_request_factory(max_body),
        parsePOSTFormSubmission=False,
        reactor=reactor,
    )
    site.displayTracebacks = False
    return site


class Options(usage.Options):
    """The listening options every endpoint program shares."""

    synopsis = "[options]"
    optParameters = [
        ["port", "p", 8090, "TCP port to listen on.", int],
        ["interface", "i", "127.0.0.1", "Address to listen on."],
        ["max-body", None, MAX_BODY, "Largest request body accepted, in bytes.", int],
    ]

    def postOptions(self) -> None:
        if not 0 <= self["port"] <= 65535:
            raise usage.UsageError(f"--port {self['port']} is not a TCP port")
        if self["max-body"] < 1:
            raise usage.UsageError("--max-body must be positive")


def listen_description(options: Mapping[str, Any]) -> str:
    """The server endpoint description for ``--port`` and ``--interface``."""
    return f"tcp:port={options['port']}:interface={quoteStringArgument(options['interface'])}"


def make_service(options: Mapping[str, Any], handlers: Mapping[str, Handler], reactor: Any) -> IService:
    """A service that serves ``handlers`` where ``options`` say (for ``twistd``)."""
    site = build_site(build_root(handlers, options["max-body"]), options["max-body"], reactor)
    # Set the tracer up now (when configured), not in the first request's time.
    tracing.tracer()
    return strports.service(listen_description(options), site, reactor=reactor)


def main(
    options_class: type[Options],
    endpoints: Callable[[Mapping[str, Any]], Mapping[str, Handler]],
    argv: list[str] | None = None,
) -> NoReturn:
    """
    Run one program's endpoints until interrupted: ``python -m amp_examples.<program> [--port N]``.

    A bad option or a port that cannot be bound is one line on stderr and
    exit status 2 or 1; requests are logged to stdout.
    """
    options = options_class()
    try:
        options.parseOptions(argv)
    except usage.UsageError as e:
        sys.exit(f"{sys.argv[0]}: {e}")
    handlers = endpoints(options)
    tracing.tracer()

    @defer.inlineCallbacks
    def serve(reactor: Any) -> Any:
        site = build_site(build_root(handlers, options["max-body"]), options["max-body"], reactor)
        try:
            port = yield serverFromString(reactor, listen_description(options)).listen(site)
        except CannotListenError as e:
            raise SystemExit(f"cannot listen on {options['interface']}:{options['port']}: {e.socketError}") from None
        address = port.getHost()
        for path in handlers:
            log.info("serving {url}", url=f"http://{address.host}:{address.port}/{path}")
        yield defer.Deferred()  # until SIGINT or SIGTERM stops the reactor

    globalLogBeginner.beginLoggingTo([textFileLogObserver(sys.stdout)], redirectStandardIO=False)
    react(serve)
