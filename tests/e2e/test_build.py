"""How the e2e suite reacts to a machine without Go, and where it builds."""

from __future__ import annotations

from pathlib import Path

import pytest

from . import build


def test_without_go_a_developer_run_skips_with_the_reason() -> None:
    outcome = build.go_missing_outcome({}, None, False)
    assert outcome is not None
    action, reason = outcome
    assert action == "skip"
    assert "Go is not installed" in reason


def test_without_go_ci_fails_instead_of_skipping() -> None:
    outcome = build.go_missing_outcome({"CI": "true"}, None, False)
    assert outcome is not None
    action, reason = outcome
    assert action == "fail"
    assert "Go is not installed" in reason and "CI=true" in reason


@pytest.mark.parametrize("go, cached", [("/usr/bin/go", False), (None, True)])
def test_go_or_cached_binaries_let_the_suite_run(go: str | None, cached: bool) -> None:
    assert build.go_missing_outcome({"CI": "true"}, go, cached) is None


def test_cache_dir_follows_the_environment_and_the_pinned_version(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("AMP_E2E_CACHE", str(tmp_path))
    assert build.cache_dir() == tmp_path / build.kubernetes_version()
    assert build.kubernetes_version().startswith("v1.")
    assert build.etcd_version().startswith("v3.")


def test_build_without_go_names_what_is_missing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(build.BuildError, match="no `go` on PATH"):
        build.build(cache=tmp_path / "empty")


def test_a_cached_binary_is_reused_only_while_go_mod_is_unchanged(tmp_path: Path) -> None:
    module = tmp_path / "mod"
    module.mkdir()
    (module / "go.mod").write_text("module example.test/m\n")
    (module / "go.sum").write_text("")
    binary = tmp_path / "prog"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    (tmp_path / "prog.stamp").write_text(build._module_digest(module) + "\n")
    assert build._is_current(binary, module)

    (module / "go.mod").write_text("module example.test/m\n\nrequire example.test/n v1.0.0\n")
    assert not build._is_current(binary, module)
