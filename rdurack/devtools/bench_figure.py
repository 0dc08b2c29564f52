"""One benchmark figure, as `make bench` prints it and writes it to build/bench.json.

A figure may carry its floor: the same quantity, measured in the same run on the same
machine, of the bare thing the figure's code path is built on (docs/benchmarks.md says
what each floor is). Absolute figures moved 2-3x between two machines of one size, and
40% between two runs on one machine; a figure over its floor moves far less, since both
see the same machine at the same moment. So where a figure has a floor its target is
held on the ratio `value / floor`, unless the figure is `absolute`: an issue's bound in
the figure's own unit (SubmitJob's 25 ms, an answer's 50 ms), held on the value while
the floor and the ratio are still carried beside it. A figure without a floor (floor
None) is not a time or a rate (a memory, an accuracy, a count) and holds an absolute
target, or none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Better = Literal["lower", "higher"]


@dataclass(frozen=True)
class BenchFigure:
    name: str
    value: float
    unit: str
    # The target: on `ratio` when the figure has a floor, else on `value` (in `unit`).
    target: float | None
    better: Better
    floor: float | None = None  # the floor's own value, in `unit`; None: no floor
    # The target is a bound on `value` (in `unit`) even though there is a floor.
    absolute: bool = False

    @property
    def ratio(self) -> float | None:
        """value / floor (None without a floor, or with a floor of 0, which no
        measured time or rate is)."""
        if self.floor is None or self.floor == 0:
            return None
        return self.value / self.floor

    @property
    def holds(self) -> Literal["ratio", "value"]:
        """What the target is held on: the ratio when there is a floor and the figure
        is not `absolute`, else the value."""
        return "ratio" if self.floor is not None and not self.absolute else "value"

    @property
    def held(self) -> float | None:
        return self.ratio if self.holds == "ratio" else self.value

    @property
    def met(self) -> bool | None:
        held = self.held
        if self.target is None or held is None:
            return None
        return held <= self.target if self.better == "lower" else held >= self.target

    def to_json(self) -> dict[str, Any]:
        """The figure as build/bench.json keeps it."""
        return {
            "name": self.name,
            "value": self.value,
            "unit": self.unit,
            "floor": self.floor,
            "ratio": self.ratio,
            "target": self.target,
            "holds": None if self.target is None else self.holds,
            "better": self.better,
        }
