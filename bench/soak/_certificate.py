"""
The soak's rotating serving certificate: L{RotatingCertificate} writes amp's
certificate into a Secret-volume-shaped directory and swaps in a new one from
the same CA whenever the driver (L{bench.soak.driver}) rotates it.
"""

from __future__ import annotations

from pathlib import Path

from tests.support.helpers import SecretVolume


class RotatingCertificate:
    """
    amp's serving certificate in a directory laid out like a Kubernetes
    Secret volume (L{tests.support.helpers.SecretVolume}: C{tls.crt} and C{tls.key}
    are links into C{..data}, swapped atomically as the kubelet does);
    L{rotate} issues a new one from the same CA.  The generation before the
    current one is kept until the next rotation, so a reload that resolved
    the old link a moment before the swap still finds its files.
    """

    def __init__(self, directory: str, ca_cert_path: str, ca_key_path: str) -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import serialization

        with open(ca_cert_path, "rb") as f:
            self.ca_cert = x509.load_pem_x509_certificate(f.read())
        with open(ca_key_path, "rb") as f:
            self.ca_key = serialization.load_pem_private_key(f.read(), None)
        self.serials: list[int] = []
        self.volume = SecretVolume(Path(directory), self._issue(), keep=1)
        self.cert = self.volume.path("tls.crt")
        self.key = self.volume.path("tls.key")

    def _issue(self) -> dict[str, bytes]:
        from amp_dev.devcert import DEFAULT_HOSTS, issue_cert, pem_cert, pem_key

        cert, key = issue_cert(self.ca_cert, self.ca_key, "amp", DEFAULT_HOSTS, days=1)
        self.serials.append(cert.serial_number)
        return {"tls.key": pem_key(key), "tls.crt": pem_cert(cert)}

    def rotate(self) -> int:
        """Issue a new serving certificate and swap it in; returns its serial."""
        self.volume.swap(self._issue())
        return self.serials[-1]
