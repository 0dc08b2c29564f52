"""A matplotlib figure saved as a PNG, through an Agg canvas of its own (no pyplot, no
global figure state, no display)."""

from __future__ import annotations

from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

DPI = 120


def save(fig: Figure, path: Path, text: dict[str, str] | None = None) -> Path:
    """Write `fig` to `path` (its folder made if need be) and return the path. `text`:
    the PNG's text chunks besides matplotlib's (what the figure was drawn from)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)  # attaches the Agg canvas; savefig renders through it
    fig.savefig(path, dpi=DPI, metadata=text)
    return path
