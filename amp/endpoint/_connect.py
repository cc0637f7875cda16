"""
SSRF-checked connecting: the connect endpoint for one endpoint host, which
never reaches an address in C{endpoints.deny_networks}.

An IP literal is checked once, when its target is built (L{denied_literal}),
and connected to directly.  A host name is resolved once per new connection
through the reactor's non-blocking C{IHostnameResolver} (or the client's
C{resolver}); every address found is checked, IPv4-mapped and NAT64 IPv6
addresses as the IPv4 address they carry, and if any is denied the connect
fails with L{DeniedAddress} and nothing is connected to, not even an allowed
address of the same answer.  Otherwise the connection goes to exactly those
addresses: through C{HostnameEndpoint} built on a reactor whose resolver can
only give that answer (L{_AnsweredReactor}), so nothing is looked up a second
time between the check and the connect.  Its attempt beat is 50 ms instead
of the default 0.3 s, on which it also notices that every address failed:
with the default a refused connection took 0.3 s to report.

https endpoints get client TLS (L{amp.endpoint._tls}); TLS (SNI and the name
check) always uses the URL's host, never the address.

This rests on C{HostnameEndpoint} asking its reactor's C{nameResolver} at
connect time and connecting through that reactor (public behaviour of
C{IReactorPluggableNameResolver}); C{tests/unit/endpoint/test_ssrf.py} pins it.
"""

from __future__ import annotations

from typing import Any, Optional

from twisted.internet import error as ierror
from twisted.internet.abstract import isIPAddress, isIPv6Address
from twisted.internet.address import IPv4Address, IPv6Address
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import HostnameEndpoint, TCP4ClientEndpoint, TCP6ClientEndpoint, wrapClientTLS
from twisted.internet.interfaces import (
    IAddress,
    IHostnameResolver,
    IHostResolution,
    IProtocol,
    IProtocolFactory,
    IReactorPluggableNameResolver,
    IResolutionReceiver,
    IStreamClientEndpoint,
)
from twisted.logger import Logger
from zope.interface import implementer

from amp.config import EndpointSettings
from amp.endpoint._failures import LocalFailure
from amp.endpoint._tls import ReloadingClientTLS
from amp.endpoint._types import IEndpointReactor
from amp.reasons import Reason
from amp.urls import denied_network

# HostnameEndpoint starts a connect to the next resolved address every this
# many seconds, and only notices that every attempt failed on that beat: its
# default (0.3s) would make a refused connection take 0.3s to report.  An IP
# literal skips resolution and connects directly.
ATTEMPT_DELAY = 0.05

log = Logger()


class DeniedAddress(LocalFailure):
    """
    A host name resolved into C{endpoints.deny_networks}: nothing was
    connected to.  amp's policy, not the endpoint's health: not counted by
    the breaker.
    """

    def __init__(self, host: str, address: str, network: Any) -> None:
        super().__init__(
            Reason.DENIED_ADDRESS, f"host {host} resolves to {address}, which is in endpoints.deny_networks ({network})"
        )
        self.host = host
        self.address = address


def denied_literal(host: str, settings: EndpointSettings) -> Optional[str]:
    """
    Why an IP literal host may not be called (it is in a denied network),
    or None (also for host names: those are checked when they resolve).
    """
    if isIPAddress(host) or isIPv6Address(host):
        net = denied_network(host, settings.deny_networks)
        if net is not None:
            return f"address {host} is in endpoints.deny_networks ({net})"
    return None


@implementer(IHostResolution)
class Resolution:
    """
    One resolution of a name (nothing to cancel: the answers are handed over
    or dropped).
    """

    def __init__(self, name: str) -> None:
        self.name = name

    def cancel(self) -> None:
        pass


@implementer(IResolutionReceiver)
class _Addresses:
    """
    Collects one resolution's addresses; C{done} fires with them.
    """

    def __init__(self) -> None:
        self.addresses: list[IAddress] = []
        self.done: Deferred[list[IAddress]] = Deferred()

    def resolutionBegan(self, resolution: IHostResolution) -> None:
        pass

    def addressResolved(self, address: IAddress) -> None:
        self.addresses.append(address)

    def resolutionComplete(self) -> None:
        self.done.callback(self.addresses)


@implementer(IHostnameResolver)
class _Answered:
    """
    A resolver that knows one answer, already checked: whatever name it is
    asked about, it reports exactly these addresses (with the asked port).
    """

    def __init__(self, addresses: list[IPv4Address | IPv6Address]) -> None:
        self._addresses = addresses

    def resolveHostName(
        self,
        receiver: IResolutionReceiver,
        hostName: str,
        portNumber: int = 0,
        addressTypes: Any = None,
        transportSemantics: str = "TCP",
    ) -> IHostResolution:
        resolution = Resolution(hostName)
        receiver.resolutionBegan(resolution)
        for a in self._addresses:
            if isinstance(a, IPv6Address):
                receiver.addressResolved(IPv6Address("TCP", a.host, portNumber, a.flowInfo, a.scopeID))
            else:
                receiver.addressResolved(IPv4Address("TCP", a.host, portNumber))
        receiver.resolutionComplete()
        return resolution


@implementer(IReactorPluggableNameResolver)
class _AnsweredReactor:
    """
    The reactor, except that its name resolver is an L{_Answered}: what
    C{HostnameEndpoint} is built on, so that it connects to the checked
    addresses and cannot look the name up again.
    """

    def __init__(self, reactor: IEndpointReactor, addresses: list[IPv4Address | IPv6Address]) -> None:
        self._reactor = reactor
        self.nameResolver = _Answered(addresses)

    def installNameResolver(self, resolver: IHostnameResolver) -> IHostnameResolver:
        raise TypeError("the answer of this reactor's resolver is fixed")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reactor, name)


def _is_ip(host: str) -> bool:
    try:
        denied_network(host, ())
    except ValueError:
        return False
    return True


@implementer(IStreamClientEndpoint)
class CheckedHostEndpoint:
    """
    Connect to a host name: resolve it once, check every address against
    C{deny}, then connect to those addresses only (L{_AnsweredReactor}).

    @param resolver: an C{IHostnameResolver}, or None for the reactor's
        C{nameResolver} (looked up on each connect).
    """

    def __init__(
        self,
        reactor: IEndpointReactor,
        resolver: Optional[IHostnameResolver],
        host: str,
        port: int,
        timeout: float,
        deny: tuple[Any, ...],
    ) -> None:
        self._reactor = reactor
        self._resolver = resolver
        self._host = host
        self._port = port
        self._timeout = timeout
        self._deny = deny

    def connect(self, factory: IProtocolFactory) -> Deferred[IProtocol]:
        receiver = _Addresses()
        resolver = self._resolver if self._resolver is not None else self._reactor.nameResolver
        resolver.resolveHostName(receiver, self._host, portNumber=self._port)
        # A cancel before the answer fails the Deferred; the late answer is
        # then dropped (a Deferred cancelled without a canceller ignores it).
        return receiver.done.addCallback(self._connect_checked, factory)

    def _connect_checked(self, resolved: list[IAddress], factory: IProtocolFactory) -> Deferred[IProtocol]:
        addresses = [a for a in resolved if isinstance(a, (IPv4Address, IPv6Address)) and _is_ip(a.host)]
        if not addresses:
            raise ierror.DNSLookupError(f"no addresses for {self._host}")
        for a in addresses:
            net = denied_network(a.host, self._deny)
            if net is not None:
                log.warn(
                    "Not calling {host}: it resolves to {address}, in endpoints.deny_networks ({network})",
                    host=self._host,
                    address=a.host,
                    network=str(net),
                )
                raise DeniedAddress(self._host, a.host, net)
        endpoint = HostnameEndpoint(
            _AnsweredReactor(self._reactor, addresses),
            self._host,
            self._port,
            timeout=self._timeout,
            attemptDelay=ATTEMPT_DELAY,
        )
        return endpoint.connect(factory)


def connect_endpoint(
    reactor: IEndpointReactor,
    resolver: Optional[IHostnameResolver],
    settings: EndpointSettings,
    scheme: bytes,
    host: str,
    port: int,
) -> IStreamClientEndpoint:
    """
    The connect endpoint for one endpoint host and port under C{settings}:
    C{connect_timeout}, the deny list for host names, and for https the
    reloading client TLS.

    @raise LocalFailure: C{tls-error} when the TLS files do not load.
    """
    timeout = settings.connect_timeout
    endpoint: IStreamClientEndpoint
    if isIPAddress(host):
        endpoint = TCP4ClientEndpoint(reactor, host, port, timeout=timeout)
    elif isIPv6Address(host):
        endpoint = TCP6ClientEndpoint(reactor, host, port, timeout=timeout)
    else:
        endpoint = CheckedHostEndpoint(reactor, resolver, host, port, timeout, settings.deny_networks)
    if scheme == b"https":
        endpoint = wrapClientTLS(ReloadingClientTLS(settings, host, reactor), endpoint)
    return endpoint
