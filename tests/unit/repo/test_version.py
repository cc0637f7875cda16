"""
amp's version is defined once, in amp/__init__.py, and every other place
that names it says the same: the package metadata, C{amp --version}, the
chart's version and appVersion (and so the image tag and the
app.kubernetes.io/version label it renders), the image's label, the
examples' distribution, the changelog and every C{amp:X.Y.Z} or
C{amp/X.Y.Z} in the docs and manifests.
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml

from amp import __version__

ROOT = Path(__file__).resolve().parents[3]
#: amp:1.2.3 (an image), amp/1.2.3 (the User-Agent), amp 1.2.3.
NAMED = re.compile(r"\bamp[:/ ]v?(\d+\.\d+\.\d+)\b")


def test_the_package_metadata_is_amps_version() -> None:
    assert importlib.metadata.version("amp") == __version__


def test_amp_version() -> None:
    amp = Path(sys.executable).with_name("amp")
    result = subprocess.run([str(amp), "--version"], capture_output=True, text=True, timeout=60)
    assert result.stdout == f"amp {__version__}\n"


def test_the_chart_is_amps_version() -> None:
    chart = yaml.safe_load((ROOT / "deploy" / "chart" / "amp" / "Chart.yaml").read_text())
    assert (chart["version"], chart["appVersion"]) == (__version__, __version__)


def test_the_image_label_is_amps_version() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert f'org.opencontainers.image.version="{__version__}"' in dockerfile


def test_the_examples_are_released_with_amp() -> None:
    project = tomllib.loads((ROOT / "examples" / "pyproject.toml").read_text())["project"]
    assert project["version"] == __version__


def test_the_changelog_has_the_version() -> None:
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert f"\n## [{__version__}]" in changelog
    assert f"\n[{__version__}]: " in changelog


def test_every_version_named_in_docs_and_manifests_is_amps() -> None:
    files = [
        ROOT / "README.md",
        ROOT / "Dockerfile",
        *(ROOT / "docs").glob("*.md"),
        *(p for p in (ROOT / "deploy").rglob("*") if p.is_file() and p.suffix in (".md", ".yaml", ".sh", ".txt")),
    ]
    named = {}
    for path in files:
        for m in NAMED.finditer(path.read_text()):
            named.setdefault(m.group(1), set()).add(str(path.relative_to(ROOT)))
    assert __version__ in named, "the docs name amp's version somewhere (the image tag)"
    assert {v: sorted(p) for v, p in named.items() if v != __version__} == {}
