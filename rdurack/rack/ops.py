"""The pieces a model step is made of: operators (per socket), blocks (what a dataflow
compiler fuses into one kernel call) and steps (blocks in order with their repeats).
rack/layers.py builds a decoder layer's operators; rack/kernels.py a whole step."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

# Assumption: a fused pipeline streams tiles of this many tokens through its SRAM stage
# buffers, double-buffered. PAPER Sec. III describes tiled streaming; the tile size
# is not published. It only decides whether a fused kernel's buffers fit in SRAM.
TILE_TOKENS = 128


class Phase(StrEnum):
    PREFILL = "prefill"
    DECODE = "decode"
    TRAIN = "train"


class OpKind(StrEnum):
    MATMUL = "matmul"
    ATTENTION = "attention"
    ELEMENTWISE = "elementwise"
    ALL_REDUCE = "all-reduce"


@dataclass(frozen=True, slots=True)
class Op:
    """One operator, per socket. Bytes are HBM traffic when it runs as its own kernel."""

    name: str
    kind: OpKind
    flops: float
    weight_bytes: float = 0.0  # weights (or weight gradients) read/written
    act_in_bytes: float = 0.0  # activations read
    act_out_bytes: float = 0.0  # activations written
    kv_bytes: float = 0.0  # KV cache read and written (HBM even when fused)
    reduce_bytes: float = 0.0  # buffer all-reduced over the TP group (ALL_REDUCE only)
    ddr_bytes: float = 0.0  # weights copied from DDR into HBM before it runs (cold experts)

    @property
    def hbm_bytes(self) -> float:
        return self.weight_bytes + self.act_in_bytes + self.act_out_bytes + self.kv_bytes


@dataclass(frozen=True, slots=True)
class Block:
    """What a dataflow compiler fuses into one kernel call."""

    name: str
    ops: tuple[Op, ...]
    tokens: int  # tokens streamed through the block (for SRAM tile sizing)
    in_bytes: float  # block input read from HBM when fused
    out_bytes: float  # block output written to HBM when fused
    saved_bytes: float = 0.0  # activations a fused training kernel keeps for backward
    loopable: bool = False  # a decoder layer: kernel looping may loop over its repeats

    @property
    def flops(self) -> float:
        return sum(op.flops for op in self.ops)

    @property
    def ddr_bytes(self) -> float:
        return sum(op.ddr_bytes for op in self.ops)

    def fused_hbm_bytes(self) -> float:
        """HBM traffic when fused: weights, KV cache, block boundary and saved
        activations; the intermediates between operators stay in SRAM."""
        inner = sum(op.weight_bytes + op.kv_bytes for op in self.ops)
        return inner + self.in_bytes + self.out_bytes + self.saved_bytes

    def fused_sram_bytes(self) -> float:
        """SRAM stage buffers of the fused kernel: each intermediate double-buffers a
        tile of TILE_TOKENS tokens."""
        if self.tokens <= 0:
            return 0.0
        share = min(self.tokens, TILE_TOKENS) / self.tokens
        return sum(2 * share * op.act_out_bytes for op in self.ops)


@dataclass(frozen=True, slots=True)
class Step:
    """One model step (a prefill pass, one decoded token, one training step): blocks in
    order, each with its repeat count."""

    phase: Phase
    blocks: tuple[tuple[Block, int], ...]

    @property
    def flops(self) -> float:
        return sum(b.flops * n for b, n in self.blocks)

    @property
    def weight_bytes(self) -> float:
        return sum(op.weight_bytes * n for b, n in self.blocks for op in b.ops)


@dataclass(frozen=True, slots=True)
class Shape:
    """Tokens in flight: `batch` sequences of `new_tokens` each, attending to `context`
    tokens (the new ones included). Causal: each new token attends to those before it
    only (a prompt, or a chunk of one); else every new token attends to the whole
    context (a decode step; a verification pass's few drafts are counted so too)."""

    batch: int
    new_tokens: int
    context: int
    causal: bool = False

    @property
    def tokens(self) -> int:
        return self.batch * self.new_tokens

    @property
    def attended(self) -> float:
        """Keys a new token attends to, on average."""
        return self.context - self.new_tokens / 2 if self.causal else self.context


@dataclass(frozen=True, slots=True)
class Rows:
    """What a pass's operators see of its shapes, summed over them: a pass may hold
    several (an iteration of a serving engine: decode steps beside a chunk of a prompt).
    A matmul runs over every new token; attention sums each shape's own work."""

    tokens: int  # new tokens: the rows of every matmul
    cached: int  # sequences x context: KV-cache tokens read
    scored: int  # new tokens x context: attention scores per head
    attended: float  # new tokens x the keys each attends to: query-key products per head

    @classmethod
    def of(cls, shapes: tuple[Shape, ...]) -> Rows:
        return cls(
            tokens=sum(s.tokens for s in shapes),
            cached=sum(s.batch * s.context for s in shapes),
            scored=sum(s.tokens * s.context for s in shapes),
            attended=sum(s.tokens * s.attended for s in shapes),
        )
