"""Builds the Kubernetes programs the end-to-end tests run.

This module owns turning the small Go modules beside it into binaries in a
cache directory, and deciding when a cached binary can be reused:

- ``go.mod`` here: kube-apiserver (every e2e test);
- ``etcd/go.mod``: etcd (every e2e test);
- ``kube-controllers/go.mod``: kube-controller-manager and kube-scheduler,
  from the same ``k8s.io/kubernetes`` release as kube-apiserver (a module of
  its own, so that adding them never invalidates a cached kube-apiserver;
  ``build`` refuses a release that differs from ``go.mod``'s);
- ``kwok/go.mod``: kwok, the kubelet of fake nodes, so that scheduled Pods
  become Ready and Jobs' Pods complete; its Stage definitions (node
  initialise, Pod ready, complete, delete) are copied from the module into
  ``kwok-stages.yaml`` beside the binary.

The controllers (the last two) are only for the tests that need them:
``build`` makes the first two, ``build_controllers`` the others, and
running this file makes all of them.

The versions live in the go.mod files only; this module reads them from there.
The cache is ``$AMP_E2E_CACHE/<kubernetes-version>/`` (``AMP_E2E_CACHE``
defaults to ``~/.cache/amp-e2e``). Each binary has a ``.stamp`` file beside it
holding a digest of the go.mod and go.sum it was built from; a binary whose
stamp matches is reused without running Go at all, so a warm run costs
nothing. A cold build fetches the modules from the Go module proxy and
compiles with at most two parallel jobs (the size of the CI machine).

Run it directly to build ahead of the tests:

    python tests/e2e/build.py

Standard library only.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Mapping

HERE = Path(__file__).resolve().parent
KUBE_MODULE_DIR = HERE
ETCD_MODULE_DIR = HERE / "etcd"
CONTROLLERS_MODULE_DIR = HERE / "kube-controllers"
KWOK_MODULE_DIR = HERE / "kwok"
KUBE_APISERVER_PACKAGE = "k8s.io/kubernetes/cmd/kube-apiserver"
KUBE_CONTROLLER_MANAGER_PACKAGE = "k8s.io/kubernetes/cmd/kube-controller-manager"
KUBE_SCHEDULER_PACKAGE = "k8s.io/kubernetes/cmd/kube-scheduler"
ETCD_PACKAGE = "go.etcd.io/etcd/server/v3"
KWOK_MODULE = "sigs.k8s.io/kwok"
KWOK_PACKAGE = "sigs.k8s.io/kwok/cmd/kwok"
#: The Stages kwok plays, from its module (``kustomize/stage/...``): nodes
#: become Ready at once; Pods become Ready, Jobs' Pods complete, and deleted
#: Pods go away (there is no kubelet to finish a graceful deletion).
KWOK_STAGES = (
    "kustomize/stage/node/fast/node-initialize.yaml",
    "kustomize/stage/pod/fast/pod-ready.yaml",
    "kustomize/stage/pod/fast/pod-complete.yaml",
    "kustomize/stage/pod/fast/pod-delete.yaml",
)
MINIMUM_GO = (1, 26)
CACHE_ENV = "AMP_E2E_CACHE"


class BuildError(RuntimeError):
    """A binary could not be built; the message says what is missing."""


@dataclasses.dataclass(frozen=True)
class Binaries:
    """Paths of the built programs and the versions they were built from."""

    kube_apiserver: Path
    etcd: Path
    kubernetes_version: str
    etcd_version: str


@dataclasses.dataclass(frozen=True)
class ControllerBinaries:
    """Paths of the controllers' programs (see ``build_controllers``)."""

    kube_controller_manager: Path
    kube_scheduler: Path
    kwok: Path
    kwok_stages: Path
    kwok_version: str


def required_version(module_dir: Path, module: str) -> str:
    """The version of ``module`` that ``module_dir/go.mod`` requires."""
    text = (module_dir / "go.mod").read_text()
    match = re.search(r"^\s*(?:require\s+)?" + re.escape(module) + r"\s+(v\S+)", text, re.M)
    if match is None:
        raise BuildError(f"{module_dir / 'go.mod'} does not require {module}")
    return match.group(1)


def kubernetes_version() -> str:
    """The Kubernetes release the tests run, e.g. ``v1.37.1``."""
    return required_version(KUBE_MODULE_DIR, "k8s.io/kubernetes")


def etcd_version() -> str:
    """The etcd release the tests run, e.g. ``v3.7.0``."""
    return required_version(ETCD_MODULE_DIR, ETCD_PACKAGE)


def kwok_version() -> str:
    """The kwok release the controller tests run, e.g. ``v0.8.0``."""
    return required_version(KWOK_MODULE_DIR, KWOK_MODULE)


def cache_dir() -> Path:
    """Where the binaries for the pinned Kubernetes version are kept."""
    root = os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "amp-e2e")
    return Path(root) / kubernetes_version()


def find_go() -> str | None:
    """The ``go`` executable on PATH, or None."""
    return shutil.which("go")


def _module_digest(module_dir: Path) -> str:
    digest = hashlib.sha256()
    for name in ("go.mod", "go.sum"):
        digest.update(name.encode())
        digest.update((module_dir / name).read_bytes())
    return digest.hexdigest()


def _is_current(binary: Path, module_dir: Path) -> bool:
    stamp = binary.with_name(binary.name + ".stamp")
    if not (binary.is_file() and os.access(binary, os.X_OK) and stamp.is_file()):
        return False
    return stamp.read_text().strip() == _module_digest(module_dir)


def _go_env() -> dict[str, str]:
    env = dict(os.environ)
    env["GOMAXPROCS"] = "2"
    # Never let Go fetch a different toolchain behind our back: a too old Go
    # must fail with a message saying so.
    env["GOTOOLCHAIN"] = "local"
    env["CGO_ENABLED"] = "0"
    flags = env.get("GOFLAGS", "").split()
    flags = [f for f in flags if not f.startswith("-mod=")]
    env["GOFLAGS"] = " ".join(flags + ["-mod=mod", "-buildvcs=false"])
    return env


def _go_version(go: str) -> tuple[int, int]:
    out = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True, env=_go_env())
    match = re.match(r"go(\d+)\.(\d+)", out.stdout.strip())
    if out.returncode != 0 or match is None:
        raise BuildError(f"could not ask {go} for its version: {out.stderr.strip() or out.stdout.strip()}")
    return int(match.group(1)), int(match.group(2))


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


_FETCH_FAILURE = re.compile(
    r"(reading https?://|dial tcp|no such host|403 Forbidden|404 Not Found|"
    r"410 Gone|TLS handshake|i/o timeout|connection refused|"
    r"module lookup disabled|verifying .*: checksum mismatch)"
)


def _run_go(args: list[str], module_dir: Path, log_path: Path, what: str, phase: str) -> None:
    with open(log_path, "ab") as log:
        log.write(f"$ (cd {module_dir} && {' '.join(args)})\n".encode())
        log.flush()
        result = subprocess.run(
            args,
            cwd=module_dir,
            env=_go_env(),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    if result.returncode == 0:
        return
    tail = _tail(log_path)
    if phase == "fetch" or _FETCH_FAILURE.search(tail):
        raise BuildError(
            f"fetching the Go modules for {what} failed: the module proxy "
            f"(GOPROXY={_go_env().get('GOPROXY') or 'default'}) could not be reached or "
            f"does not serve a required module version. Full log: {log_path}\n{tail}"
        )
    raise BuildError(f"compiling {what} failed. Full log: {log_path}\n{tail}")


def _build_one(
    go: str,
    module_dir: Path,
    package: str,
    target: Path,
    what: str,
    say: Callable[[str], None],
    also: Callable[[], None] | None = None,
) -> None:
    if _is_current(target, module_dir):
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    log_path = target.with_name(target.name + ".build.log")
    log_path.write_bytes(b"")
    started = time.monotonic()
    say(f"amp-e2e: fetching Go modules for {what}")
    _run_go(
        [go, "list", "-deps", "-mod=mod", package],
        module_dir,
        log_path,
        what,
        "fetch",
    )
    say(f"amp-e2e: compiling {what} (this takes several minutes on a cold cache)")
    fd, tmp_name = tempfile.mkstemp(prefix=target.name + ".", dir=target.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        _run_go(
            [
                go,
                "build",
                "-mod=mod",
                "-p",
                "2",
                "-trimpath",
                "-ldflags=-s -w",
                "-o",
                str(tmp),
                package,
            ],
            module_dir,
            log_path,
            what,
            "compile",
        )
        tmp.chmod(0o755)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()
    if also is not None:
        also()
    target.with_name(target.name + ".stamp").write_text(_module_digest(module_dir) + "\n")
    say(f"amp-e2e: built {target} in {time.monotonic() - started:.0f}s")


def _no_go_reason() -> str:
    return (
        "Go is not installed (no `go` on PATH): the e2e tests build "
        f"kube-apiserver {kubernetes_version()} and etcd {etcd_version()} from "
        "source and need Go >= %d.%d" % MINIMUM_GO
    )


def go_missing_outcome(environ: Mapping[str, str], go: str | None, have_binaries: bool) -> tuple[str, str] | None:
    """What a test run does about Go: None when it can go ahead (Go is on
    PATH, or the binaries are already cached), ``("skip", reason)`` on a
    developer machine without Go, ``("fail", reason)`` when ``CI=true``,
    because CI must never skip the end-to-end tests silently.
    """
    if go is not None or have_binaries:
        return None
    reason = _no_go_reason()
    if environ.get("CI") == "true":
        return ("fail", reason + "; CI=true, so the e2e tests fail instead of skipping")
    return ("skip", reason)


def binaries_present(cache: Path | None = None) -> bool:
    """True when both binaries are cached and match the current go.mod files."""
    cache = cache or cache_dir()
    return _is_current(cache / "kube-apiserver", KUBE_MODULE_DIR) and _is_current(cache / "etcd", ETCD_MODULE_DIR)


def controllers_present(cache: Path | None = None) -> bool:
    """True when the controllers' programs are cached and current."""
    cache = cache or cache_dir()
    return (
        _is_current(cache / "kube-controller-manager", CONTROLLERS_MODULE_DIR)
        and _is_current(cache / "kube-scheduler", CONTROLLERS_MODULE_DIR)
        and _is_current(cache / "kwok", KWOK_MODULE_DIR)
        and (cache / "kwok-stages.yaml").is_file()
    )


def _usable_go() -> str:
    go = find_go()
    if go is None:
        raise BuildError(_no_go_reason())
    version = _go_version(go)
    if version < MINIMUM_GO:
        raise BuildError(
            "Go %d.%d is too old: kube-apiserver %s needs Go >= %d.%d"
            % (version + (kubernetes_version(),) + MINIMUM_GO)
        )
    return go


def _module_dir_of(go: str, module_dir: Path, module: str) -> Path:
    """Where the Go module cache holds ``module`` as ``module_dir`` requires it."""
    out = subprocess.run(
        [go, "list", "-m", "-f", "{{.Dir}}", module],
        cwd=module_dir,
        env=_go_env(),
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    if out.returncode != 0 or not out.stdout.strip():
        raise BuildError(f"could not find {module} in the Go module cache: {out.stderr.strip()}")
    return Path(out.stdout.strip())


def kwok_stages_text(module_root: Path) -> str:
    """The Stages of ``KWOK_STAGES`` from kwok's module, as one YAML stream."""
    parts = []
    for relative in KWOK_STAGES:
        path = module_root / relative
        if not path.is_file():
            raise BuildError(f"kwok's module has no {relative} (looked in {module_root})")
        parts.append(path.read_text().strip() + "\n")
    return "---\n".join(parts)


def same_kubernetes_release() -> None:
    """Raise BuildError unless kube-controllers/go.mod pins go.mod's release."""
    wanted = kubernetes_version()
    have = required_version(CONTROLLERS_MODULE_DIR, "k8s.io/kubernetes")
    if have != wanted:
        raise BuildError(
            f"{CONTROLLERS_MODULE_DIR / 'go.mod'} requires k8s.io/kubernetes {have} but "
            f"kube-apiserver is built from {wanted} ({KUBE_MODULE_DIR / 'go.mod'}): "
            "change both and run `go mod tidy` in each"
        )


def build_controllers(cache: Path | None = None, say: Callable[[str], None] | None = None) -> ControllerBinaries:
    """Build (or reuse) kube-controller-manager, kube-scheduler and kwok.

    Raises BuildError as ``build`` does, and when the controllers' module
    pins another Kubernetes release than kube-apiserver's.
    """
    cache = cache or cache_dir()
    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    same_kubernetes_release()
    binaries = ControllerBinaries(
        cache / "kube-controller-manager",
        cache / "kube-scheduler",
        cache / "kwok",
        cache / "kwok-stages.yaml",
        kwok_version(),
    )
    if controllers_present(cache):
        return binaries
    go = _usable_go()
    release = kubernetes_version()
    for target, package in (
        (binaries.kube_controller_manager, KUBE_CONTROLLER_MANAGER_PACKAGE),
        (binaries.kube_scheduler, KUBE_SCHEDULER_PACKAGE),
    ):
        _build_one(go, CONTROLLERS_MODULE_DIR, package, target, f"{target.name} {release}", say)

    def stages() -> None:
        root = _module_dir_of(go, KWOK_MODULE_DIR, KWOK_MODULE)
        binaries.kwok_stages.write_text(kwok_stages_text(root))

    _build_one(go, KWOK_MODULE_DIR, KWOK_PACKAGE, binaries.kwok, f"kwok {binaries.kwok_version}", say, stages)
    if not binaries.kwok_stages.is_file():  # a current binary whose Stages were removed
        stages()
    return binaries


def build(cache: Path | None = None, say: Callable[[str], None] | None = None) -> Binaries:
    """Build (or reuse) kube-apiserver and etcd; return their paths.

    Raises BuildError with a message naming what is missing when Go is absent
    or too old, when a module cannot be fetched, or when compiling fails.
    """
    cache = cache or cache_dir()
    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    kube = cache / "kube-apiserver"
    etcd = cache / "etcd"
    binaries = Binaries(kube, etcd, kubernetes_version(), etcd_version())
    if binaries_present(cache):
        return binaries
    go = _usable_go()
    _build_one(go, ETCD_MODULE_DIR, ETCD_PACKAGE, etcd, f"etcd {etcd_version()}", say)
    _build_one(
        go,
        KUBE_MODULE_DIR,
        KUBE_APISERVER_PACKAGE,
        kube,
        f"kube-apiserver {kubernetes_version()}",
        say,
    )
    return binaries


def main() -> int:
    started = time.monotonic()
    try:
        binaries = build()
        controllers = build_controllers()
    except BuildError as exc:
        print(f"amp-e2e: {exc}", file=sys.stderr)
        return 1
    for path in (
        binaries.kube_apiserver,
        binaries.etcd,
        controllers.kube_controller_manager,
        controllers.kube_scheduler,
        controllers.kwok,
    ):
        print(path)
    print(
        f"amp-e2e: kube-apiserver, kube-controller-manager and kube-scheduler "
        f"{binaries.kubernetes_version}, etcd {binaries.etcd_version}, kwok "
        f"{controllers.kwok_version} ready in {time.monotonic() - started:.1f}s",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
