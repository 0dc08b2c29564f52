"""The node agent's own entrypoint, as Kubernetes runs it: a process with flags and env."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import ray
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rdurack.api.server import channel
from rdurack.v1 import node_agent_pb2, node_agent_pb2_grpc

pytestmark = pytest.mark.integration


def test_entrypoint_serves_a_node_and_stops_on_sigterm(ray_session: None, tmp_path: Path) -> None:
    spec = tmp_path / "two-sockets.yaml"
    spec.write_text("base: sn40l-node\nnode: {sockets: 2}\n")
    env = {
        **os.environ,
        "RDURACK_NODE_INDEX": "0",  # from the environment, as in a pod
        "RAY_ADDRESS": ray.get_runtime_context().gcs_address,  # join this session's Ray
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "rdurack.processes.node_agent_main", "--spec", str(spec)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 60
        line = ""
        while time.monotonic() < deadline and "ready at" not in line:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                break
        assert "node-agent 0 ready at 127.0.0.1:" in line, proc.stderr.read() if proc.stderr else ""
        address = line.rsplit(" ", 1)[1].strip()
        with channel(address) as ch:
            node = (
                node_agent_pb2_grpc.NodeAgentServiceStub(ch)
                .GetNode(node_agent_pb2.GetNodeRequest(), timeout=30)
                .node
            )
            assert [s.ref.id for s in node.sockets] == ["rdu-n0-s0", "rdu-n0-s1"]
            assert node.healthy
            checker: Any = health_pb2_grpc.HealthStub(ch)
            status = checker.Check(health_pb2.HealthCheckRequest(service=""), timeout=10).status
            assert status == health_pb2.HealthCheckResponse.SERVING
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_entrypoint_refuses_a_bad_node_index_in_one_line() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "rdurack.processes.node_agent_main",
            "--node-index",
            "5",
            "--platform",
            "sn40l-rack16",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "node-agent: node index 5 is not a node of sn40l-rack16 (0..1)"
    ]
