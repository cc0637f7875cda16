"""
The soak's Kubernetes API: the fake API server of the tests
(L{tests.support.fake_apiserver.FakeKube}) in a process of its own, with a small HTTP
control port through which the driver injects watch faults.

Run by the driver as C{python -m bench.soak.fakeapi PLAN.json}; it prints
C{{"url": ..., "control": PORT}} on one line once serving, and runs until
SIGTERM.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from typing import Any

from bench.fakeapi import kubeconfig_text
from tests.support.fake_apiserver import FakeKube


def serve(plan_path: str) -> int:
    """
    The fake Kubernetes API in this process, with a control port:
    C{POST /drop} cuts the watches (amp resumes from its resourceVersion),
    C{POST /expire} makes amp's resourceVersion too old and cuts the
    watches (amp gets 410 Gone and relists), C{POST /touch} changes a
    namespace (an event for amp), C{GET /stats} says what happened.  Every
    drop and expiry also replaces a C{soak-churn-N} namespace, so that amp's
    cache has something to catch up on.
    """
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    with open(plan_path) as f:
        plan = json.load(f)
    kube = FakeKube()
    for ns in plan["namespaces"]:
        kube.add_namespace(ns["name"], labels=ns["labels"], annotations=ns["annotations"])
    for i in range(plan["filler"]):
        kube.add_namespace(f"filler-{i:03d}", labels={"team": f"team-{i % 7}"})
    kube.start()
    with open(plan["kubeconfig"], "w") as f:
        f.write(kubeconfig_text(kube.url))
    lock = threading.Lock()
    state = {"drops": 0, "expiries": 0, "touches": 0, "streams_cut": 0, "churn": 0}

    def churn() -> None:
        n = state["churn"] = state["churn"] + 1
        kube.add_namespace(f"soak-churn-{n}", labels={"team": "churn"})
        if n > 1:
            kube.delete_namespace(f"soak-churn-{n - 1}")

    def drop() -> dict[str, Any]:
        cut = kube.drop_watches()
        churn()  # while amp reconnects: replayed when it resumes
        state["drops"] += 1
        state["streams_cut"] += cut
        return {"cut": cut}

    def expire() -> dict[str, Any]:
        # A change amp's namespace watch does not see moves the revision on,
        # then history is forgotten: amp's last resourceVersion is now too
        # old, and its next watch gets 410 Gone.
        kube.put_webhook_configuration("soak-bump", webhooks=[])
        kube.expire_history()
        cut = kube.drop_watches()
        churn()
        state["expiries"] += 1
        state["streams_cut"] += cut
        return {"cut": cut}

    def touch() -> dict[str, Any]:
        state["touches"] += 1
        kube.update_namespace("filler-000", labels={"team": "team-0", "touched": str(state["touches"])})
        return {}

    actions = {"/drop": drop, "/expire": expire, "/touch": touch}

    class Control(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _json(self, code: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:
            action = actions.get(self.path)
            if action is None:
                self._json(404, {"error": f"no action {self.path}"})
                return
            with lock:
                self._json(200, action())

        def do_GET(self) -> None:
            with lock:
                self._json(
                    200,
                    dict(
                        state,
                        served=kube.served,
                        errors=kube.errors[:5],
                        lists=kube.count("/api/v1/namespaces", watch=False, method="GET"),
                        watches=kube.count("/api/v1/namespaces", watch=True),
                        open_watches=kube.open_watches(),
                        resource_version=kube.resource_version,
                    ),
                )

    control = ThreadingHTTPServer(("127.0.0.1", 0), Control)
    control.daemon_threads = True
    threading.Thread(target=control.serve_forever, daemon=True).start()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    print(json.dumps({"url": kube.url, "control": control.server_address[1]}), flush=True)
    stop.wait()
    control.shutdown()
    errors = kube.errors
    kube.stop()
    print(json.dumps({"errors": errors[:5]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(serve(sys.argv[1]))
