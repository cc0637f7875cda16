"""A fake Kubernetes API server over real HTTP on loopback, for tests and benchmarks.

This module owns ``FakeKube``: a small, thread-safe stand-in for kube-apiserver
that serves Namespaces and MutatingWebhookConfigurations the way the real API
server does on the wire (JSON bodies, ``Status`` errors, chunked watch
streams), so that the official ``kubernetes`` Python client, or any HTTP
client, can be pointed at it.  It runs on the standard library's
``ThreadingHTTPServer`` in a background thread: it works whether or not a
Twisted reactor is running, and synchronous clients can talk to it from any
thread.  It listens on 127.0.0.1 only, on a free port.

Usage::

    with FakeKube() as kube:                       # start() ... stop()
        kube.add_namespace("team-a", labels={"amp.txn2.com/enabled": "true"})
        core = kubernetes.client.CoreV1Api(api_client(kube))
        core.list_namespace(_request_timeout=5)

Served API (GET only; other methods answer 405, unknown paths 404)
-------------------------------------------------------------------
- ``/api/v1/namespaces`` and
  ``/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations``:
  list (``{"kind": "<Kind>List", "metadata": {"resourceVersion": rv},
  "items": [...]}``, items without kind/apiVersion like the real server),
  ``.../<name>`` get (object, or a 404 ``Status`` with reason ``NotFound``),
  and watch with ``?watch=true`` (``1`` works too).
- ``labelSelector`` (``k=v``, ``k==v``, ``k!=v``, ``k``, ``!k``, ``k in (a,b)``,
  ``k notin (a,b)``) and ``fieldSelector`` (``metadata.name``, and
  ``status.phase`` for namespaces; ``=``, ``==``, ``!=``) work on list and
  watch.  A filtered watch behaves like the real one: an object that starts
  matching arrives as ADDED, one that stops matching as DELETED.
- List ``resourceVersion``: the current state is always returned (it is
  never older than any resourceVersion the server handed out).  A
  resourceVersion newer than the server's current one answers 504
  ``Timeout`` "Too large resource version", as the real server eventually
  does.  ``limit``/``continue``/``resourceVersionMatch``/``sendInitialEvents``
  are accepted and ignored: a list is always complete, with no ``continue``.
- ``/version``, ``/api``, ``/apis``: minimal discovery answers.
- Authorization headers are ignored: any bearer token (or none) is accepted.
- Every answer except a watch has a Content-Length; connections are HTTP/1.1
  keep-alive.

Resource versions
-----------------
One global counter (like etcd's revision) for both kinds, starting at
``initial_resource_version`` (default 100).  Every change bumps it; the
object's ``metadata.resourceVersion`` is the revision of its last change, and
the object of a DELETED event carries the deletion's revision.

Watches
-------
``?watch=true&resourceVersion=N`` streams, with ``Transfer-Encoding:
chunked``, one HTTP chunk per event, each a JSON line
``{"type": ..., "object": {...}}``: first every retained event with a
revision > N in order, then new events as they happen.  Without
resourceVersion, or with ``"0"``, the stream starts with a synthetic ADDED per
current object (sorted by name) and continues from the current revision.  The
stream ends cleanly (terminating chunk) after ``timeoutSeconds`` (default
``watch_timeout``, 1800 s).  With ``allowWatchBookmarks=true`` a
``bookmark()`` sends ``{"type": "BOOKMARK", "object": {"kind": <Kind>,
"apiVersion": ..., "metadata": {"resourceVersion": <current>}}}`` to every
open watch that asked for bookmarks; bookmarks are not replayed to watches
opened later.

History: events are retained (all of them, or the last ``history_limit``).
A watch from N succeeds iff no event with a revision > N was discarded.
``expire_history()`` discards everything, so a watch from any revision older
than the current one is "too old".  Too old is answered like the real
server: HTTP 200, then one ``ERROR`` event whose object is a ``Status`` with
``code: 410``, ``reason: "Expired"``, ``message: "too old resource version: N
(M)"``, then the end of the stream.  With ``expired_as="http"`` the server
instead answers the watch request itself with HTTP 410 and that ``Status``
body.  An open watch that falls behind the retained window gets the same
ERROR event.

How the ``kubernetes`` client (37.x) surfaces these, which the namespace
watch in amp relies on (the tests in ``test_fakekube.py`` prove each one):

- ERROR 410 event, ``timeout_seconds`` passed to ``Watch.stream``: the
  generator raises ``kubernetes.client.exceptions.ApiException`` with
  ``status == 410`` and ``reason == "Expired: too old resource version: ..."``.
  No ERROR event is ever yielded.
- ERROR 410 event, no ``timeout_seconds``: ``Watch.stream`` silently
  re-issues the watch once from the last resourceVersion it saw (for a fresh
  watch: the same, expired, one) and, on the second 410, raises the same
  ``ApiException(status=410)``.  The server sees two watch requests.
- HTTP 410 (``expired_as="http"``): ``ApiException(status=410)`` at the
  first ``next()``; ``.body`` is the ``Status`` JSON.
- ``drop_watches()`` (stream cut without the terminating chunk): the
  generator raises ``urllib3.exceptions.ProtocolError`` ("Response ended
  prematurely" or a connection reset); it is not wrapped in ApiException.
- Stream ended by ``timeoutSeconds`` with ``timeout_seconds`` given: the
  generator simply finishes (StopIteration).
- Any non-2xx answer (``fail_next``): ``ApiException(status=<code>)`` from
  the API call or at the first ``next()`` of a watch.
- A read timeout (``set_delay`` longer than ``_request_timeout``): the
  client's urllib3 pool re-sends a GET up to 3 more times (urllib3's
  ``Retry.DEFAULT``, unless ``Configuration.retries`` says otherwise), then
  raises ``urllib3.exceptions.MaxRetryError`` whose ``.reason`` is a
  ``ReadTimeoutError``; so ``_request_timeout=t`` can take 4 t.

Fault injection and introspection (all methods are thread-safe)
---------------------------------------------------------------
``fail_next(n, status=500)`` answers the next n requests with a ``Status``
error; ``set_delay(seconds)`` delays every answer (``stop()`` cuts the
delay short and closes the connection unanswered); ``drop_watches()`` cuts
every open watch stream; ``requests``/``count()``/``open_watches()`` and the
blocking ``wait_for_watches()``/``wait_for_requests()`` (bounded by a
timeout, woken by the server, no polling) let a test synchronise with a
client running in another thread.  ``errors`` lists unexpected exceptions
raised while serving (a test should assert it stays empty).

Import: ``from tests.fakekube import FakeKube`` (``tests`` is a package;
the development install puts the repository on ``sys.path``).
"""

from __future__ import annotations

import bisect
import copy
import datetime
import json
import re
import select
import socket
import threading
import time
import traceback
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterable, NamedTuple
from urllib.parse import parse_qs, unquote, urlsplit

import kubernetes.client
from twisted.logger import Logger

__all__ = [
    "FakeKube",
    "Request",
    "api_client",
    "client_configuration",
    "status_object",
]

log = Logger(namespace="tests.fakekube")

JSON = dict[str, Any]
_EPOCH = datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone.utc)
_PEER_CHECK_INTERVAL = 0.1  # seconds between checks that a watching client is still there
_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}
_WEBHOOK_DEFAULTS: JSON = {
    "admissionReviewVersions": ["v1"],
    "sideEffects": "None",
    "clientConfig": {
        "service": {"namespace": "amp", "name": "amp", "path": "/mutate", "port": 443}
    },
    "failurePolicy": "Fail",
    "matchPolicy": "Equivalent",
    "namespaceSelector": {},
    "objectSelector": {},
    "reinvocationPolicy": "Never",
    "timeoutSeconds": 10,
}


class Request(NamedTuple):
    """One request the server answered: method, path, query (last value per key)."""

    method: str
    path: str
    query: dict[str, str]


@dataclass(frozen=True)
class _Resource:
    plural: str
    kind: str
    api_version: str
    base: str
    group: str
    fields: tuple[str, ...]


_NAMESPACES = _Resource(
    plural="namespaces",
    kind="Namespace",
    api_version="v1",
    base="/api/v1/namespaces",
    group="",
    fields=("metadata.name", "status.phase"),
)
_MWCS = _Resource(
    plural="mutatingwebhookconfigurations",
    kind="MutatingWebhookConfiguration",
    api_version="admissionregistration.k8s.io/v1",
    base="/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
    group="admissionregistration.k8s.io",
    fields=("metadata.name",),
)
_RESOURCES = (_NAMESPACES, _MWCS)


@dataclass(frozen=True)
class _Event:
    rv: int
    resource: str
    type: str
    old: JSON | None
    new: JSON


@dataclass(eq=False)
class _Watch:
    resource: _Resource
    connection: socket.socket
    bookmarks: bool
    bookmark_seq: int
    cursor: int
    dropped: bool = False


@dataclass
class _Fault:
    remaining: int = 0
    status: int = 500
    path_prefix: str = ""


@dataclass
class _State:
    rv: int
    floor: int
    objects: dict[str, dict[str, JSON]] = field(default_factory=dict)
    events: list[_Event] = field(default_factory=list)


def status_object(code: int, message: str, reason: str | None = None,
                  details: JSON | None = None) -> JSON:
    """A ``Status`` object of the shape kube-apiserver sends with errors."""
    status: JSON = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason or _REASONS.get(code, "Unknown"),
        "code": code,
    }
    if details is not None:
        status["details"] = details
    return status


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode("utf-8")


def _truthy(value: str | None) -> bool:
    return value is not None and value.lower() in ("1", "true")


def _timestamp(rv: int) -> str:
    return (_EPOCH + datetime.timedelta(seconds=rv)).strftime("%Y-%m-%dT%H:%M:%SZ")


class _BadRequest(Exception):
    pass


def _split_terms(selector: str) -> list[str]:
    terms, depth, current = [], 0, []
    for char in selector:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            terms.append("".join(current))
            current = []
        else:
            current.append(char)
    terms.append("".join(current))
    return [t.strip() for t in terms if t.strip()]


_SET_TERM = re.compile(r"^(\S+)\s+(in|notin)\s+\((.*)\)$")
_EQ_TERM = re.compile(r"^([^!=\s]+)\s*(==|!=|=)\s*(\S*)$")


def _label_matcher(selector: str) -> Callable[[dict[str, str]], bool]:
    checks: list[Callable[[dict[str, str]], bool]] = []
    for term in _split_terms(selector):
        found = _SET_TERM.match(term)
        if found:
            key, op = found.group(1), found.group(2)
            values = {v.strip() for v in found.group(3).split(",") if v.strip()}
            if op == "in":
                checks.append(lambda labels, k=key, vs=values: k in labels and labels[k] in vs)
            else:
                checks.append(
                    lambda labels, k=key, vs=values: k not in labels or labels[k] not in vs)
            continue
        found = _EQ_TERM.match(term)
        if found:
            key, op, value = found.groups()
            if op == "!=":
                checks.append(lambda labels, k=key, v=value: labels.get(k) != v)
            else:
                checks.append(lambda labels, k=key, v=value: k in labels and labels[k] == v)
            continue
        if term.startswith("!") and re.fullmatch(r"!\s*\S+", term):
            key = term[1:].strip()
            checks.append(lambda labels, k=key: k not in labels)
            continue
        if re.fullmatch(r"[^\s!=(),]+", term):
            checks.append(lambda labels, k=term: k in labels)
            continue
        raise _BadRequest(f"unable to parse requirement: {term!r}")
    return lambda labels: all(check(labels) for check in checks)


def _field_value(obj: JSON, path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part, {}) if isinstance(value, dict) else {}
    return value if isinstance(value, str) else ""


def _field_matcher(selector: str, resource: _Resource) -> Callable[[JSON], bool]:
    checks: list[Callable[[JSON], bool]] = []
    for term in _split_terms(selector):
        found = _EQ_TERM.match(term)
        if not found:
            raise _BadRequest(f"invalid field selector: {term!r}")
        path, op, value = found.groups()
        if path not in resource.fields:
            raise _BadRequest(
                f'field label not supported: {path}')
        if op == "!=":
            checks.append(lambda o, p=path, v=value: _field_value(o, p) != v)
        else:
            checks.append(lambda o, p=path, v=value: _field_value(o, p) == v)
    return lambda obj: all(check(obj) for check in checks)


def _matcher(query: dict[str, str], resource: _Resource) -> Callable[[JSON | None], bool]:
    labels = _label_matcher(query.get("labelSelector", ""))
    fields = _field_matcher(query.get("fieldSelector", ""), resource)

    def match(obj: JSON | None) -> bool:
        if obj is None:
            return False
        return labels(obj["metadata"].get("labels") or {}) and fields(obj)

    return match


def _view(event: _Event, match: Callable[[JSON | None], bool]) -> tuple[str, JSON] | None:
    """What a (possibly filtered) watch sees of one event, or None."""
    if event.type == "ADDED":
        return ("ADDED", event.new) if match(event.new) else None
    if event.type == "DELETED":
        return ("DELETED", event.new) if match(event.old) else None
    was, now = match(event.old), match(event.new)
    if was and now:
        return ("MODIFIED", event.new)
    if now:
        return ("ADDED", event.new)
    if was:
        return ("DELETED", event.new)
    return None


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(self, kube: "FakeKube") -> None:
        self.kube = kube
        super().__init__(("127.0.0.1", 0), _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        self.kube._record_error(traceback.format_exc())


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "fakekube"
    sys_version = ""
    disable_nagle_algorithm = True
    server: _Server

    # connection bookkeeping, so that stop() can wake idle keep-alive readers

    def setup(self) -> None:
        super().setup()
        if not self.server.kube._register_connection(self.connection):
            self.close_connection = True

    def finish(self) -> None:
        try:
            super().finish()
        except OSError:
            pass
        finally:
            self.server.kube._unregister_connection(self.connection)

    def handle_one_request(self) -> None:
        try:
            super().handle_one_request()
        except OSError:
            # the peer went away, or drop_watches()/stop() cut the socket
            self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("fakekube {line}", line=format % args)

    # request handling

    def do_GET(self) -> None:
        kube = self.server.kube
        parts = urlsplit(self.path)
        path = unquote(parts.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        kube._record_request(Request("GET", path, query))
        if not kube._delay_for(path):
            self.close_connection = True
            return
        fault = kube._take_fault(path)
        if fault is not None:
            self._send_status(status_object(fault, f"injected failure {fault}"))
            return
        try:
            self._route(path, query)
        except _BadRequest as bad:
            self._send_status(status_object(400, str(bad)))

    def _other_method(self) -> None:
        kube = self.server.kube
        parts = urlsplit(self.path)
        kube._record_request(Request(self.command, unquote(parts.path), {}))
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        self._send_status(status_object(
            405, f"the server does not allow this method ({self.command}) "
                 "on the requested resource"))

    do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _other_method

    def _route(self, path: str, query: dict[str, str]) -> None:
        kube = self.server.kube
        path = path.rstrip("/") or "/"
        if path == "/version":
            self._send_json(200, kube._version())
            return
        if path == "/api":
            self._send_json(200, {
                "kind": "APIVersions",
                "versions": ["v1"],
                "serverAddressByClientCIDRs": [
                    {"clientCIDR": "0.0.0.0/0", "serverAddress": f"127.0.0.1:{kube.port}"}],
            })
            return
        if path == "/apis":
            version = {"groupVersion": "admissionregistration.k8s.io/v1", "version": "v1"}
            self._send_json(200, {
                "kind": "APIGroupList",
                "apiVersion": "v1",
                "groups": [{"name": "admissionregistration.k8s.io",
                            "versions": [version], "preferredVersion": version}],
            })
            return
        for resource in _RESOURCES:
            if path == resource.base:
                if _truthy(query.get("watch")):
                    self._watch(resource, query)
                else:
                    code, body = kube._list(resource, query)
                    self._send_json(code, body)
                return
            if path.startswith(resource.base + "/"):
                name = path[len(resource.base) + 1:]
                if name and "/" not in name:
                    code, body = kube._get(resource, name)
                    self._send_json(code, body)
                    return
        self._send_status(status_object(404, "the server could not find the requested resource"))

    def _send_status(self, status: JSON) -> None:
        self._send_json(status["code"], status)

    def _send_json(self, code: int, body: JSON) -> None:
        data = _dumps(body)
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-cache, private")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def _event_chunk(self, type_: str, obj: JSON) -> None:
        self._chunk(_dumps({"type": type_, "object": obj}) + b"\n")

    def _watch(self, resource: _Resource, query: dict[str, str]) -> None:
        kube = self.server.kube
        match = _matcher(query, resource)
        try:
            timeout = float(query["timeoutSeconds"]) if "timeoutSeconds" in query \
                else kube.watch_timeout
        except ValueError:
            raise _BadRequest(f"invalid timeoutSeconds: {query['timeoutSeconds']!r}")
        deadline = time.monotonic() + timeout
        opened = kube._open_watch(resource, query.get("resourceVersion", ""),
                                  _truthy(query.get("allowWatchBookmarks")),
                                  self.connection, match)
        watch, initial, expired = opened
        if expired is not None and watch is None:
            self._send_status(expired)
            return
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("Cache-Control", "no-cache, private")
            self.end_headers()
            if expired is not None:
                self._event_chunk("ERROR", expired)
                self._chunk(b"")
                return
            for obj in initial:
                self._event_chunk("ADDED", obj)
            while True:
                outcome, items = kube._next_for_watch(watch, match, deadline)
                for type_, obj in items:
                    self._event_chunk(type_, obj)
                if outcome == "continue":
                    continue
                if outcome in ("end", "expired"):
                    self._chunk(b"")
                else:
                    self.close_connection = True
                return
        except OSError:
            self.close_connection = True
        finally:
            if watch is not None:
                kube._close_watch(watch)


class FakeKube:
    """A fake kube-apiserver on ``http://127.0.0.1:<port>`` (see module docstring).

    :param history_limit: keep only the last N events for watch resumption
        (None: keep all).
    :param expired_as: ``"event"`` (the real server's way: an ERROR event
        with a 410 Status) or ``"http"`` (the watch request answers HTTP 410).
    :param watch_timeout: seconds a watch stays open without
        ``timeoutSeconds``.
    :param initial_resource_version: the revision of an empty server.
    :param request_log_limit: keep only the last N entries in ``requests``
        (None: all); a long benchmark should set it.
    """

    def __init__(self, *, history_limit: int | None = None, expired_as: str = "event",
                 watch_timeout: float = 1800.0, initial_resource_version: int = 100,
                 request_log_limit: int | None = None) -> None:
        if expired_as not in ("event", "http"):
            raise ValueError(f"expired_as must be 'event' or 'http', not {expired_as!r}")
        self.history_limit = history_limit
        self.expired_as = expired_as
        self.watch_timeout = watch_timeout
        self._request_log_limit = request_log_limit
        self._cond = threading.Condition(threading.Lock())
        self._stopping = threading.Event()
        self._state = _State(rv=initial_resource_version, floor=initial_resource_version,
                             objects={r.plural: {} for r in _RESOURCES})
        self._watches: set[_Watch] = set()
        self._connections: set[socket.socket] = set()
        self._handler_threads: set[threading.Thread] = set()
        self._bookmark_seq = 0
        self._requests: list[Request] = []
        self._served = 0
        self._fault = _Fault()
        self._delay = 0.0
        self._delay_prefix = ""
        self._errors: list[str] = []
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None

    # lifecycle

    def start(self) -> "FakeKube":
        """Bind 127.0.0.1:0 and serve in a background thread; returns self."""
        if self._httpd is not None:
            raise RuntimeError("FakeKube can be started only once")
        self._httpd = _Server(self)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
            name=f"fakekube-{self.port}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving: wake every waiter, cut every connection, join threads.

        Returns promptly even with open watch streams or delayed answers.
        """
        if self._httpd is None or self._thread is None:
            return
        with self._cond:
            self._stopping.set()
            self._cond.notify_all()
        if self._thread.is_alive():
            self._httpd.shutdown()
        with self._cond:
            connections = list(self._connections)
            threads = list(self._handler_threads)
        for connection in connections:
            _shutdown(connection)
        self._httpd.server_close()
        deadline = time.monotonic() + timeout
        self._thread.join(max(0.0, deadline - time.monotonic()))
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    @property
    def thread(self) -> threading.Thread | None:
        """The thread running the accept loop (None before start())."""
        return self._thread

    def __enter__(self) -> "FakeKube":
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("FakeKube is not started")
        return self._httpd.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # state changes

    @property
    def resource_version(self) -> str:
        """The current global revision, as the server presents it."""
        with self._cond:
            return str(self._state.rv)

    def add_namespace(self, name: str, labels: dict[str, str] | None = None,
                      annotations: dict[str, str] | None = None) -> JSON:
        """Create a Namespace (ADDED); ValueError if it exists.  Returns a copy.

        Like the real server, the label ``kubernetes.io/metadata.name: <name>``
        is always set.
        """
        with self._cond:
            if name in self._state.objects[_NAMESPACES.plural]:
                raise ValueError(f"namespace {name!r} already exists")
            rv = self._state.rv + 1
            obj = {
                "kind": "Namespace",
                "apiVersion": "v1",
                "metadata": self._metadata(_NAMESPACES, name, rv, labels, annotations),
                "spec": {"finalizers": ["kubernetes"]},
                "status": {"phase": "Active"},
            }
            obj["metadata"]["labels"]["kubernetes.io/metadata.name"] = name
            return self._commit(_NAMESPACES, "ADDED", None, obj)

    def update_namespace(self, name: str, labels: dict[str, str] | None = None,
                         annotations: dict[str, str] | None = None) -> JSON:
        """Replace labels and/or annotations (those given) of a Namespace (MODIFIED).

        KeyError if it does not exist.  Returns a copy.
        """
        with self._cond:
            old = self._existing(_NAMESPACES, name)
            obj = copy.deepcopy(old)
            if labels is not None:
                obj["metadata"]["labels"] = {**labels, "kubernetes.io/metadata.name": name}
            if annotations is not None:
                obj["metadata"]["annotations"] = dict(annotations)
            return self._commit(_NAMESPACES, "MODIFIED", old, obj)

    def terminate_namespace(self, name: str) -> JSON:
        """Start deleting a Namespace: deletionTimestamp set, phase Terminating (MODIFIED).

        ``delete_namespace`` then removes it, as the namespace controller would.
        """
        with self._cond:
            old = self._existing(_NAMESPACES, name)
            obj = copy.deepcopy(old)
            obj["metadata"]["deletionTimestamp"] = _timestamp(self._state.rv + 1)
            obj["status"]["phase"] = "Terminating"
            return self._commit(_NAMESPACES, "MODIFIED", old, obj)

    def delete_namespace(self, name: str) -> JSON:
        """Remove a Namespace (DELETED); KeyError if it does not exist."""
        return self._delete(_NAMESPACES, name)

    def put_webhook_configuration(self, name: str, webhooks: Iterable[JSON] = (),
                                  labels: dict[str, str] | None = None) -> JSON:
        """Create (ADDED) or replace (MODIFIED) a MutatingWebhookConfiguration.

        Each webhook gets the API server's defaults for missing fields
        (failurePolicy Fail, matchPolicy Equivalent, timeoutSeconds 10, ...)
        plus placeholder values for the required ones (clientConfig,
        sideEffects None, admissionReviewVersions ["v1"]), so that the
        client's models accept it.  Returns a copy.
        """
        webhooks = [{**copy.deepcopy(_WEBHOOK_DEFAULTS), **copy.deepcopy(dict(w))}
                    for w in webhooks]
        with self._cond:
            old = self._state.objects[_MWCS.plural].get(name)
            rv = self._state.rv + 1
            if old is None:
                metadata = self._metadata(_MWCS, name, rv, labels, None)
                metadata["generation"] = 1
            else:
                metadata = copy.deepcopy(old["metadata"])
                if labels is not None:
                    metadata["labels"] = dict(labels)
                metadata["generation"] += 1
            obj = {
                "kind": _MWCS.kind,
                "apiVersion": _MWCS.api_version,
                "metadata": metadata,
                "webhooks": webhooks,
            }
            return self._commit(_MWCS, "ADDED" if old is None else "MODIFIED", old, obj)

    def delete_webhook_configuration(self, name: str) -> JSON:
        """Remove a MutatingWebhookConfiguration (DELETED); KeyError if missing."""
        return self._delete(_MWCS, name)

    def get_namespace(self, name: str) -> JSON | None:
        """A copy of the stored Namespace, or None."""
        with self._cond:
            return copy.deepcopy(self._state.objects[_NAMESPACES.plural].get(name))

    def get_webhook_configuration(self, name: str) -> JSON | None:
        """A copy of the stored MutatingWebhookConfiguration, or None."""
        with self._cond:
            return copy.deepcopy(self._state.objects[_MWCS.plural].get(name))

    # watch control

    def bookmark(self) -> None:
        """Send a BOOKMARK at the current revision to every open watch that allows them."""
        with self._cond:
            self._bookmark_seq += 1
            self._cond.notify_all()

    def expire_history(self) -> None:
        """Forget every event: a watch from any revision older than now gets 410."""
        with self._cond:
            self._state.events.clear()
            self._state.floor = self._state.rv
            self._cond.notify_all()

    def drop_watches(self) -> int:
        """Cut every open watch stream abruptly (no terminating chunk).

        The sockets are shut down before this returns.  Returns how many
        streams were cut.
        """
        with self._cond:
            watches = [w for w in self._watches if not w.dropped]
            for watch in watches:
                watch.dropped = True
            self._cond.notify_all()
        for watch in watches:
            _shutdown(watch.connection)
        return len(watches)

    # faults

    def set_delay(self, seconds: float, path_prefix: str = "") -> None:
        """Delay every answer (to paths starting with path_prefix) by seconds; 0 turns it off."""
        with self._cond:
            self._delay = seconds
            self._delay_prefix = path_prefix

    def fail_next(self, n: int, status: int = 500, path_prefix: str = "") -> None:
        """Answer the next n requests (to paths starting with path_prefix) with an error Status."""
        with self._cond:
            self._fault = _Fault(remaining=n, status=status, path_prefix=path_prefix)

    # introspection

    @property
    def requests(self) -> list[Request]:
        """A snapshot of every request served, in arrival order."""
        with self._cond:
            return list(self._requests)

    @property
    def served(self) -> int:
        """How many requests were received in total (not limited by request_log_limit)."""
        with self._cond:
            return self._served

    @property
    def errors(self) -> list[str]:
        """Tracebacks of unexpected exceptions raised while serving."""
        with self._cond:
            return list(self._errors)

    def count(self, path_prefix: str = "", watch: bool | None = None,
              method: str | None = None) -> int:
        """How many logged requests have a path starting with path_prefix.

        ``watch=True`` counts only watch requests, ``False`` only the others.
        """
        with self._cond:
            return sum(1 for r in self._requests if _request_matches(r, path_prefix, watch, method))

    def open_watches(self) -> int:
        """How many watch streams are open now."""
        with self._cond:
            return len(self._watches)

    def wait_for_watches(self, n: int, timeout: float = 5.0) -> bool:
        """Block until at least n watch streams are open; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: len(self._watches) >= n, timeout)

    def wait_for_no_watches(self, timeout: float = 5.0) -> bool:
        """Block until no watch stream is open; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._watches, timeout)

    def wait_for_requests(self, n: int, path_prefix: str = "", watch: bool | None = None,
                          timeout: float = 5.0) -> bool:
        """Block until at least n matching requests were logged (see count); False on timeout."""
        def enough() -> bool:
            hits = sum(1 for r in self._requests
                       if _request_matches(r, path_prefix, watch, None))
            return hits >= n

        with self._cond:
            return self._cond.wait_for(enough, timeout)

    # internals, called with the lock held unless said otherwise

    def _metadata(self, resource: _Resource, name: str, rv: int,
                  labels: dict[str, str] | None,
                  annotations: dict[str, str] | None) -> JSON:
        return {
            "name": name,
            "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, f"fakekube/{resource.plural}/{name}/{rv}")),
            "resourceVersion": str(rv),
            "creationTimestamp": _timestamp(rv),
            "labels": dict(labels or {}),
            "annotations": dict(annotations or {}),
        }

    def _existing(self, resource: _Resource, name: str) -> JSON:
        try:
            return self._state.objects[resource.plural][name]
        except KeyError:
            raise KeyError(f"{resource.plural} {name!r} not found") from None

    def _commit(self, resource: _Resource, type_: str, old: JSON | None, obj: JSON) -> JSON:
        state = self._state
        state.rv += 1
        obj["metadata"]["resourceVersion"] = str(state.rv)
        if type_ == "DELETED":
            del state.objects[resource.plural][obj["metadata"]["name"]]
        else:
            state.objects[resource.plural][obj["metadata"]["name"]] = obj
        state.events.append(_Event(state.rv, resource.plural, type_, old, obj))
        if self.history_limit is not None and len(state.events) > self.history_limit:
            cut = len(state.events) - self.history_limit
            state.floor = state.events[cut - 1].rv
            del state.events[:cut]
        self._cond.notify_all()
        return copy.deepcopy(obj)

    def _delete(self, resource: _Resource, name: str) -> JSON:
        with self._cond:
            old = self._existing(resource, name)
            return self._commit(resource, "DELETED", old, copy.deepcopy(old))

    def _record_request(self, request: Request) -> None:
        with self._cond:
            self._served += 1
            self._requests.append(request)
            limit = self._request_log_limit
            if limit is not None and len(self._requests) > limit:
                del self._requests[:len(self._requests) - limit]
            self._cond.notify_all()

    def _record_error(self, text: str) -> None:
        if self._stopping.is_set():
            return
        log.error("fakekube error: {text}", text=text)
        with self._cond:
            self._errors.append(text)

    def _register_connection(self, connection: socket.socket) -> bool:
        with self._cond:
            if self._stopping.is_set():
                _shutdown(connection)
                return False
            self._connections.add(connection)
            self._handler_threads.add(threading.current_thread())
            return True

    def _unregister_connection(self, connection: socket.socket) -> None:
        with self._cond:
            self._connections.discard(connection)
            self._handler_threads.discard(threading.current_thread())

    def _delay_for(self, path: str) -> bool:
        """Wait the configured delay (called without the lock); False if stopping."""
        with self._cond:
            delay = self._delay if path.startswith(self._delay_prefix) else 0.0
        if delay > 0:
            self._stopping.wait(delay)
        return not self._stopping.is_set()

    def _take_fault(self, path: str) -> int | None:
        with self._cond:
            fault = self._fault
            if fault.remaining > 0 and path.startswith(fault.path_prefix):
                fault.remaining -= 1
                return fault.status
            return None

    def _version(self) -> JSON:
        return {
            "major": "1",
            "minor": "30",
            "gitVersion": "v1.30.0-fakekube",
            "gitCommit": "0000000000000000000000000000000000000000",
            "gitTreeState": "clean",
            "buildDate": "2024-01-01T00:00:00Z",
            "goVersion": "go1.22.0",
            "compiler": "gc",
            "platform": "linux/amd64",
        }

    def _list(self, resource: _Resource, query: dict[str, str]) -> tuple[int, JSON]:
        match = _matcher(query, resource)
        with self._cond:
            current = self._state.rv
            wanted = query.get("resourceVersion", "")
            if wanted not in ("", "0"):
                try:
                    asked = int(wanted)
                except ValueError:
                    raise _BadRequest(f"invalid resource version: {wanted!r}") from None
                if asked > current:
                    return 504, status_object(
                        504, f"Too large resource version: {asked}, current: {current}",
                        details={"causes": [{"reason": "ResourceVersionTooLarge",
                                             "message": "Too large resource version"}],
                                 "retryAfterSeconds": 1})
            objects = sorted(self._state.objects[resource.plural].items())
        items = [{k: v for k, v in obj.items() if k not in ("kind", "apiVersion")}
                 for _, obj in objects if match(obj)]
        return 200, {
            "kind": resource.kind + "List",
            "apiVersion": resource.api_version,
            "metadata": {"resourceVersion": str(current)},
            "items": items,
        }

    def _get(self, resource: _Resource, name: str) -> tuple[int, JSON]:
        with self._cond:
            obj = self._state.objects[resource.plural].get(name)
        if obj is None:
            details: JSON = {"name": name, "kind": resource.plural}
            if resource.group:
                details["group"] = resource.group
            qualified = f"{resource.plural}.{resource.group}" if resource.group else resource.plural
            return 404, status_object(404, f'{qualified} "{name}" not found', details=details)
        return 200, obj

    def _expired_status(self, asked: int) -> JSON:
        return status_object(
            410, f"too old resource version: {asked} ({self._state.floor + 1})", reason="Expired")

    def _open_watch(self, resource: _Resource, wanted: str, bookmarks: bool,
                    connection: socket.socket, match: Callable[[JSON | None], bool],
                    ) -> tuple[_Watch | None, list[JSON], JSON | None]:
        """Register a watch (called without the lock).

        Returns (watch, initial ADDED objects, expired Status or None); the
        watch is None when the answer is a plain HTTP 410.
        """
        initial: list[JSON] = []
        with self._cond:
            state = self._state
            if wanted in ("", "0"):
                cursor = state.rv
                initial = [obj for _, obj in sorted(state.objects[resource.plural].items())
                           if match(obj)]
            else:
                try:
                    cursor = int(wanted)
                except ValueError:
                    raise _BadRequest(f"invalid resource version: {wanted!r}") from None
                if cursor < state.floor:
                    expired = self._expired_status(cursor)
                    if self.expired_as == "http":
                        return None, [], expired
                    watch = _Watch(resource, connection, bookmarks, self._bookmark_seq, cursor)
                    self._watches.add(watch)
                    self._cond.notify_all()
                    return watch, [], expired
            watch = _Watch(resource, connection, bookmarks, self._bookmark_seq, cursor)
            self._watches.add(watch)
            self._cond.notify_all()
            return watch, initial, None

    def _next_for_watch(self, watch: _Watch, match: Callable[[JSON | None], bool],
                        deadline: float) -> tuple[str, list[tuple[str, JSON]]]:
        """Wait for something to send (called without the lock).

        Returns (outcome, events to send first): outcome is ``continue``,
        ``end`` (timeout: end the stream cleanly), ``expired`` (an ERROR
        event is included), or ``abort`` (dropped or stopping: cut it).
        """
        with self._cond:
            while True:
                if watch.dropped or self._stopping.is_set():
                    return "abort", []
                state = self._state
                if watch.cursor < state.floor:
                    return "expired", [("ERROR", self._expired_status(watch.cursor))]
                items: list[tuple[str, JSON]] = []
                start = bisect.bisect_right(state.events, watch.cursor, key=lambda e: e.rv)
                for event in state.events[start:]:
                    if event.resource == watch.resource.plural:
                        seen = _view(event, match)
                        if seen is not None:
                            items.append(seen)
                if state.rv > watch.cursor:
                    watch.cursor = state.rv
                if watch.bookmark_seq != self._bookmark_seq:
                    watch.bookmark_seq = self._bookmark_seq
                    if watch.bookmarks:
                        items.append(("BOOKMARK", {
                            "kind": watch.resource.kind,
                            "apiVersion": watch.resource.api_version,
                            "metadata": {"resourceVersion": str(state.rv)},
                        }))
                if items:
                    return "continue", items
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return "end", []
                if _peer_closed(watch.connection):
                    return "abort", []
                self._cond.wait(min(remaining, _PEER_CHECK_INTERVAL))

    def _close_watch(self, watch: _Watch) -> None:
        with self._cond:
            self._watches.discard(watch)
            self._cond.notify_all()


def _request_matches(request: Request, path_prefix: str, watch: bool | None,
                     method: str | None) -> bool:
    if not request.path.startswith(path_prefix):
        return False
    if method is not None and request.method != method:
        return False
    if watch is not None and _truthy(request.query.get("watch")) != watch:
        return False
    return True


def _peer_closed(connection: socket.socket) -> bool:
    """True if the client closed its end (checked without blocking)."""
    try:
        readable, _, _ = select.select([connection], [], [], 0)
        return bool(readable) and connection.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):
        return True


def _shutdown(connection: socket.socket) -> None:
    try:
        connection.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def client_configuration(server: FakeKube,
                         token: str = "fake-token") -> kubernetes.client.Configuration:
    """A ``kubernetes`` client Configuration for the fake server (its bearer token is ignored)."""
    configuration = kubernetes.client.Configuration()
    configuration.host = server.url
    configuration.api_key = {"authorization": token}
    configuration.api_key_prefix = {"authorization": "Bearer"}
    return configuration


def api_client(server: FakeKube,
               token: str = "fake-token") -> kubernetes.client.ApiClient:
    """A ``kubernetes`` ApiClient for the fake server; close it (or use ``with``) when done."""
    return kubernetes.client.ApiClient(client_configuration(server, token))
