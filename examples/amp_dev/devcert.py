"""
Development certificates for amp: a private CA, a serving certificate and a
client certificate, all EC P-256, written as PEM files.

This module owns certificate *creation* for development, tests and the
end-to-end harness. Loading and hot-reloading certificates for the TLS
listener belongs to ``amp.tls``.

Command line::

    python -m amp_dev.devcert DIR [--hosts h1,h2,...] [--days N] [--keep]

writes into ``DIR``:

``ca.crt`` / ``ca.key``
    The CA. Its certificate is what goes into the webhook's ``caBundle``
    (the command prints it base64-encoded).
``tls.crt`` / ``tls.key``
    amp's serving certificate, signed by the CA, ``extendedKeyUsage``
    serverAuth, with one subjectAltName per host (IP literals become IP
    SANs, everything else DNS SANs). ``--hosts`` *replaces* the default
    list, which is ``localhost, 127.0.0.1, ::1, amp, amp.amp-system,
    amp.amp-system.svc, amp.amp-system.svc.cluster.local``.
``client.crt`` / ``client.key``
    A client certificate (``extendedKeyUsage`` clientAuth, CN and DNS SAN
    ``kube-apiserver``) signed by the same CA, for exercising amp's
    verification of the API server's client certificate.

Re-running against a directory that already holds a usable CA keeps the CA,
so a ``caBundle`` already registered with the API server stays valid; the
CA is replaced only when its files are missing, unreadable, do not belong
together, or the CA has expired. The serving and client certificates are
re-issued on every run (new key, new serial) unless ``--keep`` is given, in
which case existing ones are kept as long as they still parse, were issued
by the CA in the directory, have not expired and carry exactly the requested
host names. Key files are written with mode 0600.
Certificates are valid from five minutes before now (to tolerate clock skew)
for ``--days`` days (default 365).
"""

from __future__ import annotations

import argparse
import base64
import datetime
import ipaddress
import os
import sys
from pathlib import Path
from typing import Iterable, Sequence

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DEFAULT_HOSTS: tuple[str, ...] = (
    "localhost",
    "127.0.0.1",
    "::1",
    "amp",
    "amp.amp-system",
    "amp.amp-system.svc",
    "amp.amp-system.svc.cluster.local",
)
CLIENT_COMMON_NAME = "kube-apiserver"
CA_COMMON_NAME = "amp development CA"
DEFAULT_DAYS = 365
CA_DAYS = 3650
CLOCK_SKEW = datetime.timedelta(minutes=5)

FILE_NAMES: dict[str, str] = {
    "ca_cert": "ca.crt",
    "ca_key": "ca.key",
    "cert": "tls.crt",
    "key": "tls.key",
    "client_cert": "client.crt",
    "client_key": "client.key",
}


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def _name(common_name: str, organizations: Iterable[str] = ("amp development",)) -> x509.Name:
    return x509.Name(
        [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
        + [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    )


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def make_ca(
    common_name: str = CA_COMMON_NAME,
    *,
    days: int = CA_DAYS,
    not_before: datetime.datetime | None = None,
    not_after: datetime.datetime | None = None,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """
    Create a self-signed CA certificate and its EC P-256 key.

    The CA may sign end-entity certificates only (path length 0).
    """
    key = ec.generate_private_key(ec.SECP256R1())
    start = not_before if not_before is not None else _now() - CLOCK_SKEW
    end = not_after if not_after is not None else start + CLOCK_SKEW + datetime.timedelta(days=days)
    public = key.public_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
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
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def issue_cert(
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    common_name: str,
    hosts: Iterable[str],
    *,
    client: bool = False,
    server: bool | None = None,
    organizations: Iterable[str] = ("amp development",),
    days: int = DEFAULT_DAYS,
    not_before: datetime.datetime | None = None,
    not_after: datetime.datetime | None = None,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """
    Issue an end-entity certificate signed by ``ca_cert``/``ca_key``.

    ``hosts`` become subjectAltNames (IP literals as IP SANs, the rest as
    DNS SANs). ``client`` adds clientAuth; ``server`` (by default: not
    ``client``) adds serverAuth and needs at least one host.
    ``organizations`` are the subject's O attributes (Kubernetes reads
    them as a client certificate's groups). The validity defaults to five
    minutes ago until ``days`` days from now; ``not_before``/``not_after``
    override it (e.g. to make an expired certificate for tests).
    """
    server = not client if server is None else server
    names = [_san(h) for h in hosts]
    if server and not names:
        raise ValueError("a certificate needs at least one host name or address")
    if not (server or client):
        raise ValueError("a certificate needs server or client use")
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    start = not_before if not_before is not None else now - CLOCK_SKEW
    end = not_after if not_after is not None else now + datetime.timedelta(days=days)
    if end <= start:
        raise ValueError("not_after must be later than not_before")
    usages = [ExtendedKeyUsageOID.SERVER_AUTH] if server else []
    usages += [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
    ca_ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name, organizations))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
    )
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(ca_key, hashes.SHA256()), key


def pem_cert(cert: x509.Certificate) -> bytes:
    """PEM encoding of a certificate."""
    return cert.public_bytes(serialization.Encoding.PEM)


def pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    """Unencrypted PKCS#8 PEM encoding of a private key."""
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write(path: Path, data: bytes, mode: int) -> None:
    """
    Write ``data`` to ``path`` atomically with permission ``mode``.

    The temporary file is created with ``mode`` already set, so a private
    key is never readable by others, not even briefly.
    """
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.unlink()
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink()
        except FileNotFoundError:
            pass
        raise


def _load_pair(cert_path: Path, key_path: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None:
    """Load a certificate and its key; None unless both parse and match."""
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except (OSError, ValueError, TypeError):
        return None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        return None
    if cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    ) != key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo):
        return None
    return cert, key


def _issued_by(cert: x509.Certificate, ca_cert: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca_cert)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def _still_good(cert: x509.Certificate, ca_cert: x509.Certificate, hosts: Sequence[str]) -> bool:
    """True when ``cert`` was issued by ``ca_cert``, has not expired and names exactly ``hosts``."""
    if not _issued_by(cert, ca_cert) or cert.not_valid_after_utc <= _now():
        return False
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    return set(sans) == {_san(h) for h in hosts}


def write_dev_tls(
    directory: str | os.PathLike[str],
    hosts: Sequence[str] | None = None,
    *,
    days: int = DEFAULT_DAYS,
    keep: bool = False,
) -> dict[str, Path]:
    """
    Write (or refresh) the development CA, serving and client certificates.

    Returns the paths, keyed ``ca_cert``, ``ca_key``, ``cert``, ``key``,
    ``client_cert``, ``client_key``. See the module docstring for what is
    kept and what is re-issued on a second run.
    """
    if days < 1:
        raise ValueError("days must be at least 1")
    host_list = list(DEFAULT_HOSTS if hosts is None else hosts)
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    paths = {k: out / v for k, v in FILE_NAMES.items()}

    ca = _load_pair(paths["ca_cert"], paths["ca_key"])
    if ca is not None and ca[0].not_valid_after_utc <= _now():
        ca = None
    ca_is_new = ca is None
    if ca is None:
        ca = make_ca(CA_COMMON_NAME)
        _write(paths["ca_key"], pem_key(ca[1]), 0o600)
        _write(paths["ca_cert"], pem_cert(ca[0]), 0o644)
    ca_cert, ca_key = ca

    for prefix, common_name, names, client in (
        ("", "amp", host_list, False),
        ("client_", CLIENT_COMMON_NAME, [CLIENT_COMMON_NAME], True),
    ):
        cert_path, key_path = paths[prefix + "cert"], paths[prefix + "key"]
        if keep and not ca_is_new:
            existing = _load_pair(cert_path, key_path)
            if existing is not None and _still_good(existing[0], ca_cert, names):
                continue
        cert, key = issue_cert(ca_cert, ca_key, common_name, names, client=client, days=days)
        _write(key_path, pem_key(key), 0o600)
        _write(cert_path, pem_cert(cert), 0o644)
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; see the module docstring."""
    parser = argparse.ArgumentParser(
        prog="python -m amp_dev.devcert",
        description="Write a development CA plus serving and client certificates for amp.",
    )
    parser.add_argument("directory", help="output directory (created if missing)")
    parser.add_argument(
        "--hosts",
        help="comma-separated DNS names / IP addresses for the serving certificate "
        "(replaces the default: %s)" % ",".join(DEFAULT_HOSTS),
    )
    parser.add_argument("--days", type=int, default=DEFAULT_DAYS, help="validity of the issued certificates")
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep existing serving/client certificates issued by the CA instead of re-issuing",
    )
    args = parser.parse_args(argv)
    hosts = None
    if args.hosts is not None:
        hosts = [h.strip() for h in args.hosts.split(",") if h.strip()]
        if not hosts:
            parser.error("--hosts needs at least one name")
    if args.days < 1:
        parser.error("--days must be at least 1")
    paths = write_dev_tls(args.directory, hosts, days=args.days, keep=args.keep)
    for label, path in paths.items():
        print(f"{label}: {path}")
    print("caBundle: " + base64.b64encode(paths["ca_cert"].read_bytes()).decode("ascii"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
