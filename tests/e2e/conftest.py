"""pytest wiring for the end-to-end tests: the ``e2e`` marker, the
session-wide ``control_plane`` fixture (a real etcd + kube-apiserver), the
``controllers`` fixture that adds kube-controller-manager, kube-scheduler
and kwok's fake nodes to it for the tests that need them (started on first
use), and the fixtures that run amp against it: amp's ServiceAccount
kubeconfig with the RBAC from ``deploy/``, the bypass report's Lease RBAC,
the example endpoints, and registered amp instances (``start_amp``,
``start_module_amp``).

Without Go (and without cached binaries) the e2e tests are skipped on a
developer machine and fail when ``CI=true``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Iterator, NoReturn

import pytest
import yaml

from ..support.otlp import GRPCReceiver
from ..support.waiting import poll_until
from . import build
from .amp_process import REPO_ROOT, AmpInstance, ExampleEndpoints
from .cluster import ControlPlane
from .controllers import Controllers


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "e2e: end-to-end test against a real kube-apiserver and etcd built from source",
    )


def _missing(what: str) -> NoReturn:
    """Skip (developer machine) or fail (``CI=true``) a test whose programs are not built."""
    outcome = build.go_missing_outcome(os.environ, build.find_go(), False)
    if outcome is not None:
        action, reason = outcome
    else:
        action = "fail" if os.environ.get("CI") == "true" else "skip"
        reason = (
            f"{what} are not built in {build.cache_dir()}: run `make tools` "
            "(tools/install e2e, i.e. python tests/e2e/build.py; a cold build takes several minutes)"
        )
    if action == "fail":
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


def require_binaries() -> build.Binaries:
    """The binaries the project's set-up step built (``make tools``, which
    ``make test`` runs first; tests never build them). When they are
    missing, the calling test says what is missing and how to build it: a
    skip on a developer machine, a failure when ``CI=true``."""
    if build.binaries_present():
        return build.build()  # cached and current: returns at once
    _missing("kube-apiserver and etcd")


def require_controllers() -> build.ControllerBinaries:
    """kube-controller-manager, kube-scheduler and kwok, as ``require_binaries``."""
    if build.controllers_present():
        return build.build_controllers()  # cached and current: returns at once
    _missing("kube-controller-manager, kube-scheduler and kwok")


@pytest.fixture(scope="session")
def e2e_binaries() -> build.Binaries:
    """kube-apiserver and etcd, built once (or found in the cache)."""
    return require_binaries()


@pytest.fixture(scope="session")
def otlp_receiver() -> Iterator[GRPCReceiver]:
    """The OTLP gRPC trace receiver the shared API server exports to (in
    this process, on the official protocol definitions): started with the
    plane, for the tests of traces (``test_tracing.py``)."""
    receiver = GRPCReceiver().start()
    try:
        yield receiver
    finally:
        receiver.stop()


@pytest.fixture(scope="session")
def control_plane(
    e2e_binaries: build.Binaries,
    tmp_path_factory: pytest.TempPathFactory,
    otlp_receiver: GRPCReceiver,
) -> Iterator[ControlPlane]:
    """One running control plane shared by the whole test session.

    Tests share it, so each test works in namespaces of its own
    (``control_plane.create_namespace(...)``) and removes cluster-scoped
    objects it creates (e.g. MutatingWebhookConfigurations).  The API
    server traces only requests that come with a sampled ``traceparent``
    (``ControlPlane.tracing_endpoint``), exporting to ``otlp_receiver``.
    """
    plane = ControlPlane(
        tmp_path_factory.mktemp("control-plane"), e2e_binaries, tracing_endpoint=f"127.0.0.1:{otlp_receiver.port}"
    )
    plane.start()
    try:
        yield plane
    finally:
        plane.stop()


#: The client limits the controllers run with in the tests (their defaults,
#: 20 and 30, make the controller set the pace of any storm; raised, the
#: API server and amp do).
CONTROLLER_QPS = 500.0
CONTROLLER_BURST = 1000


@pytest.fixture(scope="session")
def controllers(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Controllers]:
    """kube-controller-manager, kube-scheduler and kwok's fake nodes, added
    to the shared control plane by the first test that asks for them (with
    raised client limits) and kept for the rest of the session. Workloads
    for them: ``workloads.deployment`` and ``workloads.job``."""
    binaries = require_controllers()
    running = Controllers(
        control_plane, binaries, tmp_path_factory.mktemp("controllers"), qps=CONTROLLER_QPS, burst=CONTROLLER_BURST
    )
    running.start()
    try:
        yield running
    finally:
        running.stop()


# ---------------------------------------------------------------- amp under test

DEPLOY_DIR = REPO_ROOT / "deploy"
AMP_SERVICE_ACCOUNT = ("amp-e2e-system", "amp")
AMP_CLUSTER_ROLE = "amp-e2e"


def deploy_documents(substitutions: dict[str, str] | None = None) -> list[tuple[Path, dict[str, Any]]]:
    """Every Kubernetes object in a YAML file under ``deploy/`` as ``(file,
    document)``, after replacing each ``${NAME}`` placeholder given in
    ``substitutions`` (not the Helm chart's templates, nor files that are not
    Kubernetes objects, such as ``deploy/base/amp.yaml``, nor the managed
    mode's overlay ``deploy/managed``, whose grants its own scenario adds)."""
    documents = []
    if DEPLOY_DIR.is_dir():
        for path in sorted(DEPLOY_DIR.rglob("*")):
            if path.suffix not in (".yaml", ".yml") or not path.is_file():
                continue
            if (
                DEPLOY_DIR / "chart" in path.parents
                or DEPLOY_DIR / "managed" in path.parents
                or path == DEPLOY_DIR / "base" / "amp.yaml"
            ):
                continue
            text = path.read_text()
            for name, value in (substitutions or {}).items():
                text = text.replace("${" + name + "}", value)
            for doc in yaml.safe_load_all(text):
                if isinstance(doc, dict) and doc.get("kind") == "List":
                    documents.extend((path, item) for item in doc.get("items") or [])
                elif isinstance(doc, dict) and doc:
                    documents.append((path, doc))
    return documents


def deploy_cluster_role_rules() -> list[dict[str, Any]]:
    """The rules of amp's ClusterRole in ``deploy/`` (there must be one)."""
    roles = [(path, doc) for path, doc in deploy_documents() if doc.get("kind") == "ClusterRole"]
    names = ", ".join(f"{d['metadata']['name']} ({p.relative_to(REPO_ROOT)})" for p, d in roles)
    assert len(roles) == 1, f"expected one ClusterRole for amp in deploy/, found: {names or 'none'}"
    return roles[0][1].get("rules") or []


def deploy_amp_config() -> dict[str, Any]:
    """amp's configuration as ``deploy/`` ships it (``deploy/base/amp.yaml``,
    which kustomize's configMapGenerator turns into amp's ConfigMap)."""
    return yaml.safe_load((DEPLOY_DIR / "base" / "amp.yaml").read_text())


@pytest.fixture(scope="session")
def amp_kubeconfig(control_plane: ControlPlane) -> Iterator[Path]:
    """A kubeconfig for amp's ServiceAccount, bound to (a copy named
    ``amp-e2e`` of) the ClusterRole from ``deploy/`` and nothing else: the
    scenarios prove that this RBAC is enough."""
    from kubernetes import client

    rules = deploy_cluster_role_rules()
    namespace, name = AMP_SERVICE_ACCOUNT
    path = control_plane.service_account_kubeconfig(namespace, name)
    rbac = client.RbacAuthorizationV1Api(control_plane.admin_client())
    rbac.create_cluster_role(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": AMP_CLUSTER_ROLE},
            "rules": rules,
        }
    )
    rbac.create_cluster_role_binding(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": AMP_CLUSTER_ROLE},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": AMP_CLUSTER_ROLE},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
        }
    )
    try:
        _poll_until_authorized(path, rules)
        yield path
    finally:
        rbac.delete_cluster_role_binding(AMP_CLUSTER_ROLE)
        rbac.delete_cluster_role(AMP_CLUSTER_ROLE)


def _poll_until_authorized(kubeconfig: Path, rules: list[dict[str, Any]]) -> None:
    """Wait until the API server's authorizer has caught up with the new
    binding (it learns of RBAC objects through a watch), so that amp's first
    list is not refused and retried after a backoff."""
    from kubernetes import client, config

    api = config.new_client_from_config(config_file=str(kubeconfig))
    checks = client.AuthorizationV1Api(api)
    try:

        def allowed() -> bool | None:
            review = checks.create_self_subject_rules_review(
                {
                    "apiVersion": "authorization.k8s.io/v1",
                    "kind": "SelfSubjectRulesReview",
                    "spec": {"namespace": "default"},
                }
            )
            granted = review.status.resource_rules or []
            wanted = {
                (g, res, verb)
                for r in rules
                for g in r.get("apiGroups") or []
                for res in r.get("resources") or []
                for verb in r.get("verbs") or []
            }
            have = {
                (g, res, verb)
                for rule in granted
                for g in rule.api_groups or []
                for res in rule.resources or []
                for verb in rule.verbs or []
            }
            return True if wanted <= have else None

        poll_until("amp's RBAC to take effect", allowed, 10.0)
    finally:
        api.close()


LEASE_NAME = "amp-bypass-reporter"


@pytest.fixture(scope="module")
def lease_rbac(control_plane: ControlPlane, amp_kubeconfig: Path) -> Iterator[str]:
    """The Lease Role and RoleBinding of ``deploy/base``, in the namespace of
    the session's amp ServiceAccount (amp's own namespace), for amp's bypass
    report; that namespace's name."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    namespace, account = AMP_SERVICE_ACCOUNT
    role = yaml.safe_load((DEPLOY_DIR / "base" / "role.yaml").read_text())
    rbac = client.RbacAuthorizationV1Api(control_plane.admin_client())
    name = "amp-e2e-bypass"
    rbac.create_namespaced_role(
        namespace,
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": name, "namespace": namespace},
            "rules": role["rules"],
        },
    )
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": name, "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
        },
    )
    try:
        yield namespace
    finally:
        rbac.delete_namespaced_role_binding(name, namespace)
        rbac.delete_namespaced_role(name, namespace)
        try:
            client.CoordinationV1Api(control_plane.admin_client()).delete_namespaced_lease(LEASE_NAME, namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise


@pytest.fixture(scope="session")
def example_endpoints(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExampleEndpoints]:
    """``twistd amp-example`` on a free loopback port for the whole session."""
    examples = ExampleEndpoints(tmp_path_factory.mktemp("amp-example"))
    try:
        examples.start_and_wait()
        yield examples
    finally:
        status = examples.stop()
    assert examples.stopped_cleanly(), f"amp-example did not stop cleanly (status {status})\n{examples.describe()}"


AmpFactory = Callable[..., AmpInstance]


def _launch(
    control_plane: ControlPlane, kubeconfig: Path, examples: ExampleEndpoints, workdir: Path
) -> tuple[AmpFactory, list[AmpInstance]]:
    started: list[AmpInstance] = []

    def launch(instance: str, **options: Any) -> AmpInstance:
        amp = AmpInstance(control_plane, kubeconfig, examples, workdir, instance, **options)
        started.append(amp)
        return amp.start()

    return launch, started


def _close_all(started: list[AmpInstance]) -> None:
    failures = []
    for amp in started:
        status = amp.close()
        if not amp.process.stopped_cleanly():
            failures.append(f"amp {amp.instance} did not stop cleanly (status {status})\n{amp.process.describe()}")
    assert not failures, "\n".join(failures)


@pytest.fixture
def start_amp(
    control_plane: ControlPlane,
    amp_kubeconfig: Path,
    example_endpoints: ExampleEndpoints,
    tmp_path: Path,
) -> Iterator[AmpFactory]:
    """``start_amp(instance, **options)``: a running, registered
    L{AmpInstance} that is unregistered and stopped after the test (which
    fails if amp does not exit cleanly)."""
    launch, started = _launch(control_plane, amp_kubeconfig, example_endpoints, tmp_path)
    try:
        yield launch
    finally:
        _close_all(started)


@pytest.fixture(scope="module")
def start_module_amp(
    control_plane: ControlPlane,
    amp_kubeconfig: Path,
    example_endpoints: ExampleEndpoints,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[AmpFactory]:
    """Like ``start_amp``, for an instance shared by a module's tests."""
    launch, started = _launch(control_plane, amp_kubeconfig, example_endpoints, tmp_path_factory.mktemp("amp"))
    try:
        yield launch
    finally:
        _close_all(started)
