"""
The reactor as amp's I/O modules see it: one interface naming the parts of
Twisted's reactor they call (time, threads, descriptors, TCP, processes,
name resolution), for their type hints.  Declarations only, imported for type
checking (so a module that names it does not import the endpoint client):
a module takes the reactor as an argument, and only L{amp.tap.makeService}
and the command-line entry points take the global one.
"""

from __future__ import annotations

from twisted.internet.interfaces import (
    IReactorCore,
    IReactorFDSet,
    IReactorFromThreads,
    IReactorProcess,
    IReactorSocket,
    IReactorThreads,
)

from amp.endpoint._types import IEndpointReactor

__all__ = ["IAmpReactor"]


class IAmpReactor(
    IEndpointReactor,
    IReactorCore,
    IReactorThreads,
    IReactorFromThreads,
    IReactorFDSet,
    IReactorProcess,
    IReactorSocket,
):
    """
    What amp uses of the reactor it is given; every reactor amp runs on
    (epoll, poll, select) provides all of it.  Tests pass a
    C{MemoryReactorClock} or a C{Clock} where only part of it is used.
    """
