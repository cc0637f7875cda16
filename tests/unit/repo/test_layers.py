"""
The test tree's layers hold: a unit test cannot open a network socket
(L{tests.support.network_guard}, every test under tests/unit/), and a
connection attempt the code under test swallows still fails the test.
"""

from __future__ import annotations

import socket

import pytest

from tests.support.network_guard import NetworkInUnitTest


def test_a_unit_test_cannot_bind_or_connect_a_network_socket(no_network: list[str]) -> None:
    with socket.socket() as s:
        with pytest.raises(NetworkInUnitTest, match="tests/integration/"):
            s.bind(("127.0.0.1", 0))
    with socket.socket() as s:
        with pytest.raises(NetworkInUnitTest):
            s.connect_ex(("127.0.0.1", 9))
    assert no_network == ["bind ('127.0.0.1', 0)", "connect_ex ('127.0.0.1', 9)"]
    no_network.clear()  # what the guard would fail this test with at teardown


def test_local_sockets_are_allowed() -> None:
    a, b = socket.socketpair()
    with a, b:
        a.sendall(b"x")
        assert b.recv(1) == b"x"
