"""ProFL's baseline: the largest shrunken model that fits the memory, trained fully.

Under a memory cap that full training of the model cannot meet, the alternative to
progressive training is to shrink the model until full training fits: fewer blocks
at the same width (depth, as DepthFL does), or every block narrower at the same depth
(width, as HeteroFL does). ProFL compares itself against such models (arXiv
2404.13349, abstract: "accuracy up to 82.4%" better). `largest_shrunken` finds, in
both families, the candidates whose full training fits under the cap (by their memory
plan, memory_plan.py) and picks the one with the most parameters; ties go to the
deeper one.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

from rdurack.errors import InvalidRequest
from rdurack.rack.spec import PlatformSpec, Tier
from rdurack.workloads.training.data import data_shape
from rdurack.workloads.training.job import TrainingWorkload, built_in_plan, hbm_limit


@dataclass(frozen=True)
class Shrunken:
    """A shrunken model, trained fully: its workload, size and planned HBM peak."""

    workload: TrainingWorkload
    parameters: int
    peak_hbm_bytes: int
    family: str  # "depth" (fewer blocks) or "width" (narrower blocks)


def parameters(w: TrainingWorkload) -> int:
    """Parameters of `w`'s MLP: features -> hidden × blocks -> classes."""
    features, classes = data_shape(w.train_spec())
    sizes = [features, *[w.hidden] * w.blocks, classes]
    return sum(a * b + b for a, b in pairwise(sizes))  # weights and biases


def _fits(w: TrainingWorkload, platform: PlatformSpec, limit: int) -> int | None:
    """Its planned HBM peak if full training of `w` fits under `limit`, else None."""
    peak = built_in_plan(w, platform).peak(Tier.HBM)
    return peak if peak <= limit else None


def shrunken_candidates(full: TrainingWorkload, platform: PlatformSpec) -> list[Shrunken]:
    """The largest model of each family (depth, width) whose full training, with
    `full`'s budget, fits under `full`'s HBM cap, if any fits."""
    full = full.model_copy(update={"strategy": "full"})
    limit = hbm_limit(full, platform)
    out: list[Shrunken] = []
    for blocks in range(full.blocks - 1, 0, -1):  # fewer blocks, the same width
        shrunk = full.model_copy(update={"blocks": blocks})
        peak = _fits(shrunk, platform, limit)
        if peak is not None:
            out.append(Shrunken(shrunk, parameters(shrunk), peak, "depth"))
            break
    # Narrower, the same blocks: the peak grows with the width, so bisect the widest.
    lo, hi = 0, full.hidden - 1  # lo fits (0: none found yet), hi is the widest to try
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _fits(full.model_copy(update={"hidden": mid}), platform, limit) is not None:
            lo = mid
        else:
            hi = mid - 1
    if lo:
        shrunk = full.model_copy(update={"hidden": lo})
        peak = _fits(shrunk, platform, limit)
        assert peak is not None
        out.append(Shrunken(shrunk, parameters(shrunk), peak, "width"))
    return out


def largest_shrunken(full: TrainingWorkload, platform: PlatformSpec) -> Shrunken:
    """The largest model of `full`'s family that trains fully (with `full`'s budget)
    under `full`'s HBM cap; InvalidRequest when none does."""
    if full.model != "mlp":
        raise InvalidRequest(
            f"shrinking a model needs the mlp's blocks and width, not {full.model}"
        )
    found = shrunken_candidates(full, platform)
    if not found:
        raise InvalidRequest(
            f"no shrunken mlp (fewer than {full.blocks} blocks, or narrower than "
            f"{full.hidden}) trains fully within {hbm_limit(full, platform):,} bytes of HBM"
        )
    return max(found, key=lambda s: (s.parameters, s.workload.blocks))
