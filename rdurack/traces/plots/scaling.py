"""`plot_scaling`: a DDP scaling study's step time and efficiency against the ranks
(plotdata/scaling.py makes the curve); `read_scaling`: what a PNG of it was drawn from."""

from __future__ import annotations

import json
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter
from PIL import Image

from rdurack.traces.plotdata.scaling import ScalingCurve, scaling_title
from rdurack.traces.plots.canvas import save

# The PNG text chunk holding the curve drawn (JSON), read back by the docs' test.
SCALING_KEY = "rdurack:scaling"


def _ranks_axis(ax: Axes, ranks: list[int]) -> None:
    """World sizes double from point to point: a log axis ticked at each."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(ranks, [str(n) for n in ranks])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("ranks (one per socket)")
    ax.grid(which="major", alpha=0.3)


def plot_scaling(c: ScalingCurve, path: Path) -> Path:
    """Left: step time (ms); right: scaling efficiency (%); both against the ranks, with
    where the ranks start to cross nodes and racks left to the table. The PNG carries
    the curve as JSON (SCALING_KEY)."""
    if not c.ranks:
        raise ValueError("no study to plot")
    fig = Figure(figsize=(12, 4.8), layout="constrained")
    step, eff = fig.subplots(1, 2)
    ranks = list(c.ranks)
    step.plot(ranks, [t * 1e3 for t in c.step_s], color="C0", marker="o")
    step.set_ylabel("step time (ms)")
    step.set_ylim(bottom=0)
    step.set_title("Step time at a fixed batch per rank", loc="left")
    eff.plot(ranks, [e * 100 for e in c.efficiency], color="C1", marker="o")
    eff.set_ylabel("scaling efficiency (%)")
    eff.set_ylim(0, 105)
    eff.set_title("Efficiency: one rank's step over this step", loc="left")
    for ax in (step, eff):
        _ranks_axis(ax, ranks)
    fig.suptitle(scaling_title(c), x=0.01, ha="left", fontsize=13)
    return save(fig, path, {SCALING_KEY: json.dumps(c.as_dict())})


def read_scaling(path: Path) -> ScalingCurve:
    """The curve a PNG of `plot_scaling` was drawn from (its SCALING_KEY text)."""
    with Image.open(path) as png:
        text = png.info.get(SCALING_KEY)
    if not isinstance(text, str):
        raise ValueError(f"{path}: not a scaling plot of rdurack's (no {SCALING_KEY} text)")
    return ScalingCurve.from_dict(json.loads(text))
