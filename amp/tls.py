"""
The serving certificate of amp's TLS listener: loading, checking and hot reload.

This module owns everything between the PEM files on disk and the
C{OpenSSL.SSL.Context} each new TLS connection is built from:

L{ReloadingCertificate}
    Loads the certificate chain, private key and (optionally) the CA that
    client certificates must be signed by, checks that they belong together
    and have not expired, and builds an C{SSL.Context} with amp's TLS
    settings.  It is the L{IOpenSSLServerConnectionCreator} of the listener:
    every new connection gets the context that is current at accept time,
    and connections already open keep the context they started with.

    L{ReloadingCertificate.check} notices a change of the files (a rewrite in
    place, or the atomic C{..data} symlink swap the kubelet does for a Secret
    volume) and loads the new set.  A set that does not load (half written,
    key and certificate from different generations, already expired) never
    replaces a good one: the old context stays in service, the failure is
    logged and counted, and the next check tries again.

L{CertificateReloadService}
    Calls C{check()} every few seconds and reloads on C{SIGHUP}
    (L{amp.reload.ReloadService}).

L{TLSServerEndpoint}, L{tls_endpoint}
    TLS through a L{ReloadingCertificate} over any stream server endpoint;
    L{tls_endpoint} builds the webhook's (TCP from a C{serverFromString}
    description, or the workers' shared socket, L{amp.balance}).
    (C{serverFromString("ssl:...")} reads its certificate once and never
    again, so it is not used.)

Wiring, in order: build a L{ReloadingCertificate}, call C{load()} before the
reactor runs (it raises L{CertificateError}, whose message names the file and
the problem, so start-up fails with one clear line), listen with
L{tls_endpoint}, and add a L{CertificateReloadService} to the application.

Change detection compares, for every file, its resolved path, inode, size
and modification time (nanoseconds) with what was last loaded.  A file
rewritten in place with the same size within the file system's timestamp
granularity (a few milliseconds) of the previous load is not noticed by
polling; C{SIGHUP} (L{ReloadingCertificate.reload}) always re-reads.
"""

from __future__ import annotations

import datetime
import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.types import PublicKeyTypes
from OpenSSL import SSL, crypto
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import serverFromString
from twisted.internet.interfaces import (
    IListeningPort,
    IOpenSSLServerConnectionCreator,
    IProtocolFactory,
    IReactorTime,
    IStreamServerEndpoint,
)
from twisted.logger import Logger
from twisted.protocols.tls import TLSMemoryBIOFactory, TLSMemoryBIOProtocol
from zope.interface import implementer, providedBy
from zope.interface.declarations import Provides

from amp.files import PEM_LIMIT, FileError, FileState, Observed, observe, read_file
from amp.metrics import Metrics
from amp.reload import IReloadable, ReloadService

if TYPE_CHECKING:
    from amp.reactors import IAmpReactor

#: TLS 1.2 cipher suites: Mozilla's "intermediate" list without the
#: finite-field DHE suites, i.e. ECDHE key exchange with AES-GCM or
#: ChaCha20-Poly1305.
TLS12_CIPHERS = ":".join(
    (
        "ECDHE-ECDSA-AES128-GCM-SHA256",
        "ECDHE-RSA-AES128-GCM-SHA256",
        "ECDHE-ECDSA-AES256-GCM-SHA384",
        "ECDHE-RSA-AES256-GCM-SHA384",
        "ECDHE-ECDSA-CHACHA20-POLY1305",
        "ECDHE-RSA-CHACHA20-POLY1305",
    )
)

#: TLS 1.3 suites: OpenSSL's three, AES-128-GCM first as in the TLS 1.2 list
#: and as Go's client (the API server's) prefers them on AES hardware.
#: OpenSSL's own order puts AES-256-GCM-SHA384 first, and with the server's
#: preference every handshake ran its key schedule and transcript on
#: SHA-384: 1.4% of amp's instructions per review on a new connection
#: (bench/README.md, "Figures behind the code").
TLS13_CIPHERSUITES = ":".join(("TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256"))

#: The only application protocol offered over ALPN: the API server talks
#: HTTP/1.1 to webhooks.
ALPN_PROTOCOL = b"http/1.1"

_MIN_VERSIONS = {"1.2": SSL.TLS1_2_VERSION, "1.3": SSL.TLS1_3_VERSION}

#: No session resumption: C{OP_NO_TICKET} makes OpenSSL's tickets mere
#: references into the server's session cache, which is off (L{_context}),
#: so none resumes anything.  The API server's webhook client keeps no TLS
#: session cache and never resumes: an encrypted (stateless) ticket was work
#: on every handshake for nobody, 4% of amp's instructions per review on a
#: new connection (bench/README.md, "Figures behind the code"), and its key,
#: living as long as the process, would weaken every session's forward
#: secrecy.
_OPTIONS = (
    SSL.OP_NO_COMPRESSION | SSL.OP_CIPHER_SERVER_PREFERENCE | getattr(SSL, "OP_NO_RENEGOTIATION", 0) | SSL.OP_NO_TICKET
)

_PEM_BEGIN_CERT = b"-----BEGIN CERTIFICATE-----"
_PEM_END_CERT = b"-----END CERTIFICATE-----"


class CertificateError(ValueError):
    """
    A certificate, key or client CA file cannot be used; the message names
    the file and the problem.
    """


def _read(path: str, what: str) -> tuple[bytes, FileState]:
    """
    Read C{path} (at most L{PEM_LIMIT} bytes) and return its bytes with the
    state of exactly the file that was read.
    """
    try:
        return read_file(path, f"{what} {path}", PEM_LIMIT)
    except FileError as e:
        raise CertificateError(str(e)) from None


def _parse_certificates(data: bytes, path: str, what: str) -> list[x509.Certificate]:
    """
    All certificates of a PEM bundle; a bundle whose last block is cut off
    (a file still being written) is refused rather than silently shortened.
    """
    begins, ends = data.count(_PEM_BEGIN_CERT), data.count(_PEM_END_CERT)
    if begins == 0:
        raise CertificateError(f"{what} {path}: not a PEM certificate (no '{_PEM_BEGIN_CERT.decode()}' line)")
    if begins != ends:
        raise CertificateError(f"{what} {path}: truncated PEM certificate ({begins} BEGIN and {ends} END lines)")
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError:
        raise CertificateError(f"{what} {path}: not a valid PEM certificate (malformed or truncated)") from None
    if len(certs) != begins:
        raise CertificateError(f"{what} {path}: only {len(certs)} of {begins} PEM certificates could be parsed")
    return certs


def _parse_key(data: bytes, path: str) -> Any:
    what = "key file"
    try:
        return serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise CertificateError(f"{what} {path}: the private key is encrypted; amp needs an unencrypted key") from None
    except UnsupportedAlgorithm as e:
        raise CertificateError(f"{what} {path}: unsupported private key type ({e})") from None
    except ValueError:
        raise CertificateError(f"{what} {path}: not a valid PEM private key (malformed or truncated)") from None


def _spki(public_key: PublicKeyTypes) -> bytes:
    return public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def _utc(when: datetime.datetime) -> str:
    return when.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _select_alpn(connection: SSL.Connection, offered: list[bytes]) -> Any:
    """
    Pick HTTP/1.1 when the client offers it; otherwise negotiate no
    protocol (the handshake still succeeds).
    """
    if ALPN_PROTOCOL in offered:
        return ALPN_PROTOCOL
    return SSL.NO_OVERLAPPING_PROTOCOLS


@dataclass(frozen=True)
class _Loaded:
    context: SSL.Context
    fingerprint: tuple[Observed, ...]
    serial: int
    not_after: datetime.datetime
    chain: tuple[x509.Certificate, ...] = ()


@implementer(IOpenSSLServerConnectionCreator, IReloadable)
class ReloadingCertificate:
    """
    The serving certificate, reloadable while connections are open.

    @ivar serial: serial number of the certificate in service (C{None}
        until one is loaded).
    @ivar not_after: its expiry as an aware C{datetime} in UTC (C{None}
        until one is loaded).
    """

    log = Logger()

    def __init__(
        self,
        cert_path: str,
        key_path: str,
        *,
        clock: IReactorTime,
        client_ca: Optional[str] = None,
        min_version: str = "1.2",
        metrics: Optional[Metrics] = None,
        memory: bool = False,
    ) -> None:
        """
        @param cert_path: PEM certificate chain, the serving certificate
            first (C{tls.crt}).
        @param key_path: its unencrypted PEM private key (C{tls.key}).
        @param clock: what "now" is for the expiry checks.
        @param client_ca: PEM file of the CA(s) a client certificate must be
            signed by; when given, every client must present one.  It is
            watched and reloaded together with the pair.
        @param min_version: C{"1.2"} or C{"1.3"}.
        @param metrics: where reloads and the expiry time are reported.
        @param memory: the pair is not read from files but given
            (L{offer}, amp's own certificates from their Secret:
            L{amp.registration.SecretCertificates}); C{cert_path} and
            C{key_path} then only name where it came from.
        """
        if min_version not in _MIN_VERSIONS:
            raise ValueError(f"min_version: expected 1.2 or 1.3, got {min_version!r}")
        self.cert_path = cert_path
        self.key_path = key_path
        self.client_ca = client_ca
        self.min_version = min_version
        self._clock = clock
        self._metrics = metrics
        self._current: Optional[_Loaded] = None
        self.memory = memory
        #: In memory mode, the pair to load (the last one offered that loaded, or being tried).
        self._pem: Optional[tuple[bytes, bytes]] = None
        self._refused: Optional[tuple[bytes, bytes]] = None
        #: Called (no arguments) each time a certificate is put into service.
        self.on_install: list[Callable[[], object]] = []

    # ------------------------------------------------------------ state

    @property
    def loaded(self) -> bool:
        """Whether a certificate is in service."""
        return self._current is not None

    @property
    def serial(self) -> Optional[int]:
        return self._current.serial if self._current is not None else None

    @property
    def not_after(self) -> Optional[datetime.datetime]:
        return self._current.not_after if self._current is not None else None

    @property
    def chain(self) -> tuple[x509.Certificate, ...]:
        """The certificate chain in service, leaf first (empty until one is loaded)."""
        return self._current.chain if self._current is not None else ()

    def expired(self) -> bool:
        """
        Whether the certificate in service has expired by the clock.  False
        when none is loaded (see L{loaded}).
        """
        if self._current is None:
            return False
        return self._clock.seconds() >= self._current.not_after.timestamp()

    def readiness(self) -> tuple[bool, str]:
        """
        C{(ready, detail)} for C{/readyz}: ready when a certificate is loaded
        and has not expired.
        """
        current = self._current
        if current is None:
            return False, "no TLS certificate loaded"
        if self.expired():
            return False, f"certificate serial {current.serial:#x} expired at {_utc(current.not_after)}"
        return True, f"certificate serial {current.serial:#x}, expires {_utc(current.not_after)}"

    # ------------------------------------------------------------ loading

    def _paths(self) -> tuple[str, ...]:
        paths: tuple[str, ...] = (self.cert_path, self.key_path)
        if self.client_ca is not None:
            paths += (self.client_ca,)
        return paths

    def fingerprint(self) -> tuple[Observed, ...]:
        """
        The current on-disk state of the certificate, key and client CA files
        (in memory mode: the digest of the pair, and the client CA file).
        """
        if self.memory:
            digest: Any = ("memory", hashlib.sha256(b"\0".join(self._pem or (b"", b""))).hexdigest())
            return (digest, *(observe(p) for p in self._paths()[2:]))
        return tuple(observe(p) for p in self._paths())

    def offer(self, cert_pem: bytes, key_pem: bytes, trigger: str = "the Secret changed") -> bool:
        """
        In memory mode: put this pair in service unless it is the one in
        service.  A pair that does not load (key of another certificate,
        expired, not PEM) never replaces a good one; it is logged and
        counted once, and offering it again does nothing.

        @return: whether a new certificate was put into service.
        """
        pair = (cert_pem, key_pem)
        if not self.memory or pair == self._pem or pair == self._refused:
            return False
        previous, self._pem = self._pem, pair
        if self._attempt(trigger):
            self._refused = None
            return True
        self._pem, self._refused = previous, pair
        return False

    def _build(self) -> _Loaded:
        """
        Read, check and turn the files into a context; raises
        L{CertificateError}.  Nothing is changed here.
        """
        if self.memory:
            if self._pem is None:
                raise CertificateError(f"certificate {self.cert_path}: none given yet")
            cert_data, key_data = self._pem
            cert_state, key_state = self.fingerprint()[0], None
        else:
            cert_data, cert_state = _read(self.cert_path, "certificate file")
            key_data, key_state = _read(self.key_path, "key file")
        chain = _parse_certificates(cert_data, self.cert_path, "certificate file")
        key = _parse_key(key_data, self.key_path)
        leaf = chain[0]
        if _spki(leaf.public_key()) != _spki(key.public_key()):
            raise CertificateError(
                f"key file {self.key_path}: private key does not match the certificate "
                f"in {self.cert_path} (serial {leaf.serial_number:#x})"
            )
        not_after = leaf.not_valid_after_utc
        if self._clock.seconds() >= not_after.timestamp():
            raise CertificateError(
                f"certificate file {self.cert_path}: certificate serial {leaf.serial_number:#x} "
                f"expired at {_utc(not_after)}"
            )
        states: tuple[Observed, ...] = (cert_state, key_state) if key_state is not None else (cert_state,)
        client_cas: list[x509.Certificate] = []
        if self.client_ca is not None:
            ca_data, ca_state = _read(self.client_ca, "client CA file")
            client_cas = _parse_certificates(ca_data, self.client_ca, "client CA file")
            states += (ca_state,)

        try:
            context = self._context(leaf, chain[1:], key, client_cas)
        except (SSL.Error, crypto.Error, ValueError, TypeError) as e:
            raise CertificateError(
                f"certificate file {self.cert_path}: OpenSSL refused the certificate, key or client CA ({e})"
            ) from None
        return _Loaded(context, states, leaf.serial_number, not_after, tuple(chain))

    def _context(
        self,
        leaf: x509.Certificate,
        intermediates: list[x509.Certificate],
        key: Any,
        client_cas: list[x509.Certificate],
    ) -> SSL.Context:
        ctx = SSL.Context(SSL.TLS_SERVER_METHOD)
        ctx.set_min_proto_version(_MIN_VERSIONS[self.min_version])
        ctx.set_options(_OPTIONS)
        ctx.use_certificate(leaf)
        for extra in intermediates:
            ctx.add_extra_chain_cert(extra)
        ctx.use_privatekey(key)
        ctx.check_privatekey()
        # No session is resumed (see _OPTIONS); the context still names
        # itself, which OpenSSL asks for when client certificates are verified.
        ctx.set_session_id(b"amp")
        ctx.set_session_cache_mode(SSL.SESS_CACHE_OFF)
        if client_cas:
            store = ctx.get_cert_store()
            if store is None:
                raise CertificateError("OpenSSL context has no certificate store")
            for ca in client_cas:
                store.add_cert(crypto.X509.from_cryptography(ca))
                ctx.add_client_ca(ca)
            ctx.set_verify(SSL.VERIFY_PEER | SSL.VERIFY_FAIL_IF_NO_PEER_CERT)
        else:
            ctx.set_verify(SSL.VERIFY_NONE)
        ctx.set_alpn_select_callback(_select_alpn)
        ctx.set_cipher_list(TLS12_CIPHERS.encode("ascii"))
        ctx.set_tls13_ciphersuites(TLS13_CIPHERSUITES.encode("ascii"))
        return ctx

    def _install(self, new: _Loaded) -> None:
        self._current = new
        if self._metrics is not None:
            self._metrics.tls_not_after.set(new.not_after.timestamp())
        for installed in self.on_install:
            installed()

    def load(self) -> None:
        """
        Load the files at start-up.

        @raises CertificateError: naming the file and the problem (missing,
            unreadable, not PEM, key does not match, expired).
        """
        new = self._build()
        self._install(new)
        self.log.info(
            "Serving TLS certificate serial {serial} from {cert_path}, expires {not_after}",
            serial=f"{new.serial:#x}",
            cert_path=self.cert_path,
            not_after=_utc(new.not_after),
        )

    def check(self) -> bool:
        """
        Load the files if they changed since the last successful load.

        @return: whether a new certificate was put into service.
        """
        current = self._current
        if self.memory and self._pem is None:
            return False
        if current is not None and self.fingerprint() == current.fingerprint:
            return False
        return self._attempt("files changed")

    def reload(self) -> bool:
        """
        Re-read the files whether or not they look changed (C{SIGHUP}).

        @return: whether a new certificate was put into service.
        """
        if self.memory and self._pem is None:
            return False
        return self._attempt("reload requested")

    def _attempt(self, trigger: str) -> bool:
        """
        Try to replace the certificate in service; on any failure keep it.
        Never raises.
        """
        previous = self._current
        old_serial = f"{previous.serial:#x}" if previous is not None else None
        try:
            new = self._build()
        except CertificateError as e:
            self._count("error")
            self.log.warn(
                "TLS certificate not reloaded ({trigger}), still serving serial {serial}: {reason}",
                trigger=trigger,
                serial=old_serial,
                reason=str(e),
            )
            return False
        except Exception:
            self._count("error")
            self.log.failure(
                "TLS certificate not reloaded ({trigger}), still serving serial {serial}",
                trigger=trigger,
                serial=old_serial,
            )
            return False
        self._install(new)
        self._count("success")
        self.log.info(
            "TLS certificate reloaded ({trigger}): serial {serial} replaces {previous_serial}, expires {not_after}",
            trigger=trigger,
            serial=f"{new.serial:#x}",
            previous_serial=old_serial,
            not_after=_utc(new.not_after),
        )
        return True

    def _count(self, result: str) -> None:
        if self._metrics is not None:
            self._metrics.tls_reloads.labels(result=result).inc()

    # ------------------------------------------------------------ IOpenSSLServerConnectionCreator

    def serverConnectionForTLS(self, tlsProtocol: TLSMemoryBIOProtocol) -> SSL.Connection:
        """
        A server-side connection built from the context in service now.
        """
        current = self._current
        if current is None:
            raise CertificateError(f"certificate file {self.cert_path}: no TLS certificate loaded; call load() first")
        return SSL.Connection(current.context, None)


class CertificateReloadService(ReloadService):
    """
    Polls L{ReloadingCertificate.check} every C{interval} seconds and reloads
    when asked (C{SIGHUP}, L{amp.reload.ReloadService}).

    The certificate must already be loaded (L{ReloadingCertificate.load});
    this service only keeps it current.
    """

    what = "the TLS certificate files"

    def __init__(self, cert: ReloadingCertificate, **kwargs: Any) -> None:
        super().__init__(cert, **kwargs)
        self.cert = cert


@implementer(IStreamServerEndpoint)
class TLSServerEndpoint:
    """
    TLS over any stream server endpoint (C{inner}): every connection it
    accepts is wrapped in TLS from a L{ReloadingCertificate}, with the
    certificate in service when the connection is accepted.  (Twisted has
    C{wrapClientTLS} for clients; C{serverFromString("ssl:...")} reads its
    certificate once and never again.)
    """

    def __init__(self, inner: IStreamServerEndpoint, creator: ReloadingCertificate, clock: IReactorTime) -> None:
        self.inner = inner
        self.creator = creator
        self.clock = clock

    def listen(self, protocolFactory: IProtocolFactory) -> Deferred[IListeningPort]:
        return self.inner.listen(_ServerTLSFactory(self.creator, False, protocolFactory, clock=self.clock))


class _ServerTLSProtocol(TLSMemoryBIOProtocol):
    """
    Twisted's TLS protocol, its interface declarations kept.

    Twisted's C{makeConnection} declares the transport's interfaces one
    C{directlyProvides} at a time (nine for TCP), then all at once, and
    zope.interface caches a declaration only while something holds it: all
    but the last were built again, resolution order and all, on each new
    connection, every review's in a Pod storm (bench/README.md, "Figures
    behind the code").  Holding them makes them cache hits.
    """

    #: The declarations Twisted's makeConnection makes, kept, by the
    #: transport's class (a handful of classes at most).
    _kept: dict[type, tuple[Any, ...]] = {}

    def makeConnection(self, transport: Any) -> None:
        kind = type(transport)
        if kind not in self._kept:
            provided = providedBy(transport)
            # One per interface, then ProtocolWrapper's with them all.
            self._kept[kind] = (*(Provides(type(self), i) for i in provided), Provides(type(self), provided))
        super().makeConnection(transport)  # type: ignore[no-untyped-call]  # Twisted leaves it unannotated


class _ServerTLSFactory(TLSMemoryBIOFactory):
    protocol = _ServerTLSProtocol


def tcp_description(port: int, interface: str, backlog: Optional[int] = None) -> str:
    """
    The C{serverFromString} description of a TCP listener on
    C{interface:port} (an IPv6 interface's colons escaped).
    """
    description = f"tcp:{port}:interface={interface.replace(':', chr(92) + ':')}"
    if backlog is not None:
        description += f":backlog={backlog}"
    return description


def tls_endpoint(
    reactor: IAmpReactor,
    port: int,
    interface: str,
    creator: ReloadingCertificate,
    backlog: int = 128,
    inner: Optional[IStreamServerEndpoint] = None,
) -> IStreamServerEndpoint:
    """
    The webhook listener: TLS on C{interface:port}, each connection using
    the certificate C{creator} has in service when it is accepted.  TLS is
    over C{inner} when given (with workers, the shared socket of
    L{amp.balance.WorkerListener}), else over an ordinary TCP listener.
    """
    if inner is None:
        inner = serverFromString(reactor, tcp_description(port, interface, backlog))
    return TLSServerEndpoint(inner, creator, reactor)
