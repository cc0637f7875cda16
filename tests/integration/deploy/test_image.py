"""
amp's image as users run it: built from this checkout (``make image``),
started with the chart's security settings (read-only root filesystem, the
chart's non-root uid, every capability dropped, no privilege escalation,
only the chart's memory emptyDir writable), its config and certificate
mounted from files laid out as the kubelet lays out the chart's projected
volume.  It must pass the chart's probes, answer an AdmissionReview through
the example endpoint (the same image, a second container in amp's network
namespace, as a sidecar would be), reload its certificate when the mounted
Secret is swapped as the kubelet swaps it, and stop within its drain time
on SIGTERM with exit status 0.  What is inside is checked too: the SBOM
lists exactly the locked packages, and there is no compiler, package cache,
test or bench code.

Everything the containers are started with comes from the chart's
Deployment (tests/support/imagerun.py); tests/integration/deploy/test_image_chart.py compares that
with the chart and with the image.  Without a container engine the tests
skip saying so (fail when ``CI=true``); ``make tools`` installs one.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Iterator

import pytest
from packaging.markers import Marker

from amp.config import parse_config
from tests.support.helpers import apply_patch, decode_answer, pod, review
from tests.support.imagerun import (
    NAMESPACE,
    ChartContainer,
    Pair,
    built_image,
    chart_container,
    chart_deployment,
    container_config,
    https_get,
    imagetool,
)
from tests.support.waiting import poll_until

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def spec() -> ChartContainer:
    return chart_container(chart_deployment())


@pytest.fixture(scope="module")
def image() -> str:
    return built_image()


@pytest.fixture(scope="module")
def pair(spec: ChartContainer, image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    running = Pair(
        spec, image, tmp_path_factory.mktemp("image"), container_config(spec, tls={"reload_interval": "500ms"})
    )
    try:
        running.start()
        yield running
    finally:
        running.remove()


# ---------------------------------------------------------------- as deployed


def test_runs_with_the_charts_security_settings(pair: Pair, spec: ChartContainer) -> None:
    """amp itself (the container's process 1, the chart's command) runs as
    the chart's uid and gid, with no capability at all and no_new_privs
    set; the root filesystem is read-only and only the chart's emptyDir is
    writable."""
    script = (
        "import os, sys\n"
        "status = dict(l.split(':\\t', 1) for l in open('/proc/1/status').read().splitlines() if ':\\t' in l)\n"
        "command = open('/proc/1/cmdline', 'rb').read().split(b'\\0')\n"
        "def writable(p):\n"
        "    try:\n"
        "        open(os.path.join(p, 'probe'), 'w').close(); os.remove(os.path.join(p, 'probe')); return True\n"
        "    except OSError:\n"
        "        return False\n"
        "print(' '.join(c.decode() for c in command if c).replace(' ', '|'), status['Uid'].split()[0],\n"
        "      status['Gid'].split()[0], status['CapEff'].strip(), status['CapBnd'].strip(),\n"
        "      status['NoNewPrivs'].strip(), *[writable(p) for p in sys.argv[1:]])\n"
    )
    paths = ["/", "/opt/amp", "/etc/amp", "/run", "/var/tmp", *[p for p, _ in spec.writable]]
    result = pair.amp.exec("python", "-c", script, *paths)
    assert result.returncode == 0, result.stderr
    command, uid, gid, effective, bounding, no_new_privs, *writable = result.stdout.split()
    assert command.split("|")[-len(spec.command) + 1 :] == list(spec.command[1:]), command
    assert (int(uid), int(gid)) == (spec.user, spec.group)
    assert int(effective, 16) == 0 and int(bounding, 16) == 0, "capabilities left"
    assert no_new_privs == "1"
    assert dict(zip(paths, writable)) == {p: str(p in dict(spec.writable)) for p in paths}


def test_probes_pass(pair: Pair, spec: ChartContainer) -> None:
    """The chart's liveness and readiness probes, on the chart's port, over TLS with the mounted certificate."""
    for probe in (spec.liveness, spec.readiness):
        port = pair.amp.host_port(probe.port)
        assert https_get(port, probe.path, pair.certs.context())[0] == 200


def test_the_charts_pre_stop_hook_runs_in_the_image(pair: Pair, spec: ChartContainer) -> None:
    """The kubelet runs the chart's preStop command inside the container
    before SIGTERM: the image has what it needs, as the chart's user on a
    read-only root."""
    result = pair.amp.exec(*spec.pre_stop)
    assert result.returncode == 0, result.stderr
    assert pair.amp.running()


def test_answers_a_review_through_the_example_endpoint(pair: Pair) -> None:
    """A Pod in the static namespace goes to the example endpoint (the
    second container) and comes back patched with what it adds."""
    status, body = _post_review(pair)
    assert status == 200, body
    response = decode_answer(body)["response"]
    assert response["allowed"] is True, response
    patched = apply_patch(pod(), response["_patch"])
    assert [c["name"] for c in patched["spec"]["initContainers"]] == ["new-init-container"]
    assert {"name": "AMP_USER", "value": "anonymous"} in patched["spec"]["containers"][0]["env"]
    assert patched["metadata"]["annotations"]["amp.txn2.com/status"].split()[0] == "mutated"


def _post_review(pair: Pair) -> tuple[int, bytes]:
    import http.client

    connection = http.client.HTTPSConnection(
        "127.0.0.1", pair.port("webhook"), timeout=15, context=pair.certs.context()
    )
    try:
        body = json.dumps(review(namespace=NAMESPACE)).encode()
        connection.request("POST", "/mutate?timeout=10s", body, {"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def _served_certificate(pair: Pair) -> bytes:
    context = pair.certs.context()
    with socket.create_connection(("127.0.0.1", pair.port("webhook")), timeout=3) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


def test_reloads_its_certificate_when_the_secret_is_swapped(pair: Pair) -> None:
    """The kubelet renames a new ``..data`` link over the old one; amp
    serves the new certificate without a restart, and still answers."""
    first, second = pair.certs.pairs
    assert _served_certificate(pair) == first[2]
    pair.volume.swap_sources(pair.sources(second[0], second[1]))
    poll_until(
        "amp to serve the swapped certificate",
        lambda: _served_certificate(pair) == second[2] or None,
        30.0,
        details=pair.amp.describe,
    )
    assert pair.amp.running()
    assert _post_review(pair)[0] == 200


def test_stops_within_its_drain_time_with_status_zero(spec: ChartContainer, image: str, tmp_path: Path) -> None:
    """SIGTERM (``<engine> stop`` sends the image's stop signal, as the
    kubelet does) stops amp well inside its drain time, exit status 0, and
    the log says the server shut down."""
    config = container_config(spec)
    drain = parse_config(config).listen.drain_timeout  # the chart's, or amp's default
    running = Pair(spec, image, tmp_path, config)
    try:
        running.start()
        status, seconds = running.amp.stop(spec.termination_grace)
        log = running.amp.logs()
        assert status == 0, running.amp.describe()
        assert seconds < drain, f"took {seconds:.1f} s, the drain time is {drain} s"
        assert "Server Shut Down." in log or "server shut down" in log.lower(), running.amp.describe()
    finally:
        running.remove()


def test_the_image_runs_what_the_chart_runs(image: str, spec: ChartContainer) -> None:
    """Started without the chart's overrides (``docker run amp``), the
    image runs the chart's command as the chart's user and exposes the
    chart's ports; its labels name the version and the git revision it
    was built from."""
    inspected = imagetool.inspect(image)
    config = inspected.get("Config") or {}
    assert config["User"] == f"{spec.user}:{spec.group}"
    assert list(config["Entrypoint"]) + list(config["Cmd"]) == list(spec.command)
    assert sorted(config["ExposedPorts"]) == sorted(f"{port}/tcp" for _, port in spec.ports)
    labels = config.get("Labels") or {}
    assert labels["org.opencontainers.image.version"] == imagetool.version()
    assert labels["org.opencontainers.image.revision"] == imagetool.revision()


# ---------------------------------------------------------------- what is inside


def test_sbom_lists_the_locked_packages(image: str) -> None:
    """The image's CycloneDX SBOM (cyclonedx-py, run on the image's own
    environment) lists every package of requirements/amp.lock that applies
    to the image's Python, at the locked version, plus amp itself, and
    nothing else (no pip, no build backend)."""
    document = imagetool.sbom(image)
    assert document["bomFormat"] == "CycloneDX"
    listed = imagetool.sbom_packages(document)
    python = _image_python(image)
    wanted = {
        name: version
        for name, version, marker in _locked_with_markers(ROOT / "requirements" / "amp.lock")
        if marker is None or Marker(marker).evaluate(python)
    }
    wanted["amp"] = imagetool.version()
    assert listed == wanted


def _image_python(image: str) -> dict[str, str]:
    """The marker environment of the image's interpreter."""
    import subprocess

    script = (
        "import json, platform, sys, os; print(json.dumps({'python_version': '%d.%d' % sys.version_info[:2], "
        "'python_full_version': platform.python_version(), 'implementation_name': sys.implementation.name, "
        "'platform_python_implementation': platform.python_implementation(), 'sys_platform': sys.platform, "
        "'platform_system': platform.system(), 'platform_machine': platform.machine(), 'os_name': os.name}))"
    )
    out = subprocess.run(
        [
            imagetool.engine(),
            "run",
            "--rm",
            "--network",
            "none",
            *imagetool.ulimits(),
            "--entrypoint",
            "python",
            image,
            "-c",
            script,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    return json.loads(out)


def _locked_with_markers(path: Path) -> list[tuple[str, str, str | None]]:
    import re

    out = []
    for line in path.read_text().splitlines():
        found = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)\s*(?:;\s*([^\\]+?))?\s*\\?$", line)
        if found:
            out.append((imagetool.normalise(found.group(1)), found.group(2), found.group(3)))
    return out


def test_nothing_inside_but_what_runs(image: str) -> None:
    """No compiler, no pip or apt cache or package lists, no pip at all in
    amp's environment, no build leftovers, no tests, benchmarks or
    examples; amp's plugin cache is there (a read-only root cannot write it)."""
    files = imagetool.filesystem(image)
    assert imagetool.forbidden(files) == {}
    assert not [p for p in files if p.startswith("/opt/amp/") and "/site-packages/pip/" in p]
    assert "/opt/amp/lib/python3.13/site-packages/twisted/plugins/dropin.cache" in files
