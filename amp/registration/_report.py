"""
The registration check in the daemon (reactor side): L{RegistrationReport}
is told each version of amp's MutatingWebhookConfiguration the watch sees
(and each serving certificate amp loads, each config it reloads), checks it (L{amp.registration.check}),
and reports the problems: one log line per change, the gauge
C{amp_registration_problems{problem}}, and L{RegistrationReport.problems} for
readiness details.  None of them makes amp unready: a registration problem is
the cluster's to fix, and amp answering is still better than not.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Sequence

from cryptography import x509
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from amp.config import Config
from amp.metrics import Metrics
from amp.registration._check import check
from amp.registration._needs import Needs, Problem, RegistrationProblem, needs

__all__ = ["RegistrationReport"]

_UNSEEN: Any = object()


class RegistrationReport:
    """
    The problems of the registration amp last saw.

    @param needs: what amp's config needs of it.
    @param metrics: where C{amp_registration_problems} is set.
    @param clock: "now", for certificate expiry.
    @param chain: the certificate chain amp serves now (leaf first; empty:
        the caBundle is not judged).
    """

    log = Logger()

    def __init__(
        self,
        needs: Needs,
        metrics: Metrics,
        clock: IReactorTime,
        chain: Callable[[], Sequence[x509.Certificate]] = tuple,
    ) -> None:
        self.needs = needs
        self._metrics = metrics
        self._clock = clock
        self._chain = chain
        self._obj: Any = _UNSEEN
        self.problems: tuple[Problem, ...] = ()
        self._told = False
        for name in RegistrationProblem:
            metrics.registration_problems.labels(name.value).set(0)

    def seen(self, obj: Optional[Mapping[str, Any]]) -> tuple[Problem, ...]:
        """
        The configuration as the watch has it now (None: it does not
        exist); checked and reported when its problems changed.
        """
        self._obj = obj
        return self._check()

    def config_changed(self, config: Config) -> tuple[Problem, ...]:
        """A reloaded config is in force: what it needs, checked again (deadline, endpoint timeouts)."""
        self.needs = needs(config, self.needs.own_namespace)
        return self._check() if self._obj is not _UNSEEN else self.problems

    def certificate_changed(self) -> tuple[Problem, ...]:
        """The serving certificate changed: check the caBundle again against it."""
        return self._check() if self._obj is not _UNSEEN else self.problems

    def _check(self) -> tuple[Problem, ...]:
        problems = check(self._obj, self.needs, self._chain(), self._clock.seconds())
        if problems == self.problems and self._told:
            return problems
        # The first check is said whatever it found; then each change.
        self._told = True
        self.problems = problems
        counts = {name: 0 for name in RegistrationProblem}
        for problem in problems:
            counts[problem.name] += 1
        for name, count in counts.items():
            self._metrics.registration_problems.labels(name.value).set(count)
        if problems:
            self.log.warn(
                "MutatingWebhookConfiguration {name}: {count} registration problem(s): {problems}",
                name=self.needs.configuration,
                count=len(problems),
                problems="; ".join(str(p) for p in problems),
                registration_problems=[p.name.value for p in problems],
            )
        else:
            self.log.info("MutatingWebhookConfiguration {name}: no registration problem", name=self.needs.configuration)
        return problems
