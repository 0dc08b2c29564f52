"""The timing model: a roofline per kernel, launch overheads, and TP collectives.

    unfused operator:  launch_SO + max(FLOPs / (peak x eff_c), bytes / (BW x eff_m))
    fused block:       launch + fill + max(FLOPs / ..., fused bytes / ... + DDR copies,
                                               link bytes / link BW)
                       + latency of its collectives (serial: the next operator needs them)
    kernel-looped:     one HO launch for the whole loop; each iteration lasts
                       max(weight stream, compute + collective latency, link bytes)
                       because the pipelined outer loop streams the next layer's weights
                       while this layer computes and all-reduces (KL Sec. 3)

Both executors use this module: the predictor (in one process) and the cluster's socket
actors. Times are seconds (float); the clock rounds them up to nanoseconds.
"""

from __future__ import annotations

from dataclasses import dataclass

from rdurack.errors import InvalidRequest, OutOfMemory
from rdurack.rack.collectives import Algorithm, Cost, all_reduce
from rdurack.rack.kernels import Block, FusionPlan, Op, OpKind, Step
from rdurack.rack.spec import PlatformSpec
from rdurack.rack.topology import SocketId, Topology

NS = 1e-9


@dataclass(frozen=True, slots=True)
class StepTiming:
    """Emulated time of one step on each socket of its TP group (all take the same)."""

    total_s: float
    kernel_calls: int
    flops: float  # per socket
    hbm_bytes: float  # per socket, as the plan moves them
    launch_s: float
    collective_s: float  # time spent in collectives that nothing hides
    sram_bytes: float  # largest SRAM working set of one kernel


def tp_group(platform: PlatformSpec, sockets: int) -> list[SocketId]:
    """The first `sockets` sockets, node by node: a group of up to a node stays in it."""
    if not 0 < sockets <= platform.sockets:
        raise InvalidRequest(
            f"{platform.name} has {platform.sockets} sockets; cannot use {sockets}"
        )
    topo = Topology(platform)
    return topo.sockets[:sockets]


class CollectiveCosts:
    """All-reduce costs by what decides them: the topology and links, the group, the
    bytes. One is shared by every Timer a caller makes when it times many platforms
    that differ in other numbers: a calibration tries thousands, and simulating a
    collective's schedule is most of what timing a step costs."""

    def __init__(self) -> None:
        self._costs: dict[tuple[object, ...], Cost] = {}

    def all_reduce(self, topology: Topology, group: list[SocketId], nbytes: float) -> Cost:
        p = topology.platform
        key = (
            p.nodes,
            p.node.sockets,
            p.node.fabric,
            p.node.intra_node_link.bandwidth_bytes_per_s,
            p.node.intra_node_link.latency_ns,
            p.inter_node_link.bandwidth_bytes_per_s,
            p.inter_node_link.latency_ns,
            # The spine (None on one rack): a group across racks crosses it.
            None if p.spine is None else (p.spine.link.bandwidth_bytes_per_s, p.spine.latency_ns),
            tuple(group),
            nbytes,
        )
        cost = self._costs.get(key)
        if cost is None:
            cost = self._costs[key] = all_reduce(topology, group, nbytes, Algorithm.AUTO)
        return cost


class Timer:
    """Times steps on one TP group of a platform. `collectives`: a cache shared with
    other Timers (default: its own)."""

    def __init__(
        self,
        platform: PlatformSpec,
        group: list[SocketId],
        collectives: CollectiveCosts | None = None,
    ) -> None:
        self.platform = platform
        self.topology = Topology(platform)
        self.group = group
        self._collectives = CollectiveCosts() if collectives is None else collectives
        socket = platform.socket
        k = socket.kernels
        self._flops_per_s = socket.peak_flops_per_s * k.compute_efficiency
        self._hbm_per_s = socket.hbm.bandwidth_bytes_per_s * k.memory_efficiency
        # Cold experts' copies into HBM: each socket at its DDR->HBM rate, the sockets of
        # a node all copying at once under the node's cap (PAPER Sec. VI-C).
        in_node = min(len(group), platform.node.sockets)
        self._ddr_per_s = min(
            socket.ddr_to_hbm_bandwidth_bytes_per_s,
            platform.node.ddr_to_hbm_node_bandwidth_bytes_per_s / in_node,
        )
        self._sram_capacity = socket.sram.capacity_bytes
        self._launch_so = k.launch_so_ns * NS
        self._launch_ho = None if k.launch_ho_ns is None else k.launch_ho_ns * NS
        self._fill = k.pipeline_fill_ns * NS
        self._dataflow = k.dataflow_fusion

    # ---------------------------------------------------------------- building blocks

    def roofline_s(self, flops: float, hbm_bytes: float) -> float:
        return max(flops / self._flops_per_s, hbm_bytes / self._hbm_per_s)

    def unfused_s(self, flops: float, hbm_bytes: float) -> float:
        """One operator as its own kernel: a software-orchestrated launch and its
        roofline."""
        return self._launch_so + self.roofline_s(flops, hbm_bytes)

    def fused_s(self, flops: float, hbm_bytes: float, plan: FusionPlan) -> float:
        """Operators fused into one dataflow kernel under `plan`: one launch, the
        pipeline's fill, the roofline of its FLOPs and the HBM bytes it moves."""
        if not self._dataflow:
            raise InvalidRequest(
                f"{self.platform.socket.name} runs no dataflow kernels: plan {plan.value} "
                "needs them; use unfused"
            )
        return self._launch(plan) + self._fill + self.roofline_s(flops, hbm_bytes)

    def all_reduce(self, nbytes: float) -> Cost:
        return self._collectives.all_reduce(self.topology, self.group, nbytes)

    def _launch(self, plan: FusionPlan) -> float:
        if plan in (FusionPlan.UNFUSED, FusionPlan.FUSED_SO):
            return self._launch_so
        if self._launch_ho is None:
            raise InvalidRequest(
                f"{self.platform.socket.name} has no hardware-orchestrated launch; "
                f"plan {plan.value} needs one"
            )
        return self._launch_ho

    # ---------------------------------------------------------------- per plan

    def op_s(self, op: Op) -> float:
        """An operator as its own kernel (unfused)."""
        if op.kind is OpKind.ALL_REDUCE:
            return self._launch_so + self.all_reduce(op.reduce_bytes).total_s
        copy = op.ddr_bytes / self._ddr_per_s  # before it runs: it needs those weights
        return copy + self.unfused_s(op.flops, op.hbm_bytes)

    def _fused_parts(self, block: Block) -> tuple[float, float, float, float]:
        """(compute s, memory s, collective latency s, collective bandwidth s)."""
        latency = bandwidth = 0.0
        for op in block.ops:
            if op.kind is OpKind.ALL_REDUCE:
                cost = self.all_reduce(op.reduce_bytes)
                latency += cost.latency_s
                bandwidth += cost.bandwidth_s
        return (
            block.flops / self._flops_per_s,
            block.fused_hbm_bytes() / self._hbm_per_s + block.ddr_bytes / self._ddr_per_s,
            latency,
            bandwidth,
        )

    def _check_sram(self, block: Block) -> float:
        need = block.fused_sram_bytes()
        if need > self._sram_capacity:
            raise OutOfMemory(
                f"fused kernel {block.name}",
                "sram",
                int(need),
                int(self._sram_capacity),
                what=f"stage buffers of {block.tokens} tokens",
            )
        return need

    def fused_block_s(self, block: Block, plan: FusionPlan) -> float:
        compute, memory, latency, bandwidth = self._fused_parts(block)
        return self._launch(plan) + self._fill + max(compute, memory, bandwidth) + latency

    def looped_s(self, block: Block, iterations: int) -> float:
        compute, memory, latency, bandwidth = self._fused_parts(block)
        per_iteration = max(memory, compute + latency, bandwidth)
        return self._launch(FusionPlan.KERNEL_LOOPED) + self._fill + iterations * per_iteration

    # ---------------------------------------------------------------- a whole step

    def step(self, step: Step, plan: FusionPlan) -> StepTiming:
        if plan is not FusionPlan.UNFUSED and not self._dataflow:
            raise InvalidRequest(
                f"{self.platform.socket.name} runs unfused kernels only (no dataflow "
                f"fusion); asked for {plan.value}"
            )
        total = launch = collective = sram = hbm = 0.0
        calls = 0
        for block, repeats in step.blocks:
            if plan is FusionPlan.UNFUSED:
                for op in block.ops:
                    total += repeats * self.op_s(op)
                    if op.kind is OpKind.ALL_REDUCE:
                        collective += repeats * self.all_reduce(op.reduce_bytes).total_s
                    hbm += repeats * op.hbm_bytes
                calls += repeats * len(block.ops)
                launch += repeats * len(block.ops) * self._launch_so
                continue
            sram = max(sram, self._check_sram(block))
            hbm += repeats * block.fused_hbm_bytes()
            _, _, latency, _ = self._fused_parts(block)
            if plan is FusionPlan.KERNEL_LOOPED and block.loopable and repeats > 1:
                total += self.looped_s(block, repeats)
                calls += 1
                launch += self._launch(plan)
                # In the loop, latency hides behind the next layer's weight stream.
                compute, memory, _, bandwidth = self._fused_parts(block)
                collective += repeats * max(0.0, compute + latency - max(memory, bandwidth))
            else:
                total += repeats * self.fused_block_s(block, plan)
                calls += repeats
                launch += repeats * self._launch(plan)
                collective += repeats * latency
        return StepTiming(
            total_s=total,
            kernel_calls=calls,
            flops=step.flops,
            hbm_bytes=hbm,
            launch_s=launch,
            collective_s=collective,
            sram_bytes=sram,
        )
