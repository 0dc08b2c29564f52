"""Faults: validation, which links and nodes each touches, and the orchestrator's
injector forwarding them (with an in-memory gateway)."""

from __future__ import annotations

import pytest

from rdurack.errors import InvalidRequest, LinkFailure, UnknownName
from rdurack.orchestrator.fault_injector import FaultInjector
from rdurack.rack.faults import Fault, FaultConflict, FaultKind, make_fault
from rdurack.rack.presets import platform
from rdurack.rack.topology import Topology
from tests.support.fake_rack import RACK, FakeGateway

TOPO = Topology(platform("sn40l-rack16"))


def fault(kind: FaultKind, **kw: object) -> Fault:
    return make_fault(kind, TOPO, fault_id="f-1", **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kind", "fields", "error", "text"),
    [
        (FaultKind.KILL_SOCKET, {"sockets": ("rdu-n2-s0",)}, UnknownName, "rdu-n2-s0"),
        (FaultKind.KILL_SOCKET, {"sockets": ()}, InvalidRequest, "socket_id: required"),
        (FaultKind.SLOW_SOCKET, {"sockets": ("rdu-n0-s0",)}, None, ""),
        (FaultKind.SLOW_SOCKET, {"sockets": ("rdu-n0-s0",), "slow_factor": 0.5}, InvalidRequest,
         "slow_factor"),
        (FaultKind.SLOW_SOCKET, {"sockets": ("rdu-n0-s0",), "slow_factor": float("nan")},
         InvalidRequest, "slow_factor"),
        (FaultKind.DROP_LINK, {"sockets": ("rdu-n0-s1", "rdu-n0-s1")}, InvalidRequest, "both"),
        (FaultKind.DELAY_LINK, {"sockets": ("rdu-n0-s1", "rdu-n1-s1")}, InvalidRequest,
         "extra_latency_ns"),
        (FaultKind.KILL_AGENT, {"nodes": (2,)}, UnknownName, "node"),
        (FaultKind.PARTITION, {"nodes": (1, 1)}, InvalidRequest, "node_b"),
        (FaultKind.PARTITION, {"nodes": (0,)}, InvalidRequest, "node"),
    ],
)  # fmt: skip
def test_a_bad_fault_is_refused_naming_the_field(
    kind: FaultKind, fields: dict[str, object], error: type[Exception] | None, text: str
) -> None:
    if error is None:
        assert fault(kind, **fields).slow_factor == 1.0
        return
    with pytest.raises(error) as e:
        fault(kind, **fields)
    assert text in str(e.value)


def test_a_link_fault_acts_both_ways_and_each_way_on_its_senders_node() -> None:
    f = fault(FaultKind.DROP_LINK, sockets=("rdu-n0-s3", "rdu-n1-s3"))
    assert f.directed_links(TOPO) == [("rdu-n0-s3", "rdu-n1-s3"), ("rdu-n1-s3", "rdu-n0-s3")]
    assert f.nodes_touched(TOPO) == [0, 1]
    inside = fault(FaultKind.DELAY_LINK, sockets=("rdu-n1-s0", "rdu-n1-s5"), extra_latency_ns=9)
    assert inside.nodes_touched(TOPO) == [1]
    assert inside.describe() == "link rdu-n1-s0 <-> rdu-n1-s5 delayed by 9 ns"


def test_a_partition_cuts_every_link_between_the_two_nodes() -> None:
    f = fault(FaultKind.PARTITION, nodes=(0, 1))
    links = f.directed_links(TOPO)
    assert len(links) == 2 * 8 * 8 and len(set(links)) == len(links)
    assert all(a.split("-")[1] != b.split("-")[1] for a, b in links)  # all cross nodes
    assert f.nodes_touched(TOPO) == [0, 1]
    assert fault(FaultKind.KILL_AGENT, nodes=(1,)).nodes_touched(TOPO) == [1]


# ------------------------------------------------------------------ the injector


def injector(gateway: FakeGateway) -> FaultInjector:
    ids = iter(f"f-{i}" for i in range(100))
    return FaultInjector(gateway, RACK, wall=lambda: 50.0, new_id=lambda: next(ids))


def test_a_cross_node_fault_goes_to_both_agents_and_is_listed_once() -> None:
    gateway = FakeGateway()
    faults = injector(gateway)
    f = faults.inject(FaultKind.DROP_LINK, sockets=("rdu-n0-s2", "rdu-n1-s2"))
    assert f.id == "f-0" and f.injected_s == 50.0
    assert set(gateway.in_force[0]) == set(gateway.in_force[1]) == {"f-0"}
    assert [x.id for x in faults.list()] == ["f-0"]
    healed, _ = faults.heal("f-0")
    assert [x.id for x in healed] == ["f-0"]
    assert gateway.in_force == {0: {}, 1: {}} and faults.list() == []


def test_a_fault_one_node_refuses_is_undone_on_the_other(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gateway = FakeGateway()

    def refuse(node: int, f: Fault) -> None:
        if node == 1:
            raise FaultConflict("node 1: already")
        gateway.in_force[node][f.id] = f

    monkeypatch.setattr(gateway, "inject_fault", refuse)
    with pytest.raises(FaultConflict):
        injector(gateway).inject(FaultKind.PARTITION, nodes=(0, 1))
    assert gateway.in_force == {0: {}, 1: {}}


def test_healing_an_unknown_fault_is_not_found_naming_those_in_force() -> None:
    gateway = FakeGateway()
    faults = injector(gateway)
    faults.inject(FaultKind.SLOW_SOCKET, sockets=("rdu-n0-s0",), slow_factor=3)
    with pytest.raises(UnknownName) as e:
        faults.heal("f-9")
    assert "f-9" in str(e.value) and "f-0" in str(e.value)


def test_a_killed_agent_is_listed_until_it_is_back_as_a_new_incarnation() -> None:
    gateway = FakeGateway()
    faults = injector(gateway)
    kill = faults.inject(FaultKind.KILL_AGENT, nodes=(1,))
    assert gateway.in_force[1] == {kill.id: kill}  # forwarded to the agent to do
    gateway.in_force[1].clear()
    gateway.silent.add(1)  # the agent ended
    assert [f.id for f in faults.list()] == [kill.id]
    with pytest.raises(FaultConflict, match="supervisor"):
        faults.heal(kill.id)
    with pytest.raises(FaultConflict, match="not back yet"):
        faults.inject(FaultKind.KILL_AGENT, nodes=(1,))
    assert faults.heal() == ([], [])  # heal all: nothing the agents that answer hold
    gateway.silent.clear()
    gateway.incarnation[1] = "agent-1-again"  # restarted by its supervisor
    assert faults.list() == []


def test_killing_an_agent_that_does_not_answer_is_unavailable() -> None:
    gateway = FakeGateway()
    gateway.silent.add(0)
    with pytest.raises(LinkFailure):
        injector(gateway).inject(FaultKind.KILL_AGENT, nodes=(0,))


def test_healing_a_fault_on_an_agent_that_does_not_answer_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gateway = FakeGateway()
    faults = injector(gateway)
    f = faults.inject(FaultKind.DELAY_LINK, sockets=("rdu-n0-s0", "rdu-n1-s0"), extra_latency_ns=5)
    real_clear = gateway.clear_faults

    def clear(node: int, fault_id: str) -> tuple[list[Fault], list[str]]:
        if node == 0:
            raise LinkFailure("node 0: connection refused")
        return real_clear(node, fault_id)

    monkeypatch.setattr(gateway, "clear_faults", clear)
    with pytest.raises(LinkFailure, match="not on: node 0"):
        faults.heal(f.id)
    assert gateway.in_force[1] == {}  # ended where the agent answered


def test_a_fault_from_the_wire_with_an_impossible_time_is_refused_by_name() -> None:
    """Found by tests/integration/test_fuzz_node_agent.py: a Timestamp whose seconds lie
    outside its range made InjectFault answer INTERNAL."""
    from rdurack.v1 import fault_pb2
    from rdurack.wire.faults import fault_from_proto

    p = fault_pb2.Fault(id="f-9", kind=fault_pb2.FAULT_KIND_KILL_SOCKET, socket_ids=["rdu-n0-s0"])
    p.injected_time.seconds = -(2**63)
    with pytest.raises(InvalidRequest, match=r"fault\.injected_time: .*Seconds"):
        fault_from_proto(p, TOPO)
