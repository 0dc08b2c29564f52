"""Which Ray node a process attaches to (actors.start_ray's `host`), and the Ray head's
--host: the pieces of a rack across hosts (issue 21) that need no second host."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import ray

from rdurack.node_agent import actors
from rdurack.processes import local_rack, node_agent_main
from rdurack.processes.ray_head import RayHeadSettings
from rdurack.processes.settings import load
from rdurack.telemetry import setup


@pytest.fixture
def inits(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """ray.init's keyword arguments, call by call; Ray itself is not started."""
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: calls.append(kw))
    return calls


@pytest.mark.parametrize(
    ("host", "node_ip"),
    [("10.77.0.2", "10.77.0.2"), ("127.0.0.1", "127.0.0.1"), ("0.0.0.0", None), (None, None)],
)
def test_joining_attaches_to_the_node_of_the_host_address(
    inits: list[dict[str, Any]], host: str | None, node_ip: str | None
) -> None:
    actors.start_ray("10.77.0.1:6379", host=host)
    (call,) = inits
    assert call["address"] == "10.77.0.1:6379"
    assert call["_node_ip_address"] == node_ip


def test_a_new_cluster_takes_the_host_address(inits: list[dict[str, Any]]) -> None:
    actors.start_ray(host="10.77.0.1")
    (call,) = inits
    assert call["address"] == "local"  # always a new cluster, never a stale one
    assert call["_node_ip_address"] == "10.77.0.1"


def test_wildcards_name_no_node() -> None:
    assert {"0.0.0.0", "::", ""} <= actors.WILDCARD_HOSTS


def test_the_node_agent_joins_ray_at_its_host(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str | None, str | None]] = []

    class Stop(Exception):
        pass

    def start_ray(address: str | None = None, host: str | None = None) -> None:
        seen.append((address, host))
        raise Stop  # the rest of main needs a Ray cluster

    monkeypatch.setattr(node_agent_main, "start_ray", start_ray)
    monkeypatch.setattr(setup, "configure", lambda *a, **k: None)
    with pytest.raises(Stop):
        node_agent_main.main(["--host", "10.77.0.2", "--ray-address", "10.77.0.1:6379"])
    assert seen == [("10.77.0.1:6379", "10.77.0.2")]


def test_the_ray_head_takes_a_host(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load(RayHeadSettings, []).host == "127.0.0.1"  # loopback by default
    assert load(RayHeadSettings, ["--host", "10.77.0.1"]).host == "10.77.0.1"
    monkeypatch.setenv("RDURACK_HOST", "10.77.0.3")
    assert load(RayHeadSettings, []).host == "10.77.0.3"


def test_the_local_rack_gives_the_ray_head_its_host(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Agents attach to the Ray node of their --host, so the head's node must take the
    same one (on loopback it always did)."""
    spawned: list[tuple[str, list[str]]] = []

    class Stop(Exception):
        pass

    def spawn(name: str, module: str, args: list[str], logs: Path) -> None:
        spawned.append((module, args))
        raise Stop  # the first process is all this test looks at

    monkeypatch.setattr(local_rack, "_spawn", spawn)
    with pytest.raises(Stop):
        local_rack.up(tmp_path, host="10.77.0.1")
    assert spawned == [("rdurack.processes.ray_head", ["--host", "10.77.0.1"])]
