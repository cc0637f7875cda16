"""
Tests for amp.tls: loading the serving certificate, hot reload while
connections are open, client-certificate verification and protocol settings.

Handshakes are real, over 127.0.0.1, against a twisted.web Site behind
L{amp.tls.tls_endpoint}; polling is driven by a L{Clock}.
"""

from __future__ import annotations

import datetime
import os
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from OpenSSL import SSL, crypto
from twisted.internet import reactor
from twisted.internet.defer import Deferred, inlineCallbacks
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol, wrapClientTLS
from twisted.internet.interfaces import IHandshakeListener, IOpenSSLClientConnectionCreator
from twisted.internet.protocol import Protocol
from twisted.internet.ssl import Certificate, optionsForClientTLS
from twisted.internet.task import Clock
from twisted.logger import Logger
from twisted.trial.unittest import SkipTest, TestCase
from twisted.web.resource import Resource
from twisted.web.server import Site
from zope.interface import implementer

from amp.metrics import Metrics
from amp.reload import SighupService
from amp.tls import (
    TLS12_CIPHERS,
    CertificateError,
    CertificateReloadService,
    ReloadingCertificate,
    tls_endpoint,
)
from amp_dev.devcert import issue_cert, make_ca, pem_cert, pem_key
from tests.support.helpers import ConnectionTracker, SecretVolume

INTERVAL = 5.0
HOSTS = ["localhost", "127.0.0.1"]
REQUEST = b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
DAY = datetime.timedelta(days=1)


# ---------------------------------------------------------------- certificates and files


@dataclass(frozen=True)
class Pair:
    cert: bytes
    key: bytes
    serial: int
    not_after: datetime.datetime


class PKI:
    """A CA that issues serving and client certificates."""

    def __init__(self, name: str = "amp test CA") -> None:
        self.ca, self.ca_key = make_ca(name)
        self.ca_pem = pem_cert(self.ca)

    def server(self, **kw: Any) -> Pair:
        cert, key = issue_cert(self.ca, self.ca_key, "amp", HOSTS, **kw)
        return Pair(pem_cert(cert), pem_key(key), cert.serial_number, cert.not_valid_after_utc)

    def client(self) -> tuple[x509.Certificate, Any]:
        return issue_cert(self.ca, self.ca_key, "kube-apiserver", ["kube-apiserver"], client=True)


def _ca(name: str, *, path_length: int = 0, issuer: Optional[tuple[Any, Any]] = None) -> tuple[Any, Any]:
    """
    A CA certificate, self-signed or signed by C{issuer}; devcert's CA allows
    no intermediates, so the chain test builds its own root.
    """
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    signer_cert, signer_key = issuer if issuer is not None else (None, key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(signer_cert.subject if signer_cert is not None else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + 30 * DAY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=path_length), critical=True)
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
    if signer_cert is not None:
        ski = signer_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
        builder = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False
        )
    return builder.sign(signer_key, hashes.SHA256()), key


class PlainFiles:
    """tls.crt / tls.key / ca.crt as plain files, rewritten in place."""

    def __init__(self, directory: Path) -> None:
        self.cert = str(directory / "tls.crt")
        self.key = str(directory / "tls.key")
        self.ca = str(directory / "ca.crt")

    def write(
        self,
        pair: Optional[Pair] = None,
        *,
        cert: Optional[bytes] = None,
        key: Optional[bytes] = None,
        ca: Optional[bytes] = None,
    ) -> None:
        if pair is not None:
            cert, key = pair.cert, pair.key
        for path, data in ((self.cert, cert), (self.key, key), (self.ca, ca)):
            if data is not None:
                _write_in_place(path, data)


def _write_in_place(path: str, data: bytes) -> None:
    """
    Truncate and rewrite C{path} (same inode).  A real rotation happens
    seconds after the previous one, but the kernel stamps files with a coarse
    clock, so two writes in one test can get the same mtime: step it forward
    by a second, as the real gap would.
    """
    try:
        before: Optional[int] = os.stat(path).st_mtime_ns
    except FileNotFoundError:
        before = None
    with open(path, "wb") as f:
        f.write(data)
    if before is not None:
        os.utime(path, ns=(before + 1_000_000_000, before + 1_000_000_000))


# ---------------------------------------------------------------- server and client


class Hello(Resource):
    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.hits = 0

    def render_GET(self, request: Any) -> bytes:
        self.hits += 1
        request.setHeader(b"content-type", b"text/plain")
        return b"ok"


@implementer(IHandshakeListener)
class Probe(Protocol):
    """
    Records what the server presented in the handshake and the raw HTTP
    answer to one GET (sent on handshake unless C{auto_get} is false).
    """

    def __init__(self, auto_get: bool = True) -> None:
        self.auto_get = auto_get
        self.handshake: Deferred[int] = Deferred()
        self.finished: Deferred[Probe] = Deferred()
        self.received = b""
        self.serial: Optional[int] = None
        self.version: Optional[str] = None
        self.cipher: Optional[str] = None
        self.alpn: Optional[bytes] = None
        self.reason: Any = None

    def handshakeCompleted(self) -> None:
        conn = self.transport.getHandle()
        self.serial = conn.get_peer_certificate(as_cryptography=True).serial_number
        self.version = conn.get_protocol_version_name()
        self.cipher = conn.get_cipher_name()
        self.alpn = conn.get_alpn_proto_negotiated()
        if self.auto_get:
            self.request()
        self.handshake.callback(self.serial)

    def request(self) -> None:
        self.transport.write(REQUEST)

    def dataReceived(self, data: bytes) -> None:
        self.received += data

    def connectionLost(self, reason: Any) -> None:
        self.reason = reason
        if not self.handshake.called:
            self.handshake.errback(reason)
        self.finished.callback(self)

    @property
    def answered_ok(self) -> bool:
        return self.received.startswith(b"HTTP/1.1 200 ") and self.received.endswith(b"\r\n\r\nok")


@implementer(IOpenSSLClientConnectionCreator)
class RawClient:
    """
    A client built directly on pyOpenSSL, for protocol versions and cipher
    suites the high-level client options will not offer.  It still verifies
    the server's chain against C{ca}.
    """

    def __init__(
        self,
        ca: x509.Certificate,
        *,
        min_version: int = 0,
        max_version: int = 0,
        ciphers: Optional[bytes] = None,
        client_cert: Optional[tuple[x509.Certificate, Any]] = None,
    ) -> None:
        self.context = SSL.Context(SSL.TLS_CLIENT_METHOD)
        if client_cert is not None:
            self.context.use_certificate(client_cert[0])
            self.context.use_privatekey(client_cert[1])
        if min_version:
            self.context.set_min_proto_version(min_version)
        if max_version:
            self.context.set_max_proto_version(max_version)
        self.context.get_cert_store().add_cert(crypto.X509.from_cryptography(ca))
        self.context.set_verify(SSL.VERIFY_PEER)
        if ciphers is not None:
            self.context.set_cipher_list(ciphers)

    def clientConnectionForTLS(self, tlsProtocol: Any) -> SSL.Connection:
        conn = SSL.Connection(self.context, None)
        conn.set_tlsext_host_name(b"localhost")
        return conn


class FakeReactor:
    def __init__(self) -> None:
        self.from_thread: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []

    def callFromThread(self, f: Callable[..., Any], *args: Any) -> None:
        self.from_thread.append((f, args))


def _tls11_unavailable() -> Optional[str]:
    """
    Why this OpenSSL cannot do a TLS 1.1 handshake even when both ends allow
    it (then "TLS 1.1 is refused" would prove nothing), or None.
    """
    ca, ca_key = make_ca("probe CA")
    cert, key = issue_cert(ca, ca_key, "probe", ["localhost"])
    try:
        server = SSL.Context(SSL.TLS_SERVER_METHOD)
        server.use_certificate(cert)
        server.use_privatekey(key)
        server.set_min_proto_version(SSL.TLS1_1_VERSION)
        server.set_cipher_list(b"DEFAULT:@SECLEVEL=0")
        client = SSL.Context(SSL.TLS_CLIENT_METHOD)
        client.set_min_proto_version(SSL.TLS1_1_VERSION)
        client.set_max_proto_version(SSL.TLS1_1_VERSION)
        client.set_cipher_list(b"DEFAULT:@SECLEVEL=0")
        s, c = SSL.Connection(server, None), SSL.Connection(client, None)
        s.set_accept_state()
        c.set_connect_state()
        for _ in range(10):
            for a, b in ((c, s), (s, c)):
                try:
                    a.do_handshake()
                except SSL.WantReadError:
                    pass
                try:
                    b.bio_write(a.bio_read(65536))
                except SSL.WantReadError:
                    pass
        version = c.get_protocol_version_name()
    except SSL.Error as e:
        return f"this OpenSSL cannot negotiate TLS 1.1 at all: {e}"
    if version != "TLSv1.1":
        return f"this OpenSSL did not negotiate TLS 1.1 with a TLS 1.1 peer (got {version})"
    return None


# ---------------------------------------------------------------- base


class TLSTestCase(TestCase):
    timeout = 10

    def setUp(self) -> None:
        self.clock = Clock()
        self.clock.advance(time.time())
        self.pki = PKI()
        self.dir = Path(tempfile.mkdtemp(prefix="amp-tls-"))
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.metrics = Metrics()
        self.files = PlainFiles(self.dir)

    def reloads(self, result: str) -> float:
        return self.metrics.registry.get_sample_value("amp_tls_reloads_total", {"result": result}) or 0.0

    def not_after_metric(self) -> Optional[float]:
        return self.metrics.registry.get_sample_value("amp_tls_certificate_not_after_timestamp_seconds")

    def certificate(
        self, cert_path: Optional[str] = None, key_path: Optional[str] = None, **kw: Any
    ) -> ReloadingCertificate:
        return ReloadingCertificate(
            cert_path or self.files.cert,
            key_path or self.files.key,
            clock=self.clock,
            metrics=self.metrics,
            **kw,
        )

    def poller(self, cert: ReloadingCertificate) -> CertificateReloadService:
        service = CertificateReloadService(cert, reactor=FakeReactor(), clock=self.clock, interval=INTERVAL)
        service.startService()
        self.addCleanup(service.stopService)
        return service

    @inlineCallbacks
    def serve(self, cert: ReloadingCertificate) -> Any:
        self.hello = Hello()
        tracker = ConnectionTracker(Site(self.hello), reactor)
        port = yield tls_endpoint(reactor, 0, "127.0.0.1", cert).listen(tracker)
        self.addCleanup(port.stopListening)
        self.addCleanup(tracker.close_all)
        self.port = port.getHost().port

    def client(self, ca: Optional[bytes] = None, alpn: Optional[list[bytes]] = None) -> Any:
        """What a careful HTTPS client does: verify chain and host name."""
        return optionsForClientTLS(
            "localhost", trustRoot=Certificate.loadPEM(ca or self.pki.ca_pem), acceptableProtocols=alpn
        )

    @inlineCallbacks
    def connect(self, creator: Any = None, auto_get: bool = True) -> Any:
        probe = Probe(auto_get)
        endpoint = wrapClientTLS(
            creator if creator is not None else self.client(),
            TCP4ClientEndpoint(reactor, "127.0.0.1", self.port, timeout=5),
        )
        yield connectProtocol(endpoint, probe)
        self.addCleanup(self._close, probe)
        return probe

    def _close(self, probe: Probe) -> Deferred[Any]:
        probe.handshake.addErrback(lambda f: None)
        if not probe.finished.called:
            probe.transport.abortConnection()
        return probe.finished

    @inlineCallbacks
    def fetch(self, creator: Any = None) -> Any:
        """One connection, one GET; returns the finished L{Probe}."""
        probe = yield self.connect(creator)
        yield probe.finished
        return probe

    def assertRefused(self, probe: Probe, hits_before: int) -> None:
        """The connection ended in a TLS error and no request reached the site."""
        self.assertEqual(probe.received, b"")
        self.assertIsNotNone(probe.reason.check(SSL.Error), probe.reason)
        self.assertEqual(self.hello.hits, hits_before)


# ---------------------------------------------------------------- tests


class ServingTests(TLSTestCase):
    @inlineCallbacks
    def test_handshake_presents_the_loaded_certificate(self) -> Any:
        pair = self.pki.server()
        self.files.write(pair)
        cert = self.certificate()
        cert.load()
        yield self.serve(cert)

        probe = yield self.fetch(self.client(alpn=[b"h2", b"http/1.1"]))

        self.assertTrue(probe.answered_ok, probe.received)
        self.assertEqual(probe.serial, pair.serial)
        self.assertIn(probe.version, ("TLSv1.2", "TLSv1.3"))
        self.assertEqual(probe.alpn, b"http/1.1")
        self.assertEqual(self.not_after_metric(), pair.not_after.timestamp())

    @inlineCallbacks
    def test_rotation_in_place(self) -> Any:
        old = self.pki.server()
        self.files.write(old)
        cert = self.certificate()
        cert.load()
        self.poller(cert)
        yield self.serve(cert)
        in_flight = yield self.connect(auto_get=False)
        self.assertEqual((yield in_flight.handshake), old.serial)

        self.clock.advance(INTERVAL)
        self.clock.advance(INTERVAL)
        self.assertEqual(self.reloads("success"), 0, "unchanged files must not be reloaded")

        new = self.pki.server()
        self.files.write(new)
        before_poll = yield self.fetch()
        self.assertEqual(before_poll.serial, old.serial)

        self.clock.advance(INTERVAL)
        after = yield self.fetch()
        self.assertEqual(after.serial, new.serial)
        self.assertTrue(after.answered_ok, after.received)
        self.assertEqual(cert.serial, new.serial)
        self.assertEqual(self.reloads("success"), 1)
        self.assertEqual(self.not_after_metric(), new.not_after.timestamp())

        in_flight.request()
        yield in_flight.finished
        self.assertTrue(in_flight.answered_ok, in_flight.received)

    @inlineCallbacks
    def test_rotation_by_secret_volume_symlink_swap(self) -> Any:
        old = self.pki.server()
        volume = SecretVolume(self.dir, {"tls.crt": old.cert, "tls.key": old.key, "ca.crt": self.pki.ca_pem})
        cert = self.certificate(volume.path("tls.crt"), volume.path("tls.key"))
        cert.load()
        self.poller(cert)
        yield self.serve(cert)
        in_flight = yield self.connect(auto_get=False)
        self.assertEqual((yield in_flight.handshake), old.serial)

        new = self.pki.server()
        volume.swap({"tls.crt": new.cert, "tls.key": new.key, "ca.crt": self.pki.ca_pem})
        self.assertEqual((yield self.fetch()).serial, old.serial)

        self.clock.advance(INTERVAL)
        after = yield self.fetch()
        self.assertEqual(after.serial, new.serial)
        self.assertTrue(after.answered_ok, after.received)
        self.assertEqual(self.reloads("success"), 1)
        self.assertEqual(self.reloads("error"), 0)

        # The old generation's directory is gone; the open connection does not care.
        in_flight.request()
        yield in_flight.finished
        self.assertTrue(in_flight.answered_ok, in_flight.received)

    @inlineCallbacks
    def _bad_rotation_keeps_old(self, write_bad: Callable[[], None], reason: str) -> Any:
        old = self.pki.server()
        self.files.write(old)
        cert = self.certificate()
        cert.load()
        events: list[dict[str, Any]] = []
        cert.log = Logger(observer=events.append)
        self.poller(cert)
        yield self.serve(cert)

        write_bad()
        self.clock.advance(INTERVAL)
        probe = yield self.fetch()
        self.assertEqual(probe.serial, old.serial)
        self.assertTrue(probe.answered_ok, probe.received)
        self.assertEqual(self.reloads("error"), 1)
        self.assertEqual(self.reloads("success"), 0)
        self.assertIn(reason, events[-1]["reason"])
        self.assertEqual(events[-1]["serial"], f"{old.serial:#x}")
        self.assertEqual(self.not_after_metric(), old.not_after.timestamp())
        self.assertTrue(cert.readiness()[0])

        # A failed attempt is not remembered as loaded: the next tick retries.
        self.clock.advance(INTERVAL)
        self.assertEqual(self.reloads("error"), 2)

        good = self.pki.server()
        self.files.write(good)
        self.clock.advance(INTERVAL)
        probe = yield self.fetch()
        self.assertEqual(probe.serial, good.serial)
        self.assertEqual(self.reloads("success"), 1)
        self.assertEqual(self.reloads("error"), 2)

    def test_mismatched_key_keeps_old_certificate(self) -> Any:
        new = self.pki.server()
        return self._bad_rotation_keeps_old(lambda: self.files.write(cert=new.cert), "does not match")

    def test_truncated_certificate_keeps_old_certificate(self) -> Any:
        new = self.pki.server()
        return self._bad_rotation_keeps_old(
            lambda: self.files.write(cert=new.cert[: len(new.cert) // 2], key=new.key), "truncated"
        )

    def test_truncated_chain_keeps_old_certificate(self) -> Any:
        new = self.pki.server()
        chain = new.cert + self.pki.ca_pem
        return self._bad_rotation_keeps_old(lambda: self.files.write(cert=chain[:-40], key=new.key), "truncated")

    def test_expired_new_pair_keeps_old_certificate(self) -> Any:
        now = datetime.datetime.fromtimestamp(self.clock.seconds(), datetime.timezone.utc)
        expired = self.pki.server(not_before=now - 3 * DAY, not_after=now - DAY)
        return self._bad_rotation_keeps_old(lambda: self.files.write(expired), "expired at")

    @inlineCallbacks
    def test_chain_is_sent(self) -> Any:
        """
        A tls.crt holding leaf and intermediate (as cert-manager writes it)
        lets a client that trusts only the root verify the server.
        """
        root_cert, root_key = _ca("amp test root", path_length=1)
        inter_cert, inter_key = _ca("amp test intermediate", issuer=(root_cert, root_key))
        leaf, leaf_key = issue_cert(inter_cert, inter_key, "amp", HOSTS)
        self.files.write(cert=pem_cert(leaf) + pem_cert(inter_cert), key=pem_key(leaf_key))
        cert = self.certificate()
        cert.load()
        yield self.serve(cert)

        probe = yield self.fetch(self.client(ca=pem_cert(root_cert)))
        self.assertTrue(probe.answered_ok, probe.received)
        self.assertEqual(probe.serial, leaf.serial_number)


class ClientCertificateTests(TLSTestCase):
    @inlineCallbacks
    def test_client_certificates_are_verified_and_the_ca_is_reloaded(self) -> Any:
        other = PKI("another CA")
        self.files.write(self.pki.server(), ca=self.pki.ca_pem)
        cert = self.certificate(client_ca=self.files.ca)
        cert.load()
        self.poller(cert)
        yield self.serve(cert)

        ours = self.pki.client()
        theirs = other.client()

        accepted = yield self.fetch(RawClient(self.pki.ca, client_cert=ours))
        self.assertTrue(accepted.answered_ok, accepted.received)
        hits = self.hello.hits

        self.assertRefused((yield self.fetch(RawClient(self.pki.ca, client_cert=theirs))), hits)
        self.assertRefused((yield self.fetch(RawClient(self.pki.ca))), hits)

        # The client CA file is watched with the pair.
        self.clock.advance(INTERVAL)
        self.assertEqual(self.reloads("success"), 0, "unchanged files must not be reloaded")
        self.files.write(ca=other.ca_pem)
        self.clock.advance(INTERVAL)
        self.assertEqual(self.reloads("success"), 1)
        now_accepted = yield self.fetch(RawClient(self.pki.ca, client_cert=theirs))
        self.assertTrue(now_accepted.answered_ok, now_accepted.received)
        self.assertRefused((yield self.fetch(RawClient(self.pki.ca, client_cert=ours))), hits + 1)


class MemoryTests(TLSTestCase):
    """amp's own certificates: the pair is given (from their Secret), never read from files."""

    def memory(self) -> ReloadingCertificate:
        return ReloadingCertificate(
            "secret amp-system/amp-tls tls.crt",
            "secret amp-system/amp-tls tls.key",
            clock=self.clock,
            metrics=self.metrics,
            memory=True,
        )

    @inlineCallbacks
    def test_a_given_pair_is_served_and_replaced_without_a_restart(self) -> Any:
        cert = self.memory()
        self.assertEqual(cert.readiness(), (False, "no TLS certificate loaded"))
        self.poller(cert)
        self.clock.advance(INTERVAL)
        self.assertEqual((self.reloads("success"), self.reloads("error")), (0, 0), "nothing given: nothing tried")
        old, new = self.pki.server(), self.pki.server()
        self.assertTrue(cert.offer(old.cert, old.key))
        self.assertFalse(cert.offer(old.cert, old.key), "the pair in service is not loaded again")
        yield self.serve(cert)
        in_flight = yield self.connect(auto_get=False)
        self.assertEqual((yield in_flight.handshake), old.serial)
        self.assertTrue(cert.offer(new.cert, new.key))
        self.assertEqual((yield self.fetch()).serial, new.serial)
        self.clock.advance(INTERVAL)
        self.assertEqual(self.reloads("success"), 2, "polling finds no change of a given pair")
        in_flight.request()
        yield in_flight.finished
        self.assertTrue(in_flight.answered_ok, in_flight.received)

    @inlineCallbacks
    def test_a_pair_that_does_not_belong_together_never_replaces_a_good_one(self) -> Any:
        cert = self.memory()
        good, other = self.pki.server(), self.pki.server()
        cert.offer(good.cert, good.key)
        yield self.serve(cert)
        self.assertFalse(cert.offer(other.cert, good.key))
        self.assertFalse(cert.offer(other.cert, good.key), "refused once, not tried again")
        self.assertEqual(self.reloads("error"), 1)
        self.clock.advance(INTERVAL)
        self.assertEqual(self.reloads("error"), 1)
        self.assertEqual((yield self.fetch()).serial, good.serial)
        self.assertTrue(cert.offer(other.cert, other.key))
        self.assertEqual((yield self.fetch()).serial, other.serial)


class ProtocolTests(TLSTestCase):
    @inlineCallbacks
    def _serve(self, **kw: Any) -> Any:
        self.files.write(self.pki.server())
        cert = self.certificate(**kw)
        cert.load()
        yield self.serve(cert)

    @inlineCallbacks
    def test_tls12_client_gets_an_ecdhe_aead_suite(self) -> Any:
        yield self._serve()
        probe = yield self.fetch(RawClient(self.pki.ca, max_version=SSL.TLS1_2_VERSION))
        self.assertTrue(probe.answered_ok, probe.received)
        self.assertEqual(probe.version, "TLSv1.2")
        self.assertIn(probe.cipher, TLS12_CIPHERS.split(":"))

    @inlineCallbacks
    def test_tls12_cbc_only_client_refused(self) -> Any:
        yield self._serve()
        probe = yield self.fetch(
            RawClient(self.pki.ca, max_version=SSL.TLS1_2_VERSION, ciphers=b"ECDHE-ECDSA-AES128-SHA")
        )
        self.assertRefused(probe, 0)

    @inlineCallbacks
    def test_tls11_client_refused(self) -> Any:
        why = _tls11_unavailable()
        if why is not None:
            raise SkipTest(why)
        yield self._serve()
        probe = yield self.fetch(
            RawClient(
                self.pki.ca,
                min_version=SSL.TLS1_1_VERSION,
                max_version=SSL.TLS1_1_VERSION,
                ciphers=b"DEFAULT:@SECLEVEL=0",
            )
        )
        self.assertRefused(probe, 0)
        self.assertIsNone(probe.serial)

    @inlineCallbacks
    def test_minimum_tls13(self) -> Any:
        yield self._serve(min_version="1.3")
        refused = yield self.fetch(RawClient(self.pki.ca, max_version=SSL.TLS1_2_VERSION))
        self.assertRefused(refused, 0)
        accepted = yield self.fetch()
        self.assertTrue(accepted.answered_ok, accepted.received)
        self.assertEqual(accepted.version, "TLSv1.3")

    def test_unknown_minimum_version_rejected(self) -> None:
        with self.assertRaises(ValueError):
            self.certificate(min_version="1.1")


class StartupTests(TLSTestCase):
    def assertStartupError(self, cert: ReloadingCertificate, *fragments: str) -> None:
        with self.assertRaises(CertificateError) as caught:
            cert.load()
        message = str(caught.exception)
        for fragment in fragments:
            self.assertIn(fragment, message)
        self.assertFalse(cert.loaded)
        self.assertEqual(cert.readiness(), (False, "no TLS certificate loaded"))

    def test_certificate_error_is_a_value_error(self) -> None:
        self.assertTrue(issubclass(CertificateError, ValueError))

    def test_missing_certificate(self) -> None:
        self.files.write(key=self.pki.server().key)
        self.assertStartupError(self.certificate(), self.files.cert, "not found")

    def test_missing_key(self) -> None:
        self.files.write(cert=self.pki.server().cert)
        self.assertStartupError(self.certificate(), self.files.key, "not found")

    def test_garbage_certificate(self) -> None:
        self.files.write(cert=b"this is not a certificate\n", key=self.pki.server().key)
        self.assertStartupError(self.certificate(), self.files.cert, "not a PEM certificate")

    def test_empty_certificate(self) -> None:
        self.files.write(cert=b"", key=self.pki.server().key)
        self.assertStartupError(self.certificate(), self.files.cert, "empty")

    def test_garbage_key(self) -> None:
        self.files.write(cert=self.pki.server().cert, key=b"-----BEGIN PRIVATE KEY-----\nAAAA\n")
        self.assertStartupError(self.certificate(), self.files.key, "private key")

    def test_certificate_where_the_key_should_be(self) -> None:
        pair = self.pki.server()
        self.files.write(cert=pair.cert, key=pair.cert)
        self.assertStartupError(self.certificate(), self.files.key, "private key")

    def test_key_mismatch(self) -> None:
        self.files.write(cert=self.pki.server().cert, key=self.pki.server().key)
        self.assertStartupError(self.certificate(), self.files.key, self.files.cert, "does not match")

    def test_expired(self) -> None:
        now = datetime.datetime.fromtimestamp(self.clock.seconds(), datetime.timezone.utc)
        self.files.write(self.pki.server(not_before=now - 3 * DAY, not_after=now - DAY))
        self.assertStartupError(self.certificate(), self.files.cert, "expired at")

    def test_unreadable_key(self) -> None:
        if os.geteuid() == 0:
            raise SkipTest("file permissions do not stop root from reading")
        self.files.write(self.pki.server())
        os.chmod(self.files.key, 0)
        self.assertStartupError(self.certificate(), self.files.key, "not readable")

    def test_key_is_a_directory(self) -> None:
        self.files.write(cert=self.pki.server().cert)
        os.mkdir(self.files.key)
        self.assertStartupError(self.certificate(), self.files.key, "directory")

    def test_missing_client_ca(self) -> None:
        self.files.write(self.pki.server())
        self.assertStartupError(self.certificate(client_ca=self.files.ca), self.files.ca, "not found")

    def test_garbage_client_ca(self) -> None:
        self.files.write(self.pki.server(), ca=b"nope")
        self.assertStartupError(self.certificate(client_ca=self.files.ca), self.files.ca, "not a PEM certificate")


class StateTests(TLSTestCase):
    def test_readiness_and_expiry_follow_the_clock(self) -> None:
        pair = self.pki.server(days=30)
        self.files.write(pair)
        cert = self.certificate()
        cert.load()
        self.assertTrue(cert.loaded)
        self.assertEqual(cert.serial, pair.serial)
        self.assertEqual(cert.not_after, pair.not_after)
        self.assertIsNotNone(cert.not_after.tzinfo)
        ready, detail = cert.readiness()
        self.assertTrue(ready)
        self.assertIn(f"{pair.serial:#x}", detail)
        self.assertIn(pair.not_after.strftime("%Y-%m-%dT%H:%M:%SZ"), detail)
        self.assertFalse(cert.expired())

        self.clock.advance(pair.not_after.timestamp() - self.clock.seconds() + 1)
        self.assertTrue(cert.expired())
        ready, detail = cert.readiness()
        self.assertFalse(ready)
        self.assertIn("expired at " + pair.not_after.strftime("%Y-%m-%dT%H:%M:%SZ"), detail)

    def test_not_loaded(self) -> None:
        cert = self.certificate()
        self.assertFalse(cert.loaded)
        self.assertFalse(cert.expired())
        self.assertIsNone(cert.serial)
        self.assertFalse(cert.readiness()[0])

    def test_reload_reads_unchanged_files_again(self) -> None:
        self.files.write(self.pki.server())
        cert = self.certificate()
        cert.load()
        self.assertFalse(cert.check())
        self.assertTrue(cert.reload())
        self.assertEqual(self.reloads("success"), 1)


class ServiceTests(TLSTestCase):
    def test_sighup_handler_reloads_and_chains(self) -> None:
        if not hasattr(signal, "SIGHUP"):
            raise SkipTest("no SIGHUP on this platform")
        old = self.pki.server()
        self.files.write(old)
        cert = self.certificate()
        cert.load()

        chained: list[int] = []

        def previous(signum: int, frame: Any) -> None:
            chained.append(signum)

        original = signal.signal(signal.SIGHUP, previous)
        self.addCleanup(signal.signal, signal.SIGHUP, original)
        fake = FakeReactor()
        reload = CertificateReloadService(cert, reactor=fake, clock=self.clock, interval=INTERVAL)
        service = SighupService(fake)
        service.add(reload.what, reload.reload_now)
        service.startService()
        self.addCleanup(lambda: service.running and service.stopService())

        handler = signal.getsignal(signal.SIGHUP)
        self.assertNotEqual(handler, previous)
        new = self.pki.server()
        self.files.write(new)
        handler(signal.SIGHUP, None)

        self.assertEqual(chained, [signal.SIGHUP])
        self.assertEqual(cert.serial, old.serial, "the reload runs on the reactor thread, not in the handler")
        self.assertEqual(len(fake.from_thread), 1)
        f, args = fake.from_thread[0]
        f(*args)
        self.assertEqual(cert.serial, new.serial)
        self.assertEqual(self.reloads("success"), 1)

        service.stopService()
        self.assertEqual(signal.getsignal(signal.SIGHUP), previous)

    def test_sighup_can_be_left_alone(self) -> None:
        if not hasattr(signal, "SIGHUP"):
            raise SkipTest("no SIGHUP on this platform")
        self.files.write(self.pki.server())
        cert = self.certificate()
        cert.load()
        before = signal.getsignal(signal.SIGHUP)
        self.poller(cert)
        self.assertEqual(signal.getsignal(signal.SIGHUP), before)

    def test_a_failing_tick_does_not_stop_polling(self) -> None:
        self.files.write(self.pki.server())
        cert = self.certificate()
        cert.load()
        calls: list[int] = []

        def check() -> bool:
            calls.append(1)
            if len(calls) == 1:
                raise OSError("disk on fire")
            return False

        cert.check = check  # type: ignore[method-assign]
        service = self.poller(cert)
        events: list[dict[str, Any]] = []
        service.log = Logger(observer=events.append)

        self.clock.advance(INTERVAL)
        self.clock.advance(INTERVAL)
        self.assertEqual(len(calls), 2)
        self.assertEqual(len(events), 1)
        self.assertIn("disk on fire", str(events[0]["log_failure"].value))

    def test_stopped_service_no_longer_polls(self) -> None:
        old = self.pki.server()
        self.files.write(old)
        cert = self.certificate()
        cert.load()
        service = self.poller(cert)
        service.stopService()

        self.files.write(self.pki.server())
        self.clock.advance(INTERVAL * 3)
        self.assertEqual(cert.serial, old.serial)
        self.assertEqual(self.clock.getDelayedCalls(), [])
