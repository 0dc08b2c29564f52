"""What the built-in loop checks across its ranks: the article's mistakes it can see.

- `check_replicas`: every rank's parameters against rank 0's, by float64 checksums (one
  all-gather), the full parameters gathered only when they differ. With DDP's initial
  broadcast off (`broadcast_parameters: false`), replicas initialised differently never
  agree: diagnosed as replicas-differ.
- `duplicate_samples`: the ranks' sample indices of an epoch (one all-gather). More
  repeats than DistributedSampler's padding (< world size) mean that ranks process the
  same samples: a data loader without a DistributedSampler.
- `check_same_start`: every rank resumes at the same step, or the job stops.

Each is a collective on the loop's process group (group.py): every rank calls it.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from rdurack.errors import InvalidRequest
from rdurack.workloads.training.data import Array, Params
from rdurack.workloads.training.group import all_gather
from rdurack.workloads.training.rank import DUPLICATE_SAMPLES, REPLICAS_DIFFER, Diagnostic


def check_same_start(group: dist.ProcessGroup, step: int) -> None:
    """Every rank must resume at the same step: a checkpoint directory that only some
    ranks see (storage not shared across nodes) would desynchronise their collectives."""
    found = [int(s[0]) for s in all_gather(group, torch.tensor([step], dtype=torch.int64))]
    if len(set(found)) > 1:
        raise InvalidRequest(
            f"ranks resumed at different steps {found}: the checkpoint directory is not "
            "shared by every rank; put it on storage every node sees"
        )


def _checksums(params: Params) -> Array:
    """Per parameter: sum, sum of squares and a position-weighted sum, in float64
    (a permutation or a sign flip changes at least one of them)."""
    out = []
    for p in params.values():
        a = p.astype(np.float64).ravel()
        ramp = np.arange(1, a.size + 1, dtype=np.float64) / a.size
        out += [a.sum(), (a * a).sum(), (a * ramp).sum()]
    return np.asarray(out, dtype=np.float64)


def check_replicas(
    group: dist.ProcessGroup, params: Params, step: int, *, at_start: bool, broadcast: bool
) -> Diagnostic | None:
    """Compare every rank's `params` with rank 0's (a collective), at optimizer step
    `step`: at a DDP's start (`at_start`, after its broadcast from rank 0 if `broadcast`)
    or later. A replicas-differ diagnostic when they differ, with the largest
    difference."""
    gathered = all_gather(group, torch.from_numpy(_checksums(params)))
    if all(torch.equal(g, gathered[0]) for g in gathered):
        return None
    # Checksums disagree on every rank alike, so all ranks take this path together.
    flat = np.concatenate([p.astype(np.float64).ravel() for p in params.values()])
    everyone = torch.stack(all_gather(group, torch.from_numpy(flat))).numpy()
    diff = np.max(np.abs(everyone - everyone[0]), axis=0)
    worst = float(diff.max()) if diff.size else 0.0
    if worst == 0.0:
        return None  # checksums differed by summation order only
    offsets = np.cumsum([0, *(p.size for p in params.values())])
    where = list(params)[int(np.searchsorted(offsets, int(diff.argmax()), side="right")) - 1]
    ranks = [r for r in range(1, len(everyone)) if not np.array_equal(everyone[r], everyone[0])]
    if at_start and not broadcast:
        cause = "replicas started from different parameters: broadcast from rank 0 is off"
    elif at_start:
        cause = "replicas hold different parameters after the broadcast from rank 0"
    else:
        cause = (
            f"replicas diverged by step {step}: DDP keeps them identical only when they "
            "start identical and apply the same averaged gradients"
        )
    return Diagnostic(
        REPLICAS_DIFFER,
        f"{cause} (max |difference| {worst:.3g} in {where}; "
        f"ranks {', '.join(map(str, ranks))} differ from rank 0)",
        step,
        {"max_abs_diff": worst, "parameter": where, "ranks": ranks},
    )


def duplicate_samples(
    group: dist.ProcessGroup, order: Array, n: int, epoch: int, step: int
) -> Diagnostic | None:
    """All ranks compare this epoch's sample indices `order` (of `n` samples): a
    duplicate-samples diagnostic when ranks share samples."""
    world = group.size()
    everything = torch.cat(all_gather(group, torch.from_numpy(np.ascontiguousarray(order))))
    distinct = len(torch.unique(everything))
    repeats = len(everything) - distinct
    if repeats < world:
        return None
    return Diagnostic(
        DUPLICATE_SAMPLES,
        f"ranks processed duplicate samples: {repeats} of the {len(everything)} samples "
        f"of epoch {epoch} were also processed by another rank ({distinct} distinct of "
        f"{n}); the data loader has no DistributedSampler, so every rank walks the whole "
        "dataset",
        step,
        {"epoch": epoch, "repeats": repeats, "samples": len(everything), "distinct": distinct},
    )
