#!/usr/bin/env python3
"""
Do N amp processes sharing one listening port serve more reviews than one?

For N in C{--workers} (default 1,2) and each way of sharing the port in
C{--share}, this starts N worker processes, each building amp's real
service with L{amp.service.AmpService} (static namespaces pointing at
C{bench/endpoint.py}) and serving the webhook from a shared port:

  - C{balanced}: amp's own way with C{workers: N} (L{amp.balance}): this
    process binds one socket and creates the load table, as worker 0 does,
    and every worker takes both over with
    L{amp.balance.WorkerListener.inherit}, the listener C{twistd amp} uses:
    each new connection is accepted by the worker with the fewest open;
  - C{adopt}: this process binds and listens on one socket and passes it to
    every worker, which hands it to C{reactor.adoptStreamPort}: one accept
    queue, every worker woken for every new connection;
  - C{reuseport}: every worker binds its own socket to the same port with
    C{SO_REUSEPORT}: one accept queue per worker, the kernel spreads new
    connections over them by a hash of the client's address and port.

Then it drives the port with wrk exactly like C{bench/run} mode (b)
(typical body, C{-t1 -c16}, TLS keep-alive) and prints reviews/s, latency,
the CPU each worker used, how many reviews each answered and how many of
wrk's connections each held during the run, and the capacity: the reviews
over the CPU seconds of the busiest worker, i.e. what the N workers would
answer per second with a CPU each.  Over the N=1 row's, that is the
scaling independent of wrk and the endpoint sharing the machine's CPUs.
wrk is a closed loop (a connection sends its next request when the last
is answered), so a worker with more connections answers each more slowly
rather than more reviews; the split capacity is what the connections'
split would allow if each carried the same rate, as the API server's do.

Nothing is pinned here.
Usage::

    python bench/workers_experiment.py [--workers 1,2] [--share balanced,adopt,reuseport]
        [--duration 10] [--connections 16] [--out bench/results]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import select
import signal
import socket
import sys
import tempfile
from typing import Any, Optional

from bench import bodies
from bench.harness import (
    ON,
    WRK_MISSING,
    Proc,
    WrkMissing,
    busy_seconds,
    cpu_seconds,
    ensure_wrk,
    free_port,
    machine,
    run_wrk,
    say,
)
from tests.support.waiting import WaitTimeout, poll_until

BENCH = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH)


# ------------------------------------------------------------------ a worker


def worker(args: argparse.Namespace) -> int:
    """
    One amp worker: amp's service, its webhook listener on the shared port.
    Each C{SIGUSR1} prints a line with the reviews answered so far, the
    webhook connections open now and the most open at once since the last
    such line.
    """
    from twisted.internet import reactor
    from twisted.internet.endpoints import AdoptedStreamServerEndpoint
    from twisted.logger import globalLogBeginner

    from amp.balance import WorkerListener
    from amp.config import load_config
    from amp.logs import make_observer
    from amp.metrics import Metrics
    from amp.service import AmpService, namespace_source, serving_certificate
    from amp.tls import TLSServerEndpoint

    config = load_config(args.config)
    log = open(args.log, "w")
    globalLogBeginner.beginLoggingTo(
        [make_observer(config.log.format, config.log.level, log)], redirectStandardIO=False
    )
    inner: Any
    publish: Any = None
    if args.share == "balanced":
        shared = WorkerListener.inherit(reactor, args.index, args.fd, args.table_fd)
        inner, publish = shared, shared.connections_changed
    else:
        if args.fd is not None:
            fd = args.fd
        else:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            s.bind(("127.0.0.1", args.port))
            s.listen(1024)
            s.setblocking(False)
            fd = s.detach()
        inner = AdoptedStreamServerEndpoint(reactor, fd, socket.AF_INET)

    connections = {"open": 0, "peak": 0}

    def on_connections(count: int) -> None:
        connections["open"] = count
        connections["peak"] = max(connections["peak"], count)
        if publish is not None:
            publish(count)

    metrics = Metrics()
    certificate = serving_certificate(config.tls, reactor, metrics)
    # amp's TLS listener on the socket that is already listening.
    webhook = TLSServerEndpoint(inner, certificate, reactor)
    service = AmpService(
        config,
        reactor,
        certificate=certificate,
        webhook_endpoint=webhook,
        metrics_endpoint=None,
        namespaces=namespace_source(config, reactor, metrics),
        metrics=metrics,
        install_sighup=False,
        on_connections=on_connections,
    )
    service.startService()

    def reviews() -> int:
        return int(
            sum(s.value for m in metrics.admission_requests.collect() for s in m.samples if s.name.endswith("_total"))
        )

    def report() -> None:
        print(json.dumps({"reviews": reviews(), "open": connections["open"], "peak": connections["peak"]}), flush=True)
        connections["peak"] = connections["open"]

    signal.signal(signal.SIGUSR1, lambda *_: reactor.callFromThread(report))
    reactor.addSystemEventTrigger(
        "before", "shutdown", lambda: print(json.dumps({"pid": os.getpid(), "reviews": reviews()}), flush=True)
    )
    reactor.addSystemEventTrigger("before", "shutdown", service.stopService)
    reactor.callWhenRunning(lambda: print(json.dumps({"ready": True, "pid": os.getpid()}), flush=True))
    reactor.run()
    return 0


def ask(p: Proc, timeout: float = 10.0) -> dict[str, Any]:
    """A worker's report (see L{worker}): reviews so far, connections open and their peak."""
    os.kill(p.pid, signal.SIGUSR1)
    out = p.popen.stdout
    assert out is not None
    ready, _, _ = select.select([out], [], [], timeout)
    line = out.readline() if ready else ""
    if not line:
        raise RuntimeError(f"{p.name} did not report")
    return json.loads(line)


def wait_closed(workers: list[Proc], timeout: float = 10.0) -> list[dict[str, Any]]:
    """
    Every worker's report once none has a connection open (wrk's warm-up
    connections are closed), so that the next peaks are the next run's.
    """
    reports: list[dict[str, Any]] = []

    def closed() -> bool:
        reports[:] = [ask(p) for p in workers]
        return not any(r["open"] for r in reports)

    try:
        poll_until("the workers' connections to close", closed, timeout)
    except WaitTimeout:
        pass  # the reports as they are: the run's peaks then include what stayed open
    return reports


# ------------------------------------------------------------------ the experiment


def write_config(path: str, tls: dict[str, Any], endpoint_url: str) -> None:
    import yaml

    config = {
        "listen": {"port": 0, "interface": "127.0.0.1"},
        "tls": {"cert": tls["cert"], "key": tls["key"]},
        "metrics": {"port": 0},
        "kubernetes": {
            "source": "static",
            "namespaces": {
                ON: {"labels": {"amp.txn2.com/enabled": "true"}, "annotations": {"amp.txn2.com/ep": endpoint_url}}
            },
        },
        "endpoints": {"allow": ["http://127.0.0.1:*/*"]},
        "failure_policy": "Ignore",
    }
    with open(path, "w") as f:
        yaml.safe_dump(config, f)


def measure(
    n: int, share: str, workdir: str, config: str, body: str, endpoint: Proc, args: argparse.Namespace
) -> dict[str, Any]:
    argv = [sys.executable, os.path.abspath(__file__), "--worker", "--config", config, "--share", share]
    listener: Optional[socket.socket] = None
    table_fd: Optional[int] = None
    if share in ("adopt", "balanced"):
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", 0))
        listener.listen(1024)
        # Non-blocking, as adoptStreamPort requires: the reactor accepts in
        # a loop until EAGAIN (the flag is shared by every copy of the fd).
        listener.setblocking(False)
        port = listener.getsockname()[1]
        argv += ["--fd", str(listener.fileno())]
        if share == "balanced":
            from amp.balance import LoadTable

            _, table_fd = LoadTable.create(n)
            argv += ["--table-fd", str(table_fd)]
    else:
        port = free_port()
        argv += ["--port", str(port)]
    passed = tuple(fd for fd in (listener.fileno() if listener else None, table_fd) if fd is not None)
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    workers: list[Proc] = []
    try:
        for i in range(n):
            log = os.path.join(workdir, f"worker-{share}-{n}-{i}.log")
            workers.append(Proc(f"worker {i}", argv + ["--log", log, "--index", str(i)], env=env, pass_fds=passed))
        for p in workers:
            p.first_line()
        if listener is not None:
            listener.close()
            listener = None
        if table_fd is not None:
            os.close(table_fd)
            table_fd = None
        url = f"https://127.0.0.1:{port}/mutate?timeout=10s"
        run_wrk(url, body, connections=args.connections, duration=args.warmup, cpus=None)
        first = wait_closed(workers)
        before = [cpu_seconds(p.pid) for p in workers]
        ep_before = cpu_seconds(endpoint.pid)
        busy_before = busy_seconds()
        summary = run_wrk(url, body, connections=args.connections, duration=args.duration, cpus=None)
        busy_after = busy_seconds()
        after = [cpu_seconds(p.pid) for p in workers]
        ep_after = cpu_seconds(endpoint.pid)
        last = [ask(p) for p in workers]
    finally:
        if listener is not None:
            listener.close()
        if table_fd is not None:
            os.close(table_fd)
        counts = []
        for p in workers:
            out = p.stop()
            lines = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
            counts.append(lines[-1].get("reviews", 0) if lines else 0)
    seconds = summary["duration_us"] / 1e6
    amp_cpu = [a - b for a, b in zip(after, before)]
    window = [b["reviews"] - a["reviews"] for a, b in zip(first, last)]
    ours = sum(amp_cpu) + (ep_after - ep_before) + summary["wrk_cpu_s"]
    busiest = max(amp_cpu)
    held = [r["peak"] for r in last]
    # With every connection carrying the same rate of reviews (an open
    # loop, as the API server's requests are), worker i gets its share of
    # the connections' reviews at its own CPU cost per review; the first to
    # fill its CPU caps the whole.
    loads = [h / sum(held) * c / r for h, c, r in zip(held, amp_cpu, window) if r > 0 and sum(held)]
    row = {
        "workers": n,
        "share": share,
        "requests": summary["requests"],
        "errors": summary["errors"],
        "reviews_per_s": round(summary["requests"] / seconds, 1),
        "latency_ms": {k: round(summary["latency_us"][k] / 1000, 3) for k in ("p50", "p90", "p99", "max")},
        "worker_cpu_s": [round(c, 3) for c in amp_cpu],
        "worker_cpu_pct": [round(100 * c / seconds, 1) for c in amp_cpu],
        # Reviews each worker answered during the run, and the most of
        # wrk's connections it held at once.
        "worker_reviews": window,
        "worker_connections": held,
        "worker_reviews_total": counts,
        # What the N workers would answer per second with a CPU each: the
        # reviews over the busiest worker's CPU seconds.
        "capacity_per_s": round(sum(window) / busiest, 1) if busiest > 0 else None,
        # The same with the reviews spread as the connections are.
        "split_capacity_per_s": round(1 / max(loads), 1) if loads and max(loads) > 0 else None,
        "amp_cpu_ms_per_review": round(1000 * sum(amp_cpu) / sum(window), 4) if sum(window) else None,
        "endpoint_cpu_pct": round(100 * (ep_after - ep_before) / seconds, 1),
        "wrk_cpu_pct": round(100 * summary["wrk_cpu_s"] / seconds, 1),
        "other_cpu_pct": round(max(0.0, 100 * (busy_after - busy_before - ours) / seconds), 1),
    }
    say(
        f"{share:9} N={n}: {row['reviews_per_s']:7.0f}/s p50 {row['latency_ms']['p50']:.2f}ms "
        f"p99 {row['latency_ms']['p99']:.2f}ms workers cpu% {row['worker_cpu_pct']} reviews {window} "
        f"connections {row['worker_connections']} capacity {row['capacity_per_s']}/s "
        f"(at the connections' split {row['split_capacity_per_s']}/s) "
        f"endpoint {row['endpoint_cpu_pct']}% wrk {row['wrk_cpu_pct']}% other {row['other_cpu_pct']}%"
    )
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
        "connections per worker | capacity/s | capacity × N=1 | split capacity/s | split × N=1 | "
        "amp CPU ms/review | endpoint CPU % | wrk CPU % | other CPU % |",
        "|---|---:|---:|---:|---:|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    base = {r["share"]: r for r in result["rows"] if r["workers"] == 1}
    for r in result["rows"]:
        one = base.get(r["share"])
        ratio = f"{r['reviews_per_s'] / one['reviews_per_s']:.2f}" if one else "—"

        def over(key: str, r: dict[str, Any] = r, one: Optional[dict[str, Any]] = one) -> str:
            return f"{r[key] / one[key]:.2f}" if one and one.get(key) and r.get(key) else "—"

        lines.append(
            f"| {r['share']} | {r['workers']} | {r['reviews_per_s']:.0f} | {ratio} | "
            f"{r['latency_ms']['p50']:.2f} | {r['latency_ms']['p99']:.2f} | "
            f"{' + '.join(f'{c:.0f}' for c in r['worker_cpu_pct'])} | "
            f"{' + '.join(str(c) for c in r['worker_reviews'])} | "
            f"{' + '.join(str(c) for c in r['worker_connections'])} | "
            f"{r['capacity_per_s'] or 0:.0f} | {over('capacity_per_s')} | "
            f"{r.get('split_capacity_per_s') or 0:.0f} | {over('split_capacity_per_s')} | "
            f"{r['amp_cpu_ms_per_review'] or 0:.3f} | {r['endpoint_cpu_pct']:.0f} | "
            f"{r['wrk_cpu_pct']:.0f} | {r['other_cpu_pct']:.0f} |"
        )
    lines += [
        "",
        "*capacity/s* = reviews ÷ CPU seconds of the busiest worker: what the N workers would answer per second "
        "with a CPU each. *split capacity/s*: the same if every connection carried the same rate of reviews (an "
        "open loop, like the API server's), so that each worker gets its share of the connections' reviews: "
        "1 ÷ the largest (share of connections × CPU seconds per review). *× N=1*: over the same share's N=1 row.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--config", help=argparse.SUPPRESS)
    p.add_argument("--log", help=argparse.SUPPRESS)
    p.add_argument("--fd", type=int, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--table-fd", type=int, help=argparse.SUPPRESS)
    p.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--workers", default="1,2")
    p.add_argument("--share", default="balanced,adopt,reuseport")
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
    result: dict[str, Any] = {
        "date": now.isoformat(timespec="seconds"),
        "machine": machine(),
        "connections": args.connections,
        "duration_s": args.duration,
        "rows": [],
    }
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
