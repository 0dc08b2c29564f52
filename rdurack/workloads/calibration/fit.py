"""The joint calibration: every assumption of rack/calibration.py fitted at once, by one
objective, against the published figures the paper study marks as fitted; then each
of those figures predicted with the fit done without it (leave-one-out), and each
figure's sensitivity to each assumption across its range.

The objective is the sum of squared residuals over the fit set. A value figure's
residual is log(predicted / published), so 10% over and 10% under weigh alike and no
figure dominates by its units. A range figure's residual is how far, in the same log
measure, its predicted span leaves the published range (0 inside). Yes/no figures are
not fitted: they are checked.

Assumptions move in [0, 1] between their bounds (on a log scale where their range spans
orders of magnitude). The objective has kinks (a roofline is a max of two times; "the
best model" is a max over models), where a gradient method stops short; so scipy's
bounded least squares (trust region reflective) runs from several starts (the
calibrated values, the middle of every range, seeded random points), and Powell's
derivative-free method polishes the best of them. A leave-one-out fit is Powell's from
the full fit without that figure. The result is deterministic for a given seed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares, minimize

from rdurack.rack.calibration import ASSUMPTIONS, Assumption, checked
from rdurack.rack.kernels import FusionPlan
from rdurack.rack.timing import CollectiveCosts
from rdurack.workloads.paper.figure import Figure
from rdurack.workloads.paper.study import PaperStudy
from rdurack.workloads.paper.table_v import TABLE_V_DECODE_PLAN

Values = dict[str, float]
Progress = Callable[[str], None]
# Step of the finite-difference Jacobian, relative, in the [0, 1] coordinates: 1% of a
# range, wide enough to see across the objective's kinks (a narrow step reads the slope
# of one side of a kink and stalls the search at it).
DIFF_STEP = 1e-2


def to_unit(a: Assumption, value: float) -> float:
    if a.scale == "log":
        return math.log(value / a.low) / math.log(a.high / a.low)
    return (value - a.low) / (a.high - a.low)


def from_unit(a: Assumption, u: float) -> float:
    u = min(1.0, max(0.0, float(u)))
    if a.scale == "log":
        return float(a.low * (a.high / a.low) ** u)
    return float(a.low + u * (a.high - a.low))


def values_of(u: Sequence[float] | np.ndarray, *, whole: bool = True) -> Values:
    """The values at unit coordinates `u`; `whole=False` leaves integer assumptions
    fractional, as the fit needs them: a prompt length that moves in whole tokens makes
    the objective a staircase, whose flat steps stop the trust region at once."""
    named = {a.name: from_unit(a, x) for a, x in zip(ASSUMPTIONS, u, strict=True)}
    return checked(named, whole=whole)


def residual(f: Figure) -> float:
    """How far a fitted figure's prediction is from its published value or range, as a
    log ratio (0 inside a range)."""
    if isinstance(f.published, tuple):
        assert isinstance(f.predicted, tuple)
        (lo, hi), (plo, phi) = f.published, f.predicted
        return max(0.0, math.log(lo / plo)) + max(0.0, math.log(phi / hi))
    assert isinstance(f.published, float | int) and isinstance(f.predicted, float | int)
    return math.log(f.predicted / f.published)


# Powell stops when a sweep moves no coordinate by more than XTOL (in [0, 1] units) or
# lowers the cost by less than FTOL (relative); a search is bounded to MAX_EVALUATIONS
# for the full fit and LEFT_OUT_EVALUATIONS for each leave-one-out fit.
XTOL = 1e-4
FTOL = 1e-7
MAX_EVALUATIONS = 4000
LEFT_OUT_EVALUATIONS = 1000


class Objective:
    """The fitted figures and the objective at any values, with one collective-cost
    cache for all the studies a fit tries (rack/timing.py). `table_v_plan`: the SN40L's
    decode in Table V, for the what-if fit with another plan."""

    def __init__(self, table_v_plan: FusionPlan = TABLE_V_DECODE_PLAN) -> None:
        self._collectives = CollectiveCosts()
        self.table_v_plan = table_v_plan

    def study(self, values: Mapping[str, float]) -> PaperStudy:
        return PaperStudy(values, self._collectives, self.table_v_plan)

    def figures(self, values: Mapping[str, float]) -> list[Figure]:
        return [f for f in self.study(values).figures() if f.fitted]

    def residuals(self, u: Sequence[float] | np.ndarray, leave_out: str = "") -> list[float]:
        figures = self.figures(values_of(u, whole=False))
        return [residual(f) for f in figures if f.key != leave_out]

    def cost(self, values: Mapping[str, float], leave_out: str = "") -> float:
        """Half the sum of squared residuals (scipy's convention)."""
        return 0.5 * sum(r**2 for r in self.residuals(_units(values), leave_out))


def _units(values: Mapping[str, float]) -> list[float]:
    return [min(1.0, max(0.0, to_unit(a, values[a.name]))) for a in ASSUMPTIONS]


def fitted_figures(values: Mapping[str, float]) -> list[Figure]:
    return Objective().figures(values)


def cost(values: Mapping[str, float], leave_out: str = "") -> float:
    return Objective().cost(values, leave_out)


@dataclass(frozen=True)
class Fit:
    values: Values
    cost: float


def descend(objective: Objective, start: Mapping[str, float], leave_out: str = "") -> Fit:
    """Bounded least squares from `start` (integer assumptions left fractional)."""
    r = least_squares(
        objective.residuals,
        _units(start),
        bounds=(0.0, 1.0),
        diff_step=[DIFF_STEP] * len(ASSUMPTIONS),
        kwargs={"leave_out": leave_out},
    )
    return Fit(values_of(r.x, whole=False), float(r.cost))


def polish(
    objective: Objective,
    start: Mapping[str, float],
    leave_out: str = "",
    evaluations: int = MAX_EVALUATIONS,
) -> Fit:
    """Powell's search from `start`, within the bounds."""

    def half_sum_of_squares(u: np.ndarray) -> float:
        return 0.5 * float(sum(r**2 for r in objective.residuals(u, leave_out)))

    found = minimize(
        half_sum_of_squares,
        _units(start),
        method="Powell",
        bounds=[(0.0, 1.0)] * len(ASSUMPTIONS),
        options={"xtol": XTOL, "ftol": FTOL, "maxfev": evaluations},
    )
    values = values_of(found.x)  # integer assumptions rounded
    return Fit(values, objective.cost(values, leave_out))


def fit(
    objective: Objective,
    starts: Sequence[Values],
    progress: Progress | None = None,
) -> Fit:
    """Bounded least squares from each start, then Powell's polish of the best."""
    best: Fit | None = None
    for i, start in enumerate(starts):
        found = descend(objective, start)
        if best is None or found.cost < best.cost:
            best = found
        if progress is not None:
            progress(f"start {i + 1} of {len(starts)}: cost {found.cost:.4g}")
    assert best is not None, "at least one start"
    polished = polish(objective, best.values)
    if progress is not None:
        progress(f"polished: cost {polished.cost:.4g}")
    return polished


def starts(current: Mapping[str, float], random: int, seed: int = 0) -> list[Values]:
    """The current values, the middle of every range, and `random` seeded points."""
    rng = np.random.default_rng(seed)
    middle = values_of([0.5] * len(ASSUMPTIONS))
    points = [values_of(rng.uniform(0.0, 1.0, len(ASSUMPTIONS))) for _ in range(random)]
    return [checked(current), middle, *points]


Prediction = float | tuple[float, float]


def leave_one_out(
    objective: Objective, full: Fit, progress: Progress | None = None
) -> dict[str, Prediction]:
    """Each fitted figure predicted by a fit without it, searched from the full fit
    (least squares, then a shorter polish)."""
    out: dict[str, Prediction] = {}
    keys = [f.key for f in objective.figures(full.values)]
    for i, key in enumerate(keys):
        descended = descend(objective, full.values, key)
        without = polish(objective, descended.values, key, LEFT_OUT_EVALUATIONS)
        (figure,) = [f for f in objective.figures(without.values) if f.key == key]
        assert not isinstance(figure.predicted, bool)
        out[key] = figure.predicted
        if progress is not None:
            progress(f"left out {i + 1} of {len(keys)}: {key}")
    return out


Movement = tuple[Prediction, Prediction]  # the figure at the assumption's low, high end


def sensitivity(values: Mapping[str, float]) -> dict[str, dict[str, Movement]]:
    """For each assumption, each fitted figure at the two ends of the assumption's range
    (the others at `values`)."""
    objective = Objective()
    out: dict[str, dict[str, Movement]] = {}
    for a in ASSUMPTIONS:
        ends = [
            {f.key: f.predicted for f in objective.figures({**values, a.name: end})}
            for end in (a.low, a.high)
        ]
        out[a.name] = {key: (low, ends[1][key]) for key, low in ends[0].items()}
    return out
