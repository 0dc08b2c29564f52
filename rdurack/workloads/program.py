"""A node program: the operations a socket runs in one call, and what each one did.

A CoE batch is a short program (route, then per expert: switch it in, prefill, decode),
and a node agent hands it to each socket of its TP group in one call, so a batch costs
one round trip per node, not one per kernel. The same ops run on the fast predictor's
model of a node (workloads/coe/bundle.py, `PredictedReplicas`) and on the socket actors
(node_agent/socket.py), so both give the same emulated times.

Bytes are per socket (its 1/group share) unless a name says otherwise; times are
emulated ns.
"""

from __future__ import annotations

from dataclasses import dataclass

from rdurack.rack.kernels import FusionPlan, Phase


@dataclass(frozen=True)
class Deploy:
    """Load a model bundle (router plus a catalog of experts) for the job.

    Every expert's share goes to DDR (a DGX: host DRAM), the router's share to HBM;
    `pinned` experts are loaded into HBM and stay there. The rest of HBM is the KV cache
    pool and the reserved region experts are switched into: `region_bytes` per socket,
    or, when None, all HBM left after the router, the pins and `kv_reserve_tokens`
    tokens of KV cache (a full batch).
    """

    platform: str
    router_model: str
    expert_model: str
    experts: tuple[str, ...]
    pinned: tuple[str, ...] = ()
    kv_reserve_tokens: int = 0
    region_bytes: int | None = None
    expert_seeds: tuple[int, ...] = ()  # functional mode: each expert's weight seed


@dataclass(frozen=True)
class Kernel:
    """`steps` steps of one phase of a model on the TP group (a kernel-looped decode of
    `steps` tokens is one call). The weights are already in HBM (router, or the expert
    in the region); the op holds `kv_tokens` tokens of KV cache while it runs."""

    model: str
    phase: Phase
    plan: FusionPlan
    batch: int
    seq: int
    steps: int = 1
    kv_tokens: int = 0
    role: str = ""  # "router", "prefill", "decode": what the span says it is

    @property
    def starts_invocation(self) -> bool:
        """A router pass or a request's prefill starts a model invocation, which first
        loads the model's program and arguments (KernelCostSpec.invocation_ns); the
        decode that follows a prefill continues it."""
        return self.role in INVOCATION_ROLES


INVOCATION_ROLES = frozenset({"router", "prefill"})


@dataclass(frozen=True)
class Switch:
    """Make an expert resident in the reserved HBM region: nothing on a hit; on a miss,
    evict least-recently-used experts by bytes and copy it DDR -> HBM."""

    expert: str


@dataclass(frozen=True)
class Generate:
    """Functional mode: the expert (a tiny real model) greedily generates tokens for one
    prompt, tensor-parallel over the group with real all-reduces over the links. It
    takes no emulated time of its own: the Kernel ops of the same shapes beside it carry
    the time, so functional and timing runs take the same emulated time."""

    expert: str
    prompt: tuple[int, ...]
    max_new_tokens: int


Op = Deploy | Kernel | Switch | Generate


@dataclass(frozen=True)
class OpRun:
    """What one op did on one socket."""

    start_ns: int
    end_ns: int
    hit: bool | None = None  # Switch: was the expert already resident
    loaded_bytes: int = 0  # Switch, Deploy (pins): bytes copied DDR -> HBM
    evicted: tuple[str, ...] = ()  # Switch: experts evicted to make room, oldest first
    kernel_calls: int = 0
    hbm_bytes: int = 0  # Kernel: HBM traffic
    flops: int = 0  # Kernel: FLOPs this socket executed (its 1/group share), all steps
    tokens: tuple[int, ...] = ()  # Generate: the new tokens

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass(frozen=True)
class ProgramRun:
    """What a program did on one socket, and the state it left."""

    socket_id: str
    ops: tuple[OpRun, ...]
    resident: tuple[str, ...] = ()  # experts in the region, least recently used first
    kv_free_bytes: int = 0  # HBM left for the KV cache (after the bundle), per socket
    hbm_peak_bytes: int = 0
    ddr_used_bytes: int = 0

    @property
    def end_ns(self) -> int:
        return self.ops[-1].end_ns if self.ops else 0


def combine(runs: list[ProgramRun]) -> ProgramRun:
    """One ProgramRun for a TP group from its sockets' runs: each op starts with its
    first socket and ends with its last; memory figures are the largest. The sockets
    must agree on what happened (hits, evictions, residents, generated tokens): they run
    the same program on the same state, so a disagreement is a bug, reported as one."""
    if not runs:
        raise ValueError("no socket runs to combine")
    first = runs[0]
    for r in runs[1:]:
        same = len(r.ops) == len(first.ops) and r.resident == first.resident
        same = same and all(
            (a.hit, a.evicted, a.tokens) == (b.hit, b.evicted, b.tokens)
            for a, b in zip(r.ops, first.ops, strict=False)
        )
        if not same:
            raise RuntimeError(
                f"sockets {first.socket_id} and {r.socket_id} disagree on a program's outcome"
            )
    ops = tuple(
        OpRun(
            start_ns=min(r.ops[i].start_ns for r in runs),
            end_ns=max(r.ops[i].end_ns for r in runs),
            hit=op.hit,
            loaded_bytes=op.loaded_bytes,
            evicted=op.evicted,
            kernel_calls=op.kernel_calls,
            hbm_bytes=op.hbm_bytes,
            flops=op.flops,
            tokens=op.tokens,
        )
        for i, op in enumerate(first.ops)
    )
    return ProgramRun(
        socket_id=first.socket_id,
        ops=ops,
        resident=first.resident,
        kv_free_bytes=min(r.kv_free_bytes for r in runs),
        hbm_peak_bytes=max(r.hbm_peak_bytes for r in runs),
        ddr_used_bytes=max(r.ddr_used_bytes for r in runs),
    )
