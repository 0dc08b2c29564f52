"""`rdu certs` and `rdu token`: the files a secured rack needs (docs: README "Security")."""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Annotated

import typer

from rdurack.cli.options import JsonOpt
from rdurack.errors import InvalidRequest
from rdurack.security import certs
from rdurack.security.auth import TokenEntry, digest, dump_tokens, load_tokens, with_token
from rdurack.security.tls import DEFAULT_RACK_IDENTITY

TOKEN_BYTES = 32  # 256 random bits, URL-safe base64: nothing to guess
# `rdu token --add-to --out`'s files, named as the Secrets' keys the pods read.
TOKENS_FILE, TOKEN_FILE = "tokens.yaml", "token"


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
    add_to: Annotated[
        Path | None,
        typer.Option(
            "--add-to",
            help="a tokens file: write it to --out with the token added (the tenant too, "
            "without a quota, if it lacks it), and the token beside it; it is not changed",
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out", help=f"with --add-to: the directory for {TOKENS_FILE} and {TOKEN_FILE}"
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """A new random bearer token and its line for a tokens file (only its digest is
    stored there; give the token itself to the tenant). With --add-to and --out, a copy
    of a tokens file with the token added, and the token in a file (0600): what a
    Kubernetes Secret is made from (make k8s-secrets: the endpoint's own token)."""
    if (add_to is None) != (out is None):
        raise InvalidRequest("--add-to and --out go together")
    token = secrets.token_urlsafe(TOKEN_BYTES)
    try:
        entry = TokenEntry(sha256=digest(token), tenant=tenant)
    except ValueError:
        raise InvalidRequest(
            f"--tenant {tenant!r}: lowercase letters, digits, '.', '_' and '-', "
            "starting with a letter or digit, at most 63 characters"
        ) from None
    if add_to is not None and out is not None:
        written = _add_token(add_to, out, tenant, token)
        if as_json:
            print(json.dumps({**{k: str(v) for k, v in written.items()}, **entry.model_dump()}))
            return
        print(f"wrote {written['tokens_file']} ({add_to} and {tenant}'s new token) and "
              f"{written['token_file']} (the token)")  # fmt: skip
        return
    if as_json:
        print(json.dumps({"token": token, **entry.model_dump()}))
        return
    print(f"token: {token}")
    print(f"tokens file line:  - {{sha256: {entry.sha256}, tenant: {entry.tenant}}}")


def _add_token(tokens_file: Path, out: Path, tenant: str, token: str) -> dict[str, Path]:
    """OUT/tokens.yaml: `tokens_file` with `token` for `tenant`; OUT/token: the token,
    readable by its owner only (it is a credential; the tokens file holds digests)."""
    merged = dump_tokens(with_token(load_tokens(tokens_file), tenant, token))
    written = {"tokens_file": out / TOKENS_FILE, "token_file": out / TOKEN_FILE}
    try:
        out.mkdir(parents=True, exist_ok=True)
        written["tokens_file"].write_text(merged, encoding="utf-8")
        written["token_file"].unlink(missing_ok=True)  # a new file takes the mode below
        fd = os.open(written["token_file"], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(token + "\n")
    except OSError as e:
        raise InvalidRequest(f"--out {out}: {e.strerror or e}") from None
    return written
