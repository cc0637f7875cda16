"""
The benchmark's moving parts, shared by C{bench/run}, the soak and
C{bench/workers_experiment.py}: child processes pinned to CPUs and stopped by
pid, CPU time and peak RSS from /proc, wrk (installed by the project's set-up
step, C{tools/install}) and its summary, amp's bench configuration and a
running C{twistd amp}; the answer checks are L{bench._checks}'s, re-exported
here (the summary of py-spy's collapsed stacks is L{bench.profile_summary}'s).
"""

from __future__ import annotations

import http.client
import json
import os
import platform
import resource
import select
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from typing import Any, Optional

from bench._checks import EXPECTED_RESULT as EXPECTED_RESULT
from bench._checks import ModeFailed as ModeFailed
from bench._checks import check_answer as check_answer
from bench._checks import post_review as post_review
from tests.support.prometheus import Scrape
from tests.support.waiting import poll_until

BENCH = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH)

ON, OFF = "bench-on", "bench-off"

WRK_MISSING = 3
#: How long a child process may take to start and be ready (seconds): a
#: deadline for a harness waiting on another process, generous because a
#: busy machine starts processes slowly, never a measurement.
START_TIMEOUT = 120.0
MODE_FAILED = 1
CLK_TCK = os.sysconf("SC_CLK_TCK")
LUA = os.path.join(BENCH, "lua", "review.lua")


class WrkMissing(Exception):
    pass


def say(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------ /proc


def cpu_split(pid: int) -> tuple[float, float]:
    """
    utime and stime of every thread of C{pid}, in seconds.
    """
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK


def cpu_seconds(pid: int) -> float:
    """
    utime + stime of every thread of C{pid}, in seconds.
    """
    return sum(cpu_split(pid))


def child_pids(pid: int) -> list[int]:
    """The live child processes of C{pid} (from C{/proc/<pid>/task/*/children})."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out.extend(int(c) for c in f.read().split())
        except FileNotFoundError:
            continue
    return out


def cpu_seconds_with_children(pid: int) -> float:
    """
    L{cpu_seconds} of C{pid} and of its live child processes (amp's
    recording writer runs in one), each read now: compare two readings
    only while the same children live.
    """
    total = cpu_seconds(pid)
    for child in child_pids(pid):
        try:
            total += cpu_seconds(child)
        except FileNotFoundError:
            continue
    return total


def busy_seconds() -> float:
    """
    CPU time spent by the whole machine outside idle and iowait, in seconds.
    """
    with open("/proc/stat") as f:
        fields = f.readline().split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


def wait_quiet(max_wait: float, threshold_pct: float = 15.0, quiet: bool = False) -> float:
    """
    Wait (up to C{max_wait} seconds, in one-second samples) until the rest
    of the machine uses under C{threshold_pct}% of one CPU; return the last
    sample.  Call it while the benchmark's own processes are idle.  With
    C{quiet}, say nothing unless it had to wait.
    """
    started = time.monotonic()
    deadline = started + max_wait
    while True:
        before, t0 = busy_seconds(), time.monotonic()
        time.sleep(1.0)
        pct = 100 * (busy_seconds() - before) / (time.monotonic() - t0)
        if pct < threshold_pct or time.monotonic() >= deadline:
            waited = time.monotonic() - started
            if waited > 1.5 or not quiet:
                say(
                    f"other processes use {pct:.0f}% of a CPU after waiting {waited:.0f}s"
                    + ("" if pct < threshold_pct else "; going ahead anyway")
                )
            return round(pct, 1)


def peak_rss_mib(pid: int) -> Optional[float]:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return None


def reset_peak_rss(pid: int) -> bool:
    """
    Reset VmHWM to the current RSS (C{clear_refs} value 5), so the peak of
    one mode is not that of an earlier one.
    """
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def machine() -> dict[str, Any]:
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        wrk = subprocess.run([ensure_wrk(), "-v"], capture_output=True, text=True).stdout.split("\n")[0].strip()
    except (OSError, WrkMissing):
        wrk = ""
    import OpenSSL

    import twisted

    return {
        "nproc": os.cpu_count(),
        "cpu_model": model,
        "python": platform.python_version(),
        "kernel": platform.release(),
        "twisted": twisted.__version__,
        "pyopenssl": OpenSSL.__version__,
        "openssl": ssl.OPENSSL_VERSION,
        "wrk": wrk,
    }


# ------------------------------------------------------------------ processes


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pinned(cpus: Optional[set[int]]) -> Any:
    if not cpus:
        return None

    def pin() -> None:
        os.sched_setaffinity(0, cpus)

    return pin


class Proc:
    """
    A child process started by the benchmark, stopped by its pid.
    """

    def __init__(
        self,
        name: str,
        argv: list[str],
        *,
        cpus: Optional[set[int]] = None,
        env: Optional[dict[str, str]] = None,
        stdout: Any = subprocess.PIPE,
        cwd: Optional[str] = None,
        pass_fds: tuple[int, ...] = (),
    ) -> None:
        self.name = name
        self.argv = argv
        self.popen = subprocess.Popen(
            argv,
            stdout=stdout,
            stderr=subprocess.PIPE if stdout is subprocess.PIPE else subprocess.STDOUT,
            env=env,
            cwd=cwd,
            preexec_fn=_pinned(cpus),
            text=True,
            pass_fds=pass_fds,
        )
        self.pid = self.popen.pid

    def first_line(self, timeout: float = START_TIMEOUT) -> dict[str, Any]:
        """
        The JSON object the process prints on its first stdout line.
        """
        out = self.popen.stdout
        assert out is not None
        ready, _, _ = select.select([out], [], [], timeout)
        line = out.readline() if ready else ""
        if not line:
            if self.popen.poll() is None:
                self.popen.kill()
            _, err = self.popen.communicate(timeout=10)
            err = err or ""
            raise RuntimeError(f"{self.name} did not start: {err.strip()[-2000:]}")
        return json.loads(line)

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, timeout: float = 10.0) -> str:
        """
        SIGTERM, then SIGKILL after C{timeout}; returns what is left on stdout.
        """
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        try:
            out, _ = self.popen.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            out, _ = self.popen.communicate()
        return out or ""


# ------------------------------------------------------------------ wrk


#: Where C{tools/install} puts the tools it installs (C{$AMP_TOOLS/bin}).
TOOLS_BIN = os.path.join(os.environ.get("AMP_TOOLS") or os.path.expanduser("~/.cache/amp-tools"), "bin")


def find_tool(name: str) -> Optional[str]:
    """The path of a command-line tool: on PATH, else in the tools cache; None when missing."""
    return shutil.which(name) or shutil.which(name, path=TOOLS_BIN)


def ensure_wrk() -> str:
    """
    The path of wrk (see L{find_tool}).

    @raise WrkMissing: saying how to install it, when it is missing.
    """
    found = find_tool("wrk")
    if found is None:
        raise WrkMissing(
            f"wrk is missing: run 'make tools' (tools/install wrk), which unpacks the Debian "
            f"package into {TOOLS_BIN}, or put wrk on PATH"
        )
    return found


def run_wrk(
    url: str,
    body_file: str,
    *,
    connections: int,
    duration: float,
    cpus: Optional[set[int]],
    threads: int = 1,
    timeout_s: int = 10,
) -> dict[str, Any]:
    """
    One wrk run; its summary (requests, latency percentiles in microseconds,
    errors) plus the CPU seconds wrk itself used.
    """
    threads = max(1, min(threads, connections))
    argv = [
        ensure_wrk(),
        f"-t{threads}",
        f"-c{connections}",
        f"-d{max(1, round(duration))}s",
        f"--timeout={timeout_s}s",
        "-s",
        LUA,
        url,
        "--",
        body_file,
    ]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(argv, capture_output=True, text=True, preexec_fn=_pinned(cpus), timeout=duration + 60)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    summary = None
    for line in done.stdout.splitlines():
        if line.startswith("AMPBENCH "):
            summary = json.loads(line[len("AMPBENCH ") :])
    if done.returncode != 0 or summary is None:
        raise RuntimeError(f"wrk failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()}")
    summary["wrk_cpu_s"] = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return summary


# ------------------------------------------------------------------ amp


def amp_config(
    path: str,
    *,
    port: int,
    metrics_port: int,
    tls: dict[str, Any],
    endpoint_url: str,
    source: str,
    kubeconfig: Optional[str],
    per_review_get: bool,
    overlay: Optional[dict[str, Any]] = None,
) -> None:
    """
    Write amp's benchmark configuration to C{path}; C{overlay} is laid over
    it section by section (a mapping updates the section's keys, anything
    else replaces the section).
    """
    import yaml

    kube: dict[str, Any] = {"source": source}
    if source == "static":
        kube["namespaces"] = {
            ON: {"labels": {"amp.txn2.com/enabled": "true"}, "annotations": {"amp.txn2.com/ep": endpoint_url}},
            OFF: {"labels": {"team": "other"}},
        }
    else:
        kube["kubeconfig"] = kubeconfig
        kube["per_review_get"] = per_review_get
    config = {
        "listen": {"port": port, "interface": "127.0.0.1"},
        "tls": {"cert": str(tls["cert"]), "key": str(tls["key"])},
        "metrics": {"port": metrics_port, "interface": "127.0.0.1"},
        "kubernetes": kube,
        "endpoints": {"allow": ["http://127.0.0.1:*/*"]},
        "failure_policy": "Ignore",
    }
    for section, value in (overlay or {}).items():
        if isinstance(value, dict) and isinstance(config.get(section), dict):
            config[section].update(value)
        else:
            config[section] = value
    with open(path, "w") as f:
        yaml.safe_dump(config, f, sort_keys=False)


class Amp:
    """
    One C{twistd -n amp} process and how to reach it.
    """

    def __init__(
        self,
        name: str,
        workdir: str,
        tls: dict[str, Any],
        *,
        endpoint_url: str,
        source: str,
        kubeconfig: Optional[str],
        per_review_get: bool,
        cpus: Optional[set[int]],
        extra_twistd: tuple[str, ...] = (),
        overlay: Optional[dict[str, Any]] = None,
        prefix: tuple[str, ...] = (),
        env: Optional[dict[str, str]] = None,
        preamble: str = "",
    ) -> None:
        """
        @param prefix: what the command runs under (C{valgrind ...}).
        @param env: the process's environment (by default this one's).
        @param preamble: Python run in amp's process before C{twistd}.
        """
        self.name = name
        self.port = free_port()
        self.metrics_port = free_port()
        self.config_path = os.path.join(workdir, f"{name}.yaml")
        self.log_path = os.path.join(workdir, f"{name}.log")
        amp_config(
            self.config_path,
            port=self.port,
            metrics_port=self.metrics_port,
            tls=tls,
            endpoint_url=endpoint_url,
            source=source,
            kubeconfig=kubeconfig,
            per_review_get=per_review_get,
            overlay=overlay,
        )
        self.ca = str(tls["ca_cert"])
        argv = [
            *prefix,
            sys.executable,
            "-c",
            f"{preamble}from twisted.scripts.twistd import run; run()",
            "-n",
            "--pidfile=",
            *extra_twistd,
            "amp",
            "--config",
            self.config_path,
        ]
        self.log = open(self.log_path, "w")
        self.proc = Proc(f"amp ({name})", argv, cpus=cpus, stdout=self.log, cwd=workdir, env=env)
        self.pid = self.proc.pid
        self.url = f"https://127.0.0.1:{self.port}/mutate?timeout=10s"

    def _tls(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=self.ca)
        ctx.check_hostname = False
        return ctx

    def wait_ready(self, timeout: float = START_TIMEOUT) -> None:
        """Wait until amp's C{/readyz} answers 200; fail if amp exits or is not ready in time."""
        last = ""

        def ready() -> bool:
            nonlocal last
            if not self.proc.alive():
                raise RuntimeError(f"amp ({self.name}) exited: {self.tail()}")
            try:
                conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=self._tls(), timeout=2)
                conn.request("GET", "/readyz")
                resp = conn.getresponse()
                last = resp.read().decode("utf-8", "replace")
                conn.close()
                return resp.status == 200
            except OSError as e:
                last = str(e)
                return False

        poll_until(
            f"amp ({self.name}) to be ready",
            ready,
            timeout,
            interval=0.1,
            details=lambda: f"last /readyz answer: {last.strip()}",
        )

    def review(self, body_file: str) -> dict[str, Any]:
        """
        One review sent from here, its decoded answer.
        """
        return post_review(self.port, self.ca, body_file, f"amp ({self.name})")

    def metrics(self) -> dict[str, float]:
        """
        amp's review and endpoint counters, keyed like C{result=patched} and
        C{endpoint=ok}.
        """
        scrape = Scrape.get(self.metrics_port, timeout=5)
        out: dict[str, float] = {}
        for key, name, label in (
            ("result", "amp_admission_requests_total", "result"),
            ("endpoint", "amp_endpoint_requests_total", "outcome"),
            ("miss", "amp_namespace_cache_misses_total", "result"),
        ):
            for value, count in scrape.by(name, label).items():
                out[f"{key}={value}"] = count
        return out

    def tail(self, lines: int = 20) -> str:
        self.log.flush()
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(0, os.path.getsize(self.log_path) - 8192))
                return "\n".join(f.read().decode("utf-8", "replace").splitlines()[-lines:])
        except OSError:
            return ""

    def log_problems(self) -> list[str]:
        """
        Warning, error and critical lines in amp's log (not the per-review
        info lines).
        """
        found = []
        with open(self.log_path, "rb") as f:
            for raw in f:
                if b"#warn]" in raw or b"#error]" in raw or b"#critical]" in raw or b"Traceback" in raw:
                    found.append(raw.decode("utf-8", "replace").rstrip()[:300])
                    if len(found) >= 20:
                        break
        return found

    def stop(self, timeout: float = 10.0) -> None:
        self.proc.stop(timeout=timeout)
        self.log.close()
