"""The default configuration of progressive training, and ProFL's comparison on it.

The configuration (docs/training.md): a 4-block MLP, 64 units wide (17,290
parameters), on scikit-learn's digits, DDP over 4 ranks, global batch 64, SGD with
momentum (lr 0.1). Full training runs 30 epochs (630 steps); progressive training at
most 5 epochs a stage (8 stages, at most 840 steps), blocks freezing earlier when the
movement metric says so. The HBM cap, 128,000 bytes per socket, is under full
training's planned peak and over progressive training's: the scale of the memory wall
is this model's, not a socket's 64 GB.

`compare` runs the three trainings the acceptance compares, on threads (the same loop
and memory accounting as the rack's socket actors): full training without the cap,
progressive training under it, and the largest shrunken model that trains fully under
it (shrunken.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from rdurack.rack.presets import platform as preset
from rdurack.rack.spec import PlatformSpec
from rdurack.workloads.training.job import TrainingWorkload
from rdurack.workloads.training.loop import train_threaded
from rdurack.workloads.training.shrunken import Shrunken, largest_shrunken

DEFAULT = TrainingWorkload(world_size=4, global_batch=64, blocks=4, hidden=64, epochs=30)
STAGE_EPOCHS = 5  # progressive: the step budget of each stage
HBM_CAP_BYTES = 128_000  # per socket


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
