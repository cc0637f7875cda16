"""
How a configuration key is declared, once (pure): L{declare} gives a field
of a section's frozen dataclass its kind (L{amp.config._values.Kind}), its
default, its documentation and whether only a restart changes it; the
parser of a section, the defaults, the rows of C{docs/config.md} and the
chart's values schema are all read from those declarations (L{KEYS}).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import StrEnum
from functools import cache
from typing import Any, Callable, Iterator

from amp.config._values import Kind

__all__ = ["Key", "Restart", "declare", "declared_keys", "declared_kinds", "parsers", "section"]

_KEY = "amp.config.key"
_SECTION = "amp.config.section"


class Restart(StrEnum):
    """
    Whether a running amp can change a key when its config file changes.
    """

    #: Reloaded between reviews.
    NEVER = "never"
    #: Only a restart changes it: the listening sockets, the serving
    #: certificate's files and how they are read, the number of processes.
    ALWAYS = "always"
    #: Only a restart changes it while namespaces come from the Kubernetes
    #: API (the watch was built from it); reloaded with the static source.
    KUBERNETES = "kubernetes"


@dataclass(frozen=True)
class Key:
    """
    One key of amp's configuration, as declared.

    @ivar path: the dotted key, as in the file (C{endpoints.breaker.cooldown}).
    @ivar kind: what it holds (C{kind.name}, C{kind.choices}, bounds).
    @ivar default: the value amp uses when the key is absent.
    @ivar doc: what it does (Markdown, one paragraph: the row's meaning in
        C{docs/config.md}).
    @ivar restart: whether only a restart changes it.
    """

    path: str
    kind: Kind
    default: Any
    doc: str
    restart: Restart = Restart.NEVER

    @property
    def restart_only(self) -> bool:
        """Only a restart changes it, at least with a Kubernetes source."""
        return self.restart is not Restart.NEVER

    @property
    def shown_default(self) -> str:
        """The default as it is written in a file (C{5s}, C{3MiB}, C{"true"}, C{null})."""
        return "null" if self.default is None else self.kind.show(self.default)


@dataclass(frozen=True)
class _Declared:
    kind: Kind
    doc: str
    restart: Restart


def declare(kind: Kind, default: Any, *, doc: str, restart: Restart = Restart.NEVER) -> Any:
    """
    A dataclass field holding a key: its kind, default, documentation and
    restart rule in one place.
    """
    metadata = {_KEY: _Declared(kind, doc, restart)}
    if isinstance(default, (dict, list, set)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def section(cls: type) -> Any:
    """
    A dataclass field holding a section of keys (another such dataclass).
    """
    return dataclasses.field(default_factory=cls, metadata={_SECTION: True})


def declared_keys(cls: type, prefix: str = "", *, flatten: Callable[[str], bool] = lambda name: False) -> Iterator[Key]:
    """
    The keys declared by section C{cls} and the sections within it, in
    declaration order, their paths under C{prefix}; a section whose field
    name C{flatten} accepts adds its keys under C{prefix} itself.
    """
    defaults = cls()
    for f in dataclasses.fields(cls):
        if f.metadata.get(_SECTION):
            inner = prefix if flatten(f.name) else f"{prefix}{f.name}."
            yield from declared_keys(type(getattr(defaults, f.name)), inner, flatten=flatten)
            continue
        declared = f.metadata.get(_KEY)
        if declared is not None:
            yield Key(prefix + f.name, declared.kind, getattr(defaults, f.name), declared.doc, declared.restart)


@cache
def parsers(cls: type) -> dict[str, Callable[[Any], Any]]:
    """
    The parser of every key section C{cls} itself declares that the
    loader reads one by one (its sections, and keys whose kind has no
    parser of its own, are the loader's).
    """
    return {
        f.name: f.metadata[_KEY].kind.parse
        for f in dataclasses.fields(cls)
        if _KEY in f.metadata and f.metadata[_KEY].kind.parse is not None
    }


def declared_kinds(cls: type) -> dict[str, Kind]:
    """
    The kind of every key section C{cls} itself declares (not those of
    its sections), by name, in declaration order.
    """
    return {f.name: f.metadata[_KEY].kind for f in dataclasses.fields(cls) if _KEY in f.metadata}
