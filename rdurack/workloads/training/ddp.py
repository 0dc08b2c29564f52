"""DistributedDataParallel: torch DDP's semantics over the loop's `Backend`, on a built-in
model's numpy views of its parameters and gradients (models.Trainable).

- At construction rank 0's parameters are broadcast to every rank (torch's
  `_sync_module_states`), so all replicas start identical.
- After each backward, gradients are averaged over ranks bucket by bucket: parameters
  in reverse definition order (the order backward produces their gradients), packed
  into flat buckets of about `bucket_cap_bytes`, the first one (the last layers) capped
  at `first_bucket_cap_bytes` so that communication starts early; each bucket is one
  all-reduce (AVG), in that order. torch launches a bucket's all-reduce the moment its
  gradients are ready, during backward; here backward finishes first and the buckets
  follow, which gives the same numbers, and scaling.py models the timing.
- The bucket layout is torch's steady state: `_compute_bucket_assignment_by_size` with
  limits [1 MiB, bucket_cap] over the gradient-ready order, as torch rebuilds its
  buckets after the first iteration (which itself runs with one bucket: a difference
  in that step's timing only).
- Replica consistency is checked at construction and, optionally, every
  `check_every` steps: every rank all-gathers float64 checksums of its parameters; if
  they disagree, the full parameters are gathered to find the max difference, and a
  diagnostic is recorded. This is how the article's "replicas that start from different
  parameters" shows up when `broadcast_parameters=False`.

The mean over ranks of per-rank mean gradients equals the mean gradient of the global
batch when the shards have equal sizes, so N ranks step exactly as one process on the
global batch would (up to float rounding).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from rdurack.errors import InvalidRequest
from rdurack.workloads.training.arrays import Array, Params
from rdurack.workloads.training.diagnostics import REPLICAS_DIFFER, Diagnostic
from rdurack.workloads.training.distributed import Distributed, ReduceOp

if TYPE_CHECKING:
    from rdurack.workloads.training.models import Model

MIB = 1024 * 1024
DEFAULT_BUCKET_CAP_BYTES = 25 * MIB  # torch: bucket_cap_mb=25
DEFAULT_FIRST_BUCKET_BYTES = 1 * MIB  # torch: dist._DEFAULT_FIRST_BUCKET_BYTES
BROADCAST_BUCKET_BYTES = 250 * MIB  # torch: _sync_module_states coalesces 250 MiB buffers


@dataclass(frozen=True, slots=True)
class Bucket:
    """One all-reduce's worth of gradients."""

    index: int  # position in all-reduce order (0 is reduced first)
    params: tuple[str, ...]  # parameter names, in the order their gradients become ready
    numel: int  # elements
    nbytes: int  # bytes on the wire per all-reduce


def assign_buckets(
    sizes: Sequence[tuple[str, int, int]],
    bucket_cap_bytes: int = DEFAULT_BUCKET_CAP_BYTES,
    first_bucket_cap_bytes: int = DEFAULT_FIRST_BUCKET_BYTES,
) -> list[Bucket]:
    """Buckets, in all-reduce order, for parameters given as (name, numel, itemsize) in
    definition order. torch's rule: walk the parameters in gradient-ready order (reverse
    definition order), add each to the open bucket, close the bucket once it holds at
    least its limit (so a bucket may overshoot by one tensor); the first bucket's limit
    is `first_bucket_cap_bytes`, every later one's `bucket_cap_bytes`. Pure: the timing
    model calls it with descriptor sizes, without arrays."""
    if bucket_cap_bytes < 1 or first_bucket_cap_bytes < 1:
        raise InvalidRequest(
            f"bucket caps must be >= 1 byte, got {bucket_cap_bytes} and {first_bucket_cap_bytes}"
        )
    buckets: list[Bucket] = []
    names: list[str] = []
    numel = nbytes = 0
    for name, n, itemsize in reversed(sizes):
        names.append(name)
        numel += n
        nbytes += n * itemsize
        limit = first_bucket_cap_bytes if not buckets else bucket_cap_bytes
        if nbytes >= limit:
            buckets.append(Bucket(len(buckets), tuple(names), numel, nbytes))
            names, numel, nbytes = [], 0, 0
    if names:
        buckets.append(Bucket(len(buckets), tuple(names), numel, nbytes))
    return buckets


def broadcast_parameters(dist: Distributed, params: Params) -> None:
    """Rank 0's parameters to every rank, in place, coalesced into flat buffers of at
    most BROADCAST_BUCKET_BYTES (torch's `_sync_module_states`). A collective."""
    groups: list[list[str]] = [[]]
    nbytes = 0
    for name, p in params.items():
        if groups[-1] and nbytes + p.nbytes > BROADCAST_BUCKET_BYTES:
            groups.append([])
            nbytes = 0
        groups[-1].append(name)
        nbytes += p.nbytes
    for group in groups:
        flat = np.concatenate([params[name].ravel() for name in group])
        dist.broadcast(flat, src=0)
        offset = 0
        for name in group:
            p = params[name]
            p[...] = flat[offset : offset + p.size].reshape(p.shape)
            offset += p.size


class DistributedDataParallel:
    """Wraps `module` on one rank; every rank constructs it with the same arguments."""

    def __init__(
        self,
        module: Model,
        dist: Distributed,
        bucket_cap_bytes: int = DEFAULT_BUCKET_CAP_BYTES,
        broadcast_parameters: bool = True,
        first_bucket_cap_bytes: int = DEFAULT_FIRST_BUCKET_BYTES,
        check_every: int = 0,
    ) -> None:
        """`broadcast_parameters=False` skips the initial broadcast from rank 0 (torch
        always does it): replicas that were initialised differently then never agree,
        which the construction check records. `check_every` > 0 re-checks replicas
        every that many steps (one all-gather of checksums each time)."""
        if check_every < 0:
            raise InvalidRequest(f"check_every must be >= 0, got {check_every}")
        dtypes = {p.dtype for p in module.params.values()}
        if len(dtypes) != 1:
            raise InvalidRequest(
                f"DDP here needs one parameter dtype, got {sorted(map(str, dtypes))}"
            )
        self.module = module
        self.dist = dist
        self.rank = dist.get_rank()  # raises NotInitialized before init_process_group
        self.world_size = dist.get_world_size()
        self.broadcast_parameters = broadcast_parameters
        self.check_every = check_every
        self.buckets: list[Bucket] = assign_buckets(
            [(n, p.size, p.itemsize) for n, p in module.params.items()],
            bucket_cap_bytes,
            first_bucket_cap_bytes,
        )
        self.diagnostics: list[Diagnostic] = []
        self.steps = 0  # synchronized backward passes (one per optimizer step)
        if broadcast_parameters:
            self._broadcast_parameters()
        self.check_replicas()

    # ------------------------------------------------------------ training

    @property
    def bucket_bytes(self) -> list[int]:
        """Bytes per bucket, in all-reduce order: what the overlap timing model needs."""
        return [b.nbytes for b in self.buckets]

    def forward(self, x: Array, y: Array) -> float:
        """The local loss of this rank's batch (torch's `loss_fn(ddp(x), y)`)."""
        return self.module.forward(x, y)

    __call__ = forward

    def backward(self) -> None:
        """Local backward, then every bucket's gradients averaged over ranks in place."""
        if self.check_every and self.steps and self.steps % self.check_every == 0:
            self.check_replicas()
        self.module.backward()
        grads = self.module.grads
        for bucket in self.buckets:
            flat = np.concatenate([grads[name].ravel() for name in bucket.params])
            self.dist.all_reduce(flat, ReduceOp.AVG)
            offset = 0
            for name in bucket.params:
                g = grads[name]
                g[...] = flat[offset : offset + g.size].reshape(g.shape)
                offset += g.size
        self.steps += 1

    # ------------------------------------------------------------ replica consistency

    def _broadcast_parameters(self) -> None:
        broadcast_parameters(self.dist, self.module.params)

    def _checksums(self) -> Array:
        """Per parameter: sum, sum of squares and a position-weighted sum, in float64
        (a permutation or a sign flip changes at least one of them)."""
        out = []
        for p in self.module.params.values():
            a = p.astype(np.float64).ravel()
            ramp = np.arange(1, a.size + 1, dtype=np.float64) / a.size
            out += [a.sum(), (a * a).sum(), (a * ramp).sum()]
        return np.asarray(out, dtype=np.float64)

    def check_replicas(self) -> float:
        """Compare every rank's parameters with rank 0's (a collective: all ranks call
        it together). The max |difference| over all parameters; records a diagnostic
        when it is not zero."""
        mine = self._checksums()
        gathered = [np.empty_like(mine) for _ in range(self.world_size)]
        self.dist.all_gather(gathered, mine)
        if all(np.array_equal(g, gathered[0]) for g in gathered):
            return 0.0
        # Checksums disagree on every rank alike, so all ranks take this path together.
        flat = np.concatenate([p.astype(np.float64).ravel() for p in self.module.params.values()])
        everyone = [np.empty_like(flat) for _ in range(self.world_size)]
        self.dist.all_gather(everyone, flat)
        diff = np.max(np.abs(np.stack(everyone) - everyone[0]), axis=0)
        worst = float(diff.max()) if diff.size else 0.0
        if worst == 0.0:
            return 0.0  # checksums differed by summation order only
        offsets = np.cumsum([0, *(p.size for p in self.module.params.values())])
        names = list(self.module.params)
        where = names[int(np.searchsorted(offsets, int(diff.argmax()), side="right")) - 1]
        ranks = [
            r for r in range(1, self.world_size) if not np.array_equal(everyone[r], everyone[0])
        ]
        if self.steps == 0 and not self.broadcast_parameters:
            cause = "replicas started from different parameters: broadcast from rank 0 is off"
        elif self.steps == 0:
            cause = "replicas hold different parameters after the broadcast from rank 0"
        else:
            cause = (
                f"replicas diverged by step {self.steps}: DDP keeps them identical only "
                "when they start identical and apply the same averaged gradients"
            )
        message = (
            f"{cause} (max |difference| {worst:.3g} in {where}; "
            f"ranks {', '.join(map(str, ranks))} differ from rank 0)"
        )
        self.diagnostics.append(
            Diagnostic(
                REPLICAS_DIFFER,
                message,
                self.steps,
                {"max_abs_diff": worst, "parameter": where, "ranks": ranks},
            )
        )
        return worst
