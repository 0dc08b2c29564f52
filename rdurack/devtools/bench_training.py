"""Benchmark figures of progressive training (ProFL) on its default configuration.

The comparison (workloads/training/profl.py) on seeds 0-4, on threads: full training,
then progressive training and the largest shrunken model under the HBM cap that full
training cannot meet. The acceptance asks: peak HBM at least 40% below full training's,
accuracy within 2 points of it, and above the shrunken model's. One seed cannot say:
digits' test set is 449 images, so one image is 0.22 points and one training's
accuracy has a standard error near 0.8 points. Each figure is printed as the mean over
the seeds and as the worst seed, both against the target.
"""

from __future__ import annotations

from collections.abc import Sequence
from statistics import fmean
from typing import Literal

from rdurack.devtools.bench_figure import BenchFigure
from rdurack.workloads.training.profl import Comparison, compare

SEEDS = range(5)


def _mean_and_worst(
    name: str, values: list[float], unit: str, target: float, better: Literal["lower", "higher"]
) -> list[BenchFigure]:
    worst = min(values) if better == "higher" else max(values)
    n = len(values)
    return [
        BenchFigure(f"{name} (mean of {n} seeds)", fmean(values), unit, target, better),
        BenchFigure(f"{name} (worst of {n} seeds)", worst, unit, target, better),
    ]


def progressive_figures(runs: Sequence[Comparison]) -> list[BenchFigure]:
    """The acceptance's three figures over `runs` (one comparison per seed)."""
    shrunk = sorted({f"{c.baseline.workload.blocks} x {c.baseline.workload.hidden}" for c in runs})
    return [
        *_mean_and_worst(
            "progressive vs full training: peak HBM per socket, less by",
            [100 * c.hbm_reduction for c in runs],
            "%",
            40.0,
            "higher",
        ),
        *_mean_and_worst(
            "progressive vs full training: test accuracy below by",
            [100 * c.accuracy_gap for c in runs],
            "points",
            2.0,
            "lower",
        ),
        *_mean_and_worst(
            f"progressive vs the largest shrunken model under the cap ({', '.join(shrunk)}): "
            "accuracy above by",
            [100 * c.margin_over_shrunken for c in runs],
            "points",
            0.0,
            "higher",
        ),
    ]


def bench_progressive() -> list[BenchFigure]:
    return progressive_figures([compare(seed=seed) for seed in SEEDS])
