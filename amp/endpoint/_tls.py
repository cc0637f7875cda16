"""
Client TLS for https endpoints: the options built from an override's
C{ca_bundle}, C{client_cert} and C{client_key}, rebuilt when those files
change so that a rotated client certificate needs no restart.

The client certificate, its chain and its key go to Twisted as
C{cryptography} objects, which pyOpenSSL takes as they are; pyOpenSSL's own
C{X509}/C{PKey} objects are deprecated there.  The trust root is built with
Twisted's public C{trustRootFromCertificates}, which takes Twisted
C{Certificate}s.
"""

from __future__ import annotations

import os
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from OpenSSL import crypto
from twisted.internet.interfaces import IOpenSSLClientConnectionCreator, IReactorTime
from twisted.internet.ssl import Certificate, TLSVersion, optionsForClientTLS, trustRootFromCertificates
from twisted.logger import Logger
from zope.interface import implementer

from amp.config import EndpointSettings
from amp.endpoint._failures import LocalFailure
from amp.files import PEM_LIMIT, FileError, read_file
from amp.reasons import Reason

#: Seconds between looks at an https endpoint's TLS files (on new connections).
TLS_RECHECK = 10.0

log = Logger()


def _read_file(path: str, what: str) -> bytes:
    try:
        return read_file(path, f"{what} {path}", PEM_LIMIT)[0]
    except FileError as e:
        raise LocalFailure(Reason.TLS_ERROR, str(e)) from None


def client_tls(settings: EndpointSettings, host: str) -> IOpenSSLClientConnectionCreator:
    """
    TLS options for one endpoint host: verify the server against
    C{ca_bundle} (every certificate in it; the system's trust store when
    unset) and its name against C{host}, TLS 1.2 at least, and present
    C{client_cert} (leaf first, then any intermediates) with C{client_key}.

    @raise LocalFailure: C{tls-error} when a file does not load.
    """
    trust = None
    if settings.ca_bundle:
        pem = _read_file(settings.ca_bundle, "ca_bundle")
        try:
            cas = x509.load_pem_x509_certificates(pem)
        except ValueError:
            raise LocalFailure(Reason.TLS_ERROR, f"ca_bundle {settings.ca_bundle} holds no PEM certificate") from None
        trust = trustRootFromCertificates([Certificate(crypto.X509.from_cryptography(c)) for c in cas])
    extra: dict[str, Any] = {"raiseMinimumTo": TLSVersion.TLSv1_2}
    if settings.client_cert and settings.client_key:
        try:
            chain = x509.load_pem_x509_certificates(_read_file(settings.client_cert, "client_cert"))
        except ValueError:
            raise LocalFailure(
                Reason.TLS_ERROR, f"client_cert {settings.client_cert} holds no PEM certificate"
            ) from None
        try:
            key = serialization.load_pem_private_key(_read_file(settings.client_key, "client_key"), None)
        except (ValueError, TypeError):
            raise LocalFailure(
                Reason.TLS_ERROR, f"client_key {settings.client_key} is not an unencrypted PEM private key"
            ) from None
        public = serialization.PublicFormat.SubjectPublicKeyInfo
        if key.public_key().public_bytes(serialization.Encoding.DER, public) != chain[0].public_key().public_bytes(
            serialization.Encoding.DER, public
        ):
            raise LocalFailure(
                Reason.TLS_ERROR,
                f"client_key {settings.client_key} does not belong to client_cert {settings.client_cert}",
            )
        extra["privateKey"] = key
        extra["certificate"] = chain[0]
        if len(chain) > 1:
            extra["extraCertChain"] = chain[1:]
    return optionsForClientTLS(host, trustRoot=trust, extraCertificateOptions=extra)


def _stamp(paths: tuple[str, ...]) -> tuple[Any, ...]:
    """
    What identifies the current content of C{paths} (following symlinks, so
    that a Secret volume's C{..data} swap shows as a change).
    """
    out: list[Any] = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            out.append(None)
        else:
            out.append((st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(out)


@implementer(IOpenSSLClientConnectionCreator)
class ReloadingClientTLS:
    """
    The client TLS options of one host, rebuilt when the C{ca_bundle},
    C{client_cert} or C{client_key} files change.  The files are looked at
    only when a new connection is made, at most every L{TLS_RECHECK}
    seconds; a set that does not load leaves the previous options in
    service.

    @raise LocalFailure: from the constructor, when the files do not load.
    """

    def __init__(self, settings: EndpointSettings, host: str, clock: IReactorTime) -> None:
        self._settings = settings
        self._host = host
        self._clock = clock
        self._paths = tuple(p for p in (settings.ca_bundle, settings.client_cert, settings.client_key) if p)
        self._stamp = _stamp(self._paths)
        self._options = client_tls(settings, host)
        self._checked = clock.seconds()

    def clientConnectionForTLS(self, tlsProtocol: Any) -> Any:
        now = self._clock.seconds()
        if self._paths and not 0 <= now - self._checked < TLS_RECHECK:
            self._checked = now
            stamp = _stamp(self._paths)
            if stamp != self._stamp:
                try:
                    self._options = client_tls(self._settings, self._host)
                except LocalFailure as e:
                    log.warn("Keeping the TLS settings in use for {host}: {error}", host=self._host, error=e.message)
                else:
                    self._stamp = stamp
                    log.info("Loaded changed TLS files for {host}", host=self._host)
        return self._options.clientConnectionForTLS(tlsProtocol)
