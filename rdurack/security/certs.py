"""Throwaway certificates: a rack CA and the certificates it signs.

`rdu up --tls`, `rdu certs` and the tests all make their certificates here. Keys are
ECDSA P-256 (fast to make, and every gRPC TLS stack accepts them). A rack member's
certificate names the rack identity as a DNS subjectAltName; tls.py checks for it on
both ends of in-rack connections, so a certificate that the same CA issued for anything
else (a user, another rack) does not make its holder a member.

Files, named as a Kubernetes TLS Secret names its keys (`kubectl create secret generic
rdurack-tls --from-file=DIR` mounts them unchanged):

    ca.crt   the rack CA's certificate (PEM): what every peer and client trusts
    tls.crt  the member certificate (PEM), serverAuth and clientAuth
    tls.key  its private key (PEM, PKCS#8, unencrypted; written 0600)

The CA's own key is never written: to add a member, make the set again.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_FILE = "ca.crt"
CERT_FILE = "tls.crt"
KEY_FILE = "tls.key"
DEFAULT_DAYS = 30  # throwaway: long enough for a development rack, short if one leaks
# Names a local rack's member certificate carries besides the rack identity, so that
# clients on this machine can verify the orchestrator by the address they dial.
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")


@dataclass(frozen=True)
class Issued:
    """A certificate and its private key, both PEM."""

    cert_pem: bytes
    key_pem: bytes


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _names(hosts: Sequence[str]) -> list[x509.GeneralName]:
    out: list[x509.GeneralName] = []
    for host in hosts:
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            out.append(x509.DNSName(host))
    return out


class CertificateAuthority:
    """A self-signed CA held in memory; `issue` signs certificates with it."""

    def __init__(self, name: str = "rdurack rack CA", days: int = DEFAULT_DAYS) -> None:
        self._key = _key()
        self.days = days
        now = datetime.datetime.now(datetime.UTC)
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))  # clock skew
            .not_valid_after(now + datetime.timedelta(days=days))
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
            .sign(self._key, hashes.SHA256())
        )

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def issue(self, common_name: str, hosts: Sequence[str]) -> Issued:
        """A certificate for `hosts` (DNS names or IP addresses, as subjectAltNames),
        valid for TLS servers and clients alike."""
        if not hosts:
            raise ValueError("a certificate needs at least one host name")
        key = _key()
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=self.days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName(_names(hosts)), critical=False)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
            .sign(self._key, hashes.SHA256())
        )
        return Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def write_rack_set(
    out_dir: Path,
    rack_identity: str,
    hosts: Sequence[str] = LOCAL_HOSTS,
    days: int = DEFAULT_DAYS,
) -> Path:
    """A new CA and one member certificate for `rack_identity` plus `hosts`, written to
    `out_dir` as ca.crt, tls.crt and tls.key; returns `out_dir`."""
    ca = CertificateAuthority(f"rdurack rack CA ({rack_identity})", days)
    member = ca.issue(rack_identity, [rack_identity, *hosts])
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / CA_FILE).write_bytes(ca.cert_pem)
    (out_dir / CERT_FILE).write_bytes(member.cert_pem)
    key = out_dir / KEY_FILE
    key.unlink(missing_ok=True)
    # Created 0600, never world-readable even for an instant.
    fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(member.key_pem)
    return out_dir
