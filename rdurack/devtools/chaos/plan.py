"""What a chaos run does, drawn from its seed: its settings (`ChaosConfig`), the faults
it injects and when (`plan`), and the jobs it submits (`job_specs`)."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import Field

from rdurack.config import Config
from rdurack.rack.faults import FaultKind
from rdurack.v1 import common_pb2, job_pb2

KINDS = (
    FaultKind.KILL_SOCKET,
    FaultKind.KILL_AGENT,
    FaultKind.SLOW_SOCKET,
    FaultKind.DROP_LINK,
    FaultKind.DELAY_LINK,
    FaultKind.PARTITION,
)
# Wall seconds a fault lasts before it is healed: long enough for the jobs it hits to
# fail over, short enough that several fit in a run.
LASTS_S = (3.0, 10.0)


class ChaosConfig(Config):
    duration_s: float = Field(default=170.0, gt=0)  # the whole run, bring-up included
    seed: int = Field(default_factory=lambda: random.SystemRandom().randrange(1 << 31), ge=0)
    nodes: int = Field(default=2, ge=2, le=8)
    sockets_per_node: int = Field(default=4, ge=2, le=8)
    faults: int | None = Field(default=None, ge=0)  # None: one per 8 s of the window
    submit_every_s: float = Field(default=1.5, gt=0)
    settle_s: float = Field(default=45.0, gt=0)  # kept for jobs to finish after healing
    # Pacing of the sockets (wall s per emulated s): kernel and CoE jobs then take
    # seconds of wall time, so faults hit them while they run.
    time_scale: float = Field(default=10.0, ge=0)


@dataclass(frozen=True)
class PlannedFault:
    at_s: float  # after the fault window opens, wall s
    lasts_s: float
    kind: FaultKind
    sockets: tuple[str, ...] = ()
    nodes: tuple[int, ...] = ()
    slow_factor: float = 1.0
    extra_latency_ns: int = 0

    def describe(self) -> str:
        what = " ".join([*self.sockets, *(f"node {n}" for n in self.nodes)])
        extra = {
            FaultKind.SLOW_SOCKET: f" x{self.slow_factor:g}",
            FaultKind.DELAY_LINK: f" +{self.extra_latency_ns:,} ns",
        }.get(self.kind, "")
        return f"{self.kind.value} {what}{extra}"


def plan(
    seed: int, nodes: int, sockets_per_node: int, window_s: float, count: int
) -> list[PlannedFault]:
    """`count` faults at seeded random instants of the window, in time order; each ends
    before the window does."""
    rng = random.Random(seed)

    def socket() -> str:
        return f"rdu-n{rng.randrange(nodes)}-s{rng.randrange(sockets_per_node)}"

    out = []
    for _ in range(count):
        lasts = rng.uniform(*LASTS_S)
        at = rng.uniform(0.0, max(0.0, window_s - lasts))
        kind = rng.choice(KINDS)
        if kind is FaultKind.KILL_SOCKET:
            fault = PlannedFault(at, lasts, kind, sockets=(socket(),))
        elif kind is FaultKind.SLOW_SOCKET:
            fault = PlannedFault(at, lasts, kind, (socket(),), slow_factor=rng.choice((2, 4)))
        elif kind in (FaultKind.DROP_LINK, FaultKind.DELAY_LINK):
            a, b = rng.sample(range(nodes), 2)
            index = rng.randrange(sockets_per_node)  # a rail: the link between nodes
            ends = (f"rdu-n{a}-s{index}", f"rdu-n{b}-s{index}")
            delay = rng.choice((10_000, 1_000_000)) if kind is FaultKind.DELAY_LINK else 0
            fault = PlannedFault(at, lasts, kind, ends, extra_latency_ns=delay)
        elif kind is FaultKind.KILL_AGENT:
            fault = PlannedFault(at, lasts, kind, nodes=(rng.randrange(nodes),))
        else:
            fault = PlannedFault(at, lasts, kind, nodes=tuple(sorted(rng.sample(range(nodes), 2))))
        out.append(fault)
    return sorted(out, key=lambda f: f.at_s)


def job_specs(seed: int, sockets_per_node: int) -> Callable[[int], job_pb2.JobSpec]:
    """The i-th job of the workload: kernel, CoE and training jobs in turn, small."""
    rng = random.Random(seed + 1)
    half = max(1, sockets_per_node // 2)

    def spec(i: int) -> job_pb2.JobSpec:
        kind = i % 3
        if kind == 0:
            phase = rng.choice((common_pb2.PHASE_PREFILL, common_pb2.PHASE_DECODE))
            kernel = job_pb2.KernelJob(
                model="llama2-7b",
                phase=phase,
                sequence_length=2048 if phase == common_pb2.PHASE_PREFILL else 512,
                batch_size=1,
                num_sockets=rng.choice((1, 2, sockets_per_node)),
                output_tokens=48 if phase == common_pb2.PHASE_DECODE else 0,
            )
            return job_pb2.JobSpec(name=f"chaos-{i}-kernel", kernel=kernel)
        if kind == 1:
            coe = job_pb2.CoeInferenceJob(
                num_experts=8,
                batch_size=4,
                output_tokens=8,
                num_sockets=sockets_per_node,
                tensor_parallel=half,  # two replicas: one can take the other's requests
                poisson=job_pb2.PoissonLoad(requests=12, rate_per_s=200.0, seed=i),
            )
            return job_pb2.JobSpec(name=f"chaos-{i}-coe", coe_inference=coe)
        training = job_pb2.TrainingJob(
            model="mlp",
            world_size=rng.choice((2, half)),
            steps=60,
            global_batch=32,
            checkpoint_every=10,
            wall_timeout_s=20.0,
        )
        return job_pb2.JobSpec(
            name=f"chaos-{i}-train",
            training=training,
            payload_mode=common_pb2.PAYLOAD_MODE_FUNCTIONAL,
        )

    return spec
