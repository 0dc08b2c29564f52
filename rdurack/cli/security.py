"""`rdu certs` and `rdu token`: the files a secured rack needs (docs: README "Security")."""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Annotated

import typer

from rdurack.cli.options import JsonOpt
from rdurack.errors import InvalidRequest
from rdurack.security import certs
from rdurack.security.auth import TokenEntry, digest
from rdurack.security.tls import DEFAULT_RACK_IDENTITY

TOKEN_BYTES = 32  # 256 random bits, URL-safe base64: nothing to guess


def certs_cmd(
    out: Annotated[Path, typer.Option("--out", help="directory for ca.crt, tls.crt, tls.key")],
    host: Annotated[
        list[str] | None,
        typer.Option(
            "--host",
            help="a name or IP clients dial the orchestrator or the endpoint by (repeatable)",
        ),
    ] = None,
    rack_identity: Annotated[
        str, typer.Option(help="the name every rack member's certificate carries")
    ] = DEFAULT_RACK_IDENTITY,
    days: Annotated[int, typer.Option(min=1, max=3650, help="validity")] = certs.DEFAULT_DAYS,
) -> None:
    """A new rack CA and one member certificate for the orchestrator, node agents and
    links (for a Kubernetes Secret: kubectl create secret generic rdurack-tls --from-file=OUT)."""
    hosts = [*certs.LOCAL_HOSTS, *(host or [])]
    try:
        certs.write_rack_set(out, rack_identity, hosts, days)
    except (OSError, ValueError) as e:
        raise InvalidRequest(f"--out {out}: {e}") from None
    print(f"wrote {out / certs.CA_FILE}, {out / certs.CERT_FILE}, {out / certs.KEY_FILE}")


def token_cmd(
    tenant: Annotated[str, typer.Option(help="the tenant the token maps to")],
    as_json: JsonOpt = False,
) -> None:
    """A new random bearer token and its line for a tokens file (only its digest is
    stored there; give the token itself to the tenant)."""
    token = secrets.token_urlsafe(TOKEN_BYTES)
    try:
        entry = TokenEntry(sha256=digest(token), tenant=tenant)
    except ValueError:
        raise InvalidRequest(
            f"--tenant {tenant!r}: lowercase letters, digits, '.', '_' and '-', "
            "starting with a letter or digit, at most 63 characters"
        ) from None
    if as_json:
        print(json.dumps({"token": token, **entry.model_dump()}))
        return
    print(f"token: {token}")
    print(f"tokens file line:  - {{sha256: {entry.sha256}, tenant: {entry.tenant}}}")
