"""The kustomize overlays of k8s/ rendered, and what the manifest tests look up in them."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
OVERLAYS = ("dev", "rack16")
Obj = dict[str, Any]


def render(overlay: str) -> list[Obj]:
    """Every document of `kubectl kustomize k8s/overlays/<overlay>`."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not on PATH: cannot render the kustomize overlays")
    out = subprocess.run(
        [kubectl, "kustomize", str(ROOT / "k8s" / "overlays" / overlay)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d is not None]
    assert docs, f"overlay {overlay} rendered nothing"
    return docs


def find(docs: list[Obj], kind: str, name: str) -> Obj:
    hits = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(hits) == 1, f"expected one {kind}/{name}, found {len(hits)}"
    return hits[0]


def workloads(docs: list[Obj]) -> list[Obj]:
    return [d for d in docs if d["kind"] in ("Deployment", "StatefulSet")]


def is_rdurack(container: Obj) -> bool:
    """A container of our own image (not a third-party one such as Jaeger)."""
    return str(container["image"]).split(":")[0] == "rdurack"


def env_of(container: Obj) -> dict[str, Obj]:
    return {e["name"]: e for e in container.get("env", [])}


def component(workload: Obj) -> str:
    """A Deployment's or StatefulSet's pods' `app.kubernetes.io/component`."""
    return str(workload["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"])


def spec_path(container: Obj) -> str:
    """The rack spec a container reads: RDURACK_SPEC (the rack's processes) or `--spec`
    (`rdu serve`, whose options are a command's)."""
    env = env_of(container)
    if "RDURACK_SPEC" in env:
        return str(env["RDURACK_SPEC"]["value"])
    args = list(container.get("args", []))
    return str(args[args.index("--spec") + 1])
