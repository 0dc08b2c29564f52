"""Where a model's weights and KV cache live on each socket of its group, by tier.

Per socket, under tensor parallelism over `sockets` (rack/layers.py says what splits):

- weights split `sockets` ways, but for the parts every socket holds whole: the MoE
  router, MLA's two down-projections and, where the group is wider than the KV heads,
  the copies of the K and V projections;
- the routed experts: E / sockets whole experts (expert-parallel) or a 1 / sockets slice
  of every expert (tensor-parallel): the same bytes either way;
- the KV cache, split by KV head (`ModelSpec.kv_shards`).

Everything but the routed experts must be in HBM. The routed experts fill the HBM that
is left; those that do not fit stay in DDR (the *cold* fraction), and a step that routes
a token to one copies it into HBM first (rack/timing.py prices the copy). Nothing fits:
refused with the numbers of the tier that is short.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from math import ceil

from rdurack.errors import OutOfMemory
from rdurack.rack.models import ModelSpec
from rdurack.rack.spec import PlatformSpec


@dataclass(frozen=True, slots=True)
class Placement:
    """Bytes per socket, by what they are and where they live."""

    sockets: int
    weights_hbm_bytes: int  # every weight held in HBM, routed experts included
    experts_ddr_bytes: int  # routed experts left in DDR
    kv_hbm_bytes: int
    cold_experts: float  # fraction of the routed experts' bytes in DDR

    @property
    def hbm_bytes(self) -> int:
        return self.weights_hbm_bytes + self.kv_hbm_bytes

    def to_dict(self) -> dict[str, float]:
        return {
            "sockets": self.sockets,
            "weights_hbm_bytes": self.weights_hbm_bytes,
            "experts_ddr_bytes": self.experts_ddr_bytes,
            "kv_hbm_bytes": self.kv_hbm_bytes,
            "hbm_bytes": self.hbm_bytes,
            "cold_experts": self.cold_experts,
        }


def routed_expert_bytes(model: ModelSpec) -> float:
    """All routed experts' weights, as stored (0 for a dense model)."""
    if model.moe is None:
        return 0.0
    params = model.moe_layers * model.moe.routed_experts * model.expert_params
    return params * model.matrix_bytes_per_param


def whole_on_every_socket(model: ModelSpec) -> float:
    """Bytes of the weights every socket holds whole (counted once in weight_bytes)."""
    w, b, d = model.matrix_bytes_per_param, model.bytes_per_param, model.hidden
    out: float = model.moe_layers * model.router_params * b
    if model.mla is not None:
        down = d * model.mla.q_lora_rank + d * model.mla.cached
        out += model.layers * down * w
    return out


def socket_weight_bytes(model: ModelSpec, sockets: int) -> tuple[float, float]:
    """(weights per socket besides the routed experts, routed experts per socket)."""
    routed = routed_expert_bytes(model)
    whole = whole_on_every_socket(model)
    split = (model.weight_bytes - routed - whole) / sockets + whole
    if model.mla is None and model.kv_shards(sockets) < sockets:
        # K and V projections past the KV heads: copies, not slices.
        kv_proj = model.layers * 2 * model.hidden * model.kv_dim * model.matrix_bytes_per_param
        split += kv_proj / model.kv_shards(sockets) - kv_proj / sockets
    return split, routed / sockets


def place(
    model: ModelSpec,
    platform: PlatformSpec,
    sockets: int,
    kv_tokens: int,
    extra: int = 0,
    strict: bool = True,
) -> Placement:
    """Place `model` on `sockets` sockets of `platform` with a KV cache of `kv_tokens`
    tokens (all sequences) and `extra` bytes of other HBM use per socket. Not `strict`:
    a placement over HBM is returned (every expert in DDR) for the caller to refuse with
    its own account of what it asked."""
    socket = platform.socket
    name = f"{platform.name} socket"
    what = f"{model.name} on {sockets}"
    dense, routed = socket_weight_bytes(model, sockets)
    kv = ceil(kv_tokens * model.kv_bytes_per_token() / model.kv_shards(sockets))
    fixed = ceil(dense) + kv + extra
    cap = socket.hbm.capacity_bytes
    room = cap - fixed
    experts = ceil(routed)
    if room < 0 and strict:
        aside = " (its routed experts aside, in DDR)" if experts else ""
        raise OutOfMemory(name, "hbm", fixed, cap, what=what + aside)
    in_hbm = max(0, min(experts, room))
    cold = experts - in_hbm
    if cold > socket.ddr.capacity_bytes:
        raise OutOfMemory(
            name, "ddr", cold, socket.ddr.capacity_bytes, what=f"{what}: experts beyond HBM"
        )
    return Placement(
        sockets=sockets,
        weights_hbm_bytes=ceil(dense) + in_hbm,
        experts_ddr_bytes=cold,
        kv_hbm_bytes=kv,
        cold_experts=cold / experts if experts else 0.0,
    )


@dataclass(frozen=True, slots=True)
class Capacity:
    """The most sequences of `context` tokens each a group serves at once."""

    context: int
    max_batch: int  # what fits at all (0: not even one)
    max_batch_experts_in_hbm: int  # with every routed expert still in HBM


def capacity(model: ModelSpec, platform: PlatformSpec, sockets: int, context: int) -> Capacity:
    """Search the batch at which the KV cache first pushes experts out of HBM, and at
    which it no longer fits beside what must be there."""

    def fits(batch: int, warm: bool) -> bool:
        try:
            p = place(model, platform, sockets, batch * context)
        except OutOfMemory:
            return False
        return p.cold_experts == 0 if warm else True

    return Capacity(context, _largest(lambda b: fits(b, False)), _largest(lambda b: fits(b, True)))


def _largest(ok: Callable[[int], bool]) -> int:
    """The largest n >= 0 with ok(n), for ok true up to some n and false after."""
    if not ok(1):
        return 0
    hi = 1
    while ok(hi * 2):
        hi *= 2
    lo, hi = hi, hi * 2  # ok(lo), not ok(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo
