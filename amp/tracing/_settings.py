"""
What tracing runs with (pure): the C{tracing} section of amp's config and
the standard C{OTEL_*} environment variables resolved into one
L{Settings}.

Which wins: a key set in the config file wins; a key left null (or, for
C{headers}, empty) defers to its environment variable, and then to the
SDK's default.  C{OTEL_SDK_DISABLED=true} keeps tracing off whatever the
file says.  The sampler: C{tracing.sampling_ratio}, else
C{OTEL_TRACES_SAMPLER} (C{always_on}, C{always_off}, C{traceidratio},
C{parentbased_always_on}, C{parentbased_always_off},
C{parentbased_traceidratio}) with C{OTEL_TRACES_SAMPLER_ARG}, else
C{parentbased_always_on}.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional

from amp.config import TracingConfig
from amp.tracing._context import Sampler

#: The samplers of C{OTEL_TRACES_SAMPLER} amp knows: (parent-based, fixed ratio or None: the argument's).
_SAMPLERS: dict[str, tuple[bool, Optional[float]]] = {
    "always_on": (False, 1.0),
    "always_off": (False, 0.0),
    "traceidratio": (False, None),
    "parentbased_always_on": (True, 1.0),
    "parentbased_always_off": (True, 0.0),
    "parentbased_traceidratio": (True, None),
}


@dataclass(frozen=True)
class Exporting:
    """
    How spans leave amp: a change of any of these makes a new exporter.
    C{endpoint} and C{headers} None: the exporter reads the C{OTEL_*}
    variables itself.
    """

    protocol: str = "grpc"
    endpoint: Optional[str] = None
    headers: Optional[tuple[tuple[str, str], ...]] = None
    service_name: Optional[str] = None
    queue: int = 2048
    batch: int = 512
    interval: float = 1.0
    export_timeout: float = 10.0


@dataclass(frozen=True)
class Settings:
    """
    Tracing as it runs: on or off, the sampler, and how spans are exported.
    C{problems}: what of the environment amp could not use (logged).
    """

    enabled: bool
    sampler: Sampler
    exporting: Exporting
    problems: tuple[str, ...] = field(default=())


def _sampler(config: TracingConfig, environ: Mapping[str, str]) -> tuple[Sampler, list[str]]:
    if config.sampling_ratio is not None:
        return Sampler(config.sampling_ratio, True), []
    name = environ.get("OTEL_TRACES_SAMPLER", "").strip().lower()
    if not name:
        return Sampler(1.0, True), []
    if name not in _SAMPLERS:
        return Sampler(1.0, True), [
            f"OTEL_TRACES_SAMPLER={name!r} is not one amp knows ({', '.join(_SAMPLERS)}): parentbased_always_on instead"
        ]
    parent_based, ratio = _SAMPLERS[name]
    problems = []
    if ratio is None:
        arg = environ.get("OTEL_TRACES_SAMPLER_ARG", "").strip()
        try:
            ratio = float(arg) if arg else 1.0
            if not 0 <= ratio <= 1:
                raise ValueError
        except ValueError:
            problems.append(f"OTEL_TRACES_SAMPLER_ARG={arg!r} is not a ratio in [0, 1]: 1.0 instead")
            ratio = 1.0
    return Sampler(ratio, parent_based), problems


def resolve(config: TracingConfig, environ: Mapping[str, str]) -> Settings:
    """The L{Settings} of C{config} under the environment C{environ}."""
    sampler, problems = _sampler(config, environ)
    disabled = environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"
    service_name = config.service_name
    if (
        service_name is None
        and not environ.get("OTEL_SERVICE_NAME")
        and "service.name=" not in environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
    ):
        service_name = "amp"
    exporting = Exporting(
        protocol=config.protocol,
        endpoint=config.endpoint,
        headers=tuple(sorted(config.headers.items())) if config.headers else None,
        service_name=service_name,
        queue=config.queue,
        batch=config.batch,
        interval=config.interval,
        export_timeout=config.export_timeout,
    )
    return Settings(config.enabled and not disabled, sampler, exporting, tuple(problems))
