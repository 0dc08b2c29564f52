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

from enum import StrEnum

from rdurack.errors import InvalidRequest
from rdurack.rack.layers import check_tp, decoder_layer, expert_mapping
from rdurack.rack.models import ModelSpec
from rdurack.rack.ops import Block, Op, OpKind, Phase, Shape, Step

__all__ = ["Block", "FusionPlan", "Op", "OpKind", "Phase", "Shape", "Step", "mixed_step", "step"]


class FusionPlan(StrEnum):
    UNFUSED = "unfused"
    FUSED_SO = "fused-so"
    FUSED_HO = "fused-ho"
    KERNEL_LOOPED = "kernel-looped"


# Adam with BF16 weights and gradients and FP32 moments: read w, g (2+2), m, v (4+4);
# write w, m, v (2+4+4) = 22 bytes of HBM traffic per parameter per step.
ADAM_BYTES_PER_PARAM = 22
# Adam's arithmetic per parameter (moments, bias correction, update): ~10 FLOPs.
ADAM_FLOPS_PER_PARAM = 10


def step(
    model: ModelSpec,
    phase: Phase,
    batch: int,
    seq: int,
    tp: int,
    new_tokens: int = 1,
    cold_experts: float = 0.0,
) -> Step:
    """Decompose one step. `seq` is the prompt length (prefill, train) or the context the
    decoded tokens attend to (decode), new tokens included.

    `new_tokens` (decode only): tokens each sequence feeds in this step. One is plain
    decoding; several is a speculative verification pass, which appends all of them to
    the KV cache and needs the logits of every one (to accept or reject each draft).

    `cold_experts`: the fraction of an MoE model's routed-expert weights held in DDR
    (rack/placement.py decides it)."""
    if batch <= 0 or seq <= 0 or tp <= 0 or new_tokens <= 0:
        raise InvalidRequest(
            f"batch, seq, sockets and new tokens must be positive: {batch}, {seq}, {tp}, "
            f"{new_tokens}"
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
        shape = Shape(batch=batch, new_tokens=seq, context=seq, causal=True)
    # Prefill needs the logits of the last position of each sequence only; decode those
    # of every new token (one per sequence, unless verifying drafts); training all.
    logits = batch if phase is Phase.PREFILL else shape.tokens
    embed, layers, head = _forward(model, (shape,), logits, tp, cold_experts)
    if phase is not Phase.TRAIN:
        return Step(phase, ((embed, 1), *layers, (head, 1)))
    forward = [(_for_training(layer), n) for layer, n in layers]
    return Step(
        phase,
        (
            (embed, 1),
            *forward,
            (head, 1),
            (_backward(head), 1),
            *[(_backward(layer), n) for layer, n in reversed(forward)],
            (_optimizer(model, tp), 1),
        ),
    )


def mixed_step(
    model: ModelSpec, shapes: tuple[Shape, ...], logits: int, tp: int, cold_experts: float = 0.0
) -> Step:
    """One forward pass over several shapes at once, as a serving engine's iteration
    runs decode steps beside chunks of prompts: every matmul over all their new tokens
    (the weights read once), each shape's own attention. `logits`: the new tokens whose
    next token is sampled (each decode step's, a prompt's last)."""
    if not shapes or min(min(s.batch, s.new_tokens) for s in shapes) <= 0 or tp <= 0:
        raise InvalidRequest(f"a pass needs shapes of positive sizes on sockets, got {shapes}")
    if any(s.new_tokens > s.context for s in shapes):
        raise InvalidRequest(f"a shape's context includes its new tokens: {shapes}")
    embed, layers, head = _forward(model, shapes, logits, tp, cold_experts)
    return Step(Phase.DECODE, ((embed, 1), *layers, (head, 1)))


def _forward(
    model: ModelSpec, shapes: tuple[Shape, ...], logits: int, tp: int, cold: float
) -> tuple[Block, list[tuple[Block, int]], Block]:
    """The embedding, the decoder layers with their repeats, the LM head."""
    mapping = expert_mapping(model, tp)
    check_tp(model, tp, mapping)
    layers: list[tuple[Block, int]] = []
    if model.dense_layers:
        layers.append((decoder_layer(model, shapes, tp), model.dense_layers))
    if model.moe_layers:
        layers.append((decoder_layer(model, shapes, tp, mapping, cold), model.moe_layers))
    tokens = sum(s.tokens for s in shapes)
    return _embedding(model, tokens), layers, _lm_head(model, logits, tp)


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
