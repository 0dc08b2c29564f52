"""A rack across machines, the machines made of network namespaces (tests/support/
netns.py), started as users start one: `rdu up --head --host ADDR` on host 0 (Ray head,
orchestrator, node agent 0) and `rdu join --head ORCHESTRATOR --host ADDR` on host 1
(a Ray worker node and node agent 1, which registers with the orchestrator).

Jobs whose transfers cross hosts run (a 16-socket CoE job, a 16-rank DDP job); host 1
is then killed whole (raylet, agent, socket actors) while a DDP job runs; the
orchestrator notices, `rdu join` on host 1 again brings node 1 back, and the job
succeeds: no job is lost. Skipped, saying why, where namespaces cannot be made.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rdurack import RAY_ENVIRONMENT
from rdurack.processes.join import ray_temp_dir
from rdurack.security import certs
from tests.support.netns import Hosts, unavailable
from tests.support.tokens import TOKENS, write_tokens

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]

WHY = unavailable()
PORT = 50051  # every host has its own ports: the usual one is free in a new namespace
LINK_PORTS = "41000-41015"  # host 1's 8 sockets bind the first free ones (--link-ports)
READY_S = 240  # `rdu up`/`rdu join --timeout`: generous, the two cores are shared


class Rack:
    """The two hosts, and `rdu` run on them with STATE_DIR per host."""

    def __init__(self, hosts: Hosts, tmp: Path) -> None:
        self.hosts, self.tmp = hosts, tmp
        self.head = f"{hosts.addresses[0]}:{PORT}"
        self.env = {**os.environ, **RAY_ENVIRONMENT, "PYTHONUNBUFFERED": "1"}
        self.env["RDURACK_TRACE_DIR"] = ""  # no trace files: not what this test is about
        self.env["RDURACK_ORCHESTRATOR"] = self.head
        for leaked in ("RDURACK_TOKEN", "RDURACK_TLS_CA", "RDURACK_HOST", "RDURACK_TOKENS"):
            self.env.pop(leaked, None)

    def state(self, host: int) -> Path:
        return self.tmp / f"host{host}"

    def rdu(
        self, host: int, *args: str, timeout_s: float = 600
    ) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "rdurack.cli.main", *args]
        return self.hosts.run(
            host, argv, capture_output=True, env=self.env, timeout=timeout_s, cwd=self.tmp
        )

    def ok(self, host: int, *args: str, timeout_s: float = 600) -> str:
        done = self.rdu(host, *args, timeout_s=timeout_s)
        assert done.returncode == 0, f"rdu {' '.join(args)}: {done.stderr[-3000:]}"
        return done.stdout

    def json(self, *args: str, timeout_s: float = 600) -> dict[str, Any]:
        """`rdu ARGS --json` from host 0."""
        got: dict[str, Any] = json.loads(self.ok(0, *args, "--json", timeout_s=timeout_s))
        return got

    def join_args(self, *more: str) -> list[str]:
        """`rdu join` as host 1 runs it."""
        return ["join", "--head", self.head, "--host", self.hosts.addresses[1],
                "--state-dir", str(self.state(1)), "--timeout", str(READY_S), *more]  # fmt: skip

    def orchestrator_log(self) -> str:
        return (self.state(0) / "logs" / "orchestrator.log").read_text(errors="replace")

    def wait_log(self, needle: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while needle not in self.orchestrator_log():
            assert time.monotonic() < deadline, f"no {needle!r} in the orchestrator's log"
            time.sleep(0.2)


@pytest.fixture
def rack(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Rack]:
    """The rack up on host 0 and, unless `request.param` (indirect) is "secure", host 1
    joined. "secure": `rdu up --tls --tokens` (tests/support/tokens.py's tenants), and
    the test joins host 1 itself."""
    if WHY is not None:
        pytest.skip(WHY)
    secure = getattr(request, "param", "") == "secure"
    with Hosts(2) as hosts:
        r = Rack(hosts, tmp_path)
        up = ["up", "--head", "--host", hosts.addresses[0], "--local-nodes", "1"]
        up += ["--state-dir", str(r.state(0)), "--timeout", str(READY_S)]
        if secure:
            up += ["--tls", "--tokens", str(write_tokens(tmp_path / "tokens.yaml"))]
            r.env["RDURACK_TLS_CA"] = str(r.state(0) / "tls" / certs.CA_FILE)
            r.env["RDURACK_TOKEN"] = TOKENS["ops"]  # the admin: sees every job
        try:
            assert f"rdu join --head {r.head}" in r.ok(0, *up)  # it says what to run
            if not secure:  # its links on the ports a firewall would admit
                assert "ready at" in r.ok(1, *r.join_args("--link-ports", LINK_PORTS))
            yield r
        finally:
            # `rdu down` on each host stops what it started there; Hosts then ends
            # anything left in the namespaces (a killed host's orphans).
            for host in (1, 0):
                r.rdu(host, "down", "--state-dir", str(r.state(host)), timeout_s=120)
    shutil.rmtree(ray_temp_dir(tmp_path / "host1"), ignore_errors=True)


def test_a_rack_joined_across_hosts_runs_jobs_and_survives_a_killed_host(rack: Rack) -> None:
    nodes = rack.json("status")["nodes"]
    assert [n["agent_address"].split(":")[0] for n in nodes] == rack.hosts.addresses
    assert all(n["healthy"] for n in nodes), nodes
    lo, hi = map(int, LINK_PORTS.split("-"))
    links = [s["link_address"] for s in rack.json("status")["sockets"] if s["node"] == 1]
    assert len(links) == 8 and all(a.startswith(f"{rack.hosts.addresses[1]}:") for a in links)
    assert all(lo <= int(a.rsplit(":", 1)[1]) <= hi for a in links), links

    coe = rack.json("submit", "coe", "--experts", "20", "--sockets", "16", "--wait")
    assert coe["state"] == "SUCCEEDED", coe
    assert {s.split("-")[1] for s in coe["sockets"]} == {"n0", "n1"}  # both hosts
    train = rack.json("submit", "train", "--world-size", "16", "--global-batch", "128",
                      "--epochs", "2", "--lr", "0.3", "--wait")  # fmt: skip
    assert train["state"] == "SUCCEEDED", train

    job_id = rack.json("submit", "train", "--world-size", "16", "--global-batch", "128",
                       "--epochs", "8", "--lr", "0.3")["job_id"]  # fmt: skip
    deadline = time.monotonic() + READY_S
    while rack.json("job", job_id)["state"] != "RUNNING":
        assert time.monotonic() < deadline, "the DDP job never ran"
        time.sleep(0.5)
    assert rack.hosts.kill(1)  # host 1 crashes: raylet, agent, socket actors
    rack.wait_log("node 1's agent down", timeout_s=60)
    rack.ok(1, *rack.join_args("--link-ports", LINK_PORTS))  # the same command brings node 1 back
    rack.wait_log("node 1's agent joined at", timeout_s=60)
    done = rack.json("watch", job_id, "--timeout", "600", timeout_s=660)
    assert done["state"] == "SUCCEEDED", done
    jobs = rack.json("jobs")["jobs"]
    assert len(jobs) == 3 and all(j["state"] == "SUCCEEDED" for j in jobs), jobs  # 0 lost


@pytest.mark.parametrize("rack", ["secure"], indirect=True)
def test_a_tls_rack_with_tokens_takes_only_an_admins_joiners(rack: Rack) -> None:
    """TLS and tokens work across hosts as on one: the joiner uses the head's rack
    certificate (STATE_DIR/tls) and an admin's token; a tenant's token is refused at
    once, saying why, and leaves nothing running."""
    tls = ["--tls-dir", str(rack.state(0) / "tls")]
    refused = rack.rdu(1, *rack.join_args(*tls, "--token", TOKENS["alice"]))
    assert refused.returncode != 0 and "PERMISSION_DENIED" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr
    deadline = time.monotonic() + 60  # what it started, it stopped (Ray's last ones too)
    while rack.hosts.pids(1):
        assert time.monotonic() < deadline, f"left running on host 1: {rack.hosts.pids(1)}"
        time.sleep(0.2)
    assert "ready at" in rack.ok(1, *rack.join_args(*tls, "--token", TOKENS["ops"]))
    kernel = rack.json("submit", "kernel", "--model", "llama2-7b", "--phase", "decode",
                       "--sockets", "16", "--output-tokens", "5", "--wait")  # fmt: skip
    assert kernel["state"] == "SUCCEEDED", kernel
    assert {s.split("-")[1] for s in kernel["sockets"]} == {"n0", "n1"}
