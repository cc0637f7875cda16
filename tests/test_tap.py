"""
Tests for amp.tap and the twistd plugins: a broken config or certificate
stops start-up with one line naming the key or file, and C{twistd --help}
lists both plugins.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from twisted.internet.testing import MemoryReactorClock
from twisted.python.usage import UsageError

from amp.service import AmpService
from amp.tap import Options, makeService
from tests.helpers import dev_tls, raw_config

REPO = Path(__file__).resolve().parent.parent
TWISTD = Path(sys.executable).with_name("twistd")


def write_config(tmp_path: Path, text: str) -> str:
    path = tmp_path / "amp.yaml"
    path.write_text(text)
    return str(path)


def options_for(path: str, *extra: str) -> Options:
    options = Options()
    options.parseOptions(["--config", path, *extra])
    return options


def yaml_config(**sections: object) -> str:
    import yaml

    return yaml.safe_dump(raw_config(**sections))


def test_broken_config_is_a_usage_error_naming_the_key(tmp_path: Path) -> None:
    path = write_config(tmp_path, "listen: {port: 8443}\nendpoints: {timeout: soon}\n")
    with pytest.raises(UsageError) as e:
        options_for(path)
    assert str(e.value) == f"config {path}: endpoints.timeout: expected a duration like 250ms, 2s or 1m, got 'soon'"


def test_unknown_key_is_a_usage_error(tmp_path: Path) -> None:
    path = write_config(tmp_path, "listen: {prot: 8443}\n")
    with pytest.raises(UsageError, match=r"listen\.prot: unknown key"):
        options_for(path)


def test_missing_config_file_is_a_usage_error(tmp_path: Path) -> None:
    path = str(tmp_path / "missing.yaml")
    with pytest.raises(UsageError, match="cannot read config file .*missing.yaml: No such file"):
        options_for(path)


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


def test_check_flag_exits_zero_after_checking(tmp_path: Path) -> None:
    path = write_config(tmp_path, yaml_config())
    with pytest.raises(SystemExit) as e:
        makeService(options_for(path, "--check"), reactor=MemoryReactorClock())
    assert e.value.code == 0


def _twistd(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([str(TWISTD), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


def test_twistd_help_lists_both_plugins() -> None:
    result = _twistd("--help")
    assert result.returncode == 0, result.stderr
    commands = [line.split()[0] for line in result.stdout.splitlines() if line.startswith("    ") and line.split()]
    assert "amp" in commands
    assert "amp-example" in commands


def test_twistd_amp_with_a_broken_config_prints_the_key_not_a_traceback(tmp_path: Path) -> None:
    path = write_config(tmp_path, "listen: {port: 99999}\n")
    result = _twistd("--nodaemon", "--pidfile=", "amp", "--config", path, cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "listen.port: expected a port number 0-65535, got 99999" in output
    assert "Traceback" not in output


def test_twistd_amp_with_a_missing_key_file_prints_the_file(tmp_path: Path) -> None:
    key = tmp_path / "gone.key"
    path = write_config(tmp_path, yaml_config(tls={"cert": str(dev_tls()["cert"]), "key": str(key)}))
    result = _twistd("--nodaemon", "--pidfile=", "amp", "--config", path, cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert str(key) in output
    assert "Traceback" not in output
