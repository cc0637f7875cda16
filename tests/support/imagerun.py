"""
amp's image as the Helm chart runs it, for the container tests
(tests/integration/deploy/test_image.py, tests/e2e/test_image.py).

This module owns: loading ``tools/image.py`` (the engine, the image's name,
the build and the checks of what is inside, as ``make image`` uses them);
building the image once per test session (layers cached: seconds when
nothing changed; a file lock keeps pytest-xdist workers from building at
once); what the chart's Deployment says about amp's container
(L{ChartContainer}, read from the chart's render in
``deploy/base/deployment.yaml``, which tests/integration/deploy/test_deploy.py keeps equal to
a fresh ``helm template``, and tests/integration/deploy/test_image_chart.py compares with the
chart itself), the engine's flags that enforce it (L{run_flags}), amp's
mounted config volume laid out as the kubelet lays out a projected volume
(L{ConfigVolume}), and one running container (L{Container}).

Waiting on a container is polling by nature: every wait is
L{tests.support.waiting.poll_until} with a deadline that fails with the
container's log.
"""

from __future__ import annotations

import fcntl
import http.client
import json
import os
import shlex
import ssl
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional

import pytest
import yaml
from cryptography.hazmat.primitives.serialization import Encoding

from amp_dev.devcert import issue_cert, make_ca, pem_cert, pem_key
from tests.support.helpers import SecretVolume
from tests.support.waiting import poll_until
from tools import image as imagetool  # tools/image.py, as `make image` runs it

ROOT = Path(__file__).resolve().parents[2]
DEPLOYMENT = ROOT / "deploy" / "base" / "deployment.yaml"
#: Where the example endpoint listens, inside amp's network namespace.
EXAMPLE_PORT = 8090
#: The static namespace whose Pods go to the example endpoint.
NAMESPACE = "team-a"


def require_engine() -> str:
    """The container engine, or the test is skipped saying why (failed
    when ``CI=true``: there the set-up step must have provided one)."""
    try:
        return str(imagetool.engine())
    except imagetool.EngineMissing as e:
        reason = f"{e}; `make tools` runs it"
        if os.environ.get("CI") == "true":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)


def built_image() -> str:
    """amp's image built from this checkout (``make image``), once per
    process; the engine's layer cache makes a build with nothing changed
    take seconds."""
    require_engine()
    global _built
    if _built is None:
        lock_dir = imagetool.tools_dir()
        lock_dir.mkdir(parents=True, exist_ok=True)
        with open(lock_dir / "image-build.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                imagetool.build(quiet=True)
            except RuntimeError as e:
                pytest.fail(f"make image failed: {e}", pytrace=False)
        _built = imagetool.image_name()
    return _built


_built: Optional[str] = None


# ---------------------------------------------------------------- the chart's container


@dataclass(frozen=True)
class Probe:
    path: str
    port: int
    scheme: str


@dataclass(frozen=True)
class ChartContainer:
    """What the chart's Deployment sets for amp's container, as plain values."""

    command: tuple[str, ...]
    user: int
    group: int
    fs_group: int
    run_as_non_root: bool
    read_only_root: bool
    allow_privilege_escalation: bool
    privileged: bool
    capabilities_dropped: tuple[str, ...]
    capabilities_added: tuple[str, ...]
    seccomp: str
    ports: tuple[tuple[str, int], ...]  # (name, containerPort)
    readiness: Probe
    liveness: Probe
    config_mount: str  # where the projected config volume is mounted
    config_read_only: bool
    config_items: tuple[tuple[str, str], ...]  # (path in the volume, ConfigMap/Secret key)
    config_mode: int  # the volume's defaultMode
    writable: tuple[tuple[str, str], ...]  # (mountPath, sizeLimit) of memory emptyDirs
    termination_grace: int
    pre_stop: tuple[str, ...]  # the preStop hook's command, run in the container

    def port(self, name: str) -> int:
        return dict(self.ports)[name]

    @property
    def config_file(self) -> str:
        """The config file amp is started with (the command's ``--config``)."""
        return self.command[self.command.index("--config") + 1]


def _probe(spec: Mapping[str, Any], ports: Mapping[str, int]) -> Probe:
    get = spec["httpGet"]
    port = get["port"]
    return Probe(get["path"], ports[port] if isinstance(port, str) else int(port), get.get("scheme", "HTTP"))


def chart_container(deployment: Mapping[str, Any]) -> ChartContainer:
    """amp's container of ``deployment`` (the chart's Deployment)."""
    pod = deployment["spec"]["template"]["spec"]
    [container] = [c for c in pod["containers"] if c["name"] == "amp"]
    pod_security = pod.get("securityContext") or {}
    security = {**pod_security, **(container.get("securityContext") or {})}
    ports = {p["name"]: int(p["containerPort"]) for p in container["ports"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    config_mount = config_read_only = None
    items: list[tuple[str, str]] = []
    mode = 0o644
    writable = []
    for mount in container["volumeMounts"]:
        volume = volumes[mount["name"]]
        if "projected" in volume:
            config_mount, config_read_only = mount["mountPath"], bool(mount.get("readOnly"))
            mode = int(volume["projected"].get("defaultMode", 0o644))
            for source in volume["projected"]["sources"]:
                kind = "configMap" if "configMap" in source else "secret"
                items += [(i["path"], f"{kind}:{i['key']}") for i in source[kind]["items"]]
        elif "emptyDir" in volume:
            assert volume["emptyDir"].get("medium") == "Memory", f"{mount['name']}: expected a memory emptyDir"
            writable.append((mount["mountPath"], str(volume["emptyDir"]["sizeLimit"])))
        else:
            raise AssertionError(f"volume {mount['name']}: neither projected nor emptyDir; teach chart_container")
    assert config_mount is not None, "the Deployment mounts no projected config volume"
    return ChartContainer(
        command=tuple(container["command"]) + tuple(container.get("args") or ()),
        user=int(security["runAsUser"]),
        group=int(security["runAsGroup"]),
        fs_group=int(pod_security["fsGroup"]),
        run_as_non_root=bool(security.get("runAsNonRoot")),
        read_only_root=bool(security.get("readOnlyRootFilesystem")),
        allow_privilege_escalation=bool(security.get("allowPrivilegeEscalation", True)),
        privileged=bool(security.get("privileged")),
        capabilities_dropped=tuple((security.get("capabilities") or {}).get("drop") or ()),
        capabilities_added=tuple((security.get("capabilities") or {}).get("add") or ()),
        seccomp=(security.get("seccompProfile") or {}).get("type", ""),
        ports=tuple(ports.items()),
        readiness=_probe(container["readinessProbe"], ports),
        liveness=_probe(container["livenessProbe"], ports),
        config_mount=config_mount,
        config_read_only=bool(config_read_only),
        config_items=tuple(items),
        config_mode=mode,
        writable=tuple(writable),
        termination_grace=int(pod["terminationGracePeriodSeconds"]),
        pre_stop=tuple(container["lifecycle"]["preStop"]["exec"]["command"]),
    )


def chart_deployment() -> dict[str, Any]:
    """The chart's Deployment as rendered into deploy/base (the one the
    container tests run)."""
    return yaml.safe_load(DEPLOYMENT.read_text())


def _size(limit: str) -> str:
    """A Kubernetes quantity (16Mi) as the engine's tmpfs size (16m)."""
    units = {"Ki": "k", "Mi": "m", "Gi": "g"}
    for suffix, unit in units.items():
        if limit.endswith(suffix):
            return limit[: -len(suffix)] + unit
    return limit


def run_flags(spec: ChartContainer) -> list[str]:
    """The engine's ``run`` flags that give a container what the chart's
    securityContext and volumes give the Pod.  The engine's own seccomp
    profile stands for RuntimeDefault; ``--read-only-tmpfs=false`` keeps
    podman from mounting writable /run, /tmp and /var/tmp that the chart
    does not have."""
    assert spec.run_as_non_root and spec.user != 0, "the chart runs amp as non-root"
    assert not spec.privileged and not spec.capabilities_added
    assert spec.seccomp == "RuntimeDefault"
    flags = ["--user", f"{spec.user}:{spec.group}", "--group-add", str(spec.fs_group)]
    if spec.read_only_root:
        flags += ["--read-only", "--read-only-tmpfs=false"]
    for capability in spec.capabilities_dropped:
        flags += ["--cap-drop", capability]
    if not spec.allow_privilege_escalation:
        flags += ["--security-opt", "no-new-privileges"]
    for path, size in spec.writable:
        flags += ["--tmpfs", f"{path}:rw,nosuid,nodev,size={_size(size)},mode=1777"]
    flags += ["--entrypoint", json.dumps(list(spec.command))]
    return flags + list(imagetool.ulimits())


# ---------------------------------------------------------------- the config volume


class ConfigVolume(SecretVolume):
    """amp's projected config volume as the kubelet writes it: the
    ConfigMap's amp.yaml and the Secret's tls.crt and tls.key at the
    chart's item paths, through a ``..data`` link that a swap renames
    atomically, with the volume's defaultMode and the Pod's fsGroup."""

    def __init__(self, directory: Path, spec: ChartContainer, sources: Mapping[str, bytes]) -> None:
        self.spec = spec
        super().__init__(directory, self._files(sources), mode=spec.config_mode, gid=spec.fs_group)

    def _files(self, sources: Mapping[str, bytes]) -> dict[str, bytes]:
        """``sources`` maps ``configMap:amp.yaml``/``secret:tls.crt`` keys to bytes."""
        return {path: sources[key] for path, key in self.spec.config_items}

    def swap_sources(self, sources: Mapping[str, bytes]) -> None:
        self.swap(self._files(sources))

    def in_container(self, source: str) -> str:
        """Where the item of ``source`` (``secret:tls.crt``) is inside the container."""
        [path] = [p for p, key in self.spec.config_items if key == source]
        return f"{self.spec.config_mount}/{path}"


# ---------------------------------------------------------------- a container


class Container:
    """One detached container of the engine, removed by L{remove}."""

    def __init__(self, name_hint: str, image: str, flags: list[str], args: Optional[list[str]] = None) -> None:
        self.engine = require_engine()
        self.name = f"amp-test-{name_hint}-{uuid.uuid4().hex[:8]}"
        self.image = image
        self.flags = flags
        self.args = args or []

    def start(self) -> "Container":
        command = [self.engine, "run", "--detach", "--name", self.name, *self.flags, self.image, *self.args]
        result = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            raise AssertionError(f"{shlex.join(command)} exited {result.returncode}:\n{result.stderr}")
        return self

    def state(self) -> dict[str, Any]:
        out = subprocess.run(
            [self.engine, "inspect", "--format", "{{json .State}}", self.name],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
        return json.loads(out)

    def running(self) -> bool:
        return bool(self.state().get("Running"))

    def host_port(self, container_port: int) -> int:
        out = subprocess.run(
            [self.engine, "port", self.name, f"{container_port}/tcp"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
        return int(out.strip().splitlines()[0].rsplit(":", 1)[1])

    def logs(self) -> str:
        result = subprocess.run([self.engine, "logs", self.name], capture_output=True, text=True, timeout=60)
        return result.stdout + result.stderr

    def describe(self) -> str:
        tail = "\n".join(self.logs().splitlines()[-40:])
        return f"--- container {self.name} ({self.image}) log tail ---\n{tail}"

    def exec(self, *command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([self.engine, "exec", self.name, *command], capture_output=True, text=True, timeout=60)

    def stop(self, grace: int) -> tuple[int, float]:
        """SIGTERM, as the kubelet sends it, then SIGKILL after ``grace``
        seconds; returns the exit status and the seconds it took to exit."""
        started = time.monotonic()
        subprocess.run(
            [self.engine, "stop", "--time", str(grace), self.name], capture_output=True, timeout=grace + 60, check=True
        )
        elapsed = time.monotonic() - started
        return int(self.state()["ExitCode"]), elapsed

    def remove(self) -> None:
        subprocess.run([self.engine, "rm", "--force", "--time", "0", self.name], capture_output=True, timeout=60)


def https_get(port: int, path: str, context: ssl.SSLContext, host: str = "127.0.0.1") -> tuple[int, bytes]:
    """GET over TLS on loopback; (0, error) when the connection fails."""
    connection = http.client.HTTPSConnection(host, port, timeout=3, context=context)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read()
    except (OSError, http.client.HTTPException) as e:
        return 0, str(e).encode()
    finally:
        connection.close()


def wait_answering(
    container: Container, port: int, probe: Probe, context: ssl.SSLContext, timeout: float = 60.0
) -> float:
    """Poll the probe's path until it answers 200, as the kubelet would;
    returns the seconds it took."""
    assert probe.scheme == "HTTPS"
    started = time.monotonic()
    last = [""]

    def answered() -> Optional[bool]:
        status, body = https_get(port, probe.path, context)
        if status == 200:
            return True
        if not container.running():
            raise AssertionError(f"the container exited during start-up\n{container.describe()}")
        last[0] = f"last answer: {status} {body[-300:]!r}"
        return None

    poll_until(
        f"{probe.path} of {container.name}", answered, timeout, details=lambda: f"{last[0]}\n{container.describe()}"
    )
    return time.monotonic() - started


# ---------------------------------------------------------------- amp and its endpoint, as the tests run them


class Certificates:
    """A CA and two serving certificates it signed for the published loopback port."""

    def __init__(self) -> None:
        ca, ca_key = make_ca("amp image test CA")
        self.ca_pem = pem_cert(ca)
        self.pairs = []
        for name in ("first", "second"):
            cert, key = issue_cert(ca, ca_key, f"amp {name}", ["127.0.0.1", "localhost"])
            self.pairs.append((pem_cert(cert), pem_key(key), cert.public_bytes(Encoding.DER)))

    def context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cadata=self.ca_pem.decode())


def container_config(spec: ChartContainer, **overrides: Any) -> dict[str, Any]:
    """The chart's amp.yaml (deploy/base/amp.yaml, rendered from the chart)
    with what a cluster would provide replaced by files: a static namespace
    whose endpoint is the example endpoint on amp's loopback, which the
    chart's SSRF rules (deny_networks: loopback) then must allow."""
    config = yaml.safe_load((ROOT / "deploy" / "base" / "amp.yaml").read_text())
    config["kubernetes"] = {
        "source": "static",
        "namespaces": {
            NAMESPACE: {
                "labels": {"amp.txn2.com/enabled": "true"},
                "annotations": {"amp.txn2.com/ep": f"http://127.0.0.1:{EXAMPLE_PORT}/user-env"},
            }
        },
    }
    config["failure_policy"] = "Fail"  # an endpoint that cannot be reached denies, never passes quietly
    config["endpoints"]["allow"] = ["http://127.0.0.1:*/*"]
    config["endpoints"]["deny_networks"] = [n for n in config["endpoints"]["deny_networks"] if n != "loopback"]
    for section, values in overrides.items():
        config.setdefault(section, {}).update(values)
    return config


class Pair:
    """amp's container (the chart's ports published on loopback) and the
    example endpoint's container in amp's network namespace."""

    def __init__(self, spec: ChartContainer, image: str, workdir: Path, config: dict[str, Any]) -> None:
        self.spec = spec
        self.certs = Certificates()
        self.config = config
        cert, key, _ = self.certs.pairs[0]
        self.volume = ConfigVolume(workdir / "config", spec, self.sources(cert, key))
        publish = []
        for _, port in spec.ports:
            publish += ["--publish", f"127.0.0.1::{port}"]
        self.amp = Container(
            "amp",
            image,
            [
                *run_flags(spec),
                *publish,
                "--volume",
                f"{self.volume.dir}:{spec.config_mount}:{'ro' if spec.config_read_only else 'rw'}",
            ],
        )
        example_flags = run_flags(spec)
        example_flags[example_flags.index("--entrypoint") + 1] = json.dumps(
            [
                "twistd",
                "--nodaemon",
                "--pidfile=",
                "amp-example",
                "--port",
                str(EXAMPLE_PORT),
                "--interface",
                "127.0.0.1",
            ]
        )
        self.example_flags = example_flags + [
            "--network",
            "container:{amp}",
            "--env",
            "PYTHONPATH=/examples",
            "--volume",
            f"{ROOT / 'examples'}:/examples:ro",
        ]
        self.example: Container | None = None
        self.image = image

    def sources(self, cert: bytes, key: bytes) -> dict[str, bytes]:
        return {
            "configMap:amp.yaml": yaml.safe_dump(self.config).encode(),
            "secret:tls.crt": cert,
            "secret:tls.key": key,
        }

    def start(self) -> float:
        """Start both and wait until amp is ready and the endpoint answers;
        returns amp's seconds from ``<engine> run`` to its readiness probe
        passing (the figure bench/image.py reports)."""
        started = time.monotonic()
        self.amp.start()
        wait_answering(self.amp, self.port("webhook"), self.spec.readiness, self.certs.context())
        ready = time.monotonic() - started
        flags = [f.replace("{amp}", self.amp.name) for f in self.example_flags]
        self.example = Container("example", self.image, flags).start()
        example = self.example
        check = f"import urllib.request; urllib.request.urlopen('http://127.0.0.1:{EXAMPLE_PORT}/healthz', timeout=2)"

        def answering() -> Optional[bool]:
            if not example.running():
                raise AssertionError(f"the example endpoint exited\n{example.describe()}")
            return example.exec("python", "-c", check).returncode == 0 or None

        poll_until("the example endpoint in amp's network namespace", answering, 60.0, details=example.describe)
        return ready

    def port(self, name: str) -> int:
        return self.amp.host_port(self.spec.port(name))

    def remove(self) -> None:
        for container in (self.example, self.amp):
            if container is not None:
                container.remove()
