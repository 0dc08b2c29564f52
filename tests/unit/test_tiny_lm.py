"""TinyLM: tensor-parallel greedy generation equals the single-device reference."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from pydantic import ValidationError

from rdurack.errors import InvalidRequest
from rdurack.workloads.tiny_lm.generation import (
    Generation,
    all_reduce_traffic,
    generate,
    generate_detailed,
    generation_steps,
    reference_generate,
    tensor_parallel_generate,
)
from rdurack.workloads.tiny_lm.model import Array, TinyLM, TinyLMConfig, model_spec, seed_for

CONFIG = TinyLMConfig()
PROMPT = list(b"Hello, rack!")
NEW = 12


@pytest.fixture(scope="module")
def model() -> TinyLM:
    return TinyLM(CONFIG, seed=7)


def _identity(x: Array) -> Array:
    return x


class ThreadAllReduce:
    """An in-process all-reduce for ranks running in threads: each rank posts its
    partial, waits for all, and sums in rank order (so every rank gets the same bits)."""

    def __init__(self, world: int) -> None:
        self.barrier = threading.Barrier(world, timeout=30)
        self.slots: list[Array | None] = [None] * world
        self.payload_bytes: list[list[int]] = [[] for _ in range(world)]

    def for_rank(self, rank: int) -> ThreadAllReduceRank:
        return ThreadAllReduceRank(self, rank)


class ThreadAllReduceRank:
    def __init__(self, group: ThreadAllReduce, rank: int) -> None:
        self.group, self.rank = group, rank

    def __call__(self, partial: Array) -> Array:
        g = self.group
        g.payload_bytes[self.rank].append(partial.nbytes)
        g.slots[self.rank] = partial
        g.barrier.wait()
        parts = [s for s in g.slots if s is not None]
        total = parts[0].copy()
        for p in parts[1:]:
            total += p
        g.barrier.wait()  # nobody posts the next partial before every rank has summed
        return total


def run_threads(model: TinyLM, world: int, prompt: list[int], new: int) -> list[Generation]:
    group = ThreadAllReduce(world)

    def rank(r: int) -> Generation:
        try:
            return generate_detailed(model.shard(r, world), prompt, new, group.for_rank(r))
        except BaseException:
            group.barrier.abort()  # free the other ranks instead of hanging them
            raise

    with ThreadPoolExecutor(max_workers=world) as pool:
        results = list(pool.map(rank, range(world)))
    for r in range(world):
        traffic = all_reduce_traffic(model.config, len(prompt), new)
        assert group.payload_bytes[r] == list(traffic.payload_bytes)
    return results


# ------------------------------------------------------------------ TP equals reference


@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_tp_in_threads_gives_the_reference_tokens_and_logits(model: TinyLM, world: int) -> None:
    reference = generate_detailed(model.shard(0, 1), PROMPT, NEW, _identity)
    assert reference.tokens == reference_generate(model, PROMPT, NEW)

    results = run_threads(model, world, PROMPT, NEW)

    expected_calls = all_reduce_traffic(CONFIG, len(PROMPT), NEW).count
    for g in results:
        assert g.tokens == reference.tokens
        assert g.all_reduces == expected_calls
        assert g.logits.dtype == np.float64
        np.testing.assert_allclose(g.logits, reference.logits, rtol=0, atol=1e-9)


@pytest.mark.parametrize("world", [2, 8])
def test_in_process_lock_step_driver_matches_the_reference(model: TinyLM, world: int) -> None:
    reference = generate_detailed(model.shard(0, 1), PROMPT, NEW, _identity)

    g = tensor_parallel_generate(model, world, PROMPT, NEW)

    assert g.tokens == reference.tokens
    np.testing.assert_allclose(g.logits, reference.logits, rtol=0, atol=1e-9)


def test_a_shard_without_its_all_reduce_goes_wrong(model: TinyLM) -> None:
    # The test above has teeth: half the heads and half the MLP alone do not reproduce
    # the reference, so the all-reduces carry real information.
    reference = reference_generate(model, PROMPT, NEW)
    assert generate(model.shard(0, 2), PROMPT, NEW, _identity) != reference


def test_the_greedy_margin_dwarfs_tp_rounding(model: TinyLM) -> None:
    # Why float64 suffices: TP moves logits by ~1e-15; the top-2 gap is orders larger.
    reference = generate_detailed(model.shard(0, 1), PROMPT, 32, _identity)
    tp = tensor_parallel_generate(model, 8, PROMPT, 32)
    top2 = np.sort(reference.logits, axis=1)[:, -2:]
    assert float(np.min(top2[:, 1] - top2[:, 0])) > 1e6 * float(
        np.max(np.abs(tp.logits - reference.logits))
    )


def test_the_kv_cache_equals_recomputing_the_whole_sequence(model: TinyLM) -> None:
    full = model.shard(0, 1)
    g = generate_detailed(full, PROMPT, 6, _identity)
    for k in range(6):
        # A fresh prefill over prompt + the first k new tokens predicts token k.
        again = generate_detailed(full, PROMPT + g.tokens[:k], 1, _identity)
        assert again.tokens == [g.tokens[k]]
        np.testing.assert_allclose(again.logits[0], g.logits[k], rtol=0, atol=1e-12)


def test_generate_returns_only_the_new_tokens_all_in_the_vocabulary(model: TinyLM) -> None:
    tokens = generate(model.shard(0, 1), PROMPT, NEW, _identity)
    assert len(tokens) == NEW
    assert all(isinstance(t, int) and 0 <= t < CONFIG.vocab for t in tokens)
    assert generate(model.shard(0, 1), PROMPT, 0, _identity) == []


def test_outputs_depend_on_seed_and_prompt_and_repeat_exactly() -> None:
    a, b = TinyLM(CONFIG, seed=1), TinyLM(CONFIG, seed=2)
    assert reference_generate(a, PROMPT, 16) != reference_generate(b, PROMPT, 16)
    assert reference_generate(a, PROMPT, 16) != reference_generate(a, list(b"Bye"), 16)
    # The same seed rebuilds the same expert (each socket builds its own copy).
    assert reference_generate(a, PROMPT, 16) == reference_generate(TinyLM(CONFIG, 1), PROMPT, 16)
    assert seed_for("coding-python") == seed_for("coding-python") != seed_for("law-tax")


# ------------------------------------------------------------------ shards and sizes


def test_shards_hold_megatron_blocks_of_the_full_weights(model: TinyLM) -> None:
    world = 4
    full = model.shard(0, 1)
    shards = [model.shard(r, world) for r in range(world)]
    for i, layer in enumerate(full.layers):
        parts = [s.layers[i] for s in shards]
        for name in ("wq", "wk", "wv", "w1"):  # column blocks
            joined = np.concatenate([getattr(p, name) for p in parts], axis=1)
            np.testing.assert_array_equal(joined, getattr(layer, name))
        for name in ("wo", "w2"):  # row blocks
            joined = np.concatenate([getattr(p, name) for p in parts], axis=0)
            np.testing.assert_array_equal(joined, getattr(layer, name))
        # Rank 1 holds heads 2..3 of 8: columns 16..31 of Wq (head_dim 8).
        np.testing.assert_array_equal(parts[1].wq, layer.wq[:, 16:32])
    assert all(s.embed is full.embed and s.unembed is full.unembed for s in shards)
    assert all(s.local_heads == 2 for s in shards)


def test_parameter_count_and_bytes_match_the_timing_models_spec(model: TinyLM) -> None:
    spec = model_spec(CONFIG, "tiny")
    assert (spec.bytes_per_param, spec.mlp, spec.kv_heads) == (8, "plain", CONFIG.heads)
    assert model.parameter_count == spec.params
    assert model.weight_bytes == spec.weight_bytes == 8 * spec.params

    # A rank holds the replicated weights in full and 1/world of the layer matrices.
    world = 8
    layer_matrices = CONFIG.layers * (spec.attention_params + spec.mlp_params)
    replicated = spec.params - layer_matrices
    assert model.shard(3, world).parameter_count == replicated + layer_matrices // world


def test_all_reduce_traffic_counts_two_per_layer_per_forward_pass() -> None:
    config = TinyLMConfig(layers=3, hidden=32, heads=4)
    t = all_reduce_traffic(config, prompt_tokens=10, max_new_tokens=5)
    # 1 prefill (10 tokens) + 4 decode passes (1 token each); 2 x 3 layers per pass.
    assert t.count == 5 * 2 * 3
    assert t.payload_bytes[:6] == (10 * 32 * 8,) * 6
    assert t.payload_bytes[6:] == (32 * 8,) * 24
    assert t.total_bytes == 2 * 3 * 32 * 8 * (10 + 4)
    assert all_reduce_traffic(config, 10, 0).count == 0


def test_the_coroutine_yields_one_partial_per_all_reduce(model: TinyLM) -> None:
    steps = generation_steps(model.shard(0, 2), PROMPT, 2)
    shapes = []
    partial = next(steps)
    with pytest.raises(StopIteration):
        while True:
            shapes.append(partial.shape)
            partial = steps.send(partial * 2)  # as if the other rank had the same partial
    assert shapes == [(len(PROMPT), CONFIG.hidden)] * 4 + [(1, CONFIG.hidden)] * 4


# ------------------------------------------------------------------ errors


def test_config_needs_heads_to_divide_hidden() -> None:
    with pytest.raises(ValidationError, match="hidden 60 is not a multiple of heads 8"):
        TinyLMConfig(hidden=60)
    with pytest.raises(ValidationError):
        TinyLMConfig(layers=0)


@pytest.mark.parametrize(
    ("world", "rank", "message"),
    [
        (3, 0, "world 3 must divide heads 8 and ffn 256"),
        (16, 0, "world 16 must divide heads 8"),
        (0, 0, "world must be >= 1, got 0"),
        (2, 2, "rank 2 is outside world 2"),
    ],
)
def test_bad_world_or_rank_is_an_invalid_request(
    model: TinyLM, world: int, rank: int, message: str
) -> None:
    with pytest.raises(InvalidRequest, match=message):
        model.shard(rank, world)


@pytest.mark.parametrize(
    ("prompt", "new", "message"),
    [
        ([], 4, "prompt is empty"),
        ([72, 256, -1], 4, r"\[0, 256\): got \[256, -1\]"),
        ([65] * 500, 20, "500 tokens \\+ 20 new tokens = 520 exceeds max_seq 512"),
        ([65], -1, "max_new_tokens must be >= 0, got -1"),
    ],
)
def test_bad_prompts_are_invalid_requests(
    model: TinyLM, prompt: list[int], new: int, message: str
) -> None:
    with pytest.raises(InvalidRequest, match=message):
        generate(model.shard(0, 1), prompt, new, _identity)
    # The coroutine refuses before its first step, not at the first next().
    with pytest.raises(InvalidRequest, match=message):
        generation_steps(model.shard(0, 1), prompt, new)


def test_a_broken_all_reduce_is_named(model: TinyLM) -> None:
    with pytest.raises(InvalidRequest, match="all-reduce returned \\(1, 64\\), expected shape"):
        generate(model.shard(0, 1), PROMPT, 2, lambda x: x[:1])
    with pytest.raises(InvalidRequest, match="dtype float32, expected float64"):
        generate(model.shard(0, 1), PROMPT, 2, lambda x: x.astype(np.float32))


def test_negative_seed_is_refused() -> None:
    with pytest.raises(InvalidRequest, match="seed must be >= 0, got -1"):
        TinyLM(CONFIG, -1)
