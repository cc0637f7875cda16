"""
The Kubernetes namespace source (reactor side: everything here runs on the
reactor thread).

L{KubernetesNamespaceSource} owns:

  - the clients (L{amp.kube._client.KubeClient}), built at start from the
    in-cluster service account or a kubeconfig: one for the watches, whose
    sockets stopping shuts down, and one for the bounded calls in the
    thread pool (a GET on a cache miss, the Lease, Events), which must
    still work while amp stops (the Lease is released then);
  - one thread per watched kind, each running a
    L{amp.kube._watch.ListWatch}: the namespace watch, and, when
    C{kubernetes.webhook_configuration} is set, a second one for amp's own
    MutatingWebhookConfiguration (two independent streams with their own
    resourceVersions and failures; one thread alternating between two
    blocking reads could starve one of them, so each gets a thread);
  - the cache itself, which only the reactor thread reads or writes: each
    thread's news arrives through its L{amp.kube._bridge.Bridge} as typed
    events;
  - cache misses: one bounded GET in the reactor's thread pool, shared by
    concurrent callers, with 404s remembered briefly (L{amp.kube._misses});
  - with C{kubernetes.bypass.enabled}, the bypassed-Pod report
    (L{amp.kube._report}: a Lease loop and, while this replica holds the
    Lease, a Pod watch), fed with the namespace cache and the enablings the
    namespace watch saw happen (L{amp.kube._verdict.EnableRevisions}).

Stopping sets the threads' stop flag, releases the Lease, and shuts down the
watch clients' sockets so a blocked read returns at once; each thread says
when it has ended.
"""

from __future__ import annotations

import functools
import random as _random
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

from twisted.application.service import Service
from twisted.internet.defer import Deferred, DeferredList, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from zope.interface import implementer

from amp.config import KubernetesConfig
from amp.hints import NEAR_MISS_PROBLEM, near_miss_news
from amp.kube._bridge import Bridge, start_thread
from amp.kube._bypass import BypassReporter
from amp.kube._client import KubeClient, Lister, describe, service_account_namespace
from amp.kube._events import Bookmark, Changed, Crashed, Replaced, Restarting, WatchEvent
from amp.kube._keep import Keep, WebhookPolicy
from amp.kube._lease import LeaseElector
from amp.kube._misses import CacheMisses
from amp.kube._report import BypassReport, LeaseTerm
from amp.kube._verdict import EnableRevisions
from amp.kube._watch import ListWatch
from amp.metrics import Metrics
from amp.namespaces import INamespaceSource, NamespaceInfo
from amp.reasons import NamespaceSource

if TYPE_CHECKING:
    from amp.reactors import IAmpReactor

#: How long C{stopService} waits for the threads before giving up on them
#: (they are daemon threads; after a socket shutdown they end at once).
STOP_WAIT = 2.0


@dataclass(eq=False)
class _Run:
    """One start of the service: its stop flag, threads and bridges."""

    watch_client: Optional[KubeClient]
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)
    watches: dict[str, ListWatch] = field(default_factory=dict)
    bridges: list[Bridge] = field(default_factory=list)
    running: int = 0
    all_ended: Optional[Deferred[None]] = None
    bypass: Optional[BypassReport] = None

    def ended(self) -> None:
        self.running -= 1
        if self.running == 0 and self.all_ended is not None:
            d, self.all_ended = self.all_ended, None
            d.callback(None)


@implementer(INamespaceSource)
class KubernetesNamespaceSource(CacheMisses, Service):
    """
    Namespaces from the Kubernetes API, cached in memory and kept current by
    a watch (see the module docstring).

    @param config: the C{kubernetes} section.
    @param reactor: for C{callFromThread}, its thread pool and the stop
        timeout.
    @param metrics: where to report (a fresh L{Metrics} if None).
    @param clock: the time source for the negative-cache TTL and "last
        event ago" (the reactor if None).
    @param random: M{[0, 1)} for backoff jitter.
    @param on_first_list: called once, on the reactor thread, when the
        first namespace list has landed.
    @param client_factory: makes the client from C{config} at start
        (L{KubeClient.from_config}); raising means the configuration cannot
        be used.
    @param spawn: starts a watch thread (L{amp.kube._bridge.start_thread}).
    @param identity: this replica's name in the bypass report's Lease and
        Events (host name and a random suffix).
    @param wall: the wall clock the Pod watch thread checks the horizon
        against.
    @param on_webhook: told, on the reactor thread, each version of amp's
        own MutatingWebhookConfiguration the watch sees (None: deleted);
        the registration check (L{amp.registration.RegistrationReport.seen}).
    @param terms: told C{start_term(client)} when this replica wins the
        bypass report's Lease and C{end_term()} when it loses it (the
        managed registration); with terms, the Lease runs even without the
        bypass report.
    """

    log = Logger()

    def __init__(
        self,
        config: KubernetesConfig,
        *,
        reactor: IAmpReactor,
        metrics: Optional[Metrics] = None,
        clock: Optional[IReactorTime] = None,
        random: Callable[[], float] = _random.random,
        on_first_list: Optional[Callable[[], None]] = None,
        client_factory: Callable[[KubernetesConfig], Any] = KubeClient.from_config,
        spawn: Callable[[str, Callable[[], None]], threading.Thread] = start_thread,
        identity: Optional[str] = None,
        wall: Callable[[], float] = time.time,
        on_webhook: Optional[Callable[[Optional[Any]], None]] = None,
        terms: Sequence[LeaseTerm] = (),
    ) -> None:
        self._config = config
        self._terms = tuple(terms)
        self._on_webhook = on_webhook
        self._on_first_list = on_first_list
        self._reactor = reactor
        self._clock: IReactorTime = clock if clock is not None else reactor
        self._metrics = metrics if metrics is not None else Metrics()
        self._random = random
        self._client_factory = client_factory
        self._spawn = spawn
        self._identity = identity or f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"
        self._wall = wall
        self._keep = Keep(config)
        self._enables = EnableRevisions(config)
        self._cache: dict[str, NamespaceInfo] = {}
        self._negative: dict[str, float] = {}
        self._pending = {}
        self._listed = False
        self._listed_at: Optional[float] = None
        self._last_event: Optional[float] = None
        self._last_error = ""
        self._config_error: Optional[str] = None
        self._webhook_policy: Optional[str] = None
        self._webhook_listed = False
        self._webhook_error = ""
        self._rv = ""
        self._run: Optional[_Run] = None
        self._last_run: Optional[_Run] = None
        self.client: Optional[KubeClient] = None
        #: Called with a namespace's name when what amp keeps of it (its
        #: enabling, endpoints, canary) changes after the first list (the
        #: continuous audit's cue).
        self.on_namespace_changed: Optional[Callable[[str], None]] = None

    # ------------------------------------------------------------ lifecycle

    def startService(self) -> None:
        Service.startService(self)
        self._reset()
        config = self._config
        try:
            client = self._client_factory(config)
        except Exception as e:
            where = (
                "in-cluster service account"
                if config.source == NamespaceSource.CLUSTER
                else (
                    f"kubeconfig {config.kubeconfig or '(default)'}"
                    + (f" context {config.context}" if config.context else "")
                )
            )
            self._config_error = f"cannot load the Kubernetes client configuration from {where}: {describe(e)}"
            self.log.error("{detail}", detail=self._config_error)
            return
        self.client = client
        watches = client.fork() if not config.per_review_get or config.webhook_configuration else None
        run = self._run = self._last_run = _Run(watches)
        if watches is not None and not config.per_review_get:
            self._watch(
                run,
                "namespaces",
                "amp-namespace-watch",
                watches.namespaces(),
                parse=self._keep.namespace,
                collect=self._keep.namespaces,
                handler=self._namespace_news,
            )
        if watches is not None and config.webhook_configuration:
            webhook = WebhookPolicy(config.webhook_configuration, config.webhook_name)
            self._watch(
                run,
                "webhook",
                "amp-webhook-watch",
                watches.webhook_configuration(webhook.name),
                parse=webhook.parse,
                collect=webhook.collect,
                handler=self._webhook_news,
            )
        self.log.info(
            "Kubernetes namespace source on {host} ({mode})",
            host=client.host,
            mode="per-review GET" if config.per_review_get else "watch",
        )
        if config.bypass.enabled or self._terms:
            self._start_bypass(run, client)

    def _watch(
        self,
        run: _Run,
        name: str,
        thread_name: str,
        lister: Lister,
        *,
        parse: Callable[..., Any],
        collect: Callable[..., Any] = tuple,
        handler: Callable[[WatchEvent], None],
        stop: Optional[threading.Event] = None,
        on_finished: Optional[Callable[[], None]] = None,
        **options: Any,
    ) -> Bridge:
        """Start one list/watch thread whose events reach C{handler} on the reactor."""

        def finished() -> None:
            if on_finished is not None:
                on_finished()
            run.ended()

        bridge = Bridge(self._reactor, handler, on_finished=finished)
        watch = ListWatch(
            lister=lister,
            parse=parse,
            collect=collect,
            emit=bridge,
            stop=stop or run.stop,
            config=self._config,
            random=self._random,
            **options,
        )

        def target() -> None:
            try:
                watch.run_guarded()
            finally:
                bridge.finished()

        run.bridges.append(bridge)
        run.watches[name] = watch
        run.running += 1
        run.threads.append(self._spawn(thread_name, target))
        return bridge

    # ------------------------------------------------------------ the bypass report

    def _start_bypass(self, run: _Run, client: KubeClient) -> None:
        config = self._config
        own = config.own_namespace or service_account_namespace()
        lease_namespace = config.bypass.lease_namespace or own
        if not lease_namespace:
            self.log.error(
                "The bypassed-Pod report and the managed registration are off: set "
                "kubernetes.bypass.lease_namespace (or kubernetes.own_namespace) when amp does not run "
                "in a cluster"
            )
            return
        run.bypass = BypassReport(
            config=config,
            client=client,
            reactor=self._reactor,
            clock=self._clock,
            metrics=self._metrics,
            identity=self._identity,
            namespaces=self,
            enables=self._enables,
            own_namespace=own or lease_namespace,
            lease_namespace=lease_namespace,
            watch=functools.partial(self._watch, run),
            wall=self._wall,
            terms=self._terms,
            pods=config.bypass.enabled,
        )
        if self._listed:
            run.bypass.reporter.namespaces_listed(self._listed_at)
        run.bypass.start()

    def stopService(self) -> Optional[Deferred[None]]:
        """
        Stop the threads: set their stop flag, drop their undelivered news
        and shut down the watch client's sockets so any blocked read
        returns; release the Lease.  The Deferred fires once every thread
        has said it ended and the Lease is released, or after L{STOP_WAIT}
        seconds with a warning.
        """
        Service.stopService(self)
        run, self._run = self._run, None
        client, self.client = self.client, None
        if run is None:
            return None
        run.stop.set()
        released = run.bypass.stop() if run.bypass is not None else succeed(None)
        for bridge in run.bridges:
            bridge.close()
        assert client is not None
        if run.watch_client is not None:
            run.watch_client.cut()
        ended: Deferred[None] = Deferred()
        if run.running == 0:
            ended.callback(None)
        else:
            run.all_ended = ended
        done: Deferred[None] = Deferred()

        def finished(_: Any) -> None:
            if timer.active():
                timer.cancel()
                client.close()
                if run.watch_client is not None:
                    run.watch_client.close()
                done.callback(None)

        def late() -> None:
            run.all_ended = None
            alive = [getattr(t, "name", "?") for t in run.threads if getattr(t, "is_alive", lambda: False)()]
            if alive or run.running:
                self.log.warn(
                    "Kubernetes watch threads still running after {seconds}s: {names}",
                    seconds=STOP_WAIT,
                    names=", ".join(alive) or "?",
                )
            else:
                self.log.warn("The Lease was not released within {seconds}s", seconds=STOP_WAIT)
            done.callback(None)

        # The release needs the client: it is closed once the release and
        # every thread are done, and left alone if that takes too long.
        timer = self._reactor.callLater(STOP_WAIT, late)
        DeferredList([ended, released], consumeErrors=True).addCallback(finished)
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
        return tuple(self._last_run.threads) if self._last_run is not None else ()

    @property
    def watches(self) -> dict[str, ListWatch]:
        """The list/watch loops of the current or last run, by kind (for tooling and tests)."""
        return dict(self._last_run.watches) if self._last_run is not None else {}

    @property
    def bypass(self) -> Optional[BypassReporter]:
        """The bypassed-Pod report of the current or last run, if on."""
        return self._last_run.bypass.reporter if self._last_run is not None and self._last_run.bypass else None

    @property
    def elector(self) -> Optional[LeaseElector]:
        """The bypass report's Lease loop of the current or last run, if on."""
        return self._last_run.bypass.elector if self._last_run is not None and self._last_run.bypass else None

    # ------------------------------------------------------------ news from the threads

    def _namespace_news(self, event: WatchEvent) -> None:
        now = self._clock.seconds()
        if isinstance(event, Changed):
            kind, info, rv = event.kind, event.obj, event.resource_version
            self._metrics.namespace_events.labels(kind).inc()
            name = info.name
            pending = self._pending.get(name)
            if pending is not None:
                pending.superseded = True
            before = self._cache.get(name)
            self._enables.changed(kind, before, info, rv)
            if (
                self.on_namespace_changed is not None
                and kind != "DELETED"
                and (before is None or before.labels != info.labels or before.annotations != info.annotations)
            ):
                self.on_namespace_changed(name)
            if kind == "DELETED":
                self._cache.pop(name, None)
            else:
                self._near_misses(self._cache.get(name), info)
                self._cache[name] = info
                self._negative.pop(name, None)
            self._metrics.namespace_cache_size.set(len(self._cache))
            self._last_event, self._rv, self._last_error = now, rv or self._rv, ""
        elif isinstance(event, Bookmark):
            self._metrics.namespace_events.labels("BOOKMARK").inc()
            self._last_event, self._rv, self._last_error = now, event.resource_version or self._rv, ""
        elif isinstance(event, Replaced):
            items, rv = event.items, event.resource_version
            first = not self._listed
            self._enables.replaced(self._cache, items)
            for info in items.values():
                self._near_misses(self._cache.get(info.name), info)
            self._cache = items
            for pending in self._pending.values():
                pending.superseded = True
            for name in [n for n in self._negative if n in items]:
                del self._negative[name]
            self._listed, self._last_event, self._rv, self._last_error = True, now, rv, ""
            self._listed_at = now
            self._metrics.namespace_cache_size.set(len(items))
            self.log.info(
                "{what} {count} namespaces at resourceVersion {rv}",
                what="Listed" if first else "Relisted",
                count=len(items),
                rv=rv,
            )
            if first and self._on_first_list is not None:
                self._on_first_list()
            if self._run is not None and self._run.bypass is not None:
                self._run.bypass.reporter.namespaces_listed()
        elif isinstance(event, Restarting):
            self._restarted("namespace", "", event)
        elif isinstance(event, Crashed):
            self._last_error = f"watch thread failed: {event.error}"
            self.log.critical("Namespace watch thread failed: {error}", error=event.error)

    def _near_misses(self, before: Optional[NamespaceInfo], info: NamespaceInfo) -> None:
        """Report a namespace's unknown amp keys (L{amp.hints}) once per change of them."""
        news = near_miss_news(before.near_misses if before is not None else None, info.near_misses)
        if news is not None:
            self.log.warn("Namespace {namespace}: {hints}", namespace=info.name, hints=news)
            self._metrics.namespace_problems.labels(NEAR_MISS_PROBLEM).inc()

    def _webhook_news(self, event: WatchEvent) -> None:
        if isinstance(event, (Changed, Replaced)):
            if isinstance(event, Changed):
                _name, seen = event.obj
                if event.kind == "DELETED":
                    seen = None
            else:
                seen = event.items
                self._webhook_listed, self._webhook_error = True, ""
            policy = seen.policy if seen is not None else None
            if self._on_webhook is not None:
                self._on_webhook(seen.obj if seen is not None else None)
            if policy != self._webhook_policy:
                self.log.info(
                    "MutatingWebhookConfiguration {name}: failurePolicy is now {policy}",
                    name=self._config.webhook_configuration,
                    policy=policy or "unknown",
                )
            self._webhook_policy = policy
        elif isinstance(event, Restarting):
            self._restarted("webhook configuration", "webhook-", event)
        elif isinstance(event, Crashed):
            self._webhook_error = f"watch thread failed: {event.error}"
            self.log.critical("Webhook configuration watch thread failed: {error}", error=event.error)

    def _restarted(self, what: str, prefix: str, event: Restarting) -> None:
        reason, error = event.reason, event.error
        self._metrics.namespace_watch_restarts.labels(prefix + reason).inc()
        if reason == "timeout" and not error:
            self.log.debug("The {what} watch ended on the server's timeout; resuming", what=what)
            return
        if prefix:
            self._webhook_error = f"{reason}: {error}" if error else reason
        else:
            self._last_error = f"{reason}: {error}" if error else reason
        self.log.warn(
            "The {what} watch restarts ({reason}): {error}; next attempt in {delay:.2f}s",
            what=what,
            reason=reason,
            error=error or "-",
            delay=event.delay,
        )

    # ------------------------------------------------------------ INamespaceSource

    @property
    def count(self) -> int:
        return len(self._cache)

    @property
    def resource_version(self) -> str:
        """The resourceVersion of the last list, event or bookmark applied."""
        return self._rv

    @property
    def listed(self) -> bool:
        """The first namespace list has landed (the cache is complete)."""
        return self._listed

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
