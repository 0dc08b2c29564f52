"""DDP's scaling: how much of the gradient all-reduce hides behind backward, and the
step time and throughput per world size that follow (`rdu predict ddp`).

The overlap, a pure timing model: backward produces the buckets' gradients one after
another; bucket i is ready when the compute of buckets 0..i is done. torch DDP launches
each bucket's all-reduce when it is ready, on one communication stream, so bucket i's
all-reduce starts at max(bucket i ready, bucket i-1's all-reduce done) and all-reduces
never overlap each other. The step's backward phase ends when the last all-reduce is
done; the part of that after backward's own end is the exposed (not hidden)
communication time. All times in seconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rdurack.errors import InvalidRequest
from rdurack.rack.collectives import Algorithm, Cost, all_reduce
from rdurack.rack.hierarchy import hierarchical_all_reduce
from rdurack.rack.models import ModelSpec
from rdurack.rack.spec import PlatformSpec
from rdurack.rack.topology import SocketId, Topology
from rdurack.workloads.training.job import TrainingWorkload, step_cost


@dataclass(frozen=True, slots=True)
class OverlapTiming:
    """The schedule of one step's backward and bucket all-reduces, seconds."""

    ready_s: tuple[float, ...]  # when each bucket's gradients are ready
    start_s: tuple[float, ...]  # when each bucket's all-reduce starts
    done_s: tuple[float, ...]  # when each bucket's all-reduce is done
    backward_end_s: float  # when backward's compute ends
    end_s: float  # when the step's gradients are all reduced (the optimizer may run)
    exposed_s: float  # communication time not hidden behind backward: end - backward end
    all_reduce_s: float  # total all-reduce time

    @property
    def hidden_s(self) -> float:
        """All-reduce time that ran while backward was still computing."""
        return self.all_reduce_s - self.exposed_s


def overlap(
    backward_s: Sequence[float], all_reduce_s: Sequence[float], start_s: float = 0.0
) -> OverlapTiming:
    """The schedule for backward compute per bucket `backward_s` (in the order buckets
    become ready) and all-reduce time per bucket `all_reduce_s`, from `start_s`."""
    if len(backward_s) != len(all_reduce_s):
        raise InvalidRequest(
            f"{len(backward_s)} backward times for {len(all_reduce_s)} all-reduce times: "
            "give one of each per bucket"
        )
    if any(t < 0 for t in backward_s) or any(t < 0 for t in all_reduce_s):
        raise InvalidRequest("backward and all-reduce times must be >= 0 seconds")
    ready: list[float] = []
    starts: list[float] = []
    dones: list[float] = []
    compute_t = comm_t = float(start_s)  # when the compute / communication stream is free
    for compute, comm in zip(backward_s, all_reduce_s, strict=True):
        compute_t += compute
        begin = max(compute_t, comm_t)
        comm_t = begin + comm
        ready.append(compute_t)
        starts.append(begin)
        dones.append(comm_t)
    end = max(compute_t, comm_t)
    return OverlapTiming(
        ready_s=tuple(ready),
        start_s=tuple(starts),
        done_s=tuple(dones),
        backward_end_s=compute_t,
        end_s=end,
        exposed_s=end - compute_t,
        all_reduce_s=float(sum(all_reduce_s)),
    )


def split_by_bytes(total_s: float, bucket_bytes: Sequence[int]) -> list[float]:
    """`total_s` of backward compute shared among buckets in proportion to their bytes
    (assumption: gradient compute time is proportional to parameter count, which holds
    for the matmul-dominated layers DDP buckets hold)."""
    if total_s < 0 or any(b < 0 for b in bucket_bytes):
        raise InvalidRequest("times and bucket sizes must be >= 0")
    total_bytes = sum(bucket_bytes)
    if total_bytes == 0:
        return [total_s / len(bucket_bytes)] * len(bucket_bytes) if bucket_bytes else []
    return [total_s * b / total_bytes for b in bucket_bytes]


@dataclass(frozen=True)
class ScalingPoint:
    world_size: int
    step_s: float
    compute_s: float
    all_reduce_s: float
    exposed_s: float
    samples_per_s: float
    crosses_nodes: bool
    nodes: int = 1  # hosts the ranks span, over all racks
    racks: int = 1
    # samples/s over world_size times one rank's: one rank's step over this step.
    efficiency: float = 1.0


def scaling_world_sizes(platform: PlatformSpec) -> tuple[int, ...]:
    """1, 2, 4, ... up to every socket of the platform, and every socket."""
    sizes = [1 << k for k in range(platform.sockets.bit_length()) if 1 << k <= platform.sockets]
    return tuple(sorted({*sizes, platform.sockets}))


def _bucket_all_reduce_s(
    topo: Topology, group: list[SocketId], bucket_bytes: tuple[int, ...], itemsize: int
) -> list[float]:
    """Seconds of each bucket's all-reduce over `group`: inside a rack the ring simulated
    on the links; across racks the hierarchical ring of rack/hierarchy.py (the rack's
    ring plus the spine's phase)."""
    if len(group) == 1:
        return [0.0] * len(bucket_bytes)
    rack: dict[float, Cost] = {}  # the rack's ring per bucket size: sizes repeat

    def in_rack(members: list[SocketId], nbytes: float) -> Cost:
        if nbytes not in rack:
            rack[nbytes] = all_reduce(topo, members, nbytes, Algorithm.RING, itemsize)
        return rack[nbytes]

    across = topo.racks_of(group) > 1
    return [
        (
            hierarchical_all_reduce(topo, group, b, itemsize, in_rack)
            if across
            else in_rack(group, b)
        ).total_s
        for b in bucket_bytes
    ]


def predict_scaling(
    w: TrainingWorkload,
    platform: PlatformSpec,
    models: dict[str, ModelSpec],
    world_sizes: tuple[int, ...] | None = None,
) -> list[ScalingPoint]:
    """DDP scaling at a fixed per-rank batch: step time and throughput per world size
    (default: `scaling_world_sizes`), on the first sockets rack by rack, node by node
    (16 crosses the inter-node links of an SN40L rack, 32 the spine)."""
    topo = Topology(platform)
    sockets = topo.sockets
    out = []
    for n in world_sizes if world_sizes is not None else scaling_world_sizes(platform):
        if n > platform.sockets:
            continue
        wn = w.model_copy(update={"world_size": n, "global_batch": w.local_batch * n})
        cost = step_cost(wn, platform, models)
        group = sockets[:n]
        itemsize = 4 if w.functional else models[w.model].bytes_per_param
        comm = _bucket_all_reduce_s(topo, group, cost.bucket_bytes, itemsize)
        racks = topo.racks_of(group)
        t: OverlapTiming = overlap(split_by_bytes(cost.backward_s, cost.bucket_bytes), comm)
        step = cost.forward_s + t.end_s
        out.append(
            ScalingPoint(
                n,
                step,
                cost.compute_s,
                t.all_reduce_s,
                t.exposed_s,
                wn.global_batch / step,
                topo.nodes_of(group) > 1,
                topo.nodes_of(group),
                racks,
                # One rank's step is its compute: nothing to all-reduce.
                (cost.forward_s + cost.backward_s) / step,
            )
        )
    return out
