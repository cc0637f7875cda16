"""
amp's own CA and serving certificate (pure; the time is passed in): making
them (L{make_ca}, L{issue}), the names a serving certificate must carry
(L{serving_names}), and the Secret that keeps them (L{Held}: read from and
written to the Secret's C{data}; the replicas' reports of what they serve
in its annotations).

The Secret (type C{kubernetes.io/tls}) holds::

    tls.crt   the serving certificate (PEM)
    tls.key   its key
    ca.crt    the caBundle: every CA the registration trusts, oldest first
    ca.key    the key of the newest CA (the one that issues); an older CA
              only stays trusted while replicas may still serve its
              certificate, and issues nothing
"""

from __future__ import annotations

import base64
import binascii
import datetime
import hashlib
import ipaddress
import re
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence
from urllib.parse import urlsplit

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes, PublicKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = [
    "CA_BUNDLE",
    "CA_KEY",
    "Held",
    "REPORT_PREFIX",
    "ROTATE_ANNOTATION",
    "TLS_CERT",
    "TLS_KEY",
    "Report",
    "fingerprint",
    "issue",
    "issued_by",
    "make_ca",
    "pem",
    "read_reports",
    "report_key",
    "report_value",
    "serving_names",
]

TLS_CERT, TLS_KEY, CA_BUNDLE, CA_KEY = "tls.crt", "tls.key", "ca.crt", "ca.key"
#: An operator's request for a new CA now (its value is not read):
#: C{kubectl annotate secret ... amp.txn2.com/rotate-ca=now}.
ROTATE_ANNOTATION = "amp.txn2.com/rotate-ca"
#: Each replica's report of the certificate it serves: C{<prefix><identity>: <sha256> <unix time>}.
REPORT_PREFIX = "serving.amp.txn2.com/"
#: A new certificate starts this long before it is made (clocks that disagree a little).
BACKDATE = 60.0


def _when(seconds: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def key_pem(key: PrivateKeyTypes) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def fingerprint(cert: x509.Certificate) -> str:
    """The SHA-256 of the certificate's DER, in hex: how reports name it."""
    return hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()


def make_ca(now: float, validity: float, name: str = "amp CA") -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A self-signed CA valid from C{now} (less L{BACKDATE}) for C{validity} seconds."""
    key = _key()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} {int(now)}")])
    public = key.public_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(_when(now - BACKDATE))
        .not_valid_after(_when(now + validity))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def issue(
    ca: x509.Certificate, ca_key: Any, names: Sequence[str], now: float, validity: float
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """
    A serving certificate for C{names} (DNS names; IP addresses as IP
    SANs) signed by C{ca}, valid for C{validity} seconds but never beyond
    the CA.
    """
    key = _key()
    sans: list[x509.GeneralName] = []
    for name in names:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            sans.append(x509.DNSName(name))
    not_after = min(now + validity, ca.not_valid_after_utc.timestamp())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0] if names else "amp")]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_when(now - BACKDATE))
        .not_valid_after(_when(not_after))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return cert, key


def issued_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    """Whether C{ca} signed C{cert}."""
    if cert.issuer != ca.subject:
        return False
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def serving_names(service: str, namespace: str, url: Optional[str] = None) -> tuple[str, ...]:
    """The names amp's serving certificate carries: the Service's DNS names, and C{url}'s host."""
    names = [
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
        f"{service}.{namespace}",
        service,
    ]
    if url:
        host = urlsplit(url).hostname
        if host and host not in names:
            names.insert(0, host)
    return tuple(names)


def names_of(cert: x509.Certificate) -> frozenset[str]:
    """The DNS names and IP addresses C{cert} names."""
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return frozenset()
    return frozenset(
        [*sans.get_values_for_type(x509.DNSName), *(str(ip) for ip in sans.get_values_for_type(x509.IPAddress))]
    )


@dataclass(frozen=True)
class Held:
    """
    What the Secret holds (parsed).

    @ivar cas: the caBundle, oldest first; the last is the CA that issues.
    @ivar ca_key: the key of C{cas[-1]} (None: missing or not its key).
    @ivar cert: the serving certificate (None: missing or unreadable).
    @ivar key: its key (None: missing, unreadable or not its key).
    """

    cas: tuple[x509.Certificate, ...]
    ca_key: Any
    cert: Optional[x509.Certificate]
    key: Any

    @property
    def bundle(self) -> bytes:
        return b"".join(pem(ca) for ca in self.cas)

    def data(self) -> dict[str, str]:
        """The Secret's C{data} (base64) holding this."""
        raw = {CA_BUNDLE: self.bundle}
        if self.ca_key is not None:
            raw[CA_KEY] = key_pem(self.ca_key)
        if self.cert is not None and self.key is not None:
            raw[TLS_CERT], raw[TLS_KEY] = pem(self.cert), key_pem(self.key)
        return {k: base64.b64encode(v).decode("ascii") for k, v in raw.items()}

    @classmethod
    def read(cls, data: Optional[Mapping[str, Any]]) -> Optional["Held"]:
        """
        The Secret's C{data} parsed; None when it holds no usable CA (a
        Secret amp must fill again).  A key that does not belong to its
        certificate is read as missing.
        """
        raw = {}
        for name in (TLS_CERT, TLS_KEY, CA_BUNDLE, CA_KEY):
            value = (data or {}).get(name)
            if isinstance(value, str):
                try:
                    raw[name] = base64.b64decode(value, validate=True)
                except (binascii.Error, ValueError):
                    pass
        try:
            cas = tuple(x509.load_pem_x509_certificates(raw[CA_BUNDLE]))
        except (KeyError, ValueError):
            return None
        if not cas:
            return None
        ca_key = _load_key(raw.get(CA_KEY), cas[-1])
        cert: Optional[x509.Certificate] = None
        try:
            cert = x509.load_pem_x509_certificate(raw[TLS_CERT])
        except (KeyError, ValueError):
            pass
        key = _load_key(raw.get(TLS_KEY), cert) if cert is not None else None
        return cls(cas, ca_key, cert, key)


def _spki(public: PublicKeyTypes) -> bytes:
    return public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def _load_key(data: Optional[bytes], cert: Optional[x509.Certificate]) -> Any:
    if data is None or cert is None:
        return None
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError):
        return None
    return key if _spki(key.public_key()) == _spki(cert.public_key()) else None


@dataclass(frozen=True)
class Report:
    """A replica's report: the certificate it serves (L{fingerprint}) as of C{at} (unix time)."""

    fingerprint: str
    at: float


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def report_key(identity: str) -> str:
    """The annotation a replica reports under (its name part at most 63 characters, alphanumeric at both ends)."""
    name = _UNSAFE.sub("-", identity).strip("-._") or "replica"
    if len(name) > 63:
        name = name[:50].rstrip("-._") + "-" + hashlib.sha256(identity.encode()).hexdigest()[:12]
    return REPORT_PREFIX + name


def report_value(serving: str, at: float) -> str:
    return f"{serving} {int(at)}"


def read_reports(annotations: Optional[Mapping[str, Any]]) -> dict[str, Report]:
    """Every replica's report, by annotation key (an unreadable one is left out)."""
    out = {}
    for key, value in (annotations or {}).items():
        if not key.startswith(REPORT_PREFIX) or not isinstance(value, str):
            continue
        parts = value.split()
        if len(parts) == 2 and parts[1].isdigit():
            out[key] = Report(parts[0], float(parts[1]))
    return out
