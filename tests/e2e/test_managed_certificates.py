"""End-to-end: amp's own CA and serving certificate, rotated under load.

Two amp replicas run with ``registration.managed`` and ``registration.secret``
and only the RBAC deploy/managed grants (its ClusterRole, and its Role's
Lease and Secret rules).  No certificate is given: the Lease holder makes
the Secret, both replicas serve its certificate, and the holder applies the
registration with its CA (called by URL: the test control plane routes no
Service).  Then a CA rotation is forced (the Secret annotated
``amp.txn2.com/rotate-ca``) while a thread creates a Pod every ~100 ms in an
enabled namespace of the Fail class: every Pod is created and mutated, and
the API server counts no fail-open and no rejection of amp's webhook.  The
scenario prints the overlap (old and new CA both in the caBundle) and the
time from the rotation request to every replica serving a certificate of the
new CA.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import socket
import ssl
import threading
import time
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest
import yaml
from cryptography import x509
from kubernetes import client
from kubernetes.client.rest import ApiException

from amp.config import parse_config
from amp.registration import bundle_certificates, desired

from ..support.waiting import poll_until
from .amp_process import (
    ENDPOINT_ANNOTATION,
    LOOPBACK,
    STATUS_ANNOTATION,
    AmpProcess,
    ExampleEndpoints,
    amp_config,
    free_port,
    pod_manifest,
    unique,
)
from .cluster import ControlPlane
from .conftest import AMP_SERVICE_ACCOUNT, DEPLOY_DIR, deploy_amp_config

pytestmark = pytest.mark.e2e

WAIT = 30.0
SECRET = "amp-certificates"  # the name deploy/managed's Role grants
ENABLED = "e2e-certs.amp.txn2.com/enabled"
CLASS_LABEL = "amp.txn2.com/failure-class"


@pytest.fixture
def certificates_rbac(control_plane: ControlPlane, amp_kubeconfig: Path) -> Iterator[str]:
    """deploy/managed's ClusterRole and Role (Lease, Secret), bound to the session's amp ServiceAccount."""
    namespace, account = AMP_SERVICE_ACCOUNT
    rbac = client.RbacAuthorizationV1Api(control_plane.admin_client())
    name = "amp-e2e-certificates"
    cluster_role = next(
        d
        for d in yaml.safe_load_all((DEPLOY_DIR / "managed" / "registration-rbac.yaml").read_text())
        if d and d["kind"] == "ClusterRole"
    )
    role = yaml.safe_load((DEPLOY_DIR / "managed" / "role.yaml").read_text())
    subjects = [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]
    rbac.create_cluster_role({"metadata": {"name": name}, "rules": cluster_role["rules"]})
    rbac.create_cluster_role_binding(
        {
            "metadata": {"name": name},
            "subjects": subjects,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        }
    )
    rbac.create_namespaced_role(namespace, {"metadata": {"name": name, "namespace": namespace}, "rules": role["rules"]})
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": name, "namespace": namespace},
            "subjects": subjects,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        },
    )
    try:
        yield namespace
    finally:
        rbac.delete_cluster_role_binding(name)
        rbac.delete_cluster_role(name)
        rbac.delete_namespaced_role_binding(name, namespace)
        rbac.delete_namespaced_role(name, namespace)
        for delete in (
            lambda: client.CoreV1Api(control_plane.admin_client()).delete_namespaced_secret(SECRET, namespace),
            lambda: client.CoordinationV1Api(control_plane.admin_client()).delete_namespaced_lease(
                "amp-bypass-reporter", namespace
            ),
        ):
            try:
                delete()
            except ApiException as exc:
                if exc.status != 404:
                    raise


def served(port: int) -> Optional[x509.Certificate]:
    """The certificate a new TLS connection to amp on C{port} is shown (None: no handshake)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with socket.create_connection((LOOPBACK, port), timeout=2) as raw:
            with context.wrap_socket(raw, server_hostname=LOOPBACK) as tls:
                der = tls.getpeercert(binary_form=True)
    except (OSError, ssl.SSLError):
        return None
    return x509.load_der_x509_certificate(der) if der else None


def fingerprint(cert: x509.Certificate) -> str:
    from cryptography.hazmat.primitives.serialization import Encoding

    return hashlib.sha256(cert.public_bytes(Encoding.DER)).hexdigest()


#: Pods the stream gets answered before the rotation and after it (about 2 s).
STEADY = 20


class PodStream:
    """A thread creating a Pod every ~100 ms in C{namespace}; what became of each."""

    def __init__(self, core: client.CoreV1Api, namespace: str) -> None:
        self.core = core
        self.namespace = namespace
        self.created: list[dict[str, Any]] = []
        self.failed: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pod-stream", daemon=True)

    def __enter__(self) -> "PodStream":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            try:
                pod = self.core.create_namespaced_pod(self.namespace, pod_manifest(f"stream-{n}"))
            except Exception as exc:  # every failure is the finding
                self.failed.append(f"stream-{n}: {getattr(exc, 'body', None) or exc}")
            else:
                self.created.append(
                    {
                        "name": pod.metadata.name,
                        "annotations": pod.metadata.annotations or {},
                        "env": [e.name for e in pod.spec.containers[0].env or ()],
                    }
                )
            self._stop.wait(0.1)

    def answered(self) -> int:
        """Pods the stream has had answered so far, created or refused."""
        return len(self.created) + len(self.failed)

    def await_more(self, count: int, what: str) -> None:
        """Wait until the stream has had C{count} more Pods answered."""
        goal = self.answered() + count
        poll_until(what, lambda: self.answered() >= goal or None, WAIT, interval=0.05)


def webhook_counts(control_plane: ControlPlane, names: set[str]) -> dict[str, float]:
    """The API server's fail-open and rejection counts for amp's entries."""
    scrape = control_plane.metrics()
    out: dict[str, float] = {}
    for (sample, labels), value in scrape.samples.items():
        if (
            sample
            in (
                "apiserver_admission_webhook_fail_open_count_total",
                "apiserver_admission_webhook_rejection_count_total",
            )
            and dict(labels).get("name") in names
        ):
            out[sample] = out.get(sample, 0.0) + value
    return out


def test_a_ca_rotation_under_a_stream_of_pods_fails_no_review(
    control_plane: ControlPlane,
    amp_kubeconfig: Path,
    certificates_rbac: str,
    example_endpoints: ExampleEndpoints,
    tmp_path: Path,
) -> None:
    namespace = certificates_rbac
    name = deploy_amp_config()["kubernetes"]["webhook_configuration"]
    admin = control_plane.admin_client()
    admission = client.AdmissionregistrationV1Api(admin)
    core = client.CoreV1Api(admin)

    def read() -> Optional[dict[str, Any]]:
        try:
            return admin.sanitize_for_serialization(admission.read_mutating_webhook_configuration(name))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    if read() is not None:
        admission.delete_mutating_webhook_configuration(name)
    ports = [free_port(), free_port()]
    url = f"https://{LOOPBACK}:{ports[0]}/mutate"
    # No certificate files: the config's tls.cert and tls.key name files that do not exist.
    configs = [
        amp_config(
            port=port,
            cert=tmp_path / "absent.crt",
            key=tmp_path / "absent.key",
            kubeconfig=amp_kubeconfig,
            webhook_configuration=name,
            failure_policy="Fail",
            overrides={
                "metrics": {"port": free_port(), "interface": LOOPBACK},
                "tls": {"reload_interval": "500ms"},
                "kubernetes": {
                    "own_namespace": namespace,
                    "enabled_label": ENABLED,
                    "bypass": {"enabled": False, "lease_namespace": namespace, "lease_duration": "3s"},
                },
                "registration": {
                    "managed": True,
                    "secret": SECRET,
                    "url": url,
                    "repair_interval": "1s",
                    "ca_validity": "1h",
                    "cert_validity": "10m",
                },
            },
        )
        for port in ports
    ]
    # deploy/managed ships the object without a caBundle; amp may patch it, not create it.
    shipped = copy.deepcopy(desired(parse_config(configs[0]), b"", namespace))
    for entry in shipped["webhooks"]:
        del entry["clientConfig"]["caBundle"]
    admission.create_mutating_webhook_configuration(shipped)
    entries = {e["name"] for e in shipped["webhooks"]}
    strict = unique("certs-fail")
    control_plane.create_namespace(
        strict,
        labels={ENABLED: "true", CLASS_LABEL: "Fail"},
        annotations={ENDPOINT_ANNOTATION: example_endpoints.url("user-env")},
    )
    replicas = [AmpProcess(f"amp-certs-{i}", tmp_path, config, b"") for i, config in enumerate(configs)]
    unverified = ssl.create_default_context()
    unverified.check_hostname, unverified.verify_mode = False, ssl.CERT_NONE
    try:
        for replica in replicas:
            replica.start()
        for replica in replicas:
            replica.wait_healthy(replica.port, "/readyz", unverified, WAIT)

        def secret() -> Any:
            return core.read_namespaced_secret(SECRET, namespace)

        def bundle() -> list[x509.Certificate]:
            obj = read()
            if not obj:
                return []
            held = [
                frozenset(fingerprint(c) for c in bundle_certificates(e["clientConfig"].get("caBundle")))
                for e in obj["webhooks"]
            ]
            cas = bundle_certificates(obj["webhooks"][0]["clientConfig"].get("caBundle"))
            return [c for c in cas if all(fingerprint(c) in h for h in held)]

        def details() -> str:
            return "\n".join(r.describe() for r in replicas)

        first = poll_until("amp to apply its own CA", lambda: bundle() or None, WAIT, details=details)
        assert len(first) == 1
        leaf = served(ports[0])
        assert leaf is not None and leaf.issuer == first[0].subject
        probe = core.create_namespaced_pod(strict, pod_manifest("before"))
        assert (probe.metadata.annotations or {}).get(STATUS_ANNOTATION, "").startswith("mutated"), details()
        before = webhook_counts(control_plane, entries)
        with PodStream(core, strict) as stream:
            stream.await_more(STEADY, "a steady stream of Pods before the rotation")
            core.patch_namespaced_secret(
                SECRET, namespace, {"metadata": {"annotations": {"amp.txn2.com/rotate-ca": "e2e"}}}
            )
            asked = time.monotonic()
            both = poll_until(
                "the new CA in the caBundle beside the old",
                lambda: time.monotonic() if len(bundle()) == 2 else None,
                WAIT,
                interval=0.05,
                details=details,
            )
            new_ca = bundle()[1]

            def everyone_new() -> Optional[float]:
                for port in ports:
                    cert = served(port)
                    if cert is None or cert.issuer != new_ca.subject:
                        return None
                return time.monotonic()

            all_new = poll_until(
                "every replica to serve a certificate of the new CA", everyone_new, WAIT, interval=0.05, details=details
            )
            alone = poll_until(
                "the old CA to leave the caBundle",
                lambda: time.monotonic() if [fingerprint(c) for c in bundle()] == [fingerprint(new_ca)] else None,
                WAIT,
                interval=0.05,
                details=details,
            )
            stream.await_more(STEADY, "a steady stream of Pods after the rotation")
        after = webhook_counts(control_plane, entries)
        print(
            f"\nmanaged certificates, CA rotation under {len(stream.created)} Pod creations: "
            f"new CA in the caBundle {both - asked:.2f}s after the request; every replica serving a certificate "
            f"of the new CA {all_new - asked:.2f}s after it; overlap (old and new CA both in the caBundle) "
            f"{alone - both:.2f}s"
        )
        assert stream.failed == [], f"{stream.failed[:5]}\n{details()}"
        unmutated = [
            p["name"]
            for p in stream.created
            if "AMP_USER" not in p["env"] or not p["annotations"].get(STATUS_ANNOTATION, "").startswith("mutated")
        ]
        assert unmutated == [] and len(stream.created) >= 20, (unmutated[:5], len(stream.created))
        assert after == before, (before, after)
        # The Secret holds the new CA alone, its certificate issued by it, and each replica's report.
        data = secret().data
        assert [fingerprint(c) for c in x509.load_pem_x509_certificates(base64.b64decode(data["ca.crt"]))] == [
            fingerprint(new_ca)
        ]
        assert x509.load_pem_x509_certificate(base64.b64decode(data["tls.crt"])).issuer == new_ca.subject
        reports = [k for k in secret().metadata.annotations if k.startswith("serving.amp.txn2.com/")]
        assert len(reports) == 2, reports
        assert "amp.txn2.com/rotate-ca" not in secret().metadata.annotations
    finally:
        for replica in replicas:
            replica.stop()
        if read() is not None:
            admission.delete_mutating_webhook_configuration(name)
    for replica in replicas:
        assert replica.stopped_cleanly(), replica.describe()
