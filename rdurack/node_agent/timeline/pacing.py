"""Pacing: wall time that follows a socket's emulated clock, for software that must see
real latencies (`time_scale` wall seconds per emulated second; 0, the default: no
pacing, as fast as the machine allows).

Pacing counts from an anchor, (wall time, emulated time), set when a job reserves the
socket. A job's start moves the clock forward idle (the clocks of its sockets meet
there); that jump moves the anchor with it, so only work is paced, not the wait.
"""

from __future__ import annotations

import time

from rdurack.errors import InvalidRequest
from rdurack.rack.clock import EmulatedClock


class Pacer:
    """Pacing of `clock` at `time_scale` wall seconds per emulated second."""

    def __init__(self, clock: EmulatedClock, time_scale: float) -> None:
        if time_scale < 0:
            raise InvalidRequest(f"time_scale must be >= 0, got {time_scale}")
        self.clock = clock
        self.time_scale = time_scale
        self._anchor = (time.monotonic(), 0)  # (wall s, emulated ns) paced from

    def restart(self) -> None:
        """A job reserved the socket: pace from here."""
        self._anchor = (time.monotonic(), self.clock.now_ns)

    def meet(self, start_ns: int | None) -> None:
        """Move the clock to a job's start (the clocks of its sockets meet there). The
        jump is idle time, not work: pacing does not make it up in wall time."""
        if start_ns is None:
            return
        before = self.clock.now_ns
        self.clock.advance_to(start_ns)
        wall0, emu0 = self._anchor
        self._anchor = (wall0, emu0 + self.clock.now_ns - before)

    def pace(self) -> None:
        """With time_scale > 0, wait until wall time has caught up with emulated time."""
        if self.time_scale <= 0:
            return
        wall0, emu0 = self._anchor
        target = wall0 + (self.clock.now_ns - emu0) * 1e-9 * self.time_scale
        delay = target - time.monotonic()
        if delay > 0:
            time.sleep(delay)
