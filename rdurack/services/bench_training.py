"""Benchmark figures of progressive training (ProFL) on its default configuration.

One comparison (workloads/training/profl.py, seed 0), on threads: full training, then
progressive training and the largest shrunken model under the HBM cap that full
training cannot meet. The figures are what the acceptance asks: peak HBM at least 40%
below full training's, accuracy within 2 points of it, and above the shrunken model's.
"""

from __future__ import annotations

from rdurack.services.bench_figure import BenchFigure
from rdurack.workloads.training.profl import compare


def bench_progressive() -> list[BenchFigure]:
    c = compare(seed=0)
    shrunk = c.baseline.workload
    return [
        BenchFigure(
            "progressive vs full training: peak HBM per socket, less by",
            100 * c.hbm_reduction,
            "%",
            40.0,
            "higher",
        ),
        BenchFigure(
            "progressive vs full training: test accuracy below by",
            100 * c.accuracy_gap,
            "points",
            2.0,
            "lower",
        ),
        BenchFigure(
            f"progressive vs the largest shrunken model under the cap ({shrunk.blocks} "
            f"blocks x {shrunk.hidden}): accuracy above by",
            100 * c.margin_over_shrunken,
            "points",
            0.0,
            "higher",
        ),
    ]
