"""Decoder-only transformer models: the shape the timing model decomposes into operators.

Beside dense transformers with standard or grouped-query attention (GQA), a model may
have mixture-of-experts layers (`MoeSpec`: routed and shared experts, a few active per
token, dense layers first, expert groups) and multi-head latent attention (`MlaSpec`,
DeepSeek-V2/V3: a low-rank latent KV cache). Weights of the decoder layers' matrices may
be stored in FP8 with block scales (`WeightFormat`); the SN40L computes in BF16, so FP8
halves the bytes a weight stream moves but not the FLOPs (rack/layers.py prices the
upcast).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field, model_validator

from rdurack.config import Config
from rdurack.errors import InvalidRequest, UnknownName

# FP8 (e4m3) weights with one FP32 scale per 128 x 128 block, as DeepSeek-V3 ships them
# (its config.json: quantization_config weight_block_size [128, 128]).
FP8_BLOCK = 128
FP32_BYTES = 4


class WeightFormat(StrEnum):
    """How the decoder layers' matrices are stored. Embeddings, the LM head, norms and
    the MoE router stay at the model's `bytes_per_param`, as DeepSeek-V3's FP8 recipe
    keeps them (DeepSeek-V3 report, Sec. 3.3)."""

    NATIVE = "native"  # bytes_per_param, like the rest of the model
    FP8_BLOCK = "fp8-block128"

    def bytes_per_param(self, native: int) -> float:
        if self is WeightFormat.NATIVE:
            return float(native)
        return 1.0 + FP32_BYTES / (FP8_BLOCK * FP8_BLOCK)


class ExpertMapping(StrEnum):
    """How a model's routed experts lie over the sockets of its group (rack/layers.py)."""

    EXPERT_PARALLEL = "expert-parallel"  # whole experts, E / sockets on each
    TENSOR_PARALLEL = "tensor-parallel"  # every expert's columns split over the group


class MoeSpec(Config):
    """Mixture-of-experts layers: every layer from `dense_layers` on replaces its dense
    MLP (of the model's `ffn`) with `routed_experts` gated MLPs of `expert_ffn`, of which
    a router picks `active_experts` per token (from `groups_per_token` of
    `expert_groups` groups), plus `shared_experts` every token runs."""

    routed_experts: int = Field(gt=1)
    active_experts: int = Field(gt=0)
    expert_ffn: int = Field(gt=0)
    shared_experts: int = Field(default=0, ge=0)
    dense_layers: int = Field(default=0, ge=0)
    expert_groups: int = Field(default=1, gt=0)
    groups_per_token: int = Field(default=1, gt=0)
    # A deployment's choice, not the model's: None places the experts expert-parallel
    # where they divide evenly over the group, else tensor-parallel (`--expert-mapping`).
    mapping: ExpertMapping | None = None

    @model_validator(mode="after")
    def _consistent(self) -> MoeSpec:
        if self.active_experts > self.routed_experts:
            raise ValueError(f"{self.active_experts} active experts of only {self.routed_experts}")
        if self.routed_experts % self.expert_groups:
            raise ValueError(
                f"{self.routed_experts} experts do not split into {self.expert_groups} groups"
            )
        if self.groups_per_token > self.expert_groups:
            raise ValueError(f"{self.groups_per_token} groups of {self.expert_groups}")
        per_group = self.routed_experts // self.expert_groups
        if self.active_experts > self.groups_per_token * per_group:
            raise ValueError(
                f"{self.active_experts} active experts do not fit {self.groups_per_token} "
                f"groups of {per_group}"
            )
        return self


class MlaSpec(Config):
    """Multi-head latent attention (DeepSeek-V2/V3). Queries go through a rank
    `q_lora_rank` bottleneck (0: none); keys and values are cached as one latent of
    `kv_lora_rank` values plus a shared rotary key of `qk_rope_head_dim` per token and
    layer, and expanded per head (`qk_nope_head_dim` for keys, `v_head_dim` for values)."""

    q_lora_rank: int = Field(ge=0)
    kv_lora_rank: int = Field(gt=0)
    qk_nope_head_dim: int = Field(gt=0)
    qk_rope_head_dim: int = Field(gt=0)
    v_head_dim: int = Field(gt=0)

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def cached(self) -> int:
        """Values cached per token and layer: the latent and the rotary key."""
        return self.kv_lora_rank + self.qk_rope_head_dim


class ModelSpec(Config):
    """A decoder-only transformer. Biases and position embeddings are left out: they are
    well under 1% of the parameters of every preset."""

    name: str
    layers: int = Field(gt=0)
    hidden: int = Field(gt=0)
    heads: int = Field(gt=0)
    kv_heads: int = Field(gt=0)
    ffn: int = Field(gt=0)  # the dense MLP's width (of the dense layers of an MoE model)
    vocab: int = Field(gt=0)
    bytes_per_param: int = Field(default=2, gt=0)  # BF16; activations and KV cache too
    # "gated": SwiGLU (gate, up, down: three matrices); "plain": GELU MLP (two).
    mlp: Literal["gated", "plain"] = "gated"
    tied_embeddings: bool = False
    # Width of a head when it is not hidden / heads (Qwen3: 128 with hidden 2048, 32 heads).
    attention_head_dim: int | None = Field(default=None, gt=0)
    moe: MoeSpec | None = None
    mla: MlaSpec | None = None
    weight_format: WeightFormat = WeightFormat.NATIVE
    source: str = ""

    @model_validator(mode="after")
    def _heads_divide(self) -> ModelSpec:
        if self.attention_head_dim is None and self.hidden % self.heads:
            raise ValueError(f"hidden {self.hidden} is not a multiple of heads {self.heads}")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads {self.heads} is not a multiple of kv_heads {self.kv_heads}")
        if self.moe is not None and self.moe.dense_layers >= self.layers:
            raise ValueError(f"{self.moe.dense_layers} dense layers of {self.layers}: no MoE")
        if self.moe is not None and self.mlp != "gated":
            raise ValueError("experts are gated (SwiGLU) MLPs: mlp must be 'gated'")
        return self

    # ---------------------------------------------------------------- attention

    @property
    def head_dim(self) -> int:
        return self.attention_head_dim or self.hidden // self.heads

    @property
    def q_dim(self) -> int:
        """Width of all query heads together (hidden, unless heads are wider)."""
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of K (and of V) per token: kv_heads x head_dim."""
        return self.kv_heads * self.head_dim

    @property
    def attention_params(self) -> int:
        """Q, K, V and output projections of one layer (MLA: its down and up projections,
        and the norms of its two latents)."""
        d = self.hidden
        if self.mla is None:
            return d * (self.q_dim + 2 * self.kv_dim) + self.q_dim * d
        a, h = self.mla, self.heads
        q = (
            d * h * a.qk_head_dim
            if not a.q_lora_rank
            else (d * a.q_lora_rank + a.q_lora_rank + a.q_lora_rank * h * a.qk_head_dim)
        )
        kv = (
            d * a.cached + a.kv_lora_rank + a.kv_lora_rank * h * (a.qk_nope_head_dim + a.v_head_dim)
        )
        return q + kv + h * a.v_head_dim * d

    # ---------------------------------------------------------------- MLP and experts

    @property
    def mlp_matrices(self) -> int:
        return 3 if self.mlp == "gated" else 2

    @property
    def mlp_params(self) -> int:
        """The dense MLP of one (dense) layer."""
        return self.mlp_matrices * self.hidden * self.ffn

    @property
    def expert_params(self) -> int:
        """One expert (a gated MLP of `expert_ffn`); 0 for a dense model."""
        return 0 if self.moe is None else 3 * self.hidden * self.moe.expert_ffn

    @property
    def router_params(self) -> int:
        return 0 if self.moe is None else self.hidden * self.moe.routed_experts

    @property
    def moe_layers(self) -> int:
        return 0 if self.moe is None else self.layers - self.moe.dense_layers

    @property
    def dense_layers(self) -> int:
        return self.layers - self.moe_layers

    def moe_ffn_params(self, experts: float) -> float:
        """The MoE block of one layer with `experts` routed experts (all of them, or the
        active ones), the shared experts and the router."""
        assert self.moe is not None
        return (experts + self.moe.shared_experts) * self.expert_params + self.router_params

    # ---------------------------------------------------------------- totals

    @property
    def layer_params(self) -> int:
        """A dense layer (of a dense model, or before an MoE model's first MoE layer)."""
        return self.attention_params + self.mlp_params + 2 * self.hidden  # + two norms

    @property
    def moe_layer_params(self) -> int:
        if self.moe is None:
            return 0
        ffn = int(self.moe_ffn_params(self.moe.routed_experts))
        return self.attention_params + ffn + 2 * self.hidden

    @property
    def embedding_params(self) -> int:
        """Token embedding, LM head (unless tied) and the final norm."""
        heads = 1 if self.tied_embeddings else 2
        return heads * self.vocab * self.hidden + self.hidden

    @property
    def params(self) -> int:
        return (
            self.dense_layers * self.layer_params
            + self.moe_layers * self.moe_layer_params
            + self.embedding_params
        )

    @property
    def active_params(self) -> int:
        """Parameters one token runs through: every dense weight, the active and shared
        experts, the LM head; not the embedding table (a lookup reads one row)."""
        if self.moe is None:
            return self.params - self.vocab * self.hidden
        active_layer = (
            self.attention_params
            + int(self.moe_ffn_params(self.moe.active_experts))
            + 2 * self.hidden
        )
        return (
            self.dense_layers * self.layer_params
            + self.moe_layers * active_layer
            + self.embedding_params
            - self.vocab * self.hidden
        )

    @property
    def matrix_bytes_per_param(self) -> float:
        """Bytes per parameter of the decoder layers' matrices, as stored."""
        return self.weight_format.bytes_per_param(self.bytes_per_param)

    @property
    def weight_bytes(self) -> int:
        """Every weight as stored: the layers' matrices in `weight_format`, the rest
        (embeddings, head, norms, router) at `bytes_per_param`."""
        kept = (
            self.embedding_params
            + self.layers * 2 * self.hidden
            + self.moe_layers * self.router_params
        )
        matrices = self.params - kept
        return round(matrices * self.matrix_bytes_per_param + kept * self.bytes_per_param)

    def kv_bytes_per_token(self) -> int:
        """KV cache bytes one token adds across all layers (K and V; MLA: its latent and
        rotary key)."""
        per_layer = 2 * self.kv_dim if self.mla is None else self.mla.cached
        return self.layers * per_layer * self.bytes_per_param

    def placed(self, mapping: ExpertMapping | None) -> ModelSpec:
        """This model with its experts placed as `mapping` says (None: unchanged)."""
        if mapping is None:
            return self
        if self.moe is None:
            raise InvalidRequest(f"{self.name} has no experts to place {mapping.value}")
        return self.model_copy(update={"moe": self.moe.model_copy(update={"mapping": mapping})})

    def kv_shards(self, tp: int) -> int:
        """Ways the KV cache splits over `tp` sockets of tensor parallelism: by KV head,
        so a group wider than the KV heads holds copies (GQA), and MLA's latent, shared
        by every head, is whole on every socket."""
        return 1 if self.mla is not None else min(tp, self.kv_heads)


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
    models += moe_models()
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


def moe_models() -> list[ModelSpec]:
    """The mixture-of-experts presets, from each model's published config.json."""
    return [
        ModelSpec(
            name="deepseek-r1",
            layers=61,
            hidden=7168,
            heads=128,
            kv_heads=128,  # MLA: every head reads the shared latent
            ffn=18432,
            vocab=129280,
            moe=MoeSpec(
                routed_experts=256,
                active_experts=8,
                expert_ffn=2048,
                shared_experts=1,
                dense_layers=3,
                expert_groups=8,
                groups_per_token=4,
            ),
            mla=MlaSpec(
                q_lora_rank=1536,
                kv_lora_rank=512,
                qk_nope_head_dim=128,
                qk_rope_head_dim=64,
                v_head_dim=128,
            ),
            weight_format=WeightFormat.FP8_BLOCK,
            source="deepseek-ai/DeepSeek-V3 config_671B.json (DeepSeek-R1 has the V3 "
            "architecture); FP8 e4m3 weights, 128x128 block scales; the multi-token "
            "prediction module is left out (not used to decode here)",
        ),
        ModelSpec(
            name="mixtral-8x7b",
            layers=32,
            hidden=4096,
            heads=32,
            kv_heads=8,
            ffn=14336,
            vocab=32000,
            moe=MoeSpec(routed_experts=8, active_experts=2, expert_ffn=14336),
            source="mistralai/Mixtral-8x7B-v0.1 config.json (num_local_experts 8, "
            "num_experts_per_tok 2, intermediate_size 14336)",
        ),
        ModelSpec(
            name="qwen3-235b-a22b",
            layers=94,
            hidden=4096,
            heads=64,
            kv_heads=4,
            attention_head_dim=128,
            ffn=12288,  # unused: every layer is MoE
            vocab=151936,
            moe=MoeSpec(routed_experts=128, active_experts=8, expert_ffn=1536),
            source="Qwen/Qwen3-235B-A22B config.json (head_dim 128, num_experts 128, "
            "num_experts_per_tok 8, moe_intermediate_size 1536)",
        ),
    ]


def model(name: str) -> ModelSpec:
    models = builtin_models()
    if name not in models:
        raise UnknownName("model", name, sorted(models))
    return models[name]
