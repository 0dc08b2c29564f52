"""Operator decomposition: FLOPs and bytes per socket, and what fusion keeps on chip."""

from __future__ import annotations

import pytest

from rdurack.errors import InvalidRequest
from rdurack.rack.kernels import (
    ADAM_BYTES_PER_PARAM,
    OpKind,
    Phase,
    Shape,
    mixed_step,
    step,
)
from rdurack.rack.models import model

M = model("llama2-7b")


def _matmul_flops(s: object) -> float:
    from rdurack.rack.kernels import Step

    assert isinstance(s, Step)
    return sum(op.flops * n for b, n in s.blocks for op in b.ops if op.kind is OpKind.MATMUL)


def test_decode_matmul_flops_are_two_per_weight() -> None:
    # One token through every matrix but the embedding lookup: 2 FLOPs per weight.
    s = step(M, Phase.DECODE, 1, 1, 1)
    matrices = M.layers * (M.attention_params + M.mlp_params) + M.vocab * M.hidden
    assert _matmul_flops(s) == pytest.approx(2 * matrices)


def test_decode_reads_every_weight_once() -> None:
    s = step(M, Phase.DECODE, 1, 128, 1)
    # Weights of the matrices and norms, plus one embedding row.
    expected = (M.params - M.vocab * M.hidden) * M.bytes_per_param
    assert s.weight_bytes == pytest.approx(expected, rel=1e-3)


def test_tensor_parallelism_splits_weights_and_flops() -> None:
    one = step(M, Phase.DECODE, 1, 1024, 1)
    eight = step(M, Phase.DECODE, 1, 1024, 8)
    assert _matmul_flops(eight) == pytest.approx(_matmul_flops(one) / 8)
    # Norm weights are replicated, so slightly more than 1/8 of the bytes.
    assert one.weight_bytes / 8 < eight.weight_bytes < one.weight_bytes / 7.9


def test_tp_adds_two_all_reduces_per_layer() -> None:
    s = step(M, Phase.DECODE, 1, 1024, 8)
    layer = next(b for b, _ in s.blocks if b.name == "decoder_layer")
    assert [op.name for op in layer.ops if op.kind is OpKind.ALL_REDUCE] == [
        "attn_all_reduce",
        "mlp_all_reduce",
    ]
    single = step(M, Phase.DECODE, 1, 1024, 1)
    layer1 = next(b for b, _ in single.blocks if b.name == "decoder_layer")
    assert not [op for op in layer1.ops if op.kind is OpKind.ALL_REDUCE]


def test_decode_attention_grows_with_context() -> None:
    short = step(M, Phase.DECODE, 1, 512, 1)
    long = step(M, Phase.DECODE, 1, 4096, 1)
    assert long.flops > short.flops
    # QK^T and PV: 4 x hidden FLOPs per attended token; softmax: 5 per score.
    per_token = 4 * M.hidden + 5 * M.heads
    assert long.flops - short.flops == pytest.approx(M.layers * per_token * (4096 - 512))


def test_prefill_flops_scale_with_tokens() -> None:
    s = step(M, Phase.PREFILL, 1, 2048, 1)
    # About 2 x params x tokens, plus causal attention.
    assert s.flops == pytest.approx(2 * M.params * 2048, rel=0.12)


def test_training_is_about_three_forward_passes() -> None:
    fwd = step(M, Phase.PREFILL, 1, 2048, 8)
    train = step(M, Phase.TRAIN, 1, 2048, 8)
    # Prefill computes logits of the last token only; training of every token.
    assert 2.8 * fwd.flops < train.flops < 3.6 * fwd.flops
    opt = next(b for b, _ in train.blocks if b.name == "optimizer")
    assert opt.ops[0].weight_bytes == pytest.approx(ADAM_BYTES_PER_PARAM * M.params / 8)


def test_fusion_keeps_intermediates_on_chip() -> None:
    s = step(M, Phase.PREFILL, 1, 4096, 8)
    layer = next(b for b, _ in s.blocks if b.name == "decoder_layer")
    unfused = sum(op.hbm_bytes for op in layer.ops)
    # The attention scores alone are several times the layer's weights.
    assert layer.fused_hbm_bytes() < unfused / 3
    assert 0 < layer.fused_sram_bytes() < unfused


def test_bad_shapes_are_refused() -> None:
    with pytest.raises(InvalidRequest, match="positive"):
        step(M, Phase.DECODE, 0, 128, 1)
    with pytest.raises(InvalidRequest, match="divide heads"):
        step(M, Phase.DECODE, 1, 128, 3)


# ------------------------------------------------------------------ new tokens (speculation)


def _op(s: object, name: str) -> object:
    from rdurack.rack.kernels import Step

    assert isinstance(s, Step)
    return next(op for b, _ in s.blocks for op in b.ops if op.name == name)


def test_one_new_token_is_plain_decode() -> None:
    assert step(M, Phase.DECODE, 4, 1024, 8, new_tokens=1) == step(M, Phase.DECODE, 4, 1024, 8)


def test_a_verification_pass_feeds_every_new_token_through_the_weights_once() -> None:
    one = step(M, Phase.DECODE, 2, 1024, 8)
    five = step(M, Phase.DECODE, 2, 1024, 8, new_tokens=5)
    # The weights are read once whatever the tokens (the point of verifying k drafts in
    # one pass); FLOPs of the matrices scale with the tokens, LM head included (each
    # new token's logits decide whether its draft is accepted).
    assert five.weight_bytes == pytest.approx(one.weight_bytes, rel=1e-3)
    assert _matmul_flops(five) == pytest.approx(5 * _matmul_flops(one))
    from rdurack.rack.kernels import Op

    qkv1, qkv5 = _op(one, "qkv_proj"), _op(five, "qkv_proj")
    assert isinstance(qkv1, Op) and isinstance(qkv5, Op)
    # Five K, V entries per sequence appended to the cache, against one.
    assert qkv5.kv_bytes == pytest.approx(5 * qkv1.kv_bytes)
    scores1, scores5 = _op(one, "attn_scores"), _op(five, "attn_scores")
    assert isinstance(scores1, Op) and isinstance(scores5, Op)
    # The cache read is the same context; every new token attends to it.
    assert scores5.kv_bytes == scores1.kv_bytes
    assert scores5.flops == pytest.approx(5 * scores1.flops)


def test_new_tokens_belong_to_decode_and_fit_their_context() -> None:
    with pytest.raises(InvalidRequest, match="new tokens are a decode step's"):
        step(M, Phase.PREFILL, 1, 128, 1, new_tokens=2)
    with pytest.raises(InvalidRequest, match="context of at least as many"):
        step(M, Phase.DECODE, 1, 4, 1, new_tokens=5)
    with pytest.raises(InvalidRequest, match="positive"):
        step(M, Phase.DECODE, 1, 128, 1, new_tokens=0)


# ------------------------------------------------------------------ mixed passes


@pytest.mark.parametrize("name", ["llama2-7b", "deepseek-r1"])
@pytest.mark.parametrize(
    ("phase", "batch", "seq"), [(Phase.DECODE, 8, 700), (Phase.PREFILL, 2, 333)]
)
def test_a_pass_of_one_shape_is_the_step(name: str, phase: Phase, batch: int, seq: int) -> None:
    m = model(name)
    tp = 16 if m.moe else 4
    new = 1 if phase is Phase.DECODE else seq
    shape = Shape(batch, new, seq, causal=phase is Phase.PREFILL)
    logits = batch if phase is Phase.PREFILL else shape.tokens
    assert mixed_step(m, (shape,), logits, tp).blocks == step(m, phase, batch, seq, tp).blocks


def test_a_mixed_pass_reads_the_weights_once_and_sums_the_attention() -> None:
    decode, chunk = Shape(8, 1, 700), Shape(1, 256, 512, causal=True)
    both = mixed_step(M, (decode, chunk), 8, 1)
    alone = [mixed_step(M, (s,), logits, 1) for s, logits in ((decode, 8), (chunk, 0))]
    # The weights once; the embedding's rows are per token (a lookup, not a matrix read).
    rows = 256 * M.hidden * M.bytes_per_param
    assert both.weight_bytes == pytest.approx(alone[0].weight_bytes + rows)
    assert both.flops == pytest.approx(alone[0].flops + alone[1].flops)
    # The chunk's 256 tokens attend to the 256 before them and, causally, to each other.
    (layer,) = [b for b, _ in alone[1].blocks if b.name == "decoder_layer"]
    (scores,) = [op for op in layer.ops if op.name == "attn_scores"]
    assert scores.flops == pytest.approx(2 * 256 * (256 + 256 / 2) * M.q_dim)


def test_an_mla_pass_absorbs_its_decodes_and_expands_its_prompts() -> None:
    ds = model("deepseek-r1")
    s = mixed_step(ds, (Shape(4, 1, 900), Shape(1, 128, 128, causal=True)), 5, 16)
    (layer,) = [b for b, _ in s.blocks if b.name == "moe_layer"]
    names = [op.name for op in layer.ops]
    assert "q_absorb" in names and "kv_up" in names
    assert names.count("attn_scores") == 2


def test_a_pass_of_bad_shapes_is_refused() -> None:
    with pytest.raises(InvalidRequest, match="positive sizes"):
        mixed_step(M, (), 0, 1)
    with pytest.raises(InvalidRequest, match="includes its new tokens"):
        mixed_step(M, (Shape(1, 10, 5),), 1, 1)
