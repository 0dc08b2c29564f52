"""The emulated clock of one socket, in integer nanoseconds.

Integer nanoseconds, not float seconds, so that clocks of different sockets compare
exactly where they meet (a transfer arrives at max(sender, link) + cost) and a long run
does not accumulate float rounding.
"""

from __future__ import annotations

import math
from decimal import Decimal

from rdurack.errors import InvalidRequest

NS_PER_S = 1_000_000_000


def seconds_to_ns(s: float) -> int:
    """A duration in seconds as whole nanoseconds, rounded up.

    Rounding up means any non-zero duration advances a clock by at least 1 ns, so work
    never takes zero time. The float is read as its shortest decimal (`repr`), so that
    7.7e-6 s is exactly 7700 ns: the float product 7.7e-6 * 1e9 is 7700.000000000001,
    and a plain ceil of it would add a nanosecond that nobody asked for.
    """
    if not math.isfinite(s) or s < 0:
        raise InvalidRequest(f"a duration must be a finite number of seconds >= 0, got {s}")
    return math.ceil(Decimal(repr(float(s))) * NS_PER_S)


class EmulatedClock:
    """Monotonic emulated time of one socket: it only moves forward."""

    def __init__(self, start_ns: int = 0) -> None:
        if start_ns < 0:
            raise InvalidRequest(f"a clock cannot start before 0 ns, got {start_ns}")
        self._now_ns = start_ns

    @property
    def now_ns(self) -> int:
        return self._now_ns

    def advance(self, duration_s: float) -> int:
        """Add `duration_s` seconds (rounded up to whole ns); return the new time in ns."""
        self._now_ns += seconds_to_ns(duration_s)
        return self._now_ns

    def advance_to(self, t_ns: int) -> int:
        """Move to `t_ns` if it is later; an earlier time leaves the clock where it is.

        This is how clocks meet at a communication point: the receiver waits for the
        arrival time but never goes back. Returns the new time in ns.
        """
        self._now_ns = max(self._now_ns, t_ns)
        return self._now_ns

    def __repr__(self) -> str:
        return f"EmulatedClock(now_ns={self._now_ns})"
