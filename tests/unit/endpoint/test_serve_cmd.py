"""`rdu serve` as a user runs it: a process that answers the OpenAI API until stopped,
over HTTPS with the rack's tokens when given its files."""

from __future__ import annotations

import os
import signal
import ssl
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.support.certs import make_rack_certs
from tests.support.cli import CLI, ENV, rdu
from tests.support.ports import free_port
from tests.support.tokens import TOKENS, write_tokens


@contextmanager
def rdu_serve(args: list[str], env: dict[str, str]) -> Iterator[subprocess.Popen[str]]:
    """`rdu serve ARGS` until the block ends; then SIGTERM, and it must stop cleanly."""
    proc = subprocess.Popen([*CLI, "serve", *args], env=env, stderr=subprocess.PIPE, text=True)
    try:
        yield proc
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        # uvicorn shuts down; rdu serve releases what it held, then exits 128 + 15.
        assert proc.wait(timeout=30) in (0, 128 + signal.SIGTERM)


def answered(proc: subprocess.Popen[str], ask: Callable[[], httpx.Response]) -> httpx.Response:
    """`ask()`'s response once the server accepts connections (60 s at most)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return ask()
        except httpx.TransportError:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "rdu serve did not answer in 60 s"
            time.sleep(0.1)


def test_rdu_serve_answers_until_it_is_stopped() -> None:
    port = free_port()
    args = ["--model", "llama3.1-8b", "--model", "llama2-7b", "--sockets", "2",
            "--time-scale", "0", "--port", str(port)]  # fmt: skip
    with rdu_serve(args, ENV) as proc:
        url = f"http://127.0.0.1:{port}"
        models = answered(proc, lambda: httpx.get(f"{url}/v1/models", timeout=5)).json()
        assert [m["id"] for m in models["data"]] == ["llama3.1-8b", "llama2-7b"]
        done = httpx.post(
            f"{url}/v1/completions",
            json={"model": "llama2-7b", "prompt": "hi", "max_tokens": 3},
            timeout=30,
        ).json()
        assert done["usage"]["completion_tokens"] == 3
    said = proc.stderr.read() if proc.stderr else ""
    assert "serving llama3.1-8b, llama2-7b on 2 sn40l-rack16 sockets each" in said
    assert "no tokens: anyone who reaches it may use every model" in said
    assert "Traceback" not in said


def test_rdu_serve_with_the_racks_files_in_its_variables(tmp_path: Path) -> None:
    """As a pod runs it: the tokens file and the certificate from RDURACK_TOKENS,
    RDURACK_TLS_CERT and RDURACK_TLS_KEY (the orchestrator's variables)."""
    certs = make_rack_certs(tmp_path / "tls").member
    assert certs.cert_file and certs.key_file
    env = {
        **ENV,
        "RDURACK_TOKENS": str(write_tokens(tmp_path / "tokens.yaml")),
        "RDURACK_TLS_CERT": str(certs.cert_file),
        "RDURACK_TLS_KEY": str(certs.key_file),
    }
    port = free_port()
    args = ["--model", "llama2-7b", "--sockets", "8", "--time-scale", "0", "--port", str(port)]
    body = {"model": "llama2-7b", "prompt": "hi", "max_tokens": 2}

    def token(tenant: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {TOKENS[tenant]}"}

    trusting = ssl.create_default_context(cafile=str(certs.ca_file))
    with rdu_serve(args, env) as proc, httpx.Client(verify=trusting, timeout=30) as http:
        url = f"https://127.0.0.1:{port}"
        assert answered(proc, lambda: http.get(f"{url}/health")).status_code == 200
        assert http.post(f"{url}/v1/completions", json=body).status_code == 401
        done = http.post(f"{url}/v1/completions", json=body, headers=token("alice"))
        assert done.json()["usage"]["completion_tokens"] == 2
        refused = http.post(f"{url}/v1/completions", json=body, headers=token("bob"))
        assert refused.status_code == 403, refused.text  # bob's quota is 4 sockets
        with pytest.raises(httpx.TransportError):
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=10)
    said = proc.stderr.read() if proc.stderr else ""
    assert f"https://127.0.0.1:{port}/v1" in said
    assert "bearer tokens required (3 tenants); /health, /metrics open" in said
    assert "Traceback" not in said


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "gpt-9"], "unknown model 'gpt-9'"),
        (["--model", "llama2-7b", "--model", "llama2-7b"], "each model once"),
        (["--chunk-tokens", "64"], "chunked-prefill's"),
        (["--spec", "/nonexistent/spec.yaml"], "/nonexistent/spec.yaml"),
        (["--platform", "sn40l-node", "--sockets", "8", "--model", "llama2-7b", "--model",
          "llama3.1-8b"], "exceed sn40l-node's 8"),
        (["--tokens", "/nonexistent/tokens.yaml"], "tokens file /nonexistent/tokens.yaml"),
        (["--tls-cert", "/nonexistent/tls.crt"], "--tls-cert and --tls-key go together"),
        (["--tls-cert", "/nonexistent/tls.crt", "--tls-key", "/nonexistent/tls.key"],
         "TLS certificate /nonexistent/tls.crt"),
        (["--wait-rack", "30"], "--wait-rack is --rack's"),
        (["--rack", "--wait-rack", "-1"], "--wait-rack"),
    ],
)  # fmt: skip
def test_bad_serve_options_are_one_line(args: list[str], message: str) -> None:
    done = rdu("serve", *args)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert message in done.stderr
