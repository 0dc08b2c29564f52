"""The pictures of a training job: `plot_loss`, its loss per optimizer step, and
`plot_stages`, each stage's peak memory (HBM, DDR) and test accuracy
(plotdata/training.py derives the points)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.figure import Figure

from rdurack.traces.plotdata.training import StagePoint, loss_log_scale, loss_title
from rdurack.traces.plotdata.units import bytes_unit
from rdurack.traces.plots.canvas import save

MARKERS_UP_TO = 80  # points of a loss curve drawn with markers; more: a bare line
HBM_COLOR, DDR_COLOR, ACCURACY_COLOR, CAP_COLOR = "#1f77b4", "#8c564b", "#2ca02c", "#d62728"


def plot_loss(
    points: Sequence[tuple[int, float]], job_id: str, path: Path, what: str = "loss"
) -> Path | None:
    """The loss per optimizer step; None (nothing written) without points. `what`: the
    y axis's label (whose loss it is)."""
    if not points:
        return None
    fig = Figure(figsize=(8, 4.5), layout="constrained")
    ax = fig.add_subplot()
    ax.plot(
        [s for s, _ in points],
        [x for _, x in points],
        marker="o" if len(points) <= MARKERS_UP_TO else None,
        markersize=3,
        color="#1f77b4",
        linewidth=1.5,
    )
    if loss_log_scale(points):
        ax.set_yscale("log")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(what)
    ax.grid(alpha=0.3)
    ax.set_title(loss_title(points, job_id), loc="left")
    return save(fig, path)


def plot_stages(
    points: Sequence[StagePoint], job_id: str, path: Path, hbm_cap_bytes: int = 0
) -> Path | None:
    """Peak HBM and DDR per stage (bars, labelled), and each stage's test accuracy
    below (labelled points); a stage the movement metric ended is marked. None
    (nothing written) without stages."""
    if not points:
        return None
    xs = list(range(len(points)))
    top = max(max(p.peak_hbm_bytes, p.peak_ddr_bytes) for p in points)
    unit, scale = bytes_unit(max(top, hbm_cap_bytes))
    fig = Figure(figsize=(max(9.0, 1.15 * len(points) + 3), 7.6), layout="constrained")
    grid = fig.add_gridspec(2, 1, height_ratios=[3, 2])
    ax = fig.add_subplot(grid[0])
    width = 0.38
    hbm = [p.peak_hbm_bytes / scale for p in points]
    ddr = [p.peak_ddr_bytes / scale for p in points]
    ax.bar([x - width / 2 for x in xs], hbm, width, color=HBM_COLOR)
    ax.bar([x + width / 2 for x in xs], ddr, width, color=DDR_COLOR, alpha=0.75)
    for x, h, d in zip(xs, hbm, ddr, strict=True):
        ax.text(x - width / 2, h, f"{h:.3g}", ha="center", va="bottom", fontsize=8, color=HBM_COLOR)
        if d:
            ax.text(x + width / 2, d, f"{d:.3g}", ha="center", va="bottom", fontsize=8,
                    color=DDR_COLOR)  # fmt: skip
    # Direct labels instead of a legend: the tallest bar of each tier is named in place.
    for values, dx, tier in ((hbm, -width / 2, "HBM"), (ddr, width / 2, "DDR")):
        tallest = max(xs, key=lambda i: values[i])
        if values[tallest]:
            ax.text(tallest + dx, values[tallest] * 0.5, tier, rotation=90, ha="center",
                    va="center", color="white", fontsize=9, fontweight="bold")  # fmt: skip
    ceiling = max(hbm + ddr + [hbm_cap_bytes / scale])
    if hbm_cap_bytes:
        cap = hbm_cap_bytes / scale
        ax.axhline(cap, color=CAP_COLOR, linestyle="--", linewidth=1.2)
        ax.text(-0.55, cap * 1.02, f"HBM cap per socket: {cap:.3g} {unit}", ha="left",
                va="bottom", color=CAP_COLOR, fontsize=9)  # fmt: skip
    ax.set_ylim(0, ceiling * 1.25)
    ax.set_xlim(-0.6, len(points) - 0.4)
    ax.tick_params(axis="x", labelbottom=False)  # the stages are named below
    ax.set_ylabel(f"peak per socket ({unit})")
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    ax.set_title(
        f"Job {job_id}: peak memory of each stage on a socket (the largest over its "
        "sockets)\nblue: HBM, brown: DDR (blocks not yet grown, output modules waiting)",
        loc="left",
    )
    acc_ax = fig.add_subplot(grid[1], sharex=ax)
    measured = [(x, p.accuracy) for x, p in zip(xs, points, strict=True) if p.accuracy is not None]
    if measured:
        acc_ax.plot([x for x, _ in measured], [100 * a for _, a in measured],
                    color=ACCURACY_COLOR, marker="o", linewidth=1.5)  # fmt: skip
        for x, a in measured:
            acc_ax.text(x, 100 * a + 2, f"{100 * a:.1f}%", ha="center", va="bottom", fontsize=8,
                        color=ACCURACY_COLOR)  # fmt: skip
    acc_ax.set_xticks(xs, [p.label for p in points], fontsize=8)
    acc_ax.set_ylim(0, 112)
    acc_ax.set_ylabel("test accuracy (%)")
    acc_ax.grid(axis="y", alpha=0.3)
    acc_ax.set_title(
        "Test accuracy of each stage's model\n✓: the movement metric ended the stage "
        "(else its step budget did)",
        loc="left",
        fontsize=10,
    )
    return save(fig, path)
