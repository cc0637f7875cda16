"""Tests for amp_dev.devcert: the development CA, serving and client certificates."""

from __future__ import annotations

import base64
import datetime
import ipaddress
import stat

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID
from cryptography.x509.verification import DNSName, IPAddress, PolicyBuilder, Store, VerificationError

from amp_dev import devcert


def _load(paths: dict, name: str) -> x509.Certificate:
    return x509.load_pem_x509_certificate(paths[name].read_bytes())


def _sans(cert: x509.Certificate) -> x509.SubjectAlternativeName:
    return cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value


def _server_verifier(ca: x509.Certificate, subject, when=None):
    builder = PolicyBuilder().store(Store([ca]))
    if when is not None:
        builder = builder.time(when)
    return builder.build_server_verifier(subject)


def test_files_parse_and_keys_match(tmp_path):
    paths = devcert.write_dev_tls(tmp_path / "tls")
    assert {p.name for p in paths.values()} == {
        "ca.crt",
        "ca.key",
        "tls.crt",
        "tls.key",
        "client.crt",
        "client.key",
    }
    for cert_name, key_name in (("ca_cert", "ca_key"), ("cert", "key"), ("client_cert", "client_key")):
        cert = _load(paths, cert_name)
        key = serialization.load_pem_private_key(paths[key_name].read_bytes(), password=None)
        assert isinstance(key, ec.EllipticCurvePrivateKey)
        assert key.curve.name == "secp256r1"
        assert cert.public_key().public_numbers() == key.public_key().public_numbers()


def test_key_files_are_private(tmp_path):
    paths = devcert.write_dev_tls(tmp_path)
    for name in ("ca_key", "key", "client_key"):
        assert stat.S_IMODE(paths[name].stat().st_mode) == 0o600, name


def test_default_sans(tmp_path):
    paths = devcert.write_dev_tls(tmp_path)
    sans = _sans(_load(paths, "cert"))
    assert sans.get_values_for_type(x509.DNSName) == [
        "localhost",
        "amp",
        "amp.amp-system",
        "amp.amp-system.svc",
        "amp.amp-system.svc.cluster.local",
    ]
    assert sans.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("::1"),
    ]


def test_server_cert_verifies_against_ca_for_every_default_name(tmp_path):
    paths = devcert.write_dev_tls(tmp_path)
    ca, leaf = _load(paths, "ca_cert"), _load(paths, "cert")
    for subject in (
        DNSName("localhost"),
        DNSName("amp.amp-system.svc"),
        IPAddress(ipaddress.ip_address("127.0.0.1")),
        IPAddress(ipaddress.ip_address("::1")),
    ):
        chain = _server_verifier(ca, subject).verify(leaf, [])
        assert chain[-1] == ca
    with pytest.raises(VerificationError):
        _server_verifier(ca, DNSName("example.com")).verify(leaf, [])


def test_server_cert_is_rejected_by_another_ca(tmp_path):
    paths = devcert.write_dev_tls(tmp_path)
    other_ca, _ = devcert.make_ca("someone else")
    with pytest.raises(VerificationError):
        _server_verifier(other_ca, DNSName("localhost")).verify(_load(paths, "cert"), [])


def test_extended_key_usages(tmp_path):
    paths = devcert.write_dev_tls(tmp_path)
    server_eku = _load(paths, "cert").extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    client_eku = _load(paths, "client_cert").extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(server_eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert list(client_eku) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    ca = _load(paths, "ca_cert")
    verified = PolicyBuilder().store(Store([ca])).build_client_verifier().verify(_load(paths, "client_cert"), [])
    assert verified.chain[-1] == ca
    # A serving certificate must not pass as a client certificate.
    with pytest.raises(VerificationError):
        PolicyBuilder().store(Store([ca])).build_client_verifier().verify(_load(paths, "cert"), [])


def test_validity_window(tmp_path):
    before = datetime.datetime.now(datetime.timezone.utc)
    paths = devcert.write_dev_tls(tmp_path, days=30)
    leaf = _load(paths, "cert")
    assert leaf.not_valid_before_utc <= before - datetime.timedelta(minutes=4)
    expected_end = before + datetime.timedelta(days=30)
    assert abs(leaf.not_valid_after_utc - expected_end) < datetime.timedelta(minutes=1)


def test_rerun_keeps_ca_and_reissues_server_cert(tmp_path):
    first = devcert.write_dev_tls(tmp_path)
    ca_pem = first["ca_cert"].read_bytes()
    ca_key_pem = first["ca_key"].read_bytes()
    serial = _load(first, "cert").serial_number
    client_serial = _load(first, "client_cert").serial_number

    second = devcert.write_dev_tls(tmp_path)
    assert second["ca_cert"].read_bytes() == ca_pem
    assert second["ca_key"].read_bytes() == ca_key_pem
    assert _load(second, "cert").serial_number != serial
    assert _load(second, "client_cert").serial_number != client_serial
    # The new certificate still chains to the CA already in a caBundle.
    _server_verifier(x509.load_pem_x509_certificate(ca_pem), DNSName("localhost")).verify(_load(second, "cert"), [])


def test_keep_leaves_existing_certs_alone(tmp_path):
    first = devcert.write_dev_tls(tmp_path)
    tls_pem = first["cert"].read_bytes()
    again = devcert.write_dev_tls(tmp_path, keep=True)
    assert again["cert"].read_bytes() == tls_pem
    # Asking for other names re-issues even with keep.
    other = devcert.write_dev_tls(tmp_path, ["amp.example.internal"], keep=True)
    assert other["cert"].read_bytes() != tls_pem
    assert _sans(_load(other, "cert")).get_values_for_type(x509.DNSName) == ["amp.example.internal"]


def test_mismatched_ca_files_are_replaced(tmp_path):
    first = devcert.write_dev_tls(tmp_path)
    _, stray_key = devcert.make_ca("stray")
    first["ca_key"].write_bytes(devcert.pem_key(stray_key))
    second = devcert.write_dev_tls(tmp_path)
    ca = _load(second, "ca_cert")
    key = serialization.load_pem_private_key(second["ca_key"].read_bytes(), password=None)
    assert ca.public_key().public_numbers() == key.public_key().public_numbers()
    _server_verifier(ca, DNSName("localhost")).verify(_load(second, "cert"), [])


def test_expired_cert_for_tests_fails_verification():
    now = datetime.datetime.now(datetime.timezone.utc)
    ca, ca_key = devcert.make_ca("test CA", not_before=now - datetime.timedelta(days=3))
    cert, _ = devcert.issue_cert(
        ca,
        ca_key,
        "amp",
        ["localhost"],
        not_before=now - datetime.timedelta(days=2),
        not_after=now - datetime.timedelta(days=1),
    )
    with pytest.raises(VerificationError):
        _server_verifier(ca, DNSName("localhost"), when=now).verify(cert, [])
    # The same certificate was fine while it was valid.
    _server_verifier(ca, DNSName("localhost"), when=now - datetime.timedelta(hours=36)).verify(cert, [])


def test_issue_cert_rejects_empty_hosts_and_backwards_validity():
    ca, ca_key = devcert.make_ca("test CA")
    with pytest.raises(ValueError):
        devcert.issue_cert(ca, ca_key, "amp", [])
    now = datetime.datetime.now(datetime.timezone.utc)
    with pytest.raises(ValueError):
        devcert.issue_cert(ca, ca_key, "amp", ["localhost"], not_before=now, not_after=now)


def test_cli_hosts_days_and_ca_bundle(tmp_path, capsys):
    assert devcert.main([str(tmp_path), "--hosts", "amp.test, 10.0.0.7", "--days", "2"]) == 0
    out = capsys.readouterr().out
    paths = {k: tmp_path / v for k, v in devcert.FILE_NAMES.items()}
    leaf = _load(paths, "cert")
    sans = _sans(leaf)
    assert sans.get_values_for_type(x509.DNSName) == ["amp.test"]
    assert sans.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("10.0.0.7")]
    assert leaf.not_valid_after_utc - leaf.not_valid_before_utc < datetime.timedelta(days=2, minutes=6)
    bundle = [line.split(": ", 1)[1] for line in out.splitlines() if line.startswith("caBundle: ")]
    assert base64.b64decode(bundle[0]) == paths["ca_cert"].read_bytes()


def test_cli_rejects_bad_days(tmp_path):
    with pytest.raises(SystemExit):
        devcert.main([str(tmp_path), "--days", "0"])


def test_client_certificate_with_groups_and_no_hosts() -> None:
    """
    A Kubernetes client identity: organizations become groups, no SANs
    needed; server use still requires a host.
    """
    from cryptography.x509.oid import NameOID

    ca_cert, ca_key = devcert.make_ca("test-ca")
    cert, _ = devcert.issue_cert(ca_cert, ca_key, "admin", (), client=True, organizations=("system:masters",))
    assert [a.value for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)] == ["system:masters"]
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usages) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    both, _ = devcert.issue_cert(ca_cert, ca_key, "peer", ["127.0.0.1"], client=True, server=True)
    assert set(both.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == {
        ExtendedKeyUsageOID.SERVER_AUTH,
        ExtendedKeyUsageOID.CLIENT_AUTH,
    }
    with pytest.raises(ValueError, match="host"):
        devcert.issue_cert(ca_cert, ca_key, "server", ())
