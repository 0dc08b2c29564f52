"""A published figure beside the one the model predicts, and the table docs/figures.md
embeds.

A value figure passes within `TOLERANCE` in sample and within `LEFT_OUT_TOLERANCE` left
out of the fit (its prediction by a fit done without it); a range figure passes when
every predicted point lies inside the published range; a yes/no figure when they agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

TOLERANCE = 0.10  # in sample
LEFT_OUT_TOLERANCE = 0.20  # predicted by a fit that never saw the figure

Value = float | tuple[float, float] | bool


@dataclass(frozen=True)
class Figure:
    key: str
    what: str
    source: str
    unit: str
    published: Value
    predicted: Value
    fitted: bool = False  # in the set the joint calibration fits against
    left_out: float | tuple[float, float] | None = None  # its prediction, fitted without it

    @property
    def error(self) -> float | None:
        """Relative error of a value figure; None for ranges and yes/no figures."""
        return _error(self.published, self.predicted)

    @property
    def ok(self) -> bool:
        return _ok(self.published, self.predicted, TOLERANCE)

    @property
    def left_out_error(self) -> float | None:
        return None if self.left_out is None else _error(self.published, self.left_out)

    @property
    def left_out_ok(self) -> bool | None:
        if self.left_out is None:
            return None
        return _ok(self.published, self.left_out, LEFT_OUT_TOLERANCE)

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "what": self.what,
            "source": self.source,
            "unit": self.unit,
            "published": _json(self.published),
            "predicted": _json(self.predicted),
            "error": self.error,
            "ok": self.ok,
            "fitted": self.fitted,
            "left_out": _json(self.left_out),
            "left_out_error": self.left_out_error,
            "left_out_ok": self.left_out_ok,
        }


def _error(published: Value, predicted: Value) -> float | None:
    if isinstance(published, bool | tuple):
        return None
    assert isinstance(predicted, float | int)
    return (predicted - published) / published


def _ok(published: Value, predicted: Value, tolerance: float) -> bool:
    if isinstance(published, bool):
        return predicted == published
    if isinstance(published, tuple):
        lo, hi = published
        assert isinstance(predicted, tuple)
        return lo <= predicted[0] and predicted[1] <= hi
    err = _error(published, predicted)
    return err is not None and abs(err) <= tolerance


def _json(value: Value | None) -> Any:
    return list(value) if isinstance(value, tuple) else value


def cell(value: Value | None) -> str:
    """A figure's value as the tables show it."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, tuple):
        return f"{value[0]:.3g} – {value[1]:.3g}"
    return f"{value:.3g}"


def percent(error: float | None) -> str:
    return "" if error is None else f"{error:+.1%}"


def to_markdown(figures: list[Figure]) -> str:
    """The figures as a Markdown table (docs/figures.md embeds this output verbatim)."""
    rows = [
        "| figure | source | published | predicted | error | left out | error left out | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for f in figures:
        unit = f" ({f.unit})" if f.unit else ""
        verdict = "ok" if f.ok else "**miss**"
        if f.left_out_ok is not None:
            verdict += ", left out ok" if f.left_out_ok else ", **left out: miss**"
        rows.append(
            f"| {f.what}{unit} | {f.source} | {cell(f.published)} | {cell(f.predicted)} "
            f"| {percent(f.error)} | {cell(f.left_out)} | {percent(f.left_out_error)} "
            f"| {verdict} |"
        )
    return "\n".join(rows) + "\n"
