"""
What a watch thread tells the reactor: one small frozen dataclass per kind of
news.  These are the only values that cross from a list/watch thread to the
reactor (through L{amp.kube._bridge.Bridge}); each is immutable and holds
only what the thread already parsed, so the reactor never shares a mutable
object with a thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union


@dataclass(frozen=True, slots=True)
class Replaced:
    """
    A (re)list landed: C{items} is the whole collection as the thread's
    collector made it (a mapping of namespaces by name, a tuple of parsed
    objects), current as of C{resource_version}.  It replaces everything the
    reactor held for that kind.
    """

    items: Any
    resource_version: str


@dataclass(frozen=True, slots=True)
class Changed:
    """
    One watch event: C{kind} is C{ADDED}, C{MODIFIED} or C{DELETED}; C{obj}
    is what the thread's parser made of the object.
    """

    kind: str
    obj: Any
    resource_version: str


@dataclass(frozen=True, slots=True)
class Bookmark:
    """The server says the watch is current as of C{resource_version}."""

    resource_version: str


@dataclass(frozen=True, slots=True)
class Restarting:
    """
    The watch ended and starts again after C{delay} seconds.  C{reason} is
    one of C{timeout} (the server's own timeout; normal), C{expired} (410
    Gone: the next attempt relists), C{stalled} (nothing arrived within the
    read timeout), C{dropped} (the stream broke), C{error} (a request
    failed); C{error} says what happened, empty for a normal timeout.
    """

    reason: str
    error: str
    delay: float


@dataclass(frozen=True, slots=True)
class Crashed:
    """The thread's loop raised (a bug): it is gone, and says why."""

    error: str


WatchEvent = Union[Replaced, Changed, Bookmark, Restarting, Crashed]
