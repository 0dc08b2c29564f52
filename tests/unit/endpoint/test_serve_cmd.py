"""`rdu serve` as a user runs it: a process that answers the OpenAI API until stopped."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import httpx
import pytest

from tests.support.cli import CLI, ENV, rdu
from tests.support.ports import free_port


def test_rdu_serve_answers_until_it_is_stopped() -> None:
    port = free_port()
    args = ["serve", "--model", "llama3.1-8b", "--model", "llama2-7b", "--sockets", "2",
            "--time-scale", "0", "--port", str(port)]  # fmt: skip
    proc = subprocess.Popen([*CLI, *args], env=ENV, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5).json()
                break
            except httpx.TransportError:
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                assert time.monotonic() < deadline, "rdu serve did not answer in 60 s"
                time.sleep(0.1)
        assert [m["id"] for m in models["data"]] == ["llama3.1-8b", "llama2-7b"]
        done = httpx.post(
            f"http://127.0.0.1:{port}/v1/completions",
            json={"model": "llama2-7b", "prompt": "hi", "max_tokens": 3},
            timeout=30,
        ).json()
        assert done["usage"]["completion_tokens"] == 3
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        # uvicorn shuts down, then ends by the signal it was sent.
        assert proc.wait(timeout=30) in (0, -signal.SIGTERM)
    said = proc.stderr.read() if proc.stderr else ""
    assert "serving llama3.1-8b, llama2-7b on 2 sn40l-rack16 sockets each" in said
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
    ],
)  # fmt: skip
def test_bad_serve_options_are_one_line(args: list[str], message: str) -> None:
    done = rdu("serve", *args)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert message in done.stderr
