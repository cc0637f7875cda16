"""
The checks of tools/image.py that need no container engine: the
reproducibility comparison sees content, modes and owners but not times;
the forbidden-files check finds what it names; the lock reader and the
build's command line.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

from tests.support.imagerun import ROOT, imagetool


def _tar(files: dict[str, tuple[bytes, int, int]]) -> io.BytesIO:
    """A filesystem tar: path -> (content, mode, mtime)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, (data, mode, mtime) in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, mtime
            tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("opt/amp/bin/python")
        link.type, link.linkname = tarfile.SYMTYPE, "/usr/bin/python3.13"
        tar.addfile(link)
    out.seek(0)
    return out


def test_two_builds_differing_only_in_times_are_the_same() -> None:
    first = imagetool.read_filesystem(_tar({"opt/amp/a.py": (b"x = 1\n", 0o644, 1000)}))
    second = imagetool.read_filesystem(_tar({"opt/amp/a.py": (b"x = 1\n", 0o644, 2000)}))
    assert imagetool.differences(first, second) == []
    assert first["/opt/amp/bin/python"].digest == "/usr/bin/python3.13"


def test_a_difference_in_content_mode_or_files_is_named() -> None:
    base = imagetool.read_filesystem(_tar({"opt/amp/a.py": (b"x = 1\n", 0o644, 1000)}))
    content = imagetool.read_filesystem(_tar({"opt/amp/a.py": (b"x = 2\n", 0o644, 1000)}))
    mode = imagetool.read_filesystem(_tar({"opt/amp/a.py": (b"x = 1\n", 0o755, 1000)}))
    extra = imagetool.read_filesystem(
        _tar({"opt/amp/a.py": (b"x = 1\n", 0o644, 1000), "opt/amp/b.py": (b"", 0o644, 1000)})
    )
    for other in (content, mode):
        [line] = imagetool.differences(base, other)
        assert line.startswith("/opt/amp/a.py: ")
    assert imagetool.differences(base, extra) == ["/opt/amp/b.py: only in the second"]


def test_the_config_comparison_keeps_what_the_image_runs_with() -> None:
    inspected = {
        "Id": "sha256:1",
        "Created": "2026-11-28T22:00:00Z",
        "GraphDriver": {"Data": "/var/lib/x"},
        "Config": {"User": "65532:65532", "Cmd": ["--config", "/etc/amp/amp.yaml"], "Hostname": "h"},
        "Labels": {"org.opencontainers.image.revision": "abc"},
        "Annotations": {
            "org.opencontainers.image.base.digest": "sha256:2",
            "org.opencontainers.image.base.name": "localhost/python:3.13-slim",
        },
    }
    assert imagetool.config_without_times(inspected) == {
        "Config": {"User": "65532:65532", "Cmd": ["--config", "/etc/amp/amp.yaml"]},
        "Labels": {"org.opencontainers.image.revision": "abc"},
        "Annotations": {"org.opencontainers.image.base.name": "localhost/python:3.13-slim"},
    }


def test_the_forbidden_check_finds_what_it_looks_for() -> None:
    found = imagetool.forbidden(
        [
            "/usr/bin/gcc-14",
            "/root/.cache/pip/http/x",
            "/var/cache/apt/archives/a_1.deb",
            "/opt/amp/lib/python3.13/site-packages/tests/test_x.py",
            "/wheels/amp.whl",
            "/usr/bin/python3",
            "/var/lib/apt/lists/lock",
            "/run/secrets/build-ca",
            "/opt/amp/lib/python3.13/site-packages/bench/run.py",
        ]
    )
    assert {what: sorted(paths) for what, paths in found.items()} == {
        "a C compiler": ["/usr/bin/gcc-14"],
        "pip's cache": ["/root/.cache/pip/http/x"],
        "apt's package cache": ["/var/cache/apt/archives/a_1.deb"],
        "amp's tests": ["/opt/amp/lib/python3.13/site-packages/tests/test_x.py"],
        "amp's benchmarks": ["/opt/amp/lib/python3.13/site-packages/bench/run.py"],
        "the build's sources or wheels": ["/wheels/amp.whl"],
        "the build's CA bundle": ["/run/secrets/build-ca"],
    }


def test_the_lock_reader_reads_every_pin() -> None:
    pins = imagetool.locked(ROOT / "requirements" / "amp.lock")
    lines = [line for line in (ROOT / "requirements" / "amp.lock").read_text().splitlines() if line[:1].isalnum()]
    assert len(pins) == len(lines) and pins["twisted"] and pins["cffi"]


def test_the_build_passes_the_revision_the_time_and_the_ca_as_a_secret(tmp_path: Path, monkeypatch) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    monkeypatch.setenv("AMP_BUILD_CA", str(ca))
    args = imagetool.build_command("/usr/bin/podman", "amp:test")
    joined = " ".join(args)
    assert f"--label org.opencontainers.image.revision={imagetool.revision()}" in joined
    assert f"--annotation org.opencontainers.image.version={imagetool.version()}" in joined
    assert f"--build-arg SOURCE_DATE_EPOCH={imagetool.source_date_epoch()}" in joined
    assert f"--secret id=build-ca,src={ca}" in joined and "--build-arg PIP_CERT=/run/secrets/build-ca" in joined
    assert "--volume" not in args, "a mounted file would leave its mount point in a layer"
    assert args[-1] == str(ROOT)


def test_the_revision_names_the_last_commit_of_what_the_image_is_built_from() -> None:
    """The build context is what .dockerignore lets through and the
    Dockerfile: a file the build copies that is outside CONTEXT would leave
    a change to it out of the revision."""
    from tests.support.repo_files import stages

    copied = [args.split()[0] for ins, args in stages()[0] if ins == "COPY"]
    assert sorted(imagetool.CONTEXT) == sorted(["Dockerfile", ".dockerignore", *copied])
    allowed = [
        line[1:].rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines() if line.startswith("!")
    ]
    assert sorted(allowed) == sorted(copied)
