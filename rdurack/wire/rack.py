"""proto <-> domain conversion for the rack's messages (one place, both directions)."""

from __future__ import annotations

from typing import Protocol

from rdurack.errors import InvalidRequest
from rdurack.node_agent.health import SocketHealth
from rdurack.node_agent.runs import Run
from rdurack.rack.kernels import FusionPlan, Phase
from rdurack.rack.models import ExpertMapping
from rdurack.rack.spec import Tier
from rdurack.rack.topology import SocketId
from rdurack.v1 import common_pb2, node_agent_pb2, rack_pb2
from rdurack.workloads.serving.batch import SERVE

PHASES: dict[int, Phase] = {
    common_pb2.PHASE_PREFILL: Phase.PREFILL,
    common_pb2.PHASE_DECODE: Phase.DECODE,
    common_pb2.PHASE_TRAIN: Phase.TRAIN,
}
PLANS: dict[int, FusionPlan] = {
    common_pb2.FUSION_PLAN_UNFUSED: FusionPlan.UNFUSED,
    common_pb2.FUSION_PLAN_FUSED_SO: FusionPlan.FUSED_SO,
    common_pb2.FUSION_PLAN_FUSED_HO: FusionPlan.FUSED_HO,
    common_pb2.FUSION_PLAN_KERNEL_LOOPED: FusionPlan.KERNEL_LOOPED,
}
MAPPINGS: dict[int, ExpertMapping] = {
    common_pb2.EXPERT_MAPPING_EXPERT_PARALLEL: ExpertMapping.EXPERT_PARALLEL,
    common_pb2.EXPERT_MAPPING_TENSOR_PARALLEL: ExpertMapping.TENSOR_PARALLEL,
}
MAPPING_TO_PROTO = {v: common_pb2.ExpertMapping.ValueType(k) for k, v in MAPPINGS.items()}
PHASE_TO_PROTO = {v: common_pb2.Phase.ValueType(k) for k, v in PHASES.items()}
PLAN_TO_PROTO = {v: common_pb2.FusionPlan.ValueType(k) for k, v in PLANS.items()}
# A kernel job's phases: a step's, or SERVE (a whole batch).
JOB_PHASES: dict[int, Phase | str] = {**PHASES, common_pb2.PHASE_SERVE: SERVE}
TIERS = {
    Tier.SRAM: common_pb2.TIER_SRAM,
    Tier.HBM: common_pb2.TIER_HBM,
    Tier.DDR: common_pb2.TIER_DDR,
}
COLLECTIVES: dict[int, str] = {
    node_agent_pb2.COLLECTIVE_OP_ALL_REDUCE: "all_reduce",
    node_agent_pb2.COLLECTIVE_OP_BROADCAST: "broadcast",
    node_agent_pb2.COLLECTIVE_OP_ALL_GATHER: "all_gather",
    node_agent_pb2.COLLECTIVE_OP_BARRIER: "barrier",
    node_agent_pb2.COLLECTIVE_OP_SEND: "send",
}


def phase(value: int) -> Phase:
    """The phase of one step (PREFILL, DECODE, TRAIN); SERVE, a whole batch, is refused."""
    if value == common_pb2.PHASE_SERVE:
        raise InvalidRequest(
            "phase: SERVE is a whole batch of requests (a prefill, then decode), not one "
            "step; this needs the phase of a step: PREFILL, DECODE or TRAIN"
        )
    if value not in PHASES:
        raise InvalidRequest(f"phase: {value} is not one of PREFILL, DECODE, TRAIN")
    return PHASES[value]


def job_phase_to_proto(value: Phase | str) -> common_pb2.Phase.ValueType:
    """A kernel job's phase on the wire: a step's phase, or SERVE."""
    return common_pb2.PHASE_SERVE if value == SERVE else PHASE_TO_PROTO[Phase(value)]


def plan_to_proto(value: FusionPlan | None) -> common_pb2.FusionPlan.ValueType:
    """A fusion plan on the wire; None (a serve job's platform default) is UNSPECIFIED."""
    return common_pb2.FUSION_PLAN_UNSPECIFIED if value is None else PLAN_TO_PROTO[value]


def mapping(value: int) -> ExpertMapping | None:
    """An expert mapping from the wire; UNSPECIFIED is None (the default mapping)."""
    if value == common_pb2.EXPERT_MAPPING_UNSPECIFIED:
        return None
    if value not in MAPPINGS:
        raise InvalidRequest(
            f"expert_mapping: {value} is not one of EXPERT_PARALLEL, TENSOR_PARALLEL"
        )
    return MAPPINGS[value]


def mapping_to_proto(value: ExpertMapping | None) -> common_pb2.ExpertMapping.ValueType:
    return common_pb2.EXPERT_MAPPING_UNSPECIFIED if value is None else MAPPING_TO_PROTO[value]


def plan(value: int) -> FusionPlan:
    if value not in PLANS:
        raise InvalidRequest(
            f"fusion_plan: {value} is not one of UNFUSED, FUSED_SO, FUSED_HO, KERNEL_LOOPED"
        )
    return PLANS[value]


def collective_op(value: int) -> str:
    if value not in COLLECTIVES:
        raise InvalidRequest(
            f"op: {value} is not one of ALL_REDUCE, BROADCAST, ALL_GATHER, BARRIER, SEND"
        )
    return COLLECTIVES[value]


def positive(value: int, field: str) -> int:
    """A size a request must set (proto3 cannot tell 0 from unset)."""
    if value <= 0:
        raise InvalidRequest(f"{field}: must be positive, got {value}")
    return value


def socket_ref(socket_id: str) -> common_pb2.SocketRef:
    s = SocketId.parse(socket_id)
    return common_pb2.SocketRef(node_index=s.node, socket_index=s.index, id=socket_id)


class Usage(Protocol):
    """One tier's bytes: the agent's TierUsage and the orchestrator's TierView both are."""

    @property
    def used_bytes(self) -> int: ...
    @property
    def peak_bytes(self) -> int: ...
    @property
    def capacity_bytes(self) -> int: ...


def health(healthy: bool, dead: bool = True) -> rack_pb2.SocketHealth.ValueType:
    """HEALTHY; else FAILED for a dead actor (or any unhealthy socket, when who cannot
    tell says so with dead=True), UNREACHABLE for one that did not answer in time."""
    if healthy:
        return rack_pb2.SOCKET_HEALTH_HEALTHY
    return rack_pb2.SOCKET_HEALTH_FAILED if dead else rack_pb2.SOCKET_HEALTH_UNREACHABLE


def tier_usage(tier: str, usage: Usage) -> common_pb2.TierUsage:
    return common_pb2.TierUsage(
        tier=TIERS[Tier(tier)],
        used_bytes=usage.used_bytes,
        peak_bytes=usage.peak_bytes,
        capacity_bytes=usage.capacity_bytes,
    )


def socket_status(h: SocketHealth) -> rack_pb2.SocketStatus:
    msg = rack_pb2.SocketStatus(
        ref=socket_ref(h.socket_id),
        health=health(h.healthy, h.dead),
        health_reason=h.error,
        incarnation=h.incarnation,
        slowdown=1.0,
    )
    if h.state is not None:
        msg.current_job_id = h.state.job_id or ""
        msg.emulated_clock_ns = h.state.clock_ns
        msg.link_address = h.state.link_address
        msg.slowdown = h.state.slowdown
        msg.tiers.extend(tier_usage(t, u) for t, u in h.state.tiers.items())
    return msg


def socket_beat(h: SocketHealth) -> node_agent_pb2.SocketBeat:
    beat = node_agent_pb2.SocketBeat(
        socket_id=h.socket_id,
        health=health(h.healthy, h.dead),
        incarnation=h.incarnation,
        error=h.error,
        slowdown=1.0,
    )
    if h.state is not None:
        beat.current_job_id = h.state.job_id or ""
        beat.emulated_clock_ns = h.state.clock_ns
        beat.slowdown = h.state.slowdown
    return beat


def kernel_timing(run: Run) -> node_agent_pb2.SocketKernelTiming:
    return node_agent_pb2.SocketKernelTiming(
        socket_id=run.socket_id,
        emulated_start_ns=run.start_ns,
        emulated_end_ns=run.end_ns,
        emulated_duration_ns=run.duration_ns,
        kernel_calls=run.kernel_calls,
        hbm_traffic_bytes=run.hbm_bytes,
        flops=run.flops,
        launch_ns=run.launch_ns,
        collective_ns=run.collective_ns,
    )


def collective_timing(run: Run) -> node_agent_pb2.SocketCollectiveTiming:
    return node_agent_pb2.SocketCollectiveTiming(
        socket_id=run.socket_id,
        emulated_start_ns=run.start_ns,
        emulated_end_ns=run.end_ns,
        emulated_duration_ns=run.duration_ns,
        bytes_sent=run.bytes_sent,
        bytes_received=run.bytes_received,
    )
