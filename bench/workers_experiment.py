#!/usr/bin/env python3
"""
Do N amp processes sharing one listening port serve more reviews than one?

For N in C{--workers} (default 1,2) and each way of sharing the port in
C{--share}, this starts N worker processes, each building amp's real
service with L{amp.service.AmpService} (static namespaces pointing at
C{bench/endpoint.py}) and serving the webhook from a shared port:

  - C{adopt}: this process binds and listens on one socket and passes it to
    every worker, which hands it to C{reactor.adoptStreamPort}: one accept
    queue, every worker woken for every new connection;
  - C{reuseport}: every worker binds its own socket to the same port with
    C{SO_REUSEPORT}: one accept queue per worker, the kernel spreads new
    connections over them by a hash of the client's address and port.

Then it drives the port with wrk exactly like C{bench/run} mode (b)
(typical body, C{-t1 -c16}, TLS keep-alive) and prints reviews/s, latency,
the CPU each worker used and how many reviews each answered.

Nothing is pinned here: the point is whether a second process adds
throughput on this machine, where wrk and the endpoint need CPU as well.
Usage::

    python bench/workers_experiment.py [--workers 1,2] [--share adopt,reuseport]
        [--duration 10] [--connections 16] [--out bench/results]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import sys
import tempfile
from typing import Any

from bench import bodies
from bench.harness import (
    ON, WRK_MISSING, Proc, WrkMissing, busy_seconds, cpu_seconds, ensure_wrk, free_port, machine, run_wrk, say,
)

BENCH = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH)


# ------------------------------------------------------------------ a worker


def worker(args: argparse.Namespace) -> int:
    """
    One amp worker: amp's service, its webhook listener on the shared port.
    """
    from twisted.internet import reactor
    from twisted.internet.endpoints import AdoptedStreamServerEndpoint
    from twisted.logger import globalLogBeginner

    from amp.config import load_config
    from amp.logs import make_observer
    from amp.metrics import Metrics
    from amp.service import AmpService, namespace_source, serving_certificate
    from amp.tls import TLSServerEndpoint

    config = load_config(args.config)
    log = open(args.log, "w")
    globalLogBeginner.beginLoggingTo([make_observer(config.log.format, config.log.level, log)],
                                     redirectStandardIO=False)
    if args.fd is not None:
        fd = args.fd
    else:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        s.bind(("127.0.0.1", args.port))
        s.listen(1024)
        s.setblocking(False)
        fd = s.detach()

    metrics = Metrics()
    certificate = serving_certificate(config.tls, reactor, metrics)
    # amp's TLS listener on the socket that is already listening.
    webhook = TLSServerEndpoint(AdoptedStreamServerEndpoint(reactor, fd, socket.AF_INET), certificate, reactor)
    service = AmpService(config, reactor, certificate=certificate, webhook_endpoint=webhook, metrics_endpoint=None,
                         namespaces=namespace_source(config, reactor, metrics), metrics=metrics,
                         install_sighup=False)
    service.startService()

    def reviews() -> int:
        return int(sum(s.value for m in metrics.admission_requests.collect() for s in m.samples
                       if s.name.endswith("_total")))

    reactor.addSystemEventTrigger(
        "before", "shutdown", lambda: print(json.dumps({"pid": os.getpid(), "reviews": reviews()}), flush=True))
    reactor.addSystemEventTrigger("before", "shutdown", service.stopService)
    reactor.callWhenRunning(lambda: print(json.dumps({"ready": True, "pid": os.getpid()}), flush=True))
    reactor.run()
    return 0


# ------------------------------------------------------------------ the experiment


def write_config(path: str, tls: dict[str, Any], endpoint_url: str) -> None:
    import yaml

    config = {
        "listen": {"port": 0, "interface": "127.0.0.1"},
        "tls": {"cert": tls["cert"], "key": tls["key"]},
        "metrics": {"port": 0},
        "kubernetes": {"source": "static", "namespaces": {
            ON: {"labels": {"amp.txn2.com/enabled": "true"}, "annotations": {"amp.txn2.com/ep": endpoint_url}}}},
        "endpoints": {"allow": ["http://127.0.0.1:*/*"]},
        "failure_policy": "Ignore",
    }
    with open(path, "w") as f:
        yaml.safe_dump(config, f)


def measure(n: int, share: str, workdir: str, config: str, body: str, endpoint: Proc,
            args: argparse.Namespace) -> dict[str, Any]:
    argv = [sys.executable, os.path.abspath(__file__), "--worker", "--config", config]
    listener = None
    if share == "adopt":
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", 0))
        listener.listen(1024)
        # Non-blocking, as adoptStreamPort requires: the reactor accepts in
        # a loop until EAGAIN (the flag is shared by every copy of the fd).
        listener.setblocking(False)
        port = listener.getsockname()[1]
        argv += ["--fd", str(listener.fileno())]
    else:
        port = free_port()
        argv += ["--port", str(port)]
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    workers = []
    try:
        for i in range(n):
            log = os.path.join(workdir, f"worker-{share}-{n}-{i}.log")
            if listener is not None:
                os.set_inheritable(listener.fileno(), True)
            p = Proc(f"worker {i}", argv + ["--log", log], env=env,
                     pass_fds=(listener.fileno(),) if listener is not None else ())
            workers.append(p)
        for p in workers:
            p.first_line()
        if listener is not None:
            listener.close()
            listener = None
        url = f"https://127.0.0.1:{port}/mutate?timeout=10s"
        run_wrk(url, body, connections=args.connections, duration=args.warmup, cpus=None)
        before = [cpu_seconds(p.pid) for p in workers]
        ep_before = cpu_seconds(endpoint.pid)
        busy_before = busy_seconds()
        summary = run_wrk(url, body, connections=args.connections, duration=args.duration, cpus=None)
        busy_after = busy_seconds()
        after = [cpu_seconds(p.pid) for p in workers]
        ep_after = cpu_seconds(endpoint.pid)
    finally:
        if listener is not None:
            listener.close()
        counts = []
        for p in workers:
            out = p.stop()
            lines = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
            counts.append(lines[-1].get("reviews", 0) if lines else 0)
    seconds = summary["duration_us"] / 1e6
    amp_cpu = [a - b for a, b in zip(after, before)]
    ours = sum(amp_cpu) + (ep_after - ep_before) + summary["wrk_cpu_s"]
    row = {
        "workers": n,
        "share": share,
        "requests": summary["requests"],
        "errors": summary["errors"],
        "reviews_per_s": round(summary["requests"] / seconds, 1),
        "latency_ms": {k: round(summary["latency_us"][k] / 1000, 3) for k in ("p50", "p90", "p99", "max")},
        "worker_cpu_pct": [round(100 * c / seconds, 1) for c in amp_cpu],
        "worker_reviews_total": counts,
        "amp_cpu_ms_per_review": round(1000 * sum(amp_cpu) / summary["requests"], 4) if summary["requests"] else None,
        "endpoint_cpu_pct": round(100 * (ep_after - ep_before) / seconds, 1),
        "wrk_cpu_pct": round(100 * summary["wrk_cpu_s"] / seconds, 1),
        "other_cpu_pct": round(max(0.0, 100 * (busy_after - busy_before - ours) / seconds), 1),
    }
    say(f"{share:9} N={n}: {row['reviews_per_s']:7.0f}/s p50 {row['latency_ms']['p50']:.2f}ms "
        f"p99 {row['latency_ms']['p99']:.2f}ms workers cpu% {row['worker_cpu_pct']} reviews {counts} "
        f"endpoint {row['endpoint_cpu_pct']}% wrk {row['wrk_cpu_pct']}% other {row['other_cpu_pct']}%")
    return row


def report(result: dict[str, Any]) -> str:
    m = result["machine"]
    lines = [
        f"# amp workers experiment — {result['date']}",
        "",
        f"Machine: {m['nproc']} CPUs, {m['cpu_model']}; Python {m['python']}, Twisted {m['twisted']}. "
        f"wrk -t1 -c{result['connections']} -d{result['duration_s']}s, typical body, nothing pinned.",
        "",
        "| share | workers | reviews/s | × N=1 | p50 ms | p99 ms | worker CPU % | reviews per worker | "
        "amp CPU ms/review | endpoint CPU % | wrk CPU % | other CPU % |",
        "|---|---:|---:|---:|---:|---:|---|---|---:|---:|---:|---:|",
    ]
    base = {r["share"]: r["reviews_per_s"] for r in result["rows"] if r["workers"] == 1}
    for r in result["rows"]:
        one = base.get(r["share"])
        ratio = f"{r['reviews_per_s'] / one:.2f}" if one else "—"
        lines.append(f"| {r['share']} | {r['workers']} | {r['reviews_per_s']:.0f} | {ratio} | "
                     f"{r['latency_ms']['p50']:.2f} | {r['latency_ms']['p99']:.2f} | "
                      f"{' + '.join(f'{c:.0f}' for c in r['worker_cpu_pct'])} | "
                      f"{' + '.join(str(c) for c in r['worker_reviews_total'])} | "
                      f"{r['amp_cpu_ms_per_review']:.3f} | {r['endpoint_cpu_pct']:.0f} | {r['wrk_cpu_pct']:.0f} | "
                      f"{r['other_cpu_pct']:.0f} |")
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--config", help=argparse.SUPPRESS)
    p.add_argument("--log", help=argparse.SUPPRESS)
    p.add_argument("--fd", type=int, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--workers", default="1,2")
    p.add_argument("--share", default="adopt,reuseport")
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--connections", type=int, default=16)
    p.add_argument("--out", default=os.path.join(BENCH, "results"))
    args = p.parse_args(argv)
    if args.worker:
        return worker(args)
    try:
        ensure_wrk()
    except WrkMissing as e:
        say(str(e))
        return WRK_MISSING
    from amp_dev.devcert import write_dev_tls

    now = datetime.datetime.now(datetime.timezone.utc)
    result: dict[str, Any] = {"date": now.isoformat(timespec="seconds"), "machine": machine(),
                              "connections": args.connections, "duration_s": args.duration, "rows": []}
    with tempfile.TemporaryDirectory(prefix="amp-workers-") as workdir:
        tls = {k: str(v) for k, v in write_dev_tls(os.path.join(workdir, "tls")).items()}
        files = bodies.write_bodies(os.path.join(workdir, "bodies"), {"on": ON})
        endpoint = Proc("endpoint", [sys.executable, "-m", "bench.endpoint"])
        try:
            endpoint_url = f"http://127.0.0.1:{endpoint.first_line()['port']}/patch"
            config = os.path.join(workdir, "amp.yaml")
            write_config(config, tls, endpoint_url)
            for share in args.share.split(","):
                for n in (int(x) for x in args.workers.split(",")):
                    result["rows"].append(measure(n, share, workdir, config, files["typical-on"], endpoint, args))
        finally:
            endpoint.stop()
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, "workers-" + now.strftime("%Y%m%dT%H%M%SZ"))
    with open(stem + ".json", "w") as f:
        json.dump(result, f, indent=2)
    text = report(result)
    with open(stem + ".md", "w") as f:
        f.write(text)
    print(text)
    say(f"wrote {stem}.json and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
