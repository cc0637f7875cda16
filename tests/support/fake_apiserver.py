"""A fake Kubernetes API server over real HTTP on loopback, for the
integration tests of amp.kube, the benchmark and the soak.

``FakeKube`` serves Namespaces and MutatingWebhookConfigurations the way
kube-apiserver does on the wire (JSON bodies, ``Status`` errors, chunked
watch streams), so the official ``kubernetes`` client can be pointed at it.
It runs on the standard library's ``ThreadingHTTPServer`` in a background
thread, on 127.0.0.1, on a free port.  It serves exactly what amp asks for:

- ``GET <collection>``: a list (``{"kind": "<Kind>List", "metadata":
  {"resourceVersion": rv}, "items": [...]}``, always the current state),
  with ``fieldSelector=metadata.name=<name>`` honoured;
- ``GET <collection>/<name>``: the object, or a 404 ``Status``;
- ``GET <collection>?watch=true&resourceVersion=N``: one chunk per event,
  each a JSON line ``{"type": ..., "object": {...}}``, first every retained
  event after N, then new ones as they happen, until ``timeoutSeconds``
  (then a clean end).  With ``allowWatchBookmarks=true`` a ``bookmark()``
  sends a ``BOOKMARK`` at the current revision.
- ``PATCH <mwc>/<name>`` with ``application/apply-patch+yaml`` (a JSON
  body): server-side apply, kept in ``applied`` as (query, body), the object
  replaced as ``put_webhook_configuration`` does;
- every other method answers 405; unknown paths 404.

Resource versions: one global counter (etcd's revision) for both kinds;
every change bumps it.  ``expire_history()`` forgets every event, so a watch
from an older revision is "too old": HTTP 200 and one ``ERROR`` event with a
410 ``Expired`` ``Status`` (the real server's way), or, with
``expired_as="http"``, an HTTP 410 answer.

How the ``kubernetes`` client (37.x) surfaces the faults amp handles:
an HTTP error answer (``fail_next``, ``expired_as="http"``) is an
``ApiException`` with its status; ``drop_watches()`` (stream cut without the
terminating chunk) is a ``urllib3`` ``ProtocolError``; a ``set_delay`` longer
than the client's read timeout is a ``ReadTimeoutError`` (amp turns the
client's own retries off).

Faults and introspection (thread-safe): ``fail_next``, ``set_delay`` /
``release_delayed``, ``drop_watches``, ``requests`` / ``count`` /
``open_watches``, and the blocking ``wait_for_*`` (bounded, woken by the
server: no polling).  ``errors`` lists unexpected exceptions raised while
serving; a test should assert it stays empty.
"""

from __future__ import annotations

import bisect
import copy
import datetime
import json
import select
import socket
import threading
import time
import traceback
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterable, NamedTuple, Optional
from urllib.parse import parse_qs, unquote, urlsplit

JSON = dict[str, Any]
_EPOCH = datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone.utc)
_PEER_CHECK_INTERVAL = 0.1  # seconds between checks that a watching client is still there
_REASONS = {
    400: "BadRequest",
    404: "NotFound",
    405: "MethodNotAllowed",
    410: "Expired",
    500: "InternalError",
    503: "ServiceUnavailable",
}
_WEBHOOK_DEFAULTS: JSON = {
    "admissionReviewVersions": ["v1"],
    "sideEffects": "None",
    "clientConfig": {"service": {"namespace": "amp", "name": "amp", "path": "/mutate", "port": 443}},
    "failurePolicy": "Fail",
    "matchPolicy": "Equivalent",
    "namespaceSelector": {},
    "objectSelector": {},
    "reinvocationPolicy": "Never",
    "timeoutSeconds": 10,
}


class Request(NamedTuple):
    """One request the server received: method, path, query (last value per key)."""

    method: str
    path: str
    query: dict[str, str]


@dataclass(frozen=True)
class _Resource:
    plural: str
    kind: str
    api_version: str
    base: str


_NAMESPACES = _Resource("namespaces", "Namespace", "v1", "/api/v1/namespaces")
_MWCS = _Resource(
    "mutatingwebhookconfigurations",
    "MutatingWebhookConfiguration",
    "admissionregistration.k8s.io/v1",
    "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
)
_RESOURCES = (_NAMESPACES, _MWCS)


@dataclass(frozen=True)
class _Event:
    rv: int
    resource: str
    type: str
    name: str
    obj: JSON


@dataclass(eq=False)
class _Watch:
    resource: _Resource
    connection: socket.socket
    bookmarks: bool
    bookmark_seq: int
    cursor: int
    name: Optional[str]
    dropped: bool = False


@dataclass
class _Fault:
    remaining: int = 0
    status: int = 500
    path_prefix: str = ""


@dataclass
class _State:
    rv: int = 100
    floor: int = 100
    objects: dict[str, dict[str, JSON]] = field(default_factory=lambda: {r.plural: {} for r in _RESOURCES})
    events: list[_Event] = field(default_factory=list)


def status_object(code: int, message: str, reason: Optional[str] = None) -> JSON:
    """A ``Status`` object of the shape kube-apiserver sends with errors."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason or _REASONS.get(code, "Unknown"),
        "code": code,
    }


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode("utf-8")


def _timestamp(rv: int) -> str:
    return (_EPOCH + datetime.timedelta(seconds=rv)).strftime("%Y-%m-%dT%H:%M:%SZ")


def _name_selector(query: dict[str, str]) -> Optional[str]:
    """The name of ``fieldSelector=metadata.name=<name>``, the one selector amp uses."""
    selector = query.get("fieldSelector", "")
    if not selector:
        return None
    key, _, value = selector.partition("=")
    if key != "metadata.name":
        raise ValueError(f"field label not supported: {key}")
    return value


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
        pass

    def do_GET(self) -> None:
        kube = self.server.kube
        parts = urlsplit(self.path)
        path = unquote(parts.path).rstrip("/")
        query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        kube._record_request(Request("GET", path, query))
        if not kube._delay_for(path):
            self.close_connection = True
            return
        fault = kube._take_fault(path)
        if fault is not None:
            self._send_json(fault, status_object(fault, f"injected failure {fault}"))
            return
        try:
            self._route(path, query)
        except ValueError as bad:
            self._send_json(400, status_object(400, str(bad)))

    def _other_method(self) -> None:
        self.server.kube._record_request(Request(self.command, unquote(urlsplit(self.path).path), {}))
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        self._send_json(405, status_object(405, f"the server does not allow this method ({self.command})"))

    do_POST = do_PUT = do_DELETE = _other_method

    def do_PATCH(self) -> None:
        """Server-side apply of a MutatingWebhookConfiguration (JSON is YAML); other PATCHes 405."""
        kube = self.server.kube
        parts = urlsplit(self.path)
        path = unquote(parts.path).rstrip("/")
        query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        name = path[len(_MWCS.base) + 1 :] if path.startswith(_MWCS.base + "/") else ""
        content_type = self.headers.get("Content-Type") or ""
        if not name or "/" in name or content_type != "application/apply-patch+yaml":
            self._other_method()
            return
        kube._record_request(Request("PATCH", path, query))
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        fault = kube._take_fault(path)
        if fault is not None:
            self._send_json(fault, status_object(fault, f"injected failure {fault}"))
            return
        if not query.get("fieldManager") or body.get("metadata", {}).get("name") != name:
            self._send_json(400, status_object(400, "fieldManager is required, and the body must name the object"))
            return
        with kube._cond:
            kube.applied.append((query, body))
        self._send_json(200, kube.put_webhook_configuration(name, body.get("webhooks") or ()))

    def _route(self, path: str, query: dict[str, str]) -> None:
        kube = self.server.kube
        for resource in _RESOURCES:
            if path == resource.base:
                if query.get("watch") in ("true", "1"):
                    self._watch(resource, query)
                else:
                    self._send_json(200, kube._list(resource, _name_selector(query)))
                return
            name = path[len(resource.base) + 1 :] if path.startswith(resource.base + "/") else ""
            if name and "/" not in name:
                obj = kube._get(resource, name)
                if obj is None:
                    self._send_json(404, status_object(404, f'{resource.plural} "{name}" not found'))
                else:
                    self._send_json(200, obj)
                return
        self._send_json(404, status_object(404, "the server could not find the requested resource"))

    def _send_json(self, code: int, body: JSON) -> None:
        data = _dumps(body)
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def _watch(self, resource: _Resource, query: dict[str, str]) -> None:
        kube = self.server.kube
        deadline = time.monotonic() + float(query.get("timeoutSeconds") or kube.watch_timeout)
        watch, expired = kube._open_watch(
            resource,
            query.get("resourceVersion", ""),
            query.get("allowWatchBookmarks") == "true",
            self.connection,
            _name_selector(query),
        )
        if expired is not None and watch is None:
            self._send_json(410, expired)
            return
        assert watch is not None
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            if expired is not None:
                self._chunk(_dumps({"type": "ERROR", "object": expired}) + b"\n")
                self._chunk(b"")
                return
            while True:
                outcome, items = kube._next_for_watch(watch, deadline)
                for type_, obj in items:
                    self._chunk(_dumps({"type": type_, "object": obj}) + b"\n")
                if outcome == "continue":
                    continue
                if outcome == "end":
                    self._chunk(b"")
                else:
                    self.close_connection = True
                return
        except OSError:
            self.close_connection = True
        finally:
            kube._close_watch(watch)


class FakeKube:
    """A fake kube-apiserver on ``http://127.0.0.1:<port>`` (see the module docstring).

    :param expired_as: ``"event"`` (an ERROR event with a 410 Status) or
        ``"http"`` (the watch request answers HTTP 410).
    :param watch_timeout: seconds a watch stays open without ``timeoutSeconds``.
    :param request_log_limit: keep only the last N entries in ``requests``
        (None: all); a long benchmark should set it.
    """

    def __init__(
        self, *, expired_as: str = "event", watch_timeout: float = 1800.0, request_log_limit: Optional[int] = None
    ) -> None:
        if expired_as not in ("event", "http"):
            raise ValueError(f"expired_as must be 'event' or 'http', not {expired_as!r}")
        self.expired_as = expired_as
        self.watch_timeout = watch_timeout
        self._request_log_limit = request_log_limit
        self._cond = threading.Condition(threading.Lock())
        self._stopping = threading.Event()
        self._state = _State()
        self._watches: set[_Watch] = set()
        self._connections: set[socket.socket] = set()
        self._handler_threads: set[threading.Thread] = set()
        self._bookmark_seq = 0
        self._requests: list[Request] = []
        self._served = 0
        self._fault = _Fault()
        self._delay = 0.0
        self._delay_prefix = ""
        self._delay_generation = 0
        self._errors: list[str] = []
        #: Server-side applies received: (query, body).
        self.applied: list[tuple[dict[str, str], JSON]] = []
        self._httpd: Optional[_Server] = None
        self._thread: Optional[threading.Thread] = None

    # lifecycle

    def start(self) -> "FakeKube":
        """Bind 127.0.0.1:0 and serve in a background thread; returns self."""
        if self._httpd is not None:
            raise RuntimeError("FakeKube can be started only once")
        self._httpd = _Server(self)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, name=f"fakekube-{self.port}", daemon=True
        )
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving: wake every waiter, cut every connection, join threads."""
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

    def add_namespace(
        self, name: str, labels: Optional[dict[str, str]] = None, annotations: Optional[dict[str, str]] = None
    ) -> JSON:
        """Create a Namespace (ADDED); ValueError if it exists.  Like the real
        server, the label ``kubernetes.io/metadata.name: <name>`` is set."""
        with self._cond:
            if name in self._state.objects[_NAMESPACES.plural]:
                raise ValueError(f"namespace {name!r} already exists")
            metadata = self._metadata(_NAMESPACES, name, labels, annotations)
            metadata["labels"]["kubernetes.io/metadata.name"] = name
            obj = {
                "kind": "Namespace",
                "apiVersion": "v1",
                "metadata": metadata,
                "spec": {"finalizers": ["kubernetes"]},
                "status": {"phase": "Active"},
            }
            return self._commit(_NAMESPACES, "ADDED", obj)

    def update_namespace(
        self, name: str, labels: Optional[dict[str, str]] = None, annotations: Optional[dict[str, str]] = None
    ) -> JSON:
        """Replace the labels and/or annotations given (MODIFIED); KeyError if missing."""
        with self._cond:
            obj = copy.deepcopy(self._existing(_NAMESPACES, name))
            if labels is not None:
                obj["metadata"]["labels"] = {**labels, "kubernetes.io/metadata.name": name}
            if annotations is not None:
                obj["metadata"]["annotations"] = dict(annotations)
            return self._commit(_NAMESPACES, "MODIFIED", obj)

    def delete_namespace(self, name: str) -> JSON:
        """Remove a Namespace (DELETED); KeyError if it does not exist."""
        return self._delete(_NAMESPACES, name)

    def get_namespace(self, name: str) -> Optional[JSON]:
        """A copy of the stored Namespace, or None."""
        with self._cond:
            return copy.deepcopy(self._state.objects[_NAMESPACES.plural].get(name))

    def put_webhook_configuration(self, name: str, webhooks: Iterable[JSON] = ()) -> JSON:
        """Create (ADDED) or replace (MODIFIED) a MutatingWebhookConfiguration;
        each webhook gets the API server's defaults for missing fields."""
        webhooks = [{**copy.deepcopy(_WEBHOOK_DEFAULTS), **copy.deepcopy(dict(w))} for w in webhooks]
        with self._cond:
            old = self._state.objects[_MWCS.plural].get(name)
            metadata = copy.deepcopy(old["metadata"]) if old else self._metadata(_MWCS, name, None, None)
            obj = {"kind": _MWCS.kind, "apiVersion": _MWCS.api_version, "metadata": metadata, "webhooks": webhooks}
            return self._commit(_MWCS, "ADDED" if old is None else "MODIFIED", obj)

    def delete_webhook_configuration(self, name: str) -> JSON:
        """Remove a MutatingWebhookConfiguration (DELETED); KeyError if missing."""
        return self._delete(_MWCS, name)

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
        """Cut every open watch stream abruptly (no terminating chunk); returns how many."""
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

    def release_delayed(self) -> None:
        """Answer every request held by ``set_delay`` now."""
        with self._cond:
            self._delay_generation += 1
            self._cond.notify_all()

    def fail_next(self, n: int, status: int = 500, path_prefix: str = "") -> None:
        """Answer the next n requests (to paths starting with path_prefix) with an error Status."""
        with self._cond:
            self._fault = _Fault(remaining=n, status=status, path_prefix=path_prefix)

    # introspection

    @property
    def requests(self) -> list[Request]:
        """A snapshot of every request received, in arrival order."""
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

    def count(self, path_prefix: str = "", watch: Optional[bool] = None, method: Optional[str] = None) -> int:
        """How many logged requests have a path starting with path_prefix
        (``watch=True``: only watches, ``False``: only the others)."""
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

    def wait_for_requests(
        self, n: int, path_prefix: str = "", watch: Optional[bool] = None, timeout: float = 5.0
    ) -> bool:
        """Block until at least n matching requests were logged (see count); False on timeout."""
        with self._cond:
            return self._cond.wait_for(
                lambda: sum(1 for r in self._requests if _request_matches(r, path_prefix, watch, None)) >= n, timeout
            )

    # internals, called with the lock held unless said otherwise

    def _metadata(
        self, resource: _Resource, name: str, labels: Optional[dict[str, str]], annotations: Optional[dict[str, str]]
    ) -> JSON:
        rv = self._state.rv + 1
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

    def _commit(self, resource: _Resource, type_: str, obj: JSON) -> JSON:
        state = self._state
        state.rv += 1
        obj["metadata"]["resourceVersion"] = str(state.rv)
        name = obj["metadata"]["name"]
        if type_ == "DELETED":
            del state.objects[resource.plural][name]
        else:
            state.objects[resource.plural][name] = obj
        state.events.append(_Event(state.rv, resource.plural, type_, name, obj))
        self._cond.notify_all()
        return copy.deepcopy(obj)

    def _delete(self, resource: _Resource, name: str) -> JSON:
        with self._cond:
            return self._commit(resource, "DELETED", copy.deepcopy(self._existing(resource, name)))

    def _record_request(self, request: Request) -> None:
        with self._cond:
            self._served += 1
            self._requests.append(request)
            limit = self._request_log_limit
            if limit is not None and len(self._requests) > limit:
                del self._requests[: len(self._requests) - limit]
            self._cond.notify_all()

    def _record_error(self, text: str) -> None:
        if not self._stopping.is_set():
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
        """Wait out the configured delay (called without the lock); False if stopping."""
        with self._cond:
            delay = self._delay if path.startswith(self._delay_prefix) else 0.0
            generation = self._delay_generation
            if delay > 0:
                self._cond.wait_for(lambda: self._stopping.is_set() or self._delay_generation != generation, delay)
        return not self._stopping.is_set()

    def _take_fault(self, path: str) -> Optional[int]:
        with self._cond:
            fault = self._fault
            if fault.remaining > 0 and path.startswith(fault.path_prefix):
                fault.remaining -= 1
                return fault.status
            return None

    def _list(self, resource: _Resource, name: Optional[str]) -> JSON:
        with self._cond:
            current = self._state.rv
            objects = sorted(self._state.objects[resource.plural].items())
        items = [
            {k: v for k, v in obj.items() if k not in ("kind", "apiVersion")}
            for key, obj in objects
            if name is None or key == name
        ]
        return {
            "kind": resource.kind + "List",
            "apiVersion": resource.api_version,
            "metadata": {"resourceVersion": str(current)},
            "items": items,
        }

    def _get(self, resource: _Resource, name: str) -> Optional[JSON]:
        with self._cond:
            return self._state.objects[resource.plural].get(name)

    def _open_watch(
        self, resource: _Resource, wanted: str, bookmarks: bool, connection: socket.socket, name: Optional[str]
    ) -> tuple[Optional[_Watch], Optional[JSON]]:
        """Register a watch (called without the lock): (watch, expired Status or
        None); the watch is None when the answer is a plain HTTP 410."""
        with self._cond:
            state = self._state
            cursor = int(wanted) if wanted not in ("", "0") else state.rv
            expired = None
            if cursor < state.floor:
                expired = status_object(
                    410, f"too old resource version: {cursor} ({state.floor + 1})", reason="Expired"
                )
                if self.expired_as == "http":
                    return None, expired
            watch = _Watch(resource, connection, bookmarks, self._bookmark_seq, cursor, name)
            self._watches.add(watch)
            self._cond.notify_all()
            return watch, expired

    def _next_for_watch(self, watch: _Watch, deadline: float) -> tuple[str, list[tuple[str, JSON]]]:
        """Wait for something to send (called without the lock): ``continue``
        with events, ``end`` (timeout), or ``abort`` (dropped or stopping)."""
        with self._cond:
            while True:
                if watch.dropped or self._stopping.is_set():
                    return "abort", []
                state = self._state
                start = bisect.bisect_right(state.events, watch.cursor, key=lambda e: e.rv)
                items = [
                    (e.type, e.obj)
                    for e in state.events[start:]
                    if e.resource == watch.resource.plural and (watch.name is None or e.name == watch.name)
                ]
                watch.cursor = max(watch.cursor, state.rv)
                if watch.bookmark_seq != self._bookmark_seq:
                    watch.bookmark_seq = self._bookmark_seq
                    if watch.bookmarks:
                        items.append(
                            (
                                "BOOKMARK",
                                {
                                    "kind": watch.resource.kind,
                                    "apiVersion": watch.resource.api_version,
                                    "metadata": {"resourceVersion": str(state.rv)},
                                },
                            )
                        )
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


def _request_matches(request: Request, path_prefix: str, watch: Optional[bool], method: Optional[str]) -> bool:
    if not request.path.startswith(path_prefix):
        return False
    if method is not None and request.method != method:
        return False
    return watch is None or (request.query.get("watch") in ("true", "1")) == watch


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
