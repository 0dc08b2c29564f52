"""One benchmark figure, as `make bench` prints it and writes it to build/bench.json."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class BenchFigure:
    name: str
    value: float
    unit: str
    target: float | None
    better: Literal["lower", "higher"]

    @property
    def met(self) -> bool | None:
        if self.target is None:
            return None
        return self.value <= self.target if self.better == "lower" else self.value >= self.target
