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
    loads it again: a valid config is handed to C{apply} (the running
    service swaps it in between reviews, L{amp.service.AmpService.apply});
    keys only a restart can change keep their running values and are named
    in one warning line (L{amp.config.for_reload}); a file that does not
    load keeps the running config, and the exact error is logged.  Counted
    in C{amp_config_reloads_total{result}}.
"""

from __future__ import annotations

import signal
from types import FrameType
from typing import Any, Callable, Optional, Union

from twisted.application.service import Service
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from zope.interface import Interface, implementer

from amp._files import Observed, observe
from amp.config import Config, ConfigError, config_digest, for_reload, load_config
from amp.metrics import Metrics

_SignalHandler = Union[Callable[[int, Optional[FrameType]], Any], int, None]


class IReloadable(Interface):
    """
    Something loaded from files that L{ReloadService} keeps current.
    """

    def check() -> bool:
        """
        Load the files if they changed since the last load; never raises
        for a bad file.  Returns whether something new was put in force.
        """

    def reload() -> bool:
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
        reactor: Any,
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
        super().startService()
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
        return super().stopService()

    def _tick(self) -> None:
        try:
            self.target.check()
        except Exception:
            self.log.failure("Unexpected error while checking {what}", what=self.what)

    def reload_now(self) -> None:
        """
        Load the files whether or not they look changed (C{SIGHUP}); an
        error is logged, never raised.
        """
        try:
            self.target.reload()
        except Exception:
            self.log.failure("Unexpected error while reloading {what}", what=self.what)


class SighupService(Service):
    """
    The one C{SIGHUP} handler of the process.  On each signal it asks every
    reloader added (L{add}) in turn, in the order added, on the reactor
    thread (a reloader that raises is logged, and the next is asked), then
    calls the handler that was installed before it.  Installed on start;
    that handler is restored on stop.
    """

    log = Logger()

    def __init__(self, reactor: Any) -> None:
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
        super().startService()
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
        return super().stopService()


@implementer(IReloadable)
class ConfigFile:
    """
    amp's config file, loaded again when it changes or on C{SIGHUP}.

    @ivar running: the configuration in force.
    @ivar digest: its L{config_digest}.
    """

    log = Logger()

    def __init__(self, path: str, running: Config, apply: Callable[[Config], None],
                 metrics: Optional[Metrics] = None, seen: Optional[Observed] = None) -> None:
        """
        @param path: the file C{running} was loaded from.
        @param apply: puts a new configuration in force; called with the
            configuration L{for_reload} makes of the new file.
        @param seen: the file's state when C{running} was loaded (default:
            its state now).
        """
        self.path = path
        self.running = running
        self.digest = config_digest(running)
        self._apply = apply
        self._metrics = metrics
        self._seen = seen if seen is not None else observe(path)
        if metrics is not None:
            metrics.config_info.labels(hash=self.digest).set(1)

    def check(self) -> bool:
        state = observe(self.path)
        if state == self._seen:
            return False
        return self._attempt("file changed", state)

    def reload(self) -> bool:
        return self._attempt("reload requested", observe(self.path))

    def _attempt(self, trigger: str, state: Observed) -> bool:
        # A file that does not load is reported once, not at every poll;
        # the next change (or SIGHUP) tries again.
        self._seen = state
        try:
            new = load_config(self.path)
        except ConfigError as e:
            self._count("error")
            self.log.warn("Config {path} not reloaded ({trigger}), still running config {hash}: {error}",
                          path=self.path, trigger=trigger, hash=self.digest, error=str(e))
            return False
        effective, kept = for_reload(self.running, new)
        if kept:
            self.log.warn(
                "Config {path}: {keys} changed but only take effect on a restart; running with the old "
                "values of these keys", path=self.path, keys=", ".join(kept), kept=kept)
        digest = config_digest(effective)
        if digest == self.digest:
            self._count("success")
            self.log.info("Config {path} reloaded ({trigger}): no change in force ({hash})",
                          path=self.path, trigger=trigger, hash=digest)
            return False
        try:
            self._apply(effective)
        except Exception:
            self._count("error")
            self.log.failure("Config {path} not reloaded ({trigger}), still running config {hash}",
                             path=self.path, trigger=trigger, hash=self.digest)
            return False
        previous, self.running, self.digest = self.digest, effective, digest
        if self._metrics is not None:
            self._metrics.config_info.remove(previous)
            self._metrics.config_info.labels(hash=digest).set(1)
        self._count("success")
        self.log.info("Config {path} reloaded ({trigger}): config {hash} replaces {previous}",
                      path=self.path, trigger=trigger, hash=digest, previous=previous)
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
