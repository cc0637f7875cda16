"""
amp's configuration: ``etc/amp.yaml`` in, frozen dataclasses out (pure).

Every key is declared once, in L{amp.config._sections}: its kind (which
names its parser and how its value is written), its default, its
documentation and whether only a restart changes it (L{Key}, all of them
in L{KEYS}).  The loader (L{parse_config}, L{load_config}) reads each key
with the parser its declaration names, the rows of ``docs/config.md`` are
L{reference_row} of each key (a test keeps the page in step), and the Helm
chart's values schema is generated from L{KEYS}.

The file is reloaded while amp runs (L{amp.reload}); L{for_reload} keeps
the keys that only a restart can change at their running values and names
them, and L{config_digest} identifies the configuration in force.
L{effective_config} is the configuration in force as the file would say it
(C{twistd amp --check} prints it) and L{config_summary} its one-line
summary (logged at start-up).  Every error is a L{ConfigError} whose
message starts with the dotted key that is wrong, e.g.
``endpoints.overrides[0].timeout: expected a duration like 250ms, 2s or 1m``.
"""

from amp.config._declare import Key, Restart, declared_kinds
from amp.config._load import ConfigError, command_config, load_config, parse_config
from amp.config._reference import reference_row, rewrite_reference
from amp.config._running import RESTART_ONLY, config_digest, config_summary, effective_config, for_reload
from amp.config._sections import (
    KEYS,
    AuditConfig,
    BreakerConfig,
    BypassConfig,
    Config,
    DeadlineConfig,
    EndpointOverride,
    EndpointsConfig,
    EndpointSettings,
    KubernetesConfig,
    ListenConfig,
    LogConfig,
    MetricsConfig,
    PatchConfig,
    RecordConfig,
    RegistrationConfig,
    StaticNamespace,
    TLSConfig,
    TracingConfig,
)
from amp.config._values import Kind, parse_duration, parse_size

__all__ = [
    "KEYS",
    "RESTART_ONLY",
    "AuditConfig",
    "BreakerConfig",
    "BypassConfig",
    "Config",
    "ConfigError",
    "DeadlineConfig",
    "EndpointOverride",
    "EndpointSettings",
    "EndpointsConfig",
    "Key",
    "Kind",
    "KubernetesConfig",
    "ListenConfig",
    "LogConfig",
    "MetricsConfig",
    "PatchConfig",
    "RecordConfig",
    "RegistrationConfig",
    "Restart",
    "StaticNamespace",
    "TLSConfig",
    "TracingConfig",
    "command_config",
    "config_digest",
    "config_summary",
    "declared_kinds",
    "effective_config",
    "for_reload",
    "load_config",
    "parse_config",
    "parse_duration",
    "parse_size",
    "reference_row",
    "rewrite_reference",
]
