"""
The shape of the C{amp} package, read from its source: no import cycle
between its modules (every import counted, those inside functions too: a
cycle hidden behind a late import is still a cycle; and those under C{if
TYPE_CHECKING:}: a type-only import never runs, but two modules that name
each other's types are still one concern in two files), no cycle between
its packages and top-level modules (C{amp.x}: the graph collapsed to them),
and no module over 600 lines (a module that grows past that is split by
concern).  The benchmark and the tools are held to the same 600 lines: every
Python module under C{bench/} and C{tools/}, and the scripts C{bench/run}
and C{bench/storm}.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
AMP = REPO / "amp"
MAX_LINES = 600
#: The benchmark's and the tools' scripts without a C{.py} suffix, held to the same rule as its modules.
SCRIPTS = ("bench/run", "bench/storm")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(AMP.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(AMP.rglob("*.py"))}


def imported(tree: ast.AST, name: str, is_package: bool, known: set[str]) -> set[str]:
    """
    The modules of C{known} that module C{name} imports, anywhere in it.
    C{from amp.x import y} imports C{amp.x.y} when that is a module, else
    C{amp.x}; importing C{amp.x.y} runs C{amp.x} first, so an import of a
    submodule also counts as one of each package above it (but the module's
    own packages, already being imported, do not).
    """
    package = name if is_package else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                targets.add(sub if sub in known else source)
    out: set[str] = set()
    for target in targets:
        parts = target.split(".")
        for i in range(1, len(parts) + 1):
            prefix = ".".join(parts[:i])
            if prefix in known and prefix != name and not name.startswith(prefix + "."):
                out.add(prefix)
    return out


def import_graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {
        name: imported(ast.parse(path.read_text(), str(path)), name, path.name == "__init__.py", known)
        for name, path in found.items()
    }


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle of C{graph} as the list of its modules, or []."""
    WHITE, GREY, BLACK = 0, 1, 2
    colour = dict.fromkeys(graph, WHITE)
    stack: list[str] = []

    def visit(node: str) -> list[str]:
        colour[node] = GREY
        stack.append(node)
        for nxt in sorted(graph[node]):
            if colour[nxt] == GREY:
                return stack[stack.index(nxt) :] + [nxt]
            if colour[nxt] == WHITE:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        stack.pop()
        colour[node] = BLACK
        return []

    for node in sorted(graph):
        if colour[node] == WHITE:
            cycle = visit(node)
            if cycle:
                return cycle
    return []


def top_level(name: str) -> str:
    """The package or top-level module of C{amp} that module C{name} is in: C{amp.x} of C{amp.x.y}."""
    return ".".join(name.split(".")[:2])


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """C{graph} collapsed to C{amp}'s packages and top-level modules; an import inside one is no edge."""
    out: dict[str, set[str]] = {}
    for name, targets in graph.items():
        node = top_level(name)
        out.setdefault(node, set()).update(top_level(t) for t in targets if top_level(t) != node)
    return out


def test_no_import_cycle_in_amp() -> None:
    cycle = find_cycle(import_graph())
    assert not cycle, "import cycle: " + " -> ".join(cycle)


def test_no_import_cycle_between_packages_of_amp() -> None:
    cycle = find_cycle(package_graph(import_graph()))
    assert not cycle, "import cycle between packages: " + " -> ".join(cycle)


def test_the_cycle_check_sees_a_cycle_behind_a_late_import() -> None:
    """The check above counts an import inside a function (guards it)."""
    known = {"amp.a", "amp.b"}
    a = ast.parse("import amp.b\n")
    b = ast.parse("def f():\n    from amp import a\n")
    graph = {"amp.a": imported(a, "amp.a", False, known), "amp.b": imported(b, "amp.b", False, known)}
    assert find_cycle(graph) == ["amp.a", "amp.b", "amp.a"]


def test_the_cycle_check_sees_a_cycle_through_type_checking_imports() -> None:
    """An import under C{if TYPE_CHECKING:} is an edge: two modules naming each other's types are a cycle."""
    known = {"amp.a", "amp.b"}
    a = ast.parse("import amp.b\n")
    b = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from amp.a import A\n")
    graph = {"amp.a": imported(a, "amp.a", False, known), "amp.b": imported(b, "amp.b", False, known)}
    assert find_cycle(graph) == ["amp.a", "amp.b", "amp.a"]


def test_the_package_check_sees_a_cycle_between_packages() -> None:
    """
    Modules with no cycle between them (C{amp.p._one} -> C{amp.q} ->
    C{amp.p._two}) still make one between their packages.
    """
    known = {"amp.p", "amp.p._one", "amp.p._two", "amp.q"}
    one = ast.parse("from amp import q\n")
    q = ast.parse("from amp.p._two import f\n")
    graph = {
        "amp.p": set(),
        "amp.p._one": imported(one, "amp.p._one", False, known),
        "amp.p._two": set(),
        "amp.q": imported(q, "amp.q", False, known),
    }
    assert find_cycle(graph) == []
    assert find_cycle(package_graph(graph)) == ["amp.p", "amp.q", "amp.p"]


def test_the_graph_sees_the_known_layers() -> None:
    """The graph holds real edges (guards the cycle test against an empty graph)."""
    graph = import_graph()
    assert "amp.reasons" in graph["amp.policy"]
    assert len(graph) > 30


def over_max_lines(root: Path, paths: list[Path]) -> dict[str, int]:
    """The files of C{paths} longer than L{MAX_LINES} lines, with their line counts, by path under C{root}."""
    counts = {path: len(path.read_text().splitlines()) for path in paths}
    return {path.relative_to(root).as_posix(): n for path, n in counts.items() if n > MAX_LINES}


def bench_and_tools_files(root: Path) -> list[Path]:
    """Every Python module under C{bench/} and C{tools/} of C{root}, and the scripts of L{SCRIPTS}."""
    found = sorted((root / "bench").rglob("*.py")) + sorted((root / "tools").rglob("*.py"))
    return found + [root / script for script in SCRIPTS]


def test_no_module_over_600_lines() -> None:
    long = {name: n for name, path in modules().items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them by concern): {long}"


def test_no_bench_or_tools_file_over_600_lines() -> None:
    files = bench_and_tools_files(REPO)
    assert REPO / "bench" / "harness.py" in files and REPO / "tools" / "image.py" in files  # not an empty list
    long = over_max_lines(REPO, files)
    assert not long, f"bench/ and tools/ files over {MAX_LINES} lines (split them by concern): {long}"


def test_the_length_check_sees_long_bench_and_tools_files(tmp_path: Path) -> None:
    """
    A script of 601 lines and a module of 601 lines in a package are
    caught; files of 600 lines are not (guards the check above).
    """
    lines = {
        "bench/run": 601,
        "bench/storm": 600,
        "bench/soak/driver.py": 601,
        "bench/harness.py": 600,
        "tools/image.py": 3,
    }
    for name, n in lines.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x = 1\n" * n)
    found = bench_and_tools_files(tmp_path)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in found) == sorted(lines)
    assert over_max_lines(tmp_path, found) == {"bench/run": 601, "bench/soak/driver.py": 601}
