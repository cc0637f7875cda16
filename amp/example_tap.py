"""
The example endpoint server: twisted.web resources over ``amp.example`` and
the twistd glue for ``twistd amp-example``.

This module owns HTTP for the examples: reading and capping request bodies,
answering 400 on anything that is not a JSON object, writing replies and
logging one line per request (path, namespace, result; never the Pod). The
patch logic lives in ``amp.example``.

Paths (all ``POST``, body = the Pod as JSON, as amp sends it):

=====================  ======================================================
``/user-env``          bare JSON array (JupyterHub user env, home, init)
``/registry``          object form, image registry rewrite + warning
``/sidecar``           object form, ``amp-proxy`` sidecar + audit annotation
``/poddefault``        object form, PodDefault presets; 403 denial on conflict
``/deny``              object form, always ``allowed: false`` (403)
``/validate-labels``   object form, deny a Pod without an ``app`` label
``/noop``              ``[]``
``/bad-patch``         a valid JSON Patch that fails to apply
``/error``             HTTP 500
``/garbage``           HTTP 200 with a body that is not JSON
``/hang``              never answers
=====================  ======================================================

``GET /healthz`` answers ``ok`` for probes.
"""

from __future__ import annotations

import io
import json
from typing import Any, Callable, Mapping, Sequence

from twisted.application import strports
from twisted.application.service import IService
from twisted.internet.endpoints import quoteStringArgument
from twisted.logger import Logger
from twisted.python import usage
from twisted.web import http, pages, server
from twisted.web.resource import Resource

from amp import example

log = Logger()

MAX_BODY = 4 * 1024 * 1024
JSON_TYPE = b"application/json"


def _reply_bytes(reply: Any) -> bytes:
    return json.dumps(reply, separators=(",", ":")).encode("utf-8")


def _result_of(reply: Any) -> tuple[str, int]:
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
    Base for every example path: parse the Pod, then ``respond``.

    Subclasses (or a ``handler`` callable) decide the answer. Oversized
    bodies get 413, bodies that are not a JSON object get 400, a Pod the
    handler cannot make sense of (ValueError) gets 400.
    """

    isLeaf = True

    def __init__(self, handler: Callable[[dict[str, Any]], Any] | None = None, max_body: int = MAX_BODY) -> None:
        super().__init__()
        self.handler = handler
        self.max_body = max_body

    def _log(self, request: server.Request, result: str, status: int, ops: int = 0) -> None:
        namespace = (request.getHeader(b"x-amp-namespace") or b"").decode("latin-1")[:253]
        operation = (request.getHeader(b"x-amp-operation") or b"").decode("latin-1")[:32]
        uid = (request.getHeader(b"x-amp-uid") or b"").decode("latin-1")[:64]
        log.info(
            "{method} {path} namespace={namespace} operation={operation} uid={uid} "
            "result={result} status={status} ops={ops}",
            method=request.method.decode("latin-1"),
            path=request.path.decode("latin-1"),
            namespace=namespace,
            operation=operation,
            uid=uid,
            result=result,
            status=status,
            ops=ops,
        )

    def _send(self, request: server.Request, status: int, body: bytes, content_type: bytes = JSON_TYPE) -> bytes:
        request.setResponseCode(status)
        request.setHeader(b"content-type", content_type)
        request.setHeader(b"cache-control", b"no-store")
        return body

    def _error(self, request: server.Request, status: int, message: str, result: str) -> bytes:
        self._log(request, result, status)
        return self._send(request, status, _reply_bytes({"error": message}))

    def render(self, request: server.Request) -> bytes | int:
        if request.method != b"POST":
            request.setHeader(b"allow", b"POST")
            return self._error(request, http.NOT_ALLOWED, "only POST is allowed", "method-not-allowed")
        return self.render_POST(request)

    def render_POST(self, request: server.Request) -> bytes | int:
        if getattr(request, "body_too_large", False):
            return self._error(request, http.REQUEST_ENTITY_TOO_LARGE, "request body too large", "too-large")
        body = request.content.read(self.max_body + 1) if request.content is not None else b""
        if len(body) > self.max_body:
            return self._error(request, http.REQUEST_ENTITY_TOO_LARGE, "request body too large", "too-large")
        try:
            pod = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            return self._error(request, http.BAD_REQUEST, "request body is not JSON", "bad-request")
        if not isinstance(pod, dict):
            return self._error(request, http.BAD_REQUEST, "request body is not a JSON object", "bad-request")
        return self.respond(request, pod)

    def respond(self, request: server.Request, pod: dict[str, Any]) -> bytes | int:
        """Answer with ``handler(pod)`` as JSON."""
        if self.handler is None:
            raise TypeError("PodEndpoint needs a handler or a respond() override")
        try:
            reply = self.handler(pod)
        except ValueError as e:
            return self._error(request, http.BAD_REQUEST, f"cannot handle this pod: {e}", "bad-request")
        result, ops = _result_of(reply)
        self._log(request, result, http.OK, ops)
        return self._send(request, http.OK, _reply_bytes(reply))


class HangEndpoint(PodEndpoint):
    """``/hang``: read the request, never answer (the client must give up)."""

    def __init__(self, max_body: int = MAX_BODY) -> None:
        super().__init__(None, max_body)
        self.pending: set[server.Request] = set()

    def respond(self, request: server.Request, pod: dict[str, Any]) -> int:
        self._log(request, "hanging", 0)
        self.pending.add(request)
        request.notifyFinish().addBoth(lambda _: self.pending.discard(request))
        return server.NOT_DONE_YET


class ErrorEndpoint(PodEndpoint):
    """``/error``: HTTP 500."""

    def respond(self, request: server.Request, pod: dict[str, Any]) -> bytes:
        self._log(request, "error", http.INTERNAL_SERVER_ERROR)
        return self._send(request, http.INTERNAL_SERVER_ERROR, _reply_bytes({"error": "example failure"}))


class GarbageEndpoint(PodEndpoint):
    """``/garbage``: HTTP 200 with a body that is not JSON."""

    BODY = b"<html>this is not a JSON patch</html>"

    def respond(self, request: server.Request, pod: dict[str, Any]) -> bytes:
        self._log(request, "garbage", http.OK)
        return self._send(request, http.OK, self.BODY, JSON_TYPE)


class Healthz(Resource):
    """``GET /healthz``: ``ok``."""

    isLeaf = True

    def render_GET(self, request: server.Request) -> bytes:
        request.setHeader(b"content-type", b"text/plain")
        return b"ok\n"


class _Root(Resource):
    """
    Known endpoints, else a plain 404 (Resource's default page is a
    deprecated HTML error page).
    """

    def getChild(self, path: bytes, request: Any) -> Resource:
        return pages.notFound("Not Found", "no such example endpoint")


def build_root(
    registry_map: Mapping[str, str] | None = None,
    presets: Sequence[example.Preset] | None = None,
    max_body: int = MAX_BODY,
) -> Resource:
    """The resource tree of the example server (see the module docstring)."""
    rmap = dict(example.DEFAULT_REGISTRY_MAP if registry_map is None else registry_map)
    preset_list = tuple(example.DEFAULT_PRESETS if presets is None else presets)
    root = _Root()
    handlers: dict[bytes, Callable[[dict[str, Any]], Any]] = {
        b"user-env": example.user_env_patch,
        b"registry": lambda pod: example.registry_reply(pod, rmap),
        b"sidecar": example.sidecar_reply,
        b"poddefault": lambda pod: example.poddefault_reply(pod, preset_list),
        b"deny": lambda pod: example.deny_reply(),
        b"validate-labels": example.validate_labels_reply,
        b"noop": lambda pod: [],
        b"bad-patch": lambda pod: example.bad_patch(),
    }
    for name, handler in handlers.items():
        root.putChild(name, PodEndpoint(handler, max_body))
    root.putChild(b"hang", HangEndpoint(max_body))
    root.putChild(b"error", ErrorEndpoint(None, max_body))
    root.putChild(b"garbage", GarbageEndpoint(None, max_body))
    root.putChild(b"healthz", Healthz())
    return root


def build_site(
    registry_map: Mapping[str, str] | None = None,
    presets: Sequence[example.Preset] | None = None,
    max_body: int = MAX_BODY,
    reactor: Any = None,
) -> server.Site:
    """
    A Site over ``build_root`` whose requests cap their bodies at ``max_body``.

    ``reactor`` drives the idle-connection timeouts (the global reactor if None).
    """
    site = server.Site(
        build_root(registry_map, presets, max_body),
        requestFactory=capped_request_factory(max_body),
        parsePOSTFormSubmission=False,
        reactor=reactor,
    )
    site.displayTracebacks = False
    return site


class Options(usage.Options):
    """Command line of ``twistd amp-example``."""

    synopsis = "[options]"
    longdesc = (
        "Serve the example amp endpoints over plain HTTP: /user-env, /registry, /sidecar, "
        "/poddefault, /deny, /validate-labels, /noop, /bad-patch, /error, /garbage, /hang."
    )
    optParameters = [
        ["port", "p", 8090, "TCP port to listen on.", int],
        ["interface", "i", "127.0.0.1", "Address to listen on."],
        [
            "presets",
            None,
            None,
            "YAML file of PodDefault-style presets for /poddefault, added to the built-in "
            "add-gcp-secret preset (a preset of the same name replaces it).",
        ],
        ["max-body", None, MAX_BODY, "Largest request body accepted, in bytes.", int],
    ]

    def __init__(self) -> None:
        super().__init__()
        self["registry-map"] = []

    def opt_registry_map(self, value: str) -> None:
        """FROM=TO registry rewrite for /registry, e.g. gcr.io=asia.gcr.io; repeatable; replaces the default map (gcr.io=asia.gcr.io, docker.io=mirror.local)."""  # noqa: E501
        self["registry-map"].append(value)

    def postOptions(self) -> None:
        if not 0 <= self["port"] <= 65535:
            raise usage.UsageError(f"--port {self['port']} is not a TCP port")
        if self["max-body"] < 1:
            raise usage.UsageError("--max-body must be positive")
        try:
            self["registry_map"] = (
                example.parse_registry_map(self["registry-map"])
                if self["registry-map"]
                else dict(example.DEFAULT_REGISTRY_MAP)
            )
        except ValueError as e:
            raise usage.UsageError(f"--registry-map: {e}") from None
        extra: list[example.Preset] = []
        if self["presets"]:
            try:
                with open(self["presets"], encoding="utf-8") as f:
                    extra = example.parse_presets(f.read())
            except (OSError, ValueError) as e:
                raise usage.UsageError(f"--presets {self['presets']}: {e}") from None
        self["preset_list"] = example.combine_presets(example.DEFAULT_PRESETS, extra)


def makeService(options: Options, reactor: Any = None) -> IService:
    """The listening service of ``twistd amp-example``."""
    if reactor is None:
        from twisted.internet import reactor as global_reactor

        reactor = global_reactor
    site = build_site(options["registry_map"], options["preset_list"], options["max-body"], reactor)
    description = f"tcp:port={options['port']}:interface={quoteStringArgument(options['interface'])}"
    return strports.service(description, site, reactor=reactor)
