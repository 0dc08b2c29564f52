"""The units a plot's axes are labelled in: a time unit for an emulated extent, a byte
unit for a peak, so that axis numbers stay short."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TimeUnit:
    name: str
    ns: float  # nanoseconds per unit

    @classmethod
    def for_extent(cls, extent_ns: float) -> TimeUnit:
        """µs below 2 ms, ms below 2 s, else s: axis numbers stay short."""
        if extent_ns < 2e6:
            return cls("µs", 1e3)
        if extent_ns < 2e9:
            return cls("ms", 1e6)
        return cls("s", 1e9)


def duration_text(ns: float) -> str:
    """A short duration in the unit that reads best: '1.5 ms', not '0.0015 s'."""
    unit = TimeUnit.for_extent(ns * 2)
    return f"{ns / unit.ns:.3g} {unit.name}"


def bytes_unit(top: float) -> tuple[str, float]:
    """The unit (name, bytes per unit) for values up to `top` bytes: a training job's kB
    are not 0.0000 GB."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if top >= scale:
            return unit, scale
    return "B", 1.0
