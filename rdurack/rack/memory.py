"""The three-tier memory (SRAM / HBM / DDR) of one socket.

Memory is the point of the SN40L: every allocation names its tier, overflow is an error
that names socket, tier, bytes asked and bytes free, and a copy between tiers costs
`bytes / bandwidth` of the slower side. This module only does the bookkeeping of one
socket; node-level caps (eight sockets copying DDR->HBM at once) belong to the timing
model above it. All sizes are bytes, all times seconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from rdurack.errors import InvalidRequest, OutOfMemory, UnknownName
from rdurack.rack.spec import SocketSpec, Tier


@dataclass(frozen=True)
class Allocation:
    """A named block of `nbytes` bytes in one tier of one socket."""

    name: str
    tier: Tier
    nbytes: int


@dataclass(frozen=True)
class TierUsage:
    """Bytes used, high-water mark and capacity of one tier at one moment."""

    used_bytes: int
    peak_bytes: int
    capacity_bytes: int

    @property
    def free_bytes(self) -> int:
        return self.capacity_bytes - self.used_bytes


@dataclass(frozen=True)
class MemorySnapshot:
    """Usage of every tier of one socket; `tiers` is read-only."""

    socket_id: str
    tiers: Mapping[Tier, TierUsage]


class TieredMemory:
    """Allocations of one socket across its SRAM, HBM and DDR.

    Names are unique across the three tiers, so `free(name)` and `move(name, tier)` need
    no tier argument and a block is never in two tiers at once.
    """

    def __init__(self, socket_id: str, spec: SocketSpec) -> None:
        self.socket_id = socket_id
        self.spec = spec
        self._capacity = {t: spec.tier(t).capacity_bytes for t in Tier}
        self._used = dict.fromkeys(Tier, 0)
        self._peak = dict.fromkeys(Tier, 0)
        # Insertion-ordered, so `allocations()` lists blocks in the order they were made.
        self._allocations: dict[str, Allocation] = {}

    # ------------------------------------------------------------ allocate and free

    def allocate(self, name: str, tier: Tier, nbytes: int, *, what: str = "") -> Allocation:
        """Reserve `nbytes` in `tier` under `name`; `what` labels an overflow error."""
        if name in self._allocations:
            existing = self._allocations[name]
            raise InvalidRequest(
                f"{self.socket_id}: allocation {name!r} already exists "
                f"({existing.nbytes:,} bytes in {existing.tier.value.upper()}); free it first"
            )
        _check_nbytes(nbytes)
        self._check_room(tier, nbytes, what or name)
        allocation = Allocation(name=name, tier=tier, nbytes=nbytes)
        self._allocations[name] = allocation
        self._add(tier, nbytes)
        return allocation

    def free(self, name: str) -> Allocation:
        """Release `name` and return what it was."""
        allocation = self.get(name)
        del self._allocations[name]
        self._used[allocation.tier] -= allocation.nbytes
        return allocation

    def move(self, name: str, dst: Tier) -> float:
        """Move `name` to `dst` and return the copy time in seconds.

        Room in `dst` is checked before anything changes, so an OutOfMemory leaves the
        block where it was. Moving to the tier it is already in costs nothing.
        """
        allocation = self.get(name)
        if allocation.tier == dst:
            return 0.0
        self._check_room(dst, allocation.nbytes, name)
        copy_s = self.copy_time_s(allocation.nbytes, allocation.tier, dst)
        self._used[allocation.tier] -= allocation.nbytes
        moved = Allocation(name=name, tier=dst, nbytes=allocation.nbytes)
        self._allocations[name] = moved  # same key: keeps its place in the listing
        self._add(dst, allocation.nbytes)
        return copy_s

    # ------------------------------------------------------------ costs

    def copy_time_s(self, nbytes: int, src: Tier, dst: Tier) -> float:
        """Seconds to copy `nbytes` from `src` to `dst`: bytes / slower side's bytes/s.

        Between HBM and DDR (either way) the socket's DDR<->HBM copy path also bounds the
        rate when it is slower than both tiers. Same tier: nothing to copy, 0 s.
        """
        _check_nbytes(nbytes)
        if src == dst:
            return 0.0
        bandwidth = min(
            self.spec.tier(src).bandwidth_bytes_per_s,
            self.spec.tier(dst).bandwidth_bytes_per_s,
        )
        if {src, dst} == {Tier.HBM, Tier.DDR}:
            bandwidth = min(bandwidth, self.spec.ddr_to_hbm_bandwidth_bytes_per_s)
        return nbytes / bandwidth

    # ------------------------------------------------------------ queries

    def used_bytes(self, tier: Tier) -> int:
        return self._used[tier]

    def free_bytes(self, tier: Tier) -> int:
        return self._capacity[tier] - self._used[tier]

    def capacity_bytes(self, tier: Tier) -> int:
        return self._capacity[tier]

    def peak_bytes(self, tier: Tier) -> int:
        """Most bytes ever used at once in `tier` since creation or `reset_peak()`."""
        return self._peak[tier]

    def reset_peak(self) -> None:
        """Start a new high-water mark from what is in use now (e.g. at a job start)."""
        self._peak = dict(self._used)

    def allocations(self, tier: Tier | None = None) -> list[Allocation]:
        """Live allocations in creation order, of one tier or of all."""
        return [a for a in self._allocations.values() if tier is None or a.tier == tier]

    def get(self, name: str) -> Allocation:
        if name not in self._allocations:
            raise UnknownName("allocation", name, sorted(self._allocations))
        return self._allocations[name]

    def __contains__(self, name: object) -> bool:
        return name in self._allocations

    def snapshot(self) -> MemorySnapshot:
        tiers = {
            t: TierUsage(
                used_bytes=self._used[t],
                peak_bytes=self._peak[t],
                capacity_bytes=self._capacity[t],
            )
            for t in Tier
        }
        return MemorySnapshot(socket_id=self.socket_id, tiers=MappingProxyType(tiers))

    # ------------------------------------------------------------ internals

    def _check_room(self, tier: Tier, nbytes: int, what: str) -> None:
        free = self.free_bytes(tier)
        if nbytes > free:
            raise OutOfMemory(
                socket=self.socket_id,
                tier=tier.value,
                asked_bytes=nbytes,
                free_bytes=free,
                what=what,
            )

    def _add(self, tier: Tier, nbytes: int) -> None:
        self._used[tier] += nbytes
        self._peak[tier] = max(self._peak[tier], self._used[tier])


def _check_nbytes(nbytes: int) -> None:
    if nbytes < 0:
        raise InvalidRequest(f"a size in bytes cannot be negative, got {nbytes:,}")
