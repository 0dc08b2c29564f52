"""`plot_memory`: a job's memory per tier over emulated time, one panel per tier,
summed over its sockets (plotdata/memory.py says where the numbers come from)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.figure import Figure

from rdurack.traces.plotdata.memory import GB, memory_plot
from rdurack.traces.plots.canvas import save
from rdurack.traces.spans import Span

TIER_COLORS = {"hbm": "#1f77b4", "ddr": "#8c564b", "sram": "#2ca02c"}


def plot_memory(spans: Sequence[Span], job_id: str, path: Path) -> Path | None:
    """Memory per tier over emulated time; None (nothing written) when the spans hold
    no memory data."""
    plot = memory_plot(spans, job_id)
    if plot is None:
        return None
    panels = plot.panels
    fig = Figure(figsize=(12, 2.2 + 2.2 * len(panels)), layout="constrained")
    axes: list[Axes] = []
    for i in range(len(panels)):
        axes.append(fig.add_subplot(len(panels), 1, i + 1, sharex=axes[0] if axes else None))
    for ax, panel in zip(axes, panels, strict=True):
        color = TIER_COLORS[panel.tier]
        xs, ys = panel.times, panel.values
        ax.step(xs, ys, where="post", color=color, linewidth=2, label=panel.label)
        ax.fill_between(xs, ys, step="post", color=color, alpha=0.15)
        if panel.capacity_bytes is not None and panel.capacity_off_scale:
            # Keep the data readable: the capacity is only named when it is far off.
            ax.text(
                0.99,
                0.95,
                f"capacity {panel.capacity_bytes / GB:,.0f} GB (off the scale)",
                transform=ax.transAxes,
                ha="right",
                va="top",
                fontsize=9,
            )
        elif panel.capacity_bytes is not None:
            ax.axhline(
                panel.capacity_bytes / panel.scale,
                color="black",
                linestyle="--",
                linewidth=1,
                label=panel.capacity_label,
            )
        ax.set_ylim(0, panel.y_top)
        ax.set_ylabel(f"{panel.tier.upper()} ({panel.unit})")
        ax.set_xlim(0, plot.series.end_ns / plot.unit.ns * 1.01)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", frameon=False)
    axes[-1].set_xlabel(f"emulated time since the job's first operation ({plot.unit.name})")
    axes[0].set_title(plot.title(), loc="left")
    return save(fig, path)
