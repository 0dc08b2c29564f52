"""A Composition-of-Experts bundle served as a stream: a router and its experts on one
TP group, as Samba-CoE serves them (PAPER Sec. VI-C), under the stream's batching.

What the sockets hold is what a CoE job deploys (workloads/coe/bundle.py `BundleShare`,
the same code): every expert in DDR, the router in HBM, a reserved region of HBM that
holds the experts last used (LRU by bytes), and the KV cache. The KV cache reserved is
a full batch at `CONTEXT_TOKENS` each; the region is everything left beside it.

A request names an expert (it is one of the bundle's models) or the bundle (the router
picks the expert from its prompt, and its prompt's prefill on the router is priced in
the iteration that admits it). Requests of different experts never share an iteration:
different weights. Which run together is the scheduler's (serving/stream/scheduler.py:
a batch is one expert's); an iteration whose expert is not in the region first copies
it in from DDR at the switch rate (`workloads/predictor.py` `switch_time_s`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from math import ceil, floor

import numpy as np
from pydantic import Field, model_validator

from rdurack.config import Config
from rdurack.errors import InvalidRequest, UnknownName
from rdurack.rack.clock import EmulatedClock
from rdurack.rack.memory import TieredMemory
from rdurack.rack.models import ModelSpec
from rdurack.rack.residency import ResidencyManager
from rdurack.rack.spec import PlatformSpec, Tier
from rdurack.workloads.coe.bundle import BundleShare
from rdurack.workloads.coe.catalog import CATALOG_SIZE, expert_names
from rdurack.workloads.coe.router import Router
from rdurack.workloads.predictor import Predictor
from rdurack.workloads.program import Deploy
from rdurack.workloads.serving.stream.arrivals import Arrival

BUNDLE_NAME = "samba-coe"  # the bundle's model name: the router picks the expert
# Assumption: each running request may hold Llama 2's whole context window, 4,096
# tokens (Touvron et al. 2023, Sec. 2.2), the KV cache a full batch of the PAPER's
# experts can need; what HBM holds beside it is the expert region.
CONTEXT_TOKENS = 4096


@dataclass(frozen=True)
class BundleSetting:
    """A bundle of the first `experts` catalog experts (workloads/coe/catalog.py) of
    `expert_model`, routed by a `router_model` (PAPER: 150 Llama2-7B experts, a
    Llama2-7B router)."""

    experts: int = CATALOG_SIZE
    expert_model: str = "llama2-7b"
    router_model: str = "llama2-7b"
    name: str = BUNDLE_NAME


class BundleLayout(Config):
    """What a bundle holds on each socket of its TP group, beside the KV cache: what an
    endpoint job of a bundle (`rdu serve --rack --experts`) tells its sockets. Field
    names are the proto's ServeBundle's."""

    experts: int = Field(gt=0, le=10_000)
    router_model: str = Field(min_length=1, max_length=100)
    region_experts: int = Field(gt=0, le=10_000)  # experts the HBM region holds at once

    @model_validator(mode="after")
    def _region_in_bundle(self) -> BundleLayout:
        if self.region_experts > self.experts:
            raise ValueError(
                f"region_experts: {self.region_experts} is more than the {self.experts} experts"
            )
        return self

    def holdings(
        self, expert: ModelSpec, router: ModelSpec, sockets: int
    ) -> list[tuple[str, Tier, int, str]]:
        """Each socket's share: (name, tier, bytes, what) of the router and the expert
        region in HBM, and every expert in DDR."""
        share = ceil(expert.weight_bytes / sockets)
        return [
            ("router", Tier.HBM, ceil(router.weight_bytes / sockets), f"router {router.name}"),
            ("region", Tier.HBM, self.region_experts * share, "reserved expert region"),
            ("experts", Tier.DDR, self.experts * share, f"{self.experts} x {expert.name}"),
        ]

    def check(self, platform: PlatformSpec, expert: ModelSpec, router: ModelSpec,
              sockets: int) -> None:  # fmt: skip
        """InvalidRequest, with the numbers, when a socket's tier cannot hold its share."""
        if sockets > platform.node.sockets:
            raise InvalidRequest(
                f"a bundle is tensor parallel over one node: {sockets} sockets > "
                f"{platform.node.sockets}"
            )
        need = {Tier.HBM: 0, Tier.DDR: 0}
        for _, tier, nbytes, _ in self.holdings(expert, router, sockets):
            need[tier] += nbytes
        for tier, nbytes in need.items():
            has = platform.socket.tier(tier).capacity_bytes
            if nbytes > has:
                raise InvalidRequest(
                    f"the bundle needs {nbytes / 1e9:.1f} GB of {tier.value} per socket on "
                    f"{sockets} sockets; a socket has {has / 1e9:.1f} GB"
                )


class Bundle:
    """A bundle deployed on a TP group of `sockets`: its router, its experts, the HBM
    region of the experts and the KV cache tokens beside them."""

    def __init__(
        self,
        p: Predictor,
        setting: BundleSetting,
        models: dict[str, ModelSpec],
        sockets: int,
        max_batch: int,
    ) -> None:
        if setting.experts <= 0:
            raise InvalidRequest(f"a bundle needs experts, got {setting.experts}")
        for name in (setting.expert_model, setting.router_model):
            if name not in models:
                raise UnknownName("model", name, sorted(models))
        self.setting = setting
        self.names = expert_names(setting.experts)
        if setting.name in self.names:
            raise InvalidRequest(f"the bundle's name {setting.name!r} is one of its experts'")
        self.expert = models[setting.expert_model]
        self.router_model = models[setting.router_model]
        self.sockets = sockets
        # The deployment a CoE job makes, on a model of one socket: it refuses what
        # does not fit (DDR for the experts, HBM for the router and one expert).
        share = BundleShare(
            Deploy(
                platform=p.platform.name,
                router_model=setting.router_model,
                expert_model=setting.expert_model,
                experts=tuple(self.names),
                kv_reserve_tokens=max_batch * CONTEXT_TOKENS,
            ),
            p.platform,
            TieredMemory("bundle", p.platform.socket),
            EmulatedClock(),
            sockets,
            models,
        )
        share.deploy()
        assert share.region is not None  # deploy made it
        self._region_bytes = share.region.capacity_bytes
        self._load_rate = share.expert_share / share.switch_s
        self.expert_share = share.expert_share
        self.switch_s = share.switch_s
        # What a socket's KV pool holds, in tokens of the TP group (each socket holds
        # 1/sockets of a token's cache).
        self.kv_budget_tokens = floor(
            share.kv_pool_bytes * sockets / self.expert.kv_bytes_per_token()
        )
        self._router: Router | None = None

    @property
    def region_experts(self) -> int:
        """Experts the HBM region holds at once."""
        return self._region_bytes // self.expert_share

    @property
    def layout(self) -> BundleLayout:
        return BundleLayout(
            experts=len(self.names),
            router_model=self.router_model.name,
            region_experts=self.region_experts,
        )

    @property
    def router(self) -> Router:
        """The bundle's router (built on first use: it hashes the catalog's keywords)."""
        if self._router is None:
            self._router = Router(self.names)
        return self._router

    def region(self) -> ResidencyManager:
        """An empty expert region, every expert registered (a scheduler's own)."""
        out = ResidencyManager(self._region_bytes, self._load_rate)
        for name in self.names:
            out.register(name, self.expert_share)
        return out


def assign_experts(
    arrivals: Sequence[Arrival], names: Sequence[str], skew: float, seed: int
) -> list[Arrival]:
    """The arrivals, each sent through the router to an expert drawn with a Zipf skew
    (the CoE job's Poisson load: workloads/coe/spec.py), from its own seeded draws."""
    if skew < 0:
        raise InvalidRequest(f"the skew is a Zipf exponent, >= 0; got {skew}")
    weights = np.arange(1, len(names) + 1, dtype=np.float64) ** -skew
    rng = np.random.default_rng(seed)
    drawn = rng.choice(len(names), size=len(arrivals), p=weights / weights.sum())
    picks = zip(arrivals, drawn, strict=True)
    return [replace(a, expert=names[int(e)], routed=True) for a, e in picks]
