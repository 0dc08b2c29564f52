"""A training rank's memory on its socket's tiers: named allocations, peaks per stage.

The loop holds real arrays; `MemoryAccount` mirrors them as allocations of the socket's
`TieredMemory` (rack/memory.py), which checks capacity and tracks the peak of each tier.
Names, under the job's prefix (e.g. `job-000007/train/`):

- `weights` (full training: the whole model), or per progressive module `block.{i}`
  and `output.{i}`, in HBM or DDR as the stage places them (progressive.py);
- `gradients`, `optimizer` (its state, once the first step made it), `movement` (the
  freezing metric's sample), HBM: of what the stage trains only;
- `activations`, HBM: what the last forward kept for backward, from forward to the
  end of backward.

Peaks: the account restarts the socket's high-water marks at each stage
(`TieredMemory.reset_peak`) and reads them at its end, less what other holders used
(a socket runs one job at a time, so that is usually nothing). A job's peak per tier
is the largest of its stages'. Finer windows (a step) are the account's own: `mark`
starts one, `window_peaks` reads the most it held in each tier since.

`hbm_cap_bytes` > 0 caps the job's own HBM on the socket below its capacity: an
allocation or a move into HBM past it fails as the socket's would (OutOfMemory: tier,
asked, free under the cap).
"""

from __future__ import annotations

from collections.abc import Mapping

from rdurack.errors import OutOfMemory
from rdurack.rack.memory import TieredMemory
from rdurack.rack.spec import Tier

Holding = tuple[Tier, int]  # tier, bytes


class MemoryAccount:
    """One rank's allocations on `memory`, named `prefix + part`."""

    def __init__(self, memory: TieredMemory, prefix: str, hbm_cap_bytes: int = 0) -> None:
        self.memory = memory
        self.prefix = prefix
        self.hbm_cap_bytes = hbm_cap_bytes
        self._held: dict[str, Holding] = {}  # part -> (tier, bytes), live
        self._base: dict[Tier, int] = {}  # other holders' use when the stage began
        self.peaks: dict[str, int] = {t.value: 0 for t in Tier}  # the job's, per tier
        self._window: dict[Tier, int] = dict.fromkeys(Tier, 0)  # the most held since mark
        self.copy_s = 0.0  # seconds of copies between tiers, all stages

    # ------------------------------------------------------------ holdings

    def used(self, tier: Tier) -> int:
        """Bytes this account holds in `tier` now."""
        return sum(n for t, n in self._held.values() if t == tier)

    def held(self) -> dict[str, Holding]:
        return dict(self._held)

    def place(self, holdings: Mapping[str, Holding]) -> float:
        """Hold exactly `holdings` (part -> (tier, bytes)): parts not named are freed
        first, then parts that change tier move (the copies' seconds are returned),
        then new or resized parts are allocated. Frees come first, so a change of
        stage never peaks above the larger of the two stages."""
        for part in [p for p in self._held if p not in holdings]:
            self.release(part)
        for part, (_, nbytes) in holdings.items():
            if part in self._held and self._held[part][1] != nbytes:
                self.release(part)
        copy_s = 0.0
        # Moves out of HBM before moves in, so the HBM they free is there to take.
        moves = [p for p, (t, _) in holdings.items() if p in self._held and self._held[p][0] != t]
        for part in sorted(moves, key=lambda p: holdings[p][0] == Tier.HBM):
            copy_s += self._move(part, holdings[part][0])
        for part, (tier, nbytes) in holdings.items():
            if part not in self._held:
                self.hold(part, tier, nbytes)
        self.copy_s += copy_s
        return copy_s

    def hold(self, part: str, tier: Tier, nbytes: int) -> None:
        """Allocate `part` (replacing a holding of that name); 0 bytes: release it."""
        if self._held.get(part) == (tier, nbytes):
            return  # already held as asked (the optimizer's state, step after step)
        if part in self._held:
            self.release(part)
        if nbytes <= 0:
            return
        self._check_cap(part, tier, nbytes)
        self.memory.allocate(self.prefix + part, tier, nbytes, what=f"training {part}")
        self._held[part] = (tier, nbytes)
        self._window[tier] = max(self._window[tier], self.used(tier))

    def release(self, part: str) -> None:
        # The socket may have freed the job's allocations already (releasing the job).
        if self._held.pop(part, None) is not None and self.prefix + part in self.memory:
            self.memory.free(self.prefix + part)

    def close(self) -> None:
        for part in list(self._held):
            self.release(part)

    def _move(self, part: str, tier: Tier) -> float:
        _, nbytes = self._held[part]
        self._check_cap(part, tier, nbytes)
        seconds = self.memory.move(self.prefix + part, tier)
        self._held[part] = (tier, nbytes)
        self._window[tier] = max(self._window[tier], self.used(tier))
        return seconds

    def _check_cap(self, part: str, tier: Tier, nbytes: int) -> None:
        if tier != Tier.HBM or not self.hbm_cap_bytes:
            return
        free = self.hbm_cap_bytes - self.used(Tier.HBM)
        if nbytes > free:
            raise OutOfMemory(
                self.memory.socket_id,
                "hbm",
                nbytes,
                max(free, 0),
                what=f"training {part} under the job's HBM cap of {self.hbm_cap_bytes:,} bytes",
            )

    # ------------------------------------------------------------ peaks

    def mark(self) -> None:
        """Start a window: `window_peaks` counts from what the account holds now."""
        self._window = {t: self.used(t) for t in Tier}

    def window_peaks(self) -> dict[str, int]:
        """The most this account held in each tier since `mark` (tier name -> bytes)."""
        return {t.value: n for t, n in self._window.items()}

    def begin_stage(self) -> None:
        """Restart the socket's high-water marks: the stage's peaks start here."""
        self.memory.reset_peak()
        self._base = {t: self.memory.used_bytes(t) - self.used(t) for t in Tier}

    def end_stage(self) -> dict[str, int]:
        """The stage's peak per tier (tier name -> bytes), this account's share."""
        stage = {t.value: max(self.memory.peak_bytes(t) - self._base.get(t, 0), 0) for t in Tier}
        for tier, nbytes in stage.items():
            self.peaks[tier] = max(self.peaks[tier], nbytes)
        return stage
