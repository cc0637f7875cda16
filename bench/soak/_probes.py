"""
What the soak's driver (L{bench.soak.driver}) reads off amp from outside: its
RSS, file descriptors and threads from C{/proc}, JSON over HTTP, the serial of
the certificate it serves, and the hash of the config it runs.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
from typing import Any, Optional

from tests.support.prometheus import Scrape


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def thread_count(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    return 0


def http_json(port: int, path: str, method: str = "GET", timeout: float = 10.0) -> Any:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path)
        resp = conn.getresponse()
        data = resp.read()
    finally:
        conn.close()
    return json.loads(data)


def served_serial(port: int, ca: str) -> int:
    """
    The serial of the certificate amp presents to a new connection.
    """
    ctx = ssl.create_default_context(cafile=ca)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            return int(tls.getpeercert()["serialNumber"], 16)


def config_hash(port: int) -> Optional[str]:
    """The hash label of amp's C{amp_config_info}."""
    hashes = Scrape.get(port).by("amp_config_info", "hash")
    return next(iter(hashes)) if len(hashes) == 1 else None
