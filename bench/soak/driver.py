"""
The soak's driver: starts the chaos endpoint, the fake Kubernetes API, amp
under twistd (through the benchmark's L{bench.harness.Amp}) and the load
generator, each a process of its own; during the run it samples amp's RSS,
file descriptors and CPU every second, rotates amp's serving certificate and
injects watch faults; afterwards it collects amp's metrics and log and the
endpoint's counts, and has L{bench.soak.report} judge them.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from typing import Any, Optional

from bench.chaos_endpoint import FAULT_KINDS, HOSTILE_KINDS
from bench.harness import START_TIMEOUT, Amp, Proc, busy_seconds, cpu_seconds, machine, wait_quiet
from bench.soak._args import parse_args
from bench.soak._certificate import RotatingCertificate
from bench.soak._probes import config_hash, fd_count, http_json, rss_kib, served_serial, thread_count
from bench.soak.configswap import HOSTILE_CONFIGS, ConfigSwapper
from bench.soak.reconcile import scan_log
from bench.soak.report import busy_machine, evaluate, text_report
from bench.soak.settings import (
    BROKEN,
    DELAY_MS,
    ENABLED_LABEL,
    ENDPOINT_ANNOTATION,
    FAILED,
    FD_SLACK,
    MAX_RESPONSE,
    NAMESPACES,
    NEVER_OPENS,
    OPENS_OFTEN,
    OVERSIZE,
    PASSED,
    POLICY_ANNOTATION,
    TIMING_CRITERIA,
    amp_overlay,
)
from tests.support.prometheus import Scrape
from tests.support.waiting import WaitTimeout, poll_until


def say(message: str) -> None:
    print(f"soak: {message}", file=sys.stderr, flush=True)


class Soak:
    """
    One soak run: L{start} the processes, L{run} the load with the faults,
    L{collect} the figures, L{stop} everything.
    """

    def __init__(self, args: argparse.Namespace, workdir: str) -> None:
        self.args = args
        self.workdir = workdir
        self.procs: list[Any] = []
        cpus = sorted(os.sched_getaffinity(0))
        pin = not args.no_pin and len(cpus) >= 2
        self.amp_cpus = {cpus[0]} if pin else None
        self.load_cpus = set(cpus[1:]) if pin else None
        self.samples: list[dict[str, Any]] = []
        self.rotations = 0
        self.faults = {"drop": 0, "expire": 0, "touch": 0}
        self.streams_cut = 0
        self.problems: list[str] = []
        self._last_busy: Optional[tuple[float, float, float, float]] = None
        self.t0 = 0.0
        self.fds_before = 0
        self.served_serials: set[int] = set()
        self.kinds = FAULT_KINDS + (HOSTILE_KINDS if args.hostile else ())
        #: With --hostile, amp's config file is swapped for hostile ones during the run.
        self.configs: Optional[ConfigSwapper] = None
        self.config_hash_before: Optional[str] = None

    # -------------------------------------------------------------- processes

    def start(self) -> None:
        from amp_dev.devcert import write_dev_tls

        py = sys.executable
        w = self.workdir
        ca = write_dev_tls(os.path.join(w, "ca"))
        self.ca = str(ca["ca_cert"])
        self.volume = RotatingCertificate(os.path.join(w, "tls"), self.ca, str(ca["ca_key"]))
        self.chaos_log = os.path.join(w, "chaos-calls.txt")
        self.chaos = Proc(
            "chaos endpoint",
            [
                py,
                "-m",
                "bench.chaos_endpoint",
                "--port",
                "steady",
                "--port",
                "flaky",
                "--seed",
                str(self.args.seed),
                "--delay-ms",
                f"{DELAY_MS[0]}:{DELAY_MS[1]}",
                "--oversize",
                str(OVERSIZE),
                "--log",
                self.chaos_log,
                *(["--hostile", "--flood-bytes", str(self.args.flood_mib * 1024 * 1024)] if self.args.hostile else []),
            ],
            cpus=self.load_cpus,
        )
        self.procs.append(self.chaos)
        self.ports = self.chaos.first_line()["ports"]
        say(f"chaos endpoint on ports {self.ports} (pid {self.chaos.pid})")

        self.namespaces = []
        api_namespaces = []
        for name, policy, port, path, timeout, share in NAMESPACES:
            enabled = policy is not None
            ns = {
                "name": name,
                "policy": policy,
                "enabled": enabled,
                "timeout": timeout,
                "share": share,
                "origin": f"http://127.0.0.1:{self.ports[port]}" if enabled else None,
                "port": port,
            }
            self.namespaces.append(ns)
            labels = {ENABLED_LABEL: "true"} if enabled else {"team": "other"}
            annotations = {ENDPOINT_ANNOTATION: f"{ns['origin']}{path}", POLICY_ANNOTATION: policy} if enabled else {}
            api_namespaces.append({"name": name, "labels": labels, "annotations": annotations})
        self.kubeconfig = os.path.join(w, "kubeconfig")
        plan = os.path.join(w, "fakeapi.json")
        with open(plan, "w") as f:
            json.dump({"namespaces": api_namespaces, "filler": 50, "kubeconfig": self.kubeconfig}, f)
        self.fakeapi = Proc("fake API", [py, "-m", "bench.soak.fakeapi", plan], cpus=self.load_cpus)
        self.procs.append(self.fakeapi)
        first = self.fakeapi.first_line()
        self.api_url, self.control = first["url"], first["control"]
        say(f"fake Kubernetes API on {self.api_url}, control port {self.control} (pid {self.fakeapi.pid})")

        tls = {"cert": self.volume.cert, "key": self.volume.key, "ca_cert": self.ca}
        overlay = amp_overlay(self.ports)
        if self.args.hostile:
            overlay["reload_interval"] = "1s"
        self.amp = Amp(
            "soak",
            w,
            tls,
            endpoint_url="http://127.0.0.1:1/",
            source="kubeconfig",
            kubeconfig=self.kubeconfig,
            per_review_get=False,
            cpus=self.amp_cpus,
            overlay=overlay,
        )
        self.procs.append(self.amp)
        self.amp.wait_ready()
        say(f"amp ready on port {self.amp.port}, metrics on {self.amp.metrics_port} (pid {self.amp.pid})")
        # What amp holds open before any load: the listeners, the log, the
        # watch connection; the load must leave nothing more behind.
        poll_until(
            "amp's namespace watch",
            lambda: Scrape.get(self.amp.metrics_port).value("amp_namespace_cache_namespaces") is not None,
            START_TIMEOUT,
        )
        self.fds_before = fd_count(self.amp.pid)
        if self.args.hostile:
            self.configs = ConfigSwapper(self.amp.config_path)
            self.config_hash_before = config_hash(self.amp.metrics_port)

    def start_load(self) -> None:
        self.records = os.path.join(self.workdir, "reviews.jsonl")
        plan = os.path.join(self.workdir, "load.json")
        with open(plan, "w") as f:
            json.dump(
                {
                    "port": self.amp.port,
                    "ca": self.ca,
                    "rate": self.args.rate,
                    "duration": self.args.duration,
                    "seed": self.args.seed,
                    "namespaces": self.namespaces,
                    "records": self.records,
                    # A review asks amp to close its connection now and then
                    # (one in 125 on average), so new handshakes keep meeting
                    # the rotated certificate; an idle connection is closed
                    # well before amp's own idle timeout would.
                    "v1beta1_share": 0.1,
                    "close_share": 1 / 125,
                    "idle_close": 20.0,
                    "max_connections": 64,
                    # The client waits this long past the API server's timeout
                    # (from sending the request) before it calls a review
                    # unanswered: a late answer on a busy machine is timing, a
                    # missing one is a failure.
                    "grace": 30.0,
                },
                f,
            )
        self.load = Proc("load generator", [sys.executable, "-m", "bench.soak.load", plan], cpus=self.load_cpus)
        self.procs.append(self.load)
        self.load.first_line()

    def stop(self) -> dict[str, str]:
        outs = {}
        for proc in reversed(self.procs):
            try:
                out = proc.stop()
                outs[getattr(proc, "name", "?")] = out or ""
            except Exception as e:
                say(f"could not stop {getattr(proc, 'name', proc)}: {e}")
        self.procs = []
        return outs

    # -------------------------------------------------------------- during the run

    def sample(self, t: float) -> None:
        """
        amp's RSS, open fds, threads and CPU time, and how much CPU the rest
        of the machine used since the last sample (in % of one CPU): a soak
        on a machine busy with other work measures that work too.
        """
        pid = self.amp.pid
        ours = 0.0
        for proc in self.procs:
            try:
                ours += cpu_seconds(proc.pid)
            except OSError:
                pass
        own = resource.getrusage(resource.RUSAGE_SELF)
        ours += own.ru_utime + own.ru_stime
        busy = busy_seconds()
        sample = {
            "t": round(t, 2),
            "rss_kib": rss_kib(pid),
            "fds": fd_count(pid),
            "threads": thread_count(pid),
            "cpu_s": round(cpu_seconds(pid), 2),
        }
        previous = self._last_busy
        self._last_busy = (t, busy, ours, sample["cpu_s"])
        if previous is not None and t > previous[0]:
            dt = t - previous[0]
            sample["amp_cpu_pct"] = round(100 * (sample["cpu_s"] - previous[3]) / dt, 1)
            sample["other_cpu_pct"] = round(max(0.0, 100 * ((busy - previous[1]) - (ours - previous[2])) / dt), 1)
        self.samples.append(sample)

    def fault(self, action: str) -> None:
        result = http_json(self.control, f"/{action}", method="POST")
        self.faults[action] += 1
        self.streams_cut += result.get("cut", 0)

    def run(self) -> dict[str, Any]:
        a = self.args
        start = time.monotonic()
        self.start_load()
        t0 = self.t0 = time.monotonic()
        say(f"load started: {a.rate:g} reviews/s for {a.duration:g}s")
        next_sample = t0
        next_rotate = t0 + a.rotate_every
        next_fault = t0 + a.fault_every
        next_touch = t0 + a.fault_every / 2
        next_swap = t0 + a.config_every if self.configs is not None else float("inf")
        kind = 0
        last_report = t0
        while self.load.alive():
            now = time.monotonic()
            elapsed = now - t0
            if not self.amp.proc.alive():
                self.problems.append(f"amp exited during the run after {elapsed:.0f}s")
                break
            if now >= next_sample:
                self.sample(elapsed)
                # What a new connection is served: every rotation must be.
                try:
                    self.served_serials.add(served_serial(self.amp.port, self.ca))
                except OSError as e:
                    self.problems.append(f"a new TLS connection to amp failed after {elapsed:.0f}s: {e}")
                next_sample += 1.0
            late = elapsed > a.duration - 3.0
            if now >= next_rotate:
                if not late:
                    self.volume.rotate()
                    self.rotations += 1
                next_rotate += a.rotate_every
            if now >= next_fault:
                if not late:
                    self.fault(("drop", "expire")[kind % 2])
                    kind += 1
                next_fault += a.fault_every
            if now >= next_touch:
                if not late:
                    self.fault("touch")
                next_touch += a.fault_every
            if now >= next_swap and self.configs is not None:
                # The next swap waits until amp has loaded the last one (a
                # file replaced before amp polled it was never read).
                if self.config_reloads_seen() < self.configs.hostile + self.configs.restored:
                    next_swap = now + 0.25
                else:
                    if late:
                        self.configs.restore()
                    else:
                        self.configs.swap()
                    next_swap = now + a.config_every
            if now - last_report >= 30:
                last_report = now
                s = self.samples[-1] if self.samples else {}
                say(
                    f"{elapsed:.0f}s: amp RSS {s.get('rss_kib', 0) / 1024:.1f} MiB, {s.get('fds')} fds, "
                    f"{self.rotations} rotations, {self.faults['drop']} drops, {self.faults['expire']} 410s"
                )
            wake = min(next_sample, next_rotate, next_fault, next_touch, next_swap)
            time.sleep(max(0.01, min(0.25, wake - time.monotonic())))
        load_out = self.load.stop(timeout=30.0)
        lines = [json.loads(x) for x in load_out.splitlines() if x.startswith("{")]
        summary = lines[-1] if lines else {}
        if "sent" not in summary:
            err = self.load.popen.stderr.read() if self.load.popen.stderr else ""
            self.problems.append(f"the load generator ended without a summary: {err.strip()[-2000:]}")
        say(f"load finished after {time.monotonic() - t0:.0f}s")
        return {"load": summary, "load_started_after_s": round(t0 - start, 2)}

    # -------------------------------------------------------------- after the run

    def collect(self) -> dict[str, Any]:
        """
        The figures after the run, once amp has settled: it serves the last
        rotated certificate, its cache holds every namespace of the API, the
        endpoint holds no call open, and (connections closed, pooled endpoint
        connections expired) amp's file descriptors are back to what it held
        before the load, or as near as they get within the wait.  Each wait
        is generous: on a busy machine settling takes longer, and what is
        judged is where amp ends up, not how fast.
        """
        last = self.volume.serials[-1]
        settle = 60.0
        try:
            serial = poll_until(
                "amp to serve the last certificate",
                lambda: served_serial(self.amp.port, self.ca) == last and last,
                settle,
                interval=0.2,
            )
        except WaitTimeout:
            serial = served_serial(self.amp.port, self.ca)
        self.served_serials.add(serial)
        listed = http_json(int(self.api_url.rsplit(":", 1)[1]), "/api/v1/namespaces")
        try:
            poll_until(
                "amp's cache to hold every namespace",
                lambda: (
                    Scrape.get(self.amp.metrics_port).value("amp_namespace_cache_namespaces") == len(listed["items"])
                ),
                settle,
                interval=0.2,
            )
            poll_until(
                "the endpoint to hold no call open",
                lambda: http_json(self.ports["steady"], "/stats")["hung_now"] == 0,
                settle,
                interval=0.2,
            )
        except WaitTimeout as e:
            say(str(e))
        limit = self.fds_before + FD_SLACK
        try:
            poll_until(
                "amp's file descriptors to come back down",
                lambda: (
                    fd_count(self.amp.pid) <= limit
                    and Scrape.get(self.amp.metrics_port).value("amp_open_connections") == 0
                ),
                settle,
                interval=0.2,
            )
        except WaitTimeout as e:
            say(str(e))
        configs = self.config_reloads(settle)
        metrics = Scrape.get(self.amp.metrics_port)
        return {
            "configs": configs,
            "metrics": metrics,
            "api": http_json(self.control, "/stats"),
            "api_namespaces": len(listed["items"]),
            "chaos": http_json(self.ports["steady"], "/stats"),
            "final_serial": serial,
            "last_serial": last,
            "fds_idle": fd_count(self.amp.pid),
            "open_connections": metrics.value("amp_open_connections"),
        }

    def config_reloads_seen(self) -> int:
        """How many config loads amp has counted, valid or not."""
        try:
            return int(sum(Scrape.get(self.amp.metrics_port).by("amp_config_reloads_total", "result").values()))
        except (OSError, RuntimeError):
            return -1

    def config_reloads(self, settle: float) -> Optional[dict[str, Any]]:
        """
        With hostile config swaps: once amp has seen the last swap (the
        good file back), what it counted, the hash of the config in force
        and how often it logged a refusal.
        """
        if self.configs is None:
            return None
        port = self.amp.metrics_port
        configs = self.configs
        try:
            poll_until(
                "amp to load the last config swapped in",
                lambda: self.config_reloads_seen() >= configs.hostile + configs.restored,
                settle,
                interval=0.2,
            )
        except WaitTimeout as e:
            say(str(e))
        self.configs.restore()

        def reloads() -> dict[str, int]:
            return {k: int(v) for k, v in Scrape.get(port).by("amp_config_reloads_total", "result").items()}

        try:
            poll_until(
                "amp to see every config swap",
                lambda: (
                    reloads().get("error", 0) >= configs.hostile and reloads().get("success", 0) >= configs.restored
                ),
                settle,
                interval=0.2,
            )
        except WaitTimeout as e:
            say(str(e))
        with open(self.amp.log_path, "rb") as f:
            logged = f.read().decode("utf-8", "replace").count("not reloaded (file changed)")
        return {
            **self.configs.figures(),
            "kinds": len(HOSTILE_CONFIGS),
            "amp_reloads": reloads(),
            "hash_before": self.config_hash_before,
            "hash_after": config_hash(port),
            "refusals_logged": logged,
        }


# ---------------------------------------------------------------------- main


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    stem = (
        "soak-"
        + now.strftime("%Y%m%dT%H%M%SZ")
        + ("-hostile" if args.hostile else "")
        + ("-quick" if args.quick else "")
    )
    started = time.monotonic()
    result: dict[str, Any] = {
        "date": now.isoformat(timespec="seconds"),
        "machine": machine(),
        "settings": {
            "duration_s": args.duration,
            "rate": args.rate,
            "seed": args.seed,
            "quick": args.quick,
            "rotate_every_s": args.rotate_every,
            "fault_every_s": args.fault_every,
            "max_response": MAX_RESPONSE,
            "oversize": OVERSIZE,
            "delay_ms": DELAY_MS,
            "breakers": {"steady": NEVER_OPENS, "flaky": OPENS_OFTEN},
            "rss_limit_mib": args.rss_limit_mib,
            "fd_slack": FD_SLACK,
            "timing_judged": not args.quick,
            "timing_criteria": list(TIMING_CRITERIA),
            "hostile": args.hostile,
            "flood_mib": args.flood_mib if args.hostile else None,
            "config_every_s": args.config_every if args.hostile else None,
        },
    }
    if args.wait_quiet > 0:
        result["settings"]["other_cpu_pct_before"] = wait_quiet(args.wait_quiet)
    status = PASSED
    with tempfile.TemporaryDirectory(prefix="amp-soak-") as workdir:
        soak = Soak(args, workdir)
        try:
            try:
                soak.start()
            except Exception as e:
                say(f"could not start: {e}")
                result["error"] = str(e)
                status = BROKEN
            if status == PASSED:
                result["settings"]["pinned"] = {
                    "amp": sorted(soak.amp_cpus or []),
                    "others": sorted(soak.load_cpus or []),
                }
                run = soak.run()
                try:
                    after = soak.collect()
                except Exception as e:  # amp, the endpoint or the API is gone: say so, keep what there is
                    soak.problems.append(f"could not read the figures after the run: {type(e).__name__}: {e}")
                    status = FAILED
        finally:
            outs = soak.stop()
        if status == FAILED:
            result["problems"] = soak.problems
            result["samples"] = soak.samples
            for problem in soak.problems:
                say(problem)
        elif status == PASSED:
            log = scan_log(soak.amp.log_path)
            result["namespaces"] = soak.namespaces
            result["load"] = run["load"]
            result["criteria"] = evaluate(soak, run, after, log)
            result["failed"] = [name for name, c in result["criteria"].items() if c["judged"] and not c["passed"]]
            result["busy"] = busy_machine(soak.samples)
            result["samples"] = soak.samples
            result["fake_api_at_exit"] = outs.get("fake API", "").strip().splitlines()[-1:]
            status = FAILED if result["failed"] else PASSED
            if args.keep_logs:
                for src, name in (
                    (soak.amp.log_path, "amp.log"),
                    (soak.chaos_log, "chaos-calls.txt"),
                    (soak.records, "reviews.jsonl"),
                ):
                    if os.path.exists(src):
                        shutil.copyfile(src, os.path.join(args.out, f"{stem}-{name}"))
    result["passed"] = status == PASSED
    result["verdict"] = {PASSED: "PASSED", FAILED: "FAILED", BROKEN: "BROKEN"}[status]
    result["elapsed_s"] = round(time.monotonic() - started, 1)
    path = os.path.join(args.out, f"{stem}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=2)
    if "criteria" in result:
        print(text_report(result))
    say(f"wrote {path} in {result['elapsed_s']:.0f}s")
    return status
