"""What the tests of rdurack/traces/ share: a job traced as the rack traces it, into
trace files (a TracerProvider per service writing its own file, a CoE batch on two
sockets with its control-plane spans), hand-made hardware spans of training jobs, and
paper figures of every kind."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import Link, SpanKind

from rdurack.telemetry import names
from rdurack.telemetry.file_export import JsonlSpanExporter
from rdurack.traces.spans import Span
from rdurack.workloads.paper.figure import Figure

WALL0 = 1_700_000_000_000_000_000  # ns: the wall time a job reserved its sockets
EMU0 = 5_000_000_000  # ns: the sockets' emulated clock when the job started (not 0)
SHARE = 1_684_000_000  # bytes: one expert's share per socket
TRACE_ID = "1" * 32  # of hand-made spans


class Services:
    """A TracerProvider per service (as every process has its own), each writing its
    own trace file into one directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.providers: dict[str, TracerProvider] = {}

    def tracer(self, service: str) -> trace.Tracer:
        if service not in self.providers:
            p = TracerProvider(resource=Resource.create({names.SERVICE_NAME: service}))
            p.add_span_processor(SimpleSpanProcessor(JsonlSpanExporter(self.directory, service)))
            self.providers[service] = p
        return self.providers[service].get_tracer("test")

    def close(self) -> None:
        for p in self.providers.values():
            p.shutdown()


@dataclass(frozen=True)
class Op:
    """One hardware operation of the synthetic job: on every socket, from emulated
    EMU0 + start_ns for duration_ns."""

    name: str
    start_ns: int
    duration_ns: int
    attributes: dict[str, Any]


# A CoE batch on two sockets: deploy (3 experts, nothing pinned), router, expert a
# switched in, prefill, expert b switched in evicting a, decode, a hit on b.
OPS = [
    Op(names.SPAN_DEPLOY, 0, 0, {names.ATTR_EXPERTS: 3, names.ATTR_BYTES: 0,
                                 names.ATTR_PLATFORM: "sn40l-rack16"}),
    Op(names.SPAN_KERNEL, 0, 40_000_000, {names.ATTR_KERNEL_ROLE: "router"}),
    Op(names.SPAN_EXPERT_SWITCH, 40_000_000, 13_000_000,
       {names.ATTR_EXPERT: "a", names.ATTR_SWITCH_HIT: False, names.ATTR_BYTES: SHARE,
        names.ATTR_EVICTED: []}),
    Op(names.SPAN_KERNEL, 53_000_000, 7_000_000, {names.ATTR_KERNEL_ROLE: "prefill"}),
    Op(names.SPAN_EXPERT_SWITCH, 60_000_000, 13_000_000,
       {names.ATTR_EXPERT: "b", names.ATTR_SWITCH_HIT: False, names.ATTR_BYTES: SHARE,
        names.ATTR_EVICTED: ["a"]}),
    Op(names.SPAN_KERNEL, 73_000_000, 20_000_000, {names.ATTR_KERNEL_ROLE: "decode"}),
    Op(names.SPAN_EXPERT_SWITCH, 93_000_000, 0,
       {names.ATTR_EXPERT: "b", names.ATTR_SWITCH_HIT: True, names.ATTR_BYTES: 0,
        names.ATTR_EVICTED: []}),
]  # fmt: skip
SOCKETS = ["rdu-n0-s0", "rdu-n0-s1"]


def write_job(services: Services, job_id: str, *, round_is_parent: bool = False) -> None:
    """A job as the rack traces it: a scheduling round, the job span (linked to the
    round, or its child), an RPC pair, the node agent's span, the sockets' operations
    stamped at WALL0 + emulated offset."""
    orch = services.tracer("rdurack-orchestrator")
    agent = services.tracer("rdurack-node-agent-0")
    round_span = orch.start_span(
        names.SPAN_SCHEDULE, start_time=WALL0 - 2_000_000, attributes={names.ATTR_JOBS_PLACED: 1}
    )
    round_span.end(end_time=WALL0 - 1_000_000)
    round_ctx = trace.set_span_in_context(round_span)
    job = orch.start_span(
        names.SPAN_JOB,
        context=round_ctx if round_is_parent else None,
        links=[] if round_is_parent else [Link(round_span.get_span_context())],
        start_time=WALL0 - 500_000,
        attributes={names.ATTR_JOB_ID: job_id, names.ATTR_JOB_SOCKETS: SOCKETS},
    )
    job_ctx = trace.set_span_in_context(job)
    client = orch.start_span(
        "rdurack.v1.NodeAgentService/RunProgram",
        context=job_ctx,
        kind=SpanKind.CLIENT,
        start_time=WALL0 - 400_000,
        attributes={names.RPC_SYSTEM: "grpc"},
    )
    server = agent.start_span(
        "rdurack.v1.NodeAgentService/RunProgram",
        context=trace.set_span_in_context(client),
        kind=SpanKind.SERVER,
        start_time=WALL0 - 300_000,
        attributes={names.RPC_SYSTEM: "grpc"},
    )
    node = agent.start_span(
        names.SPAN_NODE_PROGRAM,
        context=trace.set_span_in_context(server),
        start_time=WALL0 - 200_000,
        attributes={names.ATTR_JOB_ID: job_id, names.ATTR_SOCKETS: SOCKETS},
    )
    node_ctx = trace.set_span_in_context(node)
    for sid in SOCKETS:
        tracer = services.tracer(sid)
        for op in OPS:
            span = tracer.start_span(
                op.name,
                context=node_ctx,
                start_time=WALL0 + op.start_ns,
                attributes={
                    names.ATTR_SOCKET: sid,
                    names.ATTR_JOB_ID: job_id,
                    names.ATTR_EMULATED_START_NS: EMU0 + op.start_ns,
                    names.ATTR_EMULATED_NS: op.duration_ns,
                    names.ATTR_JOB_MODEL: "llama2-7b",
                    **op.attributes,
                },
            )
            span.end(end_time=WALL0 + op.start_ns + op.duration_ns)
    end = WALL0 + OPS[-1].start_ns + OPS[-1].duration_ns
    for s in (node, server, client):
        s.end(end_time=end + 100_000)
    job.end(end_time=end + 200_000)


def hardware_span(
    name: str,
    sid: str,
    span_id: str,
    start_ns: int,
    duration_ns: int,
    attributes: dict[str, Any] | None = None,
) -> Span:
    """A socket's operation as read back from a trace file: on the emulated timeline
    from `start_ns` for `duration_ns` (its wall stamps do not matter here)."""
    emulated = {names.ATTR_EMULATED_START_NS: start_ns, names.ATTR_EMULATED_NS: duration_ns}
    return Span(TRACE_ID, span_id, None, name, sid, 1, 0, 1,
                attributes={**emulated, **(attributes or {})})  # fmt: skip


def reported_use(sid: str, start_ns: int, duration_ns: int, **used: int) -> Span:
    """A kernel span of socket `sid` reporting its tiers' use when it ended (sram=,
    hbm=, ddr= bytes), on the platform sn40l-rack16."""
    attributes: dict[str, Any] = {names.ATTR_PLATFORM: "sn40l-rack16"}
    attributes |= {f"rdurack.memory.{tier}.used_bytes": n for tier, n in used.items()}
    span_id = f"{start_ns:08x}{int(sid[-1]):08x}"
    return hardware_span(names.SPAN_KERNEL, sid, span_id, start_ns, duration_ns, attributes)


def step_span(sid: str, step: int, loss: float | None = None, **peaks: int) -> Span:
    """A rank's `rdu.train.step` span: step s from emulated 100 s for 100 ns, with the
    step's peak bytes per tier (sram=, hbm=, ddr=)."""
    attributes: dict[str, Any] = {
        names.ATTR_STEP: step,
        **{names.ATTR_PEAK_BYTES.format(tier=t): n for t, n in peaks.items()},
    }
    if loss is not None:
        attributes[names.ATTR_LOSS] = loss
    span_id = f"{step:08x}{int(sid[-1]):08x}"
    return hardware_span(names.SPAN_TRAIN_STEP, sid, span_id, 100 * step, 100, attributes)


def stage_span(sid: str, name: str, start: int, hbm: int, accuracy: float | None) -> Span:
    """A rank's `rdu.train.stage` span of 25 steps, peaking at `hbm` bytes of HBM and
    1000 - `hbm` of DDR; a grow stage is ended by the movement metric."""
    attributes: dict[str, Any] = {
        names.ATTR_TRAIN_STAGE: name,
        names.ATTR_STEPS: 25,
        names.ATTR_TRAIN_CONVERGED: name.startswith("grow"),
        "rdurack.memory.hbm.peak_bytes": hbm,
        "rdurack.memory.ddr.peak_bytes": 1000 - hbm,
    }
    if accuracy is not None:
        attributes[names.ATTR_TRAIN_ACCURACY] = accuracy
    return hardware_span(names.SPAN_TRAIN_STAGE, sid, f"{start:016x}", start, 10, attributes)


def progressive_stages() -> list[Span]:
    """Two ranks' stage spans of a progressive job, out of order: shrinking block 0
    (rank 0 measured 90%), then growing it back (95%)."""
    return [
        stage_span("rdu-n0-s1", "grow block 0", 200, 400, None),
        stage_span("rdu-n0-s0", "shrink block 0", 100, 500, 0.9),
        stage_span("rdu-n0-s1", "shrink block 0", 100, 600, None),
        stage_span("rdu-n0-s0", "grow block 0", 200, 300, 0.95),
    ]


# A figure of each kind: a value reproduced, a fitted value missed, a range, a yes/no
# missed.
PAPER_FIGURES = [
    Figure("v", "a value", "PAPER Sec. IV: x", "x", 10.0, 10.5),
    Figure("m", "a miss", "PAPER Sec. VI", "GB", 10.0, 20.0, fitted=True),
    Figure("r", "a range", "KL Table 1", "x", (1.0, 3.0), (1.5, 2.0)),
    Figure("b", "a yes/no", "PAPER abstract", "", True, False),
]
