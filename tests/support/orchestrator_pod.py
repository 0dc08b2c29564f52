"""The orchestrator's container of a rendered overlay, and what it reads in its pod: its
variables as the kubelet sets them (a Secret's keys given by the test), and the settings
the orchestrator makes of them (tests/k8s/test_ha_*.py)."""

from __future__ import annotations

import pytest

from rdurack.processes.orchestrator_main import OrchestratorSettings
from rdurack.processes.settings import load, variable
from tests.support.manifests import Obj, find

COMMAND = ["python", "-m", "rdurack.processes.orchestrator_main"]
POD_IP = "10.0.0.7"  # a made-up pod IP for status.podIP


def orchestrator(docs: list[Obj]) -> tuple[Obj, Obj]:
    """The orchestrator's Deployment and its one container."""
    deployment = find(docs, "Deployment", "rdurack-orchestrator")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return deployment, container


def pod_env(container: Obj, secrets: dict[tuple[str, str], str]) -> dict[str, str]:
    """The container's variables as the kubelet sets them: a Secret's key from
    `secrets` ((name, key) -> value), the pod IP POD_IP."""
    env = {}
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = str(e["value"])
        elif "secretKeyRef" in e["valueFrom"]:
            ref = e["valueFrom"]["secretKeyRef"]
            env[e["name"]] = secrets[(ref["name"], ref["key"])]
        else:
            assert e["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP", e
            env[e["name"]] = POD_IP
    return env


def variables() -> set[str]:
    """Every variable the orchestrator reads its settings from."""
    return {variable(f, name) for name, f in OrchestratorSettings.model_fields.items()}


def settings(
    container: Obj, secrets: dict[tuple[str, str], str], monkeypatch: pytest.MonkeyPatch
) -> OrchestratorSettings:
    """The orchestrator's settings in the pod: its variables alone, no flags (its
    command has none), whatever this shell exports."""
    for name in variables():
        monkeypatch.delenv(name, raising=False)
    for name, value in pod_env(container, secrets).items():
        monkeypatch.setenv(name, value)
    assert container["command"] == COMMAND and "args" not in container
    return load(OrchestratorSettings, [])
