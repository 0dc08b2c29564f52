"""What jobs hold on a socket's tiers: named allocations, real arrays (functional mode,
each accounted in a tier), and the HBM a kernel's model holds (its weight share and KV
cache).

Everything a job holds is named under the job's prefix (`job-1/...`), as are the
allocations of its program and its training rank, so releasing the job frees all of it
at once.
"""

from __future__ import annotations

import numpy as np

from rdurack.errors import InvalidRequest, UnknownName
from rdurack.rack.memory import TieredMemory, TierUsage
from rdurack.rack.models import ModelSpec
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

    def hold_weights(self, job_id: str, model: ModelSpec, group_size: int, kv_tokens: int) -> None:
        """`model`'s weight share in a TP group of `group_size`, and its KV cache of
        `kv_tokens` tokens (0: none), in HBM for the job; held once, then kept."""
        weights = f"{job_id}/weights/{model.name}"
        if weights not in self.memory:
            self.memory.allocate(
                weights,
                Tier.HBM,
                -(-model.weight_bytes // group_size),
                what=f"{model.name} weights (1/{group_size})",
            )
        kv = f"{job_id}/kv/{model.name}/{kv_tokens}"
        if kv_tokens and kv not in self.memory:
            self.memory.allocate(
                kv,
                Tier.HBM,
                -(-kv_tokens * model.kv_bytes_per_token() // group_size),
                what=f"KV cache of {kv_tokens} tokens",
            )

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
