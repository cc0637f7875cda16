"""pytest wiring for the end-to-end tests: the ``e2e`` marker and the
session-wide ``control_plane`` fixture (a real etcd + kube-apiserver).

Without Go (and without cached binaries) the e2e tests are skipped on a
developer machine and fail when ``CI=true``.
"""

from __future__ import annotations

import os
from typing import Iterator

import pytest

from . import build
from .cluster import ControlPlane


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "e2e: end-to-end test against a real kube-apiserver and etcd built from source",
    )


def require_binaries() -> build.Binaries:
    """The built binaries; skips or fails the calling test when Go is missing."""
    outcome = build.go_missing_outcome(
        os.environ, build.find_go(), build.binaries_present()
    )
    if outcome is not None:
        action, reason = outcome
        if action == "fail":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    try:
        return build.build()
    except build.BuildError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def e2e_binaries() -> build.Binaries:
    """kube-apiserver and etcd, built once (or found in the cache)."""
    return require_binaries()


@pytest.fixture(scope="session")
def control_plane(
    e2e_binaries: build.Binaries, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    """One running control plane shared by the whole test session.

    Tests share it, so each test works in namespaces of its own
    (``control_plane.create_namespace(...)``) and removes cluster-scoped
    objects it creates (e.g. MutatingWebhookConfigurations).
    """
    plane = ControlPlane(tmp_path_factory.mktemp("control-plane"), e2e_binaries)
    plane.start()
    try:
        yield plane
    finally:
        plane.stop()
