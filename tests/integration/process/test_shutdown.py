"""
Graceful shutdown of a real amp process (C{twistd amp} on loopback with the
development certificate): a review in flight on a slow endpoint when
C{SIGTERM} arrives gets its patched answer, and so does one sent after it on
a connection amp accepted before it; the listener closes, a connection
attempted then is refused, and the process exits within
C{listen.drain_timeout}; the same with C{workers: 2}, where worker 0 drains
its workers.

The endpoint is a small HTTP server in this process that holds each call
until the test releases it, so "in flight" is a fact the test knows, not a
timing guess (and amp's endpoint timeout is longer than any hold).  That the
listener has closed is the kernel's word (L{tests.support.ports.listening}), not a
connection attempt that could race the close.  Waiting on the other
processes is by polling with a deadline.
"""

from __future__ import annotations

import base64
import http.client
import http.server
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest
import yaml

from tests.support.helpers import ca_pem, namespace, raw_config, review_bytes
from tests.support.ports import free_port, free_ports, listening
from tests.support.prometheus import Scrape
from tests.support.waiting import poll_until

REPO = Path(__file__).resolve().parents[3]

#: The patch the held endpoint answers with.
PATCH = [{"op": "add", "path": "/metadata/labels", "value": {"drained": "answered"}}]

#: amp's endpoint timeout while the endpoint holds calls: longer than any
#: hold, so a held review is answered with the endpoint's patch, not cut
#: off by a slow run into the failure policy.
HOLD = {"timeout": "30s"}


class HeldEndpoint:
    """
    An endpoint that answers every call with L{PATCH}, but only once
    L{release} is called; L{arrived} counts the calls it holds.
    """

    def __init__(self) -> None:
        self.release_event = threading.Event()
        self.calls = 0
        self.lock = threading.Lock()
        endpoint = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                with endpoint.lock:
                    endpoint.calls += 1
                endpoint.release_event.wait(60)
                body = json.dumps(PATCH).encode()
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    pass  # amp gave up on the call (a drain that timed out)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/mutate"

    def held(self) -> int:
        with self.lock:
            return self.calls

    def release(self) -> None:
        self.release_event.set()

    def close(self) -> None:
        self.release()
        self.server.shutdown()
        self.server.server_close()


def metric(port: int, name: str) -> Optional[float]:
    """One sample of amp's metrics on C{port}, or None when it does not answer."""
    try:
        return Scrape.get(port, timeout=2).value(name)
    except (OSError, RuntimeError):
        return None


def gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


class Amp:
    """C{twistd amp} as a subprocess, with its log in C{tmp_path}."""

    def __init__(self, tmp_path: Path, endpoint: str, port: Optional[int] = None, **sections: Any) -> None:
        self.tmp_path = tmp_path
        self.port = port if port is not None else free_port()
        self.endpoint = endpoint
        path = self.config_path = tmp_path / "amp.yaml"
        self.write_config(**sections)
        self.log = open(tmp_path / "amp.log", "wb")
        env = dict(os.environ, PYTHONPATH=str(REPO))
        twistd = Path(sys.executable).with_name("twistd")
        self.process = subprocess.Popen(
            [str(twistd), "-n", "--pidfile=", "amp", "--config", str(path)],
            cwd=tmp_path,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.seen: list[int] = []
        self.context = ssl.create_default_context(cadata=ca_pem().decode())

    def write_config(self, namespaces: Optional[dict[str, Any]] = None, **sections: Any) -> None:
        """
        Write amp's config (C{team-a} enabled with the endpoint unless
        C{namespaces} says otherwise) as the kubelet updates a ConfigMap
        volume: a new file renamed over the old one.
        """
        sections["listen"] = {"port": self.port, **sections.get("listen", {})}
        config = raw_config({"team-a": namespace(self.endpoint)} if namespaces is None else namespaces, **sections)
        new = self.config_path.with_suffix(".new")
        new.write_text(yaml.safe_dump(config))
        os.replace(new, self.config_path)

    def output(self) -> str:
        return (self.tmp_path / "amp.log").read_text(errors="replace")[-6000:]

    def healthy(self) -> Optional[bool]:
        try:
            connection = http.client.HTTPSConnection("127.0.0.1", self.port, timeout=2, context=self.context)
            connection.request("GET", "/healthz")
            ok = connection.getresponse().status == 200
            connection.close()
        except OSError:
            return None
        return True if ok else None

    def connection(self) -> http.client.HTTPSConnection:
        """A connection to the webhook port, not yet made."""
        return http.client.HTTPSConnection("127.0.0.1", self.port, timeout=60, context=self.context)

    def review(
        self, uid: str, connection: Optional[http.client.HTTPSConnection] = None
    ) -> tuple[int, dict[str, str], bytes]:
        """One review on its own connection (or C{connection}); blocks until answered."""
        connection = connection if connection is not None else self.connection()
        try:
            connection.request(
                "POST", "/mutate?timeout=30s", body=review_bytes(uid=uid), headers={"Content-Type": "application/json"}
            )
            response = connection.getresponse()
            return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
        finally:
            connection.close()

    def closed(self) -> Optional[bool]:
        """True once no socket listens on the webhook port."""
        return True if not listening(self.port) else None

    def refused(self) -> bool:
        """Whether a new TCP connection to the webhook port is refused."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=2):
                return False
        except ConnectionRefusedError:
            return True

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        for pid in self.seen:
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)
        self.log.close()


@pytest.fixture
def endpoint() -> Iterator[HeldEndpoint]:
    held = HeldEndpoint()
    try:
        yield held
    finally:
        held.close()


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=16) as executor:
        yield executor


def assert_patched(result: tuple[int, dict[str, str], bytes], uid: str) -> None:
    status, headers, body = result
    assert status == 200, body
    response = json.loads(body)["response"]
    assert response["uid"] == uid
    assert json.loads(base64.b64decode(response["patch"]))[0] == PATCH[0], response
    # The connection is not kept alive past a drain.
    assert headers.get("connection") == "close", headers


def test_sigterm_answers_the_review_in_flight_refuses_new_connections_and_exits(
    tmp_path: Path, endpoint: HeldEndpoint, pool: ThreadPoolExecutor
) -> None:
    # request_timeout: the connection accepted before the signal has that
    # long from its accept to send its review.
    amp = Amp(tmp_path, endpoint.url, listen={"drain_timeout": "20s", "request_timeout": "30s"}, endpoints=HOLD)
    try:
        poll_until("amp to serve", amp.healthy, 60, amp.output)
        in_flight: Future = pool.submit(amp.review, "in-flight")
        poll_until("the review to reach the endpoint", lambda: endpoint.held() or None, 10, amp.output)
        # Accepted (the TLS handshake is done), its review not sent yet.
        accepted = amp.connection()
        accepted.connect()

        amp.process.send_signal(signal.SIGTERM)
        poll_until("the webhook listener to close", amp.closed, 10, amp.output)
        assert amp.refused()
        assert not in_flight.done()
        assert amp.process.poll() is None, "amp exited with a review in flight"
        late: Future = pool.submit(amp.review, "sent-after-sigterm", accepted)
        poll_until("the late review to reach the endpoint", lambda: endpoint.held() >= 2 or None, 10, amp.output)

        endpoint.release()
        assert_patched(in_flight.result(timeout=20), "in-flight")
        assert_patched(late.result(timeout=20), "sent-after-sigterm")
        amp.process.wait(timeout=30)
    finally:
        amp.stop()
    # twistd ends by re-raising the signal it was stopped with.
    assert amp.process.returncode in (0, -signal.SIGTERM), amp.output()
    output = amp.output()
    assert "Shutting down: not ready, not accepting connections" in output
    assert "Drained in" in output
    assert "Traceback" not in output


def test_the_drain_is_bounded_by_drain_timeout(
    tmp_path: Path, endpoint: HeldEndpoint, pool: ThreadPoolExecutor
) -> None:
    """A review that would outlast the drain (its own budget is 29.5s) is cut off at drain_timeout."""
    amp = Amp(tmp_path, endpoint.url, listen={"drain_timeout": "2s"}, endpoints={"timeout": "30s"})
    try:
        poll_until("amp to serve", amp.healthy, 60, amp.output)
        in_flight = pool.submit(amp.review, "hung")
        poll_until("the review to reach the endpoint", lambda: endpoint.held() or None, 10, amp.output)
        signalled = time.monotonic()
        amp.process.send_signal(signal.SIGTERM)
        amp.process.wait(timeout=20)
        took = time.monotonic() - signalled
    finally:
        amp.stop()
    assert took >= 2.0
    assert amp.process.returncode in (0, -signal.SIGTERM), amp.output()
    assert "1 connections still open after 2s (listen.drain_timeout), aborted" in amp.output()
    with pytest.raises((http.client.HTTPException, OSError)):
        in_flight.result(timeout=10)


def test_worker_zero_drains_its_workers(tmp_path: Path, endpoint: HeldEndpoint, pool: ThreadPoolExecutor) -> None:
    webhook, metrics = free_ports()
    amp = Amp(
        tmp_path,
        endpoint.url,
        port=webhook,
        workers=2,
        listen={"drain_timeout": "20s"},
        metrics={"port": metrics, "interface": "127.0.0.1"},
        endpoints=HOLD,
    )
    try:
        poll_until(
            "both workers to serve",
            lambda: (
                True
                if None not in (metric(metrics, "amp_open_connections"), metric(metrics + 1, "amp_open_connections"))
                else None
            ),
            60,
            amp.output,
        )
        [child] = poll_until("worker 1", lambda: children(amp.process.pid) or None, 10, amp.output)
        amp.seen.append(child)
        # New connections until each worker holds a review in flight (each
        # goes to the worker with the fewest).
        reviews: list[tuple[str, Future]] = []
        while not all(metric(port, "amp_open_connections") for port in (metrics, metrics + 1)):
            if len(reviews) == 16:
                pytest.fail(f"16 connections all went to one worker\n{amp.output()}")
            uid = f"review-{len(reviews)}"
            reviews.append((uid, pool.submit(amp.review, uid)))
            poll_until(
                f"{len(reviews)} reviews at the endpoint",
                lambda: endpoint.held() >= len(reviews) or None,
                10,
                amp.output,
            )

        amp.process.send_signal(signal.SIGTERM)
        # Closed once both workers have closed their copies of the socket.
        poll_until("the webhook listener to close", amp.closed, 10, amp.output)
        assert amp.refused()
        assert amp.process.poll() is None and not gone(child)

        endpoint.release()
        for uid, future in reviews:
            assert_patched(future.result(timeout=20), uid)
        amp.process.wait(timeout=30)
        poll_until("worker 1 to exit", lambda: True if gone(child) else None, 10, amp.output)
    finally:
        amp.stop()
    assert amp.process.returncode in (0, -signal.SIGTERM), amp.output()
    # Both processes drained.
    assert amp.output().count("Drained in") == 2, amp.output()


def test_the_shipped_deployment_gives_the_drain_its_time() -> None:
    """
    deploy/base: the kubelet waits for preStop plus amp's whole drain (and
    a little to exit) before it kills amp.
    """
    from amp.config import parse_config

    deployment = yaml.safe_load((REPO / "deploy/base/deployment.yaml").read_text())
    # The ConfigMap is generated from amp.yaml (kustomize configMapGenerator).
    config = parse_config(yaml.safe_load((REPO / "deploy/base/amp.yaml").read_text()))
    spec = deployment["spec"]["template"]["spec"]
    [container] = spec["containers"]
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    # The image is python-based: the hook needs no sleep binary.
    assert command[:2] == ["python", "-c"], command
    prestop = float(command[2].split("sleep(")[1].rstrip(")"))
    assert prestop >= 1
    assert spec["terminationGracePeriodSeconds"] >= prestop + config.listen.drain_timeout + 2
