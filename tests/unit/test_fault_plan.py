"""fault_plan: what node 0's agent must tell its sockets for the faults in force, decided
without Ray (the agent only makes the calls; tests/integration/test_faults.py runs them)."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from rdurack.errors import InvalidRequest
from rdurack.node_agent.fault_plan import (
    Change,
    ChangeKind,
    FaultState,
    LinkState,
    admit,
    changes,
    clearing,
    wanted,
)
from rdurack.rack.faults import Fault, FaultConflict, FaultKind, make_fault
from rdurack.rack.presets import platform
from rdurack.rack.topology import Topology

TOPO = Topology(platform("sn40l-rack16"))
NODE0 = [f"rdu-n0-s{i}" for i in range(8)]
NODE1 = [f"rdu-n1-s{i}" for i in range(8)]
A, B = NODE0[0], NODE0[1]  # two sockets of node 0
FAR = NODE1[0]  # a socket of node 1


def fault(fault_id: str, kind: FaultKind, **fields: object) -> Fault:
    return make_fault(kind, TOPO, fault_id=fault_id, **fields)  # type: ignore[arg-type]


def slow(fault_id: str, socket: str, factor: float) -> Fault:
    return fault(fault_id, FaultKind.SLOW_SOCKET, sockets=(socket,), slow_factor=factor)


def drop(fault_id: str, a: str, b: str) -> Fault:
    return fault(fault_id, FaultKind.DROP_LINK, sockets=(a, b))


def delay(fault_id: str, a: str, b: str, ns: int) -> Fault:
    return fault(fault_id, FaultKind.DELAY_LINK, sockets=(a, b), extra_latency_ns=ns)


def partition(fault_id: str) -> Fault:
    return fault(fault_id, FaultKind.PARTITION, nodes=(0, 1))


def plan(
    faults: Iterable[Fault], told: FaultState | None = None, alive: Iterable[str] = NODE0
) -> list[Change]:
    """Node 0's changes from `told` (default: nothing told yet) for `faults`."""
    return changes(wanted(faults, TOPO, NODE0), told or FaultState(), list(alive))


def lines(cs: Iterable[Change]) -> list[str]:
    return [c.describe() for c in cs]


def told_after(*faults: Fault) -> FaultState:
    """What node 0's sockets were told once `faults` were applied."""
    return FaultState().after(plan(faults))


# ------------------------------------------------------------------ each kind


def test_a_slow_socket_is_told_its_slowdown_on_its_control_method() -> None:
    (c,) = plan([slow("f1", B, 3.0)])
    assert c == Change(ChangeKind.SLOW, B, 3.0)
    assert (c.kind.value, c.args, c.describe()) == ("slow", (3.0,), "rdu-n0-s1 slowdown 3")


def test_a_dropped_link_is_down_in_this_nodes_direction_only() -> None:
    (c,) = plan([drop("f1", A, FAR)])
    assert c == Change(ChangeKind.LINK_DOWN, A, True, FAR)
    assert (c.kind.value, c.args) == ("set_link_down", (FAR, True))
    assert c.describe() == "rdu-n0-s0 -> rdu-n1-s0 down"
    assert plan([drop("f1", NODE1[1], FAR)]) == []  # both ends on node 1: nothing here


def test_a_delayed_link_inside_the_node_is_delayed_both_ways() -> None:
    assert lines(plan([delay("f1", B, A, 5_000)])) == [
        "rdu-n0-s0 -> rdu-n0-s1 +5,000 ns",
        "rdu-n0-s1 -> rdu-n0-s0 +5,000 ns",
    ]
    assert plan([delay("f1", B, A, 5)])[0].args == (B, 5)


def test_a_partition_downs_every_link_from_this_node_to_the_other() -> None:
    cs = plan([partition("f1")])
    assert {(c.socket, c.peer) for c in cs} == {(s, d) for s in NODE0 for d in NODE1}
    assert all(c.kind is ChangeKind.LINK_DOWN and c.value is True for c in cs)
    assert cs == sorted(cs, key=lambda c: (c.socket, c.peer))  # in (src, dst) order


def test_killing_a_socket_changes_no_setting_and_its_heal_restarts_it() -> None:
    kill = fault("f1", FaultKind.KILL_SOCKET, sockets=(B,))
    admit(kill, {}, 0, TOPO)
    assert plan([kill]) == []
    assert clearing("f1", {"f1": kill}, dead={B: "killed by fault f1"}) == ([kill], [B])


def test_the_agent_refuses_kill_agent_and_faults_with_nothing_on_its_node() -> None:
    with pytest.raises(InvalidRequest, match="kill-agent: the agent's process ends itself"):
        admit(fault("f1", FaultKind.KILL_AGENT, nodes=(0,)), {}, 0, TOPO)
    with pytest.raises(InvalidRequest, match="nothing of it is on node 0"):
        admit(slow("f1", FAR, 2.0), {}, 0, TOPO)
    admit(drop("f1", A, FAR), {}, 1, TOPO)  # node 1 holds the other direction


# ------------------------------------------------------------------ overlapping faults


def test_a_fault_id_or_kind_and_target_already_in_force_is_a_conflict() -> None:
    in_force = {"f1": drop("f1", A, B)}
    with pytest.raises(FaultConflict, match="fault f1 is already in force"):
        admit(drop("f1", A, FAR), in_force, 0, TOPO)
    with pytest.raises(FaultConflict, match=r"fault f1 \(link rdu-n0-s0 <-> rdu-n0-s1"):
        admit(drop("f2", B, A), in_force, 0, TOPO)  # the same link, named the other way
    admit(delay("f2", A, B, 7), in_force, 0, TOPO)  # another kind on it is allowed
    admit(partition("f2"), in_force, 0, TOPO)


def test_overlapping_faults_on_one_target_combine() -> None:
    both = [delay("f1", A, FAR, 100), drop("f2", A, FAR)]
    assert wanted(both, TOPO, NODE0).link(A, FAR) == LinkState(down=True, delay_ns=100)
    assert lines(plan(both)) == ["rdu-n0-s0 -> rdu-n1-s0 down", "rdu-n0-s0 -> rdu-n1-s0 +100 ns"]
    # The most severe slowdown and the sum of delays (both built past `admit`'s check).
    assert wanted([slow("f1", A, 2.0), slow("f2", A, 5.0)], TOPO, NODE0).slowdown(A) == 5.0
    twice = [delay("f1", A, FAR, 100), delay("f2", FAR, A, 20)]
    assert wanted(twice, TOPO, NODE0).link(A, FAR).delay_ns == 120


def test_clearing_one_of_two_faults_on_a_link_keeps_the_other() -> None:
    d, x = delay("f1", A, FAR, 100), drop("f2", A, FAR)
    told = told_after(d, x)
    assert plan([d, x], told) == []  # nothing more to say
    assert lines(plan([d], told)) == ["rdu-n0-s0 -> rdu-n1-s0 up"]  # the delay stays
    assert lines(plan([x], told)) == ["rdu-n0-s0 -> rdu-n1-s0 +0 ns"]  # still down


def test_a_link_dropped_twice_stays_down_until_both_are_cleared() -> None:
    x, p = drop("f1", A, FAR), partition("f2")
    told = told_after(x, p)
    assert plan([p], told) == []  # the partition still cuts it
    others = [(s, d) for s in NODE0 for d in NODE1 if (s, d) != (A, FAR)]
    assert plan([x], told) == [Change(ChangeKind.LINK_DOWN, s, False, d) for s, d in others]
    assert len(plan([], told)) == 64


def test_clearing_everything_tells_each_socket_its_fault_is_over() -> None:
    told = told_after(slow("f1", A, 4.0), delay("f2", A, B, 9))
    assert lines(plan([], told)) == [
        "rdu-n0-s0 slowdown 1",
        "rdu-n0-s0 -> rdu-n0-s1 +0 ns",
        "rdu-n0-s1 -> rdu-n0-s0 +0 ns",
    ]
    assert told.after(plan([], told)) == FaultState()  # nothing left told


# ------------------------------------------------------------------ dead and restarted sockets


def test_a_dead_socket_is_skipped_and_its_replacement_told_everything() -> None:
    faults = [slow("f1", A, 4.0), drop("f2", A, B)]
    alive = NODE0[1:]  # A is dead
    assert lines(plan(faults, alive=alive)) == ["rdu-n0-s1 -> rdu-n0-s0 down"]
    told = FaultState().after(plan(faults))  # told before A died
    assert plan(faults, told.without(A)) == [
        Change(ChangeKind.SLOW, A, 4.0),
        Change(ChangeKind.LINK_DOWN, A, True, B),
    ]
    assert plan(faults, told.without(B)) == [Change(ChangeKind.LINK_DOWN, B, True, A)]


def test_clearing_names_what_ends_and_what_restarts() -> None:
    in_force = {"f1": slow("f1", A, 2.0), "f2": fault("f2", FaultKind.KILL_SOCKET, sockets=(B,))}
    dead = {B: "killed by fault f2", NODE0[5]: "its actor died"}
    assert clearing("f1", in_force, dead) == ([in_force["f1"]], [])
    assert clearing("f9", in_force, dead) == ([], [])  # no part here
    assert clearing("", in_force, dead) == (list(in_force.values()), [B, NODE0[5]])
