"""`plot_timeline`: a Gantt chart of a job's sockets on the emulated timeline, one row
per socket, bars coloured by operation (plotdata/timeline.py says what is drawn)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.artist import Artist
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from rdurack.traces.plotdata.timeline import Bar, legend_label, timeline
from rdurack.traces.plots.canvas import save
from rdurack.traces.spans import Span


def plot_timeline(spans: Sequence[Span], job_id: str, path: Path) -> Path:
    """A Gantt chart of the job's hardware spans; raises TraceError if it has none."""
    t = timeline(spans, job_id)
    unit = t.unit
    fig = Figure(figsize=(12, max(3.2, 0.42 * len(t.sockets) + 2.0)), layout="constrained")
    ax = fig.add_subplot()
    for kind in t.kinds:
        bars: dict[tuple[int, bool], list[tuple[float, float]]] = {}
        ticks: list[Bar] = []
        for bar in t.bars[kind]:
            if bar.tick:
                ticks.append(bar)
            else:
                bars.setdefault((bar.row, bar.band), []).append((bar.start, bar.width))
        for (y, band), xs in bars.items():
            # A thin white edge parts back-to-back ops of one kind. The row's top is at
            # y - 0.38 (the y axis runs down); a band fills its lower half.
            top, height = (y + 0.02, 0.36) if band else (y - 0.38, 0.76)
            ax.broken_barh(
                xs, (top, height), facecolors=t.colors[kind], edgecolor="white", linewidth=0.4
            )
        if ticks:
            ax.plot(
                [b.start for b in ticks],
                [b.row + (0.2 if b.band else 0.0) for b in ticks],
                linestyle="none",
                marker="|",
                markersize=14,
                markeredgewidth=1.6,
                color=t.colors[kind],
                zorder=3,
            )
    ax.set_yticks(range(len(t.sockets)), t.sockets)
    ax.set_ylim(len(t.sockets) - 0.5, -0.5)  # the first socket on top
    # A margin on the left: a tick at 0 (a deploy) is not hidden by the axis.
    ax.set_xlim(-t.extent_ns / unit.ns * 0.005, t.extent_ns / unit.ns * 1.01)
    ax.set_xlabel(f"emulated time since the job's first operation ({unit.name})")
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    ax.set_title(t.title(), loc="left")
    handles: list[Artist] = [Patch(facecolor=t.colors[k], label=legend_label(k)) for k in t.kinds]
    if t.has_ticks:  # say what a tick means
        handles.append(
            Line2D(
                [],
                [],
                linestyle="none",
                marker="|",
                markersize=12,
                color="black",
                label=t.tick_label(),
            )
        )
    fig.legend(handles=handles, loc="outside right upper", title="operation", frameon=False)
    return save(fig, path)
