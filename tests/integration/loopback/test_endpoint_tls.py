"""
Client TLS to https endpoints (amp.endpoint._tls): the CA bundle, the client
certificate, names, and files reloaded when they change.  Against loopback
TLS servers with a test CA.

Run with C{-W error::DeprecationWarning}: neither the client nor these
servers hand pyOpenSSL objects to pyOpenSSL where it expects cryptography
ones.
"""

from __future__ import annotations

import datetime
import os
import shutil
import tempfile
from typing import Any, Optional

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from twisted.internet import defer
from twisted.internet.defer import inlineCallbacks
from twisted.trial.unittest import TestCase
from twisted.web.server import Site

from amp.config import BreakerConfig, EndpointSettings
from amp.endpoint import _tls
from amp_dev.devcert import issue_cert, make_ca, pem_cert, pem_key
from tests.support.endpoint_harness import (
    PATCH,
    Endpoint,
    FailureAssertions,
    LoopbackServer,
    RealHarness,
    tls_server_options,
)


def chain_ca(name: str, issuer: Optional[tuple[x509.Certificate, Any]] = None) -> tuple[x509.Certificate, Any]:
    """
    A CA that may sign CAs (a root, or with C{issuer} an intermediate).
    """
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(x509.oid.NameOID.COMMON_NAME, name)])
    signer_cert, signer_key = issuer if issuer is not None else (None, key)
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(signer_cert.subject if signer_cert is not None else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    return builder.sign(signer_key, hashes.SHA256()), key


class MutualTLSTests(TestCase, FailureAssertions):
    timeout = 15

    def setUp(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="amp-endpoint-tls-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.ca, self.ca_key = make_ca("endpoint test CA")
        self.other_ca, other_key = make_ca("another CA")
        server, server_key = issue_cert(self.ca, self.ca_key, "endpoint", ["127.0.0.1", "localhost"])
        client, client_key = issue_cert(self.ca, self.ca_key, "amp", ["amp"], client=True)
        self.ca_path = self.write("ca.crt", pem_cert(self.ca))
        self.other_ca_path = self.write("other.crt", pem_cert(self.other_ca))
        self.both_path = self.write("both.crt", pem_cert(self.other_ca) + pem_cert(self.ca))
        self.client_cert = self.write("client.crt", pem_cert(client))
        self.client_key = self.write("client.key", pem_key(client_key))
        self.resource = Endpoint()
        self.server = LoopbackServer.start(
            self, Site(self.resource), tls=tls_server_options(server, server_key, client_ca=self.ca)
        )

    def write(self, name: str, data: bytes) -> str:
        path = os.path.join(self.dir, name)
        with open(path, "wb") as f:
            f.write(data)
        return path

    def mtls(self, **kw: Any) -> EndpointSettings:
        values = dict(ca_bundle=self.ca_path, client_cert=self.client_cert, client_key=self.client_key)
        values.update(kw)
        return EndpointSettings(**values)  # type: ignore[arg-type]

    @inlineCallbacks
    def test_ca_bundle_and_client_certificate(self) -> Any:
        h = RealHarness(self, self.mtls())
        url = self.server.url("/ok")
        for _ in range(2):
            decision = yield h.call(url)
            self.assertEqual(decision.patch, PATCH)
        self.assertEqual(self.server.accepted, 1)
        self.assertEqual(h.count(url, "ok"), 2)

    @inlineCallbacks
    def test_intermediate_in_the_client_chain(self) -> Any:
        # A client certificate issued by an intermediate, which the file
        # carries after the leaf; the server trusts only the root.
        root = chain_ca("client root")
        intermediate, intermediate_key = chain_ca("client intermediate", issuer=root)
        leaf, leaf_key = issue_cert(intermediate, intermediate_key, "amp", ["amp"], client=True)
        server_cert, server_key = issue_cert(self.ca, self.ca_key, "endpoint", ["127.0.0.1"])
        server = LoopbackServer.start(
            self, Site(self.resource), tls=tls_server_options(server_cert, server_key, client_ca=root[0])
        )
        chain = self.write("chain.crt", pem_cert(leaf) + pem_cert(intermediate))
        key = self.write("leaf.key", pem_key(leaf_key))
        h = RealHarness(self, self.mtls(client_cert=chain, client_key=key))
        decision = yield h.call(server.url("/ok"))
        self.assertEqual(decision.patch, PATCH)
        # Without the intermediate the server cannot build the chain.
        alone = self.write("leaf-alone.crt", pem_cert(leaf))
        h = RealHarness(self, self.mtls(client_cert=alone, client_key=key))
        yield self.assertFailsWith(h.call(server.url("/ok")), "tls-error")

    @inlineCallbacks
    def test_host_name_in_the_url(self) -> Any:
        h = RealHarness(self, self.mtls())
        decision = yield h.call(self.server.url("/ok", host="localhost"))
        self.assertEqual(decision.patch, PATCH)

    @inlineCallbacks
    def test_bundle_with_several_cas(self) -> Any:
        h = RealHarness(self, self.mtls(ca_bundle=self.both_path))
        decision = yield h.call(self.server.url("/ok"))
        self.assertEqual(decision.patch, PATCH)

    @inlineCallbacks
    def test_without_client_certificate_is_a_tls_error(self) -> Any:
        h = RealHarness(self, EndpointSettings(ca_bundle=self.ca_path))
        url = self.server.url("/ok")
        yield self.assertFailsWith(h.call(url), "tls-error")
        self.assertEqual(self.resource.hits, {})
        self.assertEqual(h.count(url, "tls-error"), 1)

    @inlineCallbacks
    def test_wrong_ca_is_a_tls_error(self) -> Any:
        h = RealHarness(self, self.mtls(ca_bundle=self.other_ca_path))
        url = self.server.url("/ok")
        e = yield self.assertFailsWith(h.call(url), "tls-error")
        self.assertIn("certificate verify failed", e.message)
        self.assertEqual(self.resource.hits, {})
        self.assertEqual(h.count(url, "tls-error"), 1)

    @inlineCallbacks
    def test_certificate_for_another_name_is_a_tls_error(self) -> Any:
        wrong, wrong_key = issue_cert(self.ca, self.ca_key, "endpoint", ["other.example"])
        server = LoopbackServer.start(self, Site(self.resource), tls=tls_server_options(wrong, wrong_key))
        h = RealHarness(self, self.mtls())
        e = yield self.assertFailsWith(h.call(server.url("/ok")), "tls-error")
        self.assertIn("does not match", e.message)
        self.assertEqual(self.resource.hits, {})

    @inlineCallbacks
    def test_connections_are_not_shared_across_tls_settings(self) -> Any:
        # Same origin, two overrides: a connection opened with the client
        # certificate must not carry a call whose settings have none.
        h = RealHarness(self, self.mtls())
        yield h.call(self.server.url("/ok"))
        without = EndpointSettings(ca_bundle=self.ca_path)
        yield self.assertFailsWith(h.call(self.server.url("/ok"), settings=without), "tls-error")

    @inlineCallbacks
    def test_missing_ca_bundle_is_a_tls_error_that_does_not_count(self) -> Any:
        settings = self.mtls(
            ca_bundle=os.path.join(self.dir, "missing.crt"), breaker=BreakerConfig(consecutive_failures=1)
        )
        h = RealHarness(self, settings)
        url = self.server.url("/ok")
        e = yield self.assertFailsWith(h.call(url), "tls-error")
        self.assertIn("missing.crt", e.message)
        self.assertEqual(self.server.accepted, 0)
        # amp's own configuration problem says nothing about the endpoint.
        self.assertEqual(h.breaker(url).state, "closed")

    def replace(self, path: str, data: bytes) -> None:
        """
        Swap a file for a new one, as a Secret volume update does.
        """
        with open(path + ".new", "wb") as f:
            f.write(data)
        os.replace(path + ".new", path)

    @inlineCallbacks
    def test_changed_tls_files_are_loaded_without_a_restart(self) -> Any:
        self.patch(_tls, "TLS_RECHECK", 3600.0)
        bundle = self.write("rotating-ca.crt", pem_cert(self.other_ca))
        h = RealHarness(self, self.mtls(ca_bundle=bundle))
        url = self.server.url("/ok")
        yield self.assertFailsWith(h.call(url), "tls-error")
        self.replace(bundle, pem_cert(self.ca))
        # Looked at no more often than every TLS_RECHECK seconds ...
        yield self.assertFailsWith(h.call(url), "tls-error")
        # ... and once it is time, the new CA is in use.
        self.patch(_tls, "TLS_RECHECK", 0.0)
        decision = yield h.call(url)
        self.assertEqual(decision.patch, PATCH)

    @inlineCallbacks
    def test_a_broken_rotation_keeps_the_files_in_use(self) -> Any:
        self.patch(_tls, "TLS_RECHECK", 0.0)
        h = RealHarness(self, self.mtls(pool_size=1))
        self.resource.hold_until = 2
        yield defer.gatherResults([h.call(self.server.url("/hold")) for _ in range(2)])
        self.replace(self.client_key, b"half a key")
        self.resource.hold_until = 2
        # Two at once: one rides the pooled connection, one needs a new one.
        yield defer.gatherResults([h.call(self.server.url("/hold")) for _ in range(2)])
        self.assertEqual(self.server.accepted, 3)

    @inlineCallbacks
    def test_client_key_of_another_certificate(self) -> Any:
        _, stray = issue_cert(self.ca, self.ca_key, "amp", ["amp"], client=True)
        h = RealHarness(self, self.mtls(client_key=self.write("stray.key", pem_key(stray))))
        e = yield self.assertFailsWith(h.call(self.server.url("/ok")), "tls-error")
        self.assertIn("does not belong", e.message)
