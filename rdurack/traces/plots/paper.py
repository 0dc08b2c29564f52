"""`plot_paper`: published against predicted for every figure of `rdu bench paper`
(plotdata/paper.py sorts them into rows and writes their texts)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import NullFormatter

from rdurack.traces.plotdata.paper import PaperPlot, paper_plot
from rdurack.traces.plots.canvas import save
from rdurack.workloads.paper.figure import Figure as PaperFigure

OK_COLOR, MISS_COLOR = "#2ca02c", "#d62728"


def _values(ax: Axes, plot: PaperPlot) -> None:
    """Value figures: predicted / published, with the ±15% band."""
    ax.axvspan(0.85, 1.15, color=OK_COLOR, alpha=0.12, label="±15%: reproduced")
    ax.axvline(1.0, color="black", linewidth=0.8)
    for y, row in enumerate(plot.values):
        color = OK_COLOR if row.ok else MISS_COLOR
        ax.plot(
            [row.ratio],
            [y],
            marker="o",
            markersize=8,
            color=color,
            markerfacecolor="white" if row.fitted else color,
        )
        ax.text(1.3, y, row.text, va="center", fontsize=9)
    ax.set_yticks(range(len(plot.values)), [row.label for row in plot.values], fontsize=9)
    ax.set_ylim(len(plot.values) - 0.5, -0.5)
    ax.set_xlim(0.6, 1.75)
    ax.set_xlabel("predicted / published  (text: published → predicted)")
    ax.set_title("Value figures: predicted relative to published", loc="left")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(
        handles=[
            Patch(facecolor=OK_COLOR, alpha=0.3, label="±15% band"),
            Line2D([], [], marker="o", linestyle="none", color=OK_COLOR, label="reproduced"),
            Line2D([], [], marker="o", linestyle="none", color=MISS_COLOR, label="missed"),
            Line2D(
                [],
                [],
                marker="o",
                linestyle="none",
                color="grey",
                markerfacecolor="white",
                label="fitted (a consistency check)",
            ),
        ],
        loc="upper left",
        bbox_to_anchor=(1.0, 1.0),
        fontsize=9,
        frameon=False,
    )


def _ranges(ax: Axes, plot: PaperPlot) -> None:
    """Range figures: the published range (grey) above the predicted one, log scale."""
    for y, row in enumerate(plot.ranges):
        color = OK_COLOR if row.ok else MISS_COLOR
        ax.plot(list(row.published), [y - 0.12] * 2, color="#999999", linewidth=9,
                solid_capstyle="butt")  # fmt: skip
        ax.plot(
            list(row.predicted),
            [y + 0.14] * 2,
            color=color,
            linewidth=4,
            solid_capstyle="butt",
            marker="|",
            markersize=10,
        )
        ax.text(row.text_x, y, row.text, va="center", fontsize=9)
    ax.set_yticks(range(len(plot.ranges)), [row.label for row in plot.ranges], fontsize=9)
    ax.set_ylim(len(plot.ranges) - 0.4, -0.6)
    ax.set_xscale("log")
    ax.set_xlim(*plot.range_limits)
    ticks = plot.range_ticks
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("value (log scale)")
    ax.set_title(
        "Range figures: published range (grey) and the predicted range (green inside, red not)",
        loc="left",
    )
    ax.grid(axis="x", which="both", alpha=0.3)


def plot_paper(figures: Sequence[PaperFigure], path: Path) -> Path:
    """Published against predicted: value figures as predicted/published with the ±15%
    band, range figures as the published range beside the predicted one, yes/no figures
    as a list. Green: reproduced; red: missed; hollow markers: fitted figures."""
    plot = paper_plot(figures)
    values, ranges, flags = len(plot.values), len(plot.ranges), len(plot.flags)
    fig = Figure(figsize=(13, 2.8 + 0.42 * (values + ranges) + 0.22 * flags), layout="constrained")
    grid = fig.add_gridspec(
        3, 1, height_ratios=[max(values, 1), max(ranges, 1) + 0.6, 0.35 * flags + 0.6]
    )
    _values(fig.add_subplot(grid[0]), plot)
    _ranges(fig.add_subplot(grid[1]), plot)
    ax = fig.add_subplot(grid[2])
    ax.axis("off")
    ax.text(0, 1, "Yes/no figures\n" + "\n".join(plot.flags), va="top", ha="left", fontsize=9,
            transform=ax.transAxes)  # fmt: skip
    fig.suptitle(plot.title(), x=0.01, ha="left", fontsize=13)
    return save(fig, path)
