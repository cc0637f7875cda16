"""
Tests for C{workers}: several amp processes on one shared webhook socket,
each new connection accepted by the worker with the fewest (amp.balance,
amp.service, amp.tap, amp.workers).  The listener itself is tested in
tests/integration/loopback/test_balance.py.
"""

from __future__ import annotations

import http.client
import os
import signal
import socket
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest
import yaml
from twisted.internet import reactor
from twisted.internet.error import ProcessTerminated
from twisted.internet.testing import MemoryReactorClock
from twisted.python.failure import Failure
from twisted.python.usage import UsageError
from twisted.runner.procmon import ProcessMonitor

from amp.balance import SLOT, LoadTable, WorkerListener
from amp.tap import Options, makeService
from amp.workers import LISTEN_FD, LOAD_TABLE_FD, ParentWatch, worker_argv
from tests.support.helpers import ca_pem, decode_answer, raw_config, review_bytes
from tests.support.ports import free_ports
from tests.support.prometheus import Scrape
from tests.support.waiting import poll_until

REPO = Path(__file__).resolve().parents[3]


# ---------------------------------------------------------------- supervisor


class _Transport:
    pid = 4242

    def signalProcess(self, name: str) -> None:
        pass


class _SpawningReactor(MemoryReactorClock):
    def __init__(self) -> None:
        super().__init__()
        self.spawned: list[dict[str, Any]] = []

    def spawnProcess(
        self,
        protocol: Any,
        executable: Any,
        args: Any = (),
        env: Any = None,
        path: Any = None,
        uid: Any = None,
        gid: Any = None,
        usePTY: bool = False,
        childFDs: Any = None,
    ) -> Any:
        self.spawned.append(
            {"executable": executable, "args": list(args), "env": env, "childFDs": childFDs, "protocol": protocol}
        )
        protocol.makeConnection(_Transport())
        return None


def _config_file(tmp_path: Path, **sections: Any) -> str:
    path = tmp_path / "amp.yaml"
    path.write_text(yaml.safe_dump(raw_config(**sections)))
    return str(path)


def _options(path: str, *extra: str) -> Options:
    options = Options()
    options.parseOptions(["--config", path, *extra])
    return options


def _monitors(service: Any) -> list[ProcessMonitor]:
    return [s for s in service if isinstance(s, ProcessMonitor)]


def _is_listening_on(fd: int, port: int) -> bool:
    with socket.socket(fileno=os.dup(fd)) as s:
        return bool(s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)) and s.getsockname()[1] == port


def test_worker_zero_binds_the_shared_socket_and_supervises_the_other_workers(tmp_path: Path) -> None:
    webhook, _ = free_ports()
    path = _config_file(tmp_path, workers=3, listen={"port": webhook})
    fake = _SpawningReactor()
    service = makeService(_options(path), reactor=fake)
    [monitor] = _monitors(service)
    assert not [s for s in service if isinstance(s, ParentWatch)]
    service.webhook.privilegedStartService()
    try:
        # Worker 0 binds the one socket itself (no TCP listen of the reactor's) and reads it.
        assert fake.tcpServers == [] and fake.adoptedPorts == []
        port = service.webhook.port
        assert port.getHost().port == webhook
        assert fake.readers == {port}
        monitor.startService()
        first, second = fake.spawned
        assert first["args"] == worker_argv(path, 1) and second["args"] == worker_argv(path, 2)
        assert first["args"][-8:] == [
            "--config",
            path,
            "--worker",
            "1",
            "--listen-fd",
            str(LISTEN_FD),
            "--load-table-fd",
            str(LOAD_TABLE_FD),
        ]
        assert first["executable"] == sys.executable
        assert first["env"] == dict(os.environ)
        # Log lines go straight to our stdout/stderr; stdin is the parent-alive pipe;
        # descriptors 3 and 4 are the shared socket and the load table.
        fds = first["childFDs"]
        assert sorted(fds) == [0, 1, 2, 3, 4] and [fds[0], fds[1], fds[2]] == ["w", 1, 2]
        assert _is_listening_on(fds[LISTEN_FD], webhook)
        assert os.fstat(fds[LOAD_TABLE_FD]).st_size == 3 * SLOT
        assert second["childFDs"] == fds

        # Worker 1 serves; when it exits its slot stops counting at once,
        # and its replacement gets the same descriptors.
        one = LoadTable.inherit(os.dup(fds[LOAD_TABLE_FD]), 1)
        one.publish(0)
        one.beat()
        protocol = first["protocol"]
        assert port.table.loads() == [0, 0, None]
        protocol.processEnded(Failure(ProcessTerminated(signal=signal.SIGKILL)))
        assert port.table.loads() == [0, None, None]
        fake.advance(monitor.minRestartDelay)
        assert len(fake.spawned) == 3
        assert fake.spawned[2]["args"] == worker_argv(path, 1)
        assert fake.spawned[2]["childFDs"] == fds
        monitor.stopService()
    finally:
        service.webhook.stopService()


@pytest.fixture
def shared(tmp_path: Path) -> Iterator[tuple[int, list[str]]]:
    """
    A shared socket and load table for two workers as worker 0 makes them:
    the webhook port, and the options a worker 1 in this process is given
    (copies of the descriptors, which it takes over).
    """
    webhook, _ = free_ports()
    first = WorkerListener.bind(reactor, "127.0.0.1", webhook, workers=2)
    listen_fd, table_fd = first.descriptors()
    try:
        yield webhook, ["--listen-fd", str(os.dup(listen_fd)), "--load-table-fd", str(os.dup(table_fd))]
    finally:
        os.close(table_fd)
        # The listener's socket object owns listen_fd: closed behind its
        # back, its finalizer would close the number again whenever the
        # garbage collector gets to it (the listener is in a reference
        # cycle), by then another test's descriptor.
        first._socket.close()


def test_a_worker_never_supervises_and_serves_metrics_on_its_own_port(
    tmp_path: Path, shared: tuple[int, list[str]]
) -> None:
    webhook, inherited = shared
    # Free ports: start-up checks that this worker's metrics port can be listened on.
    _, metrics = free_ports()
    path = _config_file(tmp_path, workers=2, listen={"port": webhook}, metrics={"port": metrics})
    fake = _SpawningReactor()
    service = makeService(_options(path, "--worker", "1", *inherited), reactor=fake)
    assert _monitors(service) == []
    assert [s for s in service if isinstance(s, ParentWatch)]
    service.metrics_listener.privilegedStartService()
    assert [(p[0], p[3]) for p in fake.tcpServers] == [(metrics + 1, "0.0.0.0")]


def test_a_worker_takes_the_shared_socket_over_and_never_binds(tmp_path: Path, shared: tuple[int, list[str]]) -> None:
    webhook, inherited = shared
    path = _config_file(tmp_path, workers=2, listen={"port": webhook})
    fake = _SpawningReactor()
    service = makeService(_options(path, "--worker", "1", *inherited), reactor=fake)
    service.webhook.privilegedStartService()
    try:
        assert fake.tcpServers == [] and fake.adoptedPorts == []
        port = service.webhook.port
        assert port.getHost().port == webhook
        assert port.table.worker == 1 and port.table.loads() == [None, 0]
        assert fake.readers == {port}
        # The webhook site reports its connections to the table.
        service.webhook_server.on_connections(3)
        assert port.table.loads() == [None, 3]
    finally:
        service.webhook.stopService()


def test_a_worker_above_zero_needs_the_shared_descriptors(tmp_path: Path) -> None:
    path = _config_file(tmp_path, workers=2, listen={"port": 18443})
    with pytest.raises(UsageError, match="--worker 1: needs --listen-fd and --load-table-fd"):
        _options(path, "--worker", "1", "--listen-fd", "3")
    with pytest.raises(UsageError, match="--listen-fd and --load-table-fd: only for workers above 0"):
        _options(path, "--listen-fd", "3", "--load-table-fd", "4")


def test_a_worker_given_the_wrong_descriptors_stops_with_one_line(tmp_path: Path) -> None:
    path = _config_file(tmp_path, workers=2, listen={"port": 18443})
    read, write = os.pipe()
    try:
        options = _options(path, "--worker", "1", "--listen-fd", str(read), "--load-table-fd", str(write))
        with pytest.raises(SystemExit, match=f"amp: worker 1: descriptor {read} is not a socket"):
            makeService(options, reactor=_SpawningReactor())
    finally:
        os.close(read)
        os.close(write)


def test_one_worker_is_todays_amp(tmp_path: Path) -> None:
    # Free ports: start-up checks that they can be listened on.
    webhook, metrics = free_ports()
    path = _config_file(tmp_path, listen={"port": webhook}, metrics={"port": metrics})
    fake = _SpawningReactor()
    service = makeService(_options(path), reactor=fake)
    assert _monitors(service) == []
    assert not [s for s in service if isinstance(s, ParentWatch)]
    service.webhook.privilegedStartService()
    service.metrics_listener.privilegedStartService()
    # An ordinary TCP listen: no shared socket, no load table.
    assert [(p[0], p[3]) for p in fake.tcpServers] == [(webhook, "127.0.0.1"), (metrics, "0.0.0.0")]
    assert fake.adoptedPorts == [] and fake.readers == set()
    assert service.webhook_server.on_connections is None


def test_worker_index_out_of_range_is_a_usage_error(tmp_path: Path) -> None:
    path = _config_file(tmp_path, workers=2, listen={"port": 18443})
    with pytest.raises(UsageError, match=r"--worker: expected 0 to 1 \(workers: 2\), got 2"):
        _options(path, "--worker", "2")


def test_workers_need_a_fixed_webhook_port(tmp_path: Path) -> None:
    path = _config_file(tmp_path, workers=2)
    with pytest.raises(SystemExit, match="listen.port: workers share the webhook port, so it cannot be 0"):
        _options(path)


def test_metrics_ports_must_fit(tmp_path: Path) -> None:
    path = _config_file(tmp_path, workers=3, listen={"port": 18443}, metrics={"port": 65534})
    with pytest.raises(SystemExit, match="metrics.port: 65534 \\+ one port per worker \\(3\\) goes past 65535"):
        _options(path)


# ---------------------------------------------------------------- two real processes


def _reviews_answered(port: int) -> Optional[int]:
    try:
        return int(Scrape.get(port, timeout=2).total("amp_admission_requests_total"))
    except (OSError, RuntimeError):
        return None


def _open_connections(port: int) -> Optional[int]:
    try:
        return int(Scrape.get(port, timeout=2).total("amp_open_connections"))
    except (OSError, RuntimeError):
        return None


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def _gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


class _Pair:
    """C{twistd amp} with C{workers: 2} as a subprocess."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.webhook, self.metrics = free_ports()
        path = _config_file(tmp_path, workers=2, listen={"port": self.webhook}, metrics={"port": self.metrics})
        self.log = open(tmp_path / "amp.log", "wb")
        self.seen: list[int] = []
        env = dict(os.environ, PYTHONPATH=str(REPO))
        twistd = Path(sys.executable).with_name("twistd")
        self.parent = subprocess.Popen(
            [str(twistd), "-n", "--pidfile=", "amp", "--config", path],
            cwd=tmp_path,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def output(self) -> str:
        return (self.tmp_path / "amp.log").read_text(errors="replace")[-4000:]

    def counts(self) -> tuple[Optional[int], Optional[int]]:
        """Reviews answered by worker 0 and worker 1 (None: not listening)."""
        return _reviews_answered(self.metrics), _reviews_answered(self.metrics + 1)

    def open_connections(self) -> tuple[Optional[int], Optional[int]]:
        """Webhook connections open on worker 0 and worker 1 (None: not listening)."""
        return _open_connections(self.metrics), _open_connections(self.metrics + 1)

    def wait_serving(self) -> int:
        """Wait until both workers serve metrics; returns worker 1's pid."""
        poll_until("both workers' metrics", lambda: True if None not in self.counts() else None, 60, self.output)
        children = _children(self.parent.pid)
        self.seen.extend(children)
        assert len(children) == 1, children
        return children[0]

    def reap(self) -> None:
        """Kill any worker a failed test left behind."""
        for pid in self.seen:
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.parent.poll() is None:
            self.parent.send_signal(sig)
        try:
            self.parent.wait(timeout=60)
        finally:
            if self.parent.poll() is None:
                self.parent.kill()
                self.parent.wait()
            self.log.close()


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[_Pair]:
    started = _Pair(tmp_path)
    try:
        yield started
    finally:
        started.stop(signal.SIGKILL)
        started.reap()


def _connect_all(port: int, n: int) -> list[http.client.HTTPSConnection]:
    """
    C{n} keep-alive TLS connections opened at once: every TCP connection is
    made (and waits in the kernel's accept queue) before the first TLS
    handshake.
    """
    context = ssl.create_default_context(cadata=ca_pem().decode())
    raw = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(n)]
    connections = []
    for s in raw:
        connection = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=context)
        connection.sock = context.wrap_socket(s, server_hostname="127.0.0.1")
        connections.append(connection)
    return connections


def _review(connection: http.client.HTTPSConnection, uid: str) -> None:
    connection.request(
        "POST", "/mutate", body=review_bytes(namespace="default", uid=uid), headers={"Content-Type": "application/json"}
    )
    response = connection.getresponse()
    body = response.read()
    assert response.status == 200, body
    answer = decode_answer(body)["response"]
    assert answer["uid"] == uid and answer["allowed"] is True, answer


def _close_all(connections: list[http.client.HTTPSConnection]) -> None:
    for connection in connections:
        connection.close()


def test_two_workers_share_the_port_evenly_and_stop_together(pair: _Pair) -> None:
    connections: list[http.client.HTTPSConnection] = []
    try:
        child = pair.wait_serving()
        connections = _connect_all(pair.webhook, 16)
        for i, connection in enumerate(connections):
            _review(connection, f"uid-{i}")
        # Each new connection went to the worker with the fewest.
        assert pair.open_connections() == (8, 8), pair.output()
        assert pair.counts() == (8, 8)
    finally:
        _close_all(connections)
        pair.stop()
    # twistd ends by re-raising the signal it was stopped with.
    assert pair.parent.returncode in (0, -signal.SIGTERM), pair.output()
    # Worker 0 waited for its child: it is gone by the time worker 0 is.
    assert _gone(child), pair.output()


def test_a_worker_that_dies_is_restarted_with_the_shared_socket(pair: _Pair) -> None:
    connections: list[http.client.HTTPSConnection] = []
    try:
        child = pair.wait_serving()
        os.kill(child, signal.SIGKILL)
        poll_until("worker 1 to stop serving", lambda: True if pair.counts()[1] is None else None, 60, pair.output)
        replacement = poll_until(
            "a new worker 1", lambda: [p for p in _children(pair.parent.pid) if p != child] or None, 60, pair.output
        )
        poll_until("the new worker 1's metrics", lambda: pair.counts()[1], 60, pair.output)
        assert len(replacement) == 1
        pair.seen.extend(replacement)
        # The new worker 1 accepts from the same socket.
        connections = _connect_all(pair.webhook, 2)
        for i, connection in enumerate(connections):
            _review(connection, f"uid-{i}")
        assert pair.open_connections() == (1, 1), pair.output()
    finally:
        _close_all(connections)
        pair.stop()


def test_a_killed_workers_connections_are_taken_over(pair: _Pair) -> None:
    connections: list[http.client.HTTPSConnection] = []
    try:
        child = pair.wait_serving()
        connections = _connect_all(pair.webhook, 16)
        for i, connection in enumerate(connections):
            _review(connection, f"uid-{i}")
        assert pair.open_connections() == (8, 8), pair.output()
        os.kill(child, signal.SIGKILL)
        poll_until(f"worker process {child} to exit", lambda: True if _gone(child) else None, 60, pair.output)
        # Worker 1's clients find their connections closed, connect again
        # (as the API server does) and are answered.
        reconnected = 0
        for i, connection in enumerate(connections):
            try:
                _review(connection, f"again-{i}")
            except (http.client.HTTPException, OSError):
                connection.close()
                connections[i] = _connect_all(pair.webhook, 1)[0]
                _review(connections[i], f"again-{i}")
                reconnected += 1
        assert reconnected == 8
        # Every one is open on a live worker: worker 0, or worker 1's replacement.
        poll_until(
            "16 connections open",
            lambda: True if sum(c or 0 for c in pair.open_connections()) == 16 else None,
            60,
            pair.output,
        )
    finally:
        _close_all(connections)
        pair.stop()


def test_a_hung_worker_is_passed_over(pair: _Pair) -> None:
    connections: list[http.client.HTTPSConnection] = []
    more: list[http.client.HTTPSConnection] = []
    child = 0
    try:
        child = pair.wait_serving()
        connections = _connect_all(pair.webhook, 16)
        for i, connection in enumerate(connections):
            _review(connection, f"uid-{i}")
        assert pair.open_connections() == (8, 8), pair.output()
        os.kill(child, signal.SIGSTOP)
        # Worker 1 is alive but answers nothing: once its heartbeat is a
        # second old, worker 0 takes every new connection.
        more = _connect_all(pair.webhook, 4)
        for i, connection in enumerate(more):
            _review(connection, f"more-{i}")
        assert _open_connections(pair.metrics) == 12
    finally:
        if child:
            os.kill(child, signal.SIGCONT)
        _close_all(connections + more)
        pair.stop()


def test_workers_stop_when_worker_zero_is_killed(pair: _Pair) -> None:
    try:
        child = pair.wait_serving()
    finally:
        pair.stop(signal.SIGKILL)
    poll_until(f"worker process {child} to exit", lambda: True if _gone(child) else None, 60, pair.output)
