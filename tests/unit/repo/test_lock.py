"""
The locks (requirements/amp.lock, requirements/dev.lock; `make lock`)
pin, with hashes, versions inside setup.py's ranges and the examples', for
every distribution amp and the tests need, and are what is installed here:
`make venv` and the image install from them with --require-hashes.

A dependency added to setup.py without `make lock` fails here, naming it.
"""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.support.repo_files import setup_keyword, third_party_imports

ROOT = Path(__file__).resolve().parents[3]
RUNTIME = ROOT / "requirements" / "amp.lock"
DEV = ROOT / "requirements" / "dev.lock"
EXAMPLES = tomllib.loads((ROOT / "examples" / "pyproject.toml").read_text())["project"]

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^ ;\\]+)(?:\s*;\s*([^\\]+?))?\s*\\?$")


def read_lock(path: Path) -> dict[str, tuple[Version, int, str]]:
    """A lock's pins: name -> (version, number of hashes, marker)."""
    pins: dict[str, tuple[Version, int, str]] = {}
    name = ""
    for line in path.read_text().splitlines():
        m = _PIN.match(line)
        if m:
            name = canonicalize_name(m.group(1))
            pins[name] = (Version(m.group(2)), 0, (m.group(3) or "").strip())
        elif line.strip().startswith("--hash=sha256:") and name:
            version, hashes, marker = pins[name]
            pins[name] = (version, hashes + 1, marker)
    return pins


def applies(marker: str) -> bool:
    return not marker or Requirement(f"x; {marker}").marker.evaluate(default_environment())  # type: ignore[union-attr]


def requirements(*groups: list[str]) -> list[Requirement]:
    return [Requirement(r) for group in groups for r in group]


RUNTIME_PINS = read_lock(RUNTIME)
DEV_PINS = read_lock(DEV)
DECLARED_RUNTIME = requirements(setup_keyword("install_requires"))
EXTRAS = setup_keyword("extras_require")
DECLARED_DEV = requirements(
    setup_keyword("install_requires"),
    EXTRAS["test"],
    EXTRAS["bench"],
    EXAMPLES["dependencies"],
    EXAMPLES["optional-dependencies"]["test"],
)


@pytest.mark.parametrize("pins", [RUNTIME_PINS, DEV_PINS], ids=["runtime", "dev"])
def test_every_pin_has_hashes(pins: dict[str, tuple[Version, int, str]]) -> None:
    assert len(pins) > 10
    assert [name for name, (_, hashes, _) in pins.items() if hashes == 0] == []


@pytest.mark.parametrize(
    "pins, declared", [(RUNTIME_PINS, DECLARED_RUNTIME), (DEV_PINS, DECLARED_DEV)], ids=["runtime", "dev"]
)
def test_the_lock_satisfies_the_declared_ranges(
    pins: dict[str, tuple[Version, int, str]], declared: list[Requirement]
) -> None:
    for req in declared:
        name = canonicalize_name(req.name)
        assert name in pins, f"{req} is declared but not locked: run `make lock`"
        assert pins[name][0] in req.specifier, f"locked {name}=={pins[name][0]} is outside {req}: run `make lock`"


def test_the_dev_lock_pins_what_the_image_ships() -> None:
    differ = {n: (str(v), str(DEV_PINS[n][0])) for n, (v, _, _) in RUNTIME_PINS.items() if DEV_PINS[n][0] != v}
    assert differ == {}


def test_the_runtime_lock_covers_everything_amp_imports() -> None:
    providers = importlib.metadata.packages_distributions()
    for module, files in third_party_imports().items():
        dists = {canonicalize_name(d) for d in providers.get(module, [])}
        assert dists & set(RUNTIME_PINS), f"{module} (imported by {', '.join(sorted(files))}) is not in {RUNTIME.name}"


@pytest.mark.parametrize("pins", [RUNTIME_PINS, DEV_PINS], ids=["runtime", "dev"])
def test_each_lock_is_closed(pins: dict[str, tuple[Version, int, str]]) -> None:
    """Every dependency of a locked distribution (on this Python) is locked too: --require-hashes needs it."""
    missing = set()
    for name, (_, _, marker) in pins.items():
        if not applies(marker):
            continue
        for text in importlib.metadata.requires(name) or ():
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({**default_environment(), "extra": ""}):
                continue
            if canonicalize_name(req.name) not in pins:
                missing.add(f"{req.name} (needed by {name})")
    assert missing == set()


def test_what_is_installed_is_the_lock() -> None:
    """`make venv` installed exactly the dev lock's versions."""
    differ = {}
    for name, (version, _, marker) in DEV_PINS.items():
        if applies(marker):
            installed = Version(importlib.metadata.version(name))
            if installed != version:
                differ[name] = (str(version), str(installed))
    assert differ == {}, "locked vs installed: run `make venv` (or `make lock` after changing setup.py)"
