"""What the paper figure of `rdu bench paper --plot` shows: each published figure beside
the predicted one, sorted into value rows (predicted / published), range rows (the
published range beside the predicted one) and yes/no lines, with their labels, texts
and the range panel's axis."""

from __future__ import annotations

import re
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass

from rdurack.workloads.paper.figure import Figure

LABEL_WIDTH = 56  # characters per line of a row's label
# The range panel's ticks, where they fall inside its axis: plain numbers, not powers of
# ten, as the ratios are read as "3x", not "10^0.5".
RANGE_TICKS = (0.5, 1, 2, 3, 5, 10, 20, 50, 100)


def paper_label(f: Figure) -> str:
    """'what it is [where from]', wrapped: the figure's source up to its first ':' or
    '(' (the table of `rdu bench paper` has the whole of it)."""
    where = re.split(r"[:(]", f.source, maxsplit=1)[0].strip()
    return textwrap.fill(f"{f.what} [{where}]", LABEL_WIDTH)


@dataclass(frozen=True)
class ValueRow:
    """A value figure: the predicted value relative to the published one."""

    label: str
    ratio: float  # predicted / published
    ok: bool  # reproduced
    fitted: bool  # used to choose an assumption: a consistency check
    text: str  # 'published → predicted', with the unit


@dataclass(frozen=True)
class RangeRow:
    """A range figure: the published range and the predicted one."""

    label: str
    published: tuple[float, float]
    predicted: tuple[float, float]
    ok: bool  # the predicted range is inside the published one
    text: str  # 'lo–hi → lo–hi', with the unit

    @property
    def text_x(self) -> float:
        """Where the text starts: just right of both ranges (on a log axis)."""
        return max(self.published[1], self.predicted[1]) * 1.08


def _value_row(f: Figure) -> ValueRow:
    assert isinstance(f.published, int | float) and isinstance(f.predicted, int | float)
    unit = f" {f.unit}" if f.unit and f.unit != "x" else ("×" if f.unit == "x" else "")
    return ValueRow(
        paper_label(f),
        f.predicted / f.published,
        f.ok,
        f.fitted,
        f"{f.published:.3g}{unit} → {f.predicted:.3g}{unit}",
    )


def _range_row(f: Figure) -> RangeRow:
    assert isinstance(f.published, tuple) and isinstance(f.predicted, tuple)
    (lo, hi), (plo, phi) = f.published, f.predicted
    text = f"{lo:.3g}–{hi:.3g} → {plo:.3g}–{phi:.3g}{f.unit}"
    return RangeRow(paper_label(f), f.published, f.predicted, f.ok, text)


def _flag_line(f: Figure) -> str:
    return (
        f"{'✓' if f.ok else '✗'}  {f.what}: published {'yes' if f.published else 'no'}, "
        f"predicted {'yes' if f.predicted else 'no'}"
    )


@dataclass(frozen=True)
class PaperPlot:
    """The rows of the paper figure, in the study's order within each kind."""

    values: list[ValueRow]
    ranges: list[RangeRow]
    flags: list[str]  # one line per yes/no figure
    reproduced: int
    figures: int

    @property
    def range_limits(self) -> tuple[float, float]:
        """The range panel's x axis (log scale), with room for the text beside the bars."""
        bounds = [
            (min(r.published[0], r.predicted[0]), max(r.published[1], r.predicted[1]))
            for r in self.ranges
        ] or [(1.0, 1.0)]
        return min(lo for lo, _ in bounds) / 1.3, max(hi for _, hi in bounds) * 2.5

    @property
    def range_ticks(self) -> list[float]:
        lo_x, hi_x = self.range_limits
        return [t for t in RANGE_TICKS if lo_x <= t <= hi_x]

    def title(self) -> str:
        return (
            f"rdu bench paper: {self.reproduced} of {self.figures} published figures "
            "reproduced from one parameter set"
        )


def paper_plot(figures: Sequence[Figure]) -> PaperPlot:
    """The study's figures as the paper figure's rows."""
    return PaperPlot(
        [_value_row(f) for f in figures if not isinstance(f.published, bool | tuple)],
        [_range_row(f) for f in figures if isinstance(f.published, tuple)],
        [_flag_line(f) for f in figures if isinstance(f.published, bool)],
        sum(f.ok for f in figures),
        len(figures),
    )
