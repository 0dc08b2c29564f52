"""EmulatedClock and seconds_to_ns: integer nanoseconds that only move forward."""

from __future__ import annotations

import math

import pytest

from rdurack.errors import InvalidRequest
from rdurack.rack.clock import EmulatedClock, seconds_to_ns


@pytest.mark.parametrize(
    ("seconds", "ns"),
    [
        (0.0, 0),
        (1e-9, 1),
        (2.5, 2_500_000_000),
        (0.18, 180_000_000),
        (3, 3_000_000_000),  # an int is a valid number of seconds
        # 7.7e-6 * 1e9 is 7700.000000000001 in floats; it must still be 7700 ns.
        (7.7e-6, 7_700),
        (8.3, 8_300_000_000),
    ],
)
def test_exact_durations_convert_exactly(seconds: float, ns: int) -> None:
    assert seconds_to_ns(seconds) == ns


@pytest.mark.parametrize(
    ("seconds", "ns"),
    [
        (1e-12, 1),  # a picosecond still takes a nanosecond
        (4e-10, 1),
        (1.5e-9, 2),
        (1e-300, 1),
        (1.0000000001, 1_000_000_001),
    ],
)
def test_sub_nanosecond_parts_round_up(seconds: float, ns: int) -> None:
    assert seconds_to_ns(seconds) == ns


@pytest.mark.parametrize("bad", [-1e-9, -1.0, math.inf, math.nan])
def test_negative_or_non_finite_durations_are_refused(bad: float) -> None:
    with pytest.raises(InvalidRequest):
        seconds_to_ns(bad)


def test_clock_starts_at_zero_or_the_given_time() -> None:
    assert EmulatedClock().now_ns == 0
    assert EmulatedClock(start_ns=42).now_ns == 42
    with pytest.raises(InvalidRequest):
        EmulatedClock(start_ns=-1)


def test_advance_adds_rounded_up_durations_and_returns_the_new_time() -> None:
    clock = EmulatedClock()
    assert clock.advance(1e-6) == 1_000
    assert clock.advance(2.5e-10) == 1_001  # sub-ns work still moves the clock
    assert clock.advance(0.0) == 1_001
    assert clock.now_ns == 1_001


def test_many_tiny_steps_each_cost_at_least_a_nanosecond() -> None:
    clock = EmulatedClock()
    for _ in range(1_000):
        clock.advance(1e-12)
    assert clock.now_ns == 1_000


def test_advance_refuses_negative_durations_and_keeps_time() -> None:
    clock = EmulatedClock(start_ns=500)
    with pytest.raises(InvalidRequest):
        clock.advance(-1e-6)
    assert clock.now_ns == 500


def test_advance_to_moves_forward_but_never_back() -> None:
    clock = EmulatedClock()
    assert clock.advance_to(5_000) == 5_000
    assert clock.advance_to(3_000) == 5_000  # an earlier arrival does not rewind
    assert clock.now_ns == 5_000
    assert clock.advance_to(5_000) == 5_000
    assert clock.advance_to(-10) == 5_000
    assert clock.advance_to(7_001) == 7_001


def test_time_is_monotonic_over_mixed_operations() -> None:
    clock = EmulatedClock()
    seen = [clock.now_ns]
    steps: list[tuple[str, float]] = [
        ("advance", 1e-6),
        ("to", 10),
        ("advance", 3e-10),
        ("to", 50_000),
        ("to", 20_000),
        ("advance", 0.0),
        ("advance", 0.25),
    ]
    for op, value in steps:
        now = clock.advance(value) if op == "advance" else clock.advance_to(int(value))
        assert now == clock.now_ns
        seen.append(now)
    assert seen == sorted(seen)
    assert clock.now_ns == 50_000 + 250_000_000
