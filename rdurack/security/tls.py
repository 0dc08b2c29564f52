"""TLS settings, the gRPC credentials made from them, and the rack-membership check.

One TlsConfig, read from files (flags `--tls-ca/--tls-cert/--tls-key` or RDURACK_TLS_CA,
RDURACK_TLS_CERT, RDURACK_TLS_KEY; on Kubernetes a mounted Secret), serves three uses:

- a public server (the orchestrator's JobService and RackService): TLS with its own
  certificate; clients need no certificate, they authenticate with bearer tokens
  (auth.py);
- an in-rack server (node agents, socket links): mutual TLS. The client's certificate
  must chain to the rack CA (the TLS handshake refuses anything else) and must name the
  rack identity (RackPeers, below, refuses PERMISSION_DENIED otherwise);
- a channel: it trusts the CA; in the rack it also presents the member certificate and
  expects the server to be a rack member, whatever address it dialled (in a pod the
  address is an IP, which no certificate names).

The rack identity (RDURACK_TLS_RACK_IDENTITY, default "rdurack-rack") is a DNS
subjectAltName of every member certificate (certs.py). Two racks differ by their CA, or
by their identity when one CA serves several.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import grpc
from pydantic import Field, ValidationError, model_validator

from rdurack.config import Config
from rdurack.errors import InvalidRequest
from rdurack.security.guard import wrap_handler

# cryptography is imported where a certificate is read (ca_pem, read_key_pair): every
# socket actor imports this module (its link server takes a TlsConfig), most racks run
# without TLS, and the import is some 27 ms of each of the 16 actors' start.

DEFAULT_RACK_IDENTITY = "rdurack-rack"
ENV_CA, ENV_CERT, ENV_KEY = "RDURACK_TLS_CA", "RDURACK_TLS_CERT", "RDURACK_TLS_KEY"
ENV_RACK_IDENTITY = "RDURACK_TLS_RACK_IDENTITY"
ENV_SERVER_NAME = "RDURACK_TLS_SERVER_NAME"
PAIR = "--tls-cert and --tls-key go together; give both"
_HOSTNAME = r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?$"


class TlsConfig(Config):
    """Where the PEM files are. `cert_file` and `key_file` go together: a server needs
    them, a client presents them (mutual TLS); a client of the public API needs only
    `ca_file`. `server_name`: the name a client checks in the server's certificate
    instead of the host it dials (None: that host)."""

    ca_file: Path
    cert_file: Path | None = None
    key_file: Path | None = None
    rack_identity: str = Field(default=DEFAULT_RACK_IDENTITY, pattern=_HOSTNAME)
    server_name: str | None = Field(default=None, pattern=_HOSTNAME)

    @model_validator(mode="after")
    def _pair(self) -> TlsConfig:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError(PAIR)
        return self

    # ------------------------------------------------------------------ files

    def ca_pem(self) -> bytes:
        from cryptography import x509  # see the imports

        pem = _read(self.ca_file, "CA file")
        try:
            x509.load_pem_x509_certificates(pem)
        except ValueError:
            raise InvalidRequest(f"TLS CA file {self.ca_file}: not a PEM certificate") from None
        return pem

    def key_pair(self) -> tuple[bytes, bytes]:
        """(private key PEM, certificate chain PEM), checked to belong together."""
        if self.cert_file is None or self.key_file is None:
            raise InvalidRequest("TLS: this end needs its own certificate: --tls-cert, --tls-key")
        return read_key_pair(self.cert_file, self.key_file)

    # ------------------------------------------------------------------ credentials

    def server_credentials(self, rack_peers: bool) -> grpc.ServerCredentials:
        """`rack_peers`: mutual TLS, clients must present a certificate of the rack CA
        (their identity is checked by RackPeers); else any client, TLS only."""
        return grpc.ssl_server_credentials(
            [self.key_pair()],
            root_certificates=self.ca_pem() if rack_peers else None,
            require_client_auth=rack_peers,
        )

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """Trust the CA; present this end's certificate when it has one."""
        if self.cert_file is None:
            return grpc.ssl_channel_credentials(self.ca_pem())
        key, chain = self.key_pair()
        return grpc.ssl_channel_credentials(self.ca_pem(), key, chain)

    def channel_options(self, rack: bool) -> list[tuple[str, str]]:
        """In the rack the server must be a member whatever address was dialled (the
        rack identity); a public client checks `server_name` or the dialled host."""
        name = self.rack_identity if rack else self.server_name
        return [] if name is None else [("grpc.ssl_target_name_override", name)]

    def rack_peers(self) -> RackPeers:
        return RackPeers(self.rack_identity)


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise InvalidRequest(f"TLS {what} {path}: {e.strerror or e}") from None


def read_key_pair(cert_file: Path, key_file: Path) -> tuple[bytes, bytes]:
    """(private key PEM, certificate chain PEM) of a server's own certificate, checked to
    belong together; InvalidRequest (one line naming the file) for a file that cannot be
    read, is not PEM, or a key of another certificate. Any server that takes
    `--tls-cert/--tls-key` checks them with this before it starts."""
    from cryptography import x509  # see the imports
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    cert_pem = _read(cert_file, "certificate")
    key_pem = _read(key_file, "key")
    try:
        cert = x509.load_pem_x509_certificates(cert_pem)[0]
    except ValueError:
        raise InvalidRequest(f"TLS certificate {cert_file}: not a PEM certificate") from None
    try:
        key = load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError):
        raise InvalidRequest(f"TLS key {key_file}: not an unencrypted PEM private key") from None
    if key.public_key() != cert.public_key():
        raise InvalidRequest(f"TLS: key {key_file} does not belong to certificate {cert_file}")
    return key_pem, cert_pem


def tls_from(
    ca: Path | str | None,
    cert: Path | str | None = None,
    key: Path | str | None = None,
    rack_identity: str | None = None,
    server_name: str | None = None,
) -> TlsConfig | None:
    """A TlsConfig from flag or environment values; None (plaintext) when no CA is given.
    A certificate without a CA is refused: TLS here always names the CA it trusts."""
    if not ca:
        if cert or key:
            raise InvalidRequest("TLS: --tls-cert/--tls-key need --tls-ca (the rack CA)")
        return None
    if bool(cert) != bool(key):
        raise InvalidRequest(f"TLS: {PAIR}")
    try:
        return TlsConfig(
            ca_file=Path(ca),
            cert_file=Path(cert) if cert else None,
            key_file=Path(key) if key else None,
            rack_identity=rack_identity or DEFAULT_RACK_IDENTITY,
            server_name=server_name or None,
        )
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise InvalidRequest(f"TLS {where}: {first['msg']}") from None


def tls_from_env(env: Mapping[str, str] | None = None) -> TlsConfig | None:
    e = os.environ if env is None else env
    return tls_from(
        e.get(ENV_CA),
        e.get(ENV_CERT),
        e.get(ENV_KEY),
        e.get(ENV_RACK_IDENTITY),
        e.get(ENV_SERVER_NAME),
    )


def peer_names(context: grpc.ServicerContext) -> list[str]:
    """The verified peer certificate's subjectAltNames and common name; empty without
    one (plaintext, or TLS without a client certificate)."""
    auth = context.auth_context()
    raw = [*auth.get("x509_subject_alternative_name", []), *auth.get("x509_common_name", [])]
    return [n.decode(errors="replace") for n in raw]


class RackPeers(grpc.ServerInterceptor):
    """PERMISSION_DENIED for a call whose client certificate does not name the rack
    identity. The handshake has already checked that the certificate chains to the rack
    CA; this refuses certificates the same CA issued for anything else. The handler it
    builds depends on the method only (security/per_method.py): the certificate is read
    from each call's context."""

    def __init__(self, rack_identity: str) -> None:
        self.rack_identity = rack_identity

    def intercept_service(self, continuation: Any, details: Any) -> Any:
        handler = continuation(details)
        if handler is None:
            return None
        identity = self.rack_identity

        def admit(context: grpc.ServicerContext) -> None:
            if identity not in peer_names(context):
                context.abort(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"only members of rack {identity!r} may call this server",
                )

        return wrap_handler(handler, on_call=admit)
