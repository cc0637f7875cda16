"""
The synchronous side of the Kubernetes API (thread side: nothing here may run
on the reactor thread).

L{KubeClient} is the one place amp calls the official C{kubernetes} client:
the listers the watch threads loop over, and the blocking calls the reactor
runs in its thread pool (a namespace GET on a cache miss).  It owns the
C{ApiClient} and the sockets it opens, so that stopping can shut those down
and wake a thread blocked in a read.

Every request is bounded (connect and read timeouts); the client's own
retries are off, so a request that fails fails once and the caller decides.
"""

from __future__ import annotations

import socket
import threading
import weakref
from typing import Any, Callable, Iterator, Optional, Protocol

import kubernetes.client
import kubernetes.config
import urllib3
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import MaxRetryError

from amp.config import KubernetesConfig
from amp.namespaces import NamespaceInfo, NamespaceLookupError


def load_client_configuration(config: KubernetesConfig) -> kubernetes.client.Configuration:
    """
    A fresh client configuration (never the module-wide default) from the
    in-cluster service account or the kubeconfig named in C{config}.  Read
    timeouts are not retried by the HTTP pool: a watch or GET that times out
    fails once, and amp decides what to do.

    @raise Exception: whatever the loader raises when it cannot be used.
    """
    cfg = kubernetes.client.Configuration()
    if config.source == "cluster":
        kubernetes.config.load_incluster_config(client_configuration=cfg)
    else:
        kubernetes.config.load_kube_config(
            config_file=config.kubeconfig, context=config.context,
            client_configuration=cfg, persist_config=False)
    cfg.retries = urllib3.util.Retry(total=0, connect=0, read=0, redirect=False, status=0, other=0)
    return cfg


def describe(error: BaseException) -> str:
    """A short, never empty, description of a failed request."""
    if isinstance(error, ApiException):
        return f"HTTP {error.status} {error.reason or ''}".strip()
    if isinstance(error, MaxRetryError) and error.reason is not None:
        error = error.reason
    text = f"{type(error).__name__}: {error}"
    return text if len(text) <= 300 else text[:297] + "..."


# ------------------------------------------------------------ sockets


class _Connections:
    """
    The sockets one ApiClient opened, so that another thread can shut them
    down and wake a read blocked on them.  Once cut, every socket the pool
    opens is shut down as soon as it connects.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: "weakref.WeakSet[Any]" = weakref.WeakSet()
        self._cut = False

    def add(self, connection: Any) -> None:
        with self._lock:
            if not self._cut:
                self._open.add(connection)
                return
        _shutdown(connection)

    def cut(self) -> None:
        with self._lock:
            self._cut = True
            connections = list(self._open)
        for connection in connections:
            _shutdown(connection)

    def install(self, api: kubernetes.client.ApiClient) -> bool:
        """
        Make C{api}'s pool report its connections here; False when the pool
        is of a kind this cannot wrap (a SOCKS proxy), in which case stopping
        relies on the read timeouts.
        """
        manager = api.rest_client.pool_manager
        if type(manager) not in (urllib3.PoolManager, urllib3.ProxyManager):
            return False
        tracker = self

        class Connection(urllib3.connection.HTTPConnection):
            def connect(self) -> None:
                super().connect()
                tracker.add(self)

        class TLSConnection(urllib3.connection.HTTPSConnection):
            def connect(self) -> None:
                super().connect()
                tracker.add(self)

        class Pool(urllib3.HTTPConnectionPool):
            ConnectionCls = Connection

        class TLSPool(urllib3.HTTPSConnectionPool):
            ConnectionCls = TLSConnection

        manager.pool_classes_by_scheme = {"http": Pool, "https": TLSPool}
        return True


def _shutdown(connection: Any) -> None:
    sock = getattr(connection, "sock", None)
    if isinstance(sock, socket.socket):
        try:
            # The plain socket's shutdown, also for a TLS socket: it wakes a
            # reader blocked in another thread without touching TLS state.
            socket.socket.shutdown(sock, socket.SHUT_RDWR)
        except OSError:
            pass


# ------------------------------------------------------------ listers


class Lister(Protocol):
    """
    One collection that can be listed and watched (what a
    L{amp.kube._watch.ListWatch} loops over).  Both calls block; both raise
    C{ApiException} for an HTTP error answer (410 Gone included).
    """

    def list(self, *, limit: Optional[int], continue_token: Optional[str],
             timeout: tuple[float, float]) -> bytes:
        """The body of one list (or one page of it)."""

    def watch(self, *, resource_version: str, timeout_seconds: int,
              timeout: tuple[float, float]) -> "Stream":
        """
        Open a watch from C{resource_version} (returns once the server has
        answered); the stream yields its lines as they arrive.
        """


class Stream(Protocol):
    """An open watch: its lines (one JSON event each), and a way to close it."""

    def __iter__(self) -> Iterator[bytes]:
        ...

    def close(self) -> None:
        ...


class _ApiLister:
    """A L{Lister} over one list method of the generated API classes."""

    def __init__(self, call: Callable[..., Any], **fixed: Any) -> None:
        self._call = call
        self._fixed = fixed

    def list(self, *, limit: Optional[int], continue_token: Optional[str],
             timeout: tuple[float, float]) -> bytes:
        options: dict[str, Any] = dict(self._fixed)
        if limit:
            options["limit"] = limit
        if continue_token:
            options["_continue"] = continue_token
        response = self._call(_preload_content=False, _request_timeout=timeout, **options)
        try:
            return response.data
        finally:
            response.release_conn()

    def watch(self, *, resource_version: str, timeout_seconds: int,
              timeout: tuple[float, float]) -> "_ResponseStream":
        return _ResponseStream(self._call(
            watch=True, resource_version=resource_version, allow_watch_bookmarks=True,
            timeout_seconds=timeout_seconds, _request_timeout=timeout, _preload_content=False,
            **self._fixed))


class _ResponseStream:
    """A watch response read line by line."""

    def __init__(self, response: Any) -> None:
        self._response = response

    def __iter__(self) -> Iterator[bytes]:
        return _lines(self._response)

    def close(self) -> None:
        self._response.close()
        self._response.release_conn()


def _lines(response: Any) -> Iterator[bytes]:
    buffer = bytearray()
    for chunk in response.stream(amt=None, decode_content=True):
        buffer += chunk
        start = 0
        while True:
            end = buffer.find(b"\n", start)
            if end < 0:
                break
            if end > start:
                yield bytes(buffer[start:end])
            start = end + 1
        if start:
            del buffer[:start]
    if buffer.strip():
        yield bytes(buffer)


# ------------------------------------------------------------ the client


class KubeClient:
    """
    One C{ApiClient} and the sockets it opened.  Built on the reactor
    (cheap); everything else blocks and runs in a watch thread or the
    reactor's thread pool.  The API classes are built in those threads: the
    first one imports a large generated module, which must not hold up the
    reactor.
    """

    def __init__(self, configuration: kubernetes.client.Configuration) -> None:
        self.host = configuration.host
        self._configuration = configuration
        self.api = kubernetes.client.ApiClient(configuration)
        self._connections = _Connections()
        self._connections.install(self.api)

    @classmethod
    def from_config(cls, config: KubernetesConfig) -> "KubeClient":
        """
        @raise Exception: when the client configuration cannot be loaded.
        """
        return cls(load_client_configuration(config))

    def namespaces(self) -> Lister:
        api = self.api

        def list_namespace(**kwargs: Any) -> Any:
            return kubernetes.client.CoreV1Api(api).list_namespace(**kwargs)

        return _ApiLister(list_namespace)

    def webhook_configuration(self, name: str) -> Lister:
        api = self.api

        def list_webhook_configuration(**kwargs: Any) -> Any:
            adm = kubernetes.client.AdmissionregistrationV1Api(api)
            return adm.list_mutating_webhook_configuration(**kwargs)

        return _ApiLister(list_webhook_configuration, field_selector=f"metadata.name={name}")

    def read_namespace(self, name: str, timeout: float) -> Optional[bytes]:
        """The Namespace's JSON, or None when it does not exist."""
        try:
            response = kubernetes.client.CoreV1Api(self.api).read_namespace(
                name, _request_timeout=timeout, _preload_content=False)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        try:
            return response.data
        finally:
            response.release_conn()

    def cut(self) -> None:
        """Shut down every socket, now and from now on (any thread)."""
        self._connections.cut()

    def close(self) -> None:
        self.api.close()


def get_namespace(client: Any, parse: Callable[[bytes], NamespaceInfo], name: str,
                  timeout: float) -> Optional[NamespaceInfo]:
    """
    One bounded GET of a namespace (in the reactor's thread pool).

    @raise NamespaceLookupError: naming the namespace and what failed.
    """
    try:
        body = client.read_namespace(name, timeout)
    except Exception as e:
        raise NamespaceLookupError(f"namespace {name}: {describe(e)}") from None
    if body is None:
        return None
    try:
        return parse(body)
    except (ValueError, AttributeError) as e:
        raise NamespaceLookupError(f"namespace {name}: unreadable answer: {e}") from None
