"""A socket's hardware spans: each operation on the socket's emulated timeline
(docs/tracing.md, "Two clocks").

A span is stamped at the wall time the job reserved the socket plus the emulated time
since the job's first operation on it, so its wall duration is its emulated duration.
What each operation's span says lives here too: a kernel's, a serve job's prefill and
decode's, and a program op's attributes (program ops recorded as they run), what a
collective sent (`Traffic`, which the collective engine fills) with the links it sent on
and one `rdu.transfer` span per send, and the tree of spans a training segment produced
(node_agent/training/spans.py).

The bound on transfer spans: at most `MAX_TRANSFER_SPANS` per `rdu.collective`; the
collective's span counts its sends and those left untraced.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span
from opentelemetry.util.types import AttributeValue

from rdurack.node_agent.training.spans import TrainSpan
from rdurack.rack.kernels import Phase
from rdurack.telemetry import names
from rdurack.workloads.program import Deploy, Kernel, Op, OpRun, Switch
from rdurack.workloads.serving.batch import SERVE, ServeBatch
from rdurack.workloads.serving.costs import Cost, Part
from rdurack.workloads.serving.stream.pricing import Pass

# Assumption: 64 sends cover one socket's part of every algorithm over the 16 sockets
# of a rack (a ring all-reduce makes 2 x 15 = 30); the cap only guards a larger group.
MAX_TRANSFER_SPANS = 64
# The tier a kernel's `rdurack.memory.hbm.bytes` moves through: the timing model counts
# HBM traffic only (a fused kernel's intermediates stream through SRAM uncounted).
KERNEL_TRAFFIC_TIER = "hbm"


@dataclass(frozen=True, slots=True)
class Sent:
    """One transfer a socket sent, on its emulated clock (ns)."""

    link: str  # "rdu-n0-s0->rdu-n0-s1" (rack/topology.py, link_name)
    kind: str  # "intra-node" or "inter-node" (rack/topology.py, LinkKind)
    send_ns: int  # the sender's clock when it sent
    arrival_ns: int  # when it arrived, by the link rule (rack/links.py)
    nbytes: int


@dataclass
class Traffic:
    """What one socket sent and received in one collective."""

    bytes_sent: int = 0
    bytes_received: int = 0
    sends: list[Sent] = field(default_factory=list)

    def links(self) -> dict[str, str]:
        """Each link it sent on, with its kind, in the order of first use."""
        return {s.link: s.kind for s in self.sends}


def link_attributes(links: Mapping[str, str]) -> dict[str, AttributeValue]:
    """The links an operation sent on (link -> kind) as span attributes."""
    return {names.ATTR_LINKS: list(links), names.ATTR_LINK_KINDS: list(links.values())}


class HardwareTrace:
    """The hardware spans of one socket."""

    def __init__(self, socket_id: str, tracer_provider: trace.TracerProvider | None = None):
        self.socket_id = socket_id
        self._tracer = trace.get_tracer(names.TRACER_SOCKET, tracer_provider=tracer_provider)
        # (wall ns at reserve, emulated ns of the job's first operation).
        self._anchor: tuple[int, int | None] = (time.time_ns(), None)

    def restart(self) -> None:
        """A job reserved the socket: its spans start from now."""
        self._anchor = (time.time_ns(), None)

    def span(
        self,
        name: str,
        parent: Context,
        job_id: str,
        start_ns: int,
        end_ns: int,
        attributes: Mapping[str, AttributeValue],
        links: Sequence[Link] = (),
    ) -> Span:
        """Record [start_ns, end_ns] of the emulated clock as a span, child of `parent`
        (and linked to `links`); it is ended (a child may still name it as its parent)."""
        wall0, emu0 = self._anchor
        if emu0 is None:
            emu0 = start_ns
            self._anchor = (wall0, emu0)
        span = self._tracer.start_span(
            name,
            context=parent,
            start_time=wall0 + start_ns - emu0,
            attributes={
                names.ATTR_SOCKET: self.socket_id,
                names.ATTR_JOB_ID: job_id,
                names.ATTR_EMULATED_START_NS: start_ns,
                names.ATTR_EMULATED_NS: end_ns - start_ns,
                **attributes,
            },
            links=links,
        )
        span.end(end_time=wall0 + end_ns - emu0)
        return span

    def collective(
        self,
        parent: Context,
        job_id: str,
        start_ns: int,
        end_ns: int,
        attributes: Mapping[str, AttributeValue],
        traffic: Traffic,
    ) -> None:
        """The socket's part of a collective, and an `rdu.transfer` child per send (the
        first MAX_TRANSFER_SPANS)."""
        untraced = max(0, len(traffic.sends) - MAX_TRANSFER_SPANS)
        span = self.span(
            names.SPAN_COLLECTIVE,
            parent,
            job_id,
            start_ns,
            end_ns,
            {
                **attributes,
                names.ATTR_BYTES_SENT: traffic.bytes_sent,
                names.ATTR_BYTES_RECEIVED: traffic.bytes_received,
                **link_attributes(traffic.links()),
                names.ATTR_TRANSFERS: len(traffic.sends),
                names.ATTR_TRANSFERS_UNTRACED: untraced,
            },
        )
        inside = trace.set_span_in_context(span)
        tag = attributes.get(names.ATTR_COLLECTIVE_TAG, "")
        for s in traffic.sends[:MAX_TRANSFER_SPANS]:
            self.span(
                names.SPAN_TRANSFER,
                inside,
                job_id,
                s.send_ns,
                s.arrival_ns,
                {
                    names.ATTR_LINK: s.link,
                    names.ATTR_LINK_KIND: s.kind,
                    names.ATTR_BYTES: s.nbytes,
                    names.ATTR_COLLECTIVE_TAG: tag,
                },
            )

    def program(self, parent: Context, job_id: str) -> Callable[[Op, OpRun], None]:
        """What records a program's ops (ProgramRunner's `observe`): a span each,
        children of `parent`."""

        def observe(op: Op, run: OpRun) -> None:
            name, attributes = op_span(op, run)
            self.span(name, parent, job_id, run.start_ns, run.end_ns, attributes)

        return observe

    def passed(
        self,
        parent: Context,
        job_id: str,
        start_ns: int,
        end_ns: int,
        model: str,
        done: Pass,
        spent: Cost,
        kv_tokens: int,
        iteration: int | None = None,
        served: Sequence[Link] = (),
    ) -> None:
        """One forward pass of an endpoint's engine (`rdu.serve.pass`) on this socket:
        the engine's `iteration`, linked to the spans of the requests it `served`
        (telemetry/served.py)."""
        attributes: dict[str, AttributeValue] = {
            names.ATTR_JOB_MODEL: model,
            names.ATTR_FUSION_PLAN: done.plan.value,
            names.ATTR_BATCH: sum(s.batch for s in done.shapes),
            names.ATTR_PASS_TOKENS: sum(s.tokens for s in done.shapes),
            names.ATTR_KV_TOKENS: kv_tokens,
            names.ATTR_KERNEL_CALLS: round(spent.kernel_calls),
            names.ATTR_HBM_BYTES: round(spent.hbm_bytes),
            names.ATTR_FLOPS: round(spent.flops),
            names.ATTR_TIER: KERNEL_TRAFFIC_TIER,
        }
        if iteration is not None:
            attributes[names.ATTR_ITERATION] = iteration
        if done.expert:  # a bundle's pass: its expert, and whether it copied it in first
            attributes[names.ATTR_EXPERT] = done.expert
            attributes[names.ATTR_SWITCH_HIT] = not done.switch
        self.span(names.SPAN_PASS, parent, job_id, start_ns, end_ns, attributes, served)

    def serve(
        self,
        parent: Context,
        job_id: str,
        start_ns: int,
        end_ns: int,
        batch: ServeBatch,
        part: Part,
    ) -> None:
        """A serve job's prefill (`rdu.serve.prefill`) or run of decode iterations
        (`rdu.serve.decode`) on this socket."""
        r = batch.request
        attributes: dict[str, AttributeValue] = {
            names.ATTR_JOB_MODEL: batch.target.name,
            names.ATTR_JOB_PHASE: SERVE,
            names.ATTR_FUSION_PLAN: (
                batch.prefill_plan if part.phase == "prefill" else batch.plan
            ).value,
            names.ATTR_BATCH: r.batch_size,
            names.ATTR_SEQUENCE_LENGTH: r.prompt_tokens,
            names.ATTR_KERNEL_CALLS: round(part.cost.kernel_calls),
            names.ATTR_HBM_BYTES: round(part.cost.hbm_bytes),
            names.ATTR_FLOPS: round(part.cost.flops),
            names.ATTR_TIER: KERNEL_TRAFFIC_TIER,
        }
        if part.phase == "decode":
            attributes[names.ATTR_SERVE_FIRST_ITERATION] = part.first_iteration
            attributes[names.ATTR_STEPS] = part.iterations
        if batch.draft is not None:
            attributes[names.ATTR_DRAFT_MODEL] = batch.draft.name
            attributes[names.ATTR_DRAFT_TOKENS] = batch.draft_tokens
        name = names.SPAN_SERVE_PREFILL if part.phase == "prefill" else names.SPAN_SERVE_DECODE
        self.span(name, parent, job_id, start_ns, end_ns, attributes)

    def tree(
        self,
        spans: Sequence[TrainSpan],
        parent: Context,
        job_id: str,
        attributes: Mapping[str, AttributeValue],
    ) -> None:
        """Training spans and their children, each with `attributes` added."""
        for s in spans:
            attrs = {**s.attributes, **attributes}
            span = self.span(s.name, parent, job_id, s.start_ns, s.end_ns, attrs)
            if s.children:
                self.tree(s.children, trace.set_span_in_context(span), job_id, attributes)


def op_span(op: Op, run: OpRun) -> tuple[str, dict[str, AttributeValue]]:
    """A program op's span name and attributes."""
    if isinstance(op, Kernel):
        return names.SPAN_KERNEL, {
            names.ATTR_KERNEL_ROLE: op.role,
            **kernel_attributes(op.model, op.phase, op.plan.value, op.steps, op.batch, op.seq),
            names.ATTR_KERNEL_CALLS: run.kernel_calls,
            names.ATTR_HBM_BYTES: run.hbm_bytes,
            names.ATTR_FLOPS: run.flops,
        }
    if isinstance(op, Switch):
        return names.SPAN_EXPERT_SWITCH, {
            names.ATTR_EXPERT: op.expert,
            names.ATTR_SWITCH_HIT: bool(run.hit),
            names.ATTR_BYTES: run.loaded_bytes,
            names.ATTR_TIER: "ddr->hbm",
            names.ATTR_EVICTED: list(run.evicted),
        }
    if isinstance(op, Deploy):
        return names.SPAN_DEPLOY, {
            names.ATTR_JOB_MODEL: op.expert_model,
            names.ATTR_EXPERTS: len(op.experts),
            names.ATTR_PLATFORM: op.platform,
            names.ATTR_BYTES: run.loaded_bytes,
        }
    return names.SPAN_GENERATE, {
        names.ATTR_EXPERT: op.expert,
        names.ATTR_TOKENS: len(run.tokens),
    }


def kernel_attributes(
    model: str, phase: Phase, plan: str, steps: int, batch: int, seq: int
) -> dict[str, AttributeValue]:
    """What every `rdu.kernel` span says of the kernel it ran (its measured figures,
    calls, bytes and FLOPs, are the caller's)."""
    return {
        names.ATTR_JOB_MODEL: model,
        names.ATTR_JOB_PHASE: phase.value,
        names.ATTR_FUSION_PLAN: plan,
        names.ATTR_STEPS: steps,
        names.ATTR_BATCH: batch,
        names.ATTR_SEQUENCE_LENGTH: seq,
        names.ATTR_TIER: KERNEL_TRAFFIC_TIER,
    }
