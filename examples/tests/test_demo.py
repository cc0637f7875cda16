"""
Tests for amp_dev.demo, a demo that cannot lie: it refuses to start on a
port in use and names who holds it, says which config it runs, and leaves
no child process behind however it stops (SIGTERM, SIGHUP, Ctrl-C, SIGKILL,
its own crash).

The signal tests run the real demo with real ``twistd`` children, on free
loopback ports of their own (so they never collide with a running demo),
and poll the children from this process with a deadline: waiting on another
process is polling by nature.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from amp_dev import demo
from tests.support.waiting import poll_until

REPO = Path(__file__).resolve().parents[2]
REVIEW = REPO / "etc" / "reviews" / "pod-create.json"
DEADLINE = 90.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def write_config(directory: Path, webhook: int, metrics: int, examples: int) -> Path:
    path = directory / "demo.yaml"
    path.write_text(f"""
listen: {{port: {webhook}, interface: 127.0.0.1}}
tls: {{cert: dev-tls/tls.crt, key: dev-tls/tls.key}}
metrics: {{port: {metrics}, interface: 127.0.0.1}}
kubernetes:
  source: static
  namespaces:
    team-a:
      labels: {{amp.txn2.com/enabled: "true"}}
      annotations: {{amp.txn2.com/ep: "http://127.0.0.1:{examples}/user-env"}}
    opted-out: {{}}
endpoints: {{allow: ["http://127.0.0.1:*/*"], timeout: 2s}}
failure_policy: Ignore
""")
    return path


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie waiting for its reaper counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


# ---------------------------------------------------------------- the plan and the port check


def test_the_plan_of_the_shipped_config() -> None:
    plan = demo.read_plan(str(REPO / "etc" / "amp.yaml"))
    assert [p.number for p in plan.ports] == [8443, 9090, 8090]
    assert plan.amp_url == "https://127.0.0.1:8443"
    assert "team-a" in plan.namespaces and "filers" in plan.namespaces
    assert plan.config == (REPO / "etc" / "amp.yaml").resolve()


def test_the_example_port_comes_from_the_endpoint_urls(tmp_path: Path) -> None:
    plan = demo.read_plan(str(write_config(tmp_path, 1111, 2222, 3333)))
    assert [(p.number, p.interface) for p in plan.ports] == [
        (1111, "127.0.0.1"),
        (2222, "127.0.0.1"),
        (3333, "127.0.0.1"),
    ]
    path = tmp_path / "two.yaml"
    path.write_text(
        "kubernetes: {namespaces: {a: {annotations: {amp.txn2.com/ep: 'http://127.0.0.1:1/x'}},"
        " b: {annotations: {amp.txn2.com/ep: 'http://127.0.0.1:2/x'}}}}\n"
    )
    with pytest.raises(demo.DemoError, match=r"several example ports \(\[1, 2\]\)"):
        demo.read_plan(str(path))


def test_a_port_in_use_is_named_with_the_process_holding_it() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        taken = demo.Port(port, "127.0.0.1", "amp's webhook")
        with pytest.raises(demo.DemoError) as info:
            demo.check_ports([demo.Port(free_port(), "127.0.0.1", "free"), taken])
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"port {port} (amp's webhook) is in use by pid {os.getpid()} (")
    assert Path(sys.executable).name in message


def test_free_ports_pass_the_check() -> None:
    demo.check_ports([demo.Port(free_port(), "127.0.0.1", "a"), demo.Port(free_port(), "127.0.0.1", "b")])


def test_the_demo_refuses_to_start_on_a_taken_port(tmp_path: Path) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        metrics = listener.getsockname()[1]
        config = write_config(tmp_path, free_port(), metrics, free_port())
        result = subprocess.run(
            [sys.executable, "-m", "amp_dev.demo", "--config", str(config)],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=DEADLINE,
        )
    assert result.returncode == 1
    assert result.stdout == "", "nothing started"
    [line] = result.stderr.splitlines()
    assert line.startswith(
        f"demo: port {metrics} (amp's metrics, metrics.port in demo.yaml) is in use by pid {os.getpid()} ("
    )
    assert not (tmp_path / "dev-tls").exists()


# ---------------------------------------------------------------- stopping, with real children


class RunningDemo:
    """``python -m amp_dev.demo`` in ``directory`` on free ports, its output in a file."""

    def __init__(self, directory: Path, review: Path = REVIEW) -> None:
        directory.mkdir()
        self.directory = directory
        self.config = write_config(directory, free_port(), free_port(), free_port())
        self.log = directory / "demo.log"
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "amp_dev.demo", "--config", str(self.config), "--review", str(review)],
                cwd=directory,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def children(self) -> list[int]:
        """The pids the demo says it started, once it has said so."""
        found = re.search(r"example endpoints \(pid (\d+)\).* amp \(pid (\d+)\)", self.output())
        return [int(pid) for pid in found.groups()] if found else []

    def wait_until_up(self) -> list[int]:
        poll_until("'Press Ctrl-C'", lambda: "Press Ctrl-C to stop." in self.output(), DEADLINE, self.output)
        return self.children()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        for pid in self.children():
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def demos(tmp_path: Path):
    started: list[RunningDemo] = []

    def start(name: str, **kwargs) -> RunningDemo:
        started.append(RunningDemo(tmp_path / name, **kwargs))
        return started[-1]

    yield start
    for running in started:
        running.kill()


STOPS = {
    "SIGTERM": (signal.SIGTERM, 128 + signal.SIGTERM),
    "SIGHUP": (signal.SIGHUP, 128 + signal.SIGHUP),
    "Ctrl-C": (signal.SIGINT, 0),
    "SIGKILL": (signal.SIGKILL, -signal.SIGKILL),
}


def test_no_child_outlives_the_demo_however_it_stops(demos, tmp_path: Path) -> None:
    """
    Several demos at once (each on its own ports), each stopped its own way;
    a demo that crashes after starting its children (a sample review
    without a request) stops them too.
    """
    running = {name: demos(name) for name in STOPS}
    broken = tmp_path / "broken-review.json"
    broken.write_text('{"kind": "AdmissionReview"}')
    crashing = demos("crash", review=broken)

    for name, (signum, _) in STOPS.items():
        one = running[name]
        children = one.wait_until_up()
        assert len(children) == 2 and all(alive(pid) for pid in children), one.output()
        assert f"amp runs with the config {one.config}" in one.output()
        one.process.send_signal(signum)

    statuses = {name: one.process.wait(DEADLINE) for name, one in running.items()}
    assert statuses == {name: status for name, (_, status) in STOPS.items()}
    for name, one in [*running.items(), ("crash", crashing)]:
        if name == "crash":
            assert crashing.process.wait(DEADLINE) == 1
            assert "KeyError: 'request'" in crashing.output()
        children = one.children()
        assert len(children) == 2, one.output()
        poll_until(
            f"exit of the children of the demo stopped by {name}",
            lambda children=children: not any(alive(pid) for pid in children),
            DEADLINE,
            one.output,
        )
        assert not (one.directory / "twistd.pid").exists()
    for name in ("SIGTERM", "SIGHUP", "Ctrl-C"):
        assert "demo: stopped twistd amp-example (pid" in running[name].output()
