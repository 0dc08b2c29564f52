"""`rdu token`: a new token and its line, or (--add-to, --out) a copy of a tokens file
with the token added and the token in a file of its own, as make k8s-secrets uses it."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from rdurack.security.auth import Authenticator, Principal, load_tokens
from tests.support.cli import rdu, rdu_json
from tests.support.tokens import write_tokens


def test_a_token_and_its_line(tmp_path: Path) -> None:
    out = rdu_json("token", "--tenant", "alice")
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(
        f"tenants: {{alice: {{}}}}\ntokens: [{{sha256: {out['sha256']}, tenant: alice}}]\n"
    )
    auth = Authenticator(load_tokens(tokens))
    assert auth.authenticate({"authorization": f"Bearer {out['token']}"}) == Principal("alice")


def test_added_to_a_copy_of_a_tokens_file(tmp_path: Path) -> None:
    given = write_tokens(tmp_path / "tokens.yaml")
    before = given.read_text()
    done = rdu("token", "--tenant", "bob", "--add-to", str(given), "--out", str(tmp_path / "o"))
    assert done.returncode == 0, done.stderr
    assert "wrote" in done.stdout and "token" in done.stdout
    token_file, tokens_file = tmp_path / "o" / "token", tmp_path / "o" / "tokens.yaml"
    token = token_file.read_text().strip()
    assert token not in done.stdout  # a credential: in its file only
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    merged = load_tokens(tokens_file)
    # bob keeps his quota of 4; his old token still works, and the new one too.
    assert merged.tenants == load_tokens(given).tenants and given.read_text() == before
    auth = Authenticator(merged)
    assert auth.authenticate({"authorization": f"Bearer {token}"}) == Principal("bob", False, 4)
    again = rdu_json("token", "--tenant", "new-one", "--add-to", str(given), "--out",
                     str(tmp_path / "o"))  # fmt: skip
    assert (again["tenant"], again["token_file"]) == ("new-one", str(tmp_path / "o" / "token"))
    # Written anew from the file given: the previous run's token is gone.
    auth = Authenticator(load_tokens(tokens_file))
    assert auth.authenticate({"authorization": f"Bearer {token}"}) is None
    new = (tmp_path / "o" / "token").read_text().strip()
    assert auth.authenticate({"authorization": f"Bearer {new}"}) == Principal("new-one")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--add-to", "tokens.yaml"], "--add-to and --out go together"),
        (["--out", "o"], "--add-to and --out go together"),
        (["--add-to", "/nonexistent/tokens.yaml", "--out", "o"], "/nonexistent/tokens.yaml"),
    ],
)
def test_bad_token_options_are_one_line(args: list[str], message: str) -> None:
    done = rdu("token", "--tenant", "alice", *args)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and message in done.stderr
