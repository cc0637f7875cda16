"""
What the repository's own files say, read for the tests of what ships:
the Dockerfile's instructions and build stages, setup.py's keywords (the
dependencies, the Pythons amp supports) and the third-party modules amp/
imports.  Reading only: no tool, no process.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def stages() -> list[list[tuple[str, str]]]:
    """The instructions of each build stage, starting with its FROM."""
    out: list[list[tuple[str, str]]] = []
    for ins in instructions(DOCKERFILE.read_text()):
        if ins[0] == "FROM":
            out.append([])
        out[-1].append(ins)
    return out


def setup_keyword(name: str) -> Any:
    """The literal value of setup.py's C{setup(name=...)}."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    [call] = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "setup"]
    [value] = [k.value for k in call.keywords if k.arg == name]
    return ast.literal_eval(value)


def install_requires() -> list[str]:
    """The distribution names of setup.py's install_requires."""
    return [re.split(r"[<>=!~ ;\[]", e, maxsplit=1)[0] for e in setup_keyword("install_requires")]


def supported_pythons() -> list[str]:
    """The Python versions setup.py's classifiers name, oldest first."""
    prefix = "Programming Language :: Python :: "
    found = [c[len(prefix) :] for c in setup_keyword("classifiers") if c.startswith(prefix)]
    return sorted((v for v in found if re.fullmatch(r"3\.\d+", v)), key=lambda v: int(v.split(".")[1]))


def third_party_imports() -> dict[str, set[str]]:
    """Top-level modules outside the standard library that amp/ imports, with the files importing each."""
    found: dict[str, set[str]] = {}
    for path in (ROOT / "amp").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                top = module.split(".")[0]
                if top != "amp" and top not in sys.stdlib_module_names:
                    found.setdefault(top, set()).add(path.name)
    return found
