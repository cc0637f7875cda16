"""
Tests for C{workers}: several amp processes on one webhook port with
C{SO_REUSEPORT} (amp.tls, amp.service, amp.tap, amp.workers).
"""

from __future__ import annotations

import http.client
import os
import signal
import random
import socket
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest
import yaml
from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.testing import MemoryReactorClock
from twisted.python.usage import UsageError
from twisted.runner.procmon import ProcessMonitor
from twisted.trial.unittest import TestCase

from amp.tap import Options, makeService
from amp.tls import ReloadingCertificate, tls_endpoint
from amp.workers import ParentWatch, worker_argv
from tests.prometheus import Scrape
from tests.helpers import ca_pem, decode_answer, dev_tls, raw_config, review_bytes, tls_exchange
from tests.waiting import poll_until

REPO = Path(__file__).resolve().parent.parent


def _reuse_port(listening: Any) -> int:
    return int(listening.socket.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT))


class _Say(Protocol):
    def connectionMade(self) -> None:
        self.transport.write(self.factory.word)  # type: ignore[attr-defined]
        self.transport.loseConnection()


def _saying(word: bytes) -> Factory:
    factory = Factory.forProtocol(_Say)
    factory.word = word  # type: ignore[attr-defined]
    return factory


class ListenerTests(TestCase):
    def certificate(self) -> ReloadingCertificate:
        tls = dev_tls()
        cert = ReloadingCertificate(str(tls["cert"]), str(tls["key"]), clock=reactor)
        cert.load()
        return cert

    @inlineCallbacks
    def test_two_reuse_port_listeners_share_a_port_and_both_answer_tls(self) -> Any:
        cert = self.certificate()
        a = yield tls_endpoint(reactor, 0, "127.0.0.1", cert, reuse_port=True).listen(_saying(b"a"))
        port = a.getHost().port
        b = yield tls_endpoint(reactor, port, "127.0.0.1", cert, reuse_port=True).listen(_saying(b"b"))
        yield b.stopListening()
        self.assertEqual((yield tls_exchange(reactor, port)), b"a")
        c = yield tls_endpoint(reactor, port, "127.0.0.1", cert, reuse_port=True).listen(_saying(b"c"))
        self.addCleanup(c.stopListening)
        yield a.stopListening()
        self.assertEqual((yield tls_exchange(reactor, port)), b"c")

    @inlineCallbacks
    def test_without_reuse_port_the_port_is_taken(self) -> Any:
        cert = self.certificate()
        a = yield tls_endpoint(reactor, 0, "127.0.0.1", cert, reuse_port=True).listen(_saying(b"a"))
        self.addCleanup(a.stopListening)
        from twisted.internet.error import CannotListenError

        with self.assertRaises(CannotListenError):
            yield tls_endpoint(reactor, a.getHost().port, "127.0.0.1", cert).listen(_saying(b"b"))


# ---------------------------------------------------------------- supervisor


class _SpawningReactor(MemoryReactorClock):
    def __init__(self) -> None:
        super().__init__()
        self.spawned: list[dict[str, Any]] = []

    def spawnProcess(self, protocol: Any, executable: Any, args: Any = (), env: Any = None, path: Any = None,
                     uid: Any = None, gid: Any = None, usePTY: bool = False, childFDs: Any = None) -> Any:
        self.spawned.append({"executable": executable, "args": list(args), "env": env, "childFDs": childFDs})
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


def test_worker_zero_supervises_the_other_workers(tmp_path: Path) -> None:
    path = _config_file(tmp_path, workers=2, listen={"port": 18443})
    fake = _SpawningReactor()
    service = makeService(_options(path), reactor=fake)
    [monitor] = _monitors(service)
    monitor.startService()
    [child] = fake.spawned
    assert child["args"] == worker_argv(path, 1)
    assert child["args"][-4:] == ["--config", path, "--worker", "1"]
    assert child["executable"] == sys.executable
    assert child["env"] == dict(os.environ)
    # Log lines go straight to our stdout/stderr; stdin is the parent-alive pipe.
    assert child["childFDs"] == {0: "w", 1: 1, 2: 2}
    assert not [s for s in service if isinstance(s, ParentWatch)]


def test_a_worker_never_supervises_and_serves_metrics_on_its_own_port(tmp_path: Path) -> None:
    path = _config_file(tmp_path, workers=2, listen={"port": 18443}, metrics={"port": 19090})
    fake = _SpawningReactor()
    service = makeService(_options(path, "--worker", "1"), reactor=fake)
    assert _monitors(service) == []
    assert [s for s in service if isinstance(s, ParentWatch)]
    service.metrics_listener.privilegedStartService()
    assert [(p[0], p[3]) for p in fake.tcpServers] == [(19091, "0.0.0.0")]


def test_several_workers_bind_the_webhook_port_with_reuse_port(tmp_path: Path) -> None:
    webhook, _ = _free_ports()
    path = _config_file(tmp_path, workers=2, listen={"port": webhook})
    fake = _SpawningReactor()
    service = makeService(_options(path, "--worker", "1"), reactor=fake)
    service.webhook.privilegedStartService()
    # Bound here with SO_REUSEPORT, then handed to the reactor.
    [(fileno, family, factory)] = fake.adoptedPorts
    assert family == socket.AF_INET
    assert fake.tcpServers == []


def test_one_worker_is_todays_amp(tmp_path: Path) -> None:
    path = _config_file(tmp_path, listen={"port": 18443}, metrics={"port": 19090})
    fake = _SpawningReactor()
    service = makeService(_options(path), reactor=fake)
    assert _monitors(service) == []
    assert not [s for s in service if isinstance(s, ParentWatch)]
    service.webhook.privilegedStartService()
    service.metrics_listener.privilegedStartService()
    # Without SO_REUSEPORT: an ordinary TCP listen (a reuse-port listen adopts a socket).
    assert [(p[0], p[3]) for p in fake.tcpServers] == [(18443, "127.0.0.1"), (19090, "0.0.0.0")]
    assert fake.adoptedPorts == []


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


def _free_ports() -> tuple[int, int]:
    """
    A free port for the webhook and a free pair (base, base+1) for metrics,
    below the kernel's ephemeral range: there no other test's port-0
    listener or outgoing connection can take one of them between this check
    and the workers' start (the workers listen on every interface).
    """
    low, _ = (int(n) for n in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    rng = random.Random()
    for _ in range(200):
        webhook, base = rng.randrange(10000, low - 1), rng.randrange(10000, low - 1)
        wanted = {webhook, base, base + 1}
        if len(wanted) != 3:
            continue
        held = []
        try:
            for port in wanted:
                s = socket.socket()
                held.append(s)
                s.bind(("", port))
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
        return webhook, base
    raise AssertionError("no free ports below the ephemeral range")


def _reviews_answered(port: int) -> Optional[int]:
    try:
        return int(Scrape.get(port, timeout=2).total("amp_admission_requests_total"))
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
        self.webhook, self.metrics = _free_ports()
        path = _config_file(tmp_path, workers=2, listen={"port": self.webhook}, metrics={"port": self.metrics})
        self.log = open(tmp_path / "amp.log", "wb")
        self.seen: list[int] = []
        env = dict(os.environ, PYTHONPATH=str(REPO))
        twistd = Path(sys.executable).with_name("twistd")
        self.parent = subprocess.Popen(
            [str(twistd), "-n", "--pidfile=", "amp", "--config", path], cwd=tmp_path, env=env,
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT)

    def output(self) -> str:
        return (self.tmp_path / "amp.log").read_text(errors="replace")[-4000:]

    def counts(self) -> tuple[Optional[int], Optional[int]]:
        """Reviews answered by worker 0 and worker 1 (None: not listening)."""
        return _reviews_answered(self.metrics), _reviews_answered(self.metrics + 1)

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


def test_two_workers_share_the_port_and_stop_together(pair: _Pair) -> None:
    try:
        child = pair.wait_serving()
        context = ssl.create_default_context(cadata=ca_pem().decode())
        sent = 40
        for i in range(sent):
            connection = http.client.HTTPSConnection("127.0.0.1", pair.webhook, timeout=5, context=context)
            uid = f"uid-{i}"
            connection.request("POST", "/mutate", body=review_bytes(namespace="default", uid=uid),
                               headers={"Content-Type": "application/json"})
            response = connection.getresponse()
            body = response.read()
            connection.close()
            assert response.status == 200, body
            answer = decode_answer(body)["response"]
            assert answer["uid"] == uid and answer["allowed"] is True, answer

        counts = pair.counts()
        assert sum(c or 0 for c in counts) == sent, counts
        assert all(counts), f"one worker answered everything: {counts}"
    finally:
        pair.stop()
    # twistd ends by re-raising the signal it was stopped with.
    assert pair.parent.returncode in (0, -signal.SIGTERM), pair.output()
    # Worker 0 waited for its child: it is gone by the time worker 0 is.
    assert _gone(child), pair.output()


def test_a_worker_that_dies_is_restarted(pair: _Pair) -> None:
    try:
        child = pair.wait_serving()
        os.kill(child, signal.SIGKILL)
        poll_until("worker 1 to stop serving", lambda: True if pair.counts()[1] is None else None, 60, pair.output)
        replacement = poll_until(
            "a new worker 1", lambda: [p for p in _children(pair.parent.pid) if p != child] or None, 60, pair.output)
        poll_until("the new worker 1's metrics", lambda: pair.counts()[1], 60, pair.output)
        assert len(replacement) == 1
    finally:
        pair.stop()


def test_workers_stop_when_worker_zero_is_killed(pair: _Pair) -> None:
    try:
        child = pair.wait_serving()
    finally:
        pair.stop(signal.SIGKILL)
    poll_until(f"worker process {child} to exit", lambda: True if _gone(child) else None, 60, pair.output)
