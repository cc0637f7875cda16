"""
Whether a TCP port can be listened on, and if not, who holds it.

amp checks its listening ports (C{listen.port}, C{metrics.port}) before it
starts, so a taken port stops start-up with one line naming the config key
and the process holding the port (C{pid N (command)}) instead of a
traceback; the local demo checks its ports the same way.  The holder is
read from Linux's C{/proc} (the listening socket's inode in
C{/proc/net/tcp} and C{tcp6}, then the process with a descriptor on it);
elsewhere, or for another user's process, the answer says how to find out.

These are blocking reads of small kernel tables, for start-up and
command-line programs only, never the reactor thread.
"""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path
from typing import Iterator, Optional

__all__ = ["listening_inodes", "port_holder", "listen_problem"]


def listening_inodes(port: int) -> set[str]:
    """
    Socket inodes of TCP listeners on C{port} (any address), from
    C{/proc/net/tcp} and C{/proc/net/tcp6}.
    """
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes


#: The most of a command line shown, on one line (its whitespace collapsed).
_COMMAND_SHOWN = 160


def _processes_holding(inodes: set[str], proc: Path = Path("/proc")) -> Iterator[tuple[int, str]]:
    """
    (pid, command line) of every process with an open descriptor on one
    of the socket C{inodes}.
    """
    targets = {f"socket:[{inode}]" for inode in inodes}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fds = list((entry / "fd").iterdir())
        except OSError:  # gone, or not ours to look at
            continue
        for fd in fds:
            try:
                if os.readlink(fd) not in targets:
                    continue
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:  # closed meanwhile (or the process is gone)
                continue
            command = " ".join(" ".join(a.decode(errors="replace") for a in argv).split())
            yield int(entry.name), command if len(command) <= _COMMAND_SHOWN else command[: _COMMAND_SHOWN - 3] + "..."
            break


def port_holder(port: int) -> str:
    """
    Who listens on TCP C{port}: C{pid N (command)}, or why that cannot be
    said and how to find out.
    """
    inodes = listening_inodes(port)
    if not inodes:
        return f"a process that cannot be named here (no listener in /proc/net/tcp; try: lsof -iTCP:{port})"
    holders = sorted(_processes_holding(inodes))
    if not holders:
        return f"a process of another user (try: sudo ss -ltnp 'sport = :{port}')"
    return ", ".join(f"pid {pid} ({command})" for pid, command in holders)


def listen_problem(interface: str, port: int, what: str = "") -> Optional[str]:
    """
    Why TCP C{port} on C{interface} cannot be listened on (C{port 8443 is
    in use by pid 12 (twistd amp)}, C{cannot listen on 10.9.9.9:8443:
    Cannot assign requested address}), or None when it can.  C{what}, when
    given, says in brackets after the port what it is for.

    The probe binds as Twisted's C{listenTCP} does (C{SO_REUSEADDR}), so a
    port in TIME_WAIT counts as free, as it is for amp.  Port 0 (any free
    port) is always free.
    """
    if port == 0:
        return None
    label = f" ({what})" if what else ""
    family = socket.AF_INET6 if ":" in interface else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((interface, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return f"port {port}{label} is in use by {port_holder(port)}"
            return f"cannot listen on {interface}:{port}{label}: {e.strerror}"
        except (socket.gaierror, UnicodeError, ValueError) as e:
            return f"cannot listen on {interface}:{port}{label}: {e}"
    return None
