"""Collective costs over the rack topology."""

from __future__ import annotations

import pytest

from rdurack.errors import InvalidRequest
from rdurack.rack.collectives import (
    Algorithm,
    all_gather,
    all_reduce,
    barrier,
    broadcast,
    transfer,
)
from rdurack.rack.presets import platform
from rdurack.rack.topology import SocketId, Topology

RACK = platform("sn40l-rack16")
TOPO = Topology(RACK)
INTRA = RACK.node.intra_node_link
INTER = RACK.inter_node_link
NODE0 = [SocketId(0, i) for i in range(8)]
ALL = TOPO.sockets


def steps(n: int) -> float:
    """The tolerance of a formula over `n` hops: the simulation's clocks are whole
    nanoseconds, so each hop rounds (the fitted link latencies have fractions)."""
    return n * 1e-9


def test_transfer_inside_a_node_and_across() -> None:
    nbytes = 64e6
    inside = transfer(TOPO, SocketId(0, 0), SocketId(0, 5), nbytes)
    assert inside.total_s == pytest.approx(
        INTRA.latency_ns * 1e-9 + nbytes / INTRA.bandwidth_bytes_per_s
    )
    rail = transfer(TOPO, SocketId(0, 3), SocketId(1, 3), nbytes)
    assert rail.total_s == pytest.approx(
        INTER.latency_ns * 1e-9 + nbytes / INTER.bandwidth_bytes_per_s
    )
    # No direct link: rail, then the other node's mesh.
    routed = transfer(TOPO, SocketId(0, 3), SocketId(1, 4), nbytes)
    assert routed.latency_s == pytest.approx((INTER.latency_ns + INTRA.latency_ns) * 1e-9)
    assert routed.bandwidth_s == pytest.approx(nbytes / INTER.bandwidth_bytes_per_s)


def test_ring_all_reduce_formula_in_a_node() -> None:
    nbytes = 16e6
    cost = all_reduce(TOPO, NODE0, nbytes, Algorithm.RING)
    step = INTRA.latency_ns * 1e-9 + nbytes / 8 / INTRA.bandwidth_bytes_per_s
    assert cost.total_s == pytest.approx(2 * 7 * step, abs=steps(2 * 7))


def test_ring_across_nodes_is_bound_by_the_rail() -> None:
    ring = TOPO.ring(ALL)
    # The ring crosses between nodes exactly twice, both times on a rail.
    crossings = [(a, b) for a, b in zip(ring, ring[1:] + ring[:1], strict=True) if a.node != b.node]
    assert len(crossings) == 2
    assert all(a.index == b.index for a, b in crossings)
    nbytes = 16e6
    cost = all_reduce(TOPO, ALL, nbytes, Algorithm.RING)
    chunk = nbytes / 16
    rail_busy = 2 * 15 * chunk / INTER.bandwidth_bytes_per_s  # one rail carries 30 chunks
    lockstep = 2 * 15 * (INTER.latency_ns * 1e-9 + chunk / INTER.bandwidth_bytes_per_s)
    # Steps pipeline: a hop waits for its own input and its link, not for the slowest hop.
    assert rail_busy < cost.total_s < lockstep


def test_on_a_switch_auto_picks_one_shot_for_small_and_two_shot_for_large() -> None:
    dgx = Topology(platform("dgx-h100"))
    group = dgx.sockets
    port = platform("dgx-h100").node.intra_node_link
    small, large = 8e3, 256e6
    assert all_reduce(dgx, group, small).total_s == pytest.approx(
        all_reduce(dgx, group, small, Algorithm.DIRECT).total_s
    )
    assert all_reduce(dgx, group, large).total_s == pytest.approx(
        all_reduce(dgx, group, large, Algorithm.TWO_SHOT).total_s
    )
    # One-shot: the port carries one copy of the buffer per peer.
    one_shot = all_reduce(dgx, group, large, Algorithm.DIRECT)
    assert one_shot.bandwidth_s == pytest.approx(7 * large / port.bandwidth_bytes_per_s)
    # Two-shot moves what a ring moves, (N-1)/N of the buffer twice, in two hops.
    two = all_reduce(dgx, group, large, Algorithm.TWO_SHOT)
    ring = all_reduce(dgx, group, large, Algorithm.RING)
    assert two.bandwidth_s == pytest.approx(ring.bandwidth_s, abs=steps(2 * 7))
    assert two.latency_s == pytest.approx(2 * port.latency_ns * 1e-9)


def test_on_a_mesh_every_link_works_at_once() -> None:
    nbytes = 256e6
    one_shot = all_reduce(TOPO, NODE0, nbytes, Algorithm.DIRECT)
    assert one_shot.bandwidth_s == pytest.approx(nbytes / INTRA.bandwidth_bytes_per_s)
    two = all_reduce(TOPO, NODE0, nbytes, Algorithm.TWO_SHOT)
    assert two.bandwidth_s == pytest.approx(
        2 * nbytes / 8 / INTRA.bandwidth_bytes_per_s, abs=steps(2)
    )
    assert all_reduce(TOPO, NODE0, nbytes).total_s == pytest.approx(two.total_s)
    assert two.total_s < one_shot.total_s < all_reduce(TOPO, NODE0, nbytes, Algorithm.RING).total_s


def test_two_shot_across_nodes_adds_one_rail_hop() -> None:
    nbytes = 64e6
    cost = all_reduce(TOPO, ALL, nbytes, Algorithm.TWO_SHOT)
    inside = 2 * (INTRA.latency_ns * 1e-9 + nbytes / 8 / INTRA.bandwidth_bytes_per_s)
    rail = INTER.latency_ns * 1e-9 + nbytes / 8 / INTER.bandwidth_bytes_per_s
    assert cost.total_s == pytest.approx(inside + rail, abs=steps(3))


def test_direct_pays_one_hop_per_level() -> None:
    cost = all_reduce(TOPO, ALL, 0.0, Algorithm.DIRECT)
    assert cost.latency_s == pytest.approx((INTRA.latency_ns + INTER.latency_ns) * 1e-9)
    assert barrier(TOPO, NODE0).total_s == pytest.approx(INTRA.latency_ns * 1e-9, abs=steps(1))


def test_single_member_costs_nothing() -> None:
    assert all_reduce(TOPO, [SocketId(1, 2)], 1e9).total_s == 0.0
    assert all_gather(TOPO, [SocketId(1, 2)], 1e9).total_s == 0.0


def test_broadcast_and_all_gather() -> None:
    nbytes = 8e6
    b = broadcast(TOPO, NODE0, SocketId(0, 3), nbytes)
    # The root serialises 7 chunks onto its link; the last then makes 7 hops.
    serialise = nbytes / 8 / INTRA.bandwidth_bytes_per_s
    assert b.total_s == pytest.approx(
        7 * serialise + 7 * (INTRA.latency_ns * 1e-9 + serialise), abs=steps(14)
    )
    g = all_gather(TOPO, NODE0, nbytes)
    assert g.total_s == pytest.approx(
        7 * (INTRA.latency_ns * 1e-9 + nbytes / INTRA.bandwidth_bytes_per_s), abs=steps(7)
    )
    with pytest.raises(InvalidRequest, match="root"):
        broadcast(TOPO, NODE0, SocketId(1, 0), nbytes)


def test_bad_groups() -> None:
    with pytest.raises(InvalidRequest, match="twice"):
        all_reduce(TOPO, [SocketId(0, 0), SocketId(0, 0)], 1.0, Algorithm.RING)
    with pytest.raises(InvalidRequest, match="not a socket"):
        transfer(TOPO, SocketId(0, 0), SocketId(2, 0), 1.0)
    with pytest.raises(InvalidRequest, match="rdu-n"):
        SocketId.parse("node3")
    assert SocketId.parse("rdu-n1-s7") == SocketId(1, 7)
    assert str(SocketId(1, 7)) == "rdu-n1-s7"


def test_link_rule_charges_latency_once_and_queues_on_a_busy_link() -> None:
    from rdurack.rack.links import LinkState, Route

    link = LinkState(Route(latency_ns=1000.0, bandwidth_bytes_per_s=1e9))
    assert link.transmit(0, 1000) == (0, 2000)  # 1 us latency + 1 us on the wire
    # Sent at 500 ns, but the link is busy until 1000 ns.
    assert link.transmit(500, 1000) == (1000, 3000)
    # An idle link starts at the sender's clock.
    assert link.transmit(10_000, 0) == (10_000, 11_000)


def test_ring_schedule_reduces_every_chunk_everywhere() -> None:
    """Replay the ring's chunk bookkeeping on integers: every member ends with the sum."""
    from rdurack.rack.collectives import ring_all_reduce

    group = ALL
    sched = ring_all_reduce(TOPO, group, 16 * 3, 4)
    data = {s: [[k] * 3 for k in range(16)] for s in group}  # member, chunk -> values
    value = {s: i + 1 for i, s in enumerate(group)}
    for s in group:
        data[s] = [[value[s]] * 3 for _ in range(16)]
    for step in sched:
        sent = [(m, list(data[m.src][m.chunk])) for m in step]
        for m, payload in sent:
            mine = data[m.dst][m.chunk]
            data[m.dst][m.chunk] = (
                [a + b for a, b in zip(mine, payload, strict=True)] if m.reduce else payload
            )
    total = sum(value.values())
    assert all(chunk == [total] * 3 for s in group for chunk in data[s])
