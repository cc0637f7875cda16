#!/usr/bin/env python3
"""
amp's container image: build it with whichever container engine runs here,
and look inside it.  Standard library only (``make image`` runs it before
any virtualenv exists); the tests import it for the same engine, image name
and checks.

    python3 tools/image.py build           # make image: build amp:<version>
    python3 tools/image.py reproducible    # a second build without cache; same files?
    python3 tools/image.py sbom FILE       # CycloneDX SBOM of the image's Python packages
    python3 tools/image.py contents        # no compiler, no package cache, no tests or bench

The engine is podman or Docker, whichever answers ``<engine> info`` (podman
first; ``AMP_CONTAINER_ENGINE`` picks one).  The build passes the time of
the last commit that changed what the image is built from as
``SOURCE_DATE_EPOCH`` (hash-checked .pyc files, dated wheel entries), and
the version and that commit (the git revision) as OCI labels and
annotations.  Where
outgoing TLS is re-signed by a local CA (``PIP_CERT`` or ``SSL_CERT_FILE``
names its bundle, or ``AMP_BUILD_CA``), that bundle is a build secret,
mounted into the pip steps only, and pip is pointed at it by a build
argument: it is never copied into a layer (``contents`` checks).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tarfile
import time
from functools import partial
from pathlib import Path
from typing import IO, Iterator, NamedTuple, Optional

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"
#: The build secret that carries the host's CA bundle, where it is mounted
#: (the RUN steps that ask for it only) and what ``PIP_CERT`` names.
BUILD_CA_SECRET = "build-ca"
BUILD_CA_PATH = f"/run/secrets/{BUILD_CA_SECRET}"
#: The cyclonedx-bom release the SBOM is made with (tools/install image
#: installs it into $AMP_TOOLS/cyclonedx, pure Python, run inside the image).
CYCLONEDX_VERSION = "7.5.0"
LABEL_PREFIX = "org.opencontainers.image."


class EngineMissing(RuntimeError):
    """No container engine runs here; the message says what was tried."""


def version() -> str:
    text = (ROOT / "amp" / "__init__.py").read_text()
    found = re.search(r'^__version__\s*=\s*"([^"]+)"', text, re.M)
    if found is None:
        raise RuntimeError("amp/__init__.py declares no __version__")
    return found.group(1)


def image_name() -> str:
    """The image the chart runs by default (``image.repository``:appVersion)."""
    return f"amp:{version()}"


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


#: What the image is built from (the Dockerfile and what it copies, per
#: .dockerignore's allow-list); tests/unit/deploy/test_image_tool.py checks the list.
CONTEXT = (
    "Dockerfile",
    ".dockerignore",
    "requirements/amp.lock",
    "requirements/build.lock",
    "setup.py",
    "amp",
    "twisted",
)


def revision() -> str:
    """The commit whose files the image is built from: the last one that
    changed anything of ``CONTEXT`` (a later commit that changed none of it
    packages the same bytes, and reuses the engine's cached layers);
    ``-dirty`` when the work tree's files there differ from it."""
    commit = _git("log", "-1", "--format=%H", "--", *CONTEXT)
    changed = _git("status", "--porcelain", "--untracked-files=normal", "--", *CONTEXT)
    return commit + ("-dirty" if changed else "")


def source_date_epoch() -> str:
    """The time of that commit."""
    return _git("log", "-1", "--format=%ct", "--", *CONTEXT)


def _answers(command: str) -> bool:
    try:
        return subprocess.run([command, "info"], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def engine() -> str:
    """The container engine's command: podman or docker, whichever runs."""
    wanted = os.environ.get("AMP_CONTAINER_ENGINE")
    tried = []
    for name in [wanted] if wanted else ["podman", "docker"]:
        path = shutil.which(name)
        if path is None:
            tried.append(f"{name}: not installed")
        elif not _answers(path):
            tried.append(f"{name}: `{name} info` fails (no engine running?)")
        else:
            return path
    raise EngineMissing(
        "no container engine runs here ("
        + "; ".join(tried)
        + "): `tools/install image` installs podman from the distribution's packages"
    )


def ulimits() -> list[str]:
    """Resource limits for every container: the engines' defaults (1048576
    open files) exceed what some machines allow even root, and the runtime
    then refuses to start the container.  The machine's own hard limit for
    open files (at most 65536) and 4096 processes, more than amp needs."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    files = 65536 if hard == resource.RLIM_INFINITY else min(hard, 65536)
    return ["--ulimit", f"nofile={files}:{files}", "--ulimit", "nproc=4096:4096"]


def build_ca() -> Optional[Path]:
    """The CA bundle pip inside the build must trust, where the host names one."""
    for name in ("AMP_BUILD_CA", "PIP_CERT", "SSL_CERT_FILE"):
        value = os.environ.get(name)
        if value and Path(value).is_file():
            return Path(value)
    return None


def build_command(command: str, tag: str, *, no_cache: bool = False) -> list[str]:
    """The engine's build command line for ``tag`` from this checkout."""
    labels = {"version": version(), "revision": revision(), "title": "amp"}
    args = [
        command,
        "build",
        "--tag",
        tag,
        "--file",
        str(DOCKERFILE),
        "--build-arg",
        f"SOURCE_DATE_EPOCH={source_date_epoch()}",
        *ulimits(),
    ]
    for key, value in labels.items():
        args += ["--label", f"{LABEL_PREFIX}{key}={value}"]
    if Path(command).name == "podman":
        # OCI annotations on the manifest too (Docker's classic builder has none).
        for key, value in labels.items():
            args += ["--annotation", f"{LABEL_PREFIX}{key}={value}"]
    ca = build_ca()
    if ca is not None:
        args += ["--secret", f"id={BUILD_CA_SECRET},src={ca}", "--build-arg", f"PIP_CERT={BUILD_CA_PATH}"]
    if no_cache:
        args.append("--no-cache")
    return [*args, str(ROOT)]


def build(tag: Optional[str] = None, *, no_cache: bool = False, quiet: bool = False) -> float:
    """Build the image; returns the seconds it took."""
    command = engine()
    args = build_command(command, tag or image_name(), no_cache=no_cache)
    started = time.monotonic()
    result = subprocess.run(args, cwd=ROOT, capture_output=quiet, text=True)
    if result.returncode != 0:
        raise RuntimeError(
            f"{' '.join(args)} exited {result.returncode}"
            + (f"\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}" if quiet else "")
        )
    return time.monotonic() - started


def inspect(tag: Optional[str] = None) -> dict:
    out = subprocess.run(
        [engine(), "image", "inspect", tag or image_name()], capture_output=True, text=True, check=True
    ).stdout
    return json.loads(out)[0]


# ---------------------------------------------------------------- the files inside


class Entry(NamedTuple):
    """One path of the image's filesystem, all but its times."""

    kind: str  # f(ile), d(ir), l(ink), h(ardlink), o(ther)
    mode: int
    uid: int
    gid: int
    size: int
    digest: str  # sha256 of a file's content, a link's target


def read_filesystem(stream: IO[bytes]) -> dict[str, Entry]:
    """Every path of a filesystem tar stream (``<engine> export``) with its
    kind, mode, owner and content digest; modification times are left out."""
    entries: dict[str, Entry] = {}
    with tarfile.open(fileobj=stream, mode="r|") as tar:
        for member in tar:
            name = "/" + member.name.lstrip("./").rstrip("/")
            if member.isreg():
                fileobj = tar.extractfile(member)
                assert fileobj is not None
                digest = hashlib.sha256()
                for chunk in iter(partial(fileobj.read, 1 << 20), b""):
                    digest.update(chunk)
                entry = Entry("f", member.mode, member.uid, member.gid, member.size, digest.hexdigest())
            elif member.isdir():
                entry = Entry("d", member.mode, member.uid, member.gid, 0, "")
            elif member.issym():
                entry = Entry("l", member.mode, member.uid, member.gid, 0, member.linkname)
            elif member.islnk():
                entry = Entry("h", member.mode, member.uid, member.gid, 0, "/" + member.linkname.lstrip("./"))
            else:
                entry = Entry("o", member.mode, member.uid, member.gid, 0, "")
            entries[name] = entry
    return entries


def filesystem(tag: Optional[str] = None) -> dict[str, Entry]:
    """The image's files, read from a container created (never started) from it."""
    command = engine()
    container = (
        subprocess.run([command, "create", tag or image_name()], capture_output=True, text=True, check=True)
        .stdout.strip()
        .splitlines()[-1]
    )
    try:
        export = subprocess.Popen([command, "export", container], stdout=subprocess.PIPE)
        assert export.stdout is not None
        try:
            return read_filesystem(export.stdout)
        finally:
            export.stdout.close()
            if export.wait() != 0:
                raise RuntimeError(f"{command} export {container} exited {export.returncode}")
    finally:
        subprocess.run([command, "rm", "--force", container], capture_output=True)


#: What two builds of one commit may differ in: when they were made, and
#: what names or hashes their dated layers or where the engine stores them.
NOT_COMPARED = (
    "Created",
    "Id",
    "Digest",
    "RepoDigests",
    "RepoTags",
    "History",
    "NamesHistory",
    "Parent",
    "Size",
    "VirtualSize",
    "Metadata",
    "RootFS",
    "GraphDriver",
)


def config_without_times(inspected: dict) -> dict:
    """``image inspect`` with what names or dates the build left out (the ids
    and digests hash the dated layers); what the image runs with stays."""
    config = {k: v for k, v in inspected.items() if k not in NOT_COMPARED}
    for key in ("Config", "ContainerConfig"):
        if isinstance(config.get(key), dict):
            config[key] = {k: v for k, v in config[key].items() if k not in ("Image", "Hostname")}
    # buildah's digest of the base's manifest as it wrote it for this build:
    # two builds on one local base image get two (the base's name stays compared).
    if isinstance(config.get("Annotations"), dict):
        config["Annotations"] = {
            k: v for k, v in config["Annotations"].items() if k != "org.opencontainers.image.base.digest"
        }
    return config


def differences(first: dict[str, Entry], second: dict[str, Entry]) -> list[str]:
    """What differs between two filesystems (times never do, having been left out)."""
    out = []
    for path in sorted(first.keys() | second.keys()):
        a, b = first.get(path), second.get(path)
        if a != b:
            out.append(f"{path}: {a} != {b}" if a and b else f"{path}: only in the {'first' if a else 'second'}")
    return out


def reproducible() -> list[str]:
    """Build the image (cached), then again without the cache under another
    tag, and compare the two: the files (content, mode, owner) and
    the configuration, times apart.  Returns the differences."""
    tag = image_name()
    build(tag, quiet=True)  # of this commit (cached layers: what `make image` made)
    again = "amp:reproducible-check"
    seconds = build(again, no_cache=True, quiet=True)
    print(f"tools/image: built {again} without cache in {seconds:.1f} s", file=sys.stderr)
    try:
        found = differences(filesystem(tag), filesystem(again))
        a, b = config_without_times(inspect(tag)), config_without_times(inspect(again))
        for key in sorted(a.keys() | b.keys()):
            if a.get(key) != b.get(key):
                found.append(f"image config {key}: {a.get(key)!r} != {b.get(key)!r}")
        return found
    finally:
        subprocess.run([engine(), "rmi", again], capture_output=True)


# ---------------------------------------------------------------- what must not be inside

#: Paths that must not be in the image: compilers, package-manager caches,
#: the repository's tests and benchmarks.  Each is a regular expression on
#: the absolute path.
FORBIDDEN = {
    "a C compiler": re.compile(r"^/usr/(local/)?bin/(cc|gcc|c\+\+|g\+\+|clang|x86_64-linux-gnu-gcc)(-[0-9.]+)?$"),
    "pip's cache": re.compile(r"^/(root|home/[^/]+)/\.cache/pip(/|$)"),
    "apt's package cache": re.compile(r"^/var/cache/apt/archives/[^/]+\.deb$"),
    "apt's package lists": re.compile(r"^/var/lib/apt/lists/[^/]+_(Packages|Release|InRelease|Sources)"),
    "the build's sources or wheels": re.compile(r"^/(src|wheels|opt/build)(/|$)"),
    "the build's CA bundle": re.compile("^" + re.escape(BUILD_CA_PATH) + "$"),
    "amp's tests": re.compile(r"/site-packages/tests(/|$)"),
    "amp's benchmarks": re.compile(r"/site-packages/bench(/|$)"),
    "the example endpoints": re.compile(r"/site-packages/amp_(examples|dev)(/|$)"),
}


def forbidden(paths: Iterator[str] | list[str]) -> dict[str, list[str]]:
    """The forbidden paths among ``paths``, by what they are."""
    found: dict[str, list[str]] = {}
    for path in paths:
        for what, pattern in FORBIDDEN.items():
            if pattern.search(path):
                found.setdefault(what, []).append(path)
    return found


# ---------------------------------------------------------------- SBOM


def tools_dir() -> Path:
    return Path(os.environ.get("AMP_TOOLS") or Path.home() / ".cache" / "amp-tools")


def cyclonedx_dir() -> Path:
    return tools_dir() / "cyclonedx"


#: Runs cyclonedx-py from a read-only mount without putting it on the
#: analysed interpreter's path (PYTHONPATH would be inherited and list the
#: tool's own packages).
_SBOM_SCRIPT = (
    "import runpy, sys; sys.path.insert(0, '/sbom-tool'); "
    "sys.argv = ['cyclonedx-py', 'environment', '/opt/amp/bin/python', '--output-format', 'JSON', "
    "'--output-reproducible', '--mc-type', 'application']; "
    "runpy.run_module('cyclonedx_py', run_name='__main__')"
)


def sbom(tag: Optional[str] = None) -> dict:
    """A CycloneDX SBOM of the image's Python environment (/opt/amp), made by
    cyclonedx-py run with the image's own interpreter, in a container as
    locked down as the chart's (read-only, no network, no capabilities)."""
    tool = cyclonedx_dir()
    if not (tool / "cyclonedx_py").is_dir():
        raise RuntimeError(f"cyclonedx-py is not installed in {tool}: run `tools/install image`")
    result = subprocess.run(
        [
            engine(),
            "run",
            "--rm",
            "--read-only",
            "--network",
            "none",
            "--cap-drop",
            "ALL",
            "--security-opt",
            "no-new-privileges",
            "--user",
            "65532:65532",
            *ulimits(),
            "--volume",
            f"{tool}:/sbom-tool:ro",
            "--entrypoint",
            "python",
            tag or image_name(),
            "-I",
            "-c",
            _SBOM_SCRIPT,
        ],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise RuntimeError(f"cyclonedx-py in the image exited {result.returncode}:\n{result.stderr[-4000:]}")
    return json.loads(result.stdout)


def sbom_packages(document: dict) -> dict[str, str]:
    """The SBOM's components, normalised name -> version."""
    return {normalise(c["name"]): c["version"] for c in document.get("components", [])}


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def locked(path: Path) -> dict[str, str]:
    """A hashed lock's pins, normalised name -> version."""
    pins = {}
    for line in path.read_text().splitlines():
        found = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)", line)
        if found:
            pins[normalise(found.group(1))] = found.group(2)
    return pins


# ---------------------------------------------------------------- command line


def main(argv: list[str]) -> int:
    what = argv[0] if argv else "build"
    try:
        if what == "build":
            seconds = build()
            labels = inspect().get("Labels") or inspect().get("Config", {}).get("Labels") or {}
            print(
                f"tools/image: built {image_name()} in {seconds:.1f} s "
                f"(revision {labels.get(LABEL_PREFIX + 'revision')})",
                file=sys.stderr,
            )
        elif what == "reproducible":
            found = reproducible()
            if found:
                print("tools/image: two builds of this commit differ beyond their times:", file=sys.stderr)
                print("\n".join(found[:50]), file=sys.stderr)
                return 1
            print("tools/image: a build without cache has the same files and configuration", file=sys.stderr)
        elif what == "sbom":
            document = sbom()
            text = json.dumps(document, indent=2, sort_keys=True) + "\n"
            if len(argv) > 1:
                Path(argv[1]).write_text(text)
            else:
                sys.stdout.write(text)
            print(f"tools/image: SBOM lists {len(document.get('components', []))} Python packages", file=sys.stderr)
        elif what == "contents":
            found = forbidden(filesystem())
            for what_, paths in found.items():
                print(f"tools/image: {what_}: {', '.join(paths[:5])}", file=sys.stderr)
            return 1 if found else 0
        else:
            print(__doc__, file=sys.stderr)
            return 2
    except (EngineMissing, RuntimeError, subprocess.CalledProcessError) as e:
        print(f"tools/image: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
