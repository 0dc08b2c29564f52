"""All-reduce across racks: a two-level (hierarchical) ring, priced by formula.

The socket actors execute the same three phases as sends (collectives.ring_all_reduce,
its two-level ring); the predictor prices them here by formula, which stays fast at a
thousand sockets. The formula runs the phases one after another; the simulated sends
overlap them a little (a member starts on the spine when its own reduce-scatter ends),
so on large buckets the formula is up to 5% higher (measured, tests/unit/test_racks.py).

A group that spans racks, with the same sockets in every rack, all-reduces in three
phases (the standard 2D hierarchical ring):

  1. reduce-scatter around the ring of the rack's members (the first half of the ring
     all-reduce of collectives.py, node by node over the mesh and the rails): each of
     the rack's K members ends up owning the rack's sum of one chunk of B/K bytes;
  2. all-reduce of that chunk among its R owners, one per rack, around a ring over the
     spine (socket i of node n in every rack: a rail of the spine): 2(R-1) steps of
     B/(K·R) bytes; every socket of every rack sends at once, so each gets the spine's
     bandwidth divided by its oversubscription;
  3. all-gather around the rack's ring (the second half of the ring all-reduce).

Phases 1 and 3 together are the ring all-reduce of the rack's members, which the
predictor already simulates on the links (the single-rack cost, unchanged); phase 2 adds

    2·(R-1)·latency + 2·(R-1)·(B/K)/R · oversubscription / bandwidth   seconds

from the spine's numbers (`PlatformSpec.spine`), nothing fitted. So the cost at R racks
is the single-rack cost plus a term that grows with R: latency linearly, bandwidth
towards 2·(B/K)·oversubscription/bandwidth. Latency-bound trees (NCCL's at scale) are
not modelled: at many racks and small buckets this ring overstates the spine's latency.
"""

from __future__ import annotations

from collections.abc import Callable

from rdurack.errors import InvalidRequest
from rdurack.rack.collectives import (
    BF16_BYTES,
    Algorithm,
    Cost,
    all_reduce,
    elements_of,
    rack_aligned,
)
from rdurack.rack.topology import SocketId, Topology

NS = 1e-9


def spine_all_reduce(topo: Topology, racks: int, nbytes: float) -> Cost:
    """Phase 2: a ring all-reduce of `nbytes` among `racks` sockets over the spine, every
    socket of a rack sending at once (so each gets bandwidth / oversubscription)."""
    if racks < 1 or nbytes < 0:
        raise InvalidRequest(f"spine all-reduce of {nbytes} bytes among {racks} racks")
    if racks == 1:
        return Cost(0.0, 0.0)
    spine = topo.platform.spine
    if spine is None:
        raise InvalidRequest(f"{topo.platform.name} has no spine between racks")
    steps = 2 * (racks - 1)
    chunk = nbytes / racks
    return Cost(
        steps * spine.latency_ns * NS,
        steps * chunk * spine.oversubscription / spine.bandwidth_bytes_per_s,
    )


def hierarchical_all_reduce(
    topo: Topology,
    group: list[SocketId],
    nbytes: float,
    itemsize: int = BF16_BYTES,
    rack_cost: Callable[[list[SocketId], float], Cost] | None = None,
) -> Cost:
    """Emulated time of an all-reduce of `nbytes` over `group` (any number of racks):
    the rack's ring all-reduce (phases 1 and 3, simulated on the links, or
    `rack_cost(members, nbytes)` when the caller caches it), plus the spine's phase 2 on
    the chunk each member owns."""
    if not group:
        raise InvalidRequest("a collective needs at least one member")
    if not rack_aligned(topo, group):
        raise InvalidRequest(
            "an all-reduce across racks needs the same sockets in every rack of the group"
        )
    first = min(s.rack for s in group)
    members = sorted(s for s in group if s.rack == first)
    racks = len(group) // len(members)
    if rack_cost is not None:
        inside = rack_cost(members, nbytes)
    elif len(members) > 1:
        inside = all_reduce(topo, members, nbytes, Algorithm.RING, itemsize)
    else:
        inside = Cost(0.0, 0.0)
    # The chunk a member owns after phase 1: whole elements, the largest of the split.
    chunk = elements_of(elements_of(nbytes, itemsize) / len(members), 1) * itemsize
    across = spine_all_reduce(topo, racks, chunk)
    return Cost(inside.latency_s + across.latency_s, inside.bandwidth_s + across.bandwidth_s)
