"""One socket's share of a deployed model bundle (a CoE router plus its experts), and the
program ops that run on it: deploy, switch an expert in, run a kernel.

Both executors use this class: a socket actor (on its own memory and clock) and the
fast predictor's model of a node. A TP group of a node does the same thing on each of
its sockets, so one instance speaks for each socket.

HBM of a socket, per socket share (bytes):

    router weights | pinned experts | reserved region (switched experts, LRU by bytes) | KV pool

Pinned experts are static weights kept in HBM outside the region; the region is
`Deploy.region_bytes`, or by default everything left after the router, the pins and
the KV cache of a full batch (at least one expert). The KV pool is what remains.
Expert weights all live in DDR (a DGX: host DRAM) as well; a switch copies an expert's
share DDR -> HBM at the rate `predictor.switch_time_s` gives (each socket's own link,
under the node's aggregate cap).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from math import ceil

from rdurack.errors import InvalidRequest, OutOfMemory, UnknownName
from rdurack.rack.clock import EmulatedClock, seconds_to_ns
from rdurack.rack.memory import TieredMemory
from rdurack.rack.models import ModelSpec
from rdurack.rack.presets import platform as preset
from rdurack.rack.residency import ResidencyManager
from rdurack.rack.spec import PlatformSpec, Tier
from rdurack.workloads.predictor import DGX_HOST_RESERVE_BYTES, Predictor, switch_time_s
from rdurack.workloads.program import Deploy, Generate, Kernel, Op, OpRun, ProgramRun, Switch


@dataclass(frozen=True, slots=True)
class _KernelCost:
    duration_ns: int
    kernel_calls: int
    hbm_bytes: int
    flops: int  # per socket, all steps
    kv_bytes: int  # per socket


class BundleShare:
    """A socket's share (1/`group_size`) of a bundle deployed for one job."""

    def __init__(
        self,
        op: Deploy,
        platform: PlatformSpec,
        memory: TieredMemory,
        clock: EmulatedClock,
        group_size: int,
        models: dict[str, ModelSpec],
        prefix: str = "",
    ) -> None:
        """`memory` and `clock` are the socket's (or a model of them); allocations are
        named `prefix` + what, so a job's prefix lets its release free them."""
        if platform.name != op.platform:
            raise InvalidRequest(f"deploy: platform {op.platform!r} is not {platform.name!r}")
        if not 0 < group_size <= platform.node.sockets:
            raise InvalidRequest(
                f"a bundle is TP over one node: group size {group_size} is not in "
                f"1..{platform.node.sockets}"
            )
        self.op = op
        self.platform = platform
        self.memory = memory
        self.clock = clock
        self.group = group_size
        self.prefix = prefix
        self.predictor = Predictor(platform)
        self.router = _model(models, op.router_model)
        self.expert = _model(models, op.expert_model)
        self.models = models
        if len(set(op.experts)) != len(op.experts):
            raise InvalidRequest("deploy: expert names must be unique")
        unknown = sorted(set(op.pinned) - set(op.experts))
        if unknown:
            raise UnknownName("pinned expert", unknown[0], list(op.experts[:20]))
        self.expert_share = ceil(self.expert.weight_bytes / group_size)
        self.switch_s = switch_time_s(platform, self.expert.weight_bytes, group_size)
        self.pinned = frozenset(op.pinned)
        self.region: ResidencyManager | None = None
        self.kv_pool_bytes = 0
        self._kernels: dict[tuple[Kernel, float], _KernelCost] = {}

    # ------------------------------------------------------------------ ops

    def deploy(self) -> OpRun:
        """Allocate the bundle. Raises OutOfMemory (socket, tier, asked, free) when the
        catalog does not fit DDR, or the router and pins do not fit HBM."""
        start = self.clock.now_ns
        mem, p = self.memory, self.prefix
        if self.platform.socket.kind == "gpu":
            # A DGX keeps host DRAM for the OS and framework (workloads/predictor.py).
            reserve = ceil(DGX_HOST_RESERVE_BYTES / self.platform.node.sockets)
            mem.allocate(p + "host-reserve", Tier.DDR, reserve, what="host reserve")
        ddr = "host DRAM" if self.platform.socket.kind == "gpu" else "DDR"
        for i, name in enumerate(self.op.experts):
            if self.expert_share > mem.free_bytes(Tier.DDR):
                raise OutOfMemory(
                    mem.socket_id,
                    "ddr",
                    self.expert_share * (len(self.op.experts) - i),
                    mem.free_bytes(Tier.DDR),
                    what=(
                        f"{len(self.op.experts)} x {self.expert.name} experts in {ddr} "
                        f"({len(self.op.experts) * self.expert.weight_bytes / 1e12:.2f} TB "
                        f"over {self.group} sockets; {i} fit)"
                    ),
                )
            mem.allocate(p + f"expert/{name}", Tier.DDR, self.expert_share, what=name)
        router_share = ceil(self.router.weight_bytes / self.group)
        mem.allocate(p + "router", Tier.HBM, router_share, what=f"router {self.router.name}")
        loaded = 0
        for name in self.op.pinned:
            mem.allocate(p + f"pinned/{name}", Tier.HBM, self.expert_share, what=f"pin {name}")
            loaded += self.expert_share
        kv_reserve = kv_tokens_bytes(self.expert, self.op.kv_reserve_tokens, self.group)
        region = self.op.region_bytes
        if region is None:
            region = max(self.expert_share, mem.free_bytes(Tier.HBM) - kv_reserve)
        if region < self.expert_share and len(self.pinned) < len(self.op.experts):
            raise InvalidRequest(
                f"deploy: a reserved region of {region:,} bytes per socket cannot hold one "
                f"{self.expert.name} expert ({self.expert_share:,} bytes per socket)"
            )
        mem.allocate(p + "region", Tier.HBM, region, what="reserved expert region")
        self.region = ResidencyManager(region, self.expert_share / self.switch_s)
        for name in self.op.experts:
            if name not in self.pinned:
                self.region.register(name, self.expert_share)
        self.kv_pool_bytes = mem.free_bytes(Tier.HBM)
        # Pins are loaded like switches, each at the switch rate.
        self.clock.advance(self.switch_s * len(self.op.pinned))
        return OpRun(start, self.clock.now_ns, loaded_bytes=loaded)

    def switch(self, op: Switch) -> OpRun:
        region = self._region()
        start = self.clock.now_ns
        if op.expert in self.pinned:
            return OpRun(start, start, hit=True)
        load = region.ensure(op.expert)
        self.clock.advance(load.load_s)
        return OpRun(
            start,
            self.clock.now_ns,
            hit=load.hit,
            loaded_bytes=load.loaded_bytes,
            evicted=load.evicted,
        )

    def kernel(self, op: Kernel, slowdown: float = 1.0) -> OpRun:
        """The op's time from the timing model; its KV cache is held while it runs."""
        key = (op, slowdown)
        cost = self._kernels.get(key)
        if cost is None:
            if op.steps <= 0:
                raise InvalidRequest(f"steps must be positive, got {op.steps}")
            model = _model(self.models, op.model)
            t = self.predictor.step(model, op.phase, op.plan, op.batch, op.seq, self.group)
            invocation = self.predictor.invocation_s if op.starts_invocation else 0.0
            cost = _KernelCost(
                seconds_to_ns((t.total_s * op.steps + invocation) * slowdown),
                t.kernel_calls * op.steps,
                int(t.hbm_bytes * op.steps),
                int(t.flops * op.steps),
                kv_tokens_bytes(model, op.kv_tokens, self.group),
            )
            self._kernels[key] = cost
        kv_name = self.prefix + "kv"
        if cost.kv_bytes:
            self.memory.allocate(
                kv_name, Tier.HBM, cost.kv_bytes, what=f"KV cache, {op.kv_tokens} tokens"
            )
            self.memory.free(kv_name)  # held only while the op runs: it counts in the peak
        start = self.clock.now_ns
        end = self.clock.advance_to(start + cost.duration_ns)
        return OpRun(
            start, end, kernel_calls=cost.kernel_calls, hbm_bytes=cost.hbm_bytes, flops=cost.flops
        )

    # ------------------------------------------------------------------ state

    def resident(self) -> tuple[str, ...]:
        """Experts in HBM: the pinned ones, then the region's, least recently used first."""
        return tuple(self.op.pinned) + tuple(self._region().resident())

    def _region(self) -> ResidencyManager:
        if self.region is None:
            raise InvalidRequest("the bundle is not deployed: run a Deploy op first")
        return self.region


def _model(models: dict[str, ModelSpec], name: str) -> ModelSpec:
    if name not in models:
        raise UnknownName("model", name, sorted(models))
    return models[name]


def kv_tokens_bytes(model: ModelSpec, tokens: int, group: int) -> int:
    """Per-socket KV cache bytes of `tokens` tokens of `model` over a TP group."""
    return ceil(tokens * model.kv_bytes_per_token() / group)


class ProgramRunner:
    """Runs programs (workloads/program.py) for one job on one socket's memory and clock.

    A Deploy whose platform is not the socket's own (a DGX job on SN40L socket actors)
    gives the job a memory of that platform's socket for its duration: the socket is
    "loaded with that platform's spec". `generate` computes a Generate op (functional
    mode; the socket supplies it); without it Generate ops are refused.
    """

    def __init__(
        self,
        name: str,
        platform: PlatformSpec,
        memory: TieredMemory,
        clock: EmulatedClock,
        group_size: int,
        models: dict[str, ModelSpec],
        *,
        prefix: str = "",
        generate: Callable[[Generate, BundleShare], tuple[int, ...]] | None = None,
    ) -> None:
        self.name = name
        self.home = platform
        self.memory = memory
        self.clock = clock
        self.group = group_size
        self.models = models
        self.prefix = prefix
        self.share: BundleShare | None = None
        self._generate = generate

    def run(
        self,
        ops: Sequence[Op],
        start_ns: int | None = None,
        slowdown: float = 1.0,
        observe: Callable[[Op, OpRun], None] | None = None,
    ) -> ProgramRun:
        """Run `ops` in order from `start_ns` (or the clock, if later). `observe` sees
        each op and what it did (the socket records spans with it)."""
        if start_ns is not None:
            self.clock.advance_to(start_ns)
        runs = []
        for op in ops:
            run = self._one(op, slowdown)
            if observe is not None:
                observe(op, run)
            runs.append(run)
        share = self.share
        return ProgramRun(
            socket_id=self.name,
            ops=tuple(runs),
            resident=share.resident() if share and share.region else (),
            kv_free_bytes=share.kv_pool_bytes if share else 0,
            hbm_peak_bytes=self.memory.peak_bytes(Tier.HBM),
            ddr_used_bytes=self.memory.used_bytes(Tier.DDR),
        )

    def _one(self, op: Op, slowdown: float) -> OpRun:
        if isinstance(op, Deploy):
            if self.share is not None:
                raise InvalidRequest("deploy: this job has already deployed its bundle")
            platform = self.home if op.platform == self.home.name else preset(op.platform)
            if platform is not self.home:
                self.memory = TieredMemory(self.name, platform.socket)
            self.share = BundleShare(
                op, platform, self.memory, self.clock, self.group, self.models, self.prefix
            )
            return self.share.deploy()
        share = self._share()
        if isinstance(op, Kernel):
            return share.kernel(op, slowdown)
        if isinstance(op, Switch):
            return share.switch(op)
        if self._generate is None:
            raise InvalidRequest("generate: this executor runs timing programs only")
        now = self.clock.now_ns
        return OpRun(now, now, tokens=self._generate(op, share))

    def _share(self) -> BundleShare:
        if self.share is None:
            raise InvalidRequest("the bundle is not deployed: run a Deploy op first")
        return self.share


class PredictedReplicas:
    """The fast predictor's NodeExecutor (workloads/coe/engine.py): every socket of a replica's
    TP group does the same, so one socket's memory and clock model speak for it."""

    def __init__(
        self, platform: PlatformSpec, models: dict[str, ModelSpec], group_size: int | None = None
    ) -> None:
        self.platform = platform
        self.models = models
        self.group = group_size or platform.node.sockets
        self._runners: dict[int, ProgramRunner] = {}

    def run(self, replica: int, ops: Sequence[Op], start_ns: int) -> ProgramRun:
        runner = self._runners.get(replica)
        if runner is None:
            name = f"{self.platform.name} replica {replica} socket"
            runner = ProgramRunner(
                name,
                self.platform,
                TieredMemory(name, self.platform.socket),
                EmulatedClock(),
                self.group,
                self.models,
            )
            self._runners[replica] = runner
        return runner.run(ops, start_ns)
