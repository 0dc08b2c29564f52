"""CoE inference jobs on the rack: what is refused up front, the run (the serving
engine's programs on the node agents, through the NodeGateway), and its result
(CoeResult, the engine's report; a bundle too big for its platform fails the job with
it).

A job's sockets split into replicas of `tensor_parallel` sockets, each inside one node;
the engine (workloads/coe/engine.py) sends each batch to one replica as one program, and the
replica's sockets run it together. A replica whose socket or agent dies is lost alone:
its requests are re-routed to the others. A job on another platform (a DGX) runs on
socket actors loaded with that platform's spec for the job's duration.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rdurack.errors import InvalidRequest, LinkFailure, OneProcessPerSocket, UnknownName
from rdurack.orchestrator.gateway import NodeGateway
from rdurack.orchestrator.jobs import JobSpec
from rdurack.orchestrator.kinds.contract import JobRun, KindContext, by_node, workload_of
from rdurack.orchestrator.kinds.platforms import job_platform
from rdurack.orchestrator.results import CoeResult
from rdurack.rack.kernels import FusionPlan
from rdurack.rack.models import ModelSpec
from rdurack.rack.spec import PlatformSpec
from rdurack.rack.topology import SocketId
from rdurack.telemetry import names
from rdurack.workloads.coe.engine import CoeEngine, check_functional
from rdurack.workloads.coe.report import CoeOutOfMemory, CoeReport, ReplicaFailed
from rdurack.workloads.coe.router import Router
from rdurack.workloads.coe.spec import CoeWorkload, build_requests
from rdurack.workloads.program import Op, ProgramRun, combine

FIELD = "spec.coe_inference"


class CoeKind:
    """CoE inference jobs on the rack of `context`."""

    def __init__(self, context: KindContext) -> None:
        self.context = context

    def validate(self, spec: JobSpec) -> None:
        """Refuse, before storing, a CoE job that could never run."""
        _validate(
            workload_of(spec, CoeWorkload),
            self.context.platform,
            spec.platform,
            spec.payload_mode == "functional",
            self.context.models,
        )
        self.context.scheduler.check(spec)

    def attributes(self, spec: JobSpec) -> dict[str, str]:
        return {names.ATTR_JOB_MODEL: workload_of(spec, CoeWorkload).expert_model}

    def execute(self, job: JobRun) -> None:
        """Serve the job's requests on its replicas; progress at `progress_chunks` marks."""
        start = job.start()
        w = workload_of(job.job.spec, CoeWorkload)
        platform = job_platform(self.context.platform, job.job.spec.platform)
        replicas = replica_groups(job.job.sockets, w.tensor_parallel or platform.node.sockets)
        job.run.replicas = replicas
        router = Router.for_catalog(w.num_experts)
        requests = build_requests(w, router)
        marks = {
            round(len(requests) * k / self.context.progress_chunks)
            for k in range(1, self.context.progress_chunks + 1)
        }

        def progress(done: int, total: int, emulated_ns: int) -> None:
            job.check()
            if done in marks or done == total:
                job.progress(done / total, f"{done} of {total} requests", start + emulated_ns)

        engine = CoeEngine(
            w,
            platform,
            self.context.models,
            router.names,
            GatewayReplicas(job.gateway, job.job.id, replicas, job.run.lost.get),
            range(len(replicas)),
            functional=job.job.spec.payload_mode == "functional",
            start_ns=start,
            progress=progress,
        )
        try:
            report = engine.run(requests)
        except CoeOutOfMemory as e:
            job.finish(_result(e.report), error=e.report.oom_reason)
            return
        job.finish(_result(report), end_ns=start + round(report.emulated_s * 1e9))


def _result(report: CoeReport) -> CoeResult:
    return CoeResult.model_validate(report.model_dump())


def _validate(
    w: CoeWorkload, rack: PlatformSpec, platform_name: str, functional: bool,
    models: dict[str, ModelSpec],
) -> None:  # fmt: skip
    platform = job_platform(rack, platform_name)
    node = rack.node.sockets
    tp = w.tensor_parallel or platform.node.sockets
    if tp > node:
        raise InvalidRequest(
            f"{FIELD}.tensor_parallel: {tp} > {node}: a replica's TP group stays in one node"
        )
    if w.num_sockets < tp or w.num_sockets % tp:
        raise OneProcessPerSocket(
            f"{FIELD}.num_sockets: {w.num_sockets} sockets cannot host replicas of "
            f"tensor_parallel {tp}: some socket would run two TP ranks, two processes on one "
            f"RDU. Each rank needs a socket of its own (one process per socket); use a "
            f"multiple of {tp} sockets, or a smaller tensor_parallel"
        )
    if w.num_sockets > node and w.num_sockets % node:
        raise InvalidRequest(
            f"{FIELD}.num_sockets: {w.num_sockets}: a job wider than a node takes whole nodes "
            f"(a multiple of {node})"
        )
    if platform is not rack and w.num_sockets != platform.node.sockets:
        raise InvalidRequest(
            f"{FIELD}.num_sockets: a {platform.name} job runs on one emulated node of "
            f"{platform.node.sockets} sockets, not {w.num_sockets}"
        )
    fusion = platform.socket.kernels.dataflow_fusion
    if w.decode_plan not in (None, FusionPlan.UNFUSED) and not fusion:
        raise InvalidRequest(
            f"{FIELD}.decode_plan: {w.decode_plan.value}: a {platform.name} socket runs unfused "
            "kernels only (no dataflow fusion); leave it unset or use unfused"
        )
    for field, name in (("expert_model", w.expert_model), ("router_model", w.router_model)):
        if name not in models:
            raise UnknownName(f"model ({FIELD}.{field})", name, sorted(models))
    if functional:
        check_functional(w)
    router = Router.for_catalog(w.num_experts)
    unknown = sorted(set(w.pinned_experts) - set(router.names))
    if unknown:
        raise UnknownName(f"expert ({FIELD}.pinned_experts)", unknown[0], router.names[:10])
    if w.reserved_hbm_bytes and w.reserved_hbm_bytes > platform.socket.hbm.capacity_bytes:
        raise InvalidRequest(
            f"{FIELD}.reserved_hbm_bytes: {w.reserved_hbm_bytes:,} bytes per socket > a "
            f"{platform.name} socket's HBM ({platform.socket.hbm.capacity_bytes:,})"
        )
    build_requests(w, router)  # hints and routing: fail now, not after queueing


def replica_groups(sockets: Sequence[str], tp: int) -> list[tuple[int, list[str]]]:
    """(node, TP group) of each replica: a node's sockets in order, `tp` at a time."""
    ordered = sorted(sockets, key=lambda s: (SocketId.parse(s).node, SocketId.parse(s).index))
    return [
        (node, ids[i : i + tp])
        for node, ids in sorted(by_node(ordered).items())
        for i in range(0, len(ids), tp)
    ]


class GatewayReplicas:
    """The engine's NodeExecutor on the rack: replica i is a TP group of one node.

    A replica whose socket or agent died fails with ReplicaFailed (the engine re-routes
    its requests): when its program fails on a link or a dead socket, or at once when
    `lost(replica)` says why (the health watcher saw one of its sockets die)."""

    def __init__(
        self,
        gateway: NodeGateway,
        job_id: str,
        replicas: list[tuple[int, list[str]]],
        lost: Callable[[int], str | None] = lambda replica: None,
    ) -> None:
        self.gateway = gateway
        self.job_id = job_id
        self.replicas = replicas
        self.lost = lost

    def run(self, replica: int, ops: Sequence[Op], start_ns: int) -> ProgramRun:
        node, sockets = self.replicas[replica]
        why = self.lost(replica)
        if why is not None:
            raise ReplicaFailed(replica, why)
        try:
            runs = self.gateway.run_program(node, self.job_id, sockets, ops, start_ns)
        except LinkFailure as e:
            raise ReplicaFailed(replica, self.lost(replica) or str(e)) from None
        return combine(runs)
