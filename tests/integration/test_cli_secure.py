"""`rdu up --tls --tokens`: the secured rack on this machine, used through the CLI as a
user does. TLS to the orchestrator, mutual TLS to the node agent and between the
sockets' links (a 2-socket job all-reduces over them), tokens and tenants."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rdurack.processes import local_rack
from rdurack.security.auth import digest
from tests.support.cli import rdu
from tests.support.ports import free_port

pytestmark = pytest.mark.integration

TOKENS = {"alice": "alice-cli-token", "bob": "bob-cli-token"}


def test_a_secured_rack_serves_its_tenants_and_refuses_the_rest(tmp_path: Path) -> None:
    state = tmp_path / "state"
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(
        "tenants: {alice: {socket_quota: 2}, bob: {socket_quota: 1}}\ntokens:\n"
        + "".join(f"  - {{sha256: {digest(t)}, tenant: {n}}}\n" for n, t in TOKENS.items())
    )
    port = free_port()
    address = ["--address", f"127.0.0.1:{port}"]
    ca = str(state / "tls" / "ca.crt")
    try:
        up = rdu(
            "up", "--state-dir", str(state), "--port", str(port), "--nodes", "1",
            "--sockets-per-node", "2", "--tls", "--tokens", str(tokens), timeout=180,
        )  # fmt: skip
        assert up.returncode == 0, up.stderr
        assert f"security: TLS (clients: --tls-ca {Path(ca).resolve()})" in up.stdout
        assert "bearer tokens required" in up.stdout
        log = (state / "logs" / "orchestrator.log").read_text()
        assert "orchestrator: TLS, bearer tokens required (2 tenants)" in log

        plain = rdu("status", *address)
        assert plain.returncode == 1 and "--tls-ca" in plain.stderr
        anonymous = rdu("status", *address, "--tls-ca", ca)
        assert anonymous.returncode == 2, anonymous.stderr
        assert anonymous.stderr.strip().splitlines() == [
            "rdu: a valid bearer token is required (metadata 'authorization: Bearer TOKEN')"
        ]

        alice = [*address, "--tls-ca", ca, "--token", TOKENS["alice"]]
        done = rdu(
            "submit", "kernel", "--model", "llama2-7b", "--phase", "decode", "--sockets", "2",
            "--output-tokens", "4", "--wait", "--json", *alice, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        job = json.loads(done.stdout)
        assert job["state"] == "SUCCEEDED", job
        assert job["kernel_calls"] > 0

        token_file = tmp_path / "bob.token"
        token_file.write_text(TOKENS["bob"] + "\n")
        bob = [*address, "--tls-ca", ca, "--token-file", str(token_file)]
        theirs = rdu("job", job["job_id"], *bob)
        assert theirs.returncode == 2 and "no job of tenant 'bob'" in theirs.stderr
        listed = rdu("jobs", "--json", *bob)
        assert listed.returncode == 0, listed.stderr
        assert json.loads(listed.stdout) == {"jobs": []}
        wide = rdu(
            "submit", "kernel", "--model", "llama2-7b", "--phase", "prefill", "--sockets", "2",
            *bob,
        )  # fmt: skip
        assert wide.returncode == 2
        assert "a job of 2 sockets exceeds its socket quota of 1" in wide.stderr
        hers = rdu("jobs", "--json", *alice)
        assert hers.returncode == 0, hers.stderr
        assert [j["job_id"] for j in json.loads(hers.stdout)["jobs"]] == [job["job_id"]]
    finally:
        local_rack.down(state)
