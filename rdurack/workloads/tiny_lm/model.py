"""A tiny decoder-only language model that really generates tokens, tensor-parallel: its
config, weights and shards (generation in generation.py).

Functional mode runs CoE experts as this model: byte-level tokens, greedy decoding,
Megatron-style tensor parallelism (TP) over up to 8 sockets. Each socket holds one
`TinyLMShard`; the shards meet at two all-reduces per layer per forward pass (after
the attention output projection and after the MLP's second matmul), which the caller
carries over the emulated links. With a correct all-reduce the tokens are identical to
`reference_generate`, the single-device run.

Everything is float64: TP changes the order of summation, and float64 keeps those
differences (~1e-15) far below the gap between the two largest logits, so a greedy
argmax never flips. Weights come from `np.random.default_rng(seed)`: the same seed
gives the same expert on every socket and in every process, with nothing to ship.

Architecture (per layer): x += Attn(RMSNorm(x)); x += MLP(RMSNorm(x)), with causal
multi-head attention, a GELU (tanh) MLP, fixed sinusoidal positions (no parameters, so
the parameter count equals `model_spec(...).params`), a final RMSNorm and a separate
unembedding. No biases. A KV cache holds keys and values: the prompt is one prefill
pass, each further token one decode pass.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from pydantic import Field, model_validator

from rdurack.config import Config
from rdurack.errors import InvalidRequest
from rdurack.rack.models import ModelSpec

Array = npt.NDArray[np.float64]
AllReduce = Callable[[Array], Array]
"""Takes this rank's partial sum, returns the sum over all ranks (same shape, float64).
Every rank must get bitwise the same sum (a ring all-reduce does: each chunk is reduced
once, then copied), or the ranks' greedy choices could drift apart."""

BYTES_PER_PARAM = 8  # float64


class TinyLMConfig(Config):
    """Shape of a tiny expert. Defaults: byte-level vocabulary, 131,392 parameters (1.05 MB)."""

    vocab: int = Field(default=256, gt=0)  # 256: one token per UTF-8 byte
    hidden: int = Field(default=64, gt=0)
    heads: int = Field(default=8, gt=0)
    ffn: int = Field(default=256, gt=0)
    layers: int = Field(default=2, gt=0)
    max_seq: int = Field(default=512, gt=0)  # prompt + new tokens, in tokens

    @model_validator(mode="after")
    def _heads_divide_hidden(self) -> TinyLMConfig:
        if self.hidden % self.heads:
            raise ValueError(f"hidden {self.hidden} is not a multiple of heads {self.heads}")
        return self

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


@dataclass(frozen=True)
class LayerWeights:
    """One decoder layer as one rank holds it; `local` = this rank's share."""

    attn_norm: Array  # (hidden,), replicated
    wq: Array  # (hidden, local_heads * head_dim): column block
    wk: Array  # (hidden, local_heads * head_dim): column block
    wv: Array  # (hidden, local_heads * head_dim): column block
    wo: Array  # (local_heads * head_dim, hidden): row block -> partial sum
    mlp_norm: Array  # (hidden,), replicated
    w1: Array  # (hidden, local_ffn): column block
    w2: Array  # (local_ffn, hidden): row block -> partial sum

    def arrays(self) -> tuple[Array, ...]:
        return (
            self.attn_norm,
            self.wq,
            self.wk,
            self.wv,
            self.wo,
            self.mlp_norm,
            self.w1,
            self.w2,
        )

    def block(self, rank: int, world: int) -> LayerWeights:
        """Rank `rank`'s Megatron block: heads and ffn columns [r/w, (r+1)/w)."""
        attn = self.wq.shape[1] // world  # = local_heads * head_dim: whole heads
        ffn = self.w1.shape[1] // world
        a, f = slice(rank * attn, (rank + 1) * attn), slice(rank * ffn, (rank + 1) * ffn)
        return LayerWeights(
            attn_norm=self.attn_norm,
            wq=_frozen(self.wq[:, a]),
            wk=_frozen(self.wk[:, a]),
            wv=_frozen(self.wv[:, a]),
            wo=_frozen(self.wo[a, :]),
            mlp_norm=self.mlp_norm,
            w1=_frozen(self.w1[:, f]),
            w2=_frozen(self.w2[f, :]),
        )


def _frozen(a: Array) -> Array:
    """A contiguous read-only copy: a shard owns its block (it may be pickled to an
    actor), and nothing may change weights that several shards share."""
    out = np.ascontiguousarray(a, dtype=np.float64)
    out.flags.writeable = False
    return out


@dataclass(frozen=True)
class TinyLMShard:
    """The weights rank `rank` of `world` holds. World 1 is the whole model."""

    config: TinyLMConfig
    seed: int
    rank: int
    world: int
    embed: Array  # (vocab, hidden), replicated
    layers: tuple[LayerWeights, ...]
    final_norm: Array  # (hidden,), replicated
    unembed: Array  # (hidden, vocab), replicated

    @property
    def local_heads(self) -> int:
        return self.config.heads // self.world

    def arrays(self) -> tuple[Array, ...]:
        layer_arrays = tuple(a for layer in self.layers for a in layer.arrays())
        return (self.embed, *layer_arrays, self.final_norm, self.unembed)

    @property
    def parameter_count(self) -> int:
        """Parameters this rank holds (replicated ones counted in full)."""
        return sum(a.size for a in self.arrays())

    @property
    def weight_bytes(self) -> int:
        return sum(a.nbytes for a in self.arrays())


class TinyLM:
    """The full weights of one expert, generated from `seed` (distinct seeds give
    distinct experts)."""

    def __init__(self, config: TinyLMConfig, seed: int) -> None:
        if seed < 0:
            raise InvalidRequest(f"seed must be >= 0, got {seed}")
        self.config = config
        self.seed = seed
        c = config
        rng = np.random.default_rng(seed)

        def normal(fan_in: int, *shape: int) -> Array:
            # N(0, 1/fan_in): each output of x @ W keeps x's O(1) scale.
            w = rng.standard_normal(shape, dtype=np.float64) / math.sqrt(fan_in)
            return _frozen(w)

        def gain() -> Array:
            # Norm gains near 1, not exactly 1: replicated weights are exercised too.
            return _frozen(1.0 + 0.1 * rng.standard_normal(c.hidden, dtype=np.float64))

        # Generation order is part of the model's identity: never reorder these calls.
        embed = normal(1, c.vocab, c.hidden)  # O(1) entries: the residual stream's scale
        layers = tuple(
            LayerWeights(
                attn_norm=gain(),
                wq=normal(c.hidden, c.hidden, c.hidden),
                wk=normal(c.hidden, c.hidden, c.hidden),
                wv=normal(c.hidden, c.hidden, c.hidden),
                wo=normal(c.hidden, c.hidden, c.hidden),
                mlp_norm=gain(),
                w1=normal(c.hidden, c.hidden, c.ffn),
                w2=normal(c.ffn, c.ffn, c.hidden),
            )
            for _ in range(c.layers)
        )
        final_norm = gain()
        unembed = normal(c.hidden, c.hidden, c.vocab)
        self._full = TinyLMShard(c, seed, 0, 1, embed, layers, final_norm, unembed)

    def shard(self, rank: int, world: int) -> TinyLMShard:
        """Rank `rank`'s shard for TP over `world` sockets."""
        c = self.config
        if world < 1:
            raise InvalidRequest(f"TP world must be >= 1, got {world}")
        if not 0 <= rank < world:
            raise InvalidRequest(f"rank {rank} is outside world {world} (0..{world - 1})")
        if c.heads % world or c.ffn % world:
            raise InvalidRequest(
                f"TP world {world} must divide heads {c.heads} and ffn {c.ffn}: "
                "each rank holds whole attention heads and an equal ffn block"
            )
        if world == 1:
            return self._full
        f = self._full
        layers = tuple(layer.block(rank, world) for layer in f.layers)
        return TinyLMShard(c, self.seed, rank, world, f.embed, layers, f.final_norm, f.unembed)

    @property
    def parameter_count(self) -> int:
        return self._full.parameter_count

    @property
    def weight_bytes(self) -> int:
        return self._full.weight_bytes


def seed_for(name: str) -> int:
    """A stable seed for an expert name (blake2b: the same in every process, unlike
    Python's salted hash())."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little")


def model_spec(config: TinyLMConfig, name: str) -> ModelSpec:
    """The timing model's view of a tiny expert: same shapes, float64 weights."""
    return ModelSpec(
        name=name,
        layers=config.layers,
        hidden=config.hidden,
        heads=config.heads,
        kv_heads=config.heads,  # plain multi-head attention: no grouped KV
        ffn=config.ffn,
        vocab=config.vocab,
        bytes_per_param=BYTES_PER_PARAM,
        mlp="plain",
        tied_embeddings=False,
        source="rdurack.workloads.tiny_lm: functional-mode expert (float64, random weights)",
    )
