"""How much of DDP's gradient all-reduce hides behind backward: a pure timing model.

Backward produces the buckets' gradients one after another; bucket i is ready when
the compute of buckets 0..i is done. torch DDP launches each bucket's all-reduce when
it is ready, on one communication stream, so bucket i's all-reduce starts at
max(bucket i ready, bucket i-1's all-reduce done) and all-reduces never overlap each
other. The step's backward phase ends when the last all-reduce is done; the part of
that after backward's own end is the exposed (not hidden) communication time.
All times in seconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rdurack.errors import InvalidRequest


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
