"""
twistd glue: C{twistd amp --config etc/amp.yaml}.

Options are checked before the reactor starts: a broken config or an
unusable certificate stops start-up with one line that names the key or file
and the problem, not a traceback.
"""

from __future__ import annotations

import sys
from typing import Any, Optional

from twisted.python import usage

from amp.config import Config, ConfigError, load_config
from amp.logs import make_observer


class Options(usage.Options):
    synopsis = "[--config FILE]"
    longdesc = "Run amp, the admission mutation proxy for Kubernetes."
    optParameters = [
        ["config", "c", "etc/amp.yaml", "Path to amp's YAML configuration."],
    ]
    optFlags = [
        ["check", None, "Check the configuration and certificate, then exit."],
    ]

    config: Config

    def postOptions(self) -> None:
        try:
            self.config = load_config(self["config"])
        except ConfigError as e:
            raise usage.UsageError(f"config {self['config']}: {e}") from None


def makeService(options: Options, reactor: Optional[Any] = None) -> Any:
    """
    Build amp's service from parsed options.
    """
    if reactor is None:
        from twisted.internet import reactor as global_reactor

        reactor = global_reactor
    from amp.metrics import Metrics
    from amp.service import make_amp_service
    from amp.tls import CertificateError

    config = options.config
    observer = make_observer(config.log.format, config.log.level, sys.stdout)
    try:
        service = make_amp_service(config, reactor, metrics=Metrics(), log_observer=observer, freeze_gc=True)
    except CertificateError as e:
        raise SystemExit(f"amp: {e}") from None
    if options["check"]:
        raise SystemExit(0)
    return service
