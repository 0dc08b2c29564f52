"""Smoke test: the dev overlay's endpoint container (k8s/components/serve), run as a local
process with its own command, args and environment, rewritten as test_smoke.py rewrites
the rack's (tests/support/pods.py): its Secrets' volumes filled as `make k8s-secrets`
fills them, `0.0.0.0` and port 8000 become loopback and a free port.

As the kubelet's probes do, it waits for HTTPS `GET /health` without a token; then a
client outside the cluster sees what a pod's clients see: plain HTTP gets nothing,
HTTPS without a token is 401, a tenant's token lists and uses the model. SIGTERM, as a
pod's deletion sends, stops it."""

from __future__ import annotations

import signal
import ssl
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from rdurack.security import certs
from rdurack.security.auth import digest
from rdurack.security.tls import DEFAULT_RACK_IDENTITY
from tests.support.manifests import find, is_rdurack, render
from tests.support.pods import SPEC_DIR, TLS_DIR, TOKENS_DIR, Localizer

pytestmark = pytest.mark.integration

DEADLINE_S = 60.0
TOKEN = "smoke-test-tenant-token"
TOKENS = "tenants: {{alice: {{socket_quota: 2}}}}\ntokens: [{{sha256: {}, tenant: alice}}]\n"


def test_dev_overlay_endpoint_serves_https_with_tokens(tmp_path: Path) -> None:
    docs = render("dev")
    (container,) = find(docs, "Deployment", "rdurack-endpoint")["spec"]["template"]["spec"][
        "containers"
    ]
    assert is_rdurack(container)
    local = Localizer(tmp_path, tmp_path / "ray")  # no Ray in this pod
    for path in local.paths.values():
        path.mkdir()
    for key, text in find(docs, "ConfigMap", "rdurack-spec")["data"].items():
        (local.paths[SPEC_DIR] / key).write_text(text)
    certs.write_rack_set(local.paths[TLS_DIR], DEFAULT_RACK_IDENTITY)
    (local.paths[TOKENS_DIR] / "tokens.yaml").write_text(TOKENS.format(digest(TOKEN)))

    env = local.env(container)
    log = tmp_path / "endpoint.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            local.command(container, env),
            env=env,
            cwd=tmp_path,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"https://127.0.0.1:{local.ports[8000]}"
    trusting = ssl.create_default_context(cafile=str(local.paths[TLS_DIR] / certs.CA_FILE))
    try:
        with httpx.Client(verify=trusting, timeout=30) as https:
            deadline = time.monotonic() + DEADLINE_S
            while True:  # the startup probe: HTTPS /health, no token
                try:
                    if https.get(f"{url}/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert proc.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.2)
            with pytest.raises(httpx.TransportError):
                httpx.get(url.replace("https://", "http://") + "/health", timeout=10)
            assert https.get(f"{url}/v1/models").status_code == 401
            alice = {"Authorization": f"Bearer {TOKEN}"}
            models = https.get(f"{url}/v1/models", headers=alice).json()
            assert [m["id"] for m in models["data"]] == ["llama3.1-8b"]
            body = {"model": "llama3.1-8b", "prompt": "hi", "max_tokens": 2}
            done = https.post(f"{url}/v1/completions", json=body, headers=alice).json()
            assert done["usage"]["completion_tokens"] == 2
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code: int | None = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
            code = None
    # uvicorn shuts down, then ends by the signal it was sent, as a pod's process may.
    assert code in (0, 128 + signal.SIGTERM), log.read_text()[-3000:]
    said = log.read_text()
    assert "security: HTTPS, bearer tokens required (1 tenant)" in said
    assert "Traceback" not in said
