"""
The kind of reactor the endpoint client needs, for type checking (modelled
on treq's C{_ITreqReactor}).
"""

from __future__ import annotations

from twisted.internet.interfaces import IReactorPluggableNameResolver, IReactorTCP, IReactorTime


class IEndpointReactor(IReactorTCP, IReactorTime, IReactorPluggableNameResolver):
    """
    What the endpoint client uses of its reactor: TCP connects, timers (the
    call's timer, the pool's idle timers, the TLS files' re-check), and the
    non-blocking name resolver that SSRF-checked connecting asks.  That is
    what C{HostnameEndpoint} needs too (C{IReactorPluggableResolver}, the
    deprecated alternative, is not modelled).

    A client given a C{connector} of in-memory connections (tests,
    C{amp explain --reply}) uses only the timers: a
    L{twisted.internet.task.Clock} will do.
    """
