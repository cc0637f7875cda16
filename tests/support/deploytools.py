"""
The deployment tools for tests: helm, kustomize and promtool from the cache
that C{tools/install-deploy-tools} (C{make tools}) fills, and what the tests
do with them: render the chart, build a kustomization.

A test never installs a tool: a missing one fails the test with the command
that installs it.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any, Iterable

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CHART = DEPLOY / "chart" / "amp"
RELEASE = "amp"
NAMESPACE = "amp-system"
#: The Kubernetes version the manifests are rendered and validated for (the
#: end-to-end tests run kube-apiserver 1.37).
KUBE_VERSION = "1.37.0"

#: Metrics the alerting rules use that the API server exports, not amp
#: (tests/e2e/test_chart.py finds them on a real kube-apiserver).
APISERVER_METRICS = ("apiserver_admission_webhook_fail_open_count", "apiserver_admission_webhook_request_total")


def tools_bin() -> Path:
    root = os.environ.get("AMP_TOOLS") or os.path.join(os.path.expanduser("~"), ".cache", "amp-tools")
    return Path(root) / "bin"


def tool(name: str) -> str:
    """The path of a cached tool; fails the test (never skips) when it is missing."""
    path = tools_bin() / name
    if not os.access(path, os.X_OK):
        pytest.fail(
            f"{name} is not installed in {path.parent}: run `make tools` (tools/install-deploy-tools {name})",
            pytrace=False,
        )
    return str(path)


def run(args: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """Run a tool; a non-zero exit fails the test with its output."""
    result = subprocess.run(args, capture_output=True, text=True, timeout=120, **kwargs)
    if result.returncode != 0:
        pytest.fail(f"{' '.join(args)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}", pytrace=False)
    return result


def documents(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def helm_template(
    *args: str, chart: Path = CHART, namespace: str = NAMESPACE, release: str = RELEASE
) -> list[dict[str, Any]]:
    """The objects C{helm template} renders from the chart with C{args}."""
    return documents(
        run(
            [
                tool("helm"),
                "template",
                release,
                str(chart),
                "--namespace",
                namespace,
                "--kube-version",
                KUBE_VERSION,
                *args,
            ]
        ).stdout
    )


def kustomize_build(directory: Path) -> list[dict[str, Any]]:
    """The objects C{kubectl apply -k directory} would send."""
    return documents(run([tool("kustomize"), "build", str(directory)]).stdout)


def by_kind(objects: Iterable[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: Iterable[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(objects, kind)
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]
