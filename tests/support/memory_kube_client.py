"""
In-memory Kubernetes for the unit tests of amp.kube: no sockets, no threads,
no time.

- L{ScriptedLister}: a L{amp.kube._client.Lister} that answers each list and
  watch from a script written by the test (bodies, events, errors, and
  steps that advance a clock or set the stop flag), so that a
  L{amp.kube._watch.ListWatch} runs synchronously in the test.
- L{MemoryKube}: the client facade the reactor side uses
  (L{amp.kube._client.KubeClient}'s methods) over dictionaries: namespaces
  for GETs, Leases with resourceVersion conflicts, Events unique by name,
  the managed registration's applies.
- L{ThreadReactor}: a C{MemoryReactorClock} with C{callFromThread} (run at
  once, or queued until L{ThreadReactor.deliver}) and a thread pool whose
  calls run only when the test says (L{ManualThreadPool.run}).
- L{Threads}: a C{spawn} that records the watch threads instead of starting
  them; a test runs one with L{FakeThread.run}.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from typing import Any, Callable, Iterable, Iterator, Optional

from kubernetes.client.exceptions import ApiException
from twisted.internet.testing import MemoryReactorClock

from amp.kube._client import Conflict


def api_error(status: int, reason: str = "") -> ApiException:
    """What the kubernetes client raises for an HTTP error answer."""
    return ApiException(
        status=status,
        reason=reason
        or {
            404: "Not Found",
            409: "Conflict",
            410: "Gone",
            500: "Internal Server Error",
            503: "Service Unavailable",
        }.get(status, "Error"),
    )


def namespace(
    name: str, rv: str = "1", labels: Optional[dict] = None, annotations: Optional[dict] = None, **metadata: Any
) -> dict[str, Any]:
    """A Namespace as the API server sends it."""
    return {
        "metadata": {
            "name": name,
            "resourceVersion": rv,
            "labels": labels or {},
            "annotations": annotations or {},
            **metadata,
        },
        "spec": {"finalizers": ["kubernetes"]},
        "status": {"phase": "Active"},
    }


def pod(
    namespace: str,
    name: str,
    created: str,
    *,
    uid: Optional[str] = None,
    labels: Optional[dict] = None,
    annotations: Optional[dict] = None,
    owner: Optional[str] = None,
    rv: str = "1",
    **metadata: Any,
) -> dict[str, Any]:
    """A Pod's PartialObjectMetadata, as the metadata-only list and watch send it."""
    meta: dict[str, Any] = {
        "namespace": namespace,
        "name": name,
        "uid": uid or f"uid-{namespace}-{name}",
        "resourceVersion": rv,
        "creationTimestamp": created,
        **metadata,
    }
    if labels:
        meta["labels"] = labels
    if annotations:
        meta["annotations"] = annotations
    if owner:
        meta["ownerReferences"] = [
            {"apiVersion": "apps/v1", "kind": owner, "name": f"{name}-owner", "uid": "owner-uid", "controller": True}
        ]
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": meta}


def event(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    return {"type": kind, "object": obj}


def bookmark(rv: str) -> dict[str, Any]:
    return {"type": "BOOKMARK", "object": {"kind": "Namespace", "metadata": {"resourceVersion": rv}}}


def expired_event(message: str = "too old resource version: 5 (8)") -> dict[str, Any]:
    return {
        "type": "ERROR",
        "object": {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "reason": "Expired",
            "code": 410,
            "message": message,
        },
    }


def list_body(items: Iterable[dict[str, Any]], rv: str, continue_token: Optional[str] = None) -> bytes:
    metadata: dict[str, Any] = {"resourceVersion": rv}
    if continue_token:
        metadata["continue"] = continue_token
    return json.dumps({"kind": "List", "metadata": metadata, "items": list(items)}).encode()


class _Stream:
    def __init__(self, steps: list[Any]) -> None:
        self._steps = steps
        self.closed = False

    def __iter__(self) -> Iterator[bytes]:
        for step in self._steps:
            if isinstance(step, BaseException):
                raise step
            if callable(step):
                step()
            elif isinstance(step, bytes):
                yield step
            else:
                yield json.dumps(step).encode()

    def close(self) -> None:
        self.closed = True


class ScriptedLister:
    """
    Answers lists and watches from scripts, in order.

    C{lists} items are a body (bytes), an exception to raise, or a callable
    returning one of those.  C{watches} items are an exception (the watch
    request fails) or a list of steps: an event (dict) or raw line (bytes)
    is sent, an exception is raised mid-stream, a callable is called (to
    advance a clock, set the stop flag); the end of the list ends the stream
    as the server's timeout does.  When a script runs out, the lister sets
    C{stop} and ends quietly, so C{ListWatch.run} returns: C{stop} must be
    the loop's own flag (C{ListWatch.stopping}).
    """

    def __init__(self, stop: threading.Event, lists: Iterable[Any] = (), watches: Iterable[Any] = ()) -> None:
        self.stop = stop
        self.lists: deque[Any] = deque(lists)
        self.watches: deque[Any] = deque(watches)
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.streams: list[_Stream] = []

    def list(self, *, limit: Optional[int], continue_token: Optional[str], timeout: tuple[float, float]) -> bytes:
        self.calls.append(("list", {"limit": limit, "continue": continue_token, "timeout": timeout}))
        if not self.lists:
            self.stop.set()
            return list_body([], "0")
        answer = self.lists.popleft()
        if callable(answer) and not isinstance(answer, BaseException):
            answer = answer()
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def watch(self, *, resource_version: str, timeout_seconds: int, timeout: tuple[float, float]) -> _Stream:
        self.calls.append(
            ("watch", {"resource_version": resource_version, "timeout_seconds": timeout_seconds, "timeout": timeout})
        )
        if not self.watches:
            self.stop.set()
            stream = _Stream([])
        else:
            script = self.watches.popleft()
            if isinstance(script, BaseException):
                raise script
            stream = _Stream(list(script))
        self.streams.append(stream)
        return stream

    def requests(self, what: str) -> list[dict[str, Any]]:
        return [kwargs for call, kwargs in self.calls if call == what]


class MemoryKube:
    """
    The client facade over dictionaries: C{namespaces} by name (API
    objects); C{errors} maps a namespace name to the exception its next
    GET raises.
    """

    host = "memory"

    def __init__(self) -> None:
        self.namespace_objects: dict[str, dict[str, Any]] = {}
        self.errors: dict[str, BaseException] = {}
        self.gets: list[tuple[str, float]] = []
        self.cut_calls = 0
        self.closed = False
        self.stop = threading.Event()
        self.listers: dict[str, ScriptedLister] = {}
        self.leases: dict[tuple[str, str], dict[str, Any]] = {}
        self.lease_rv = 0
        #: When set, every Lease call raises it (the API server is away).
        self.lease_error: Optional[BaseException] = None
        self.lease_calls: list[tuple[str, str]] = []
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.event_names: set[tuple[str, str]] = set()
        self.event_error: Optional[BaseException] = None
        self.forks: list[MemoryKube] = []
        #: The managed registration's applies (bodies), and the objects they left.
        self.applies: list[dict[str, Any]] = []
        self.webhook_objects: dict[str, dict[str, Any]] = {}
        #: When set, every apply raises it.
        self.apply_error: Optional[BaseException] = None
        #: Secrets (amp's own certificates) by (namespace, name); their writes and reports, in order.
        self.secrets: dict[tuple[str, str], dict[str, Any]] = {}
        self.secret_rv = 0
        self.secret_writes: list[str] = []
        #: When set, every Secret call raises it.
        self.secret_error: Optional[BaseException] = None

    def add_namespace(self, name: str, **kwargs: Any) -> None:
        self.namespace_objects[name] = namespace(name, **kwargs)

    def _lister(self, name: str) -> ScriptedLister:
        return self.listers.setdefault(name, ScriptedLister(self.stop))

    def namespaces(self) -> ScriptedLister:
        return self._lister("namespaces")

    def webhook_configuration(self, name: str) -> ScriptedLister:
        return self._lister("webhook")

    def pod_metadata(self) -> ScriptedLister:
        return self._lister("pods")

    def fork(self) -> "MemoryKube":
        """A client with sockets of its own (its own cut and close), on the same listers."""
        child = MemoryKube()
        child.listers = self.listers
        child.stop = self.stop
        self.forks.append(child)
        return child

    def _check_open(self) -> None:
        if self.cut_calls or self.closed:
            raise OSError("the client's sockets were shut down")

    def create_event(self, namespace: str, body: dict[str, Any], timeout: float) -> bool:
        """Events are unique by name in their namespace, as the API server keeps them: False for a second one."""
        self._check_open()
        if self.event_error is not None:
            raise self.event_error
        key = (namespace, body["metadata"]["name"])
        if key in self.event_names:
            return False
        self.event_names.add(key)
        self.events.append((namespace, body))
        return True

    def _lease_call(self, what: str, identity: str) -> None:
        self._check_open()
        self.lease_calls.append((what, identity))
        if self.lease_error is not None:
            raise self.lease_error

    def read_lease(self, namespace: str, name: str, timeout: float) -> Optional[dict[str, Any]]:
        self._lease_call("read", "")
        lease = self.leases.get((namespace, name))
        return json.loads(json.dumps(lease)) if lease is not None else None

    def _store(self, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        self.lease_rv += 1
        stored = json.loads(json.dumps(body))
        stored["metadata"]["resourceVersion"] = str(self.lease_rv)
        self.leases[(namespace, name)] = stored
        return json.loads(json.dumps(stored))

    def create_lease(self, namespace: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        self._lease_call("create", body["spec"].get("holderIdentity") or "")
        name = body["metadata"]["name"]
        if (namespace, name) in self.leases:
            raise Conflict("HTTP 409 Conflict")
        return self._store(namespace, name, body)

    def replace_lease(self, namespace: str, name: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        self._lease_call("replace", body["spec"].get("holderIdentity") or "")
        current = self.leases.get((namespace, name))
        if current is None:
            raise api_error(404)
        if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
            raise Conflict("HTTP 409 Conflict")
        return self._store(namespace, name, body)

    def apply_webhook_configuration(self, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Server-side apply, as far as amp's managed registration needs it: the object becomes C{body}."""
        self._check_open()
        self.applies.append(json.loads(json.dumps(body)))
        if self.apply_error is not None:
            raise self.apply_error
        self.webhook_objects[body["metadata"]["name"]] = json.loads(json.dumps(body))
        return json.loads(json.dumps(body))

    def _secret_call(self, what: str) -> None:
        self._check_open()
        self.secret_writes.append(what)
        if self.secret_error is not None:
            raise self.secret_error

    def _keep_secret(self, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        self.secret_rv += 1
        stored = json.loads(json.dumps(body))
        stored["metadata"]["resourceVersion"] = str(self.secret_rv)
        self.secrets[(namespace, name)] = stored
        return json.loads(json.dumps(stored))

    def read_secret(self, namespace: str, name: str, timeout: float) -> Optional[dict[str, Any]]:
        self._secret_call("read")
        secret = self.secrets.get((namespace, name))
        return json.loads(json.dumps(secret)) if secret is not None else None

    def create_secret(self, namespace: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        self._secret_call("create")
        if (namespace, body["metadata"]["name"]) in self.secrets:
            raise Conflict("HTTP 409 Conflict")
        return self._keep_secret(namespace, body["metadata"]["name"], body)

    def replace_secret(self, namespace: str, name: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        self._secret_call("replace")
        current = self.secrets.get((namespace, name))
        if current is None:
            raise api_error(404)
        if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
            raise Conflict("HTTP 409 Conflict")
        return self._keep_secret(namespace, name, body)

    def annotate_secret(self, namespace: str, name: str, annotations: dict[str, Optional[str]], timeout: float) -> None:
        self._secret_call("annotate")
        current = self.secrets.get((namespace, name))
        if current is None:
            raise api_error(404)
        kept = current["metadata"].setdefault("annotations", {})
        for key, value in annotations.items():
            if value is None:
                kept.pop(key, None)
            else:
                kept[key] = value
        self._keep_secret(namespace, name, current)

    def holder(self, namespace: str = "amp-system", name: str = "amp-bypass-reporter") -> Optional[str]:
        lease = self.leases.get((namespace, name))
        return (lease["spec"].get("holderIdentity") or None) if lease else None

    def read_namespace(self, name: str, timeout: float) -> Optional[bytes]:
        self._check_open()
        self.gets.append((name, timeout))
        if name in self.errors:
            raise self.errors.pop(name)
        obj = self.namespace_objects.get(name)
        return None if obj is None else json.dumps(obj).encode()

    def cut(self) -> None:
        self.cut_calls += 1

    def close(self) -> None:
        self.closed = True


class ManualThreadPool:
    """A thread pool whose work runs when the test calls L{run}."""

    def __init__(self) -> None:
        self.queue: list[tuple[Callable[..., Any], Callable[..., Any], tuple, dict]] = []

    def callInThreadWithCallback(
        self, onResult: Callable[[bool, Any], None], func: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> None:
        self.queue.append((onResult, func, args, kwargs))

    def run(self) -> int:
        """Run everything queued (and queued meanwhile); returns how many."""
        done = 0
        while self.queue:
            on_result, func, args, kwargs = self.queue.pop(0)
            try:
                result = func(*args, **kwargs)
            except BaseException:
                from twisted.python.failure import Failure

                on_result(False, Failure())
            else:
                on_result(True, result)
            done += 1
        return done


class ThreadReactor(MemoryReactorClock):
    """
    C{MemoryReactorClock} plus what threads use: C{callFromThread} runs the
    call at once (C{queue_from_threads=False}) or keeps it until
    L{deliver}, and C{getThreadPool} is a L{ManualThreadPool}.
    """

    def __init__(self, queue_from_threads: bool = False) -> None:
        super().__init__()
        self.queue_from_threads = queue_from_threads
        self.from_threads: list[tuple[Callable[..., Any], tuple, dict]] = []
        self.pool = ManualThreadPool()

    def callFromThread(self, f: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        if self.queue_from_threads:
            self.from_threads.append((f, args, kwargs))
        else:
            f(*args, **kwargs)

    def deliver(self) -> int:
        """Run the queued C{callFromThread} calls in order; returns how many."""
        done = 0
        while self.from_threads:
            f, args, kwargs = self.from_threads.pop(0)
            f(*args, **kwargs)
            done += 1
        return done

    def getThreadPool(self) -> ManualThreadPool:
        return self.pool


class FakeThread:
    """A watch thread that has not run: L{run} runs its target here and now."""

    def __init__(self, name: str, target: Callable[[], None]) -> None:
        self.name = name
        self.target = target
        self.ran = False

    def run(self) -> None:
        self.ran = True
        self.target()

    def is_alive(self) -> bool:
        return not self.ran


class Threads:
    """A C{spawn} that records threads instead of starting them."""

    def __init__(self) -> None:
        self.started: list[FakeThread] = []

    def __call__(self, name: str, target: Callable[[], None]) -> FakeThread:
        thread = FakeThread(name, target)
        self.started.append(thread)
        return thread

    def named(self, name: str) -> FakeThread:
        [thread] = [t for t in self.started if t.name == name]
        return thread

    def run_all(self) -> None:
        for thread in self.started:
            if not thread.ran:
                thread.run()
