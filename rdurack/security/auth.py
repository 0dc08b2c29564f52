"""Bearer tokens: who is calling, which tenant that is, and what it may do.

A tokens file (YAML, or JSON, which is YAML) names the tenants and the tokens that map
to them. Tokens are stored as SHA-256 hex digests, never in the clear:

    tenants:
      alice: {socket_quota: 8}        # at most 8 sockets SCHEDULED or RUNNING at once
      bob: {socket_quota: 4}
      ops: {admin: true}              # sees every job; may call AdminService
    tokens:
      - {sha256: 2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae, tenant: alice}
      - {sha256: ..., tenant: bob}

(`printf %s "$TOKEN" | sha256sum` gives a digest; `rdu token --tenant alice` makes a
random token and prints its line.) A client sends `authorization: Bearer TOKEN` in the
call's metadata. A tenant without `socket_quota` has no quota.

`Authenticator` is what servers hold:

- `principal(context)`: the caller's Principal(tenant, admin, socket_quota), or the call
  ends UNAUTHENTICATED (no token, or one the file does not know: the same answer for
  both, so it reveals nothing);
- `require_admin(context)`: the Principal if it is an admin, else PERMISSION_DENIED.
  This is the check for administrative services (AdminService: faults):

      def InjectFault(self, request, context):
          self.auth.require_admin(context)   # first line of every admin method
          ...

- `interceptor()`: refuses every call without a valid token to every service but
  grpc.health.v1 (so a method that forgets to ask cannot be reached anonymously).

Without a tokens file, `Authenticator.open()` lets everyone in as OPEN (an admin of no
tenant), which is the local default (`rdu up`); servers say so when they start.

Every presented token is hashed and compared with every stored digest in constant time
(hmac.compare_digest, no early exit), so timing reveals neither which entry matched nor
how much of a digest did.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import yaml
from pydantic import Field, ValidationError, model_validator

from rdurack.config import Config
from rdurack.errors import InvalidRequest
from rdurack.security.guard import wrap_handler

HEALTH_SERVICE = "grpc.health.v1.Health"
MAX_TOKEN_CHARS = 512  # longer "tokens" are refused before hashing
_TENANT = r"^[a-z0-9]([a-z0-9._-]{0,62})$"
_BEARER = "bearer "
UNAUTHENTICATED = "a valid bearer token is required (metadata 'authorization: Bearer TOKEN')"


class TenantPolicy(Config):
    socket_quota: int | None = Field(default=None, ge=1, le=1 << 16)  # None: no quota
    admin: bool = False


class TokenEntry(Config):
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    tenant: str = Field(pattern=_TENANT)


class TokensFile(Config):
    tenants: dict[str, TenantPolicy] = Field(min_length=1)
    tokens: list[TokenEntry] = Field(min_length=1)

    @model_validator(mode="after")
    def _consistent(self) -> TokensFile:
        for name in self.tenants:
            TokenEntry(sha256="0" * 64, tenant=name)  # the same rule for tenant names
        unknown = sorted({t.tenant for t in self.tokens} - set(self.tenants))
        if unknown:
            raise ValueError(f"tokens name tenants not in 'tenants': {', '.join(unknown)}")
        digests = [t.sha256 for t in self.tokens]
        if len(set(digests)) != len(digests):
            raise ValueError("a token digest is listed twice")
        return self


def digest(token: str) -> str:
    """The SHA-256 hex digest a tokens file stores for `token`."""
    return hashlib.sha256(token.encode()).hexdigest()


def load_tokens(path: Path) -> TokensFile:
    """Read and validate a tokens file; errors name the file and the field."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise InvalidRequest(f"tokens file {path}: {e.strerror or e}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise InvalidRequest(f"tokens file {path}: not YAML ({type(e).__name__})") from None
    try:
        return TokensFile.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "(top level)"
        raise InvalidRequest(f"tokens file {path}: {where}: {first['msg']}") from None


def with_token(tokens: TokensFile, tenant: str, token: str) -> TokensFile:
    """`tokens` with `token`'s digest added for `tenant`, which keeps its policy if the
    file has it, and is added without a quota if not."""
    tenants = {**tokens.tenants}
    tenants.setdefault(tenant, TenantPolicy())
    entry = TokenEntry(sha256=digest(token), tenant=tenant)
    return TokensFile(tenants=tenants, tokens=[*tokens.tokens, entry])


def dump_tokens(tokens: TokensFile) -> str:
    """A tokens file's text (YAML), which `load_tokens` reads back as `tokens`."""
    return yaml.safe_dump(tokens.model_dump(mode="json", exclude_defaults=True), sort_keys=False)


@dataclass(frozen=True)
class Principal:
    """Who a call comes from. `tenant` None: no tenant (the open local default)."""

    tenant: str | None
    admin: bool = False
    socket_quota: int | None = None

    @property
    def scope(self) -> str | None:
        """Whose jobs it may see: its tenant's, or None (every job) for an admin."""
        return None if self.admin else self.tenant

    @property
    def owner(self) -> str:
        """The tenant its submissions belong to ("" for none)."""
        return self.tenant or ""


OPEN = Principal(tenant=None, admin=True)


class Authenticator:
    """Bearer-token authentication against a tokens file; `Authenticator.open()` for
    none (module docstring)."""

    def __init__(self, tokens: TokensFile | None) -> None:
        self.tokens = tokens
        self._entries: list[tuple[str, Principal]] = []
        if tokens is not None:
            for t in tokens.tokens:
                policy = tokens.tenants[t.tenant]
                self._entries.append(
                    (t.sha256, Principal(t.tenant, policy.admin, policy.socket_quota))
                )

    @classmethod
    def open(cls) -> Authenticator:
        return cls(None)

    @classmethod
    def from_file(cls, path: Path | None) -> Authenticator:
        return cls(None if path is None else load_tokens(path))

    @property
    def is_open(self) -> bool:
        return self.tokens is None

    def quotas(self) -> dict[str, int]:
        """Tenant -> socket quota, for the tenants that have one."""
        if self.tokens is None:
            return {}
        return {
            name: p.socket_quota
            for name, p in self.tokens.tenants.items()
            if p.socket_quota is not None
        }

    def authenticate(self, metadata: Mapping[str, str | bytes] | Any) -> Principal | None:
        """The principal of `authorization: Bearer TOKEN` in `metadata` (pairs or a
        mapping); None without a known token. OPEN when there is no tokens file."""
        if self.tokens is None:
            return OPEN
        pairs = metadata.items() if isinstance(metadata, Mapping) else metadata
        header = next((v for k, v in pairs or () if k == "authorization"), None)
        if not isinstance(header, str) or header[: len(_BEARER)].lower() != _BEARER:
            return None
        token = header[len(_BEARER) :].strip()
        if not token or len(token) > MAX_TOKEN_CHARS:
            return None
        presented = digest(token)
        found: Principal | None = None
        for stored, principal in self._entries:  # every entry: no early exit
            if hmac.compare_digest(stored, presented):
                found = principal
        return found

    def principal(self, context: grpc.ServicerContext) -> Principal:
        found = self.authenticate(context.invocation_metadata())
        if found is None:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED)
            raise AssertionError("unreachable: context.abort raises")
        return found

    def require_admin(self, context: grpc.ServicerContext) -> Principal:
        """The caller, if it is an admin; else the call ends (UNAUTHENTICATED without a
        valid token, PERMISSION_DENIED for a tenant that is not an admin)."""
        found = self.principal(context)
        if not found.admin:
            context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"tenant {found.tenant!r} is not an admin; this needs an admin token",
            )
        return found

    def interceptor(self) -> grpc.ServerInterceptor | None:
        """Refuses calls without a valid token to every service but health; None when
        open (nothing to refuse)."""
        return None if self.tokens is None else _RequireToken(self)


class _RequireToken(grpc.ServerInterceptor):
    """The handler it builds depends on the method only (security/per_method.py): the
    token is read from each call's context."""

    def __init__(self, auth: Authenticator) -> None:
        self.auth = auth

    def intercept_service(self, continuation: Any, details: Any) -> Any:
        handler = continuation(details)
        if handler is None or str(details.method).startswith(f"/{HEALTH_SERVICE}/"):
            return handler
        auth = self.auth

        def admit(context: grpc.ServicerContext) -> None:
            auth.principal(context)

        return wrap_handler(handler, on_call=admit)
