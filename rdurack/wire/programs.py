"""Programs (workloads/program.py) to and from rdurack.v1 RunProgram messages: the
gateway encodes ops and decodes runs, the node agent the other way round."""

from __future__ import annotations

from collections.abc import Sequence

from rdurack.errors import InvalidRequest
from rdurack.v1 import node_agent_pb2
from rdurack.wire import rack as convert
from rdurack.workloads.program import Deploy, Generate, Kernel, Op, OpRun, ProgramRun, Switch


def op_to_proto(op: Op) -> node_agent_pb2.ProgramOp:
    if isinstance(op, Deploy):
        return node_agent_pb2.ProgramOp(
            deploy=node_agent_pb2.DeployBundleOp(
                platform=op.platform,
                router_model=op.router_model,
                expert_model=op.expert_model,
                experts=list(op.experts),
                pinned=list(op.pinned),
                kv_reserve_tokens=op.kv_reserve_tokens,
                region_bytes=op.region_bytes or 0,
                expert_seeds=list(op.expert_seeds),
            )
        )
    if isinstance(op, Kernel):
        return node_agent_pb2.ProgramOp(
            kernel=node_agent_pb2.KernelOp(
                model=op.model,
                phase=convert.PHASE_TO_PROTO[op.phase],
                fusion_plan=convert.PLAN_TO_PROTO[op.plan],
                batch_size=op.batch,
                sequence_length=op.seq,
                steps=op.steps,
                kv_tokens=op.kv_tokens,
                role=op.role,
            )
        )
    if isinstance(op, Switch):
        return node_agent_pb2.ProgramOp(
            switch_expert=node_agent_pb2.SwitchExpertOp(expert=op.expert)
        )
    return node_agent_pb2.ProgramOp(
        generate=node_agent_pb2.GenerateOp(
            expert=op.expert, prompt=list(op.prompt), max_new_tokens=op.max_new_tokens
        )
    )


def op_from_proto(msg: node_agent_pb2.ProgramOp, index: int) -> Op:
    kind = msg.WhichOneof("op")
    if kind == "deploy":
        d = msg.deploy
        return Deploy(
            platform=d.platform,
            router_model=d.router_model,
            expert_model=d.expert_model,
            experts=tuple(d.experts),
            pinned=tuple(d.pinned),
            kv_reserve_tokens=d.kv_reserve_tokens,
            region_bytes=d.region_bytes or None,
            expert_seeds=tuple(d.expert_seeds),
        )
    if kind == "kernel":
        k = msg.kernel
        return Kernel(
            model=k.model,
            phase=convert.phase(k.phase),
            plan=convert.plan(k.fusion_plan),
            batch=convert.positive(k.batch_size, f"ops[{index}].kernel.batch_size"),
            seq=convert.positive(k.sequence_length, f"ops[{index}].kernel.sequence_length"),
            steps=convert.positive(k.steps, f"ops[{index}].kernel.steps"),
            kv_tokens=k.kv_tokens,
            role=k.role,
        )
    if kind == "switch_expert":
        return Switch(msg.switch_expert.expert)
    if kind == "generate":
        g = msg.generate
        return Generate(g.expert, tuple(g.prompt), g.max_new_tokens)
    raise InvalidRequest(f"ops[{index}]: no operation set")


def run_to_proto(run: ProgramRun) -> node_agent_pb2.SocketProgramTiming:
    return node_agent_pb2.SocketProgramTiming(
        socket_id=run.socket_id,
        ops=[
            node_agent_pb2.OpTiming(
                emulated_start_ns=o.start_ns,
                emulated_end_ns=o.end_ns,
                hit=bool(o.hit),
                loaded_bytes=o.loaded_bytes,
                evicted=list(o.evicted),
                kernel_calls=o.kernel_calls,
                hbm_traffic_bytes=o.hbm_bytes,
                flops=o.flops,
                tokens=list(o.tokens),
            )
            for o in run.ops
        ],
        resident_experts=list(run.resident),
        kv_free_bytes=run.kv_free_bytes,
        hbm_peak_bytes=run.hbm_peak_bytes,
        ddr_used_bytes=run.ddr_used_bytes,
    )


def run_from_proto(msg: node_agent_pb2.SocketProgramTiming, ops: Sequence[Op]) -> ProgramRun:
    """`ops`: the program that ran, to tell which ops have a hit flag."""
    if len(msg.ops) != len(ops):
        raise InvalidRequest(f"{msg.socket_id}: {len(msg.ops)} op timings for {len(ops)} ops")
    return ProgramRun(
        socket_id=msg.socket_id,
        ops=tuple(
            OpRun(
                start_ns=t.emulated_start_ns,
                end_ns=t.emulated_end_ns,
                hit=t.hit if isinstance(op, Switch) else None,
                loaded_bytes=t.loaded_bytes,
                evicted=tuple(t.evicted),
                kernel_calls=t.kernel_calls,
                hbm_bytes=t.hbm_traffic_bytes,
                flops=t.flops,
                tokens=tuple(t.tokens),
            )
            for t, op in zip(msg.ops, ops, strict=True)
        ),
        resident=tuple(msg.resident_experts),
        kv_free_bytes=msg.kv_free_bytes,
        hbm_peak_bytes=msg.hbm_peak_bytes,
        ddr_used_bytes=msg.ddr_used_bytes,
    )
