"""WORK IN PROGRESS (issue 21), not collected (the file name does not match test_*.py):
run it by hand, as root, with `.venv/bin/pytest -p no:cacheprovider
tests/integration/wip_netns.py`.

A 2-node rack across two hosts made of network namespaces (tests/support/netns.py),
started by hand as `rdu up --head` / `rdu join` will start it:
- host 0: the Ray head (`ray_head --host`) and the orchestrator (and, with 2 hosts,
  node agent 0);
- hosts 1 (and 2): a Ray worker node (`ray start --address HEAD --node-ip-address ADDR
  --block`) and a node agent, which joins Ray at its own address (actors.start_ray's
  `host`).
Kernel, CoE and DDP jobs of 16 sockets cross the hosts; node 1's host is then killed
whole (every process in it), the orchestrator notices, the running DDP job goes back to
PENDING, and the host comes back (Ray worker node and agent at the same port, as the
local rack's supervisor restarts an agent): the job succeeds, no job is lost.

What `rdu join` must add over this: the orchestrator learns of agents from `--agents`
only; here host 1's agent port is fixed in advance so the orchestrator can be given it.

Status (2026-12-05, 2 cores shared with other work, load 30-90): every test here
passed; the recovery test with 2 hosts in 211-268 s (rack up 12-17 s), with 3 hosts in
246 s (rack up 39 s), each TLS test (2 hosts) in 25-90 s (rack up 19-84 s, by load). Why not
collected yet: 4.5 min of a loaded machine, and it starts processes by hand that `rdu up
--head` / `rdu join` should start (/work/scratch/netns/FINDINGS.md has the plan).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rdurack import RAY_ENVIRONMENT
from rdurack.security import certs
from rdurack.security.tls import DEFAULT_RACK_IDENTITY, ENV_CA, ENV_SERVER_NAME
from tests.support.netns import SUBNET, Hosts, unavailable

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]

WHY = unavailable()
RAY = str(Path(sys.executable).parent / "ray")
AGENT_PORT = 50061  # every host has its own ports: the same number on each is fine
ORCHESTRATOR_PORT = 50051
READY_S = 240.0  # generous: the two cores of a build machine are shared


def _env(join: bool = False) -> dict[str, str]:
    # rdurack's processes keep rdurack's Ray environment; only a joining raylet needs
    # RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=1 (with 0 `ray start --address` refuses).
    env = {**os.environ, **RAY_ENVIRONMENT, "PYTHONUNBUFFERED": "1", "RDURACK_TRACE_DIR": ""}
    if join:
        env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "1"
    return env


class Rack:
    """The processes of the rack, each logging to LOGS/<name>.log. Host 0 runs the Ray
    head and the orchestrator; node i's agent runs on host `agent_hosts[i]`."""

    def __init__(
        self, hosts: Hosts, logs: Path, ray_tmp: Path, tls: Path | None, agent_hosts: list[int]
    ) -> None:
        self.hosts, self.logs, self.ray_tmp = hosts, logs, ray_tmp
        self.agent_hosts = agent_hosts
        self.procs: dict[str, subprocess.Popen[str]] = {}
        self.gcs = ""
        # Mutual TLS among rack members (agents, links, orchestrator), as `rdu up --tls`.
        self.tls = tls
        self.client_env: dict[str, str] = {}  # more environment for `rdu`
        self.security: list[str] = []
        if tls is not None:
            self.security = ["--tls-ca", str(tls / certs.CA_FILE)]
            self.security += ["--tls-cert", str(tls / certs.CERT_FILE)]
            self.security += ["--tls-key", str(tls / certs.KEY_FILE)]

    def start(self, name: str, host: int, argv: list[str], join: bool = False) -> None:
        out = (self.logs / f"{name}.log").open("w")
        self.procs[name] = self.hosts.spawn(
            host, argv, stdout=out, stderr=subprocess.STDOUT, env=_env(join)
        )

    def wait_line(self, name: str, needle: str, timeout_s: float = READY_S) -> str:
        """The first line of NAME's log that contains `needle`."""
        deadline = time.monotonic() + timeout_s
        log = self.logs / f"{name}.log"
        while time.monotonic() < deadline:
            for line in log.read_text(errors="replace").splitlines():
                if needle in line:
                    return line
            if self.procs[name].poll() is not None:
                break
            time.sleep(0.2)
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
        raise AssertionError(f"{name}: no '{needle}' line; its log ends:\n{tail}")

    def python(self, name: str, host: int, module: str, *args: str) -> None:
        self.start(name, host, [sys.executable, "-m", module, *args])

    def join_ray(self, host: int) -> None:
        """Host `host`'s Ray worker node, in the foreground as `rdu join` would run it."""
        name = f"ray-{host}"
        self.start(name, host, [RAY, "start", "--address", self.gcs, "--block",
                                "--node-ip-address", self.hosts.addresses[host],
                                "--num-cpus", "0", "--disable-usage-stats",
                                "--temp-dir", str(self.ray_tmp / name)], join=True)  # fmt: skip
        self.wait_line(name, "Ray runtime started")

    def agent(self, node: int) -> str:
        """Node `node`'s agent, on its host; its address."""
        name, host = f"node-agent-{node}", self.agent_hosts[node]
        self.python(name, host, "rdurack.processes.node_agent_main", "--node-index", str(node),
                    "--host", self.hosts.addresses[host], "--port", str(AGENT_PORT),
                    "--ray-address", self.gcs, *self.security)  # fmt: skip
        return self.wait_line(name, "ready at").rsplit(" ", 1)[1]

    def rdu(self, *args: str, timeout_s: float = 600) -> dict[str, Any]:
        """`rdu ARGS --json` from host 0, against the orchestrator there."""
        env = {**_env(), "RDURACK_ORCHESTRATOR": f"{self.hosts.addresses[0]}:{ORCHESTRATOR_PORT}"}
        if self.tls is not None:
            env[ENV_CA] = str(self.tls / certs.CA_FILE)
        env.update(self.client_env)
        done = self.hosts.run(0, [sys.executable, "-m", "rdurack.cli.main", *args, "--json"],
                              capture_output=True, env=env, timeout=timeout_s)  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        got: dict[str, Any] = json.loads(done.stdout)
        return got


@pytest.fixture
def rack(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Rack]:
    """The rack; `request.param` (indirect) a string of words:
    - "3-hosts": host 0 runs only the Ray head and the orchestrator, the node agents run
      on hosts 1 and 2 (the acceptance's layout); else 2 hosts, agent 0 on host 0;
    - "tls-hosts" / "tls-loopback": mutual TLS, the member certificate naming the hosts'
      addresses (what `rdu up --head --tls` must issue) or loopback only (today's)."""
    if WHY is not None:
        pytest.skip(WHY)
    words = str(getattr(request, "param", "")).split()
    count, agent_hosts = (3, [1, 2]) if "3-hosts" in words else (2, [0, 1])
    tls = None
    if "tls-hosts" in words or "tls-loopback" in words:
        addresses = [f"{SUBNET}.{i + 1}" for i in range(count)] if "tls-hosts" in words else []
        tls = certs.write_rack_set(
            tmp_path / "tls", DEFAULT_RACK_IDENTITY, [*certs.LOCAL_HOSTS, *addresses]
        )
    # Ray's unix sockets live under its temp dir, whose path must stay short (108 bytes).
    ray_tmp = Path(tempfile.mkdtemp(prefix="rdh-ray-", dir="/tmp"))
    with Hosts(count) as hosts:
        r = Rack(hosts, tmp_path, ray_tmp, tls, agent_hosts)
        r.python("ray-head", 0, "rdurack.processes.ray_head", "--host", hosts.addresses[0])
        r.gcs = r.wait_line("ray-head", "ready at").rsplit(" ", 1)[1]
        for host in range(1, count):
            r.join_ray(host)
        agents = [r.agent(0), r.agent(1)]
        r.python("orchestrator", 0, "rdurack.processes.orchestrator_main",
                 "--host", hosts.addresses[0], "--port", str(ORCHESTRATOR_PORT),
                 "--state-dir", str(tmp_path / "state"), "--agents", ",".join(agents),
                 *r.security)  # fmt: skip
        r.wait_line("orchestrator", "ready at")
        yield r
    # Hosts.down stopped every process in the namespaces; the Ray head's node lived in
    # host 0, so nothing of this rack is left on the machine but the temp dirs.
    shutil.rmtree(ray_tmp, ignore_errors=True)


@pytest.mark.parametrize("rack", ["3-hosts"], indirect=True, ids=["3-hosts"])
def test_jobs_cross_hosts_and_a_killed_host_is_recovered(rack: Rack) -> None:
    kernel = rack.rdu("submit", "kernel", "--model", "llama2-7b", "--phase", "decode",
                      "--sockets", "16", "--output-tokens", "5", "--wait")  # fmt: skip
    assert kernel["state"] == "SUCCEEDED", kernel
    assert {s.split("-")[1] for s in kernel["sockets"]} == {"n0", "n1"}
    coe = rack.rdu("submit", "coe", "--experts", "20", "--sockets", "16", "--wait")
    assert coe["state"] == "SUCCEEDED", coe
    train = rack.rdu("submit", "train", "--world-size", "16", "--global-batch", "128",
                     "--epochs", "3", "--lr", "0.3", "--wait")  # fmt: skip
    assert train["state"] == "SUCCEEDED", train

    job = rack.rdu("submit", "train", "--world-size", "16", "--global-batch", "128",
                   "--epochs", "20", "--lr", "0.3")  # fmt: skip
    job_id = job["job_id"]
    deadline = time.monotonic() + READY_S
    while rack.rdu("job", job_id)["state"] != "RUNNING":
        assert time.monotonic() < deadline, "the DDP job never ran"
        time.sleep(0.5)
    host = rack.agent_hosts[1]
    assert rack.hosts.kill(host)  # node 1's host crashes: raylet, agent, socket actors
    rack.wait_line("orchestrator", "node 1's agent down", timeout_s=30)
    rack.join_ray(host)
    rack.agent(1)
    rack.wait_line("orchestrator", "node 1's agent restarted", timeout_s=60)
    done = _wait(rack, job_id)
    assert done["state"] == "SUCCEEDED", done
    jobs = rack.rdu("jobs")
    assert all(j["state"] == "SUCCEEDED" for j in jobs["jobs"]), jobs  # 0 jobs lost


KERNEL_16 = ["submit", "kernel", "--model", "llama2-7b", "--phase", "decode",
             "--sockets", "16", "--output-tokens", "5", "--wait"]  # fmt: skip


@pytest.mark.parametrize("rack", ["tls-hosts"], indirect=True, ids=["tls"])
def test_a_tls_rack_across_hosts_runs_a_job(rack: Rack) -> None:
    assert rack.rdu(*KERNEL_16)["state"] == "SUCCEEDED"


@pytest.mark.parametrize("rack", ["tls-loopback"], indirect=True, ids=["tls-loopback-names"])
def test_rack_members_need_no_host_names_but_clients_do(rack: Rack) -> None:
    """Members verify each other by the rack identity, so links and agents work with
    today's loopback-only certificate; a client dialing 10.77.0.1 is refused unless it
    names a host the certificate has (RDURACK_TLS_SERVER_NAME)."""
    # The CLI says only "unavailable; is the rack up?": it does not name the mismatch.
    with pytest.raises(AssertionError, match=r"10\.77\.0\.1:50051 is unavailable"):
        rack.rdu("jobs")
    rack.client_env[ENV_SERVER_NAME] = "localhost"
    assert rack.rdu(*KERNEL_16)["state"] == "SUCCEEDED"


def _wait(rack: Rack, job_id: str) -> dict[str, Any]:
    """The job once it ended: `rdu watch` (one process; polling `rdu job` starts one a
    second, each a second of CPU on a busy machine)."""
    return rack.rdu("watch", job_id, "--timeout", "600", "--json", timeout_s=660)
