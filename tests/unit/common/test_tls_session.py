"""
What a TLS handshake with amp's listener negotiates, run in memory (two
memory BIOs, no socket): the suite a client like the API server's gets,
that no session is resumed (nobody resumes; see L{amp.tls}), and the TLS
protocol's interface declarations.
"""

from __future__ import annotations

import gc
import ssl
import weakref
from pathlib import Path

from OpenSSL import SSL
from twisted.internet.address import IPv4Address
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.protocols.tls import TLSMemoryBIOFactory, TLSMemoryBIOProtocol
from twisted.trial.unittest import TestCase
from zope.interface import directlyProvidedBy, providedBy
from zope.interface.declarations import Provides

from amp.tls import TLS13_CIPHERSUITES, ReloadingCertificate, _ServerTLSFactory, _ServerTLSProtocol
from amp_dev.devcert import write_dev_tls


class _Handshake:
    """
    One client (the standard library's C{ssl}, as a Python client would)
    against one server connection of a L{ReloadingCertificate}, with the
    bytes carried between their memory BIOs by hand.
    """

    def __init__(
        self, cert: ReloadingCertificate, ca: Path, client: ssl.SSLContext, session: "ssl.SSLSession | None" = None
    ) -> None:
        client.load_verify_locations(cafile=str(ca))
        client.check_hostname = False
        self.server = cert.serverConnectionForTLS(None)  # type: ignore[arg-type]  # the protocol is unused
        self.server.set_accept_state()
        self._incoming, self._outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.client = client.wrap_bio(self._incoming, self._outgoing, server_side=False, session=session)

    def _carry(self) -> None:
        data = self._outgoing.read()
        if data:
            self.server.bio_write(data)
        try:
            self.server.do_handshake()
        except SSL.WantReadError:
            pass
        try:
            self._incoming.write(self.server.bio_read(1 << 16))
        except SSL.WantReadError:
            pass

    def run(self) -> None:
        """Shake hands, then let the client read what the server sends after it (a ticket, if any)."""
        for _ in range(10):
            try:
                self.client.do_handshake()
                break
            except ssl.SSLWantReadError:
                self._carry()
        else:
            raise AssertionError("the handshake did not finish")
        self._carry()
        try:
            self.client.read(1)
        except ssl.SSLWantReadError:
            pass


class HandshakeTests(TestCase):
    def setUp(self) -> None:
        files = write_dev_tls(self.mktemp())
        self.ca = files["ca_cert"]
        self.cert = ReloadingCertificate(str(files["cert"]), str(files["key"]), clock=Clock())
        self.cert.load()

    def test_tls13_prefers_aes128_gcm_sha256(self) -> None:
        """
        A client offering OpenSSL's TLS 1.3 suites in their default order
        (AES-256 first) gets AES-128-GCM-SHA256, the first of amp's list.
        """
        shake = _Handshake(self.cert, self.ca, ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT))
        shake.run()
        self.assertEqual(shake.client.version(), "TLSv1.3")
        self.assertEqual(shake.client.cipher()[0], "TLS_AES_128_GCM_SHA256")
        self.assertEqual(TLS13_CIPHERSUITES.split(":")[0], "TLS_AES_128_GCM_SHA256")

    def test_no_session_is_resumed(self) -> None:
        """
        Offering the session of a full handshake on the next connection
        gets another full handshake: in TLS 1.3 (tickets) and in TLS 1.2
        (tickets or session IDs) alike.
        """
        for version in (ssl.TLSVersion.TLSv1_3, ssl.TLSVersion.TLSv1_2):
            client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            client.maximum_version = version
            first = _Handshake(self.cert, self.ca, client)
            first.run()
            session = first.client.session
            assert session is not None
            second = _Handshake(self.cert, self.ca, client, session)
            second.run()
            self.assertEqual(second.client.version(), version.name.replace("_", "."))
            self.assertFalse(second.client.session_reused, version)


class DeclarationTests(TestCase):
    """
    The listener's TLS protocol declares what Twisted's declares, and keeps
    the declarations Twisted's makeConnection builds on every connection.
    """

    def _connected(self, cert: ReloadingCertificate) -> TLSMemoryBIOProtocol:
        factory = _ServerTLSFactory(cert, False, Factory.forProtocol(Protocol), clock=Clock())
        protocol = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 1))
        assert isinstance(protocol, TLSMemoryBIOProtocol)
        protocol.makeConnection(StringTransport())
        return protocol

    def test_declarations_are_twisteds_and_survive_the_connection(self) -> None:
        files = write_dev_tls(self.mktemp())
        cert = ReloadingCertificate(str(files["cert"]), str(files["key"]), clock=Clock())
        cert.load()
        protocol = self._connected(cert)
        self.assertIsInstance(protocol, _ServerTLSProtocol)
        twisteds = TLSMemoryBIOProtocol(TLSMemoryBIOFactory(cert, False, Factory.forProtocol(Protocol)), Protocol())
        twisteds.makeConnection(StringTransport())
        self.assertEqual(list(directlyProvidedBy(protocol)), list(directlyProvidedBy(twisteds)))
        interfaces = list(providedBy(StringTransport()))
        self.assertGreater(len(interfaces), 1)
        transport = StringTransport()
        declared = [weakref.ref(Provides(_ServerTLSProtocol, i)) for i in (*interfaces, providedBy(transport))]
        del protocol, twisteds
        gc.collect()
        # Every declaration Twisted's loop made is still alive, so the next
        # connection's are cache hits, not new specifications.
        self.assertNotIn(None, [ref() for ref in declared])
        again = self._connected(cert)
        self.assertIs(again.__provides__, declared[-1]())  # type: ignore[attr-defined]  # zope sets it
