"""
Tests for amp.tap and the twistd plugins: a broken config or certificate
stops start-up with one line naming the key or file and nothing else on the
screen (no usage text), exit status non-zero, with C{--check} too; and
C{twistd --help} lists both plugins.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from twisted.internet.testing import MemoryReactorClock
from twisted.logger import capturedLogs, formatEvent
from twisted.python.usage import UsageError

from amp.service import AmpService
from amp.tap import Options, makeService
from tests.support.helpers import dev_tls, raw_config

REPO = Path(__file__).resolve().parents[3]
TWISTD = Path(sys.executable).with_name("twistd")


def write_config(tmp_path: Path, text: str) -> str:
    path = tmp_path / "amp.yaml"
    path.write_text(text)
    return str(path)


def options_for(path: str, *extra: str) -> Options:
    options = Options()
    options.parseOptions(["--config", path, *extra])
    return options


def yaml_config(namespaces: object = None, **sections: object) -> str:
    return yaml.safe_dump(raw_config(namespaces, **sections))  # type: ignore[arg-type]


def config_error(path: str, *extra: str) -> str:
    """The one line amp exits with for a wrong config."""
    with pytest.raises(SystemExit) as e:
        options_for(path, *extra)
    assert isinstance(e.value.code, str), e.value.code
    return e.value.code


def test_broken_config_exits_with_one_line_naming_the_key(tmp_path: Path) -> None:
    path = write_config(tmp_path, "listen: {port: 8443}\nendpoints: {timeout: soon}\n")
    assert config_error(path) == (
        f"amp: config {path}: endpoints.timeout: expected a duration like 250ms, 2s or 1m, got 'soon'"
    )


def test_unknown_key_exits_naming_it(tmp_path: Path) -> None:
    path = write_config(tmp_path, "listen: {prot: 8443}\n")
    assert "listen.prot: unknown key" in config_error(path)


def test_missing_config_file_exits_naming_it(tmp_path: Path) -> None:
    path = str(tmp_path / "missing.yaml")
    assert re.search("missing.yaml: file not found", config_error(path))


def test_a_wrong_worker_flag_is_a_usage_error(tmp_path: Path) -> None:
    path = write_config(tmp_path, yaml_config(workers=2, listen={"port": 18443}))
    with pytest.raises(UsageError, match=r"--worker: expected 0 to 1 \(workers: 2\), got 2"):
        options_for(path, "--worker", "2")


def test_missing_certificate_exits_naming_the_file(tmp_path: Path) -> None:
    cert = tmp_path / "nowhere" / "tls.crt"
    path = write_config(tmp_path, yaml_config(tls={"cert": str(cert)}))
    with pytest.raises(SystemExit) as e:
        makeService(options_for(path), reactor=MemoryReactorClock())
    message = str(e.value.code)
    assert message.startswith("amp: ")
    assert str(cert) in message


def test_make_service_builds_amp(tmp_path: Path) -> None:
    path = write_config(tmp_path, yaml_config())
    service = makeService(options_for(path), reactor=MemoryReactorClock())
    assert isinstance(service, AmpService)
    assert service.certificate.loaded


def test_start_up_logs_the_version_and_a_config_summary(tmp_path: Path) -> None:
    from amp import __version__
    from amp.config import config_summary

    path = write_config(tmp_path, yaml_config({"a": {}, "b": {}}, failure_policy="Fail"))
    service = makeService(options_for(path), reactor=MemoryReactorClock())
    with capturedLogs() as events:
        service.startService()
    service.stopService()
    lines = [formatEvent(e) for e in events if e.get("log_namespace") == "amp.service.AmpService"]
    summary = config_summary(service.config)
    assert f"amp {__version__} starting: {summary}" in lines
    assert "namespaces from static (2 namespaces), failure policy Fail" in summary


def test_check_flag_exits_zero_after_checking(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_config(tmp_path, yaml_config())
    with pytest.raises(SystemExit) as e:
        makeService(options_for(path, "--check"), reactor=MemoryReactorClock())
    assert e.value.code == 0
    assert "effective configuration" in capsys.readouterr().out


def _twistd(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([str(TWISTD), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


def test_twistd_help_lists_both_plugins() -> None:
    result = _twistd("--help")
    assert result.returncode == 0, result.stderr
    commands = [line.split()[0] for line in result.stdout.splitlines() if line.startswith("    ") and line.split()]
    assert "amp" in commands
    assert "amp-example" in commands


def one_line(result: subprocess.CompletedProcess) -> str:
    """
    The process failed and wrote exactly one line, on standard error, and
    nothing else (no usage text, no traceback, no log lines).
    """
    assert result.returncode != 0, result
    assert result.stdout == "", result.stdout
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.mark.parametrize("check", [False, True], ids=["run", "check"])
def test_twistd_amp_with_a_broken_config_prints_one_line(tmp_path: Path, check: bool) -> None:
    path = write_config(tmp_path, "listen: {port: 99999}\n")
    result = _twistd("--nodaemon", "--pidfile=", "amp", "--config", path, *(["--check"] if check else []), cwd=tmp_path)
    assert one_line(result) == f"amp: config {path}: listen.port: expected a port number 0-65535, got 99999"


@pytest.mark.parametrize(
    "text, error",
    [
        ("listen: [1, 2\n", "is not valid YAML"),
        ("workers: 2\n", "listen.port: workers share the webhook port, so it cannot be 0"),
        ("tls: {cert: 1}\n", "tls.cert: expected a non-empty string, got 1"),
    ],
    ids=["yaml", "workers", "type"],
)
def test_twistd_amp_check_prints_one_line_per_config_error(tmp_path: Path, text: str, error: str) -> None:
    path = write_config(tmp_path, text.replace("workers: 2", "workers: 2\nlisten: {port: 0}"))
    result = _twistd("--nodaemon", "--pidfile=", "amp", "--config", path, "--check", cwd=tmp_path)
    line = one_line(result)
    assert line.startswith(f"amp: config {path}: "), line
    assert error in line


def test_twistd_amp_with_a_missing_config_file_prints_one_line(tmp_path: Path) -> None:
    path = str(tmp_path / "nowhere.yaml")
    result = _twistd("--nodaemon", "--pidfile=", "amp", "--config", path, cwd=tmp_path)
    assert "nowhere.yaml: file not found" in one_line(result)


@pytest.mark.parametrize("check", [False, True], ids=["run", "check"])
def test_twistd_amp_with_a_missing_key_file_prints_one_line(tmp_path: Path, check: bool) -> None:
    key = tmp_path / "gone.key"
    path = write_config(tmp_path, yaml_config(tls={"cert": str(dev_tls()["cert"]), "key": str(key)}))
    result = _twistd("--nodaemon", "--pidfile=", "amp", "--config", path, *(["--check"] if check else []), cwd=tmp_path)
    line = one_line(result)
    assert line.startswith(f"amp: config {path}: tls.key: key file {key}: "), line


def test_twistd_amp_check_prints_the_effective_config(tmp_path: Path) -> None:
    """
    C{--check} of a good config exits 0 and prints the effective config as
    YAML, defaults filled in: loading what it prints gives the same config.
    TLS file paths are shown, never what the files hold, and an endpoint
    URL's credentials and query in a namespace's annotation are masked.
    """
    from amp import __version__
    from amp.config import config_digest, load_config, parse_config

    tls = dev_tls()
    path = write_config(
        tmp_path,
        yaml_config(
            {
                "team-a": {
                    "labels": {"amp.txn2.com/enabled": "true"},
                    "annotations": {"amp.txn2.com/ep": "http://user:hunter2@127.0.0.1:8080/mutate?token=t0ps3cret"},
                }
            },
            endpoints={
                "client_cert": str(tls["cert"]),
                "client_key": str(tls["key"]),
                "overrides": [{"match": "http://127.0.0.1:9/*", "timeout": "750ms"}],
                "deny_networks": ["metadata"],
            },
        ),
    )
    result = _twistd("--nodaemon", "--pidfile=", "amp", "--config", path, "--check", cwd=tmp_path)
    assert (result.returncode, result.stderr) == (0, "")
    config = load_config(path)
    first, _, rest = result.stdout.partition("\n")
    assert first == f"# amp {__version__}: effective configuration {config_digest(config)}"
    shown = yaml.safe_load(rest)
    # Every default is there.
    assert shown["listen"]["max_connections"] == 1024
    assert shown["metrics"]["debug_reviews"] == 256
    assert shown["endpoints"]["overrides"][0]["timeout"] == 0.75
    assert shown["tls"]["key"] == str(tls["key"])
    assert shown["kubernetes"]["namespaces"]["team-a"]["annotations"]["amp.txn2.com/ep"] == (
        "http://***@127.0.0.1:8080/mutate"
    )
    for secret in ("hunter2", "t0ps3cret"):
        assert secret not in result.stdout
    key_body = tls["key"].read_text().splitlines()[1]
    assert key_body not in result.stdout
    assert tls["cert"].read_text().splitlines()[1] not in result.stdout
    # It loads back to the same config (the masked annotation aside).
    shown["kubernetes"]["namespaces"]["team-a"]["annotations"]["amp.txn2.com/ep"] = (
        "http://user:hunter2@127.0.0.1:8080/mutate?token=t0ps3cret"
    )
    assert parse_config(shown) == config


def test_twistd_amp_version_is_amps() -> None:
    from amp import __version__

    result = _twistd("amp", "--version")
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout.startswith(f"amp {__version__} (Twisted ")


def test_twistd_amp_check_into_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    """
    C{twistd amp --check | head -1}: the reader has gone before amp has
    written everything; amp exits 0 without a BrokenPipeError traceback.
    (Here the reader is gone before amp starts, so every write fails.)
    """
    path = write_config(tmp_path, yaml_config())
    read, write = os.pipe()
    os.close(read)
    try:
        result = subprocess.run(
            [str(TWISTD), "--nodaemon", "--pidfile=", "amp", "--config", path, "--check"],
            cwd=tmp_path,
            env=dict(os.environ, PYTHONPATH=str(REPO)),
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    finally:
        os.close(write)
    assert (result.returncode, result.stderr) == (0, "")


def test_effective_config_to_a_closed_reader_raises_nothing(tmp_path: Path) -> None:
    from amp.tap import print_effective_config

    class Gone:
        def write(self, text: str) -> None:
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self) -> None:
            raise BrokenPipeError(32, "Broken pipe")

    print_effective_config(options_for(write_config(tmp_path, yaml_config())).config, out=Gone())


def test_the_managed_registration_is_wired_to_the_lease_and_the_watch(tmp_path: Path) -> None:
    """With registration.managed the namespace source runs the Lease for the keeper and tells it each version."""
    from amp.registration import RegistrationKeeper

    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\nclusters: [{name: f, cluster: {server: 'http://127.0.0.1:1'}}]\n"
        "users: [{name: amp, user: {token: t}}]\n"
        "contexts: [{name: f, context: {cluster: f, user: amp}}]\ncurrent-context: f\n"
    )
    raw = raw_config(None)
    raw["kubernetes"] = {
        "source": "kubeconfig",
        "kubeconfig": str(kubeconfig),
        "own_namespace": "amp-system",
        "webhook_configuration": "amp.txn2.com",
    }
    raw["registration"] = {"managed": True}
    path = write_config(tmp_path, yaml.safe_dump(raw))
    service = makeService(options_for(path), reactor=MemoryReactorClock())
    source = service.namespaces
    [keeper] = source._terms
    assert isinstance(keeper, RegistrationKeeper) and not keeper.active
    assert any(getattr(f, "__self__", None) is keeper for f in service.on_apply)
    source._on_webhook(None)  # the watch's news reaches the keeper (and the check)
    assert keeper._obj is None
    # off by default: no keeper, no Lease for it
    raw["registration"] = {"managed": False}
    path = write_config(tmp_path, yaml.safe_dump(raw))
    assert makeService(options_for(path), reactor=MemoryReactorClock()).namespaces._terms == ()


def test_amps_own_certificates_are_wired_to_the_lease_the_watch_and_the_keeper(tmp_path: Path) -> None:
    """With registration.secret: no certificate file is read, every replica serves the Secret's, the holder rotates."""
    from amp.registration import RegistrationKeeper, SecretCertificates

    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\nclusters: [{name: f, cluster: {server: 'http://127.0.0.1:1'}}]\n"
        "users: [{name: amp, user: {token: t}}]\n"
        "contexts: [{name: f, context: {cluster: f, user: amp}}]\ncurrent-context: f\n"
    )
    raw = raw_config(None)
    raw["tls"] = {"cert": str(tmp_path / "absent.crt"), "key": str(tmp_path / "absent.key")}
    raw["kubernetes"] = {
        "source": "kubeconfig",
        "kubeconfig": str(kubeconfig),
        "own_namespace": "amp-system",
        "webhook_configuration": "amp.txn2.com",
    }
    raw["registration"] = {"managed": True, "secret": "amp-certificates"}
    service = makeService(options_for(write_config(tmp_path, yaml.safe_dump(raw))), reactor=MemoryReactorClock())
    keeper, certs = service.namespaces._terms
    assert isinstance(keeper, RegistrationKeeper) and isinstance(certs, SecretCertificates)
    assert certs.parent is service and (certs.namespace, certs.name) == ("amp-system", "amp-certificates")
    assert service.certificate.memory and not service.certificate.loaded
    assert keeper.refresh in certs.on_bundle
    certs.bundle = b"PEM"
    assert keeper._bundle is not None and keeper._bundle() == b"PEM"
    service.namespaces._on_webhook({"webhooks": []})  # the watch's news reaches the rotation too
    assert certs._cluster == {}
