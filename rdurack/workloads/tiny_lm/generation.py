"""Greedy generation with the tiny LM (model.py), tensor-parallel: a prefill pass over the
prompt, then one decode pass per further token, each rank's partial sums met by the
caller's all-reduce (two per layer per pass), a KV cache for keys and values.

Everything is float64 (model.py says why); with a correct all-reduce the tokens equal
`reference_generate`'s, the single-device run.
"""

from __future__ import annotations

import math
from collections.abc import Generator, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from rdurack.errors import InvalidRequest
from rdurack.workloads.tiny_lm.model import (
    BYTES_PER_PARAM,
    AllReduce,
    Array,
    LayerWeights,
    TinyLM,
    TinyLMConfig,
    TinyLMShard,
)

NORM_EPS = 1e-6  # RMSNorm epsilon: keeps a zero vector finite
POSITION_BASE = 10_000.0  # sinusoidal positions, as in "Attention Is All You Need"


@dataclass(frozen=True)
class Generation:
    """What one generate call produced."""

    tokens: list[int]  # the new tokens only
    logits: Array  # (new tokens, vocab): the logits each token was the argmax of
    all_reduces: int  # all-reduce calls this rank made


@dataclass(frozen=True)
class AllReduceTraffic:
    """All-reduces one generate call makes on each rank (the same on every rank)."""

    count: int
    payload_bytes: tuple[int, ...]  # size of each call's tensor, in call order
    total_bytes: int  # sum of payload_bytes: one rank's tensors, not the link traffic


def _validate(config: TinyLMConfig, prompt_tokens: int, max_new_tokens: int) -> None:
    if prompt_tokens < 1:
        raise InvalidRequest("the prompt is empty: generation needs at least 1 token")
    if max_new_tokens < 0:
        raise InvalidRequest(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    total = prompt_tokens + max_new_tokens
    if total > config.max_seq:
        raise InvalidRequest(
            f"prompt of {prompt_tokens} tokens + {max_new_tokens} new tokens = {total} "
            f"exceeds max_seq {config.max_seq}"
        )


def all_reduce_traffic(
    config: TinyLMConfig, prompt_tokens: int, max_new_tokens: int
) -> AllReduceTraffic:
    """All-reduces of one generate call. Forward passes: 1 prefill over the prompt (it
    yields the first new token), then one decode pass per further token, so
    `max_new_tokens` passes (the last token is never fed back). Each pass makes 2 per
    layer, of (tokens in the pass x hidden) float64 values."""
    _validate(config, prompt_tokens, max_new_tokens)
    passes = [prompt_tokens] + [1] * (max_new_tokens - 1) if max_new_tokens else []
    payload = tuple(
        t * config.hidden * BYTES_PER_PARAM for t in passes for _ in range(2 * config.layers)
    )
    return AllReduceTraffic(count=len(payload), payload_bytes=payload, total_bytes=sum(payload))


def _positions(start: int, count: int, hidden: int) -> Array:
    """Sinusoidal position encodings for positions start..start+count-1: (count, hidden)."""
    pos = np.arange(start, start + count, dtype=np.float64)[:, None]
    dims = np.arange(hidden)
    freq = POSITION_BASE ** (-(2 * (dims // 2)).astype(np.float64) / hidden)
    angle = pos * freq[None, :]
    out: Array = np.where(dims % 2 == 0, np.sin(angle), np.cos(angle))
    return out


def _rms_norm(x: Array, gain: Array) -> Array:
    scale = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + NORM_EPS)
    out: Array = x * scale * gain
    return out


def _gelu(x: Array) -> Array:
    """GELU, tanh approximation (GPT-2's)."""
    out: Array = 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
    return out


class _KVCache:
    """This rank's keys and values: per layer (positions, local heads, head_dim)."""

    def __init__(self, shard: TinyLMShard, positions: int) -> None:
        shape = (positions, shard.local_heads, shard.config.head_dim)
        self.k = [np.zeros(shape, dtype=np.float64) for _ in shard.layers]
        self.v = [np.zeros(shape, dtype=np.float64) for _ in shard.layers]


def _attention_partial(
    h: Array, layer: LayerWeights, k_cache: Array, v_cache: Array, start: int
) -> Array:
    """This rank's heads for tokens at positions start..start+t-1, projected by its Wo
    row block: a partial sum of the layer's attention output, (t, hidden)."""
    t = h.shape[0]
    heads, head_dim = k_cache.shape[1], k_cache.shape[2]
    end = start + t
    q = (h @ layer.wq).reshape(t, heads, head_dim)
    k_cache[start:end] = (h @ layer.wk).reshape(t, heads, head_dim)
    v_cache[start:end] = (h @ layer.wv).reshape(t, heads, head_dim)
    k, v = k_cache[:end], v_cache[:end]
    scores = np.einsum("qhd,khd->hqk", q, k) / math.sqrt(head_dim)
    # Causal: the query at position start+i sees keys at positions 0..start+i.
    future = np.arange(end)[None, :] > (start + np.arange(t))[:, None]
    scores = np.where(future[None, :, :], -np.inf, scores)
    scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
    weights = scores / scores.sum(axis=-1, keepdims=True)
    out = np.einsum("hqk,khd->qhd", weights, v).reshape(t, heads * head_dim)
    partial: Array = out @ layer.wo
    return partial


def _reduced(partial: Array, total: Array) -> Array:
    """Check what the caller's all-reduce returned: a wrong shape or dtype is a bug in
    the transport, better named here than as a silently wrong token."""
    if not isinstance(total, np.ndarray) or total.shape != partial.shape:
        got = getattr(total, "shape", type(total).__name__)
        raise InvalidRequest(f"all-reduce returned {got}, expected shape {partial.shape}")
    if total.dtype != np.float64:
        raise InvalidRequest(f"all-reduce returned dtype {total.dtype}, expected float64")
    return total


def _forward(
    shard: TinyLMShard, cache: _KVCache, tokens: npt.NDArray[np.intp], start: int
) -> Generator[Array, Array, Array]:
    """One forward pass over `tokens` (at positions start..): yields each partial sum,
    receives the all-reduced sum, returns the logits of the last token, (vocab,)."""
    x = shard.embed[tokens] + _positions(start, len(tokens), shard.config.hidden)
    for i, layer in enumerate(shard.layers):
        partial = _attention_partial(
            _rms_norm(x, layer.attn_norm), layer, cache.k[i], cache.v[i], start
        )
        x = x + _reduced(partial, (yield partial))
        partial = _gelu(_rms_norm(x, layer.mlp_norm) @ layer.w1) @ layer.w2
        x = x + _reduced(partial, (yield partial))
    logits: Array = (_rms_norm(x[-1], shard.final_norm) @ shard.unembed).astype(np.float64)
    return logits


def _steps(
    shard: TinyLMShard, prompt: list[int], max_new_tokens: int
) -> Generator[Array, Array, Generation]:
    cache = _KVCache(shard, len(prompt) + max_new_tokens)
    feed = np.asarray(prompt, dtype=np.intp)
    start, calls = 0, 0
    tokens: list[int] = []
    rows: list[Array] = []
    for _ in range(max_new_tokens):
        step = _forward(shard, cache, feed, start)
        # Drive the pass by hand (not `yield from`) to count its all-reduces.
        try:
            partial = next(step)
            while True:
                calls += 1
                partial = step.send((yield partial))
        except StopIteration as done:
            logits: Array = done.value
        token = int(np.argmax(logits))  # greedy; ties go to the lowest id
        tokens.append(token)
        rows.append(logits)
        start += len(feed)
        feed = np.asarray([token], dtype=np.intp)
    stacked = np.stack(rows) if rows else np.zeros((0, shard.config.vocab), dtype=np.float64)
    return Generation(tokens=tokens, logits=stacked, all_reduces=calls)


def generation_steps(
    shard: TinyLMShard, prompt: Sequence[int], max_new_tokens: int
) -> Generator[Array, Array, Generation]:
    """Greedy generation as a coroutine, for callers that drive ranks themselves: it
    yields each partial sum, must be sent the all-reduced sum, and returns (in
    StopIteration.value) the Generation. Validates before the first step."""
    ids = _checked_prompt(shard.config, prompt, max_new_tokens)
    return _steps(shard, ids, max_new_tokens)


def _checked_prompt(config: TinyLMConfig, prompt: Sequence[int], max_new_tokens: int) -> list[int]:
    _validate(config, len(prompt), max_new_tokens)
    ids = [int(t) for t in prompt]
    bad = [t for t in ids if not 0 <= t < config.vocab]
    if bad:
        raise InvalidRequest(
            f"token ids must be in [0, {config.vocab}): got {bad[:5]}"
            + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        )
    return ids


def generate_detailed(
    shard: TinyLMShard, prompt: Sequence[int], max_new_tokens: int, all_reduce: AllReduce
) -> Generation:
    """`generate`, also returning the logits and the all-reduce count."""
    steps = generation_steps(shard, prompt, max_new_tokens)
    try:
        partial = next(steps)
        while True:
            partial = steps.send(all_reduce(partial))
    except StopIteration as done:
        result: Generation = done.value
        return result


def generate(
    shard: TinyLMShard, prompt: Sequence[int], max_new_tokens: int, all_reduce: AllReduce
) -> list[int]:
    """Greedy decoding on one rank: exactly `max_new_tokens` new tokens (no stop token,
    so every rank makes the same all-reduce calls: see `all_reduce_traffic`)."""
    return generate_detailed(shard, prompt, max_new_tokens, all_reduce).tokens


def _identity(partial: Array) -> Array:
    return partial


def reference_generate(model: TinyLM, prompt: Sequence[int], max_new_tokens: int) -> list[int]:
    """The single-device run: world 1, the all-reduce is the identity."""
    return generate(model.shard(0, 1), prompt, max_new_tokens, _identity)


def tensor_parallel_generate(
    model: TinyLM, world: int, prompt: Sequence[int], max_new_tokens: int
) -> Generation:
    """All `world` ranks in one process, in lock step, with an in-process all-reduce
    (partials summed in rank order, so every rank gets the same bits). Returns rank 0's
    Generation; the fast path when no links are emulated."""
    steps = [generation_steps(model.shard(r, world), prompt, max_new_tokens) for r in range(world)]
    done: list[Generation] = []
    partials: list[Array] = []
    for s in steps:
        try:
            partials.append(next(s))
        except StopIteration as stop:
            done.append(stop.value)
    while not done:
        total = partials[0].copy()
        for p in partials[1:]:
            total += p
        partials = []
        for s in steps:
            try:
                partials.append(s.send(total))
            except StopIteration as stop:
                done.append(stop.value)
    # Ranks run the same control flow on the same sums: they finish together, agreeing.
    if len(done) != world or any(g.tokens != done[0].tokens for g in done):
        raise RuntimeError(f"TP ranks disagreed: {[g.tokens for g in done]}")
    return done[0]
