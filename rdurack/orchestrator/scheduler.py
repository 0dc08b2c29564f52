"""Which queued jobs start now, and on which sockets.

The scheduler is pure: it sees the queue, the sockets other jobs hold and the sockets not
to use, and returns placements. The orchestrator reserves them in the job store; nothing
here talks to a node. Its only state is the per-job skip counters of the starvation guard.

Policy (what `Scheduler.schedule` does each round):

- **Gang.** A job gets all of its sockets or none; a half-placed job would hold sockets
  while it waits for the rest, and two such jobs can deadlock each other.
- **Topology.** A job of at most `sockets_per_node` sockets goes in one node: inside a
  node every socket reaches every other one directly, across nodes only rail peers do.
  Best fit: the node with the fewest free sockets that still hold it (ties: lowest node),
  and in it the lowest free indices, so that whole nodes stay free for wide jobs.
- **Rail alignment.** A wider job spans the fewest nodes `m` such that `k % m == 0` and
  `k / m <= sockets_per_node`, using the same `k / m` socket indices on each node, so
  that every socket's peer on the other nodes is its rail peer (one hop). Nodes are
  tried best fit first (fewest free, then lowest node) and the lowest common free
  indices are taken. A size that cannot split this way on the rack is refused by `check`.
- **Racks.** On a platform of several racks (nodes number across them), a job that
  fits the nodes of one rack is placed in one rack when one has room: the spine between
  racks is slower and shared. Only a job that fits no single rack crosses it.
- **Order and backfill.** The queue comes ordered by priority (desc) then FIFO and is
  walked in that order. A job that does not fit now does not stop later jobs that do.
- **Starvation guard.** Backfill alone lets a stream of small jobs keep a wide job
  waiting forever. So each round that a job is skipped while some job behind it is
  placed counts against it; rounds where nothing overtakes it neither count nor reset
  (a full rack is nobody's fault). Once a job has been overtaken `starvation_rounds`
  times, no job behind it is placed until it is: the rack drains for it. Jobs ahead of it
  still start. A job that could not fit even on the idle rack (given the unhealthy
  sockets) never drains the rack, since draining could not help it. Counters of jobs
  that left the queue are forgotten.
- **Tenant quotas.** `allowance` maps a tenant to the sockets it may still take (its
  quota less what its SCHEDULED and RUNNING jobs hold). A job that would go over is not
  placed this round and counts as neither placed nor overtaken: only its own tenant's
  jobs ending can let it start, so it never drains the rack. Tenants not in the map
  have no quota.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass

from rdurack.errors import InvalidRequest
from rdurack.orchestrator.jobs import Job, JobSpec
from rdurack.rack.topology import SocketId


@dataclass(frozen=True)
class Placement:
    """Where one job starts: socket id strings in rack order (node, then index)."""

    job_id: str
    sockets: tuple[str, ...]


def _low_bits(mask: int, count: int) -> list[int]:
    """The `count` lowest set bit positions of `mask` (the caller ensures there are enough)."""
    out: list[int] = []
    while len(out) < count:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


class Scheduler:
    """Gang, topology-aware, priority/FIFO scheduling with backfill and a starvation guard
    (the module docstring states the policy)."""

    def __init__(
        self,
        nodes: int,
        sockets_per_node: int,
        starvation_rounds: int = 20,
        nodes_per_rack: int | None = None,
    ) -> None:
        """`nodes`: every node of the platform; `nodes_per_rack`: how many of them each
        rack holds (None: one rack)."""
        if nodes <= 0 or sockets_per_node <= 0:
            raise InvalidRequest(
                f"a rack needs at least one node and one socket per node; "
                f"got {nodes} nodes x {sockets_per_node}"
            )
        if starvation_rounds <= 0:
            raise InvalidRequest(f"starvation_rounds must be positive; got {starvation_rounds}")
        per_rack = nodes_per_rack or nodes
        if per_rack <= 0 or nodes % per_rack:
            raise InvalidRequest(f"{nodes} nodes do not make racks of {per_rack}")
        self.nodes = nodes
        self.nodes_per_rack = per_rack
        self.sockets_per_node = sockets_per_node
        self.starvation_rounds = starvation_rounds
        # job id -> rounds it was overtaken by a later job while it waited.
        self.skips: dict[str, int] = {}
        # Names are built once: scheduling turns bits into strings for every placement.
        self._names = [
            [str(SocketId(n, i, n // per_rack)) for i in range(sockets_per_node)]
            for n in range(nodes)
        ]
        self._index = {
            name: (n, i) for n, row in enumerate(self._names) for i, name in enumerate(row)
        }
        self._full = (1 << sockets_per_node) - 1

    @property
    def total(self) -> int:
        return self.nodes * self.sockets_per_node

    # ------------------------------------------------------------------ sizes

    def split(self, k: int) -> tuple[int, int] | None:
        """(nodes, sockets per node) for a job of k sockets, or None if it cannot be placed
        on this rack: one node when it fits one, else the fewest nodes that share k evenly
        with at most `sockets_per_node` each."""
        if k <= 0 or k > self.total:
            return None
        if k <= self.sockets_per_node:
            return (1, k)
        for m in range(2, self.nodes + 1):
            if k % m == 0 and k // m <= self.sockets_per_node:
                return (m, k // m)
        return None

    def check(self, spec: JobSpec) -> None:
        """Refuse a job that could never be placed on this rack, naming the field."""
        k = spec.sockets
        shape = f"{self.nodes} nodes x {self.sockets_per_node}"
        if k <= 0:
            raise InvalidRequest(
                f"spec.kernel.num_sockets: {k} sockets asked; a job needs at least 1"
            )
        if k > self.total:
            raise InvalidRequest(
                f"spec.kernel.num_sockets: {k} sockets asked; the rack has {self.total} ({shape})"
            )
        if self.split(k) is None:
            fits = [s for s in range(self.sockets_per_node + 1, self.total + 1) if self.split(s)]
            raise InvalidRequest(
                f"spec.kernel.num_sockets: {k} sockets asked; a job wider than one node "
                f"({self.sockets_per_node} sockets) must use the same socket indices on each "
                f"node it spans (rail-aligned), so it must split evenly over at most "
                f"{self.nodes} nodes ({shape}); sizes above {self.sockets_per_node} that fit: "
                f"{', '.join(map(str, fits)) or 'none'}"
            )

    # ------------------------------------------------------------------ a round

    def schedule(
        self,
        queued: Iterable[Job],
        busy: Collection[str],
        unhealthy: Collection[str] = (),
        allowance: Mapping[str, int] | None = None,
        still_queued: Collection[str] | None = None,
    ) -> list[Placement]:
        """Placements for the jobs of `queued` (priority desc, then FIFO) that start now.

        They never overlap each other, `busy` (held by other jobs) or `unhealthy`, and no
        tenant in `allowance` gets more sockets than it allows. Updates the starvation
        counters (module docstring). `queued` is walked only as far as the round needs
        (it may be read lazily); then `still_queued`, the ids of every queued job, says
        whose counters to keep (None: `queued` was the whole queue)."""
        left = dict(allowance or {})
        healthy = self._masks(unhealthy)
        free = self._masks(busy, start=healthy)
        free_count = sum(m.bit_count() for m in free)

        placements: list[Placement] = []
        failed: set[int] = set()  # sizes that did not fit this round: free only shrinks
        fits_idle: dict[int, bool] = {}  # sizes that fit the healthy rack with no job on it
        skipped: list[tuple[int, str]] = []  # (queue position, job id) of jobs not placed
        last_placed = -1
        walked: list[Job] = []
        # Once no socket is free, nothing later can start and nothing later overtakes
        # anyone: the walk stops there (before reading the next job).
        for pos, job in enumerate(queued if free_count else ()):
            walked.append(job)
            k = job.spec.sockets
            if job.tenant in left and k > left[job.tenant]:
                continue  # over its tenant's quota for now (module docstring)
            sockets = None if k in failed else self._place(k, free)
            if sockets is not None:
                placements.append(Placement(job.id, sockets))
                free_count -= k
                last_placed = pos
                if job.tenant in left:
                    left[job.tenant] -= k
                if free_count == 0:
                    break
                continue
            failed.add(k)
            skipped.append((pos, job.id))
            if self.skips.get(job.id, 0) >= self.starvation_rounds:
                if k not in fits_idle:
                    fits_idle[k] = self._place(k, list(healthy)) is not None
                if fits_idle[k]:
                    break  # drain: nothing behind a starving job starts until it does

        # Count a round against each skipped job that some later job overtook; keep only
        # counters of jobs still queued and not placed (a placed job's wait is over).
        overtaken = {job_id for pos, job_id in skipped if pos < last_placed}
        known = set(still_queued) if still_queued is not None else {j.id for j in walked}
        waiting = known - {p.job_id for p in placements}
        counts = {job_id: n for job_id, n in self.skips.items() if job_id in waiting}
        for job_id in overtaken:
            counts[job_id] = counts.get(job_id, 0) + 1
        self.skips = counts
        return placements

    # ------------------------------------------------------------------ internals

    def _masks(self, sockets: Collection[str], start: list[int] | None = None) -> list[int]:
        """Per node, a bitmask of the free socket indices once `sockets` are taken away."""
        masks = list(start) if start is not None else [self._full] * self.nodes
        for name in sockets:
            where = self._index.get(name)
            if where is None:
                # A socket the rack does not have means the caller's view is wrong;
                # placing around it silently would hide that.
                SocketId.parse(name)  # a malformed id gets the parser's own message
                raise InvalidRequest(
                    f"{name} is not a socket of this rack "
                    f"({self.nodes} nodes x {self.sockets_per_node})"
                )
            node, index = where
            masks[node] &= ~(1 << index)
        return masks

    def _place(self, k: int, free: list[int]) -> tuple[str, ...] | None:
        """Take k sockets out of `free` (mutated) per the topology rules, or None."""
        shape = self.split(k)
        if shape is None:
            return None  # never placeable here; `check` refuses such jobs at submit
        m, width = shape
        if m == 1:
            best = -1
            for node, mask in enumerate(free):
                n = mask.bit_count()
                # Strict < keeps the lowest node on ties.
                if n >= width and (best < 0 or n < free[best].bit_count()):
                    best = node
            if best < 0:
                return None
            chosen_nodes, common = [best], free[best]
        else:
            found = self._rail_nodes(m, width, free)
            if found is None:
                return None
            chosen_nodes, common = found
        indices = _low_bits(common, width)
        bits = sum(1 << i for i in indices)
        for node in chosen_nodes:
            free[node] &= ~bits
        return tuple(self._names[node][i] for node in sorted(chosen_nodes) for i in sorted(indices))

    def _rail_nodes(self, m: int, width: int, free: list[int]) -> tuple[list[int], int] | None:
        """The first m nodes (best fit order: fewest free, then lowest node) whose common
        free indices number at least `width`, with that common mask; or None.

        Depth-first with pruning on the running intersection: the intersection only
        shrinks, so a branch whose common mask is already too small is dropped."""
        order = sorted(
            (n for n in range(self.nodes) if free[n].bit_count() >= width),
            key=lambda n: (free[n].bit_count(), n),
        )
        if m <= self.nodes_per_rack < self.nodes:
            # One rack first (Racks, module docstring), each rack's nodes in best-fit order.
            for rack in range(self.nodes // self.nodes_per_rack):
                inside = [n for n in order if n // self.nodes_per_rack == rack]
                found = _first_common(inside, m, width, free, self._full)
                if found is not None:
                    return found
        return _first_common(order, m, width, free, self._full)


def _first_common(
    order: list[int], m: int, width: int, free: list[int], full: int
) -> tuple[list[int], int] | None:
    """The first m nodes of `order` whose common free indices number at least `width`,
    with that common mask; or None."""

    def search(start: int, chosen: list[int], common: int) -> Iterator[tuple[list[int], int]]:
        if len(chosen) == m:
            yield chosen, common
            return
        for at in range(start, len(order) - (m - len(chosen)) + 1):
            node = order[at]
            both = common & free[node]
            if both.bit_count() >= width:
                yield from search(at + 1, [*chosen, node], both)

    return next(search(0, [], full), None)
