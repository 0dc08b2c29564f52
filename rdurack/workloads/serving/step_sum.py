"""Sums of a decode loop's step costs, exact and fast.

A decode step's cost is a function of the context it attends to: each figure the timing
model gives (seconds, bytes, FLOPs, ...) is a sum of maxima of terms linear in the
context (rooflines of operators whose KV-cache bytes and attention FLOPs grow with it),
so it is piecewise linear, with a few kinks where one term overtakes another; its time
is moreover convex (a sum of maxima of linear terms). Summing it over every step of a
2,048-token decode would price 2,048 steps; `linear_sum` prices a few dozen instead:

- on [lo, hi], if the costs at the midpoint and at the first quarter lie on the chord
  between the ends, the function is linear there (for a convex function, one interior
  point on the chord proves it), and the sum over the integers of [lo, hi] is
  (hi - lo + 1) x the mean of the ends;
- otherwise it splits [lo, hi] in two. Only the intervals around the kinks are split,
  down to single steps: O(kinks x log(steps)) evaluations.

`exact_sum` is the reference, one evaluation per step; tests/unit/test_serving.py
holds the two within 0.1% of each other (they agree to about 1e-9).
"""

from __future__ import annotations

from collections.abc import Callable

Vector = tuple[float, ...]
# Relative distance from the chord below which a point counts as on it: float rounding
# of the timing model's sums, far below any figure's meaning.
ON_CHORD = 1e-9


def exact_sum(f: Callable[[int], Vector], lo: int, hi: int) -> Vector:
    """f(lo) + f(lo + 1) + ... + f(hi), one evaluation per term (hi >= lo)."""
    total = f(lo)
    for i in range(lo + 1, hi + 1):
        total = _add(total, f(i))
    return total


def linear_sum(f: Callable[[int], Vector], lo: int, hi: int) -> Vector:
    """The same sum as `exact_sum`, for a piecewise-linear `f` (the module docstring)."""
    memo: dict[int, Vector] = {}

    def at(i: int) -> Vector:
        if i not in memo:
            memo[i] = f(i)
        return memo[i]

    def total(a: int, b: int) -> Vector:
        fa, fb = at(a), at(b)
        if b - a <= 1:
            return fa if a == b else _add(fa, fb)
        mid = (a + b) // 2
        quarter = (a + mid) // 2
        if all(_on_chord(fa, fb, at(x), (x - a) / (b - a)) for x in {mid, quarter} if a < x < b):
            return _scale(_add(fa, fb), (b - a + 1) / 2)
        return _sub(_add(total(a, mid), total(mid, b)), at(mid))

    return total(lo, hi)


def _on_chord(fa: Vector, fb: Vector, fx: Vector, t: float) -> bool:
    for a, b, x in zip(fa, fb, fx, strict=True):
        chord = a + (b - a) * t
        if abs(x - chord) > ON_CHORD * max(abs(a), abs(b), abs(x)):
            return False
    return True


def _add(u: Vector, v: Vector) -> Vector:
    return tuple(a + b for a, b in zip(u, v, strict=True))


def _sub(u: Vector, v: Vector) -> Vector:
    return tuple(a - b for a, b in zip(u, v, strict=True))


def _scale(u: Vector, k: float) -> Vector:
    return tuple(a * k for a in u)
