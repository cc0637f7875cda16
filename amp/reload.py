"""
Reloading what amp reads from files while it runs.

L{ReloadService}
    Calls C{check()} of an L{IReloadable} every few seconds (reload if the
    files changed), and C{reload()} when asked (L{ReloadService.reload_now},
    reload regardless), on the reactor thread; a check that raises is
    logged and polling goes on.  The serving certificate
    (L{amp.tls.CertificateReloadService}) and the config file
    (L{ConfigFile}) each have one.

L{SighupService}
    The one C{SIGHUP} handler, installed by the top service
    (L{amp.service.AmpService}): each signal asks every reloader it was
    given in turn, on the reactor thread (the certificate, the config, the
    workers); the handler that was there before is restored on stop.

L{ConfigFile}
    amp's config file.  A change (its resolved path, inode, size or mtime,
    so a ConfigMap volume's C{..data} symlink swap is seen) or C{SIGHUP}
    loads it again, in a thread (L{load_config_file}: the file is
    untrusted, read and parsed within L{amp.files}' limits, and even a
    bounded parse must not stall reviews); only the parsed, checked config
    comes back to the reactor thread.  A valid config is handed to C{apply}
    (the running service swaps it in between reviews,
    L{amp.service.AmpService.apply}); keys only a restart can change keep
    their running values and are named in one warning line
    (L{amp.config.for_reload}); a file that does not load keeps the running
    config, and the exact error is logged once per distinct content.
    Counted in C{amp_config_reloads_total{result}}.
"""

from __future__ import annotations

import hashlib
import signal
from collections import OrderedDict
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

from twisted.application.service import Service
from twisted.internet.defer import Deferred, maybeDeferred
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import LoopingCall
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger
from zope.interface import Interface, implementer

from amp.config import Config, ConfigError, config_digest, for_reload, parse_config
from amp.files import CONFIG_LIMIT, FileError, Observed, config_document, observe, read_file
from amp.metrics import Metrics

if TYPE_CHECKING:
    from amp.reactors import IAmpReactor

_SignalHandler = Union[Callable[[int, Optional[FrameType]], Any], int, None]


class IReloadable(Interface):
    """
    Something loaded from files that L{ReloadService} keeps current.
    """

    def check() -> "Union[bool, Deferred[bool]]":
        """
        Load the files if they changed since the last load; never raises
        for a bad file.  Returns (or fires with, when the load runs in a
        thread) whether something new was put in force.
        """

    def reload() -> "Union[bool, Deferred[bool]]":
        """
        Load the files whether or not they look changed (C{SIGHUP}).
        """


class ReloadService(Service):
    """
    Polls C{target.check()} every C{interval} seconds and calls
    C{target.reload()} when asked (L{reload_now}: C{SIGHUP}, through
    L{SighupService}).

    @ivar clock: the clock the polling runs on.
    """

    log = Logger()

    #: What the target is, for log lines.
    what = "files"

    def __init__(
        self,
        target: IReloadable,
        *,
        reactor: IAmpReactor,
        interval: float = 5.0,
        clock: Optional[IReactorTime] = None,
    ) -> None:
        """
        @param reactor: unless C{clock} is given, for polling.
        """
        if interval <= 0:
            raise ValueError(f"interval: must be greater than zero, got {interval!r}")
        self.target = target
        self.reactor = reactor
        self.interval = interval
        self.clock: IReactorTime = clock if clock is not None else reactor
        self._loop: Optional[LoopingCall] = None

    def startService(self) -> None:
        Service.startService(self)
        self._start_polling()

    def _start_polling(self) -> None:
        loop = LoopingCall(self._tick)
        loop.clock = self.clock
        self._loop = loop
        done = loop.start(self.interval, now=False)
        done.addErrback(lambda f: self.log.failure("Polling {what} stopped", f, what=self.what))

    def set_interval(self, interval: float) -> None:
        """
        Poll every C{interval} seconds from now on.
        """
        if interval == self.interval:
            return
        self.interval = interval
        if self._loop is not None and self._loop.running:
            self._loop.stop()
            self._start_polling()

    def stopService(self) -> Optional[Deferred[None]]:
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self._loop = None
        Service.stopService(self)
        return None

    def _tick(self) -> "Deferred[None]":
        # The loop waits for a load in a thread before its next poll, and an
        # error never stops it.
        d = maybeDeferred(self.target.check)
        d.addErrback(lambda f: self.log.failure("Unexpected error while checking {what}", f, what=self.what))
        return d.addCallback(lambda _: None)

    def reload_now(self) -> None:
        """
        Load the files whether or not they look changed (C{SIGHUP}); an
        error is logged, never raised.
        """
        d = maybeDeferred(self.target.reload)
        d.addErrback(lambda f: self.log.failure("Unexpected error while reloading {what}", f, what=self.what))


class SighupService(Service):
    """
    The one C{SIGHUP} handler of the process.  On each signal it asks every
    reloader added (L{add}) in turn, in the order added, on the reactor
    thread (a reloader that raises is logged, and the next is asked), then
    calls the handler that was installed before it.  Installed on start;
    that handler is restored on stop.
    """

    log = Logger()

    def __init__(self, reactor: IAmpReactor) -> None:
        """
        @param reactor: the reactor the reloaders run on
            (C{callFromThread} from the signal handler).
        """
        self.reactor = reactor
        self._reloaders: list[tuple[str, Callable[[], Any]]] = []
        self._installed = False
        self._previous: _SignalHandler = None

    def add(self, what: str, reload: Callable[[], Any]) -> None:
        """
        Ask C{reload()} on every C{SIGHUP}; C{what} names it in log lines.
        """
        self._reloaders.append((what, reload))

    def reloaders(self) -> list[str]:
        """
        What every C{SIGHUP} reloads, in the order it is asked.
        """
        return [what for what, _ in self._reloaders]

    def handle(self, signum: int, frame: Optional[FrameType]) -> None:
        """
        The C{SIGHUP} handler: schedule the reloaders on the reactor thread,
        then call the handler that was installed before this one.
        """
        self.reactor.callFromThread(self.reload_all)
        previous = self._previous
        if callable(previous):
            previous(signum, frame)

    def reload_all(self) -> None:
        """
        Ask every reloader in turn.
        """
        for what, reload in list(self._reloaders):
            try:
                reload()
            except Exception:
                self.log.failure("Unexpected error while reloading {what} on SIGHUP", what=what)

    def startService(self) -> None:
        Service.startService(self)
        try:
            previous = signal.getsignal(signal.SIGHUP)
            signal.signal(signal.SIGHUP, self.handle)
        except ValueError as e:
            # Not the main thread: polling still works.
            self.log.warn("SIGHUP not available: {error}", error=str(e))
            return
        self._previous = previous
        self._installed = True

    def stopService(self) -> Optional[Deferred[None]]:
        if self._installed:
            self._installed = False
            previous, self._previous = self._previous, None
            try:
                if signal.getsignal(signal.SIGHUP) == self.handle:
                    signal.signal(signal.SIGHUP, previous if previous is not None else signal.SIG_DFL)
            except ValueError as e:
                self.log.warn("Could not restore the previous SIGHUP handler: {error}", error=str(e))
        Service.stopService(self)
        return None


#: Runs a blocking callable away from the reactor thread and fires with its
#: result there: L{in_thread_pool} in the daemon.
InThread = Callable[[Callable[[], Any]], "Deferred[Any]"]


def in_thread_pool(reactor: IAmpReactor) -> InThread:
    """
    Run callables in C{reactor}'s thread pool; the result crosses back to
    the reactor thread (C{deferToThreadPool}).
    """
    return lambda f: deferToThreadPool(reactor, reactor.getThreadPool(), f)


@dataclass(frozen=True)
class Loaded:
    """
    What one look at the config file found (built in a thread; only this
    crosses to the reactor).

    @ivar state: the file's state (of exactly the bytes read, when read).
    @ivar config: the parsed, checked config, or None.
    @ivar error: why the file was refused, or None.
    @ivar content: identifies what was refused (a hash of the bytes, or
        the error when nothing could be read): each is logged once.
    """

    state: Observed
    config: Optional[Config] = None
    error: Optional[str] = None
    content: str = ""

    @property
    def unchanged(self) -> bool:
        return self.config is None and self.error is None


def load_config_file(path: str, seen: Optional[Observed]) -> Loaded:
    """
    Look at the config file and, unless its state is C{seen} (None: load
    regardless), read and parse it (L{amp.files.config_document}, then
    L{parse_config}).  Blocking: run in a thread, never on the reactor.
    """
    state = observe(path)
    if seen is not None and state == seen:
        return Loaded(state)
    try:
        data, state = read_file(path, path, CONFIG_LIMIT)
    except FileError as e:
        return Loaded(state, error=f"(file): {e}", content=str(e))
    content = hashlib.sha256(data).hexdigest()
    try:
        return Loaded(state, config=parse_config(config_document(data, path)))
    except FileError as e:
        return Loaded(state, error=f"(file): {e}", content=content)
    except ConfigError as e:
        return Loaded(state, error=str(e), content=content)


#: Refused file contents remembered, so that each is logged once.
REFUSED_REMEMBERED = 64


@implementer(IReloadable)
class ConfigFile:
    """
    amp's config file, loaded again when it changes or on C{SIGHUP}.

    Reading and parsing run in C{in_thread} (L{load_config_file}); only the
    result comes back to the reactor thread, where a valid config is put in
    force.  One load runs at a time: a C{SIGHUP} during a load loads again
    after it.

    @ivar running: the configuration in force.
    @ivar digest: its L{config_digest}.
    """

    log = Logger()

    def __init__(
        self,
        path: str,
        running: Config,
        apply: Callable[[Config], None],
        metrics: Optional[Metrics] = None,
        seen: Optional[Observed] = None,
        *,
        in_thread: InThread,
    ) -> None:
        """
        @param path: the file C{running} was loaded from.
        @param apply: puts a new configuration in force; called with the
            configuration L{for_reload} makes of the new file.
        @param seen: the file's state when C{running} was loaded (default:
            its state now).
        @param in_thread: runs L{load_config_file} off the reactor thread.
        """
        self.path = path
        self.running = running
        self.digest = config_digest(running)
        self._apply = apply
        self._metrics = metrics
        self._in_thread = in_thread
        self._seen = seen if seen is not None else observe(path)
        self._loading: Optional[Deferred[bool]] = None
        self._again = False
        self._refused: OrderedDict[str, None] = OrderedDict()
        if metrics is not None:
            metrics.config_info.labels(hash=self.digest).set(1)

    def check(self) -> "Deferred[bool]":
        return self._load("file changed", force=False)

    def reload(self) -> "Deferred[bool]":
        return self._load("reload requested", force=True)

    def _load(self, trigger: str, force: bool) -> "Deferred[bool]":
        if self._loading is not None:
            # A poll waits for the load in flight; a SIGHUP loads again after it.
            self._again = self._again or force
            return self._loading
        path, seen = self.path, None if force else self._seen
        d: Deferred[Loaded] = self._in_thread(lambda: load_config_file(path, seen))
        loading = d.addCallback(self._settle, trigger)
        loading.addErrback(self._unexpected, trigger)
        self._loading = loading
        loading.addBoth(self._done)
        return loading

    def _done(self, result: Any) -> Any:
        self._loading = None
        if self._again:
            self._again = False
            self.reload()
        return result

    def _unexpected(self, failure: Any, trigger: str) -> bool:
        self._count("error")
        self.log.failure(
            "Config {path} not reloaded ({trigger}), still running config {hash}",
            failure,
            path=self.path,
            trigger=trigger,
            hash=self.digest,
        )
        return False

    def _settle(self, loaded: Loaded, trigger: str) -> bool:
        if loaded.unchanged:
            return False
        # A file that does not load is reported once per content, not at
        # every poll; the next change (or SIGHUP) tries again.
        self._seen = loaded.state
        if loaded.config is None:
            self._count("error")
            if loaded.content not in self._refused:
                self._refused[loaded.content] = None
                if len(self._refused) > REFUSED_REMEMBERED:
                    self._refused.popitem(last=False)
                self.log.warn(
                    "Config {path} not reloaded ({trigger}), still running config {hash}: {error}",
                    path=self.path,
                    trigger=trigger,
                    hash=self.digest,
                    error=loaded.error,
                )
            return False
        effective, kept = for_reload(self.running, loaded.config)
        if kept:
            self.log.warn(
                "Config {path}: {keys} changed but only take effect on a restart; running with the old "
                "values of these keys",
                path=self.path,
                keys=", ".join(kept),
                kept=kept,
            )
        digest = config_digest(effective)
        if digest == self.digest:
            self._count("success")
            self.log.info(
                "Config {path} reloaded ({trigger}): no change in force ({hash})",
                path=self.path,
                trigger=trigger,
                hash=digest,
            )
            return False
        try:
            self._apply(effective)
        except Exception:
            self._count("error")
            self.log.failure(
                "Config {path} not reloaded ({trigger}), still running config {hash}",
                path=self.path,
                trigger=trigger,
                hash=self.digest,
            )
            return False
        previous, self.running, self.digest = self.digest, effective, digest
        if self._metrics is not None:
            self._metrics.config_info.remove(previous)
            self._metrics.config_info.labels(hash=digest).set(1)
        self._count("success")
        self.log.info(
            "Config {path} reloaded ({trigger}): config {hash} replaces {previous}",
            path=self.path,
            trigger=trigger,
            hash=digest,
            previous=previous,
        )
        return True

    def _count(self, result: str) -> None:
        if self._metrics is not None:
            self._metrics.config_reloads.labels(result=result).inc()


class ConfigReloadService(ReloadService):
    """
    Keeps the configuration current (L{ConfigFile}): polls every
    C{reload_interval}, reloads when asked (C{SIGHUP}).
    """

    what = "the config file"
    target: ConfigFile
