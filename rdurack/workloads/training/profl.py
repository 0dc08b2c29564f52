"""The default configuration of progressive training, ProFL's baseline, and ProFL's
comparison on it.

The configuration (docs/training.md): a 4-block MLP, 64 units wide (17,290
parameters), on scikit-learn's digits, DDP over 4 ranks, global batch 64, SGD with
momentum (lr 0.1). Full training runs 30 epochs (630 steps); progressive training at
most 5 epochs a stage (8 stages, at most 840 steps), blocks freezing earlier when the
movement metric says so. The HBM cap, 128,000 bytes per socket, is under full
training's planned peak and over progressive training's: the scale of the memory wall
is this model's, not a socket's 64 GB.

The baseline: under a memory cap that full training of the model cannot meet, the
alternative to progressive training is to shrink the model until full training fits:
fewer blocks at the same width (depth, as DepthFL does), or every block narrower at the
same depth (width, as HeteroFL does). ProFL compares itself against such models (arXiv
2404.13349, abstract: "accuracy up to 82.4%" better). `largest_shrunken` finds, in
both families, the candidates whose full training fits under the cap (by their memory
plan, strategy.plan_memory) and picks the one with the most parameters; ties go to the
deeper one.

`compare` runs the three trainings the acceptance compares, on threads (the same loop
and memory accounting as the rack's socket actors): full training without the cap,
progressive training under it, and the largest shrunken model that trains fully under
it.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

from rdurack.errors import InvalidRequest
from rdurack.rack.presets import platform as preset
from rdurack.rack.spec import PlatformSpec, Tier
from rdurack.workloads.training.data import data_shape
from rdurack.workloads.training.job import TrainingWorkload
from rdurack.workloads.training.loop import train_threaded
from rdurack.workloads.training.scaling import built_in_plan, hbm_limit

DEFAULT = TrainingWorkload(world_size=4, global_batch=64, blocks=4, hidden=64, epochs=30)
STAGE_EPOCHS = 5  # progressive: the step budget of each stage
HBM_CAP_BYTES = 128_000  # per socket


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


def progressive(full: TrainingWorkload = DEFAULT, cap: int = HBM_CAP_BYTES) -> TrainingWorkload:
    """The progressive counterpart of `full`, under the HBM cap `cap`."""
    return full.model_copy(
        update={"strategy": "progressive", "epochs": STAGE_EPOCHS, "hbm_cap_bytes": cap}
    )


@dataclass(frozen=True)
class Outcome:
    """One training of the comparison: rank 0's accuracy, the peaks per socket."""

    workload: TrainingWorkload
    test_accuracy: float
    peak_hbm_bytes: int
    peak_ddr_bytes: int
    steps: int


@dataclass(frozen=True)
class Comparison:
    full: Outcome
    progressive: Outcome
    shrunken: Outcome
    baseline: Shrunken  # how the shrunken model was chosen

    @property
    def hbm_reduction(self) -> float:
        """Progressive's peak HBM below full training's, a fraction."""
        return 1 - self.progressive.peak_hbm_bytes / self.full.peak_hbm_bytes

    @property
    def accuracy_gap(self) -> float:
        """Full training's accuracy minus progressive's (> 0: progressive is below)."""
        return self.full.test_accuracy - self.progressive.test_accuracy

    @property
    def margin_over_shrunken(self) -> float:
        """Progressive's accuracy minus the shrunken model's (> 0: progressive wins)."""
        return self.progressive.test_accuracy - self.shrunken.test_accuracy


def run(w: TrainingWorkload, platform: PlatformSpec) -> Outcome:
    """Train `w` on threads, each rank's memory on a socket of `platform`."""
    results = train_threaded(
        w.train_spec(resume=False), platform=platform, hbm_cap_bytes=w.hbm_cap_bytes
    )
    accuracy = results[0].test_accuracy
    assert accuracy is not None  # rank 0 evaluates
    return Outcome(
        w,
        accuracy,
        max(r.peak_bytes["hbm"] for r in results),
        max(r.peak_bytes["ddr"] for r in results),
        results[0].steps,
    )


def compare(
    full: TrainingWorkload = DEFAULT,
    cap: int = HBM_CAP_BYTES,
    platform: PlatformSpec | None = None,
    seed: int = 0,
) -> Comparison:
    """Full training (no cap), progressive training and the largest shrunken model
    (both under `cap`), with the same seed."""
    rack = platform or preset("sn40l-rack16")
    full = full.model_copy(update={"seed": seed, "strategy": "full", "hbm_cap_bytes": 0})
    grown = progressive(full, cap)
    baseline = largest_shrunken(full.model_copy(update={"hbm_cap_bytes": cap}), rack)
    return Comparison(run(full, rack), run(grown, rack), run(baseline.workload, rack), baseline)
