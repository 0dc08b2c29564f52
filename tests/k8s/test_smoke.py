"""Smoke test: the dev overlay's rdurack containers, run as local processes.

It reads the rendered manifests and starts each rdurack container's own command with its
own environment (Jaeger, a third-party image, is left out). The endpoint starts first,
as a pod may, and must wait for the rack; then the rack's containers in the order the
kubelet's probes would gate them: the Ray head until its GCS port accepts connections,
then the node agent and the orchestrator until their gRPC health reports SERVING; then
the endpoint until HTTPS `GET /health` answers, on the rack's sockets.

What changes from a pod, and nothing else:
- the downward API: status.podIP is 127.0.0.1 and the pod-index label is "0";
- Service DNS names become 127.0.0.1, with free ports instead of 6379/50061/50051/8000,
  and `0.0.0.0` becomes 127.0.0.1;
- the ConfigMap mount and the state dir are directories under tmp_path, and so are the
  Secret mounts, filled as `make k8s-secrets` fills the Secrets: `rdu certs` output, and
  a tokens file with the endpoint's own token added by `rdu token --add-to`;
- Ray's temp root (RAY_TMPDIR) is a fresh short directory, removed afterwards: `ray start`
  records its cluster in TMP/ray/ray_current_cluster, and a stale record under /tmp
  would make every later `ray.init()` on this machine try to join a dead cluster (in a
  pod, /tmp is the pod's own emptyDir);
- OTEL_EXPORTER_OTLP_ENDPOINT is dropped (no Jaeger here);
- `python`, `ray` and `rdu` are this venv's (PATH), as they are the image's in a pod;
- Ray stays on loopback (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, the rule on these
  machines), so the node agent's Ray worker node is stood in for (below).

The node agent's container script runs unchanged under bash, except for its
`ray start --address ... --block` worker: with worker nodes allowed, Ray turns a
127.0.0.1 node address into the machine's own network address, and a second Ray node on
this host could not stay on loopback. A `ray` shim on PATH therefore replaces only that
one command with a process that waits for SIGTERM; the agent joins the head's Ray node
(same host, same 127.0.0.1) and pins its socket actors there. The script's start-up,
signal handling and shutdown order are exercised as written.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rdurack.security import certs
from rdurack.security.auth import digest
from rdurack.security.tls import DEFAULT_RACK_IDENTITY
from rdurack.v1 import common_pb2
from tests.support.cli import rdu
from tests.support.manifests import Obj, find, is_rdurack, render
from tests.support.pods import (
    ENDPOINT_TOKEN_DIR,
    SPEC_DIR,
    STATE_DIR,
    TLS_DIR,
    TOKENS_DIR,
    Localizer,
)

pytestmark = pytest.mark.integration

DEADLINE_S = 180.0
TOKEN = "smoke-test-admin-token"
ALICE = "smoke-test-tenant-token"  # a tenant of the endpoint's HTTP callers
ENDPOINT_TENANT = "rdurack-endpoint"  # the Makefile's ENDPOINT_TENANT
MODEL = "llama3.1-8b"  # the endpoint's, in its args


def wait_tcp(port: int, proc: subprocess.Popen[bytes], log: Path, deadline: float) -> None:
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"exited {proc.returncode}:\n{log.read_text()[-3000:]}"
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            return
        time.sleep(0.2)
    pytest.fail(f"port {port} never accepted a connection:\n{log.read_text()[-3000:]}")


def wait_serving(port: int, proc: subprocess.Popen[bytes], log: Path, deadline: float) -> None:
    """Ask grpc.health.v1 as the kubelet's gRPC probe does, until SERVING."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        stub: Any = health_pb2_grpc.HealthStub(ch)
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"exited {proc.returncode}:\n{log.read_text()[-3000:]}"
            with contextlib.suppress(grpc.RpcError):
                reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=2)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            time.sleep(0.5)
    pytest.fail(f"health on {port} never reported SERVING:\n{log.read_text()[-3000:]}")


def stop(procs: list[subprocess.Popen[bytes]]) -> list[int | None]:
    """SIGTERM, as the kubelet sends, to each process this test started (newest first)."""
    for proc in reversed(procs):
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    codes: list[int | None] = []
    for proc in reversed(procs):
        try:
            codes.append(proc.wait(timeout=40))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
            codes.append(None)
    return codes


def api_is_secured(local: Localizer) -> None:
    """The orchestrator's API as a client outside the cluster sees it: plaintext fails,
    TLS without a token is UNAUTHENTICATED, TLS with the token lists the rack; and it
    reached the node agent over mutual TLS (the rack shows its sockets)."""
    from rdurack.api.server import channel
    from rdurack.security.tls import TlsConfig
    from rdurack.v1 import rack_pb2, rack_pb2_grpc

    address = f"127.0.0.1:{local.ports[50051]}"
    request = rack_pb2.GetRackRequest()
    with grpc.insecure_channel(address) as ch, pytest.raises(grpc.RpcError) as plain:
        rack_pb2_grpc.RackServiceStub(ch).GetRack(request, timeout=5)
    assert plain.value.code() == grpc.StatusCode.UNAVAILABLE
    tls = TlsConfig(ca_file=local.paths[TLS_DIR] / certs.CA_FILE)
    with channel(address, tls=tls) as ch, pytest.raises(grpc.RpcError) as anonymous:
        rack_pb2_grpc.RackServiceStub(ch).GetRack(request, timeout=5)
    assert anonymous.value.code() == grpc.StatusCode.UNAUTHENTICATED
    # The node shows healthy once the orchestrator's health watcher has heard from its
    # agent: on a loaded machine its first heartbeat may miss its deadline, so wait.
    deadline = time.monotonic() + 60
    with channel(address, tls=tls, token=TOKEN) as ch:
        while True:
            rack = rack_pb2_grpc.RackServiceStub(ch).GetRack(request, timeout=10).rack
            if [n.healthy for n in rack.nodes] == [True] or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    reasons = [n.health_reason for n in rack.nodes]
    assert [n.healthy for n in rack.nodes] == [True], reasons
    assert len(rack.nodes[0].sockets) == 2


@pytest.fixture
def ray_tmp() -> Iterator[Path]:
    # Short: Ray's unix sockets live under it, and socket paths are limited to 107 bytes.
    path = Path(tempfile.mkdtemp(prefix="rdk8s-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def start(
    name: str, c: Obj, local: Localizer, tmp_path: Path
) -> tuple[subprocess.Popen[bytes], Path]:
    """The container's command as a process, its output in NAME.log."""
    env = local.env(c)
    log = tmp_path / f"{name}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            local.command(c, env),
            env=env,
            cwd=tmp_path,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return proc, log


def wait_said(text: str, proc: subprocess.Popen[bytes], log: Path, deadline: float) -> None:
    while text not in log.read_text():
        assert proc.poll() is None, f"exited {proc.returncode}:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"never said {text!r}:\n{log.read_text()[-3000:]}"
        time.sleep(0.2)


def fill_secrets(local: Localizer, tmp_path: Path) -> None:
    """The Secrets' volumes, as `make k8s-secrets` fills them: `rdu certs`' files, and
    the tokens file given (an admin, and alice for the endpoint's HTTP) with the
    endpoint's own token added by `rdu token --add-to`, which also writes that token."""
    certs.write_rack_set(local.paths[TLS_DIR], DEFAULT_RACK_IDENTITY)
    given = tmp_path / "tokens-given.yaml"
    given.write_text(
        "tenants: {ops: {admin: true}, alice: {socket_quota: 1}}\n"
        f"tokens: [{{sha256: {digest(TOKEN)}, tenant: ops}}, "
        f"{{sha256: {digest(ALICE)}, tenant: alice}}]\n"
    )
    made = tmp_path / "k8s-tokens"
    done = rdu("token", "--tenant", ENDPOINT_TENANT, "--add-to", str(given), "--out", str(made))
    assert done.returncode == 0, done.stderr
    shutil.copy(made / "tokens.yaml", local.paths[TOKENS_DIR] / "tokens.yaml")
    shutil.copy(made / "token", local.paths[ENDPOINT_TOKEN_DIR] / "token")


def endpoint_jobs(local: Localizer) -> list[Any]:
    """The rack's endpoint jobs, as its admin sees them."""
    from rdurack.api.server import channel
    from rdurack.security.tls import TlsConfig
    from rdurack.v1 import job_pb2, job_pb2_grpc

    tls = TlsConfig(ca_file=local.paths[TLS_DIR] / certs.CA_FILE)
    address = f"127.0.0.1:{local.ports[50051]}"
    with channel(address, tls=tls, token=TOKEN) as ch:
        jobs = job_pb2_grpc.JobServiceStub(ch).ListJobs(job_pb2.ListJobsRequest(), timeout=10)
    return [j for j in jobs.jobs if j.spec.WhichOneof("workload") == "endpoint"]


def endpoint_serves(
    local: Localizer, proc: subprocess.Popen[bytes], log: Path, deadline: float
) -> None:
    """As the kubelet's startup probe does, HTTPS /health without a token until 200;
    then a client outside the cluster sees what a pod's clients see: plain HTTP gets
    nothing, HTTPS without a token is 401, a tenant's token lists and uses the model,
    which runs on the rack's socket, held by an endpoint job of the endpoint's tenant."""
    url = f"https://127.0.0.1:{local.ports[8000]}"
    trusting = ssl.create_default_context(cafile=str(local.paths[TLS_DIR] / certs.CA_FILE))
    with httpx.Client(verify=trusting, timeout=30) as https:
        while True:
            with contextlib.suppress(httpx.TransportError):
                if https.get(f"{url}/health").status_code == 200:
                    break
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        with pytest.raises(httpx.TransportError):
            httpx.get(url.replace("https://", "http://") + "/health", timeout=10)
        assert https.get(f"{url}/v1/models").status_code == 401
        alice = {"Authorization": f"Bearer {ALICE}"}
        models = https.get(f"{url}/v1/models", headers=alice).json()
        assert [m["id"] for m in models["data"]] == [MODEL]
        body = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
        done = https.post(f"{url}/v1/completions", json=body, headers=alice).json()
        assert done["usage"]["completion_tokens"] == 2, done
    (job,) = endpoint_jobs(local)
    assert (job.tenant, job.spec.endpoint.model, len(job.sockets)) == (ENDPOINT_TENANT, MODEL, 1)
    assert job.state == common_pb2.JOB_STATE_RUNNING


def test_dev_overlay_containers_serve_as_local_processes(tmp_path: Path, ray_tmp: Path) -> None:
    docs = render("dev")
    local = Localizer(tmp_path, ray_tmp)
    for path in local.paths.values():
        path.mkdir()
    spec = find(docs, "ConfigMap", "rdurack-spec")["data"]
    for key, text in spec.items():  # the ConfigMap volume, as files
        (local.paths[SPEC_DIR] / key).write_text(text)
    fill_secrets(local, tmp_path)

    def container(kind: str, name: str) -> Obj:
        (c,) = find(docs, kind, name)["spec"]["template"]["spec"]["containers"]
        assert is_rdurack(c)
        found: Obj = c
        return found

    # The kubelet asks the plaintext health ports; the API ports are TLS.
    order = [
        ("ray-head", container("Deployment", "rdurack-ray-head"), 6379, wait_tcp),
        ("node-agent", container("StatefulSet", "rdurack-node-agent"), 50062, wait_serving),
        ("orchestrator", container("Deployment", "rdurack-orchestrator"), 50052, wait_serving),
    ]
    procs: list[subprocess.Popen[bytes]] = []
    endpoint: subprocess.Popen[bytes] | None = None
    orchestrator = f"127.0.0.1:{local.ports[50051]}"
    try:
        deadline = time.monotonic() + DEADLINE_S
        # The endpoint first: it waits for the orchestrator rather than exiting.
        endpoint, endpoint_log = start("endpoint", container("Deployment", "rdurack-endpoint"),
                                       local, tmp_path)  # fmt: skip
        wait_said(f"s for the orchestrator at {orchestrator} (UNAVAILABLE", endpoint,
                  endpoint_log, deadline)  # fmt: skip
        started = []
        for name, c, pod_port, wait in order:
            proc, log = start(name, c, local, tmp_path)
            procs.append(proc)
            started.append((local.ports[pod_port], proc, log, wait))
            if name == "ray-head":  # the others need the GCS, as in the cluster
                wait_tcp(local.ports[6379], proc, log, deadline)
        for port, proc, log, wait in started[1:]:
            wait(port, proc, log, deadline)
        assert "node-agent 0 ready" in (tmp_path / "node-agent.log").read_text()
        assert (local.paths[STATE_DIR] / "jobs.sqlite").exists()
        api_is_secured(local)
        endpoint_serves(local, endpoint, endpoint_log, deadline)
        # Deleted, the endpoint releases its socket before it exits.
        (ended,) = stop([endpoint])
        assert ended in (0, 128 + signal.SIGTERM), endpoint_log.read_text()[-3000:]
        assert [j.state for j in endpoint_jobs(local)] == [common_pb2.JOB_STATE_CANCELLED]
    finally:
        if endpoint is not None:
            stop([endpoint])
        codes = stop(procs)
    # Each one stopped on SIGTERM, as a pod must on deletion; ours cleanly. (`ray start
    # --block` exits 1 after draining on SIGTERM: Ray's choice, not an error here.)
    head, agent, orchestrator_code = reversed(codes)
    assert (orchestrator_code, agent) == (0, 0), codes
    assert head is not None, "the Ray head ignored SIGTERM"
    assert (ray_tmp / "ray" / "ray_current_cluster").exists()  # it went there, not /tmp/ray
    said = endpoint_log.read_text()
    assert f"waiting up to 300 s for the orchestrator at {orchestrator}" in said
    assert f"the orchestrator at {orchestrator} answered after" in said
    assert f"serving {MODEL} on 1 sn40l-rack16 sockets each of the rack at {orchestrator}" in said
    assert "security: HTTPS, bearer tokens required (3 tenants)" in said
    assert "Traceback" not in said
