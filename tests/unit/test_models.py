"""Model presets against their published parameter counts."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rdurack.errors import UnknownName
from rdurack.rack.models import ModelSpec, builtin_models, model
from rdurack.workloads.tiny_lm.model import TinyLM, TinyLMConfig, model_spec

# Published sizes (model cards / papers), in parameters.
PUBLISHED = {
    "llama2-7b": 6.74e9,
    "llama2-13b": 13.0e9,
    "llama2-70b": 68.98e9,
    "mistral-7b": 7.24e9,
    "falcon-40b": 41.8e9,
    "bloom-176b": 176.2e9,
    "llama3.1-8b": 8.03e9,
    "llama3.1-70b": 70.6e9,
    "llama3.1-405b": 405.9e9,
    "llama3.2-1b": 1.24e9,
    # Mixture of experts: total parameters (DeepSeek-V3 report: 671B without its 14B
    # multi-token-prediction module; Mixtral paper: 46.7B; Qwen3 model card: 235B).
    "deepseek-r1": 671e9,
    "mixtral-8x7b": 46.7e9,
    "qwen3-235b-a22b": 235e9,
}
# Parameters one token runs through, as published (DeepSeek-V3: 37B; Mixtral: 12.9B;
# Qwen3: 22B). rdurack leaves the embedding table out (a lookup reads one row).
ACTIVE = {"deepseek-r1": 37e9, "mixtral-8x7b": 12.9e9, "qwen3-235b-a22b": 22e9}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_count_matches_published(name: str) -> None:
    assert model(name).params == pytest.approx(PUBLISHED[name], rel=0.01)


@pytest.mark.parametrize("name", sorted(ACTIVE))
def test_active_parameters_match_published(name: str) -> None:
    assert model(name).active_params == pytest.approx(ACTIVE[name], rel=0.03)


def test_fp8_weights_take_a_byte_and_their_block_scales() -> None:
    r1 = model("deepseek-r1")
    # The reference: 671 GB of FP8 weights fit the rack's 1 TB of HBM.
    assert 660e9 < r1.weight_bytes < 680e9
    assert r1.matrix_bytes_per_param == 1 + 4 / (128 * 128)


def test_mla_caches_the_latent_and_rotary_key() -> None:
    # 61 layers x (512 + 64) values x 2 bytes: 70 KB per token, against 4 MB if the 128
    # heads cached their keys and values.
    r1 = model("deepseek-r1")
    assert r1.kv_bytes_per_token() == 61 * 576 * 2
    assert r1.kv_shards(16) == 1  # every socket holds the whole latent
    assert model("llama3.1-70b").kv_shards(16) == 8  # 8 KV heads: copies past 8 sockets


def test_every_preset_has_a_published_size_but_our_own_tiny_expert() -> None:
    assert set(builtin_models()) == set(PUBLISHED) | {"tiny-lm"}


def test_the_tiny_lm_preset_is_the_shape_of_the_functional_model() -> None:
    shape = model_spec(TinyLMConfig(), "tiny-lm")
    assert model("tiny-lm").model_copy(update={"source": ""}) == shape.model_copy(
        update={"source": ""}
    )
    assert model("tiny-lm").params == TinyLM(TinyLMConfig(), seed=1).parameter_count


def test_kv_cache_per_token_uses_kv_heads() -> None:
    # Llama 3.1 8B: 32 layers x K and V x 8 kv heads x 128 dims x 2 bytes = 128 KiB.
    assert model("llama3.1-8b").kv_bytes_per_token() == 32 * 2 * 8 * 128 * 2
    # Llama 2 7B has no grouped-query attention: 4x as much.
    assert model("llama2-7b").kv_bytes_per_token() == 4 * model("llama3.1-8b").kv_bytes_per_token()


def test_weight_bytes_are_bf16() -> None:
    m = model("llama2-7b")
    assert m.weight_bytes == 2 * m.params


def test_heads_must_divide() -> None:
    with pytest.raises(ValidationError, match="not a multiple of kv_heads"):
        ModelSpec(name="x", layers=1, hidden=64, heads=8, kv_heads=3, ffn=128, vocab=10)
    with pytest.raises(ValidationError, match="not a multiple of heads"):
        ModelSpec(name="x", layers=1, hidden=60, heads=8, kv_heads=8, ffn=128, vocab=10)


def test_unknown_model_lists_accepted() -> None:
    with pytest.raises(UnknownName, match="llama2-7b"):
        model("gpt-5")
