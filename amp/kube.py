"""
The Kubernetes namespace source: a warm cache of every Namespace's labels and
annotations, kept current by a list+watch running in a thread of its own and
bridged into the reactor.

L{KubernetesNamespaceSource} owns:

  - the client configuration (in-cluster service account or a kubeconfig),
    loaded into a fresh C{kubernetes.client.Configuration} at start;
  - one daemon thread per watched kind: the namespace watch, and, when
    C{kubernetes.webhook_configuration} is set, a second one for amp's own
    MutatingWebhookConfiguration (two independent streams with their own
    resourceVersions and failures; one thread alternating between two
    blocking reads could starve one of them, so each gets a thread);
  - the cache itself, which only the reactor thread reads or writes: the
    threads hand every list and event over with C{reactor.callFromThread};
  - cache misses: one bounded GET in the reactor's thread pool, shared by
    concurrent callers, with 404s remembered briefly.

The threads never block for long: every request has a connect and read
timeout, waits between retries are C{threading.Event.wait}, and stopping
shuts down the sockets the client opened so a blocked read returns at once.
Only what amp reads is kept: the enable label, amp's annotations and the
resourceVersion, never whole objects.
"""

from __future__ import annotations

import json
import random as _random
import socket
import sys
import threading
import time
import types
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Optional

import kubernetes.client
import kubernetes.config
import urllib3
from kubernetes.client.exceptions import ApiException
from twisted.application.service import Service
from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger
from twisted.python.failure import Failure
from urllib3.exceptions import MaxRetryError, ProtocolError, ReadTimeoutError
from zope.interface import implementer

from amp.config import KubernetesConfig
from amp.metrics import Metrics
from amp.namespaces import UNKNOWN, CachedAnswer, INamespaceSource, NamespaceLookupError
from amp.policy import NamespaceInfo

#: How long C{stopService} waits for the threads before giving up on them
#: (they are daemon threads; after a socket shutdown they end at once).
STOP_WAIT = 2.0
_STOP_POLL = 0.01

_EMPTY: Mapping[str, str] = types.MappingProxyType({})
_NEGATIVE_PRUNE_AT = 1024


def backoff_delay(attempt: int, initial: float, cap: float, random: Callable[[], float]) -> float:
    """
    Seconds to wait before retry number C{attempt} (0 for the first): "full
    jitter", uniform in M{[0, min(cap, initial * 2 ** attempt))}, so that
    many amp replicas do not reconnect in step after an API server restart.
    """
    ceiling = min(cap, initial * 2.0 ** min(max(attempt, 0), 64))
    return random() * ceiling


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


# ------------------------------------------------------------ what is kept


class _Keep:
    """
    The label and annotations amp reads; every other key is dropped.  The
    kept keys are these very string objects, shared by every namespace.
    """

    def __init__(self, config: KubernetesConfig) -> None:
        self.label = config.enabled_label
        self.annotations = tuple(dict.fromkeys((
            *config.endpoint_annotations, config.validation_annotation,
            config.failure_policy_annotation, config.mode_annotation)))

    def namespace(self, obj: Mapping[str, Any]) -> NamespaceInfo:
        meta = obj.get("metadata") or {}
        labels = meta.get("labels") or {}
        value = labels.get(self.label)
        kept_labels: Mapping[str, str] = {self.label: sys.intern(value)} if isinstance(value, str) else _EMPTY
        annotations = meta.get("annotations") or {}
        kept: dict[str, str] = {}
        if annotations:
            for key in self.annotations:
                v = annotations.get(key)
                if isinstance(v, str):
                    kept[key] = v
        return NamespaceInfo(str(meta.get("name", "")), kept_labels, kept or _EMPTY,
                             str(meta.get("resourceVersion", "")))

    def namespace_list(self, body: bytes) -> tuple[dict[str, NamespaceInfo], str]:
        doc = json.loads(body)
        items = {}
        for obj in doc.get("items") or ():
            info = self.namespace(obj)
            items[info.name] = info
        return items, str((doc.get("metadata") or {}).get("resourceVersion", ""))


def webhook_failure_policy(obj: Optional[Mapping[str, Any]], webhook_name: Optional[str]) -> Optional[str]:
    """
    The C{failurePolicy} of the webhook entry named C{webhook_name} (the
    first entry when None) of a MutatingWebhookConfiguration; C{Fail}, the
    API's default, when the entry has none; None when there is no such entry.
    """
    if not obj:
        return None
    for hook in obj.get("webhooks") or ():
        if webhook_name is None or hook.get("name") == webhook_name:
            policy = hook.get("failurePolicy")
            return policy if isinstance(policy, str) and policy else "Fail"
    return None


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


# ------------------------------------------------------------ the watch thread


class _Expired(Exception):
    """The watch's resourceVersion is too old (410 Gone): relist."""


class _WatchError(Exception):
    """An ERROR event other than 410."""


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


def _describe(error: BaseException) -> str:
    if isinstance(error, ApiException):
        return f"HTTP {error.status} {error.reason or ''}".strip()
    if isinstance(error, MaxRetryError) and error.reason is not None:
        error = error.reason
    text = f"{type(error).__name__}: {error}"
    return text if len(text) <= 300 else text[:297] + "..."


def _reason(error: BaseException, streaming: bool) -> str:
    if isinstance(error, MaxRetryError) and error.reason is not None:
        error = error.reason
    if isinstance(error, (ReadTimeoutError, socket.timeout)):
        return "stalled"
    if streaming and isinstance(error, (ProtocolError, OSError)):
        return "dropped"
    return "error"


@dataclass
class _Run:
    """One start of the service: its stop flag and threads."""

    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)


class _ListWatch:
    """
    List, then watch from the list's resourceVersion, forever, for one kind;
    runs in its own thread and hands everything to C{deliver} (which crosses
    to the reactor).

    C{deliver("replace", result, rv)} after each list (C{result} is what
    C{parse_list} made of the body); C{deliver("event", type, obj, rv)} for
    ADDED/MODIFIED/DELETED (C{obj} is what C{parse_object} made of it);
    C{deliver("bookmark", rv)}; C{deliver("restart", reason, error, delay)}
    before each retry.
    """

    def __init__(
        self,
        *,
        list_call: Callable[..., Any],
        parse_list: Callable[[bytes], tuple[Any, str]],
        parse_object: Callable[[Mapping[str, Any]], Any],
        deliver: Callable[..., None],
        stop: threading.Event,
        config: KubernetesConfig,
        random: Callable[[], float],
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._list_call = list_call
        self._parse_list = parse_list
        self._parse_object = parse_object
        self._deliver = deliver
        self._stop = stop
        self._config = config
        self._random = random
        self._monotonic = monotonic
        self.resource_version: Optional[str] = None
        connect = config.request_timeout
        self._list_timeout = (connect, config.request_timeout)
        self._server_timeout = max(1, int(round(config.watch_timeout)))
        # Longer than the server's own timeout: a stream that stays silent
        # past it (no event, no bookmark, no end) is dead and is restarted.
        self._watch_timeout = (connect, self._server_timeout + config.request_timeout)
        self._progress = False
        self._streaming = False

    def run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            self._progress = False
            self._streaming = False
            error = ""
            try:
                if self.resource_version is None:
                    self._list()
                started = self._monotonic()
                events = self._watch()
                reason = "timeout"
                if events == 0 and self._monotonic() - started < self._server_timeout / 2:
                    error = "the watch ended early without events"
                else:
                    self._progress = True
            except _Expired as e:
                self.resource_version = None
                reason, error = "expired", str(e)
            except Exception as e:
                if self._stop.is_set():
                    break
                reason, error = _reason(e, self._streaming), _describe(e)
            if self._stop.is_set():
                break
            if self._progress:
                failures = 0
            if self._progress and reason == "timeout":
                delay = 0.0
            elif reason == "expired" and failures == 0:
                delay = 0.0
                failures += 1
            else:
                delay = backoff_delay(failures, self._config.backoff_initial, self._config.backoff_max,
                                      self._random)
                failures += 1
            self._deliver("restart", reason, error, delay)
            if delay > 0:
                self._stop.wait(delay)

    def _list(self) -> None:
        response = self._list_call(_preload_content=False, _request_timeout=self._list_timeout)
        try:
            body = response.data
        finally:
            response.release_conn()
        result, rv = self._parse_list(body)
        self._deliver("replace", result, rv)
        self.resource_version = rv

    def _watch(self) -> int:
        """
        One watch request; returns the number of events when the server
        ends the stream, raises otherwise.
        """
        response = self._list_call(
            watch=True, resource_version=self.resource_version, allow_watch_bookmarks=True,
            timeout_seconds=self._server_timeout, _request_timeout=self._watch_timeout,
            _preload_content=False)
        self._streaming = True
        events = 0
        try:
            for line in _lines(response):
                if self._stop.is_set():
                    break
                event = json.loads(line)
                kind = event.get("type")
                obj = event.get("object") or {}
                rv = str((obj.get("metadata") or {}).get("resourceVersion", ""))
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    self._deliver("event", kind, self._parse_object(obj), rv)
                elif kind == "BOOKMARK":
                    self._deliver("bookmark", rv)
                elif kind == "ERROR":
                    code, message = obj.get("code"), obj.get("message", "")
                    if code == 410:
                        raise _Expired(f"{obj.get('reason', 'Expired')}: {message}")
                    raise _WatchError(f"ERROR event {code} {obj.get('reason', '')}: {message}")
                else:
                    continue
                events += 1
                self._progress = True
                if rv:
                    self.resource_version = rv
        except ApiException as e:
            if e.status == 410:
                raise _Expired(_describe(e)) from None
            raise
        finally:
            response.close()
            response.release_conn()
        return events

    def call(self) -> None:
        try:
            self.run()
        except BaseException as e:  # a bug: say so rather than die silently
            self._deliver("crashed", _describe(e))


def _list_call_410(call: Callable[..., Any]) -> Callable[..., Any]:
    """A list/watch call whose HTTP 410 answer becomes L{_Expired}."""

    def wrapped(**kwargs: Any) -> Any:
        try:
            return call(**kwargs)
        except ApiException as e:
            if e.status == 410:
                raise _Expired(_describe(e)) from None
            raise

    return wrapped


# ------------------------------------------------------------ the service


@dataclass(eq=False)
class _Pending:
    """One GET in flight and the callers waiting for it."""

    waiters: list[Deferred] = field(default_factory=list)
    superseded: bool = False


@implementer(INamespaceSource)
class KubernetesNamespaceSource(Service):
    """
    Namespaces from the Kubernetes API, cached in memory and kept current by
    a watch (see the module docstring).

    @param config: the C{kubernetes} section.
    @param reactor: for C{callFromThread}, its thread pool and stop polling.
    @param metrics: where to report (a fresh L{Metrics} if None).
    @param clock: the time source for the negative-cache TTL and "last event
        ago" (the reactor if None).
    @param random: M{[0, 1)} for backoff jitter.
    """

    log = Logger()

    def __init__(
        self,
        config: KubernetesConfig,
        *,
        reactor: Any,
        metrics: Optional[Metrics] = None,
        clock: Optional[IReactorTime] = None,
        random: Callable[[], float] = _random.random,
        on_first_list: Optional[Callable[[], None]] = None,
    ) -> None:
        """
        @param on_first_list: called once, on the reactor thread, when the
            first namespace list has landed.
        """
        self._config = config
        self._on_first_list = on_first_list
        self._reactor = reactor
        self._clock: IReactorTime = clock if clock is not None else reactor
        self._metrics = metrics if metrics is not None else Metrics()
        self._random = random
        self._keep = _Keep(config)
        self._cache: dict[str, NamespaceInfo] = {}
        self._negative: dict[str, float] = {}
        self._pending: dict[str, _Pending] = {}
        self._listed = False
        self._last_event: Optional[float] = None
        self._last_error = ""
        self._config_error: Optional[str] = None
        self._webhook_policy: Optional[str] = None
        self._webhook_listed = False
        self._webhook_error = ""
        self._rv = ""
        self._run: Optional[_Run] = None
        self._api: Optional[kubernetes.client.ApiClient] = None
        self._connections: Optional[_Connections] = None
        self._threads: list[threading.Thread] = []

    # ------------------------------------------------------------ lifecycle

    def startService(self) -> None:
        super().startService()
        self._reset()
        config = self._config
        try:
            cfg = load_client_configuration(config)
        except Exception as e:
            where = "in-cluster service account" if config.source == "cluster" else (
                f"kubeconfig {config.kubeconfig or '(default)'}"
                + (f" context {config.context}" if config.context else ""))
            self._config_error = f"cannot load the Kubernetes client configuration from {where}: {_describe(e)}"
            self.log.error("{detail}", detail=self._config_error)
            return
        self._api = kubernetes.client.ApiClient(cfg)
        self._connections = _Connections()
        self._connections.install(self._api)
        run = self._run = _Run()
        self._threads = run.threads
        api = self._api
        # The API classes are built in the threads: the first one imports a
        # large generated module, which must not hold up the reactor.

        def list_namespaces(**kwargs: Any) -> Any:
            return kubernetes.client.CoreV1Api(api).list_namespace(**kwargs)

        if not config.per_review_get:
            watch = _ListWatch(
                list_call=_list_call_410(list_namespaces), parse_list=self._keep.namespace_list,
                parse_object=self._keep.namespace, deliver=self._bridge(run, self._namespace_news),
                stop=run.stop, config=config, random=self._random)
            run.threads.append(threading.Thread(target=watch.call, name="amp-namespace-watch", daemon=True))
        if config.webhook_configuration:
            name = config.webhook_configuration
            def list_webhook_configuration(**kwargs: Any) -> Any:
                adm = kubernetes.client.AdmissionregistrationV1Api(api)
                return adm.list_mutating_webhook_configuration(field_selector=f"metadata.name={name}", **kwargs)

            def parse_list(body: bytes) -> tuple[Any, str]:
                doc = json.loads(body)
                found = [o for o in doc.get("items") or () if (o.get("metadata") or {}).get("name") == name]
                policy = webhook_failure_policy(found[0] if found else None, config.webhook_name)
                return policy, str((doc.get("metadata") or {}).get("resourceVersion", ""))

            watch = _ListWatch(
                list_call=_list_call_410(list_webhook_configuration), parse_list=parse_list,
                parse_object=lambda obj: webhook_failure_policy(obj, config.webhook_name),
                deliver=self._bridge(run, self._webhook_news), stop=run.stop, config=config,
                random=self._random)
            run.threads.append(threading.Thread(target=watch.call, name="amp-webhook-watch", daemon=True))
        self.log.info("Kubernetes namespace source on {host} ({mode})", host=cfg.host,
                      mode="per-review GET" if config.per_review_get else "watch")
        for thread in run.threads:
            thread.start()

    def stopService(self) -> Optional[Deferred]:
        """
        Stop the threads: set their stop flag and shut down the client's
        sockets so any blocked read returns.  The Deferred fires once every
        thread has ended (polled on the reactor, never blocking it), or
        after L{STOP_WAIT} seconds with a warning.
        """
        super().stopService()
        run, self._run = self._run, None
        api, self._api = self._api, None
        if run is not None:
            run.stop.set()
        if self._connections is not None:
            self._connections.cut()
        if run is None:
            if api is not None:
                api.close()
            return None
        done: Deferred = Deferred()
        polls = int(STOP_WAIT / _STOP_POLL)

        def poll(left: int) -> None:
            alive = [t for t in run.threads if t.is_alive()]
            if alive and left > 0:
                self._reactor.callLater(_STOP_POLL, poll, left - 1)
                return
            if alive:
                self.log.warn("Kubernetes watch threads still running after {seconds}s: {names}",
                              seconds=STOP_WAIT, names=", ".join(t.name for t in alive))
            if api is not None and not alive:
                api.close()
            done.callback(None)

        poll(polls)
        return done

    def _reset(self) -> None:
        self._cache = {}
        self._negative = {}
        self._listed = False
        self._last_event = None
        self._last_error = ""
        self._config_error = None
        self._webhook_policy = None
        self._webhook_listed = False
        self._webhook_error = ""
        self._rv = ""
        self._metrics.namespace_cache_size.set(0)

    @property
    def threads(self) -> tuple[threading.Thread, ...]:
        """The watch threads of the current or last run (for tooling and tests)."""
        return tuple(self._threads)

    # ------------------------------------------------------------ thread -> reactor

    def _bridge(self, run: _Run, handler: Callable[..., None]) -> Callable[..., None]:
        call = self._reactor.callFromThread

        def deliver(*args: Any) -> None:
            call(self._on_reactor, run, handler, args)

        return deliver

    def _on_reactor(self, run: _Run, handler: Callable[..., None], args: tuple) -> None:
        if run is self._run:
            handler(*args)

    def _namespace_news(self, what: str, *args: Any) -> None:
        now = self._clock.seconds()
        if what == "event":
            kind, info, rv = args
            self._metrics.namespace_events.labels(kind).inc()
            name = info.name
            pending = self._pending.get(name)
            if pending is not None:
                pending.superseded = True
            if kind == "DELETED":
                self._cache.pop(name, None)
            else:
                self._cache[name] = info
                self._negative.pop(name, None)
            self._metrics.namespace_cache_size.set(len(self._cache))
            self._last_event, self._rv, self._last_error = now, rv or self._rv, ""
        elif what == "bookmark":
            (rv,) = args
            self._metrics.namespace_events.labels("BOOKMARK").inc()
            self._last_event, self._rv, self._last_error = now, rv or self._rv, ""
        elif what == "replace":
            items, rv = args
            first = not self._listed
            self._cache = items
            for pending in self._pending.values():
                pending.superseded = True
            for name in [n for n in self._negative if n in items]:
                del self._negative[name]
            self._listed, self._last_event, self._rv, self._last_error = True, now, rv, ""
            self._metrics.namespace_cache_size.set(len(items))
            self.log.info("{what} {count} namespaces at resourceVersion {rv}",
                          what="Listed" if first else "Relisted", count=len(items), rv=rv)
            if first and self._on_first_list is not None:
                self._on_first_list()
        elif what == "restart":
            self._restarted("namespace", "", *args)
        elif what == "crashed":
            self._last_error = f"watch thread failed: {args[0]}"
            self.log.critical("Namespace watch thread failed: {error}", error=args[0])

    def _webhook_news(self, what: str, *args: Any) -> None:
        name = self._config.webhook_configuration
        if what in ("event", "replace"):
            if what == "event":
                kind, policy, _rv = args
                if kind == "DELETED":
                    policy = None
            else:
                policy, _rv = args
                self._webhook_listed, self._webhook_error = True, ""
            if policy != self._webhook_policy:
                self.log.info("MutatingWebhookConfiguration {name}: failurePolicy is now {policy}",
                              name=name, policy=policy or "unknown")
            self._webhook_policy = policy
        elif what == "restart":
            self._restarted("webhook configuration", "webhook-", *args)
        elif what == "crashed":
            self._webhook_error = f"watch thread failed: {args[0]}"
            self.log.critical("Webhook configuration watch thread failed: {error}", error=args[0])

    def _restarted(self, what: str, prefix: str, reason: str, error: str, delay: float) -> None:
        self._metrics.namespace_watch_restarts.labels(prefix + reason).inc()
        if reason == "timeout" and not error:
            self.log.debug("The {what} watch ended on the server's timeout; resuming", what=what)
            return
        if prefix:
            self._webhook_error = f"{reason}: {error}" if error else reason
        else:
            self._last_error = f"{reason}: {error}" if error else reason
        self.log.warn("The {what} watch restarts ({reason}): {error}; next attempt in {delay:.2f}s",
                      what=what, reason=reason, error=error or "-", delay=delay)

    # ------------------------------------------------------------ INamespaceSource

    @property
    def count(self) -> int:
        return len(self._cache)

    @property
    def resource_version(self) -> str:
        """The resourceVersion of the last list, event or bookmark applied."""
        return self._rv

    def cached(self, name: str) -> CachedAnswer:
        if self._config.per_review_get:
            return UNKNOWN
        info = self._cache.get(name)
        if info is not None:
            return info
        until = self._negative.get(name)
        if until is not None:
            if self._clock.seconds() < until:
                return None
            del self._negative[name]
        return UNKNOWN

    def fetch(self, name: str, timeout: float) -> "Deferred[Optional[NamespaceInfo]]":
        """
        One GET of the namespace, bounded by C{timeout} (and
        C{kubernetes.miss_timeout}), in the reactor's thread pool.  Callers
        asking for the same name meanwhile share it; each gets its own
        Deferred, so cancelling one leaves the others waiting.

        @raise NamespaceLookupError: (in the Deferred) when the GET fails.
        """
        bound = max(0.001, min(timeout, self._config.miss_timeout))
        if self._config.per_review_get:
            d = self._get(name, bound)
            d.addCallbacks(self._counted, self._lookup_failed, errbackArgs=(name, 1))
            return d
        waiter: Deferred = Deferred()
        pending = self._pending.get(name)
        if pending is not None:
            pending.waiters.append(waiter)
            return waiter
        pending = self._pending[name] = _Pending([waiter])
        self._get(name, bound).addBoth(self._fetched, name, pending)
        return waiter

    def readiness(self) -> tuple[bool, str]:
        if self._config_error is not None:
            return False, self._config_error
        if self._run is None:
            return False, "not started"
        config = self._config
        if config.per_review_get:
            ok, detail = True, "per-review GET mode: no namespace cache"
        elif not self._listed:
            ok, detail = False, "waiting for the first namespace list"
            if self._last_error:
                detail += f" (last attempt: {self._last_error})"
        else:
            age = self._clock.seconds() - (self._last_event or 0.0)
            ok, detail = True, f"{len(self._cache)} namespaces, last event {age:.0f}s ago"
            if self._last_error:
                detail += f"; watch restarting after {self._last_error}"
        if config.webhook_configuration and not self._webhook_listed:
            waiting = f"waiting for the first list of MutatingWebhookConfiguration {config.webhook_configuration}"
            if self._webhook_error:
                waiting += f" (last attempt: {self._webhook_error})"
            return False, f"{detail}; {waiting}" if ok else detail
        return ok, detail

    def cluster_failure_policy(self) -> Optional[str]:
        return self._webhook_policy

    # ------------------------------------------------------------ cache misses

    def _get(self, name: str, timeout: float) -> Deferred:
        api = self._api
        if api is None:
            detail = self._config_error or "the Kubernetes namespace source is not running"
            return _failed(NamespaceLookupError(detail))
        if not name:
            return succeed(None)
        keep = self._keep

        def get() -> Optional[NamespaceInfo]:
            try:
                core = kubernetes.client.CoreV1Api(api)
                response = core.read_namespace(name, _request_timeout=timeout, _preload_content=False)
            except ApiException as e:
                if e.status == 404:
                    return None
                raise NamespaceLookupError(f"namespace {name}: {_describe(e)}") from None
            except Exception as e:
                raise NamespaceLookupError(f"namespace {name}: {_describe(e)}") from None
            try:
                body = response.data
            finally:
                response.release_conn()
            try:
                return keep.namespace(json.loads(body))
            except (ValueError, AttributeError) as e:
                raise NamespaceLookupError(f"namespace {name}: unreadable answer: {e}") from None

        return deferToThreadPool(self._reactor, self._reactor.getThreadPool(), get)

    def _counted(self, info: Optional[NamespaceInfo]) -> Optional[NamespaceInfo]:
        self._metrics.namespace_misses.labels("found" if info is not None else "not-found").inc()
        return info

    def _lookup_failed(self, failure: Failure, name: str, callers: int) -> Failure:
        self._metrics.namespace_misses.labels("error").inc(callers)
        self.log.warn("Namespace lookup for {namespace} failed: {error}", namespace=name,
                      error=failure.getErrorMessage())
        if not failure.check(NamespaceLookupError):
            return Failure(NamespaceLookupError(f"namespace {name}: {failure.getErrorMessage()}"))
        return failure

    def _fetched(self, result: Any, name: str, pending: _Pending) -> None:
        if self._pending.get(name) is pending:
            del self._pending[name]
        waiters = [w for w in pending.waiters if not w.called]
        if isinstance(result, Failure):
            result = self._lookup_failed(result, name, len(waiters))
            for waiter in waiters:
                waiter.errback(result)
            return
        info: Optional[NamespaceInfo] = result
        if pending.superseded and name in self._cache:
            # The watch saw this namespace change while the GET was out:
            # its view is the newer one.
            info = self._cache[name]
        elif not pending.superseded and self._run is not None:
            if info is not None:
                self._cache.setdefault(name, info)
                self._metrics.namespace_cache_size.set(len(self._cache))
            elif self._config.miss_negative_ttl > 0:
                self._remember_missing(name)
        label = "found" if info is not None else "not-found"
        self._metrics.namespace_misses.labels(label).inc(len(waiters))
        for waiter in waiters:
            waiter.callback(info)

    def _remember_missing(self, name: str) -> None:
        now = self._clock.seconds()
        if len(self._negative) >= _NEGATIVE_PRUNE_AT:
            for stale in [n for n, until in self._negative.items() if until <= now]:
                del self._negative[stale]
        self._negative[name] = now + self._config.miss_negative_ttl


def _failed(error: Exception) -> Deferred:
    d: Deferred = Deferred()
    d.errback(Failure(error))
    return d
