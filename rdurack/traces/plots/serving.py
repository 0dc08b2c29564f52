"""`plot_rates`: a serving study's latencies against the request rate, one colour per
configuration (plotdata/serving.py makes the curves); `read_curves`: what a PNG of it
was drawn from."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator, NullFormatter
from PIL import Image

from rdurack.traces.plotdata.serving import RateCurve, latency_ticks, rates_title
from rdurack.traces.plots.canvas import save

# The PNG text chunk holding the curves drawn (JSON), read back by the docs' test.
CURVES_KEY = "rdurack:curves"


def _ms(seconds: Sequence[float]) -> list[float]:
    return [s * 1e3 for s in seconds]


def _rate_axis(ax: Axes, rates: list[float], values_ms: list[float]) -> None:
    """Rates double from point to point in a study: a log axis ticked at each rate."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(rates, [f"{r:g}" for r in rates])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("requests per second (Poisson arrivals)")
    # Latencies run from milliseconds to seconds within a doubling of the rate.
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(FixedLocator(latency_ticks(min(values_ms), max(values_ms))))
    ax.yaxis.set_major_formatter(lambda v, _: f"{v:g}")
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.grid(which="major", alpha=0.3)


def plot_rates(curves: Sequence[RateCurve], path: Path, title: str | None = None) -> Path:
    """Left: TTFT p99 (solid) and p50 (dashed); right: ITL p99; each against the rate,
    a colour per curve. The PNG carries the curves as JSON (CURVES_KEY)."""
    if not curves:
        raise ValueError("no study to plot")
    fig = Figure(figsize=(12, 5.2), layout="constrained")
    ttft, itl = fig.subplots(1, 2)
    for i, c in enumerate(curves):
        color = f"C{i}"
        ttft.plot(c.rates, _ms(c.ttft_p99_s), color=color, marker="o", label=c.label)
        ttft.plot(c.rates, _ms(c.ttft_p50_s), color=color, marker="o", linestyle="--",
                  markerfacecolor="white")  # fmt: skip
        itl.plot(c.rates, _ms(c.itl_p99_s), color=color, marker="o", label=c.label)
    rates = sorted({r for c in curves for r in c.rates})
    _rate_axis(ttft, rates, [v for c in curves for v in _ms(c.ttft_p50_s + c.ttft_p99_s)])
    _rate_axis(itl, rates, [v for c in curves for v in _ms(c.itl_p99_s)])
    ttft.set_ylabel("time to first token (ms)")
    ttft.set_title("Time to first token: p99 (solid), p50 (dashed)", loc="left")
    itl.set_ylabel("inter-token latency p99 (ms)")
    itl.set_title("Inter-token latency: p99", loc="left")
    styles = [
        Line2D([], [], color="grey", marker="o", label="p99"),
        Line2D([], [], color="grey", marker="o", linestyle="--", markerfacecolor="white",
               label="p50"),
    ]  # fmt: skip
    ttft.legend(handles=[*ttft.get_legend_handles_labels()[0], *styles], fontsize=9)
    fig.suptitle(title or rates_title(curves), x=0.01, ha="left", fontsize=13)
    text = {CURVES_KEY: json.dumps([c.as_dict() for c in curves])}
    return save(fig, path, text)


def read_curves(path: Path) -> list[RateCurve]:
    """The curves a PNG of `plot_rates` was drawn from (its CURVES_KEY text)."""
    with Image.open(path) as png:
        text = png.info.get(CURVES_KEY)
    if not isinstance(text, str):
        raise ValueError(f"{path}: not a plot of rdurack's (no {CURVES_KEY} text)")
    return [RateCurve.from_dict(c) for c in json.loads(text)]
