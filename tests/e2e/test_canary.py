"""Changing an endpoint safely, against a real kube-apiserver: a canary
beside the live sidecar injector, the recording of the same run, and
``amp replay`` on that recording.

The live endpoint is the example sidecar injector; the candidate is the
same injector with a newer sidecar image for Pods labelled ``track:
canary`` (``tests.support.candidates``), served from this process on loopback.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from ..support.candidates import CANDIDATE_IMAGE, candidate_reply
from ..support.waiting import poll_until
from .amp_process import (
    STATUS_ANNOTATION,
    AmpInstance,
    ExampleEndpoints,
    LoopbackServer,
    free_port,
    pod_manifest,
    unique,
)
from .cluster import ControlPlane
from .conftest import AmpFactory

pytestmark = pytest.mark.e2e

TRACKS = ["stable", "canary", "stable", "canary", "stable", "stable"]


class Candidate(LoopbackServer):
    def __init__(self) -> None:
        super().__init__("candidate")
        self.calls = 0

    def answer(self, path: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
        with self._lock:
            self.calls += 1
        return 200, json.dumps(candidate_reply(json.loads(body))).encode()


def stored(core: client.CoreV1Api, namespace: str, name: str) -> dict[str, Any]:
    """What amp's endpoint changes of a stored Pod (the service account
    token's volume, named at random by the API server, made comparable)."""
    pod = json.loads(core.read_namespaced_pod(name, namespace, _preload_content=False).data)
    spec = {
        "containers": pod["spec"]["containers"],
        "initContainers": pod["spec"].get("initContainers"),
        "volumes": pod["spec"].get("volumes"),
        "stamp": (pod["metadata"].get("annotations") or {}).get(STATUS_ANNOTATION),
    }
    return json.loads(re.sub(r"kube-api-access-[a-z0-9]+", "kube-api-access", json.dumps(spec)))


def replay(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", "from amp.cli import main; main()", "replay", *argv],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_canary_compares_a_candidate_on_live_traffic_and_replay_finds_the_same(
    start_amp: AmpFactory, example_endpoints: ExampleEndpoints, control_plane: ControlPlane, tmp_path: Path
) -> None:
    recordings = tmp_path / "recordings"
    metrics_port = free_port()
    with Candidate() as candidate:
        amp: AmpInstance = start_amp(
            "canary",
            overrides={
                "metrics": {"port": metrics_port, "interface": "127.0.0.1"},
                "record": {"enabled": True, "directory": str(recordings), "namespaces": ["annotated"]},
            },
        )
        live = example_endpoints.url("sidecar")
        ns = amp.namespace(
            unique("canary"),
            live,
            annotations={"amp.txn2.com/canary": candidate.url("sidecar"), "amp.txn2.com/record": "true"},
        )
        control = amp.namespace(unique("control"), live)
        core = client.CoreV1Api(control_plane.admin_client())
        for i, track in enumerate(TRACKS):
            for namespace in (ns, control):
                core.create_namespaced_pod(namespace, pod_manifest(f"web-{i}", labels={"track": track}))

        # Every live Pod is stored exactly as without the canary.
        for i, _ in enumerate(TRACKS):
            with_canary, without = stored(core, ns, f"web-{i}"), stored(core, control, f"web-{i}")
            assert with_canary == without
            assert CANDIDATE_IMAGE not in json.dumps(with_canary) and with_canary["stamp"].startswith("mutated ")

        def counted() -> Any:
            values = {
                r: amp.process.metric("amp_canary_reviews_total", namespace=ns, result=r) or 0
                for r in ("same", "differs", "failed", "skipped")
            }
            return values if sum(values.values()) >= len(TRACKS) else None

        counts = poll_until("the canary's comparisons", counted, 10.0)
        assert counts == {"same": TRACKS.count("stable"), "differs": TRACKS.count("canary"), "failed": 0, "skipped": 0}
        log = amp.process.log_text()
        differing = [line for line in log.splitlines() if "Canary " in line and " differs " in line]
        assert sorted(line.split("Pod ")[1].split(" ")[0] for line in differing) == sorted(
            f"{ns}/web-{i}" for i, t in enumerate(TRACKS) if t == "canary"
        )
        assert all(line.endswith(": /spec/containers/1/image") for line in differing), differing

        # The recording of that run, replayed.
        def recorded() -> Any:
            files = sorted(recordings.glob("amp-reviews-*.jsonl"))
            lines = sum(len(f.read_bytes().splitlines()) for f in files)
            return files if lines >= len(TRACKS) else None

        files = [str(f) for f in poll_until("the recording", recorded, 10.0)]
        config = tmp_path / "replay.yaml"
        config.write_text('endpoints:\n  allow: ["http://127.0.0.1:*/*"]\nkubernetes:\n  source: static\n')
        against = replay(*files, "--config", str(config), "--against", candidate.url("sidecar"))
        assert against.returncode == 1, against.stdout + against.stderr
        assert against.stdout.splitlines()[-1].endswith(
            f"{TRACKS.count('stable')} same, {TRACKS.count('canary')} different, 0 failed, 0 unreadable"
        )
        for i, track in enumerate(TRACKS):
            assert (f"different  {ns}/web-{i} " in against.stdout) == (track == "canary")
        assert f'/spec/containers/1/image: "envoyproxy/envoy:v1.27.0" -> "{CANDIDATE_IMAGE}"' in against.stdout
        same = replay(*files, "--config", str(config), "--against", live)
        assert same.returncode == 0, same.stdout + same.stderr
        recorded_answers = replay(*files, "--config", str(config))
        assert recorded_answers.returncode == 0, recorded_answers.stdout + recorded_answers.stderr
