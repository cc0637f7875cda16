#!/usr/bin/env python3
"""
Instructions per review of the whole amp process beside the floor's, the
load-independent form of C{bench/run}'s "amp CPU ÷ floor (f)".

Each proxy, amp (C{twistd -n amp}, the benchmark's configuration with
static namespaces) and the floor (L{bench.floor}), runs under
C{valgrind --tool=callgrind} with the benchmark's endpoint
(L{bench.endpoint}), and is driven over TLS keep-alive connections by
L{bench.closed_loop}: the connections are opened and warmed up, the
counters zeroed (C{callgrind_control -z}), then every connection sends a
fixed number of reviews and the counters are dumped.  Everything the
process runs is counted: the TLS record layer, the reactor, the HTTP on
both sides, amp's review.  A busy machine changes none of it, which makes
it the figure for comparing versions when the CPU time of C{bench/run}
drifts (on a shared virtual machine it does, by tens of percent).

Instructions are not time: cache misses and the kernel are not in them,
and a review of amp's, more Python over more memory than the floor's,
runs fewer instructions per cycle (measured here: amp's CPU ratio
C{bench/run} reports is above this one).  Use both.

With C{--fresh}, every review goes on a new TLS connection (handshake,
one review, the client closes), as in a Pod storm where kube-apiserver
opens a connection per call in flight: the figure then holds amp's and the
floor's per-connection cost too.

Run: C{python -m bench.process_instructions [--reviews N] [--body typical] [--fresh]};
needs valgrind.  Prints one JSON object.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Any

from bench import bodies
from bench.harness import OFF, ON, Amp, Proc, say

_SUMMARY = re.compile(r"^summary: (\d+)", re.M)
#: Connections of the closed-loop client, as C{bench/run}'s rows.
CONNECTIONS = 16


def measure(
    which: str,
    body: str,
    reviews: int,
    workdir: str,
    tls: dict[str, str],
    body_files: dict[str, str],
    endpoint_url: str,
    fresh: bool = False,
) -> dict[str, Any]:
    """Instructions per review of one proxy (C{amp} or C{floor}) for C{body}."""
    out = os.path.join(workdir, f"callgrind.{which}.{body}")
    valgrind = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
    py = sys.executable
    proc: Proc | Amp
    if which == "floor":
        proc = Proc(
            "floor",
            valgrind
            + [py, "-m", "bench.floor", "--cert", tls["cert"], "--key", tls["key"], "--endpoint", endpoint_url],
        )
        port = proc.first_line()["port"]
    else:
        proc = Amp(
            f"amp-{body}",
            workdir,
            tls,
            endpoint_url=endpoint_url,
            source="static",
            kubeconfig=None,
            per_review_get=False,
            cpus=None,
            prefix=tuple(valgrind),
        )
        proc.wait_ready(timeout=600)
        port = proc.port
    client = subprocess.Popen(
        [py, "-m", "bench.closed_loop", str(port), body_files[f"{body}-on"], str(CONNECTIONS), tls["ca_cert"]]
        + (["fresh"] if fresh else []),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert client.stdin is not None and client.stdout is not None
    try:
        client.stdin.write("3\n")
        client.stdin.flush()
        json.loads(client.stdout.readline())
        subprocess.run(["callgrind_control", "-z", str(proc.pid)], capture_output=True, check=True)
        client.stdin.write(f"{reviews}\n")
        client.stdin.flush()
        answered, unpatched = json.loads(client.stdout.readline())
        subprocess.run(["callgrind_control", "-d", str(proc.pid)], capture_output=True, check=True)
        client.stdin.write("\n")
        client.stdin.flush()
        client.wait(timeout=60)
    finally:
        if client.poll() is None:
            client.kill()
        proc.stop(timeout=60)
    if unpatched:
        raise SystemExit(f"{which}: {unpatched} of {answered} answers had no patch")
    dumps = sorted(glob.glob(out + ".*"))
    if not dumps:
        raise SystemExit(f"{which}: callgrind wrote no dump")
    with open(dumps[0]) as f:
        match = _SUMMARY.search(f.read())
    if match is None:
        raise SystemExit(f"{which}: no summary in {dumps[0]}")
    return {"reviews": answered, "instructions_per_review": round(int(match.group(1)) / answered)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--reviews",
        type=int,
        default=15,
        help=f"reviews per connection in the counted round ({CONNECTIONS} connections; default 15)",
    )
    parser.add_argument("--body", choices=bodies.BODIES, action="append", help="the bodies (default both)")
    parser.add_argument(
        "--fresh", action="store_true", help="a new TLS connection per review, closed by the client after its answer"
    )
    args = parser.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("bench.process_instructions needs valgrind (callgrind and callgrind_control)")
    from amp_dev.devcert import write_dev_tls

    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="amp-process-instructions-") as workdir:
        tls = {k: str(v) for k, v in write_dev_tls(os.path.join(workdir, "tls")).items()}
        body_files = bodies.write_bodies(os.path.join(workdir, "bodies"), {"on": ON, "off": OFF})
        endpoint = Proc("endpoint", [sys.executable, "-m", "bench.endpoint"])
        try:
            endpoint_url = f"http://127.0.0.1:{endpoint.first_line()['port']}/patch"
            for body in args.body or bodies.BODIES:
                figures = {
                    which: measure(which, body, args.reviews, workdir, tls, body_files, endpoint_url, args.fresh)
                    for which in ("floor", "amp")
                }
                figures["amp_vs_floor"] = round(
                    figures["amp"]["instructions_per_review"] / figures["floor"]["instructions_per_review"], 2
                )
                say(
                    f"{body}: amp {figures['amp']['instructions_per_review']}, floor "
                    f"{figures['floor']['instructions_per_review']} instructions per review: "
                    f"{figures['amp_vs_floor']}x"
                )
                result[body] = figures
        finally:
            endpoint.stop()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
