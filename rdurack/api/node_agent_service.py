"""rdurack.v1.NodeAgentService: a node agent on the wire."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import grpc
from pydantic import ValidationError

from rdurack.api.status import rpc
from rdurack.errors import InvalidRequest
from rdurack.node_agent.agent import NodeAgent
from rdurack.rack.faults import FaultConflict, FaultKind
from rdurack.rack.kernels import Phase
from rdurack.rack.models import model
from rdurack.v1 import common_pb2, node_agent_pb2, node_agent_pb2_grpc, rack_pb2
from rdurack.wire import programs as program_convert
from rdurack.wire import rack as convert
from rdurack.wire import training as training_convert
from rdurack.wire.faults import fault_from_proto, fault_to_proto
from rdurack.wire.jobs import speculative_from_proto
from rdurack.wire.passes import bundle_from_proto, passes_from_proto
from rdurack.wire.served import served_from_proto
from rdurack.workloads.serving.batch import ServeRequest
from rdurack.workloads.serving.speculative import SpeculativeSetting
from rdurack.workloads.training.job import TrainingWorkload

SERVICE = node_agent_pb2.DESCRIPTOR.services_by_name["NodeAgentService"].full_name
# Seconds between answering a KILL_AGENT fault and ending the process, so the answer
# leaves first.
KILL_DELAY_S = 0.2
log = logging.getLogger(__name__)


class NodeAgentService(node_agent_pb2_grpc.NodeAgentServiceServicer):
    def __init__(
        self, agent: NodeAgent, address: str = "", on_kill: Callable[[], None] | None = None
    ) -> None:
        """`on_kill`: how a KILL_AGENT fault ends this agent (node_agent_main: the process
        exits at once, taking its socket actors with it); None refuses the fault."""
        self.agent = agent
        self.address = address
        self.on_kill = on_kill

    def add_to(self, server: grpc.Server) -> None:
        node_agent_pb2_grpc.add_NodeAgentServiceServicer_to_server(self, server)

    @rpc
    def GetNode(
        self, request: node_agent_pb2.GetNodeRequest, context: grpc.ServicerContext
    ) -> node_agent_pb2.GetNodeResponse:
        health = self.agent.health()
        node = rack_pb2.NodeStatus(
            index=self.agent.node_index,
            agent_address=self.address,
            healthy=all(h.healthy for h in health),
            sockets=[convert.socket_status(h) for h in health],
        )
        return node_agent_pb2.GetNodeResponse(node=node)

    @rpc
    def ReserveSockets(
        self, request: node_agent_pb2.ReserveSocketsRequest, context: grpc.ServicerContext
    ) -> node_agent_pb2.ReserveSocketsResponse:
        _require(request.job_id, "job_id")
        self.agent.reserve(request.job_id, list(request.socket_ids))
        held = [h for h in self.agent.health() if h.socket_id in set(request.socket_ids)]
        return node_agent_pb2.ReserveSocketsResponse(
            sockets=[convert.socket_status(h) for h in held]
        )

    @rpc
    def ReleaseSockets(
        self, request: node_agent_pb2.ReleaseSocketsRequest, context: grpc.ServicerContext
    ) -> node_agent_pb2.ReleaseSocketsResponse:
        _require(request.job_id, "job_id")
        released = self.agent.release(request.job_id, list(request.socket_ids))
        return node_agent_pb2.ReleaseSocketsResponse(released_socket_ids=released)

    @rpc
    def RunKernel(
        self, request: node_agent_pb2.RunKernelRequest, context: grpc.ServicerContext
    ) -> node_agent_pb2.RunKernelResponse:
        _require(request.job_id, "job_id")
        _require(list(request.socket_ids), "socket_ids")
        if request.payload_mode == common_pb2.PAYLOAD_MODE_FUNCTIONAL:
            # Computing a kernel needs a small model with real weights; the presets are
            # shapes only. Refuse rather than silently time it.
            raise InvalidRequest(
                "payload_mode: FUNCTIONAL kernels need a model with real weights, which "
                "the model presets do not have; run kernels in TIMING mode"
            )
        members = [m.socket.id for m in sorted(request.group.members, key=lambda m: m.rank)]
        group = request.group_size or len(members) or len(request.socket_ids)
        if members and len(members) != group:
            raise InvalidRequest(f"group_size: {group}, but group lists {len(members)} sockets")
        if members and not set(request.socket_ids) <= set(members):
            raise InvalidRequest(
                f"socket_ids: {sorted(set(request.socket_ids) - set(members))} are not in the group"
            )
        if request.phase == common_pb2.PHASE_SERVE:
            return self._serve(request, group)
        phase = convert.phase(request.phase)
        steps = request.output_tokens if phase is Phase.DECODE and request.output_tokens else 1
        runs = self.agent.run_kernel(
            request.job_id,
            list(request.socket_ids),
            model(request.model).placed(convert.mapping(request.expert_mapping)),
            phase,
            convert.plan(request.fusion_plan),
            request.batch_size or 1,
            convert.positive(request.sequence_length, "sequence_length"),
            group,
            steps,
            request.emulated_start_ns or None,
            members or None,
        )
        return node_agent_pb2.RunKernelResponse(sockets=[convert.kernel_timing(r) for r in runs])

    @rpc
    def RunPasses(
        self, request: node_agent_pb2.NodePassesRequest, context: grpc.ServicerContext
    ) -> node_agent_pb2.NodePassesResponse:
        _require(request.job_id, "job_id")
        _require(list(request.socket_ids), "socket_ids")
        passes = passes_from_proto(request.passes)
        runs = self.agent.run_passes(
            request.job_id,
            list(request.socket_ids),
            model(request.model).placed(None),
            request.group_size or len(request.socket_ids),
            passes,
            request.kv_tokens,
            request.emulated_start_ns or None,
            served_from_proto(request.served, len(passes)),
            bundle_from_proto(request),
        )
        return node_agent_pb2.NodePassesResponse(
            sockets=[
                node_agent_pb2.SocketPasses(
                    socket_id=r.socket_id,
                    duration_ns=r.durations_ns,
                    emulated_start_ns=r.start_ns,
                    emulated_end_ns=r.end_ns,
                )
                for r in runs
            ]
        )

    def _serve(
        self, request: node_agent_pb2.RunKernelRequest, group: int
    ) -> node_agent_pb2.RunKernelResponse:
        """A serve job's steps first_step .. first_step + steps - 1 on the sockets."""
        speculative = None
        if request.HasField("speculative"):
            speculative = SpeculativeSetting.of(**speculative_from_proto(request.speculative))
        serve = ServeRequest(
            model=request.model,
            batch_size=request.batch_size or 1,
            prompt_tokens=convert.positive(request.sequence_length, "sequence_length"),
            output_tokens=convert.positive(request.output_tokens, "output_tokens"),
            sockets=group,
            plan=None
            if request.fusion_plan == common_pb2.FUSION_PLAN_UNSPECIFIED
            else convert.plan(request.fusion_plan),
            speculative=speculative,
            expert_mapping=convert.mapping(request.expert_mapping),
        )
        runs = self.agent.serve(
            request.job_id,
            list(request.socket_ids),
            serve,
            request.first_step,
            convert.positive(request.steps, "steps"),
            request.emulated_start_ns or None,
        )
        return node_agent_pb2.RunKernelResponse(sockets=[convert.kernel_timing(r) for r in runs])

    @rpc
    def Collective(
        self, request: node_agent_pb2.CollectiveRequest, context: grpc.ServicerContext
    ) -> node_agent_pb2.CollectiveResponse:
        _require(request.job_id, "job_id")
        _require(request.tag, "tag")
        members = sorted(request.group.members, key=lambda m: m.rank)
        _require(members, "group.members")
        group = [m.socket.id for m in members]
        peers = {m.socket.id: m.link_address for m in members if m.link_address}
        if peers:
            self.agent.connect(peers)
        root = group[request.root_rank] if request.root_rank < len(group) else None
        if root is None:
            raise InvalidRequest(
                f"root_rank: {request.root_rank} is not a rank of a group of {len(group)}"
            )
        runs = self.agent.collective(
            request.job_id,
            convert.collective_op(request.op),
            request.tag,
            group,
            list(request.socket_ids) or None,
            nbytes=request.size_bytes,
            tensor=request.tensor or None,
            root=root,
            algorithm=request.algorithm or "auto",
            reduce_op=request.reduce_op or "sum",
            start_ns=request.emulated_start_ns or None,
        )
        return node_agent_pb2.CollectiveResponse(
            sockets=[convert.collective_timing(r) for r in runs]
        )

    @rpc
    def RunProgram(
        self, request: node_agent_pb2.RunProgramRequest, context: grpc.ServicerContext
    ) -> node_agent_pb2.RunProgramResponse:
        _require(request.job_id, "job_id")
        _require(list(request.socket_ids), "socket_ids")
        _require(list(request.ops), "ops")
        ops = [program_convert.op_from_proto(op, i) for i, op in enumerate(request.ops)]
        runs = self.agent.run_program(
            request.job_id, list(request.socket_ids), ops, request.emulated_start_ns or None
        )
        return node_agent_pb2.RunProgramResponse(
            sockets=[program_convert.run_to_proto(r) for r in runs]
        )

    @rpc
    def RunTraining(
        self, request: node_agent_pb2.RunTrainingRequest, context: grpc.ServicerContext
    ) -> node_agent_pb2.RunTrainingResponse:
        _require(request.job_id, "job_id")
        _require(list(request.socket_ids), "socket_ids")
        members = sorted(request.group.members, key=lambda m: m.rank)
        _require(members, "group.members")
        peers = {m.socket.id: m.link_address for m in members if m.link_address}
        if peers:
            self.agent.connect(peers, list(request.socket_ids))
        try:
            workload = TrainingWorkload.model_validate(
                training_convert.workload_from_proto(request.training)
            )
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(x) for x in first["loc"])
            raise InvalidRequest(f"training.{where}: {first['msg']}") from None
        reports = self.agent.train(
            request.job_id,
            list(request.socket_ids),
            workload,
            [m.socket.id for m in members],
            platform_name=request.platform,
            steps=request.steps,
            start_ns=request.emulated_start_ns or None,
            checkpoint_dir=request.checkpoint_dir,
            prepare=request.prepare,
        )
        return node_agent_pb2.RunTrainingResponse(
            ranks=[training_convert.report_to_proto(r) for r in reports]
        )

    # ------------------------------------------------------------------ faults

    @rpc
    def Heartbeat(
        self, request: node_agent_pb2.HeartbeatRequest, context: grpc.ServicerContext
    ) -> node_agent_pb2.HeartbeatResponse:
        return node_agent_pb2.HeartbeatResponse(
            node_index=self.agent.node_index,
            incarnation=self.agent.incarnation,
            sockets=[convert.socket_beat(h) for h in self.agent.heartbeat()],
        )

    @rpc
    def AbortJob(
        self, request: node_agent_pb2.AbortJobRequest, context: grpc.ServicerContext
    ) -> node_agent_pb2.AbortJobResponse:
        _require(request.job_id, "job_id")
        _require(list(request.socket_ids), "socket_ids")
        reason = request.reason or "aborted by the orchestrator"
        aborted = self.agent.abort(request.job_id, list(request.socket_ids), reason)
        return node_agent_pb2.AbortJobResponse(aborted_socket_ids=aborted)

    @rpc
    def InjectFault(
        self, request: node_agent_pb2.InjectFaultRequest, context: grpc.ServicerContext
    ) -> node_agent_pb2.InjectFaultResponse:
        if not request.HasField("fault"):
            raise InvalidRequest("fault: required")
        fault = fault_from_proto(request.fault, self.agent.topology)
        if fault.kind is not FaultKind.KILL_AGENT:
            applied = self.agent.inject_fault(fault)
            return node_agent_pb2.InjectFaultResponse(applied=applied)
        if fault.nodes[0] != self.agent.node_index:
            raise InvalidRequest(
                f"fault.node_indices: this is node {self.agent.node_index}'s agent, "
                f"not node {fault.nodes[0]}'s"
            )
        kill = self.on_kill
        if kill is None:
            raise FaultConflict("this agent has no process of its own to end (on_kill unset)")
        log.warning("killed by fault %s: %s", fault.id, fault.describe())
        threading.Timer(KILL_DELAY_S, kill).start()
        return node_agent_pb2.InjectFaultResponse(applied=[fault.describe()])

    @rpc
    def ClearFaults(
        self, request: node_agent_pb2.ClearFaultsRequest, context: grpc.ServicerContext
    ) -> node_agent_pb2.ClearFaultsResponse:
        cleared, restarted = self.agent.clear_faults(request.fault_id)
        return node_agent_pb2.ClearFaultsResponse(
            cleared=[fault_to_proto(f) for f in cleared], restarted_socket_ids=restarted
        )

    @rpc
    def ListFaults(
        self, request: node_agent_pb2.ListNodeFaultsRequest, context: grpc.ServicerContext
    ) -> node_agent_pb2.ListNodeFaultsResponse:
        return node_agent_pb2.ListNodeFaultsResponse(
            faults=[fault_to_proto(f) for f in self.agent.faults()]
        )


def _require(value: object, field: str) -> None:
    if not value:
        raise InvalidRequest(f"{field}: required")
