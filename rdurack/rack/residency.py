"""Which model weights (e.g. the experts of a Composition of Experts) sit in HBM.

A socket reserves a fixed HBM region for weights; everything registered lives in DDR and
is loaded into that region on demand. When a load needs room, the least recently used
unpinned residents are evicted one by one, oldest first, only until enough BYTES are
free: experts differ in size, so counting slots would evict too much or too little.
Sizes are bytes, times seconds.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from rdurack.errors import InvalidRequest, OutOfMemory, UnknownName

# How an OutOfMemory from the reserved region names itself: it is a region of HBM, not a
# socket's whole tier, and this class does not know which socket holds it.
REGION = "reserved-region"


@dataclass(frozen=True)
class LoadResult:
    """What making one set of weights resident cost."""

    hit: bool
    loaded_bytes: int
    evicted: tuple[str, ...]  # names evicted to make room, oldest first
    load_s: float


class ResidencyManager:
    """LRU-by-bytes residency of registered weights in a fixed-capacity HBM region."""

    def __init__(self, capacity_bytes: int, load_bandwidth_bytes_per_s: float) -> None:
        if capacity_bytes < 0:
            raise InvalidRequest(f"region capacity cannot be negative, got {capacity_bytes:,}")
        if not load_bandwidth_bytes_per_s > 0:
            raise InvalidRequest(
                f"load bandwidth must be positive, got {load_bandwidth_bytes_per_s} bytes/s"
            )
        self._capacity = capacity_bytes
        self._bandwidth = load_bandwidth_bytes_per_s
        self._sizes: dict[str, int] = {}  # every registered name -> bytes
        # Residents, least recently used first: `move_to_end` on each use keeps it so.
        self._resident: OrderedDict[str, None] = OrderedDict()
        self._pinned: set[str] = set()
        self._used = 0
        self._hits = 0
        self._misses = 0
        self._bytes_loaded = 0
        self._loads: dict[str, int] = {}

    def register(self, name: str, nbytes: int) -> None:
        """Declare weights that live in DDR and may be loaded.

        Weights larger than the region may be registered (a catalog lists them all);
        only `ensure` of them fails.
        """
        if name in self._sizes:
            raise InvalidRequest(
                f"weights {name!r} are already registered ({self._sizes[name]:,} bytes)"
            )
        if nbytes < 0:
            raise InvalidRequest(f"weights {name!r}: size cannot be negative, got {nbytes:,}")
        self._sizes[name] = nbytes
        self._loads[name] = 0

    def ensure(self, name: str) -> LoadResult:
        """Make `name` resident and most recently used; load it from DDR on a miss.

        Raises OutOfMemory, changing nothing (counters included), when even evicting
        every unpinned resident would not free enough bytes.
        """
        nbytes = self._size(name)
        if name in self._resident:
            self._resident.move_to_end(name)
            self._hits += 1
            return LoadResult(hit=True, loaded_bytes=0, evicted=(), load_s=0.0)

        # Check before evicting anything, so a load that cannot succeed evicts nothing.
        reachable = self.free_bytes + sum(
            self._sizes[n] for n in self._resident if n not in self._pinned
        )
        if nbytes > reachable:
            raise OutOfMemory(
                socket=REGION, tier="hbm", asked_bytes=nbytes, free_bytes=reachable, what=name
            )

        evicted: list[str] = []
        for victim in list(self._resident):  # oldest first
            if self.free_bytes >= nbytes:
                break
            if victim in self._pinned:
                continue
            del self._resident[victim]
            self._used -= self._sizes[victim]
            evicted.append(victim)

        self._resident[name] = None
        self._used += nbytes
        self._misses += 1
        self._bytes_loaded += nbytes
        self._loads[name] += 1
        return LoadResult(
            hit=False,
            loaded_bytes=nbytes,
            evicted=tuple(evicted),
            load_s=nbytes / self._bandwidth,
        )

    def pin(self, name: str) -> LoadResult:
        """Keep `name` resident until `unpin`; loads it first if needed.

        Pinning is an access like `ensure` (it counts as a hit or a miss and makes `name`
        most recently used), so the caller learns what the pin cost. Pinning twice is
        the same as once.
        """
        result = self.ensure(name)
        self._pinned.add(name)
        return result

    def unpin(self, name: str) -> None:
        """Let `name` be evicted again; it stays resident until it is. No-op if unpinned."""
        self._size(name)  # unknown names are an error, not a silent no-op
        self._pinned.discard(name)

    # ------------------------------------------------------------ queries

    def resident(self) -> list[str]:
        """Resident names, least recently used first (the next to be evicted first)."""
        return list(self._resident)

    def is_resident(self, name: str) -> bool:
        self._size(name)
        return name in self._resident

    def is_pinned(self, name: str) -> bool:
        self._size(name)
        return name in self._pinned

    def loads(self, name: str) -> int:
        """How many times `name` was loaded from DDR (misses on it)."""
        self._size(name)
        return self._loads[name]

    @property
    def used_bytes(self) -> int:
        return self._used

    @property
    def free_bytes(self) -> int:
        return self._capacity - self._used

    @property
    def capacity_bytes(self) -> int:
        return self._capacity

    @property
    def hits(self) -> int:
        return self._hits

    @property
    def misses(self) -> int:
        return self._misses

    @property
    def bytes_loaded(self) -> int:
        """Bytes copied DDR -> region over all misses."""
        return self._bytes_loaded

    def _size(self, name: str) -> int:
        if name not in self._sizes:
            raise UnknownName("weights", name, sorted(self._sizes))
        return self._sizes[name]
