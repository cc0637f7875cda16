"""
bench/run's processes and measurements: L{Bench} starts amp (under twistd),
the endpoint, the fake Kubernetes API, the floors and the OTLP collector,
pinned to their CPUs; checks one review of each mode; runs wrk against it
and reads CPU, RSS and amp's own counters around the run into one row; and
gathers the rows of the table, the interleaved ratio rounds and the latency
curve.  The profile is L{bench.run_profile}'s; what the rows mean,
L{bench.run_analysis}'s.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from typing import Any, Optional

from bench import bodies
from bench.harness import (
    EXPECTED_RESULT,
    OFF,
    ON,
    Amp,
    ModeFailed,
    Proc,
    busy_seconds,
    check_answer,
    cpu_seconds,
    cpu_split,
    peak_rss_mib,
    post_review,
    reset_peak_rss,
    run_wrk,
    say,
    wait_quiet,
)
from bench.run_analysis import add_cpu_ratios
from bench.run_modes import BUSY_PCT, MODES, PROXIES, ROW_ORDER, ROW_WAIT, TRACING


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.procs: list[Any] = []
        self.quick = args.quick
        n = len(os.sched_getaffinity(0))
        self.pin = (not args.no_pin) and n >= 2
        cpus = sorted(os.sched_getaffinity(0))
        self.amp_cpus = {cpus[0]} if self.pin else None
        self.load_cpus = {cpus[1]} if self.pin else None
        self.kube = importlib.util.find_spec("amp.kube") is not None and not args.static
        self.results: dict[str, Any] = {}

    # -------------------------------------------------------------- setup

    def start(self, workdir: str) -> None:
        from amp_dev.devcert import write_dev_tls  # type: ignore[import-untyped]  # examples/, no py.typed

        self.tls = {k: str(v) for k, v in write_dev_tls(os.path.join(workdir, "tls")).items()}
        self.bodies = bodies.write_bodies(os.path.join(workdir, "bodies"), {"on": ON, "off": OFF})
        py = sys.executable
        self.endpoint = Proc("endpoint", [py, "-m", "bench.endpoint", "--stats"], cpus=self.load_cpus)
        self.procs.append(self.endpoint)
        port = self.endpoint.first_line()["port"]
        self.endpoint_url = f"http://127.0.0.1:{port}/patch"
        say(f"endpoint on {self.endpoint_url} (pid {self.endpoint.pid})")
        #: mode -> (process, port, URL) of the benchmark's own proxies.
        self.proxies: dict[str, tuple[Proc, int, str]] = {}
        for mode, who in PROXIES.items():
            proc = Proc(
                who,
                [
                    py,
                    "-m",
                    "bench.floor",
                    "--cert",
                    self.tls["cert"],
                    "--key",
                    self.tls["key"],
                    "--endpoint",
                    self.endpoint_url,
                    *(["--stack"] if who == "stack" else []),
                ],
                cpus=self.amp_cpus,
            )
            self.procs.append(proc)
            first = proc.first_line()
            url = f"https://127.0.0.1:{first['port']}/mutate?timeout=10s"
            self.proxies[mode] = (proc, first["port"], url)
            self.results["floor_json"] = first["json"]
            say(f"{MODES[mode]} on {url} (pid {proc.pid}, JSON by {first['json']})")
        kubeconfig = None
        self.fakeapi: Optional[Proc] = None
        if self.kube:
            kubeconfig = os.path.join(workdir, "kubeconfig")
            self.fakeapi = Proc(
                "fake API",
                [
                    py,
                    "-m",
                    "bench.fakeapi",
                    "--kubeconfig",
                    kubeconfig,
                    "--enabled",
                    f"{ON}={self.endpoint_url}",
                    "--disabled",
                    OFF,
                    "--filler",
                    "200",
                ],
                cpus=self.load_cpus,
            )
            self.procs.append(self.fakeapi)
            say(f"fake Kubernetes API on {self.fakeapi.first_line()['url']} (pid {self.fakeapi.pid})")
        source = "kubeconfig" if self.kube else "static"
        self.workdir = workdir
        self.amp = self.new_amp("cache")
        self.procs.append(self.amp)
        self.amp_get: Optional[Amp] = None
        if self.kube:
            self.amp_get = self.new_amp("per-review-get", per_review_get=True)
            self.procs.append(self.amp_get)
        #: mode -> the amp of a tracing mode, exporting to the benchmark's collector.
        self.traced: dict[str, Amp] = {}
        if set(TRACING) & set(self.args.modes):
            self.sink = Proc("OTLP collector", [py, "-m", "bench.otlp_sink"], cpus=self.load_cpus)
            self.procs.append(self.sink)
            sink_url = f"http://127.0.0.1:{self.sink.first_line()['port']}/v1/traces"
            say(f"OTLP collector on {sink_url} (pid {self.sink.pid})")
            for mode, ratio in TRACING.items():
                if mode in self.args.modes:
                    self.traced[mode] = self.new_amp(
                        f"tracing-{ratio:g}",
                        overlay={
                            "tracing": {
                                "enabled": True,
                                "sampling_ratio": ratio,
                                "protocol": "http/protobuf",
                                "endpoint": sink_url,
                            }
                        },
                    )
                    self.procs.append(self.traced[mode])
        for amp in (self.amp, self.amp_get, *self.traced.values()):
            if amp is not None:
                amp.wait_ready()
                say(f"amp ({amp.name}) ready on {amp.url} (pid {amp.pid})")
        self.results["namespace_source"] = source
        if not self.kube:
            say("amp.kube is not available: mode (b) uses static namespaces and mode (c) is not measured")

    def new_amp(self, name: str, *, per_review_get: bool = False, **options: Any) -> Amp:
        """
        An amp of the run (L{start} made the workdir, the certificate, the
        endpoint and, with C{amp.kube}, the fake API it uses), pinned to
        amp's CPU; C{options} go to L{Amp} (C{overlay}, C{extra_twistd}).
        """
        return Amp(
            name,
            self.workdir,
            self.tls,
            endpoint_url=self.endpoint_url,
            source="kubeconfig" if self.kube else "static",
            kubeconfig=os.path.join(self.workdir, "kubeconfig") if self.kube else None,
            per_review_get=per_review_get,
            cpus=self.amp_cpus,
            **options,
        )

    def stop(self) -> None:
        for proc in reversed(self.procs):
            try:
                out = proc.stop() if isinstance(proc, Proc) else (proc.stop() or "")
            except Exception as e:  # a stuck child must not hide the results
                say(f"could not stop {getattr(proc, 'name', proc)}: {e}")
                continue
            if proc is self.fakeapi and out:
                lines = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
                if lines and lines[-1].get("errors"):
                    say(f"fake API errors: {lines[-1]['errors']}")
        self.procs = []

    # -------------------------------------------------------------- measuring

    def target(self, mode: str, body: str) -> tuple[str, str, Optional[Amp]]:
        if mode == "a":
            return self.endpoint_url, self.bodies[f"{body}-pod"], None
        if mode in self.proxies:
            return self.proxies[mode][2], self.bodies[f"{body}-on"], None
        if mode == "b":
            return self.amp.url, self.bodies[f"{body}-on"], self.amp
        if mode in self.traced:
            return self.traced[mode].url, self.bodies[f"{body}-on"], self.traced[mode]
        if mode == "c":
            assert self.amp_get is not None
            return self.amp_get.url, self.bodies[f"{body}-on"], self.amp_get
        return self.amp.url, self.bodies[f"{body}-off"], self.amp

    def check(self, mode: str, amp: Optional[Amp], body_file: str, attempts: int = 3) -> None:
        """
        One review of the mode sent before its run must get the mode's
        answer (L{check_answer}).  The first reviews also warm the path up
        (TLS, pools, the kubernetes client's first GET): on a starved
        machine amp may answer one under its failure policy when the
        review's deadline passes, which is right, so the check is tried
        up to C{attempts} times before the mode fails.
        """
        for attempt in range(attempts):
            if amp is not None:
                answer = amp.review(body_file)
            else:
                answer = post_review(self.proxies[mode][1], self.tls["ca_cert"], body_file, PROXIES[mode])
            try:
                check_answer(mode, answer)
                return
            except ModeFailed:
                if attempt == attempts - 1:
                    raise
                say(f"mode ({mode}): {answer.get('warnings') or answer.get('status')}; trying again")

    def measure(self, mode: str, body: str, connections: int, duration: float, warmup: float) -> dict[str, Any]:
        url, body_file, amp = self.target(mode, body)
        proxy = self.proxies[mode][0] if mode in self.proxies else None
        if amp is not None or proxy is not None:
            self.check(mode, amp, body_file)
        if warmup > 0:
            run_wrk(url, body_file, connections=connections, duration=warmup, cpus=self.load_cpus)
        watched = {"endpoint": self.endpoint.pid}
        if proxy is not None:
            watched["floor"] = proxy.pid
            floor_split_before = cpu_split(proxy.pid)
        if amp is not None:
            watched["amp"] = amp.pid
            reset_ok = reset_peak_rss(amp.pid)
            before_metrics = amp.metrics()
            split_before = cpu_split(amp.pid)
        if self.fakeapi is not None:
            watched["fakeapi"] = self.fakeapi.pid
        others = [p.pid for p in self.procs if p.pid not in watched.values()]
        cpu_before = {k: cpu_seconds(pid) for k, pid in watched.items()}
        ours_before = sum(cpu_seconds(pid) for pid in others)
        busy_before = busy_seconds()
        summary = run_wrk(url, body_file, connections=connections, duration=duration, cpus=self.load_cpus)
        busy_after = busy_seconds()
        cpu_after = {k: cpu_seconds(pid) for k, pid in watched.items()}
        ours_after = sum(cpu_seconds(pid) for pid in others)
        seconds = summary["duration_us"] / 1e6
        requests = summary["requests"]
        lat = summary["latency_us"]
        row: dict[str, Any] = {
            "mode": mode,
            "label": MODES[mode],
            "body": body,
            "body_bytes": os.path.getsize(body_file),
            "connections": connections,
            "duration_s": round(seconds, 3),
            "requests": requests,
            "reviews_per_s": round(requests / seconds, 1) if seconds else 0.0,
            "latency_ms": {k: round(lat[k] / 1000, 3) for k in ("p50", "p90", "p99", "max")},
            "errors": summary["errors"],
            "cpu_pct": {k: round(100 * (cpu_after[k] - cpu_before[k]) / seconds, 1) for k in watched},
            "wrk_cpu_pct": round(100 * summary["wrk_cpu_s"] / seconds, 1) if seconds else 0.0,
        }
        row["cpu_pct"]["wrk"] = row.pop("wrk_cpu_pct")
        # Everything else the machine did meanwhile (other processes, the
        # kernel's own work): a busy machine makes throughput and latency
        # figures unreliable, CPU per review much less so.
        ours = sum(cpu_after[k] - cpu_before[k] for k in watched) + summary["wrk_cpu_s"] + ours_after - ours_before
        row["cpu_pct"]["other"] = (
            round(max(0.0, 100 * (busy_after - busy_before - ours) / seconds), 1) if seconds else 0.0
        )
        if requests:
            per = {k: (cpu_after[k] - cpu_before[k]) * 1000 / requests for k in watched}
            row["endpoint_cpu_ms_per_request"] = round(per["endpoint"], 4)
            if amp is not None:
                row["amp_cpu_ms_per_review"] = round(per["amp"], 4)
            if proxy is not None:
                row["floor_cpu_ms_per_review"] = round(per["floor"], 4)
        if proxy is not None:
            split_after = cpu_split(proxy.pid)
            user, system = (split_after[i] - floor_split_before[i] for i in (0, 1))
            row["floor_cpu_kernel_pct"] = round(100 * system / (user + system), 1) if user + system else 0.0
            row["floor_peak_rss_mib"] = round(peak_rss_mib(proxy.pid) or 0.0, 1)
        if amp is not None:
            split_after = cpu_split(amp.pid)
            user, system = (split_after[i] - split_before[i] for i in (0, 1))
            row["amp_cpu_kernel_pct"] = round(100 * system / (user + system), 1) if user + system else 0.0
            row["amp_peak_rss_mib"] = round(peak_rss_mib(amp.pid) or 0.0, 1)
            row["amp_peak_rss_scope"] = "this mode" if reset_ok else "process lifetime"
            after_metrics = amp.metrics()
            row["amp_counts"] = {
                k: int(v - before_metrics.get(k, 0)) for k, v in after_metrics.items() if v - before_metrics.get(k, 0)
            }
            expected = EXPECTED_RESULT[mode]
            answered = row["amp_counts"].get(expected, 0)
            otherwise = {k: v for k, v in row["amp_counts"].items() if k.startswith("result=") and k != expected}
            # wrk hangs up on the reviews still in flight when it stops; amp
            # answers those under its failure policy (cancelled): at most one
            # per connection, for the warm-up's end and the run's.
            unexpected = answered < requests or sum(otherwise.values()) > 2 * connections
            if unexpected and not self.quick:
                raise ModeFailed(
                    f"mode ({mode}) {body}: wrk counted {requests} requests, amp answered "
                    f"{answered} with {expected} and {otherwise or 'nothing'} otherwise"
                )
            if unexpected:
                # A quick run proves the harness on any machine: amp answered
                # every request (wrk saw no error), and a review the starved
                # machine made amp answer under its failure policy (a
                # namespace GET or an endpoint call that took too long) is
                # reported, not a failure; the mode's check above got the
                # right answer.
                row["failure_policy_answers"] = otherwise
                if answered + sum(otherwise.values()) < requests:
                    raise ModeFailed(
                        f"mode ({mode}) {body}: wrk counted {requests} requests, amp answered only "
                        f"{answered + sum(otherwise.values())}"
                    )
        failed = sum(summary["errors"].values())
        if failed or not requests:
            raise ModeFailed(f"mode ({mode}) {body}: {requests} requests, errors {summary['errors']}")
        say(
            f"({mode}) {body:7} c={connections:<2} {row['reviews_per_s']:8.0f}/s  p50 {row['latency_ms']['p50']:.2f}ms"
            f"  p99 {row['latency_ms']['p99']:.2f}ms  amp cpu "
            f"{row.get('amp_cpu_ms_per_review', row.get('floor_cpu_ms_per_review', float('nan'))):.3f} ms/review"
            f"  cpu% {row['cpu_pct']}"
        )
        return row

    def measure_quiet(self, mode: str, body: str, connections: int, duration: float, warmup: float) -> dict[str, Any]:
        """
        L{measure}, again (up to C{--retry-busy} times) while other processes
        used more than C{BUSY_PCT}% of a CPU meanwhile; the quietest attempt.
        With C{--wait-quiet}, each attempt first waits (up to L{ROW_WAIT}
        seconds) for the machine to be idle.
        """
        best = None
        for attempt in range(1 + self.args.retry_busy):
            if self.args.wait_quiet > 0:
                wait_quiet(min(self.args.wait_quiet, ROW_WAIT), quiet=True)
            row = self.measure(mode, body, connections, duration, warmup)
            row["attempts"] = attempt + 1
            if best is None or row["cpu_pct"]["other"] < best["cpu_pct"]["other"]:
                best = row
            if row["cpu_pct"]["other"] <= BUSY_PCT:
                break
            if attempt < self.args.retry_busy:
                say(f"other processes used {row['cpu_pct']['other']:.0f}% of a CPU: measuring again")
        assert best is not None
        return best

    def table(self) -> list[dict[str, Any]]:
        a = self.args
        rows = []
        modes = [m for m in ROW_ORDER if m in a.modes and (m != "c" or self.amp_get is not None)]
        for body in bodies.BODIES:
            for mode in modes:
                rows.append(self.measure_quiet(mode, body, a.connections, a.duration, a.warmup))
        add_cpu_ratios(rows)
        return rows

    def ratio_rounds(self) -> list[dict[str, Any]]:
        """
        amp (b) and the floor (f) measured in turn, C{--ratio-rounds} times
        per body (the order swapped each round): CPU per review drifts on a
        shared machine over the minutes between the table's rows of (f) and
        (b), so the CPU goals are judged on the median of ratios whose two
        halves were measured seconds apart.
        """
        a = self.args
        if "b" not in a.modes or "f" not in a.modes:
            return []
        rounds = []
        for body in bodies.BODIES:
            for n in range(a.ratio_rounds):
                order = ("f", "b") if n % 2 == 0 else ("b", "f")
                got = {mode: self.measure(mode, body, a.connections, a.ratio_duration, 0.0) for mode in order}
                floor, amp = got["f"]["floor_cpu_ms_per_review"], got["b"]["amp_cpu_ms_per_review"]
                rounds.append(
                    {
                        "body": body,
                        "round": n + 1,
                        "floor_ms": floor,
                        "amp_ms": amp,
                        "ratio": round(amp / floor, 3),
                        "other_cpu_pct": max(row["cpu_pct"].get("other", 0.0) for row in got.values()),
                    }
                )
        return rounds

    def curve(self) -> list[dict[str, Any]]:
        a = self.args
        points = []
        # The floor (f) is on the curve too: at low connection counts the
        # machine's own wake-up latency shows in every proxy's p99 (each
        # request wakes an idle process on the other CPU), and the floor
        # at the same point says how much of a p99 is the machine's.
        for mode in ("a", "f", "g", "b"):
            for c in a.curve:
                row = self.measure_quiet(mode, "typical", c, a.curve_duration, a.curve_warmup)
                points.append(
                    {k: row[k] for k in ("mode", "connections", "reviews_per_s", "latency_ms")}
                    | {
                        "amp_cpu_ms_per_review": row.get("amp_cpu_ms_per_review"),
                        "other_cpu_pct": row["cpu_pct"].get("other", 0.0),
                    }
                )
        return points
