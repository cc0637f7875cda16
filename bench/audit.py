#!/usr/bin/env python3
"""
What an audit of a large fleet costs: C{amp audit}'s whole run (paged
lists, owner chains, each template through amp's pipeline, every Pod
compared) against an API server in memory and the example sidecar
injector on a loopback socket.

The fleet: C{--pods} Pods in Deployments of C{--per-workload} Pods each
(a ReplicaSet between them, as the controllers make them), across two
namespaces; the Pods carry the API server's defaults, the service account
volume and a label of another admission plugin, and every other
Deployment's Pods still have the sidecar's previous image.  Reported: the
wall time, the endpoint calls (one per template, whatever the Pod count),
the Pods in each state, the list requests, and the peak resident memory
of this process.  Nothing is asserted but that the run found what the
fleet holds (C{--quick}: a small fleet, for the test suite).

Usage: C{python -m bench.audit [--pods 1000] [--per-workload 20] [--page-size 500] [--rate 10]
[--concurrency 4] [--quick]}
"""

from __future__ import annotations

import argparse
import copy
import io
import json
import resource
import sys
import tempfile
import time
from typing import Any, Optional
from urllib.parse import parse_qs

import yaml
from twisted.internet.defer import inlineCallbacks

OLD = "envoyproxy/envoy:v1.27.0"
NEW = "envoyproxy/envoy:v1.28.0"


class MemoryAPI:
    """The lists of an API server in memory, served in pages (C{limit}, C{continue})."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], list[dict[str, Any]]] = {}
        self.requests = 0

    def add(self, resource_: str, namespace: str, obj: dict[str, Any]) -> None:
        self.objects.setdefault((resource_, namespace), []).append(obj)

    def get(self, path: str, query: list[tuple[str, str]]) -> bytes:
        self.requests += 1
        q = parse_qs("&".join(f"{k}={v}" for k, v in query))
        parts = path.strip("/").split("/")
        key = ("namespaces", "") if path == "/api/v1/namespaces" else (parts[-1], parts[parts.index("namespaces") + 1])
        items = self.objects.get(key, [])
        limit, start = int(q["limit"][0]), int(q.get("continue", ["0"])[0])
        more = start + limit < len(items)
        return json.dumps(
            {"items": items[start : start + limit], "metadata": {"continue": str(start + limit) if more else ""}}
        ).encode()


def stored_pod(template: dict[str, Any], name: str, rs: str, image: str, endpoint: str) -> dict[str, Any]:
    """A Pod as the API server stores it after amp injected the sidecar of C{image}."""
    pod = copy.deepcopy(template)
    meta = pod["metadata"]
    meta.update(
        name=name,
        uid=f"uid-{name}",
        annotations={"amp.txn2.com/status": f"mutated {endpoint}"},
        ownerReferences=[{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": rs, "uid": "u", "controller": True}],
    )
    meta["labels"] = {**meta["labels"], "pod-template-hash": "7c9d8", "policy.example/added": "yes"}
    spec = pod["spec"]
    mount = {"name": "amp-shared", "mountPath": "/var/run/amp"}
    for c in spec["containers"]:
        c.update(
            imagePullPolicy="IfNotPresent",
            terminationMessagePath="/dev/termination-log",
            volumeMounts=[{"name": "kube-api-access-x", "mountPath": "/var/run/secrets"}, mount],
        )
    spec["volumes"] = [
        {"name": "kube-api-access-x", "projected": {"sources": []}},
        {"name": "amp-shared", "emptyDir": {}},
    ]
    spec["initContainers"] = [
        {
            "name": "amp-proxy-init",
            "image": "alpine:3.12.0",
            "command": ["sh", "-c", 'echo "proxying ports: $APP_PORTS"'],
            "env": [{"name": "APP_PORTS", "value": "8080"}],
        }
    ]
    spec["containers"].append({"name": "amp-proxy", "image": image, "volumeMounts": [dict(mount)]})
    pod["status"] = {"phase": "Running"}
    return pod


def fleet(pods: int, per_workload: int, endpoint: str) -> MemoryAPI:
    api = MemoryAPI()
    namespaces = ("team-a", "team-b")
    for ns in namespaces:
        api.add(
            "namespaces",
            "",
            {
                "metadata": {
                    "name": ns,
                    "labels": {"amp.txn2.com/enabled": "true"},
                    "annotations": {"amp.txn2.com/ep": endpoint},
                }
            },
        )
    workloads = max(1, pods // per_workload)
    made = 0
    for w in range(workloads):
        ns = namespaces[w % len(namespaces)]
        name = f"app{w}"
        template = {
            "metadata": {"labels": {"app": name}},
            "spec": {
                "containers": [
                    {"name": name, "image": f"registry.example/{name}:1", "ports": [{"containerPort": 8080}]}
                ]
            },
        }
        api.add(
            "deployments",
            ns,
            {
                "metadata": {"name": name, "namespace": ns},
                "spec": {"selector": {"matchLabels": {"app": name}}, "template": template},
            },
        )
        rs = f"{name}-7c9d8"
        api.add(
            "replicasets",
            ns,
            {
                "metadata": {
                    "name": rs,
                    "namespace": ns,
                    "ownerReferences": [
                        {"apiVersion": "apps/v1", "kind": "Deployment", "name": name, "controller": True}
                    ],
                }
            },
        )
        count = per_workload if w < workloads - 1 else pods - made
        for i in range(count):
            api.add("pods", ns, stored_pod(template, f"{rs}-{i}", rs, OLD if w % 2 else NEW, endpoint))
        made += count
    return api


@inlineCallbacks
def measure(reactor: Any, pods: int, per_workload: int, page_size: int, rate: int, concurrency: int) -> Any:
    from amp.cli.audit import run
    from amp.cli.audit_cluster import PagedLists
    from amp_examples import server, serving

    options = server.Options()
    options.parseOptions(["--sidecar-image", NEW])
    listening = reactor.listenTCP(
        0, serving.build_site(serving.build_root(server.handlers(options), serving.MAX_BODY)), interface="127.0.0.1"
    )
    endpoint = f"http://127.0.0.1:{listening.getHost().port}/sidecar"
    api = fleet(pods, per_workload, endpoint)
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(
            {
                "kubernetes": {"source": "kubeconfig", "kubeconfig": "/unused"},
                "endpoints": {"allow": ["http://127.0.0.1:*/*"]},
                "failure_policy": "Ignore",
            },
            f,
        )
    out = io.StringIO()
    started = time.perf_counter()
    status = yield run(
        [
            "--config",
            f.name,
            "-o",
            "json",
            "--page-size",
            str(page_size),
            "--rate",
            str(rate),
            "--concurrency",
            str(concurrency),
        ],
        reactor,
        stdout=out,
        stderr=io.StringIO(),
        lists=PagedLists(api.get, page_size, reactor),
    )
    seconds = time.perf_counter() - started
    yield listening.stopListening()
    report = json.loads(out.getvalue())
    return {
        "pods": pods,
        "rate": rate,
        "concurrency": concurrency,
        "workloads": len(report["workloads"]),
        "seconds": round(seconds, 3),
        "endpoint_calls": report["endpoint_calls"],
        "states": {k: v for k, v in report["totals"].items() if v},
        "list_requests": api.requests,
        "exit_status": status,
        "max_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def main(argv: Optional[list[str]] = None) -> dict[str, Any]:
    from twisted.internet.task import react

    p = argparse.ArgumentParser(prog="python -m bench.audit", description=__doc__.split("\n\n")[0])
    p.add_argument("--pods", type=int, default=1000)
    p.add_argument("--per-workload", type=int, default=20)
    p.add_argument("--page-size", type=int, default=500)
    p.add_argument("--rate", type=int, default=10, help="templates a second (amp's default: 10)")
    p.add_argument("--concurrency", type=int, default=4, help="templates at once (amp's default: 4)")
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    if args.quick:
        args.pods, args.per_workload = 40, 10
    found: dict[str, Any] = {}

    def go(r: Any) -> Any:
        return measure(r, args.pods, args.per_workload, args.page_size, args.rate, args.concurrency).addCallback(
            found.update
        )

    try:
        react(go)
    except SystemExit as e:
        if e.code:
            raise
    print(json.dumps(found, indent=2))
    return found


if __name__ == "__main__":
    main(sys.argv[1:])
