"""Decoder-only transformer models: the shape the timing model decomposes into operators."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rdurack.config import Config
from rdurack.errors import UnknownName


class ModelSpec(Config):
    """A decoder-only transformer. Biases and position embeddings are left out: they are
    well under 1% of the parameters of every preset."""

    name: str
    layers: int = Field(gt=0)
    hidden: int = Field(gt=0)
    heads: int = Field(gt=0)
    kv_heads: int = Field(gt=0)
    ffn: int = Field(gt=0)
    vocab: int = Field(gt=0)
    bytes_per_param: int = Field(default=2, gt=0)  # BF16
    # "gated": SwiGLU (gate, up, down: three matrices); "plain": GELU MLP (two).
    mlp: Literal["gated", "plain"] = "gated"
    tied_embeddings: bool = False
    source: str = ""

    @model_validator(mode="after")
    def _heads_divide(self) -> ModelSpec:
        if self.hidden % self.heads:
            raise ValueError(f"hidden {self.hidden} is not a multiple of heads {self.heads}")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads {self.heads} is not a multiple of kv_heads {self.kv_heads}")
        return self

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        """Width of K (and of V) per token: kv_heads x head_dim."""
        return self.kv_heads * self.head_dim

    @property
    def mlp_matrices(self) -> int:
        return 3 if self.mlp == "gated" else 2

    @property
    def attention_params(self) -> int:
        """Q, K, V and output projections of one layer."""
        return self.hidden * (self.hidden + 2 * self.kv_dim) + self.hidden * self.hidden

    @property
    def mlp_params(self) -> int:
        return self.mlp_matrices * self.hidden * self.ffn

    @property
    def layer_params(self) -> int:
        return self.attention_params + self.mlp_params + 2 * self.hidden  # + two norms

    @property
    def embedding_params(self) -> int:
        """Token embedding, LM head (unless tied) and the final norm."""
        heads = 1 if self.tied_embeddings else 2
        return heads * self.vocab * self.hidden + self.hidden

    @property
    def params(self) -> int:
        return self.layers * self.layer_params + self.embedding_params

    @property
    def weight_bytes(self) -> int:
        return self.params * self.bytes_per_param

    def kv_bytes_per_token(self) -> int:
        """KV cache bytes one token adds across all layers (K and V)."""
        return 2 * self.layers * self.kv_dim * self.bytes_per_param


def _m(
    name: str,
    layers: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    ffn: int,
    vocab: int,
    mlp: Literal["gated", "plain"] = "gated",
    tied: bool = False,
) -> ModelSpec:
    return ModelSpec(
        name=name,
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        ffn=ffn,
        vocab=vocab,
        mlp=mlp,
        tied_embeddings=tied,
        source=f"{name}: the model's published config (num_hidden_layers, hidden_size, ...)",
    )


def builtin_models() -> dict[str, ModelSpec]:
    """The presets, by name: PAPER Table III's models, Llama 3.1 (KL) and tiny-lm."""
    models = [
        _m("llama2-7b", 32, 4096, 32, 32, 11008, 32000),
        _m("llama2-13b", 40, 5120, 40, 40, 13824, 32000),
        _m("llama2-70b", 80, 8192, 64, 8, 28672, 32000),
        _m("mistral-7b", 32, 4096, 32, 8, 14336, 32000),
        _m("falcon-40b", 60, 8192, 128, 8, 32768, 65024, mlp="plain"),
        _m("bloom-176b", 70, 14336, 112, 112, 57344, 250880, mlp="plain", tied=True),
        _m("llama3.1-8b", 32, 4096, 32, 8, 14336, 128256),
        _m("llama3.1-70b", 80, 8192, 64, 8, 28672, 128256),
        _m("llama3.1-405b", 126, 16384, 128, 8, 53248, 128256),
        # Small enough for one socket to hold a whole replica: DDP (data parallel) demos.
        _m("llama3.2-1b", 16, 2048, 32, 8, 8192, 128256, tied=True),
    ]
    # rdurack's own functional-mode expert: the shapes of workloads/tiny_lm/'s default
    # TinyLMConfig, float64 weights (a test keeps the two equal).
    models.append(
        ModelSpec(
            name="tiny-lm",
            layers=2,
            hidden=64,
            heads=8,
            kv_heads=8,
            ffn=256,
            vocab=256,
            bytes_per_param=8,
            mlp="plain",
            source="rdurack workloads/tiny_lm/: a tiny real model for functional runs",
        )
    )
    return {m.name: m for m in models}


def model(name: str) -> ModelSpec:
    models = builtin_models()
    if name not in models:
        raise UnknownName("model", name, sorted(models))
    return models[name]
