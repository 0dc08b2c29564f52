"""The orchestrator's NodeGateway over gRPC: one NodeAgentService per rack node."""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from rdurack.orchestrator.gateway import KernelRun, NodeView, SocketView, TierView
from rdurack.orchestrator.jobs import KernelWorkload
from rdurack.rack.errors import InvalidRequest, LinkFailure, OutOfMemory, RdurackError
from rdurack.security.tls import TlsConfig
from rdurack.services import convert, program_convert, training_convert
from rdurack.services.grpc_server import channel
from rdurack.v1 import node_agent_pb2, node_agent_pb2_grpc, rack_pb2
from rdurack.workloads.program import Op, ProgramRun
from rdurack.workloads.training.job import RankReport, TrainingWorkload

TIER_NAMES = {v: k.value for k, v in convert.TIERS.items()}
# Agent refusals the orchestrator retries later (busy, unreachable); others fail the job.
RETRYABLE = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.ABORTED,
}
# While a job runs, FAILED_PRECONDITION is the job's own failure (a straggler past the
# timeout), not a busy socket: retrying would fail the same way.
WORK_RETRYABLE = RETRYABLE - {grpc.StatusCode.FAILED_PRECONDITION}


class GrpcNodeGateway:
    """`agents[i]` is the address of node i's agent. With `tls`, every channel is mutual
    TLS as a rack member (the agents accept nothing else)."""

    def __init__(
        self,
        agents: Sequence[str],
        timeout_s: float = 120.0,
        probe_s: float = 5.0,
        tls: TlsConfig | None = None,
    ):
        if not agents:
            raise InvalidRequest("at least one node agent address is needed")
        self.addresses = list(agents)
        self.timeout_s = timeout_s
        self.probe_s = probe_s
        self._channels = [channel(a, tls=tls, rack=True) for a in self.addresses]
        self._stubs = [node_agent_pb2_grpc.NodeAgentServiceStub(c) for c in self._channels]

    def close(self) -> None:
        for c in self._channels:
            c.close()

    def _call(
        self,
        node: int,
        what: str,
        method: str,
        request: object,
        timeout_s: float,
        retryable: frozenset[grpc.StatusCode] | set[grpc.StatusCode] = RETRYABLE,
    ) -> object:
        if not 0 <= node < len(self._stubs):
            raise InvalidRequest(f"no agent for node {node}")
        try:
            return getattr(self._stubs[node], method)(request, timeout=timeout_s)
        except grpc.RpcError as e:
            code = e.code() if hasattr(e, "code") else grpc.StatusCode.UNKNOWN
            details = e.details() if hasattr(e, "details") else str(e)
            message = f"node {node} ({self.addresses[node]}): {what}: {details}"
            oom = OutOfMemory.from_message(details or "")
            if code == grpc.StatusCode.RESOURCE_EXHAUSTED and oom is not None:
                raise oom from None  # the socket's own error: tier, asked and free
            if code in retryable:
                raise LinkFailure(message) from None
            raise RdurackError(message) from None

    def nodes(self) -> list[NodeView]:
        views = []
        for i in range(len(self._stubs)):
            try:
                reply = self._call(
                    i, "status", "GetNode", node_agent_pb2.GetNodeRequest(), self.probe_s
                )
            except RdurackError as e:
                views.append(NodeView(i, self.addresses[i], False, (), str(e)))
                continue
            assert isinstance(reply, node_agent_pb2.GetNodeResponse)
            views.append(_node_view(reply.node, self.addresses[i]))
        return views

    def reserve(self, node: int, job_id: str, sockets: Sequence[str]) -> None:
        request = node_agent_pb2.ReserveSocketsRequest(job_id=job_id, socket_ids=list(sockets))
        self._call(node, f"reserve for {job_id}", "ReserveSockets", request, self.timeout_s)

    def release(self, node: int, job_id: str, sockets: Sequence[str]) -> None:
        request = node_agent_pb2.ReleaseSocketsRequest(job_id=job_id, socket_ids=list(sockets))
        self._call(node, f"release for {job_id}", "ReleaseSockets", request, self.timeout_s)

    def run_kernel(
        self,
        node: int,
        job_id: str,
        sockets: Sequence[str],
        workload: KernelWorkload,
        steps: int,
        start_ns: int,
    ) -> list[KernelRun]:
        request = node_agent_pb2.RunKernelRequest(
            job_id=job_id,
            socket_ids=list(sockets),
            model=workload.model,
            phase=convert.PHASE_TO_PROTO[workload.phase],
            fusion_plan=convert.PLAN_TO_PROTO[workload.fusion_plan],
            sequence_length=workload.sequence_length,
            batch_size=workload.batch_size,
            output_tokens=steps,
            emulated_start_ns=start_ns,
            group_size=workload.num_sockets,
        )
        reply = self._call(node, f"kernel of {job_id}", "RunKernel", request, self.timeout_s)
        assert isinstance(reply, node_agent_pb2.RunKernelResponse)
        return [
            KernelRun(
                t.socket_id,
                t.emulated_start_ns,
                t.emulated_end_ns,
                t.kernel_calls,
                t.hbm_traffic_bytes,
            )
            for t in reply.sockets
        ]

    def run_program(
        self, node: int, job_id: str, sockets: Sequence[str], ops: Sequence[Op], start_ns: int
    ) -> list[ProgramRun]:
        request = node_agent_pb2.RunProgramRequest(
            job_id=job_id,
            socket_ids=list(sockets),
            ops=[program_convert.op_to_proto(op) for op in ops],
            emulated_start_ns=start_ns,
        )
        reply = self._call(
            node, f"program of {job_id}", "RunProgram", request, self.timeout_s, WORK_RETRYABLE
        )
        assert isinstance(reply, node_agent_pb2.RunProgramResponse)
        return [program_convert.run_from_proto(t, ops) for t in reply.sockets]

    def train(
        self,
        node: int,
        job_id: str,
        sockets: Sequence[str],
        workload: TrainingWorkload,
        group: Sequence[tuple[str, str]],
        *,
        platform_name: str = "",
        steps: int = 0,
        start_ns: int = 0,
        checkpoint_dir: str = "",
    ) -> list[RankReport]:
        request = node_agent_pb2.RunTrainingRequest(
            job_id=job_id,
            socket_ids=list(sockets),
            group=node_agent_pb2.CollectiveGroup(
                members=[
                    node_agent_pb2.GroupMember(
                        socket=convert.socket_ref(sid), rank=rank, link_address=address
                    )
                    for rank, (sid, address) in enumerate(group)
                ]
            ),
            training=training_convert.workload_to_proto(workload),
            platform=platform_name,
            steps=steps,
            emulated_start_ns=start_ns,
            checkpoint_dir=checkpoint_dir,
        )
        reply = self._call(
            node, f"training of {job_id}", "RunTraining", request, self.timeout_s, WORK_RETRYABLE
        )
        assert isinstance(reply, node_agent_pb2.RunTrainingResponse)
        return [training_convert.report_from_proto(r) for r in reply.ranks]


def _node_view(node: rack_pb2.NodeStatus, address: str) -> NodeView:
    sockets = tuple(
        SocketView(
            socket_id=s.ref.id,
            node=s.ref.node_index,
            healthy=s.health == rack_pb2.SOCKET_HEALTH_HEALTHY,
            job_id=s.current_job_id,
            clock_ns=s.emulated_clock_ns,
            link_address=s.link_address,
            tiers={
                TIER_NAMES[t.tier]: TierView(t.used_bytes, t.peak_bytes, t.capacity_bytes)
                for t in s.tiers
                if t.tier in TIER_NAMES
            },
        )
        for s in node.sockets
    )
    return NodeView(node.index, address, node.healthy, sockets)
