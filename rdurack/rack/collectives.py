"""Collectives as schedules of sends, and their emulated time.

A collective is a list of steps; in a step every member sends its messages at once (at
its clock), then waits for the messages sent to it and moves its clock to the latest
arrival. Each transfer follows the one rule of rack/links.py. The predictor *simulates*
a schedule here; the socket actors *execute* the same schedule over their gRPC links,
with real bytes or descriptors, so the two give the same emulated time.

A Send names the chunk it carries (index `chunk` of the buffer split into `parts` nearly
equal parts, or the whole buffer) and whether the receiver reduces it into its own or
copies it, which is all the functional executor needs.

Algorithms:
  ring      2(N-1) steps of bytes/N around a ring (reduce-scatter, then all-gather);
            across racks the two-level ring of rack/hierarchy.py (the rack's ring, a
            ring of each rack-chunk over the spine, the rack's ring again)
  direct    one-shot: the whole buffer to every peer of the node, then to rail peers
  two-shot  reduce-scatter and all-gather each as one direct exchange, rails between
  auto      the one with the earliest finish, as NCCL picks by message size
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum

from rdurack.errors import InvalidRequest
from rdurack.rack.links import LinkState, Route
from rdurack.rack.topology import SocketId, Topology

NS = 1e-9
WHOLE = -1  # Send.chunk value: the whole buffer
# Bytes per element of what the timing model all-reduces: BF16 activations.
BF16_BYTES = 2


class Algorithm(StrEnum):
    RING = "ring"
    DIRECT = "direct"
    TWO_SHOT = "two-shot"
    AUTO = "auto"


@dataclass(frozen=True, slots=True)
class Send:
    src: SocketId
    dst: SocketId
    nbytes: int
    chunk: int = WHOLE  # which part of the buffer travels (WHOLE: all of it)
    reduce: bool = True  # the receiver adds it into its own; False: copies it
    parts: int = 1  # the buffer is split (see `split`) into this many parts
    # Part `sub` of that chunk split again into `subparts` (WHOLE: the whole chunk): the
    # spine phase of the two-level ring splits each rack-chunk among the racks.
    sub: int = WHOLE
    subparts: int = 1

    def __post_init__(self) -> None:
        if self.chunk != WHOLE and not 0 <= self.chunk < self.parts:
            raise InvalidRequest(f"chunk {self.chunk} of a buffer in {self.parts} parts")
        if self.sub != WHOLE and (self.chunk == WHOLE or not 0 <= self.sub < self.subparts):
            raise InvalidRequest(f"part {self.sub} of {self.subparts} of chunk {self.chunk}")


Step = tuple[Send, ...]
Schedule = tuple[Step, ...]


@dataclass(frozen=True, slots=True)
class Cost:
    latency_s: float
    bandwidth_s: float

    @property
    def total_s(self) -> float:
        return self.latency_s + self.bandwidth_s


ZERO = Cost(0.0, 0.0)


def split(elements: int, parts: int) -> list[int]:
    """Element counts of `parts` nearly equal chunks (numpy.array_split's rule)."""
    base, extra = divmod(elements, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


# ------------------------------------------------------------------ links of a run


class Links:
    """The link states one run uses: a link per (src, dst) pair on a mesh or rail, one
    port per sender on a switch. An actor holds one for its own sends."""

    def __init__(
        self, topo: Topology, slowdown: Callable[[SocketId, SocketId], float] | None = None
    ):
        self.topo = topo
        self._slowdown = slowdown
        self._states: dict[tuple[SocketId, SocketId | None], LinkState] = {}

    def state(self, src: SocketId, dst: SocketId) -> LinkState:
        switched = src.node == dst.node and self.topo.platform.node.fabric == "switch"
        key = (src, None) if switched else (src, dst)
        st = self._states.get(key)
        if st is None:
            factor = 1.0 if self._slowdown is None else self._slowdown(src, dst)
            st = LinkState(Route.over(self.topo.path(src, dst)), factor)
            self._states[key] = st
        return st


def simulate(
    topo: Topology,
    schedule: Schedule,
    start_ns: int = 0,
    observe: Callable[[Send, int, int], None] | None = None,
) -> dict[SocketId, int]:
    """Run a schedule on fresh links with every member starting at `start_ns`; the clock
    of every member at the end, in ns. `observe(send, send_ns, arrival_ns)` sees each
    transfer."""
    links = Links(topo)
    clocks: dict[SocketId, int] = {}
    for step in schedule:
        for s in step:
            clocks.setdefault(s.src, start_ns)
            clocks.setdefault(s.dst, start_ns)
        arrivals: dict[SocketId, int] = {}
        for s in step:
            _, arrival = links.state(s.src, s.dst).transmit(clocks[s.src], s.nbytes)
            if observe is not None:
                observe(s, clocks[s.src], arrival)
            arrivals[s.dst] = max(arrivals.get(s.dst, 0), arrival)
        for dst, arrival in arrivals.items():
            clocks[dst] = max(clocks[dst], arrival)
    return clocks


def cost(topo: Topology, schedule: Schedule) -> Cost:
    """Emulated time of a schedule, split into a latency part (each step's slowest hop
    latency, what a fused kernel pays serially) and the rest (which it can overlap)."""
    if not schedule:
        return ZERO
    total = max(simulate(topo, schedule).values()) * NS
    latency = (
        sum(max(Route.over(topo.path(s.src, s.dst)).latency_ns for s in step) for step in schedule)
        * NS
    )
    latency = min(latency, total)
    return Cost(latency, total - latency)


# ------------------------------------------------------------------ schedules


def _check(topo: Topology, group: list[SocketId]) -> None:
    if not group:
        raise InvalidRequest("a collective needs at least one member")
    for s in group:
        topo.check(s)
    if len(set(group)) != len(group):
        raise InvalidRequest("a collective group lists a socket twice")


def _by_node(group: Iterable[SocketId]) -> dict[int, list[SocketId]]:
    """Members by node (host)."""
    nodes: dict[int, list[SocketId]] = {}
    for s in sorted(group):
        nodes.setdefault(s.node, []).append(s)
    return nodes


def rail_aligned(group: list[SocketId]) -> bool:
    """Every node of the group holds the same socket indices, so each member has a rail
    peer in every other node: what direct and two-shot need across nodes."""
    nodes = _by_node(group)
    indices = {tuple(s.index for s in members) for members in nodes.values()}
    return len(indices) == 1


def rack_aligned(topo: Topology, group: list[SocketId]) -> bool:
    """Every rack of the group holds the same sockets (node within its rack, index):
    each member has a spine peer in every other rack, as the two-level ring needs."""
    racks: dict[int, set[tuple[int, int]]] = {}
    for s in group:
        racks.setdefault(s.rack, set()).add((s.node - s.rack * topo.platform.nodes, s.index))
    return len({frozenset(v) for v in racks.values()}) <= 1


def ring_all_reduce(
    topo: Topology, group: list[SocketId], elements: int, itemsize: int
) -> Schedule:
    """Reduce-scatter then all-gather around `topo.ring(group)`: member p first sends chunk
    (p - s) mod N and the receiver adds it; then chunk (p + 1 - s) mod N, copied. A group
    across racks with the same sockets in each takes the two-level ring instead."""
    _check(topo, group)
    if topo.racks_of(group) > 1 and rack_aligned(topo, group):
        return _two_level_ring(topo, group, elements, itemsize)
    ring = topo.ring(group)
    return (
        *_ring_phase(ring, elements, itemsize, True),
        *_ring_phase(ring, elements, itemsize, False),
    )


def _ring_phase(ring: list[SocketId], elements: int, itemsize: int, reduce: bool) -> list[Step]:
    """Half a ring all-reduce over `ring`: reduce-scatter (`reduce`; member p ends owning
    chunk (p + 1) mod N) or the all-gather that follows it."""
    n = len(ring)
    sizes = [e * itemsize for e in split(elements, n)]
    offset = 0 if reduce else 1
    return [
        tuple(
            Send(
                ring[p],
                ring[(p + 1) % n],
                sizes[(p + offset - s) % n],
                (p + offset - s) % n,
                reduce,
                n,
            )
            for p in range(n)
        )
        for s in range(n - 1)
    ]


def _two_level_ring(
    topo: Topology, group: list[SocketId], elements: int, itemsize: int
) -> Schedule:
    """rack/hierarchy.py's three phases as sends: every rack's ring reduce-scatter at
    once; then the R owners of each rack-chunk (member p of every rack owns chunk
    (p + 1) mod K) ring-all-reduce it over the spine in R parts; then every rack's ring
    all-gather. Racks ring in rack order, members in `topo.ring` order."""
    by_rack: dict[int, list[SocketId]] = {}
    for s in sorted(group):
        by_rack.setdefault(s.rack, []).append(s)
    rings = [topo.ring(members) for _, members in sorted(by_rack.items())]
    k, r = len(rings[0]), len(rings)

    def in_racks(reduce: bool) -> list[Step]:
        phases = [_ring_phase(ring, elements, itemsize, reduce) for ring in rings]
        return [tuple(send for phase in phases for send in phase[s]) for s in range(k - 1)]

    chunks = split(elements, k)
    spine: list[Step] = []
    for reduce, offset in ((True, 0), (False, 1)):
        for t in range(r - 1):
            step = []
            for p in range(k):
                c = (p + 1) % k
                subs = split(chunks[c], r)
                for q in range(r):
                    sub = (q + offset - t) % r
                    src, dst = rings[q][p], rings[(q + 1) % r][p]
                    step.append(Send(src, dst, subs[sub] * itemsize, c, reduce, k, sub, r))
            spine.append(tuple(step))
    return (*in_racks(True), *spine, *in_racks(False))


def _rail_step(
    group: list[SocketId], chunk_of: Callable[[SocketId], tuple[int, int]], parts: int
) -> Step:
    """Every member sends (chunk, nbytes) = chunk_of(member) to its rail peers."""
    nodes = _by_node(group)
    sends = []
    for s in group:
        chunk, nbytes = chunk_of(s)
        for node, members in nodes.items():
            if node != s.node:
                peer = next(m for m in members if m.index == s.index)
                sends.append(Send(s, peer, nbytes, chunk, True, parts))
    return tuple(sends)


def direct_all_reduce(
    topo: Topology, group: list[SocketId], elements: int, itemsize: int
) -> Schedule:
    """One-shot: every member sends its whole buffer to each peer of its node, each adds
    what it receives; across nodes, members then exchange node sums with rail peers."""
    _check(topo, group)
    if len(group) == 1:
        return ()
    nbytes = elements * itemsize
    nodes = _by_node(group)
    steps: list[Step] = []
    intra = tuple(
        Send(s, t, nbytes) for members in nodes.values() for s in members for t in members if s != t
    )
    if intra:
        steps.append(intra)
    if len(nodes) > 1:
        if not rail_aligned(group):
            raise InvalidRequest("a direct all-reduce across nodes needs a rail-aligned group")
        steps.append(_rail_step(group, lambda s: (WHOLE, nbytes), 1))
    return tuple(steps)


def two_shot_all_reduce(
    topo: Topology, group: list[SocketId], elements: int, itemsize: int
) -> Schedule:
    """Direct reduce-scatter inside each node (the k-th member of a node owns chunk k),
    rail exchange of the owned chunks, direct all-gather inside each node."""
    _check(topo, group)
    if len(group) == 1:
        return ()
    nodes = _by_node(group)
    if len(nodes) > 1 and not rail_aligned(group):
        raise InvalidRequest("a two-shot all-reduce across nodes needs a rail-aligned group")
    per_node = len(next(iter(nodes.values())))
    sizes = [e * itemsize for e in split(elements, per_node)]
    rank = {s: k for members in nodes.values() for k, s in enumerate(members)}
    steps: list[Step] = []
    if per_node > 1:
        steps.append(
            tuple(
                Send(s, t, sizes[rank[t]], rank[t], True, per_node)
                for members in nodes.values()
                for s in members
                for t in members
                if s != t
            )
        )
    if len(nodes) > 1:
        steps.append(_rail_step(group, lambda s: (rank[s], sizes[rank[s]]), per_node))
    if per_node > 1:
        steps.append(
            tuple(
                Send(s, t, sizes[rank[s]], rank[s], False, per_node)
                for members in nodes.values()
                for s in members
                for t in members
                if s != t
            )
        )
    return tuple(steps)


ALL_REDUCE = {
    Algorithm.RING: ring_all_reduce,
    Algorithm.DIRECT: direct_all_reduce,
    Algorithm.TWO_SHOT: two_shot_all_reduce,
}


def all_reduce_schedule(
    topo: Topology,
    group: list[SocketId],
    elements: int,
    itemsize: int,
    algorithm: Algorithm = Algorithm.AUTO,
) -> Schedule:
    return pick_all_reduce(topo, group, elements, itemsize, algorithm)[1]


def pick_all_reduce(
    topo: Topology,
    group: list[SocketId],
    elements: int,
    itemsize: int,
    algorithm: Algorithm = Algorithm.AUTO,
) -> tuple[Algorithm, Schedule]:
    """The all-reduce's algorithm (AUTO: the one with the earliest finish) and schedule."""
    if elements < 0:
        raise InvalidRequest(f"all-reduce of {elements} elements")
    if algorithm is not Algorithm.AUTO:
        return algorithm, ALL_REDUCE[algorithm](topo, group, elements, itemsize)
    candidates = [Algorithm.RING]
    if len(_by_node(group)) == 1 or rail_aligned(group):
        candidates += [Algorithm.DIRECT, Algorithm.TWO_SHOT]
    schedules = [(a, ALL_REDUCE[a](topo, group, elements, itemsize)) for a in candidates]
    return min(schedules, key=lambda c: max(simulate(topo, c[1]).values(), default=0))


def elements_of(nbytes: float, itemsize: int) -> int:
    """Whole elements of `itemsize` bytes that hold `nbytes` (rounded up)."""
    if nbytes < 0:
        raise InvalidRequest(f"all-reduce of {nbytes} bytes")
    return int(-(-nbytes // itemsize)) if nbytes > 0 else 0


def broadcast_schedule(
    topo: Topology, group: list[SocketId], root: SocketId, elements: int, itemsize: int
) -> Schedule:
    """Pipelined ring broadcast in N chunks: in step k the member at ring position p
    forwards chunk k - p to the next."""
    _check(topo, group)
    if root not in group:
        raise InvalidRequest(f"broadcast root {root} is not in the group")
    ring = topo.ring(group)
    n = len(ring)
    if n == 1:
        return ()
    start = ring.index(root)
    ring = ring[start:] + ring[:start]
    sizes = [e * itemsize for e in split(elements, n)]
    return tuple(
        tuple(
            Send(ring[p], ring[p + 1], sizes[k - p], k - p, False, n)
            for p in range(n - 1)
            if 0 <= k - p < n
        )
        for k in range(2 * n - 2)
    )


def all_gather_schedule(
    topo: Topology, group: list[SocketId], elements_per_member: int, itemsize: int
) -> Schedule:
    """Ring all-gather: in step s the member at ring position p forwards block (p - s)
    mod N, the block of the member at that position."""
    _check(topo, group)
    ring = topo.ring(group)
    n = len(ring)
    nbytes = elements_per_member * itemsize
    return tuple(
        tuple(Send(ring[p], ring[(p + 1) % n], nbytes, (p - s) % n, False, n) for p in range(n))
        for s in range(n - 1)
    )


def barrier_schedule(topo: Topology, group: list[SocketId]) -> Schedule:
    """A zero-byte one-shot exchange: every member hears from every other."""
    if len(_by_node(group)) > 1 and not rail_aligned(group):
        return ring_all_reduce(topo, group, 0, 1)
    return direct_all_reduce(topo, group, 0, 1)


# ------------------------------------------------------------------ costs (predictor)


def all_reduce(
    topo: Topology,
    group: list[SocketId],
    nbytes: float,
    algorithm: Algorithm = Algorithm.AUTO,
    itemsize: int = BF16_BYTES,
) -> Cost:
    """Emulated time of an all-reduce of `nbytes` (BF16 elements by default)."""
    elements = elements_of(nbytes, itemsize)
    return cost(topo, all_reduce_schedule(topo, group, elements, itemsize, algorithm))


def broadcast(topo: Topology, group: list[SocketId], root: SocketId, nbytes: float) -> Cost:
    return cost(topo, broadcast_schedule(topo, group, root, int(nbytes), 1))


def all_gather(topo: Topology, group: list[SocketId], nbytes_per_member: float) -> Cost:
    return cost(topo, all_gather_schedule(topo, group, int(nbytes_per_member), 1))


def barrier(topo: Topology, group: list[SocketId]) -> Cost:
    return cost(topo, barrier_schedule(topo, group))


def transfer(topo: Topology, src: SocketId, dst: SocketId, nbytes: float) -> Cost:
    return cost(topo, ((Send(src, dst, int(nbytes)),),)) if src != dst else ZERO
