"""
The synchronous side of the Kubernetes API (thread side: nothing here may run
on the reactor thread).

L{KubeClient} is the one place amp calls the official C{kubernetes} client:
the listers the watch threads loop over, and the blocking calls the reactor
runs in its thread pool (a namespace GET on a cache miss, the bypass
report's Lease and Events).  It owns the
C{ApiClient} and the sockets it opens, so that stopping can shut those down
and wake a thread blocked in a read.

Every request is bounded (connect and read timeouts); the client's own
retries are off, so a request that fails fails once and the caller decides.
"""

from __future__ import annotations

import json
import socket
import threading
import urllib.parse
import weakref
from typing import Any, Callable, Iterable, Iterator, Optional, Protocol

import kubernetes.client
import kubernetes.config
import urllib3
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import MaxRetryError

from amp.config import KubernetesConfig
from amp.files import INPUT_LIMIT, config_document, read_file
from amp.namespaces import NamespaceInfo, NamespaceLookupError
from amp.reasons import NamespaceSource


def load_client_configuration(config: KubernetesConfig) -> kubernetes.client.Configuration:
    """
    A fresh client configuration (never the module-wide default) from the
    in-cluster service account or the kubeconfig named in C{config}.  Read
    timeouts are not retried by the HTTP pool: a watch or GET that times out
    fails once, and amp decides what to do.

    @raise Exception: whatever the loader raises when it cannot be used.
    """
    cfg = kubernetes.client.Configuration()
    if config.source == NamespaceSource.CLUSTER:
        kubernetes.config.load_incluster_config(client_configuration=cfg)
    else:
        if config.kubeconfig:
            # The client library parses it with PyYAML as it stands: amp's
            # reader refuses what would blow up (a cap, no aliases) first.
            data, _ = read_file(config.kubeconfig, f"kubeconfig {config.kubeconfig}", INPUT_LIMIT)
            config_document(data, f"kubeconfig {config.kubeconfig}")
        kubernetes.config.load_kube_config(
            config_file=config.kubeconfig, context=config.context, client_configuration=cfg, persist_config=False
        )
    cfg.retries = urllib3.util.Retry(total=0, connect=0, read=0, redirect=False, status=0, other=0)
    return cfg


def describe(error: BaseException) -> str:
    """A short, never empty, description of a failed request."""
    if isinstance(error, ApiException):
        return f"HTTP {error.status} {error.reason or ''}".strip()
    if isinstance(error, MaxRetryError) and error.reason is not None:
        error = error.reason
    detail = str(error).strip()
    text = f"{type(error).__name__}: {detail}" if detail else type(error).__name__
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

    def list(self, *, limit: Optional[int], continue_token: Optional[str], timeout: tuple[float, float]) -> bytes:
        """The body of one list (or one page of it)."""

    def watch(self, *, resource_version: str, timeout_seconds: int, timeout: tuple[float, float]) -> "Stream":
        """
        Open a watch from C{resource_version} (returns once the server has
        answered); the stream yields its lines as they arrive.
        """


class Stream(Protocol):
    """An open watch: its lines (one JSON event each), and a way to close it."""

    def __iter__(self) -> Iterator[bytes]: ...

    def close(self) -> None: ...


class _PathLister:
    """
    A L{Lister} of the collection at C{path}; C{query} goes with every
    request, C{list_accept} and C{watch_accept} say what lists and watches
    ask for.
    """

    def __init__(
        self,
        client: "KubeClient",
        path: str,
        *,
        query: tuple[tuple[str, str], ...] = (),
        list_accept: str = "application/json",
        watch_accept: str = "application/json",
    ) -> None:
        self._client = client
        self._path = path
        self._query = query
        self._list_accept = list_accept
        self._watch_accept = watch_accept

    def list(self, *, limit: Optional[int], continue_token: Optional[str], timeout: tuple[float, float]) -> bytes:
        query = list(self._query)
        if limit:
            query.append(("limit", str(limit)))
        if continue_token:
            query.append(("continue", continue_token))
        return self._client.request("GET", self._path, query=query, accept=self._list_accept, timeout=timeout)

    def watch(self, *, resource_version: str, timeout_seconds: int, timeout: tuple[float, float]) -> "_ResponseStream":
        query = [
            *self._query,
            ("watch", "true"),
            ("resourceVersion", resource_version),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(timeout_seconds)),
        ]
        return _ResponseStream(
            self._client.open("GET", self._path, query=query, accept=self._watch_accept, timeout=timeout)
        )


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

#: Ask for metadata only (the API server's PartialObjectMetadata), so that a
#: Pod list or watch carries no spec or status.
METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
METADATA = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
#: The field manager of what amp applies (its managed registration).
FIELD_MANAGER = "amp"


class Conflict(Exception):
    """The object exists already, or changed since it was read (HTTP 409)."""


class KubeClient:
    """
    One C{ApiClient} and the sockets it opened.  Built on the reactor
    (cheap); everything else blocks and runs in a watch thread or the
    reactor's thread pool.

    Requests go through C{ApiClient.param_serialize} and C{call_api} (the
    client's configuration, authentication and connection pool) with the
    API paths written here, not through the generated API classes:
    importing the modules of C{CoreV1Api} and C{AdmissionregistrationV1Api}
    costs 25 MiB of resident memory and 1.1 s of CPU (5.4 s of wall time on
    the busy 2-core machine of the end-to-end tests), which delayed every
    start's first namespace list; amp reads the answers as JSON anyway.
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

    def fork(self) -> "KubeClient":
        """Another client on the same configuration, with sockets of its own to cut."""
        return KubeClient(self._configuration)

    # ------------------------------------------------------------ requests

    def open(
        self,
        method: str,
        path: str,
        *,
        query: Iterable[tuple[str, str]] = (),
        accept: str = "application/json",
        body: Any = None,
        timeout: Any,
        content_type: str = "application/json",
    ) -> Any:
        """
        Send one request; the response, its body not read yet.

        @raise ApiException: for an answer that is not 2xx.
        """
        headers = {"Accept": accept}
        if body is not None:
            headers["Content-Type"] = content_type
        request = self.api.param_serialize(
            method=method,
            resource_path=path,
            query_params=list(query),
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        response = self.api.call_api(*request, _request_timeout=timeout)
        if not 200 <= response.status <= 299:
            response.read()
            raise ApiException.from_response(http_resp=response, body=None, data=None)
        return response.response

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Iterable[tuple[str, str]] = (),
        accept: str = "application/json",
        body: Any = None,
        timeout: Any,
        content_type: str = "application/json",
    ) -> bytes:
        """One request; its body."""
        response = self.open(
            method, path, query=query, accept=accept, body=body, timeout=timeout, content_type=content_type
        )
        try:
            data: bytes = response.data
            return data
        finally:
            response.release_conn()

    # ------------------------------------------------------------ what amp reads and writes

    def namespaces(self) -> Lister:
        return _PathLister(self, "/api/v1/namespaces")

    def webhook_configuration(self, name: str) -> Lister:
        return _PathLister(
            self,
            "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
            query=(("fieldSelector", f"metadata.name={name}"),),
        )

    def pod_metadata(self) -> Lister:
        """Every Pod of the cluster, metadata only."""
        return _PathLister(self, "/api/v1/pods", list_accept=METADATA_LIST, watch_accept=METADATA)

    def read_namespace(self, name: str, timeout: float) -> Optional[bytes]:
        """The Namespace's JSON, or None when it does not exist."""
        try:
            return self.request("GET", f"/api/v1/namespaces/{_segment(name)}", timeout=timeout)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def create_event(self, namespace: str, body: dict[str, Any], timeout: float) -> bool:
        """Create a core/v1 Event: True, or False when one of that name exists already (409)."""
        try:
            self.request("POST", f"/api/v1/namespaces/{_segment(namespace)}/events", body=body, timeout=timeout)
        except ApiException as e:
            if e.status != 409:
                raise
            return False
        return True

    def apply_webhook_configuration(self, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        """
        Server-side apply of a MutatingWebhookConfiguration under the field
        manager C{amp}, forcing conflicts (amp owns what it applies); the
        object as stored.
        """
        name = body["metadata"]["name"]
        stored: dict[str, Any] = json.loads(
            self.request(
                "PATCH",
                f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{_segment(name)}",
                query=(("fieldManager", FIELD_MANAGER), ("force", "true")),
                body=json.dumps(body),
                content_type="application/apply-patch+yaml",
                timeout=timeout,
            )
        )
        return stored

    def _leases(self, namespace: str) -> str:
        return f"/apis/coordination.k8s.io/v1/namespaces/{_segment(namespace)}/leases"

    def read_lease(self, namespace: str, name: str, timeout: float) -> Optional[dict[str, Any]]:
        """The Lease, or None when it does not exist."""
        try:
            lease: dict[str, Any] = json.loads(
                self.request("GET", f"{self._leases(namespace)}/{_segment(name)}", timeout=timeout)
            )
            return lease
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def create_lease(self, namespace: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        """
        @raise Conflict: another replica created it first.
        """
        return self._write_lease("POST", self._leases(namespace), body, timeout)

    def replace_lease(self, namespace: str, name: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        """
        Replace the Lease if it is still at C{body}'s resourceVersion.

        @raise Conflict: it changed since it was read.
        """
        return self._write_lease("PUT", f"{self._leases(namespace)}/{_segment(name)}", body, timeout)

    def _write_lease(self, method: str, path: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        try:
            written: dict[str, Any] = json.loads(self.request(method, path, body=body, timeout=timeout))
            return written
        except ApiException as e:
            if e.status == 409:
                raise Conflict(describe(e)) from None
            raise

    def _secrets(self, namespace: str) -> str:
        return f"/api/v1/namespaces/{_segment(namespace)}/secrets"

    def read_secret(self, namespace: str, name: str, timeout: float) -> Optional[dict[str, Any]]:
        """The Secret (amp's own certificates), or None when it does not exist."""
        try:
            secret: dict[str, Any] = json.loads(
                self.request("GET", f"{self._secrets(namespace)}/{_segment(name)}", timeout=timeout)
            )
            return secret
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def create_secret(self, namespace: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        """
        @raise Conflict: it exists already.
        """
        return self._write_lease("POST", self._secrets(namespace), body, timeout)

    def replace_secret(self, namespace: str, name: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        """
        Replace the Secret if it is still at C{body}'s resourceVersion.

        @raise Conflict: it changed since it was read.
        """
        return self._write_lease("PUT", f"{self._secrets(namespace)}/{_segment(name)}", body, timeout)

    def annotate_secret(self, namespace: str, name: str, annotations: dict[str, Optional[str]], timeout: float) -> None:
        """Set (None: remove) annotations of the Secret, by a merge patch (no resourceVersion: no conflict)."""
        self.request(
            "PATCH",
            f"{self._secrets(namespace)}/{_segment(name)}",
            body={"metadata": {"annotations": annotations}},
            content_type="application/merge-patch+json",
            timeout=timeout,
        )

    def cut(self) -> None:
        """Shut down every socket, now and from now on (any thread)."""
        self._connections.cut()

    def close(self) -> None:
        self.api.close()


def _segment(name: str) -> str:
    """A name as one path segment."""
    return urllib.parse.quote(name, safe="")


def get_namespace(
    client: Any, parse: Callable[[bytes], NamespaceInfo], name: str, timeout: float
) -> Optional[NamespaceInfo]:
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


#: Where a Pod's service account token mount says which namespace it runs in.
SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def service_account_namespace(path: str = SERVICE_ACCOUNT_NAMESPACE) -> Optional[str]:
    """amp's own namespace when it runs in a cluster; None elsewhere."""
    try:
        with open(path) as f:
            return f.read().strip() or None
    except OSError:
        return None
