"""
Endpoints as a new endpoint author first writes one: on the standard
library's C{http.server}, in a thread on 127.0.0.1.

L{StdlibEndpoint} answers every POST with a patch that sets one label of the
Pod (an idempotent endpoint: C{[]} once the label is there), in one of the
ways such a server ends or keeps its connections (L{Style}), and optionally
closes its kept-alive connections after a random idle delay from a seeded
C{random.Random} (L{IdleClose}), as a server with a short keep-alive timeout
does.  It counts the connections it accepted and the requests it read.

The path says which label: C{/label/KEY/VALUE}; any other path sets
C{team=payments}.  Two paths on one server are a chain of two steps on one
origin.
"""

from __future__ import annotations

import enum
import http.server
import json
import random
import socket
import threading
from dataclasses import dataclass
from typing import Any, Optional

from twisted.internet.defer import Deferred
from twisted.internet.threads import deferToThread

LOOPBACK = "127.0.0.1"


class Style(enum.Enum):
    """
    How the server ends or keeps its connections.
    """

    #: C{BaseHTTPRequestHandler}'s default: an HTTP/1.0 reply with a
    #: Content-Length and no Connection header, then the server closes.
    HTTP10 = "HTTP/1.0"
    #: HTTP/1.0 without a Content-Length: the body ends with the close.
    HTTP10_UNTIL_CLOSE = "HTTP/1.0, body until the close"
    #: An HTTP/1.1 reply with C{Connection: close}, then the server closes.
    CLOSE = "HTTP/1.1, Connection: close"
    #: HTTP/1.1 keep-alive: the connection serves the next request.
    KEEP_ALIVE = "HTTP/1.1 keep-alive"
    #: HTTP/1.1 keep-alive, but a request that comes second on a connection
    #: is read and the connection closed without a reply: what a server
    #: that closed an idle connection as the request arrived looks like.
    DROPS_SECOND = "HTTP/1.1, drops the second request on a connection"
    #: Every request is read and its connection closed without a reply.
    DROPS_ALL = "HTTP/1.1, drops every request"


@dataclass
class IdleClose:
    """
    Close a kept-alive connection when no request arrived on it within a
    random delay, uniform in C{[0, most)} seconds, from C{random.Random(seed)}.
    """

    seed: int
    most: float


def label_patch(pod: dict[str, Any], key: str, value: str) -> list[dict[str, Any]]:
    """
    The JSON Patch that sets label C{key} to C{value}, or C{[]} when the
    Pod has it already.
    """
    labels = (pod.get("metadata") or {}).get("labels")
    if labels is None:
        return [{"op": "add", "path": "/metadata/labels", "value": {key: value}}]
    if labels.get(key) == value:
        return []
    return [{"op": "add", "path": "/metadata/labels/" + key.replace("~", "~0").replace("/", "~1"), "value": value}]


class StdlibEndpoint:
    """
    One C{http.server} endpoint in its own thread; start it with
    L{start} (or C{with}), stop it with L{stop}.

    @ivar connections: connections accepted so far.
    @ivar requests: requests read so far (answered or dropped).
    @ivar idle_closed: kept-alive connections closed for idling.
    """

    def __init__(self, style: Style = Style.HTTP10, idle_close: Optional[IdleClose] = None) -> None:
        self.style = style
        self.connections = 0
        self.requests = 0
        self.idle_closed = 0
        self._lock = threading.Lock()
        self._random = random.Random(idle_close.seed) if idle_close is not None else None
        self._idle_most = idle_close.most if idle_close is not None else 0.0
        owner = self

        class Server(http.server.ThreadingHTTPServer):
            daemon_threads = True

            def process_request(self, request: Any, client_address: Any) -> None:
                with owner._lock:
                    owner.connections += 1
                super().process_request(request, client_address)

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0" if style in (Style.HTTP10, Style.HTTP10_UNTIL_CLOSE) else "HTTP/1.1"
            served = 0

            def handle_one_request(self) -> None:
                delay = owner._idle_delay() if self.served else None
                if delay is not None:
                    self.connection.settimeout(delay)
                try:
                    super().handle_one_request()
                except TimeoutError:
                    # The delay ran out in the middle of a request: closed
                    # without an answer, as a server's idle close would.
                    self.close_connection = True
                self.served += 1

            def log_error(self, format: str, *args: Any) -> None:
                if format.startswith("Request timed out"):
                    with owner._lock:
                        owner.idle_closed += 1

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 (http.server naming)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with owner._lock:
                    owner.requests += 1
                if style is Style.DROPS_ALL or (style is Style.DROPS_SECOND and self.served):
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                parts = self.path.split("/")
                key, value = (parts[2], parts[3]) if len(parts) == 4 and parts[1] == "label" else ("team", "payments")
                reply = json.dumps(label_patch(json.loads(body), key, value)).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                if style is not Style.HTTP10_UNTIL_CLOSE:
                    self.send_header("Content-Length", str(len(reply)))
                if style is Style.CLOSE:
                    self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(reply)

        self._server = Server((LOOPBACK, 0), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), name=f"stdlib-endpoint-{self.port}", daemon=True
        )

    def _idle_delay(self) -> Optional[float]:
        if self._random is None:
            return None
        with self._lock:
            return self._random.uniform(0, self._idle_most)

    def url(self, path: str = "/mutate") -> str:
        return f"http://{LOOPBACK}:{self.port}{path}"

    def start(self) -> "StdlibEndpoint":
        self._thread.start()
        return self

    def stop(self) -> None:
        """
        Stop accepting and close the listening socket (blocking: from a
        thread, see L{stop_later}, or outside a reactor).
        """
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def stop_later(self) -> Deferred:
        """
        L{stop} in the reactor's thread pool: for a test's cleanup.
        """
        return deferToThread(self.stop)

    def __enter__(self) -> "StdlibEndpoint":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
