"""The health watcher with a scripted gateway and clocks it controls: what counts as
down, when, why; restarts; and the detection bound it promises."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import cast

from rdurack.errors import LinkFailure
from rdurack.orchestrator.gateway import NodeBeat, NodeGateway, SocketBeat
from rdurack.orchestrator.health import Change, HealthWatcher
from rdurack.rack.presets import platform

RACK = platform("sn40l-node").overridden({"nodes": 2, "node": {"sockets": 2}}, "test: 2 x 2")
SOCKETS = {0: ["rdu-n0-s0", "rdu-n0-s1"], 1: ["rdu-n1-s0", "rdu-n1-s1"]}


@dataclass
class Clock:
    now: float = 100.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Agents:
    """What each agent answers: its incarnation and each socket's beat."""

    incarnation: dict[int, str] = field(default_factory=lambda: {0: "a", 1: "b"})
    silent: set[int] = field(default_factory=set)
    state: dict[str, str] = field(default_factory=dict)  # socket -> dead | unresponsive
    socket_incarnation: dict[str, int] = field(default_factory=dict)
    asked: int = 0

    def heartbeat(self, node: int, timeout_s: float) -> NodeBeat:
        self.asked += 1
        if node in self.silent:
            raise LinkFailure(f"node {node}: connection refused")
        beats = tuple(
            SocketBeat(
                s,
                self.state.get(s, "healthy"),  # type: ignore[arg-type]
                incarnation=self.socket_incarnation.get(s, 0),
                error="killed" if self.state.get(s) == "dead" else "",
            )
            for s in SOCKETS[node]
        )
        return NodeBeat(node, self.incarnation[node], beats)


def watcher(agents: Agents, clock: Clock, seen: list[Change]) -> HealthWatcher:
    return HealthWatcher(
        cast(NodeGateway, agents),  # only heartbeat is called
        RACK,
        interval_s=0.5,
        dead_after_s=2.0,
        on_change=seen.extend,
        wall=lambda: 1_000.0 + clock.now,
        monotonic=clock,
    )


def test_all_healthy_reports_no_change() -> None:
    agents, clock, seen = Agents(), Clock(), list[Change]()
    w = watcher(agents, clock, seen)
    assert w.poll_once() == [] and seen == []
    assert w.unhealthy() == set()
    assert agents.asked == 2  # one heartbeat per agent per round


def test_a_dead_socket_actor_is_down_at_the_first_round_with_its_reason() -> None:
    agents, clock, seen = Agents(), Clock(), list[Change]()
    w = watcher(agents, clock, seen)
    w.poll_once()
    agents.state["rdu-n0-s1"] = "dead"
    clock.now += 0.5
    changes = w.poll_once()
    assert [(c.socket_id, c.healthy, c.lost) for c in changes] == [("rdu-n0-s1", False, True)]
    assert seen == changes
    assert w.unhealthy() == {"rdu-n0-s1"}
    health = w.socket("rdu-n0-s1")
    assert not health.healthy and "killed" in health.reason
    assert health.since_s == 1_000.0 + clock.now  # the wall clock of the change
    assert w.socket("rdu-n0-s0").healthy
    clock.now += 0.5
    assert w.poll_once() == []  # still down: no new change


def test_a_socket_that_does_not_answer_is_down_only_after_dead_after_s() -> None:
    agents, clock, seen = Agents(), Clock(), list[Change]()
    w = watcher(agents, clock, seen)
    w.poll_once()
    agents.state["rdu-n1-s0"] = "unresponsive"
    for _ in range(4):  # 2.0 s of silence: not yet more than dead_after_s
        clock.now += 0.5
        assert w.poll_once() == []
    clock.now += 0.5
    (change,) = w.poll_once()
    assert change.socket_id == "rdu-n1-s0" and not change.healthy
    assert "no heartbeat for 2 s" in change.reason
    # Suspect, not known dead: no new work, but what it runs is not counted lost.
    assert change.suspect and not change.lost
    assert w.unhealthy() == {"rdu-n1-s0"}
    assert w.trouble_since(["rdu-n1-s0"], 0.0) is None


def test_a_silent_agent_takes_its_sockets_down_after_dead_after_s() -> None:
    agents, clock, seen = Agents(), Clock(), list[Change]()
    w = watcher(agents, clock, seen)
    w.poll_once()
    last_answer = clock.now
    agents.silent.add(1)
    noticed = None
    while noticed is None:
        clock.now += 0.5
        if w.poll_once():
            noticed = clock.now
    # Noticed at the first round more than dead_after_s after the last answer: within
    # dead_after_s + interval_s (the timeout of each call adds to it on a real rack).
    assert 2.0 < noticed - last_answer <= 2.5
    (change,) = seen
    assert change.node == 1 and change.socket_id == "" and not change.healthy
    assert "connection refused" in change.reason and change.what == "node 1's agent"
    assert w.unhealthy() == set(SOCKETS[1])
    assert not w.socket("rdu-n1-s1").healthy  # a socket of a down node is down
    assert not w.node(1).healthy and w.node(0).healthy


def test_an_agent_back_as_a_new_incarnation_is_up_and_restarted() -> None:
    agents, clock, seen = Agents(), Clock(), list[Change]()
    w = watcher(agents, clock, seen)
    w.poll_once()
    agents.silent.add(0)
    for _ in range(6):
        clock.now += 0.5
        w.poll_once()
    assert not w.node(0).healthy
    agents.silent.clear()
    agents.incarnation[0] = "a2"
    clock.now += 0.5
    (change,) = w.poll_once()
    assert change.node == 0 and change.healthy and change.restarted
    assert w.unhealthy() == set() and w.node(0).healthy


def test_a_restart_between_two_rounds_is_still_seen() -> None:
    """An agent that restarts faster than dead_after_s never looks silent; its new
    incarnation gives it away, and the runs it held are lost."""
    agents, clock, seen = Agents(), Clock(), list[Change]()
    w = watcher(agents, clock, seen)
    w.poll_once()
    t0 = clock.now
    agents.incarnation[1] = "b2"
    clock.now += 0.5
    (change,) = w.poll_once()
    assert change.restarted and change.node == 1
    assert w.trouble_since(["rdu-n1-s0"], t0) is not None
    assert w.trouble_since(["rdu-n0-s0"], t0) is None


def test_a_socket_actor_restarted_by_its_agent_is_reported_restarted() -> None:
    agents, clock, seen = Agents(), Clock(), list[Change]()
    w = watcher(agents, clock, seen)
    w.poll_once()
    agents.state["rdu-n0-s0"] = "dead"
    clock.now += 0.5
    w.poll_once()
    agents.state.clear()
    agents.socket_incarnation["rdu-n0-s0"] = 1
    clock.now += 0.5
    (change,) = w.poll_once()
    assert change.socket_id == "rdu-n0-s0" and change.healthy and change.restarted
    assert w.unhealthy() == set()


def test_trouble_since_names_what_went_wrong_after_a_run_started() -> None:
    agents, clock, seen = Agents(), Clock(), list[Change]()
    w = watcher(agents, clock, seen)
    w.poll_once()
    before = clock.now
    clock.now += 1
    agents.state["rdu-n0-s1"] = "dead"
    w.poll_once()
    why = w.trouble_since(["rdu-n0-s0", "rdu-n0-s1"], before)
    assert why is not None and why.startswith("rdu-n0-s1: socket actor dead")
    assert w.trouble_since(["rdu-n0-s1"], clock.now + 1) is None  # a run placed later


def test_the_loop_keeps_polling_when_a_round_fails() -> None:
    """An error that is not the gateway's own (a bug) fails the round, not the watcher."""

    class Broken(Agents):
        def heartbeat(self, node: int, timeout_s: float) -> NodeBeat:
            self.asked += 1
            raise RuntimeError("boom")

    agents, seen = Broken(), list[Change]()
    w = HealthWatcher(cast(NodeGateway, agents), RACK, interval_s=0.01, on_change=seen.extend)
    w.start()
    try:
        deadline = time.monotonic() + 10
        while agents.asked < 6:
            assert time.monotonic() < deadline, "the watcher stopped polling"
            time.sleep(0.01)
    finally:
        w.stop()
    assert seen == []
