"""
The unit layer's rule, checked rather than trusted: a test under
tests/unit/ opens no network socket.  Loopback servers, in-process amps on
a port, fake API servers and real processes are tests/integration/'s.

L{no_network} is an autouse fixture of tests/unit/conftest.py: while a unit
test runs, binding or connecting an internet socket (IPv4 or IPv6) raises
L{NetworkInUnitTest}, and the test fails at teardown with what it tried,
even when the code under test caught the exception.  Local sockets
(C{AF_UNIX}: a socketpair, a reactor's waker) are allowed.
"""

from __future__ import annotations

import socket
from typing import Any, Callable, Iterator

import pytest

_INTERNET = (socket.AF_INET, socket.AF_INET6)


class NetworkInUnitTest(Exception):
    """A unit test bound or connected an internet socket."""


def _guarded(name: str, real: Callable[..., Any], attempts: list[str]) -> Callable[..., Any]:
    def method(self: socket.socket, address: Any, *args: Any) -> Any:
        if self.family in _INTERNET:
            attempts.append(f"{name} {address!r}")
            raise NetworkInUnitTest(
                f"a unit test may not {name} a network socket ({address!r}): "
                "a test over sockets belongs in tests/integration/"
            )
        return real(self, address, *args)

    return method


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Refuse network sockets for one test; yields the attempts (a test of the guard may clear them)."""
    attempts: list[str] = []
    for name in ("bind", "connect", "connect_ex"):
        monkeypatch.setattr(socket.socket, name, _guarded(name, getattr(socket.socket, name), attempts))
    yield attempts
    assert not attempts, "a unit test used the network: " + "; ".join(attempts)
