"""
The local demo (C{make demo}, or C{python -m amp_dev.demo}): writes a dev
certificate, starts C{twistd amp-example} and C{twistd amp} with
C{etc/amp.yaml} (static namespaces, no cluster needed), sends a sample
AdmissionReview for each demo namespace and prints the decoded answer, then
keeps both running until interrupted (C{--once} stops after the samples).

This is a command-line program, not library code: it blocks, and that is
fine here.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Optional

from amp_dev.devcert import write_dev_tls

SAMPLE = Path("etc/reviews/pod-create.json")
NAMESPACES = ["team-a", "registry-mirror", "mesh", "kubeflow", "filers", "flaky", "strict", "opted-out"]


def _wait(url: str, context: Optional[ssl.SSLContext], deadline: float, procs: list) -> None:
    while True:
        for p in procs:
            if p.poll() is not None:
                raise SystemExit(f"demo: {' '.join(p.args)} exited with {p.returncode}; see its output above")
        try:
            with urllib.request.urlopen(url, context=context, timeout=1) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"demo: {url} did not become ready")
        time.sleep(0.1)


def review(url: str, body: bytes, context: ssl.SSLContext) -> dict[str, Any]:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, context=context, timeout=15) as r:
        return json.loads(r.read())


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--once", action="store_true", help="stop after sending the samples")
    parser.add_argument("--config", default="etc/amp.yaml")
    args = parser.parse_args(argv)
    paths = write_dev_tls("dev-tls", keep=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")])))
    twistd = [sys.executable, "-c", "from twisted.scripts.twistd import run; run()"]
    procs = [
        subprocess.Popen(twistd + ["-n", "--pidfile=", "amp-example"], env=env),
        subprocess.Popen(twistd + ["-n", "--pidfile=", "amp", "--config", args.config], env=env),
    ]
    try:
        context = ssl.create_default_context(cafile=str(paths["ca_cert"]))
        deadline = time.monotonic() + 30
        _wait("http://127.0.0.1:8090/healthz", None, deadline, procs)
        _wait("https://127.0.0.1:8443/readyz", context, deadline, procs)
        template = SAMPLE.read_text()
        print("\namp is up on https://127.0.0.1:8443 (metrics on http://127.0.0.1:9090/metrics).\n")
        for ns in NAMESPACES:
            body = template.replace('"team-a"', json.dumps(ns)).encode()
            answer = review("https://127.0.0.1:8443/mutate?timeout=10s", body, context)["response"]
            patch = answer.pop("patch", None)
            print(f"--- namespace {ns}: {json.dumps(answer)}")
            if patch:
                for op in json.loads(base64.b64decode(patch)):
                    print(f"    {json.dumps(op)[:150]}")
        print("\nTry it yourself:\n  curl --cacert dev-tls/ca.crt -H 'Content-Type: application/json' "
              "--data @etc/reviews/pod-create.json 'https://127.0.0.1:8443/mutate?timeout=10s'\n")
        if args.once:
            return 0
        print("Press Ctrl-C to stop.")
        while all(p.poll() is None for p in procs):
            time.sleep(0.5)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


if __name__ == "__main__":
    sys.exit(main())
