"""The orchestrator's NodeGateway over gRPC: one NodeAgentService per rack node."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import grpc

from rdurack.api.server import channel
from rdurack.errors import InvalidRequest, LinkFailure, OutOfMemory, RdurackError
from rdurack.orchestrator.gateway import (
    KernelRun,
    NodeBeat,
    NodeView,
    PassesRun,
    SocketBeat,
    SocketView,
    TierView,
)
from rdurack.orchestrator.jobs import EndpointWorkload, KernelWorkload
from rdurack.rack.faults import Fault, FaultConflict
from rdurack.rack.spec import PlatformSpec
from rdurack.rack.topology import Topology
from rdurack.security.tls import TlsConfig
from rdurack.telemetry.served import PassesServed
from rdurack.v1 import fault_pb2, node_agent_pb2, node_agent_pb2_grpc, rack_pb2
from rdurack.wire import programs as program_convert
from rdurack.wire import rack as convert
from rdurack.wire import training as training_convert
from rdurack.wire.faults import fault_from_proto, fault_to_proto
from rdurack.wire.jobs import speculative_to_proto
from rdurack.wire.passes import bundle_to_proto, pass_to_proto
from rdurack.wire.served import served_to_proto
from rdurack.workloads.program import Op, ProgramRun
from rdurack.workloads.serving.stream.pricing import Pass
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
# Fault calls: FAILED_PRECONDITION is a conflict with a fault in force, said as such.
FAULT_RETRYABLE = RETRYABLE - {grpc.StatusCode.FAILED_PRECONDITION}
BEATS = {
    rack_pb2.SOCKET_HEALTH_HEALTHY: "healthy",
    rack_pb2.SOCKET_HEALTH_FAILED: "dead",
}
# A restarted agent is noticed as soon as the channel reconnects: gRPC's default backoff
# between attempts grows to 120 s, so an agent down for a minute would be found back only
# minutes later. Capped at 1 s (loopback or in-cluster: a connection attempt is cheap).
RECONNECT_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.min_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
# Wall seconds an abort or a fault call may take (the agent does them on the actors'
# control threads: milliseconds, but a restarted socket actor takes a second or two).
CONTROL_TIMEOUT_S = 30.0
# Wall seconds a registration waits for the node's previous agent to answer before the
# new one takes the node (a heartbeat answers in milliseconds when the agent is alive).
REGISTER_PROBE_S = 2.0
AWAITING = "no node agent has joined as this node yet (rdu join)"


class GrpcNodeGateway:
    """`agents[i]` is the address of node i's agent; an empty one (or a list shorter
    than the platform's nodes) is a node whose agent has not joined yet (`register`,
    `rdu join`). With `tls`, every channel is mutual TLS as a rack member (the agents
    accept nothing else). `platform`: the rack's, to validate the faults agents report
    (needed by `clear_faults` and `faults`) and to count its nodes."""

    def __init__(
        self,
        agents: Sequence[str],
        timeout_s: float = 120.0,
        probe_s: float = 5.0,
        tls: TlsConfig | None = None,
        platform: PlatformSpec | None = None,
    ):
        count = max(len(agents), platform.nodes_total if platform is not None else 0)
        if count == 0:
            raise InvalidRequest("at least one node agent address is needed")
        if platform is not None and len(agents) > platform.nodes_total:
            raise InvalidRequest(
                f"{len(agents)} node agent addresses for {platform.nodes_total} nodes of "
                f"{platform.name}"
            )
        self.addresses = [*agents, *[""] * (count - len(agents))]
        self.timeout_s = timeout_s
        self.probe_s = probe_s
        self._tls = tls
        self._topology = Topology(platform) if platform is not None else None
        self._channels: list[grpc.Channel | None] = [self._channel(a) for a in self.addresses]
        self._stubs = [
            None if c is None else node_agent_pb2_grpc.NodeAgentServiceStub(c)
            for c in self._channels
        ]
        self._registering = threading.Lock()

    def _channel(self, address: str) -> grpc.Channel | None:
        if not address:
            return None
        return channel(address, tls=self._tls, rack=True, options=RECONNECT_OPTIONS)

    def close(self) -> None:
        for c in self._channels:
            if c is not None:
                c.close()

    def register(self, node: int, address: str) -> bool:
        """Node `node`'s agent is at `address` from now on (an agent that joined from
        another host); whether that changed anything. Refused (RdurackError, on the wire
        FAILED_PRECONDITION) while another agent serves the node and answers its
        heartbeat: two agents claiming one node is a mistake to say, not to settle by
        the last one."""
        if not 0 <= node < len(self.addresses):
            raise InvalidRequest(f"node {node}: the rack has nodes 0..{len(self.addresses) - 1}")
        if not address or ":" not in address:
            raise InvalidRequest(f"agent_address {address!r}: expected host:port")
        with self._registering:  # one registration at a time: the check, then the swap
            old = self.addresses[node]
            if old == address:
                return False
            if old:
                try:
                    self.heartbeat(node, REGISTER_PROBE_S)
                except RdurackError:
                    pass  # the old agent is gone: the new one takes the node
                else:
                    raise RdurackError(
                        f"node {node} is served by the agent at {old}, which answers; "
                        f"stop it before another joins as node {node}"
                    )
            new = self._channel(address)
            assert new is not None
            # Stub before address: a reader never sees the new address with the old stub.
            previous = self._channels[node]
            self._channels[node] = new
            self._stubs[node] = node_agent_pb2_grpc.NodeAgentServiceStub(new)
            self.addresses[node] = address
        if previous is not None:
            previous.close()
        return True

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
        stub = self._stubs[node]
        if stub is None:
            raise LinkFailure(f"node {node}: {what}: {AWAITING}")
        try:
            return getattr(stub, method)(request, timeout=timeout_s)
        except grpc.RpcError as e:
            code = e.code() if hasattr(e, "code") else grpc.StatusCode.UNKNOWN
            details = e.details() if hasattr(e, "details") else str(e)
            message = f"node {node} ({self.addresses[node]}): {what}: {details}"
            oom = OutOfMemory.from_message(details or "")
            if code == grpc.StatusCode.RESOURCE_EXHAUSTED and oom is not None:
                raise oom from None  # the socket's own error: tier, asked and free
            if code in retryable:
                raise LinkFailure(message) from None
            if retryable is FAULT_RETRYABLE and code == grpc.StatusCode.FAILED_PRECONDITION:
                raise FaultConflict(message) from None
            if retryable is FAULT_RETRYABLE and code == grpc.StatusCode.INVALID_ARGUMENT:
                raise InvalidRequest(message) from None
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
        first_step: int = 0,
        group: Sequence[str] = (),
    ) -> list[KernelRun]:
        request = node_agent_pb2.RunKernelRequest(
            job_id=job_id,
            socket_ids=list(sockets),
            model=workload.model,
            phase=convert.job_phase_to_proto(workload.phase),
            fusion_plan=convert.plan_to_proto(workload.fusion_plan),
            sequence_length=workload.sequence_length,
            batch_size=workload.batch_size,
            # Decode: this call's tokens; serve: the job's (its steps are said apart).
            output_tokens=workload.output_tokens if workload.serves else steps,
            emulated_start_ns=start_ns,
            group=node_agent_pb2.CollectiveGroup(
                members=[
                    node_agent_pb2.GroupMember(socket=convert.socket_ref(sid), rank=rank)
                    for rank, sid in enumerate(group)
                ]
            ),
            group_size=workload.num_sockets,
            first_step=first_step,
            steps=steps,
            speculative=speculative_to_proto(workload.speculative),
            expert_mapping=convert.mapping_to_proto(workload.expert_mapping),
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
                t.flops,
                t.launch_ns,
                t.collective_ns,
            )
            for t in reply.sockets
        ]

    def run_passes(
        self,
        node: int,
        job_id: str,
        sockets: Sequence[str],
        workload: EndpointWorkload,
        passes: Sequence[Pass],
        kv_tokens: int,
        start_ns: int,
        served: PassesServed | None = None,
    ) -> list[PassesRun]:
        request = node_agent_pb2.NodePassesRequest(
            job_id=job_id,
            socket_ids=list(sockets),
            model=workload.model,
            group_size=workload.num_sockets,
            emulated_start_ns=start_ns,
            passes=[pass_to_proto(p) for p in passes],
            kv_tokens=kv_tokens,
            served=None if served is None else served_to_proto(served),
            bundle=bundle_to_proto(workload.bundle),
        )
        reply = self._call(node, f"passes of {job_id}", "RunPasses", request, self.timeout_s)
        assert isinstance(reply, node_agent_pb2.NodePassesResponse)
        return [
            PassesRun(s.socket_id, s.emulated_start_ns, s.emulated_end_ns, tuple(s.duration_ns))
            for s in reply.sockets
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
        prepare: bool = False,
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
            prepare=prepare,
        )
        timeout_s = workload.call_timeout_s(self.timeout_s, prepare)
        what = f"starting the ranks of {job_id}" if prepare else f"training of {job_id}"
        reply = self._call(node, what, "RunTraining", request, timeout_s, WORK_RETRYABLE)
        assert isinstance(reply, node_agent_pb2.RunTrainingResponse)
        return [training_convert.report_from_proto(r) for r in reply.ranks]

    # ------------------------------------------------------------------ faults

    def heartbeat(self, node: int, timeout_s: float) -> NodeBeat:
        reply = self._call(
            node, "heartbeat", "Heartbeat", node_agent_pb2.HeartbeatRequest(), timeout_s
        )
        assert isinstance(reply, node_agent_pb2.HeartbeatResponse)
        return NodeBeat(
            reply.node_index,
            reply.incarnation,
            tuple(
                SocketBeat(
                    b.socket_id,
                    BEATS.get(b.health, "unresponsive"),  # type: ignore[arg-type]
                    job_id=b.current_job_id,
                    incarnation=b.incarnation,
                    clock_ns=b.emulated_clock_ns,
                    slowdown=b.slowdown,
                    error=b.error,
                )
                for b in reply.sockets
            ),
        )

    def abort(self, node: int, job_id: str, sockets: Sequence[str], reason: str) -> None:
        request = node_agent_pb2.AbortJobRequest(
            job_id=job_id, socket_ids=list(sockets), reason=reason
        )
        self._call(node, f"abort {job_id}", "AbortJob", request, CONTROL_TIMEOUT_S)

    def inject_fault(self, node: int, fault: Fault) -> None:
        request = node_agent_pb2.InjectFaultRequest(fault=fault_to_proto(fault))
        self._call(
            node, f"fault {fault.id}", "InjectFault", request, CONTROL_TIMEOUT_S, FAULT_RETRYABLE
        )

    def clear_faults(self, node: int, fault_id: str) -> tuple[list[Fault], list[str]]:
        request = node_agent_pb2.ClearFaultsRequest(fault_id=fault_id)
        reply = self._call(node, "heal", "ClearFaults", request, CONTROL_TIMEOUT_S, FAULT_RETRYABLE)
        assert isinstance(reply, node_agent_pb2.ClearFaultsResponse)
        return [self._fault(f) for f in reply.cleared], list(reply.restarted_socket_ids)

    def faults(self, node: int) -> list[Fault]:
        request = node_agent_pb2.ListNodeFaultsRequest()
        reply = self._call(node, "faults", "ListFaults", request, self.probe_s)
        assert isinstance(reply, node_agent_pb2.ListNodeFaultsResponse)
        return [self._fault(f) for f in reply.faults]

    def _fault(self, p: fault_pb2.Fault) -> Fault:
        if self._topology is None:
            raise InvalidRequest("GrpcNodeGateway: faults need the platform (platform=...)")
        return fault_from_proto(p, self._topology)


def _node_view(node: rack_pb2.NodeStatus, address: str) -> NodeView:
    sockets = tuple(
        SocketView(
            socket_id=s.ref.id,
            node=s.ref.node_index,
            healthy=s.health == rack_pb2.SOCKET_HEALTH_HEALTHY,
            job_id=s.current_job_id,
            clock_ns=s.emulated_clock_ns,
            link_address=s.link_address,
            slowdown=s.slowdown or 1.0,
            incarnation=s.incarnation,
            reason=s.health_reason,
            dead=s.health == rack_pb2.SOCKET_HEALTH_FAILED,
            tiers={
                TIER_NAMES[t.tier]: TierView(t.used_bytes, t.peak_bytes, t.capacity_bytes)
                for t in s.tiers
                if t.tier in TIER_NAMES
            },
        )
        for s in node.sockets
    )
    return NodeView(node.index, address, node.healthy, sockets)
