"""Small numpy classifiers with hand-written backward passes.

Parameters and gradients are ordered dicts name -> array, in definition order (torch's
`named_parameters()` order, with torch's names), so DDP can bucket them the way torch
does. `forward(x, y)` returns the mean softmax cross-entropy over the batch and keeps
what `backward()` needs; `backward()` writes d(loss)/d(param) into `grads` in place (the
buffers live as long as the model, like torch's `.grad`). Models train in float32;
build one in float64 to check gradients numerically.

- `MLP`: linear layers with ReLU between them.
- `TransformerClassifier`: an input row of `tokens * token_features` values (an 8×8
  digit as 8 rows of 8 pixels) becomes `tokens` tokens: a linear embedding plus learned
  positions, one pre-norm block (LayerNorm, multi-head self-attention, residual;
  LayerNorm, ReLU MLP, residual), mean pooling over tokens, a linear head.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import pairwise
from typing import Any, Literal, Protocol

import numpy as np
from numpy.typing import DTypeLike

from rdurack.errors import InvalidRequest
from rdurack.workloads.training.arrays import TRAIN_DTYPE, Array, Params, as_dtype

LN_EPS = 1e-5  # torch.nn.LayerNorm's default


class Model(Protocol):
    """What training needs of a model."""

    params: Params  # name -> parameter, definition order; updated in place by optimizers
    grads: Params  # name -> gradient of the last backward(), same shapes and order
    dtype: np.dtype[Any]

    def forward(self, x: Array, y: Array) -> float:
        """Mean cross-entropy of the batch; keeps the activations for backward()."""
        ...

    def backward(self) -> None:
        """Gradients of the last forward's loss into `grads`."""
        ...

    def logits(self, x: Array) -> Array:
        """Class scores, (batch, classes), without keeping anything for backward."""
        ...

    def saved_bytes(self) -> int:
        """Bytes of the arrays kept from the last forward for backward (0 after it)."""
        ...

    @property
    def frozen(self) -> Params:
        """Parameters forward uses but nothing trains (progressive: earlier blocks)."""
        ...


# ------------------------------------------------------------------ building blocks


def _uniform(rng: np.random.Generator, fan_in: int, shape: tuple[int, ...], dtype: Any) -> Array:
    # torch.nn.Linear's default init: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weight and bias.
    bound = 1.0 / math.sqrt(fan_in)
    return rng.uniform(-bound, bound, size=shape).astype(dtype)


def softmax_cross_entropy(logits: Array, y: Array) -> tuple[float, Array]:
    """Mean cross-entropy of integer labels `y` under `logits`, and d(loss)/d(logits)."""
    n = logits.shape[0]
    z = logits - logits.max(axis=1, keepdims=True)  # stable: exp of values <= 0
    e = np.exp(z)
    total = e.sum(axis=1, keepdims=True)
    rows = np.arange(n)
    loss = float(np.mean(np.log(total[:, 0]) - z[rows, y]))
    dlogits = e / total
    dlogits[rows, y] -= 1
    dlogits /= n  # a Python int: stays in the logits' dtype
    return loss, dlogits


def _linear(x: Array, w: Array, b: Array) -> Array:
    """x @ w.T + b over the last axis (torch's Linear layout: w is (out, in))."""
    return x @ w.T + b


def _linear_backward(x: Array, w: Array, dz: Array) -> tuple[Array, Array, Array]:
    """(dx, dw, db) of z = x @ w.T + b, for x of any leading shape."""
    flat_dz = dz.reshape(-1, dz.shape[-1])
    flat_x = x.reshape(-1, x.shape[-1])
    return dz @ w, flat_dz.T @ flat_x, flat_dz.sum(axis=0)


def _layernorm(x: Array, g: Array, b: Array) -> tuple[Array, Array, Array]:
    """LayerNorm over the last axis: (y, xhat, rstd), the last two kept for backward."""
    xc = x - x.mean(axis=-1, keepdims=True)
    rstd = 1.0 / np.sqrt((xc * xc).mean(axis=-1, keepdims=True) + LN_EPS)
    xhat = xc * rstd
    return xhat * g + b, xhat, rstd


def _layernorm_backward(
    dy: Array, xhat: Array, rstd: Array, g: Array
) -> tuple[Array, Array, Array]:
    """(dx, dg, db) of LayerNorm, from its saved xhat and 1/std."""
    lead = tuple(range(dy.ndim - 1))
    dg = (dy * xhat).sum(axis=lead)
    db = dy.sum(axis=lead)
    dxhat = dy * g
    dx = rstd * (
        dxhat
        - dxhat.mean(axis=-1, keepdims=True)
        - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True)
    )
    return dx, dg, db


def _softmax_last(s: Array) -> Array:
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    out: Array = e / e.sum(axis=-1, keepdims=True)
    return out


class _Module:
    """Parameters, gradient buffers and dtype handling shared by the models."""

    def __init__(self, params: Params, dtype: DTypeLike) -> None:
        self.dtype: np.dtype[Any] = np.dtype(dtype)
        if not np.issubdtype(self.dtype, np.floating):
            raise InvalidRequest(f"a model's dtype must be floating, got {self.dtype}")
        self.params: Params = params
        self.grads: Params = {name: np.zeros_like(p) for name, p in params.items()}

    def num_parameters(self) -> int:
        return sum(p.size for p in self.params.values())

    @property
    def frozen(self) -> Params:
        return {}  # every parameter trains

    def zero_grad(self) -> None:
        for g in self.grads.values():
            g.fill(0)

    def _set_grad(self, name: str, value: Array) -> None:
        # In place (the buffers stay the same objects), and casting="no": a float64
        # gradient here means a numpy float64 scalar upcast the float32 math.
        np.copyto(self.grads[name], value, casting="no")

    def _input(self, x: Array, features: int) -> Array:
        x = as_dtype(x, self.dtype)
        if x.ndim != 2 or x.shape[1] != features:
            raise InvalidRequest(f"input of shape {x.shape}: expected (batch, {features})")
        return x


# ------------------------------------------------------------------ MLP


class MLP(_Module):
    """Linear layers `sizes[0] -> ... -> sizes[-1]`, ReLU between them."""

    def __init__(self, sizes: Sequence[int], seed: int = 0, dtype: DTypeLike = TRAIN_DTYPE):
        if len(sizes) < 2 or any(s < 1 for s in sizes):
            raise InvalidRequest(f"MLP sizes must be >= 2 positive widths, got {list(sizes)}")
        rng = np.random.default_rng(seed)
        params: Params = {}
        for i, (fan_in, fan_out) in enumerate(pairwise(sizes)):
            params[f"layers.{i}.weight"] = _uniform(rng, fan_in, (fan_out, fan_in), dtype)
            params[f"layers.{i}.bias"] = _uniform(rng, fan_in, (fan_out,), dtype)
        super().__init__(params, dtype)
        self.sizes = list(sizes)
        self._saved: tuple[list[Array], Array] | None = None  # (layer inputs, dlogits)

    def _run(self, x: Array) -> tuple[Array, list[Array]]:
        """Logits and the input of every layer (post-ReLU activations)."""
        inputs: list[Array] = []
        h = self._input(x, self.sizes[0])
        layers = len(self.sizes) - 1
        for i in range(layers):
            inputs.append(h)
            h = _linear(h, self.params[f"layers.{i}.weight"], self.params[f"layers.{i}.bias"])
            if i < layers - 1:
                h = np.maximum(h, 0)  # ReLU; kept as the next layer's input
        return h, inputs

    def forward(self, x: Array, y: Array) -> float:
        logits, inputs = self._run(x)
        loss, dlogits = softmax_cross_entropy(logits, np.asarray(y))
        self._saved = (inputs, dlogits)
        return loss

    def backward(self) -> None:
        if self._saved is None:
            raise InvalidRequest("backward() without a forward() before it")
        inputs, dz = self._saved
        self._saved = None
        for i in reversed(range(len(inputs))):
            w = self.params[f"layers.{i}.weight"]
            dh, dw, db = _linear_backward(inputs[i], w, dz)
            self._set_grad(f"layers.{i}.weight", dw)
            self._set_grad(f"layers.{i}.bias", db)
            if i > 0:
                dz = dh * (inputs[i] > 0)  # through the ReLU that produced inputs[i]

    def logits(self, x: Array) -> Array:
        return self._run(x)[0]

    def saved_bytes(self) -> int:
        if self._saved is None:
            return 0
        inputs, dlogits = self._saved
        return sum(a.nbytes for a in inputs) + dlogits.nbytes


# ------------------------------------------------------------------ transformer


class TransformerClassifier(_Module):
    """One pre-norm transformer block over `tokens` tokens of `token_features` each."""

    def __init__(
        self,
        tokens: int = 8,
        token_features: int = 8,
        classes: int = 10,
        d_model: int = 32,
        heads: int = 4,
        mlp_hidden: int = 64,
        seed: int = 0,
        dtype: DTypeLike = TRAIN_DTYPE,
    ) -> None:
        if min(tokens, token_features, classes, d_model, heads, mlp_hidden) < 1:
            raise InvalidRequest("transformer sizes must be positive")
        if d_model % heads:
            raise InvalidRequest(f"d_model {d_model} is not divisible by {heads} heads")
        rng = np.random.default_rng(seed)
        d, f = d_model, token_features
        p: Params = {
            "embed.weight": _uniform(rng, f, (d, f), dtype),
            "embed.bias": _uniform(rng, f, (d,), dtype),
            # Learned positions (GPT-2 style N(0, 0.02)): attention alone cannot tell
            # which row of the image a token is.
            "pos": (rng.standard_normal((tokens, d)) * 0.02).astype(dtype),
            "ln1.weight": np.ones(d, dtype),
            "ln1.bias": np.zeros(d, dtype),
        }
        for proj in ("q", "k", "v", "out"):
            p[f"attn.{proj}.weight"] = _uniform(rng, d, (d, d), dtype)
            p[f"attn.{proj}.bias"] = _uniform(rng, d, (d,), dtype)
        p |= {
            "ln2.weight": np.ones(d, dtype),
            "ln2.bias": np.zeros(d, dtype),
            "mlp.0.weight": _uniform(rng, d, (mlp_hidden, d), dtype),
            "mlp.0.bias": _uniform(rng, d, (mlp_hidden,), dtype),
            "mlp.2.weight": _uniform(rng, mlp_hidden, (d, mlp_hidden), dtype),
            "mlp.2.bias": _uniform(rng, mlp_hidden, (d,), dtype),
            "head.weight": _uniform(rng, d, (classes, d), dtype),
            "head.bias": _uniform(rng, d, (classes,), dtype),
        }
        super().__init__(p, dtype)
        self.tokens, self.token_features, self.heads = tokens, token_features, heads
        self.d_model, self.classes = d_model, classes
        self._saved: dict[str, Array] | None = None

    def _split(self, a: Array) -> Array:
        """(N, T, D) -> (N, H, T, D/H)."""
        n, t, _ = a.shape
        return a.reshape(n, t, self.heads, -1).transpose(0, 2, 1, 3)

    def _merge(self, a: Array) -> Array:
        """(N, H, T, D/H) -> (N, T, D)."""
        n, _, t, _ = a.shape
        return a.transpose(0, 2, 1, 3).reshape(n, t, self.d_model)

    def _run(self, x: Array) -> tuple[Array, dict[str, Array]]:
        p = self.params
        xt = self._input(x, self.tokens * self.token_features)
        xt = xt.reshape(-1, self.tokens, self.token_features)
        e = _linear(xt, p["embed.weight"], p["embed.bias"]) + p["pos"]
        a_in, xhat1, rstd1 = _layernorm(e, p["ln1.weight"], p["ln1.bias"])
        q = self._split(_linear(a_in, p["attn.q.weight"], p["attn.q.bias"]))
        k = self._split(_linear(a_in, p["attn.k.weight"], p["attn.k.bias"]))
        v = self._split(_linear(a_in, p["attn.v.weight"], p["attn.v.bias"]))
        scale = 1.0 / math.sqrt(self.d_model // self.heads)  # Python float: keeps float32
        probs = _softmax_last((q @ k.transpose(0, 1, 3, 2)) * scale)
        o = self._merge(probs @ v)
        h1 = e + _linear(o, p["attn.out.weight"], p["attn.out.bias"])
        m_in, xhat2, rstd2 = _layernorm(h1, p["ln2.weight"], p["ln2.bias"])
        u = _linear(m_in, p["mlp.0.weight"], p["mlp.0.bias"])
        r = np.maximum(u, 0)
        h2 = h1 + _linear(r, p["mlp.2.weight"], p["mlp.2.bias"])
        pooled = h2.mean(axis=1)
        logits = _linear(pooled, p["head.weight"], p["head.bias"])
        saved = {
            "x": xt, "a_in": a_in, "xhat1": xhat1, "rstd1": rstd1, "q": q, "k": k, "v": v,
            "probs": probs, "o": o, "xhat2": xhat2, "rstd2": rstd2, "m_in": m_in, "u": u,
            "r": r, "pooled": pooled,
        }  # fmt: skip
        return logits, saved

    def forward(self, x: Array, y: Array) -> float:
        logits, saved = self._run(x)
        loss, saved["dlogits"] = softmax_cross_entropy(logits, np.asarray(y))
        self._saved = saved
        return loss

    def backward(self) -> None:
        if self._saved is None:
            raise InvalidRequest("backward() without a forward() before it")
        s, p, grad = self._saved, self.params, self._set_grad
        self._saved = None
        # Head and mean pooling over tokens.
        dpooled, dw, db = _linear_backward(s["pooled"], p["head.weight"], s["dlogits"])
        grad("head.weight", dw)
        grad("head.bias", db)
        dh2 = np.repeat(dpooled[:, None, :] / self.tokens, self.tokens, axis=1)
        # MLP sub-block: h2 = h1 + mlp(ln2(h1)).
        dr, dw, db = _linear_backward(s["r"], p["mlp.2.weight"], dh2)
        grad("mlp.2.weight", dw)
        grad("mlp.2.bias", db)
        du = dr * (s["u"] > 0)
        dm_in, dw, db = _linear_backward(s["m_in"], p["mlp.0.weight"], du)
        grad("mlp.0.weight", dw)
        grad("mlp.0.bias", db)
        dx, dg, db = _layernorm_backward(dm_in, s["xhat2"], s["rstd2"], p["ln2.weight"])
        grad("ln2.weight", dg)
        grad("ln2.bias", db)
        dh1 = dh2 + dx
        # Attention sub-block: h1 = e + out(attention(ln1(e))).
        do, dw, db = _linear_backward(s["o"], p["attn.out.weight"], dh1)
        grad("attn.out.weight", dw)
        grad("attn.out.bias", db)
        do_heads = self._split(do)
        probs, q, k, v = s["probs"], s["q"], s["k"], s["v"]
        dv = probs.transpose(0, 1, 3, 2) @ do_heads
        dprobs = do_heads @ v.transpose(0, 1, 3, 2)
        # Softmax backward, row by row: dS = P * (dP - sum(dP * P)).
        dscores = probs * (dprobs - (dprobs * probs).sum(axis=-1, keepdims=True))
        scale = 1.0 / math.sqrt(self.d_model // self.heads)
        dq = (dscores @ k) * scale
        dk = (dscores.transpose(0, 1, 3, 2) @ q) * scale
        da_in = np.zeros_like(s["a_in"])
        for name, d_heads in (("q", dq), ("k", dk), ("v", dv)):
            dpart, dw, db = _linear_backward(
                s["a_in"], p[f"attn.{name}.weight"], self._merge(d_heads)
            )
            grad(f"attn.{name}.weight", dw)
            grad(f"attn.{name}.bias", db)
            da_in += dpart
        dx, dg, db = _layernorm_backward(da_in, s["xhat1"], s["rstd1"], p["ln1.weight"])
        grad("ln1.weight", dg)
        grad("ln1.bias", db)
        de = dh1 + dx
        # Embedding and positions.
        grad("pos", de.sum(axis=0))
        _, dw, db = _linear_backward(s["x"], p["embed.weight"], de)
        grad("embed.weight", dw)
        grad("embed.bias", db)

    def logits(self, x: Array) -> Array:
        return self._run(x)[0]

    def saved_bytes(self) -> int:
        return sum(a.nbytes for a in self._saved.values()) if self._saved is not None else 0


ModelName = Literal["mlp", "transformer"]


def build_model(
    name: ModelName,
    features: int,
    classes: int,
    seed: int = 0,
    hidden: int = 64,
    dtype: DTypeLike = TRAIN_DTYPE,
    blocks: int = 1,
) -> MLP | TransformerClassifier:
    """A model for `features` inputs and `classes` outputs. The MLP has `blocks` hidden
    layers of `hidden` units; the transformer (one block) reads the input as 8 tokens
    (an 8×8 digit's rows), so `features` must be a multiple of 8."""
    if name == "mlp":
        return MLP([features, *[hidden] * blocks, classes], seed=seed, dtype=dtype)
    if blocks != 1:
        raise InvalidRequest(f"{name}: one block only, got blocks={blocks}")
    if name == "transformer":
        tokens = 8
        if features % tokens:
            raise InvalidRequest(
                f"transformer: {features} features do not split into {tokens} tokens"
            )
        return TransformerClassifier(
            tokens=tokens,
            token_features=features // tokens,
            classes=classes,
            mlp_hidden=hidden,
            seed=seed,
            dtype=dtype,
        )
    raise InvalidRequest(f"unknown model {name!r}: expected 'mlp' or 'transformer'")
