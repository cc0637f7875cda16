#!/usr/bin/env python3
"""
The benchmark's Kubernetes API: the fake API server of the test suite
(C{tests/support/fake_apiserver.py}) in a process of its own, with the benchmark's
namespaces created before amp starts, and a kubeconfig that points at it.

Run::

    python bench/fakeapi.py --kubeconfig FILE \\
        --enabled bench-on=http://127.0.0.1:PORT/patch --disabled bench-off --filler 200

It listens on a free port on 127.0.0.1, writes the kubeconfig, prints
C{{"port": N, "url": ...}} on one line to stdout, and serves until
SIGTERM/SIGINT; then it prints C{{"requests": N, "errors": [...]}} (requests
served, and any exception the fake server hit) and exits.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading

from tests.support.fake_apiserver import FakeKube

ENABLED_LABEL = "amp.txn2.com/enabled"
ENDPOINT_ANNOTATION = "amp.txn2.com/ep"


def kubeconfig_text(url: str) -> str:
    """
    A kubeconfig for a plain-HTTP API server at C{url} with a dummy token.
    """
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "bench", "cluster": {"server": url}}],
            "users": [{"name": "bench", "user": {"token": "bench-token"}}],
            "contexts": [{"name": "bench", "context": {"cluster": "bench", "user": "bench"}}],
            "current-context": "bench",
        },
        indent=2,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kubeconfig", required=True, help="where to write the kubeconfig")
    parser.add_argument(
        "--enabled",
        action="append",
        default=[],
        metavar="NAME=URL",
        help="an amp-enabled namespace and its endpoint URL",
    )
    parser.add_argument(
        "--disabled", action="append", default=[], metavar="NAME", help="a namespace without amp's label"
    )
    parser.add_argument(
        "--filler", type=int, default=0, help="this many other namespaces, so the cache is not trivially small"
    )
    args = parser.parse_args(argv)

    kube = FakeKube(request_log_limit=1000)
    for i in range(args.filler):
        labels = {"team": f"team-{i % 17}"}
        if i % 3 == 0:
            labels[ENABLED_LABEL] = "true"
        kube.add_namespace(
            f"filler-{i:04d}",
            labels=labels,
            annotations={ENDPOINT_ANNOTATION: f"http://127.0.0.1:1/filler-{i}"} if i % 3 == 0 else {},
        )
    for spec in args.enabled:
        name, _, url = spec.partition("=")
        kube.add_namespace(name, labels={ENABLED_LABEL: "true"}, annotations={ENDPOINT_ANNOTATION: url})
    for name in args.disabled:
        kube.add_namespace(name, labels={"team": "other"})
    kube.start()
    with open(args.kubeconfig, "w") as f:
        f.write(kubeconfig_text(kube.url))

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    print(json.dumps({"port": kube.port, "url": kube.url}), flush=True)
    stop.wait()
    served, errors = kube.served, kube.errors
    kube.stop()
    print(json.dumps({"requests": served, "errors": errors[:20]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
