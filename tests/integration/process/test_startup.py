"""
Tests for amp.startup and amp.ports: a taken port, an unreadable
certificate and a kubeconfig that cannot be loaded stop C{twistd amp} with
one line naming the config key (and, for a port, the process holding it)
and exit status 1, before anything listens.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
import yaml
from twisted.internet.task import Clock

from amp.config import KubernetesConfig
from amp.ports import listen_problem, port_holder
from amp.startup import certificate_key, kubernetes_problem, port_problem
from amp.tls import CertificateError, ReloadingCertificate
from tests.support.helpers import dev_tls, make_config, raw_config
from tests.support.ports import free_port, free_ports

REPO = Path(__file__).resolve().parents[3]
TWISTD = Path(sys.executable).with_name("twistd")


@pytest.fixture
def taken() -> Iterator[int]:
    """A loopback port this process listens on."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield listener.getsockname()[1]


def test_a_taken_port_names_this_process(taken: int) -> None:
    holder = port_holder(taken)
    assert holder.startswith(f"pid {os.getpid()} (")
    assert "\n" not in holder


def test_a_free_port_and_port_zero_have_no_problem() -> None:
    assert listen_problem("127.0.0.1", free_port()) is None
    assert listen_problem("127.0.0.1", 0) is None


def test_an_address_not_on_this_host_is_named() -> None:
    problem = listen_problem("192.0.2.1", free_port(), "webhook")
    assert problem is not None and problem.startswith("cannot listen on 192.0.2.1:")
    assert "(webhook): " in problem


def test_the_webhook_port_is_named_by_its_key(taken: int) -> None:
    config = make_config(listen={"port": taken})
    assert port_problem(config) == f"listen.port: port {taken} (webhook) is in use by {port_holder(taken)}"


def test_each_workers_metrics_port_is_checked_by_worker_zero() -> None:
    # A pair below the ephemeral range: worker 0's port stays free while
    # worker 1's is held here (next to a port-0 listener, the port below may
    # be any other test's).
    webhook, base = free_ports()
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", base + 1))
        listener.listen()
        config = make_config(workers=2, listen={"port": webhook}, metrics={"port": base, "interface": "127.0.0.1"})
        problem = port_problem(config)
        assert problem is not None
        assert problem.startswith(f"metrics.port: port {base + 1} (metrics of worker 1) is in use by pid {os.getpid()}")
        # A worker above 0 inherits the webhook socket and checks only its own metrics port.
        assert port_problem(config, worker=1) is not None
        assert (
            port_problem(
                make_config(
                    workers=2, listen={"port": base + 1}, metrics={"port": free_ports()[1], "interface": "127.0.0.1"}
                ),
                worker=1,
            )
            is None
        )


def test_free_ports_have_no_problem() -> None:
    webhook, metrics = free_ports()
    assert (
        port_problem(make_config(listen={"port": webhook}, metrics={"port": metrics, "interface": "127.0.0.1"})) is None
    )


@pytest.mark.parametrize("which, key", [("cert", "tls.cert"), ("key", "tls.key"), ("client_ca", "tls.client_ca")])
def test_a_certificate_problem_is_named_by_its_key(tmp_path: Path, which: str, key: str) -> None:
    files = {"cert": str(dev_tls()["cert"]), "key": str(dev_tls()["key"]), "client_ca": str(dev_tls()["cert"])}
    files[which] = str(tmp_path / "gone.pem")
    cert = ReloadingCertificate(files["cert"], files["key"], client_ca=files["client_ca"], clock=Clock())
    with pytest.raises(CertificateError) as e:
        cert.load()
    assert certificate_key(str(e.value)) == key


def test_a_kubeconfig_that_is_not_yaml_is_one_line(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("clusters: [\n")
    problem = kubernetes_problem(KubernetesConfig(source="kubeconfig", kubeconfig=str(kubeconfig)))
    assert problem is not None
    assert problem.startswith(f"kubernetes.kubeconfig: cannot load {kubeconfig}: ")
    assert "\n" not in problem


def test_a_missing_kubeconfig_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    problem = kubernetes_problem(KubernetesConfig(source="kubeconfig", kubeconfig=str(missing)))
    assert problem is not None and problem.startswith(f"kubernetes.kubeconfig: cannot load {missing}: ")


def test_static_namespaces_need_no_client_configuration() -> None:
    def load(config: KubernetesConfig) -> object:
        raise AssertionError("not loaded")

    assert kubernetes_problem(KubernetesConfig(source="static"), load) is None


def test_outside_a_cluster_source_cluster_says_what_to_use_instead() -> None:
    def load(config: KubernetesConfig) -> object:
        raise RuntimeError("Service host/port is not set.")

    problem = kubernetes_problem(KubernetesConfig(source="cluster"), load)
    assert problem == (
        "kubernetes.source: cluster, but the in-cluster service account cannot be loaded "
        "(RuntimeError: Service host/port is not set.); outside a cluster use source: kubeconfig "
        "or static"
    )


def _twistd_amp(tmp_path: Path, **sections: object) -> tuple[str, subprocess.CompletedProcess]:
    path = tmp_path / "amp.yaml"
    path.write_text(yaml.safe_dump(raw_config(**sections)))
    result = subprocess.run(
        [str(TWISTD), "--nodaemon", "--pidfile=", "amp", "--config", str(path)],
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    return str(path), result


def _one_line(result: subprocess.CompletedProcess) -> str:
    assert (result.returncode, result.stdout) == (1, ""), result
    [line] = result.stderr.splitlines()
    return line


def test_twistd_amp_on_a_taken_port_prints_one_line_naming_the_holder(tmp_path: Path, taken: int) -> None:
    path, result = _twistd_amp(tmp_path, listen={"port": taken})
    assert _one_line(result).startswith(
        f"amp: config {path}: listen.port: port {taken} (webhook) is in use by pid {os.getpid()} ("
    )


def test_twistd_amp_on_a_taken_metrics_port_prints_one_line(tmp_path: Path, taken: int) -> None:
    path, result = _twistd_amp(tmp_path, metrics={"port": taken, "interface": "127.0.0.1"})
    assert _one_line(result).startswith(f"amp: config {path}: metrics.port: port {taken} (metrics) is in use by ")


def test_twistd_amp_with_a_missing_certificate_prints_one_line(tmp_path: Path) -> None:
    cert = tmp_path / "missing.crt"
    path, result = _twistd_amp(tmp_path, tls={"cert": str(cert)})
    assert _one_line(result) == f"amp: config {path}: tls.cert: certificate file {cert}: file not found"


def test_twistd_amp_with_a_broken_kubeconfig_prints_one_line(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("clusters: [\n")
    path, result = _twistd_amp(tmp_path, kubernetes={"source": "kubeconfig", "kubeconfig": str(kubeconfig)})
    assert _one_line(result).startswith(f"amp: config {path}: kubernetes.kubeconfig: cannot load {kubeconfig}: ")
