"""Dependencies point one way: the hardware model and workloads stay pure."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "rdurack"
FORBIDDEN = (
    "grpc",
    "ray",
    "rdurack.v1",
    "rdurack.services",
    "rdurack.node_agent",
    "rdurack.orchestrator",
    "opentelemetry.sdk",
)
PURE = {
    "rack": (*FORBIDDEN, "rdurack.workloads"),
    "workloads": FORBIDDEN,
    # The core; services/ implements its gateway to node agents.
    "orchestrator": tuple(f for f in FORBIDDEN if f != "rdurack.orchestrator"),
    # Below both servers' packages, which use it: gRPC and the hardware model's errors
    # and config base only.
    "security": (
        "ray",
        "rdurack.v1",
        "rdurack.services",
        "rdurack.node_agent",
        "rdurack.orchestrator",
        "rdurack.workloads",
    ),
}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("package", sorted(PURE))
def test_pure_packages_import_nothing_forbidden(package: str) -> None:
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, f"no source in rdurack/{package}"
    bad = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in files
        for name in sorted(_imports(path))
        if any(name == f or name.startswith(f + ".") for f in PURE[package])
    ]
    assert not bad, "\n".join(bad)


def test_importing_the_predictor_loads_no_grpc_or_ray() -> None:
    code = (
        "import sys, rdurack.workloads.paper, rdurack.rack.whatif;"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('grpc', 'ray'));"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
