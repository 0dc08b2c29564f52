"""What jobs hold on a socket's tiers: named allocations, real arrays (functional mode,
each accounted in a tier), and what a kernel's model holds (its weight share and KV
cache in HBM, its cold experts in DDR).

Everything a job holds is named under the job's prefix (`job-1/...`), as are the
allocations of its program and its training rank, so releasing the job frees all of it
at once.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rdurack.errors import InvalidRequest, UnknownName
from rdurack.rack.memory import TieredMemory, TierUsage
from rdurack.rack.placement import Placement
from rdurack.rack.spec import Tier


class JobMemory:
    """The jobs' holdings on one socket's `memory`."""

    def __init__(self, memory: TieredMemory) -> None:
        self.memory = memory
        self.tensors: dict[str, np.ndarray] = {}  # job/name -> the socket's own copy

    def allocate(self, job_id: str, name: str, tier: str, nbytes: int) -> TierUsage:
        """Hold `nbytes` in `tier` (by name: sram, hbm, ddr); the tier's usage after."""
        t = tier_named(tier)
        self.memory.allocate(f"{job_id}/{name}", t, nbytes, what=name)
        return self.memory.snapshot().tiers[t]

    def free(self, job_id: str, name: str) -> None:
        self.memory.free(f"{job_id}/{name}")
        self.tensors.pop(f"{job_id}/{name}", None)

    def store(self, job_id: str, name: str, array: np.ndarray, tier: Tier = Tier.HBM) -> None:
        """Hold `array` itself (not a copy) as `name`, accounted in `tier`; an array of
        that name before is freed."""
        key = f"{job_id}/{name}"
        if key in self.memory:
            self.memory.free(key)
        self.memory.allocate(key, tier, int(array.nbytes), what=name)
        self.tensors[key] = array

    def tensor(self, job_id: str, name: str) -> np.ndarray:
        key = f"{job_id}/{name}"
        if key not in self.tensors:
            names = sorted(k.split("/", 1)[1] for k in self.tensors if k.startswith(f"{job_id}/"))
            raise UnknownName("tensor", name, names)
        return self.tensors[key]

    def hold_model(self, job_id: str, model: str, placement: Placement, kv_tokens: int) -> None:
        """A model's `placement` on this socket (rack/placement.py) held for the job: its
        weights in HBM, the routed experts that do not fit there in DDR, and its KV cache
        of `kv_tokens` tokens (0: none) in HBM; held once, then kept."""
        n = placement.sockets
        held = [
            (f"weights/{model}", Tier.HBM, placement.weights_hbm_bytes, f"{model} weights (1/{n})"),
            (f"experts/{model}", Tier.DDR, placement.experts_ddr_bytes, f"{model} cold experts"),
            (f"kv/{model}/{kv_tokens}", Tier.HBM, placement.kv_hbm_bytes,
             f"KV cache of {kv_tokens} tokens"),
        ]  # fmt: skip
        self.hold(job_id, held)

    def hold(self, job_id: str, held: Sequence[tuple[str, Tier, int, str]]) -> None:
        """Each (name, tier, bytes, what) held for the job: once, then kept."""
        for name, tier, nbytes, what in held:
            key = f"{job_id}/{name}"
            if nbytes and key not in self.memory:
                self.memory.allocate(key, tier, nbytes, what=what)

    def hold_kv(self, job_id: str, model: str, kv_tokens: int, nbytes: int) -> None:
        """A serving engine's KV cache, which grows and shrinks with its requests: the
        previous hold of `model`'s cache for the job is replaced by `nbytes` in HBM."""
        prefix = f"{job_id}/kv/{model}/"
        for alloc in self.memory.allocations():
            if alloc.name.startswith(prefix):
                self.memory.free(alloc.name)
        if nbytes:
            what = f"KV cache of {kv_tokens} tokens"
            self.memory.allocate(f"{prefix}{kv_tokens}", Tier.HBM, nbytes, what=what)

    def release(self, job_id: str) -> None:
        """Free everything `job_id` holds."""
        prefix = f"{job_id}/"
        for alloc in self.memory.allocations():
            if alloc.name.startswith(prefix):
                self.memory.free(alloc.name)
        self.tensors = {k: v for k, v in self.tensors.items() if not k.startswith(prefix)}


def tier_named(name: str) -> Tier:
    """The tier called `name` (any case)."""
    try:
        return Tier(name.lower())
    except ValueError:
        raise InvalidRequest(f"unknown tier {name!r}; accepted: sram, hbm, ddr") from None
