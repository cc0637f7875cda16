"""
amp's distribution and image are the product only, and declare exactly
what the product imports.

The wheel is built offline (no build isolation, the test environment's
setuptools) from exactly the files the Dockerfile's build stage copies, in
a scratch directory, so the proof covers both ``pip install .`` and the
image: neither contains the example endpoints, the demo or the
development-certificate tool, which live in ``examples/``.
"""

from __future__ import annotations

import importlib.metadata
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.support.repo_files import install_requires, setup_keyword, stages, supported_pythons, third_party_imports

ROOT = Path(__file__).resolve().parents[3]
SAMPLE_WORDS = re.compile(r"example|demo|devcert", re.I)


def _copied_by_the_image(dest: Path) -> list[Path]:
    """Copy what the Dockerfile's build stage COPYs into ``dest``; returns the files copied."""
    dest.mkdir(parents=True)
    for instruction, args in stages()[0]:
        if instruction != "COPY":
            continue
        source, target = args.split()
        assert target.startswith("./"), f"COPY {args}: expected a path relative to WORKDIR"
        if (ROOT / source).is_dir():
            shutil.copytree(ROOT / source, dest / target, ignore=shutil.ignore_patterns("__pycache__", "dropin.cache"))
        else:
            (dest / target).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / source, dest / target)
    return [p for p in dest.rglob("*") if p.is_file()]


def test_the_image_and_the_wheel_contain_no_sample_code(tmp_path: Path) -> None:
    src = tmp_path / "src"
    copied = _copied_by_the_image(src)
    assert copied, "the Dockerfile copies something"
    assert [p.relative_to(src) for p in copied if SAMPLE_WORDS.search(str(p.relative_to(src)))] == []

    out = tmp_path / "wheel"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-q",
            "-w",
            str(out),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    [wheel] = out.glob("amp-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert [n for n in names if SAMPLE_WORDS.search(n)] == []
    assert {n.split("/")[0] for n in names} == {"amp", "twisted", wheel.name.split("-py")[0] + ".dist-info"}
    assert [n for n in names if n.startswith("twisted/")] == ["twisted/plugins/amp_plugin.py"]
    product = sorted(n for n in names if n.startswith("amp/"))
    assert product == sorted(f"amp/{p.relative_to(ROOT / 'amp')}" for p in (ROOT / "amp").rglob("*.py"))
    metadata = zipfile.ZipFile(wheel).read(f"{wheel.name.split('-py')[0]}.dist-info/METADATA").decode()
    runtime = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:") and "extra ==" not in line]
    assert not [line for line in runtime if "treq" in line], "treq is a test dependency"


def test_the_declared_pythons_are_the_tested_ones() -> None:
    """
    python_requires starts at the oldest version the classifiers name, and
    `make test-pythons` runs the unit suite on exactly those versions.
    """
    pythons = supported_pythons()
    assert pythons, "setup.py names the supported Python versions in its classifiers"
    assert setup_keyword("python_requires") == f">={pythons[0]}"
    make = re.search(r"^PYTHONS := (.*)$", (ROOT / "Makefile").read_text(), re.M)
    assert make is not None and make.group(1).split() == pythons
    examples = (ROOT / "examples" / "pyproject.toml").read_text()
    assert f'requires-python = ">={pythons[0]}"' in examples


def test_kubectl_amp_is_the_same_command() -> None:
    """`kubectl amp ...` finds kubectl-amp on PATH: the same entry point as amp."""
    scripts = setup_keyword("entry_points")["console_scripts"]
    assert "kubectl-amp = amp.cli:main" in scripts and "amp = amp.cli:main" in scripts
    installed = {
        e.name: e.value
        for e in importlib.metadata.entry_points(group="console_scripts")
        if e.name in ("amp", "kubectl-amp")
    }
    assert installed == {"amp": "amp.cli:main", "kubectl-amp": "amp.cli:main"}
    script = Path(sys.executable).with_name("kubectl-amp")
    result = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=60)
    from amp import __version__

    assert (result.returncode, result.stdout) == (0, f"amp {__version__}\n")


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_install_requires_is_exactly_what_the_product_imports() -> None:
    """
    Every third-party module amp imports comes from a declared distribution,
    and every declared distribution is imported: a dependency only the tests
    use (treq, jsonpatch) belongs in the test extra.
    """
    providers = importlib.metadata.packages_distributions()
    declared = {_normal(name) for name in install_requires()}
    imported = third_party_imports()
    used: set[str] = set()
    for module, files in imported.items():
        dists = {_normal(d) for d in providers.get(module, [])}
        assert dists & declared, (
            f"{module} (imported by {', '.join(sorted(files))}) comes from an undeclared distribution {sorted(dists)}"
        )
        used |= dists & declared
    assert declared - used == set(), "declared in install_requires but never imported by amp/"
    assert "treq" not in imported
