"""A tokens file of three tenants (alice and bob with quotas, ops an admin)."""

from __future__ import annotations

from pathlib import Path

from rdurack.security.auth import digest

TOKENS = {"alice": "alice-secret-token", "bob": "bob-secret-token", "ops": "ops-secret-token"}


def write_tokens(path: Path) -> Path:
    lines = [
        "tenants:",
        "  alice: {socket_quota: 8}",
        "  bob: {socket_quota: 4}",
        "  ops: {admin: true}",
        "tokens:",
        *(f"  - {{sha256: {digest(t)}, tenant: {n}}}" for n, t in TOKENS.items()),
    ]
    path.write_text("\n".join(lines) + "\n")
    return path
