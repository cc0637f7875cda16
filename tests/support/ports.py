"""
Ports for the tests that run amp as a real process (C{twistd amp}), and what
the kernel says about them.

A port taken with C{bind(port 0)} and released is in the kernel's ephemeral
range, where any outgoing connection may take it as its source port before
amp listens on it, or connect to itself on it (a client polling a port
nobody listens on yet then reads its own request back).  L{free_port} and
L{free_ports} choose below that range, where only an explicit bind lands.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

from amp.ports import listening_inodes


def _ephemeral_low() -> int:
    low, _ = (int(n) for n in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    return low


def _bindable(ports: set[int]) -> bool:
    held = []
    try:
        for port in ports:
            s = socket.socket()
            held.append(s)
            s.bind(("", port))
    except OSError:
        return False
    finally:
        for s in held:
            s.close()
    return True


def free_ports() -> tuple[int, int]:
    """
    A free port for the webhook and a free pair (base, base+1) for metrics,
    below the kernel's ephemeral range: there no other test's port-0
    listener or outgoing connection can take one of them between this check
    and amp's start (amp listens on every interface they are free on).
    """
    low = _ephemeral_low()
    rng = random.Random()
    for _ in range(200):
        webhook, base = rng.randrange(10000, low - 1), rng.randrange(10000, low - 1)
        wanted = {webhook, base, base + 1}
        if len(wanted) == 3 and _bindable(wanted):
            return webhook, base
    raise AssertionError("no free ports below the ephemeral range")


def free_port() -> int:
    """One free port below the kernel's ephemeral range (see L{free_ports})."""
    return free_ports()[0]


def listening(port: int) -> bool:
    """
    Whether any socket on this host listens on TCP C{port}, as the kernel
    reports it (C{/proc/net/tcp}, C{/proc/net/tcp6}): a listening socket
    shared by several processes is listed until its last copy is closed.
    """
    return bool(listening_inodes(port))
