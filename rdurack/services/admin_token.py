"""Who may call rdurack.v1.AdminService: a bearer token, compared in constant time.

The one place that decides it (a tenant-token module replaces it later): the servicer
takes `authorize(context)`, which returns for an admin and aborts the call otherwise.
A call without `authorization: Bearer <token>` metadata, or with another token, is
UNAUTHENTICATED. (PERMISSION_DENIED, a valid token that is not an admin's, needs
tokens that are not admin tokens, which this module does not know.)
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Callable
from pathlib import Path

import grpc

from rdurack.rack.errors import InvalidRequest

# Fewer characters than this is not a secret worth the name (token_urlsafe(32) gives 43).
MIN_TOKEN_CHARS = 16
HEADER = "authorization"

Authorize = Callable[[grpc.ServicerContext], None]


def new_token() -> str:
    return secrets.token_urlsafe(32)


def write_token(path: Path) -> str:
    """A new token in `path`, readable by its owner only (0600)."""
    token = new_token()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600)
    path.chmod(0o600)
    path.write_text(token + "\n")
    return token


def read_token(path: Path) -> str:
    try:
        token = path.read_text().strip()
    except OSError as e:
        raise InvalidRequest(f"admin token file {path}: {e.strerror or e}") from None
    if len(token) < MIN_TOKEN_CHARS or any(c.isspace() for c in token):
        raise InvalidRequest(
            f"admin token file {path}: one token of at least {MIN_TOKEN_CHARS} characters "
            "without spaces expected"
        )
    return token


def bearer(token: str) -> tuple[tuple[str, str | bytes], ...]:
    """The call metadata that presents `token`."""
    return ((HEADER, f"Bearer {token}"),)


def admin_token_authorizer(token: str) -> Authorize:
    """`authorize(context)`: returns if the call presents `token`, else aborts it."""
    expected = token.encode()

    def authorize(context: grpc.ServicerContext) -> None:
        values = [v for k, v in context.invocation_metadata() if k == HEADER]
        if not values:
            context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                "AdminService needs an admin token: `authorization: Bearer <token>` metadata",
            )
        value = values[0] if isinstance(values[0], str) else values[0].decode(errors="replace")
        scheme, _, presented = value.partition(" ")
        if scheme.lower() != "bearer" or not presented.strip():
            context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                "authorization metadata: expected `Bearer <token>`",
            )
        if not hmac.compare_digest(presented.strip().encode(), expected):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "not a valid admin token")

    return authorize
