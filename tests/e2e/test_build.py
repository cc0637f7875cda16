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


def test_build_without_go_names_what_is_missing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
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


def _replaces(module_dir: Path) -> list[str]:
    text = (module_dir / "go.mod").read_text()
    block = text.split("replace (", 1)[1].split(")", 1)[0]
    return sorted(line.strip() for line in block.splitlines() if line.strip())


def test_the_controllers_are_built_from_kube_apiservers_release_and_staging_pins() -> None:
    assert build.required_version(build.CONTROLLERS_MODULE_DIR, "k8s.io/kubernetes") == build.kubernetes_version()
    assert _replaces(build.CONTROLLERS_MODULE_DIR) == _replaces(build.KUBE_MODULE_DIR)
    build.same_kubernetes_release()  # does not raise
    assert build.kwok_version().startswith("v0.")


def test_controllers_of_another_release_are_refused_naming_both(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "go.mod").write_text("module example.test/c\n\nrequire k8s.io/kubernetes v1.2.3\n")
    monkeypatch.setattr(build, "CONTROLLERS_MODULE_DIR", tmp_path)
    with pytest.raises(build.BuildError, match=r"v1\.2\.3 but kube-apiserver is built from v1\."):
        build.build_controllers(cache=tmp_path / "cache")


def test_kwoks_stages_come_from_its_module_as_one_stream(tmp_path: Path) -> None:
    for relative in build.KWOK_STAGES:
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"kind: Stage\nmetadata:\n  name: {path.stem}\n")
    docs = build.kwok_stages_text(tmp_path).split("---\n")
    assert [doc.splitlines()[-1].strip() for doc in docs] == [
        "name: node-initialize",
        "name: pod-ready",
        "name: pod-complete",
        "name: pod-delete",
    ]

    (tmp_path / build.KWOK_STAGES[1]).unlink()
    with pytest.raises(build.BuildError, match="kwok's module has no kustomize/stage/pod/fast/pod-ready.yaml"):
        build.kwok_stages_text(tmp_path)


def test_cached_controllers_are_current_only_with_their_stages(tmp_path: Path) -> None:
    for name, module in (
        ("kube-controller-manager", build.CONTROLLERS_MODULE_DIR),
        ("kube-scheduler", build.CONTROLLERS_MODULE_DIR),
        ("kwok", build.KWOK_MODULE_DIR),
    ):
        binary = tmp_path / name
        binary.write_text("#!/bin/sh\n")
        binary.chmod(0o755)
        (tmp_path / f"{name}.stamp").write_text(build._module_digest(module) + "\n")
    assert not build.controllers_present(tmp_path)
    (tmp_path / "kwok-stages.yaml").write_text("kind: Stage\n")
    assert build.controllers_present(tmp_path)
    assert build.build_controllers(cache=tmp_path).kwok_stages == tmp_path / "kwok-stages.yaml"
