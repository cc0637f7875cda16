"""
The local demo (``make demo``, or ``python -m amp_dev.demo``): amp and the
example endpoints on this machine, no cluster needed.

It writes a development certificate (``dev-tls/``), starts ``twistd amp-example``
and ``twistd amp --config etc/amp.yaml`` (static namespaces), sends a sample
AdmissionReview into each namespace of that config and prints the decoded
answer, then keeps both running until it is stopped (``--once`` stops after
the samples).

A demo that cannot lie:

- Before it starts anything it checks every port it needs: amp's webhook and
  metrics ports (``listen`` and ``metrics`` in the config) and the example
  endpoints' port (the one the config's endpoint URLs name). A port in use
  is one line naming it and the process holding it, and nothing starts, so
  an old demo can never answer for a new one.  The check is amp's own
  (``amp.ports``, what ``twistd amp`` checks at start-up): the demo runs
  amp, so amp is installed beside it.
- It says which config file amp runs with, and each child's pid.
- Its children run in their own process group (a Ctrl-C reaches only the
  demo, which stops them in order), die with the demo even when it is
  killed with SIGKILL (``PR_SET_PDEATHSIG`` on Linux), and are stopped
  (SIGTERM to their group, SIGKILL after a grace period) whenever the demo
  stops: Ctrl-C, SIGTERM, SIGHUP, a child that exits, or a crash of the demo.

This is a command-line program, not library code: it blocks, and that is
fine here.
"""

from __future__ import annotations

import argparse
import base64
import ctypes
import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import yaml

from amp.ports import listen_problem
from amp_dev.devcert import write_dev_tls

DEFAULT_CONFIG = "etc/amp.yaml"
DEFAULT_REVIEW = "etc/reviews/pod-create.json"
DEFAULT_EXAMPLES_PORT = 8090
ENDPOINT_ANNOTATION = "amp.txn2.com/ep"
START_TIMEOUT = 30.0
STOP_GRACE = 10.0
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
PR_SET_PDEATHSIG = 1
TWISTD = [sys.executable, "-c", "from twisted.scripts.twistd import run; run()", "--nodaemon", "--pidfile="]


class DemoError(Exception):
    """Something the user must fix before the demo can run; the message is the one line to print."""


class Stopped(BaseException):
    """The demo received ``signum`` (raised from the signal handler, so every wait unwinds through cleanup)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


# ---------------------------------------------------------------- the config


@dataclass(frozen=True)
class Port:
    """A TCP port the demo needs, where it listens, and what it is for (for messages)."""

    number: int
    interface: str
    what: str


@dataclass(frozen=True)
class Plan:
    """What the demo runs, read from amp's config file."""

    config: Path
    ports: tuple[Port, ...]
    amp_url: str
    examples_url: str
    namespaces: tuple[str, ...]


def _client_host(interface: str) -> str:
    return "127.0.0.1" if interface in ("", "0.0.0.0") else ("::1" if interface == "::" else interface)


def read_plan(config_path: str) -> Plan:
    """The ports, URLs and namespaces of amp's config (defaults as amp's: 8443, 9090)."""
    path = Path(config_path).resolve()
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise DemoError(f"cannot read the config {path}: {e}") from None
    if not isinstance(doc, dict):
        raise DemoError(f"the config {path} is not a mapping")
    listen, metrics = doc.get("listen") or {}, doc.get("metrics") or {}
    kubernetes = doc.get("kubernetes") or {}
    if kubernetes.get("source", "static") != "static":
        raise DemoError(f"the demo runs amp without a cluster; {path} has kubernetes.source {kubernetes['source']}")
    namespaces = kubernetes.get("namespaces") or {}
    webhook = Port(
        int(listen.get("port", 8443)),
        str(listen.get("interface", "0.0.0.0")),
        f"amp's webhook, listen.port in {path.name}",
    )
    ports = [webhook]
    if int(metrics.get("port", 9090)):
        ports.append(
            Port(
                int(metrics.get("port", 9090)),
                str(metrics.get("interface", "0.0.0.0")),
                f"amp's metrics, metrics.port in {path.name}",
            )
        )
    examples = _examples_port(namespaces, path)
    ports.append(Port(examples, "127.0.0.1", f"the example endpoints, named by the endpoint URLs in {path.name}"))
    return Plan(
        config=path,
        ports=tuple(ports),
        amp_url=f"https://{_client_host(webhook.interface)}:{webhook.number}",
        examples_url=f"http://127.0.0.1:{examples}",
        namespaces=tuple(str(name) for name in namespaces),
    )


def _examples_port(namespaces: dict[str, Any], path: Path) -> int:
    """The one loopback port the config's endpoint annotations point at (8090 when none does)."""
    found = set()
    for spec in namespaces.values():
        urls = ((spec or {}).get("annotations") or {}).get(ENDPOINT_ANNOTATION) or ""
        for url in urls.split():  # a chain names several, one per line
            parsed = urllib.parse.urlsplit(url)
            if parsed.hostname == "127.0.0.1" and parsed.port:
                found.add(parsed.port)
    if len(found) > 1:
        raise DemoError(f"the endpoint URLs in {path} name several example ports ({sorted(found)}); the demo runs one")
    return found.pop() if found else DEFAULT_EXAMPLES_PORT


# ---------------------------------------------------------------- ports


def check_ports(ports: Sequence[Port]) -> None:
    """Raise DemoError naming the first port that cannot be bound, and the process holding it."""
    for port in ports:
        problem = listen_problem(port.interface, port.number, port.what)
        if problem is not None:
            raise DemoError(f"{problem}; stop it, or run the demo with another config")


# ---------------------------------------------------------------- children


def _die_with_parent(parent: int) -> Callable[[], None]:
    """A ``preexec_fn``: on Linux, the child gets SIGTERM when the demo dies, however it dies."""
    libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None

    def setup() -> None:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # blocked by Children.start
        if libc is not None:
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
            if os.getppid() != parent:  # the demo died before prctl took effect
                os._exit(1)

    return setup


class Children:
    """The demo's child processes, each the leader of its own process group."""

    def __init__(self) -> None:
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(self, name: str, argv: Sequence[str]) -> subprocess.Popen[bytes]:
        # A stop signal waits until the child is on the list, so the clean-up always knows it.
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            proc = subprocess.Popen(list(argv), process_group=0, preexec_fn=_die_with_parent(os.getpid()))
            self.procs.append((name, proc))
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        return proc

    def check_alive(self) -> None:
        for name, proc in self.procs:
            if proc.poll() is not None:
                raise DemoError(f"{name} (pid {proc.pid}) exited with status {proc.returncode}; see its output above")

    def wait_any(self) -> None:
        """Block until a child exits (or a signal raises Stopped), then raise DemoError naming it."""
        while True:
            try:
                pid, status = os.wait()
            except ChildProcessError:  # every child was reaped already
                pid, status = 0, 0
            for _, proc in self.procs:
                if proc.pid == pid:
                    proc.returncode = os.waitstatus_to_exitcode(status)
            self.check_alive()

    def stop(self, grace: float = STOP_GRACE) -> None:
        """SIGTERM to every child's group, SIGKILL to what is left after ``grace`` seconds."""
        for _, proc in self.procs:
            _signal_group(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for _, proc in self.procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for _, proc in self.procs:
            _signal_group(proc.pid, signal.SIGKILL)  # the leader if it hung, and anything it left in its group
            proc.wait()


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


# ---------------------------------------------------------------- talking to amp


def _wait_ready(url: str, context: Optional[ssl.SSLContext], children: Children) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        children.check_alive()
        try:
            with urllib.request.urlopen(url, context=context, timeout=1) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            raise DemoError(f"{url} did not become ready within {START_TIMEOUT:.0f}s")
        time.sleep(0.1)


def review(url: str, body: bytes, context: ssl.SSLContext) -> dict[str, Any]:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, context=context, timeout=15) as r:
        return json.loads(r.read())


def send_samples(plan: Plan, template: dict[str, Any], context: ssl.SSLContext) -> None:
    for namespace in plan.namespaces:
        template["request"]["namespace"] = namespace
        answer = review(f"{plan.amp_url}/mutate?timeout=10s", json.dumps(template).encode(), context)["response"]
        patch = answer.pop("patch", None)
        print(f"--- namespace {namespace}: {json.dumps(answer)}", flush=True)
        if patch:
            for op in json.loads(base64.b64decode(patch)):
                print(f"    {json.dumps(op)[:150]}", flush=True)


# ---------------------------------------------------------------- main


def _raise_stopped(signum: int, frame: Any) -> None:
    raise Stopped(signum)


def run(args: argparse.Namespace) -> int:
    plan = read_plan(args.config)
    check_ports(plan.ports)
    try:
        template = json.loads(Path(args.review).read_text())
    except (OSError, ValueError) as e:
        raise DemoError(f"cannot read the sample review {args.review}: {e}") from None
    paths = write_dev_tls(args.tls_dir, keep=True)
    print(f"demo: amp runs with the config {plan.config}", flush=True)

    children = Children()
    try:
        examples = children.start("twistd amp-example", [*TWISTD, "amp-example", "--port", str(plan.ports[-1].number)])
        amp = children.start("twistd amp", [*TWISTD, "amp", "--config", str(plan.config)])
        print(
            f"demo: example endpoints (pid {examples.pid}) on {plan.examples_url}, "
            f"amp (pid {amp.pid}) on {plan.amp_url}",
            flush=True,
        )
        context = ssl.create_default_context(cafile=str(paths["ca_cert"]))
        _wait_ready(f"{plan.examples_url}/healthz", None, children)
        _wait_ready(f"{plan.amp_url}/readyz", context, children)
        print(f"\namp is up on {plan.amp_url}, config {plan.config}\n", flush=True)
        send_samples(plan, template, context)
        print(
            f"\nTry it yourself:\n  curl --cacert {paths['ca_cert']} -H 'Content-Type: application/json' "
            f"--data @{args.review} '{plan.amp_url}/mutate?timeout=10s'\n",
            flush=True,
        )
        if args.once:
            return 0
        print("Press Ctrl-C to stop.", flush=True)
        children.wait_any()
        return 1
    finally:
        # Nothing interrupts the clean-up: it is bounded by the grace period and SIGKILL.
        for signum in STOP_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)
        children.stop()
        print("demo: stopped " + ", ".join(f"{name} (pid {proc.pid})" for name, proc in children.procs), flush=True)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m amp_dev.demo", description=__doc__.strip().split("\n\n")[0])
    parser.add_argument("--once", action="store_true", help="stop after sending the samples")
    parser.add_argument("--config", default=DEFAULT_CONFIG, help=f"amp's config (default {DEFAULT_CONFIG})")
    parser.add_argument("--review", default=DEFAULT_REVIEW, help=f"the sample review (default {DEFAULT_REVIEW})")
    parser.add_argument("--tls-dir", default="dev-tls", help="where the dev certificate goes (default dev-tls)")
    args = parser.parse_args(argv)
    for signum in STOP_SIGNALS:
        signal.signal(signum, _raise_stopped)
    try:
        return run(args)
    except DemoError as e:
        print(f"demo: {e}", file=sys.stderr, flush=True)
        return 1
    except Stopped as e:
        print(f"demo: {e} received, children stopped", file=sys.stderr, flush=True)
        return 0 if e.signum == signal.SIGINT else 128 + e.signum


if __name__ == "__main__":
    sys.exit(main())
