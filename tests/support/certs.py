"""Certificates of the security tests: one rack's CA and member, and the outsiders."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rdurack.security.certs import LOCAL_HOSTS, CertificateAuthority, Issued
from rdurack.security.tls import DEFAULT_RACK_IDENTITY, TlsConfig


@dataclass(frozen=True)
class RackCerts:
    member: TlsConfig  # the rack's own certificate (orchestrator, agents, links)
    client: TlsConfig  # a public client: trusts the rack CA, has no certificate
    stranger: TlsConfig  # a certificate of the rack's own CA, for another identity
    foreign: TlsConfig  # a rack-identity certificate of another CA


def _write(directory: Path, ca_pem: bytes, issued: Issued) -> TlsConfig:
    directory.mkdir(parents=True)
    (directory / "ca.crt").write_bytes(ca_pem)
    (directory / "tls.crt").write_bytes(issued.cert_pem)
    (directory / "tls.key").write_bytes(issued.key_pem)
    return TlsConfig(
        ca_file=directory / "ca.crt",
        cert_file=directory / "tls.crt",
        key_file=directory / "tls.key",
    )


def make_rack_certs(root: Path) -> RackCerts:
    """A rack's CA with its member, a public client, a stranger and a foreigner, in `root`."""
    ca = CertificateAuthority("the rack's CA")
    member = _write(
        root / "member", ca.cert_pem, ca.issue("m", [DEFAULT_RACK_IDENTITY, *LOCAL_HOSTS])
    )
    stranger = _write(root / "stranger", ca.cert_pem, ca.issue("s", ["someone.example"]))
    other = CertificateAuthority("another rack's CA")
    foreign = _write(
        root / "foreign", other.cert_pem, other.issue("f", [DEFAULT_RACK_IDENTITY, *LOCAL_HOSTS])
    )
    return RackCerts(member, TlsConfig(ca_file=member.ca_file), stranger, foreign)
