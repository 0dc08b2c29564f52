"""A decoder layer's operators, per socket, under tensor parallelism over `tp` sockets.

Attention heads are split `tp` ways (Megatron-style TP); keys and values split by KV
head, so a group wider than the model's KV heads holds copies (`ModelSpec.kv_shards`).
Multi-head latent attention (MLA) caches one latent per token that every head reads: it
is whole on every socket, and so are its two down-projections (replicated, as vLLM
places them: splitting them would add a collective to every layer).

MLA runs in two forms (DeepSeek-V2 Sec. 2.1.3): prefill and training expand the latent
into per-head keys and values; decode absorbs the key up-projection into the query and
the value up-projection into the output, so each new token attends over the cached
latent directly and nothing is expanded.

The MLP is dense, or a mixture of experts (rack/routing.py: how many experts a batch
touches), placed one of two ways (`ExpertMapping`):

- expert-parallel: whole experts, E / tp on each socket. After attention's all-reduce
  every socket holds every token, so dispatch needs no transfer; each socket runs its
  own experts for the tokens routed to them, and the combine is one all-reduce of the
  partial outputs. The layer waits for the busiest socket.
- tensor-parallel: every expert's columns split over the group, like a dense MLP; every
  socket reads its slice of each touched expert. Balanced, but every socket reads every
  touched expert.

Weights stored in FP8 (`WeightFormat`) move at their stored size; the SN40L computes in
BF16, so each weight read is converted and scaled first: UPCAST_FLOPS_PER_WEIGHT.
"""

from __future__ import annotations

from dataclasses import replace

from rdurack.errors import InvalidRequest
from rdurack.rack.models import ExpertMapping, ModelSpec, WeightFormat
from rdurack.rack.ops import Block, Op, OpKind, Rows, Shape
from rdurack.rack.routing import expert_load, touched

# What an MoE layer's all-reduces do for its experts (see above): attention's leaves
# every token on every socket, so it is the dispatch; the experts' sums their outputs.
MOE_ROLES = {
    ("moe_layer", "attn_all_reduce"): "dispatch",
    ("moe_layer", "experts_combine"): "combine",
}

# Assumption: converting an FP8 weight to BF16 and applying its block scale costs one
# conversion and one multiply; the article seed says the SN40L has no FP8 arithmetic.
UPCAST_FLOPS_PER_WEIGHT = 2


def decoder_layer(
    model: ModelSpec,
    shapes: tuple[Shape, ...],
    tp: int,
    moe: ExpertMapping | None = None,
    cold: float = 0.0,
) -> Block:
    """One decoder layer over the tokens of `shapes` (one shape, or a serving engine's
    mix of decode steps and prompt chunks): attention, then the dense MLP (`moe` None)
    or the MoE block. `cold`: the fraction of the routed experts' weights held in DDR
    (rack/placement.py); an expert touched there is copied into HBM before it runs."""
    rows = Rows.of(shapes)
    t, b, d = rows.tokens, model.bytes_per_param, model.hidden
    act = t * d * b  # one full hidden state
    ops = [Op("attn_norm", OpKind.ELEMENTWISE, 4 * t * d, d * b, act, act)]
    ops += _mla(model, shapes, tp) if model.mla is not None else _attention(model, rows, tp)
    if tp > 1:
        ops.append(Op("attn_all_reduce", OpKind.ALL_REDUCE, 0, reduce_bytes=act))
    ops += [
        Op("attn_residual", OpKind.ELEMENTWISE, t * d, 0, 2 * act, act),
        Op("mlp_norm", OpKind.ELEMENTWISE, 4 * t * d, d * b, act, act),
    ]
    ops += _dense_mlp(model, t, tp) if moe is None else _experts(model, t, tp, moe, cold)
    if tp > 1:
        combine = "mlp_all_reduce" if moe is None else "experts_combine"
        ops.append(Op(combine, OpKind.ALL_REDUCE, 0, reduce_bytes=act))
    ops.append(Op("mlp_residual", OpKind.ELEMENTWISE, t * d, 0, 2 * act, act))
    name = "decoder_layer" if moe is None else "moe_layer"
    return Block(name, tuple(ops), t, in_bytes=act, out_bytes=act, loopable=True)


def _matmul(
    model: ModelSpec, name: str, tokens: float, k: float, n: float, params: float, act_in: float
) -> Op:
    """A (tokens x k) @ (k x n) product reading `params` weights of the layer's matrices."""
    w = model.matrix_bytes_per_param
    stored = model.weight_format is not WeightFormat.NATIVE
    upcast = UPCAST_FLOPS_PER_WEIGHT * params if stored else 0
    out = tokens * n * model.bytes_per_param
    return Op(name, OpKind.MATMUL, 2 * tokens * k * n + upcast, params * w, act_in, out)


# ------------------------------------------------------------------ attention


def _attention(model: ModelSpec, r: Rows, tp: int) -> list[Op]:
    """Standard or grouped-query attention. Each new token attends to its shape's
    `attended` keys (ops.Shape: half a prompt's context on average, a decode step's
    whole context)."""
    b, t, d = model.bytes_per_param, r.tokens, model.hidden
    q, kvd, shards = model.q_dim / tp, model.kv_dim / model.kv_shards(tp), model.kv_shards(tp)
    heads = model.heads / tp
    kv_cache = r.cached * model.kv_dim * b / shards  # K (or V) of every sequence
    scores = heads * r.scored * b
    qkv = _matmul(model, "qkv_proj", t, d, q + 2 * kvd, d * (q + 2 * kvd), t * d * b)
    return [
        replace(qkv, kv_bytes=t * 2 * kvd * b),  # this step's K, V appended to the cache
        Op("rope", OpKind.ELEMENTWISE, 6 * t * (q + kvd), 0, *(2 * [t * (q + kvd) * b])),
        Op("attn_scores", OpKind.ATTENTION, 2 * r.attended * q, 0, t * q * b, scores,
           kv_bytes=kv_cache),
        Op("softmax", OpKind.ELEMENTWISE, 5 * heads * r.scored, 0, scores, scores),
        Op("attn_v", OpKind.ATTENTION, 2 * r.attended * q, 0, scores, t * q * b,
           kv_bytes=kv_cache),
        _matmul(model, "o_proj", t, q, d, q * d, t * q * b),
    ]  # fmt: skip


def _mla(model: ModelSpec, shapes: tuple[Shape, ...], tp: int) -> list[Op]:
    """Multi-head latent attention: absorbed for decode steps, expanded for prompts (a
    pass holding both runs each form on its own tokens, as vLLM's MLA backend does)."""
    a = model.mla
    assert a is not None
    b, d = model.bytes_per_param, model.hidden
    t = Rows.of(shapes).tokens
    h = model.heads / tp
    latent = a.cached  # per token and layer: latent + rotary key
    ops: list[Op] = []
    if a.q_lora_rank:
        ops.append(_matmul(model, "q_down", t, d, a.q_lora_rank, d * a.q_lora_rank, t * d * b))
        q_in, q_k = t * a.q_lora_rank * b, a.q_lora_rank
    else:
        q_in, q_k = t * d * b, d
    ops.append(_matmul(model, "q_up", t, q_k, h * a.qk_head_dim, q_k * h * a.qk_head_dim, q_in))
    kv_down = _matmul(model, "kv_down", t, d, latent, d * latent, t * d * b)
    # Every socket appends the new tokens' latents to its own whole copy of the cache.
    ops.append(replace(kv_down, kv_bytes=t * latent * b))
    absorbed = Rows.of(tuple(s for s in shapes if not s.causal))
    expanded = Rows.of(tuple(s for s in shapes if s.causal))
    if absorbed.tokens:
        ops += _mla_absorbed(model, absorbed, h)
    if expanded.tokens:
        ops += _mla_expanded(model, expanded, h)
    o = h * a.v_head_dim
    ops.append(_matmul(model, "o_proj", t, o, d, o * d, t * o * b))
    return ops


def _mla_absorbed(model: ModelSpec, r: Rows, h: float) -> list[Op]:
    """Decode: the key up-projection absorbed into the query, the value's into the
    output; each new token attends over the cached latents directly."""
    a = model.mla
    assert a is not None
    b, t = model.bytes_per_param, r.tokens
    scores = h * r.scored * b
    return [
        _matmul(model, "q_absorb", t * h, a.qk_nope_head_dim, a.kv_lora_rank,
                h * a.qk_nope_head_dim * a.kv_lora_rank, t * h * a.qk_nope_head_dim * b),
        # The latent serves as key and as value: one read, charged to the scores.
        Op("attn_scores", OpKind.ATTENTION, 2 * r.attended * h * a.cached, 0,
           t * h * a.cached * b, scores, kv_bytes=r.cached * a.cached * b),
        Op("softmax", OpKind.ELEMENTWISE, 5 * h * r.scored, 0, scores, scores),
        Op("attn_v", OpKind.ATTENTION, 2 * r.attended * h * a.kv_lora_rank, 0, scores,
           t * h * a.kv_lora_rank * b),
        _matmul(model, "v_absorb", t * h, a.kv_lora_rank, a.v_head_dim,
                h * a.kv_lora_rank * a.v_head_dim, t * h * a.kv_lora_rank * b),
    ]  # fmt: skip


def _mla_expanded(model: ModelSpec, r: Rows, h: float) -> list[Op]:
    """Prefill and training: the latent of every cached token expanded into per-head
    keys and values (DeepSeek-V2 Sec. 2.1.3)."""
    a = model.mla
    assert a is not None
    b, t = model.bytes_per_param, r.tokens
    scores = h * r.scored * b
    kv_w = a.qk_nope_head_dim + a.v_head_dim
    return [
        _matmul(model, "kv_up", r.cached, a.kv_lora_rank, h * kv_w,
                a.kv_lora_rank * h * kv_w, r.cached * a.kv_lora_rank * b),
        Op("attn_scores", OpKind.ATTENTION, 2 * r.attended * h * a.qk_head_dim, 0,
           t * h * a.qk_head_dim * b, scores),
        Op("softmax", OpKind.ELEMENTWISE, 5 * h * r.scored, 0, scores, scores),
        Op("attn_v", OpKind.ATTENTION, 2 * r.attended * h * a.v_head_dim, 0, scores,
           t * h * a.v_head_dim * b),
    ]  # fmt: skip


# ------------------------------------------------------------------ MLP and experts


def _dense_mlp(model: ModelSpec, t: int, tp: int) -> list[Op]:
    b, d, f = model.bytes_per_param, model.hidden, model.ffn / tp
    m = model.mlp_matrices - 1  # matrices before the activation: 2 gated, 1 plain
    return [
        _matmul(model, "up_proj", t, d, m * f, d * m * f, t * d * b),
        Op("activation", OpKind.ELEMENTWISE, 8 * t * f, 0, t * m * f * b, t * f * b),
        _matmul(model, "down_proj", t, f, d, f * d, t * f * b),
    ]


def _experts(model: ModelSpec, t: int, tp: int, mapping: ExpertMapping, cold: float) -> list[Op]:
    """Router, shared experts (split like a dense MLP) and the routed experts; of those
    it reads, the `cold` fraction comes from DDR first."""
    moe = model.moe
    assert moe is not None
    b, d, fe = model.bytes_per_param, model.hidden, moe.expert_ffn
    e, k = moe.routed_experts, moe.active_experts
    # The router is small and kept at full precision; every socket routes every token.
    router = Op("router", OpKind.MATMUL, 2 * t * d * e, d * e * b, t * d * b, t * e * b)
    ops = [router]
    if moe.shared_experts:
        f = moe.shared_experts * fe / tp
        ops += [
            _matmul(model, "shared_up", t, d, 2 * f, d * 2 * f, t * d * b),
            Op("shared_activation", OpKind.ELEMENTWISE, 8 * t * f, 0, 2 * t * f * b, t * f * b),
            _matmul(model, "shared_down", t, f, d, f * d, t * f * b),
        ]
    if mapping is ExpertMapping.EXPERT_PARALLEL:
        load = expert_load(moe, t, tp)
        experts, pairs, f = load.busiest_experts, load.busiest_assignments, fe
    else:
        experts, pairs, f = touched(moe, t), t * k, fe / tp
    # `pairs` (token, expert) rows through the weights of `experts` experts.
    up = _matmul(model, "experts_up", pairs, d, 2 * f, experts * d * 2 * f, pairs * d * b)
    down = _matmul(model, "experts_down", pairs, f, d, experts * f * d, pairs * f * b)
    act = Op("experts_activation", OpKind.ELEMENTWISE, 8 * pairs * f, 0, 2 * pairs * f * b,
             pairs * f * b)  # fmt: skip
    ops += [_cold(up, cold), act, _cold(down, cold)]
    return ops


def _cold(op: Op, cold: float) -> Op:
    """The op with the `cold` share of its weights copied from DDR before it runs."""
    return replace(op, ddr_bytes=cold * op.weight_bytes) if cold else op


def expert_mapping(model: ModelSpec, tp: int) -> ExpertMapping | None:
    """The mapping of a model's experts over `tp` sockets: the model's, else
    expert-parallel where the experts divide evenly over the group, else
    tensor-parallel. None for a dense model."""
    if model.moe is None:
        return None
    if model.moe.mapping is not None:
        return model.moe.mapping
    if model.moe.routed_experts % tp == 0:
        return ExpertMapping.EXPERT_PARALLEL
    return ExpertMapping.TENSOR_PARALLEL


def check_tp(model: ModelSpec, tp: int, mapping: ExpertMapping | None) -> None:
    """The splits this group needs must be whole."""
    if model.heads % tp:
        raise InvalidRequest(
            f"{model.name}: TP over {tp} sockets must divide heads ({model.heads})"
        )
    if model.dense_layers and model.ffn % tp:
        raise InvalidRequest(f"{model.name}: TP over {tp} sockets must divide ffn ({model.ffn})")
    moe = model.moe
    if moe is None or mapping is None:
        return
    if (moe.shared_experts * moe.expert_ffn) % tp:
        raise InvalidRequest(
            f"{model.name}: TP over {tp} sockets must divide the shared experts' ffn "
            f"({moe.shared_experts} x {moe.expert_ffn})"
        )
    if mapping is ExpertMapping.EXPERT_PARALLEL and moe.routed_experts % tp:
        raise InvalidRequest(
            f"{model.name}: {moe.routed_experts} experts do not divide over {tp} sockets; "
            "place them tensor-parallel"
        )
    if mapping is ExpertMapping.TENSOR_PARALLEL and moe.expert_ffn % tp:
        raise InvalidRequest(
            f"{model.name}: TP over {tp} sockets must divide the experts' ffn ({moe.expert_ffn})"
        )
