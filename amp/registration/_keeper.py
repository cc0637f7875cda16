"""
The managed registration (C{registration.managed}), reactor side:
L{RegistrationKeeper} applies the MutatingWebhookConfiguration amp needs
(L{amp.registration.desired}) while this replica holds the Lease, and again
whenever the version the watch sees has drifted from it, at most once per
C{registration.repair_interval}; an apply that changed it is a repair
(C{amp_registration_repairs_total}, one warning each).  Each apply (reading
the CA file, building the object, the server-side apply) runs in the
reactor's thread pool; its result comes back on the reactor.  A failure is
logged and retried with backoff; none of it makes amp unready.
"""

from __future__ import annotations

import random as _random
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional

from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger

from amp.config import Config
from amp.kube import backoff_delay, describe
from amp.metrics import Metrics
from amp.registration._desired import desired, drifted

if TYPE_CHECKING:
    from amp.kube import KubeClient
    from amp.reactors import IAmpReactor

__all__ = ["RegistrationKeeper"]

_UNSEEN: Any = object()


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read(1024 * 1024)


class RegistrationKeeper:
    """
    @param config: amp's config (C{registration}, C{kubernetes}, what the
        registration needs).
    @param reactor: for its thread pool.
    @param clock: for the rate limit and the backoff.
    @param own_namespace: amp's namespace (its Service's).
    @param read: reads the CA file (in the thread).
    @param bundle: when given, the caBundle (PEM) comes from it instead of
        C{registration.ca_bundle} (amp's own CA, L{amp.registration.SecretCertificates});
        None from it: none yet, nothing is applied until L{refresh}.
    """

    log = Logger()

    def __init__(
        self,
        config: Config,
        *,
        reactor: IAmpReactor,
        clock: IReactorTime,
        metrics: Metrics,
        own_namespace: Optional[str],
        random: Callable[[], float] = _random.random,
        read: Callable[[str], bytes] = _read,
        bundle: Optional[Callable[[], Optional[bytes]]] = None,
    ) -> None:
        self._config = config
        self._reactor = reactor
        self._clock = clock
        self._metrics = metrics
        self._own = own_namespace
        self._random = random
        self._read = read
        self._bundle = bundle
        self._client: Optional[KubeClient] = None
        self.active = False
        self._term = 0
        self._obj: Any = _UNSEEN
        self.want: Optional[dict[str, Any]] = None
        self._force = False
        self._busy = False
        self._timer: Optional[IDelayedCall] = None
        self._next = float("-inf")
        self.failures = 0
        self._last_error = ""

    # ------------------------------------------------------------ what the daemon tells it

    def start_term(self, client: KubeClient) -> None:
        """This replica holds the Lease: apply now, with C{client} (blocking; used in the thread pool)."""
        self._client = client
        self.active = True
        self._term += 1
        self.failures = 0
        self.log.info(
            "Managing MutatingWebhookConfiguration {name} (registration.managed)",
            name=self._config.kubernetes.webhook_configuration,
        )
        self._poke(force=True)

    def end_term(self) -> None:
        """Another replica holds the Lease (or amp stops): apply nothing more."""
        self.active = False
        self._term += 1
        self._force = False
        self._busy = False
        self._client = None
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None

    def seen(self, obj: Optional[Mapping[str, Any]]) -> None:
        """The configuration as the watch has it now (None: deleted); repaired if it drifted."""
        self._obj = obj
        if self.active and self.want is not None and drifted(obj, self.want) is not None:
            self._poke()

    def refresh(self) -> None:
        """The CA (or the serving certificate) may have changed: apply again."""
        if self.active:
            self._poke(force=True)

    def config_changed(self, config: Config) -> None:
        """A reloaded config (the deadline, the protected namespaces): apply what it needs."""
        self._config = config
        self.refresh()

    # ------------------------------------------------------------ applying

    def _poke(self, force: bool = False) -> None:
        if force:
            self._force = True
        if not self.active or self._busy or self._timer is not None:
            return
        wait = self._next - self._clock.seconds()
        if wait > 0:
            self._timer = self._clock.callLater(wait, self._fire)
        else:
            self._fire()

    def _fire(self) -> None:
        self._timer = None
        if not self.active or self._busy or self._client is None:  # a term has its client
            return
        if not self._force and (self.want is None or drifted(self._obj, self.want) is None):
            return
        given = self._bundle() if self._bundle is not None else None
        if self._bundle is not None and given is None:
            return  # amp's own CA is not made yet: refresh() when it is
        self._force = False
        self._busy = True
        self._next = self._clock.seconds() + self._config.registration.repair_interval
        term, before = self._term, self._obj
        config, own, client, read = self._config, self._own, self._client, self._read
        timeout = config.kubernetes.request_timeout

        def work() -> dict[str, Any]:
            want = desired(config, given if given is not None else read(config.registration.ca_bundle), own)
            client.apply_webhook_configuration(want, timeout)
            return want

        d = deferToThreadPool(self._reactor, self._reactor.getThreadPool(), work)
        d.addCallbacks(
            lambda want: self._applied(term, before, want), lambda failure: self._failed(term, failure.value)
        )
        d.addErrback(lambda failure: self.log.failure("The managed registration failed", failure))

    def _applied(self, term: int, before: Any, want: dict[str, Any]) -> None:
        if term != self._term:
            return
        self._busy = False
        self.want = want
        if self.failures:
            self.log.info(
                "MutatingWebhookConfiguration {name}: applied again after {failures} failure(s)",
                name=want["metadata"]["name"],
                failures=self.failures,
            )
        self.failures, self._last_error = 0, ""
        where = drifted(before, want) if before is not _UNSEEN else None
        if where is not None:
            self._metrics.registration_repairs.inc()
            self.log.warn(
                "MutatingWebhookConfiguration {name}: repaired {where} (registration.managed)",
                name=want["metadata"]["name"],
                where=where,
                registration_repair=where,
            )
        # An edit seen while the apply ran is judged against what was applied.
        if self._force or (self._obj is not before and drifted(self._obj, want) is not None):
            self._poke()

    def _failed(self, term: int, error: BaseException) -> None:
        if term != self._term:
            return
        self._busy = False
        kube = self._config.kubernetes
        delay = kube.backoff_initial + backoff_delay(
            self.failures, kube.backoff_initial, kube.backoff_max, self._random
        )
        self.failures += 1
        text = describe(error)
        if getattr(error, "status", None) == 403 and self._obj is None:
            text += (
                ": the configuration does not exist and amp may only patch it (deploy/managed grants no create):"
                " apply it again from the chart or the overlay"
            )
        if text != self._last_error:
            self.log.warn(
                "MutatingWebhookConfiguration {name}: the apply failed ({error}); retrying with backoff",
                name=kube.webhook_configuration,
                error=text,
            )
        self._last_error = text
        self._next = self._clock.seconds() + delay
        self._poke(force=True)
