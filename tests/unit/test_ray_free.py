"""Only the node agent's process needs Ray: the orchestrator, the CLI and the gRPC edge
that converts what agents report import none of it (each module in a fresh
interpreter, since this one may have Ray loaded already)."""

from __future__ import annotations

import subprocess
import sys

import pytest

RAY_FREE = [
    "rdurack.node_agent.health",  # SocketHealth, which the edge converts
    "rdurack.node_agent.fault_plan",  # the agent's fault decisions, tested without Ray
    "rdurack.wire.rack",
    "rdurack.api.node_gateway",  # the orchestrator's side of NodeAgentService
    "rdurack.processes.orchestrator_main",
    "rdurack.cli.main",
]


@pytest.mark.parametrize("module", RAY_FREE)
def test_importing_loads_no_ray(module: str) -> None:
    ray = "sorted(m for m in sys.modules if m.split('.')[0] == 'ray')"
    code = f"import sys, {module}; print({ray})"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.strip() == "[]", f"{module} imports Ray: {done.stdout[:300]}"
