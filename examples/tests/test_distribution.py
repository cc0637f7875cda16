"""
The examples tree stands on its own: it imports nothing from amp (but the
demo, which runs amp, uses amp's port check), builds
into its own wheel with its own twistd plugin, and each program runs by
itself as ``python -m amp_examples.<program>``, a real process on a free
loopback port.
"""

from __future__ import annotations

import ast
import json
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
import zipfile
from pathlib import Path

from amp_examples import server

EXAMPLES = Path(__file__).resolve().parent.parent
DEADLINE = 60.0


#: The one use of amp in the examples tree: the demo runs amp, and checks its
#: ports with amp's own check (amp.ports), so a taken port reads the same
#: from `make demo` as from `twistd amp`.
DEMO_USES = {("amp_dev/demo.py", "amp.ports")}


def test_the_examples_import_nothing_from_amp() -> None:
    """The endpoints, the plugin and the dev certificates import nothing from amp; the demo only its port check."""
    found = set()
    sources = [*EXAMPLES.glob("amp_examples/*.py"), *EXAMPLES.glob("amp_dev/*.py"), *EXAMPLES.glob("twisted/**/*.py")]
    for path in sources:
        for node in ast.walk(ast.parse(path.read_text())):
            modules = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else ([node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            )
            found |= {(str(path.relative_to(EXAMPLES)), m) for m in modules if m == "amp" or m.startswith("amp.")}
    assert found == DEMO_USES


def test_the_wheel_holds_every_program_and_the_plugin(tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(
        EXAMPLES, src, ignore=shutil.ignore_patterns("tests", "__pycache__", "*.egg-info", "build", "dropin.cache")
    )
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
            str(tmp_path / "out"),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    [wheel] = (tmp_path / "out").glob("amp_examples-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for program in server.PROGRAMS:
        assert program.__name__.replace(".", "/") + ".py" in names
    assert {"twisted/plugins/amp_example_plugin.py", "amp_dev/devcert.py", "amp_dev/demo.py"} <= names
    assert not [n for n in names if n.startswith("amp/") or n == "twisted/plugins/amp_plugin.py"]
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("/METADATA"))).decode()
    requires = [
        line.split(":", 1)[1].split()[0]
        for line in metadata.splitlines()
        if line.startswith("Requires-Dist:") and "extra ==" not in line
    ]
    assert "amp" not in requires


def _serving_url(process: subprocess.Popen[str], path: str) -> str:
    """The URL the program logs for ``path``, read from its stdout before a deadline."""
    deadline = time.monotonic() + DEADLINE
    assert process.stdout is not None
    seen = []
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        seen.append(line)
        if f"/{path}" in line and "serving http://" in line:
            return line.split("serving ", 1)[1].strip()
    raise AssertionError(f"no 'serving' line for /{path}; output so far:\n{''.join(seen)}")


def _post(url: str, pod: dict) -> list:
    request = urllib.request.Request(url, data=json.dumps(pod).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=DEADLINE) as response:
        assert response.status == 200, url
        reply = json.loads(response.read())
    return reply if isinstance(reply, list) else reply["patch"]


def test_each_program_runs_on_its_own() -> None:
    """All programs at once (each in its own process), so the test costs one start-up, not six."""
    processes = {
        program: subprocess.Popen(
            [sys.executable, "-m", program.__name__, "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for program in server.PROGRAMS
    }
    pod = {
        "metadata": {
            "name": "p",
            "labels": {"app": "a", "notebook-name": "n", "add-gcp-secret": "true"},
            "annotations": {"hub.jupyter.org/username": "alice"},
        },
        "spec": {"containers": [{"name": "c", "image": "gcr.io/x/y:1"}]},
    }
    try:
        for program, process in processes.items():
            paths = list(program.endpoints({}))
            urls = {path: _serving_url(process, path) for path in paths}
            assert set(urls) == set(paths)
            if program.__name__.endswith(".failures"):
                assert _post(urls["noop"], pod) == []
            else:
                [url] = urls.values()
                assert _post(url, pod), f"{program.__name__} changed nothing"
    finally:
        for process in processes.values():
            process.send_signal(signal.SIGTERM)
        statuses = {program.__name__: process.wait(DEADLINE) for program, process in processes.items()}
        for process in processes.values():
            if process.stdout is not None:
                process.stdout.close()
    assert set(statuses.values()) == {0}, statuses


def test_a_bad_option_is_one_line() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "amp_examples.registry", "--registry-map", "nonsense"],
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )
    assert result.returncode != 0
    [line] = result.stderr.strip().splitlines()
    assert line.endswith(": --registry-map: registry map entry 'nonsense' is not FROM=TO")
