"""A model step decomposed into operators, grouped into blocks, and fusion plans.

Every figure here is per socket under tensor parallelism (TP) over `tp` sockets:
projection weights and attention heads are split `tp` ways, norms and residual adds
are replicated, and two all-reduces per layer (after attention and after the MLP)
re-assemble the hidden state, as in Megatron-style TP.

A *block* is what a dataflow compiler fuses into one kernel: a decoder layer, the
embedding, the LM head, the optimizer step. A *fusion plan* says how blocks become
kernel calls:

- UNFUSED: one kernel per operator; every intermediate goes through HBM and every
  kernel is launched by the host (PAPER Sec. VI, the unfused baseline).
- FUSED_SO / FUSED_HO: one kernel per block; intermediates stream through SRAM;
  launched host-orchestrated (SO) or hardware-orchestrated (HO).
- KERNEL_LOOPED: the repeated decoder-layer calls become one call with a pipelined
  outer loop (KL), so layer-boundary synchronisation disappears.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from rdurack.errors import InvalidRequest
from rdurack.rack.models import ModelSpec


class Phase(StrEnum):
    PREFILL = "prefill"
    DECODE = "decode"
    TRAIN = "train"


class FusionPlan(StrEnum):
    UNFUSED = "unfused"
    FUSED_SO = "fused-so"
    FUSED_HO = "fused-ho"
    KERNEL_LOOPED = "kernel-looped"


class OpKind(StrEnum):
    MATMUL = "matmul"
    ATTENTION = "attention"
    ELEMENTWISE = "elementwise"
    ALL_REDUCE = "all-reduce"


# Adam with BF16 weights and gradients and FP32 moments: read w, g (2+2), m, v (4+4);
# write w, m, v (2+4+4) = 22 bytes of HBM traffic per parameter per step.
ADAM_BYTES_PER_PARAM = 22
# Adam's arithmetic per parameter (moments, bias correction, update): ~10 FLOPs.
ADAM_FLOPS_PER_PARAM = 10
# Assumption: a fused pipeline streams tiles of this many tokens through its SRAM stage
# buffers, double-buffered. PAPER Sec. III describes tiled streaming; the tile size
# is not published. It only decides whether a fused kernel's buffers fit in SRAM.
TILE_TOKENS = 128


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
    """Tokens in flight: `batch` sequences of `new_tokens` each, attending to `context`."""

    batch: int
    new_tokens: int
    context: int

    @property
    def tokens(self) -> int:
        return self.batch * self.new_tokens


def step(
    model: ModelSpec, phase: Phase, batch: int, seq: int, tp: int, new_tokens: int = 1
) -> Step:
    """Decompose one step. `seq` is the prompt length (prefill, train) or the context the
    decoded tokens attend to (decode), new tokens included.

    `new_tokens` (decode only): tokens each sequence feeds in this step. One is plain
    decoding; several is a speculative verification pass, which appends all of them to
    the KV cache and needs the logits of every one (to accept or reject each draft)."""
    if batch <= 0 or seq <= 0 or tp <= 0 or new_tokens <= 0:
        raise InvalidRequest(
            f"batch, seq, sockets and new tokens must be positive: {batch}, {seq}, {tp}, "
            f"{new_tokens}"
        )
    if model.heads % tp or model.ffn % tp:
        raise InvalidRequest(
            f"{model.name}: TP over {tp} sockets must divide heads ({model.heads}) and "
            f"ffn ({model.ffn})"
        )
    if phase is Phase.DECODE:
        if new_tokens > seq:
            raise InvalidRequest(
                f"a decode step of {new_tokens} new tokens needs a context of at least as "
                f"many (the context includes them), got {seq}"
            )
        shape = Shape(batch=batch, new_tokens=new_tokens, context=seq)
    elif new_tokens != 1:
        raise InvalidRequest(
            f"new tokens are a decode step's; a {phase.value} step processes its whole "
            f"sequence ({seq} tokens), got new_tokens={new_tokens}"
        )
    else:
        shape = Shape(batch=batch, new_tokens=seq, context=seq)
    layer = _decoder_layer(model, shape, tp, causal=phase is not Phase.DECODE)
    # Prefill needs the logits of the last position of each sequence only; decode those
    # of every new token (one per sequence, unless verifying drafts); training all.
    head_tokens = batch if phase is Phase.PREFILL else shape.tokens
    embed = _embedding(model, shape.tokens)
    head = _lm_head(model, head_tokens, tp)
    if phase is not Phase.TRAIN:
        return Step(phase, ((embed, 1), (layer, model.layers), (head, 1)))
    layer_fwd = _for_training(layer)
    return Step(
        phase,
        (
            (embed, 1),
            (layer_fwd, model.layers),
            (head, 1),
            (_backward(head), 1),
            (_backward(layer_fwd), model.layers),
            (_optimizer(model, tp), 1),
        ),
    )


def _decoder_layer(model: ModelSpec, s: Shape, tp: int, causal: bool) -> Block:
    b = model.bytes_per_param
    t = s.tokens
    d, kvd, f = model.hidden, model.kv_dim, model.ffn
    qkv_w = d + 2 * kvd
    heads = model.heads / tp
    # Causal attention: on average a query attends to half the context. A decode query
    # attends to all of it (of a verification pass's new tokens, the i-th of n sees
    # n - 1 - i fewer: at most a few draft tokens out of thousands, left out).
    attended = s.context / 2 if causal else s.context
    kv_cache = s.batch * s.context * kvd * b / tp  # K (or V) of every sequence
    scores = heads * t * s.context * b
    m = model.mlp_matrices - 1  # matrices before the activation: 2 gated, 1 plain
    act = t * d * b  # one full hidden state
    ops = [
        Op("attn_norm", OpKind.ELEMENTWISE, 4 * t * d, d * b, act, act),
        Op(
            "qkv_proj",
            OpKind.MATMUL,
            2 * t * d * qkv_w / tp,
            d * qkv_w * b / tp,
            act,
            t * qkv_w * b / tp,
            kv_bytes=t * 2 * kvd * b / tp,  # this step's K, V appended to the cache
        ),
        Op("rope", OpKind.ELEMENTWISE, 6 * t * (d + kvd) / tp, 0, *(2 * [t * (d + kvd) * b / tp])),
        Op(
            "attn_scores",
            OpKind.ATTENTION,
            2 * t * attended * d / tp,
            0,
            t * d * b / tp,
            scores,
            kv_bytes=kv_cache,
        ),
        Op("softmax", OpKind.ELEMENTWISE, 5 * heads * t * s.context, 0, scores, scores),
        Op(
            "attn_v",
            OpKind.ATTENTION,
            2 * t * attended * d / tp,
            0,
            scores,
            t * d * b / tp,
            kv_bytes=kv_cache,
        ),
        Op("o_proj", OpKind.MATMUL, 2 * t * d * d / tp, d * d * b / tp, t * d * b / tp, act),
    ]
    if tp > 1:
        ops.append(Op("attn_all_reduce", OpKind.ALL_REDUCE, 0, reduce_bytes=act))
    ops += [
        Op("attn_residual", OpKind.ELEMENTWISE, t * d, 0, 2 * act, act),
        Op("mlp_norm", OpKind.ELEMENTWISE, 4 * t * d, d * b, act, act),
        Op(
            "up_proj",
            OpKind.MATMUL,
            2 * t * d * m * f / tp,
            d * m * f * b / tp,
            act,
            t * m * f * b / tp,
        ),
        Op("activation", OpKind.ELEMENTWISE, 8 * t * f / tp, 0, t * m * f * b / tp, t * f * b / tp),
        Op("down_proj", OpKind.MATMUL, 2 * t * f * d / tp, f * d * b / tp, t * f * b / tp, act),
    ]
    if tp > 1:
        ops.append(Op("mlp_all_reduce", OpKind.ALL_REDUCE, 0, reduce_bytes=act))
    ops.append(Op("mlp_residual", OpKind.ELEMENTWISE, t * d, 0, 2 * act, act))
    return Block("decoder_layer", tuple(ops), t, in_bytes=act, out_bytes=act, loopable=True)


def _embedding(model: ModelSpec, tokens: int) -> Block:
    row = model.hidden * model.bytes_per_param
    gather = Op("embed", OpKind.ELEMENTWISE, 0, tokens * row, 0, tokens * row)
    return Block("embedding", (gather,), tokens, in_bytes=0, out_bytes=0)


def _lm_head(model: ModelSpec, tokens: int, tp: int) -> Block:
    b, d, v = model.bytes_per_param, model.hidden, model.vocab
    act = tokens * d * b
    ops = (
        Op("final_norm", OpKind.ELEMENTWISE, 4 * tokens * d, d * b, act, act),
        Op(
            "lm_head",
            OpKind.MATMUL,
            2 * tokens * d * v / tp,
            d * v * b / tp,
            act,
            tokens * v * b / tp,
        ),
    )
    return Block("lm_head", ops, tokens, in_bytes=act, out_bytes=tokens * v * b / tp)


def _for_training(layer: Block) -> Block:
    """A forward layer that keeps the inputs of its matmuls and attention for backward.
    Fused, those saved activations are the only extra HBM traffic."""
    saved = sum(op.act_in_bytes for op in layer.ops if op.kind in (OpKind.MATMUL, OpKind.ATTENTION))
    return Block(layer.name, layer.ops, layer.tokens, layer.in_bytes, layer.out_bytes, saved, True)


def _backward(block: Block) -> Block:
    """Backward of a block: each matmul becomes two (input and weight gradients, 2x the
    FLOPs) and writes its weight gradient; every other operator reads what its forward
    wrote and writes the gradient of its input. TP all-reduces the input gradients."""
    ops: list[Op] = []
    for op in reversed(block.ops):
        if op.kind is OpKind.ALL_REDUCE:
            ops.append(Op(f"{op.name}_bwd", op.kind, 0, reduce_bytes=op.reduce_bytes))
        elif op.kind is OpKind.MATMUL:
            ops.append(
                Op(
                    f"{op.name}_bwd",
                    op.kind,
                    2 * op.flops,
                    2 * op.weight_bytes,  # read weights, write weight gradients
                    op.act_in_bytes + op.act_out_bytes,
                    op.act_in_bytes,
                )
            )
        else:
            ops.append(
                Op(
                    f"{op.name}_bwd",
                    op.kind,
                    2 * op.flops,
                    op.weight_bytes,
                    op.act_in_bytes + op.act_out_bytes,
                    op.act_in_bytes,
                    kv_bytes=op.kv_bytes,
                )
            )
    return Block(
        f"{block.name}_bwd",
        tuple(ops),
        block.tokens,
        in_bytes=block.out_bytes,
        out_bytes=block.in_bytes,
        saved_bytes=block.saved_bytes,  # read back what the forward saved
        loopable=block.loopable,
    )


def _optimizer(model: ModelSpec, tp: int) -> Block:
    params = model.params / tp
    op = Op(
        "adam",
        OpKind.ELEMENTWISE,
        ADAM_FLOPS_PER_PARAM * params,
        ADAM_BYTES_PER_PARAM * params,
    )
    return Block("optimizer", (op,), 0, in_bytes=0, out_bytes=0)
