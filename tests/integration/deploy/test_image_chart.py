"""
The chart and the container tests agree: the container tests
(tests/integration/deploy/test_image.py, tests/e2e/test_image.py) start amp's image with what
L{tests.support.imagerun.chart_container} reads from the chart's Deployment, and
these tests show that it reads the chart itself (``helm template`` of
deploy/chart/amp) and that the flags follow it.  The image's own defaults
(user, ports, command) are compared with the chart in tests/integration/deploy/test_image.py,
which has the image.
"""

from __future__ import annotations

import copy

import yaml

from tests.support.deploytools import helm_template, one
from tests.support.imagerun import ROOT, chart_container, chart_deployment, run_flags


def test_the_container_tests_run_what_the_chart_renders() -> None:
    """securityContext, probes, ports, mounted paths, user and command of
    the chart's Deployment, rendered by helm with the default values, are
    the ones the container tests start amp with."""
    rendered = chart_container(one(helm_template(), "Deployment"))
    used = chart_container(chart_deployment())
    assert rendered == used
    # What the chart says, spelled out once here so that a change is seen.
    assert (used.user, used.group, used.fs_group) == (65532, 65532, 65532)
    assert used.read_only_root and not used.allow_privilege_escalation and used.capabilities_dropped == ("ALL",)
    assert dict(used.ports) == {"webhook": 8443, "metrics": 9090}
    assert (used.readiness.path, used.liveness.path) == ("/readyz", "/healthz")
    assert used.config_mount == "/etc/amp" and used.config_read_only
    assert dict(used.writable) == {"/tmp": "16Mi"}
    assert used.pre_stop[0] == "python", "the image has python on PATH, not necessarily a sleep binary"


def test_the_charts_config_names_the_mounted_files_and_ports() -> None:
    """amp.yaml as the chart ships it reads the certificate and key where
    the projected volume puts them, and listens on the container's ports."""
    spec = chart_container(chart_deployment())
    config = yaml.safe_load((ROOT / "deploy" / "base" / "amp.yaml").read_text())
    items = {key: f"{spec.config_mount}/{path}" for path, key in spec.config_items}
    assert spec.config_file == items["configMap:amp.yaml"]
    assert (config["tls"]["cert"], config["tls"]["key"]) == (items["secret:tls.crt"], items["secret:tls.key"])
    assert (config["listen"]["port"], config["metrics"]["port"]) == (spec.port("webhook"), spec.port("metrics"))
    assert config["listen"]["interface"] == "0.0.0.0", "published ports reach the container's interface"


def test_the_flags_follow_the_chart() -> None:
    """A Deployment that asked for less isolation would be run with less:
    the flags are derived, not written down twice."""
    deployment = chart_deployment()
    flags = run_flags(chart_container(deployment))
    for expected in (
        ["--user", "65532:65532"],
        ["--read-only", "--read-only-tmpfs=false"],
        ["--cap-drop", "ALL"],
        ["--security-opt", "no-new-privileges"],
    ):
        assert any(flags[i : i + len(expected)] == expected for i in range(len(flags))), expected
    loose = copy.deepcopy(deployment)
    [container] = loose["spec"]["template"]["spec"]["containers"]
    container["securityContext"].update(readOnlyRootFilesystem=False, allowPrivilegeEscalation=True)
    container["securityContext"]["capabilities"]["drop"] = ["NET_RAW"]
    loose_flags = run_flags(chart_container(loose))
    assert "--read-only" not in loose_flags and "no-new-privileges" not in loose_flags
    assert "ALL" not in loose_flags and "NET_RAW" in loose_flags
