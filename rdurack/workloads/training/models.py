"""The built-in loop's classifiers: torch modules, and the view of one the loop trains.

- `MLP`: linear layers with ReLU between them (parameters `layers.{i}.*`).
- `TransformerClassifier`: an input row of `tokens * token_features` values (an 8×8
  digit as 8 rows of 8 pixels) becomes `tokens` tokens: a linear embedding plus learned
  positions, one pre-norm block (LayerNorm, multi-head self-attention, residual;
  LayerNorm, ReLU MLP, residual), mean pooling over tokens, a linear head.
- `BlockSplit`: the MLP split into blocks for progressive training, each block with an
  output module (ProFL's; a linear read-out is ours, for an MLP): block i is the MLP's
  layer i (Linear, then ReLU); the classifier `layers.{blocks}.*` is the last block's
  output module, the others have their own, `outputs.{i}.*`. A stage trains block i and
  its output module on top of blocks 0..i-1, frozen with `requires_grad_(False)`.

`Trainable` is what the loop trains: a module and the parameters that train, with
torch's autograd for backward (through torch's DDP, which averages the gradients in
`.grad`). Its `params` and `grads` are numpy views of the parameters' and their
`.grad`'s storage, in `named_parameters()` order: checkpoints, the movement metric and
the memory account read them, while torch.optim and DDP update the same storage.
"""

from __future__ import annotations

import math
from itertools import pairwise
from typing import Any, Literal, TypeVar

import numpy as np
import torch
from torch import nn
from torch.nn import functional

from rdurack.errors import InvalidRequest
from rdurack.workloads.training.data import Array, Params

ModelName = Literal["mlp", "transformer"]
M = TypeVar("M", bound=nn.Module)
TOKENS = 8  # the transformer reads a digit's 8 rows as 8 tokens


class MLP(nn.Module):
    """Linear layers `sizes[0] -> ... -> sizes[-1]`, ReLU between them."""

    def __init__(self, sizes: list[int]) -> None:
        if len(sizes) < 2 or any(s < 1 for s in sizes):
            raise InvalidRequest(f"MLP sizes must be >= 2 positive widths, got {sizes}")
        super().__init__()
        self.sizes = sizes
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in pairwise(sizes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.run(x, len(self.layers))

    def run(self, x: torch.Tensor, layers: int) -> torch.Tensor:
        """The first `layers` layers, ReLU after each but the model's last."""
        for i in range(layers):
            x = self.layers[i](x)
            if i < len(self.layers) - 1:
                x = functional.relu(x)
        return x


class TransformerClassifier(nn.Module):
    """One pre-norm transformer block over `tokens` tokens of `token_features` each."""

    def __init__(
        self, tokens: int, token_features: int, classes: int, mlp_hidden: int, d_model: int = 32,
        heads: int = 4,
    ) -> None:  # fmt: skip
        super().__init__()
        if d_model % heads:
            raise InvalidRequest(f"d_model {d_model} is not divisible by {heads} heads")
        self.tokens, self.token_features, self.heads = tokens, token_features, heads
        self.embed = nn.Linear(token_features, d_model)
        # Learned positions (GPT-2 style N(0, 0.02)): attention alone cannot tell which
        # row of the image a token is.
        self.pos = nn.Parameter(torch.empty(tokens, d_model))  # N(0, 0.02): initialise
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, mlp_hidden), nn.ReLU(), nn.Linear(mlp_hidden, d_model)
        )
        self.head = nn.Linear(d_model, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        e = self.embed(x.reshape(n, self.tokens, self.token_features)) + self.pos
        q, k, v = self.qkv(self.ln1(e)).chunk(3, dim=-1)
        # (N, T, D) -> (N, H, T, D/H) and back.
        q, k, v = (t.reshape(n, self.tokens, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        o = (scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(n, self.tokens, -1)
        h = e + self.out(o)
        h = h + self.mlp(self.ln2(h))
        return self.head(h.mean(dim=1))  # type: ignore[no-any-return]


class BlockSplit(MLP):
    """The MLP (`layers.{i}.*`, what full training trains) and its blocks' output
    modules (`outputs.{i}.*`)."""

    def __init__(self, features: int, hidden: int, classes: int, blocks: int) -> None:
        if blocks < 2:
            raise InvalidRequest(f"a block split needs at least 2 blocks, got {blocks}")
        super().__init__([features, *[hidden] * blocks, classes])
        self.blocks = blocks
        self.outputs = nn.ModuleList(nn.Linear(hidden, classes) for _ in range(blocks - 1))

    def output(self, i: int) -> nn.Module:
        """Block i's output module: its own, or the classifier for the last block."""
        self._check(i)
        return self.layers[i + 1] if i == self.blocks - 1 else self.outputs[i]

    def block(self, i: int) -> nn.Module:
        self._check(i)
        return self.layers[i]

    def stage(self, i: int) -> Trainable:
        """The model that trains block i and its output module, blocks before it frozen."""
        self._check(i)
        trains = [*self.block(i).parameters(), *self.output(i).parameters()]
        frozen = [p for j in range(i) for p in self.block(j).parameters()]
        return Trainable(_Stage(self, i), trains, frozen, owner=self)

    def _check(self, i: int) -> None:
        if not 0 <= i < self.blocks:
            raise InvalidRequest(f"block {i} of {self.blocks}: blocks are 0..{self.blocks - 1}")


class _Stage(nn.Module):
    """Blocks 0..i (Linear, then ReLU, each), then block i's output module."""

    def __init__(self, split: BlockSplit, block: int) -> None:
        super().__init__()
        self.split, self.block = split, block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.split.output(self.block)(self.split.run(x, self.block + 1))
        return out


def views(module: nn.Module, params: list[nn.Parameter], grads: bool = False) -> Params:
    """`params` (or, `grads`, their `.grad`) by their names in `module`, definition
    order, as numpy views of their storage."""
    ids = {id(p) for p in params}
    return {
        name: _tensor(p, grads).numpy() for name, p in module.named_parameters() if id(p) in ids
    }


def _tensor(p: nn.Parameter, grad: bool) -> torch.Tensor:
    if not grad:
        return p.detach()
    if p.grad is None:
        raise InvalidRequest("a parameter that trains has no .grad to view")
    return p.grad


class Trainable:
    """`net` with `trains` (default: all of `owner`'s parameters) trained by autograd,
    `owner` (default `net`) naming them; the rest of `owner`'s parameters kept as they
    are (`frozen`: those forward uses)."""

    def __init__(
        self,
        net: nn.Module,
        trains: list[nn.Parameter] | None = None,
        frozen: list[nn.Parameter] | None = None,
        owner: nn.Module | None = None,
    ) -> None:
        self.net = net
        owner = owner if owner is not None else net
        trained = list(owner.parameters()) if trains is None else trains
        ids = {id(p) for p in trained}
        for p in owner.parameters():
            p.requires_grad_(id(p) in ids)
        for p in trained:
            # Gradients live as long as the model (torch's .grad after the first
            # backward); backward accumulates into them in place, so views stay valid.
            p.grad = torch.zeros_like(p)
        self.trained = trained
        self.params: Params = views(owner, trained)
        self.grads: Params = views(owner, trained, grads=True)
        self._frozen = views(owner, frozen or [])
        # float32 trains; a float64 net (`.double()`) checks equivalences exactly.
        self.dtype: np.dtype[Any] = next(iter(self.params.values())).dtype
        self._loss: torch.Tensor | None = None
        self._saved: dict[int, int] = {}  # storage -> bytes autograd saved for backward

    @property
    def frozen(self) -> Params:
        return self._frozen

    def _input(self, x: Array) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(x, dtype=self.dtype))

    def forward(self, x: Array, y: Array, net: nn.Module | None = None) -> float:
        """Mean cross-entropy of the batch through `net` (default: the module; the loop
        gives the DDP that wraps it); keeps the activations for backward()."""
        self._saved = {}
        with torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t):
            logits = (net or self.net)(self._input(x))
            self._loss = functional.cross_entropy(logits, torch.from_numpy(np.asarray(y, np.int64)))
        return float(self._loss.detach())

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        found = activation(t)
        if found is not None:
            self._saved[found[0]] = found[1]
        return t

    def backward(self) -> None:
        """Gradients of the last forward's loss into `.grad` (zeroed first, in place:
        the views stay valid)."""
        if self._loss is None:
            raise InvalidRequest("backward() without a forward() before it")
        for p in self.trained:
            assert p.grad is not None
            p.grad.zero_()
        loss, self._loss = self._loss, None
        loss.backward()  # type: ignore[no-untyped-call]
        self._saved = {}

    def logits(self, x: Array) -> Array:
        with torch.no_grad():
            out: Array = self.net(self._input(x)).numpy()
        return out

    def saved_bytes(self) -> int:
        return sum(self._saved.values())


def activation(t: torch.Tensor) -> tuple[int, int] | None:
    """(storage address, bytes) of a tensor autograd saves for backward that is an
    activation; None for a weight or a view of one (weight.t()), held as weights."""
    base = t._base if t._base is not None else t
    if isinstance(base, nn.Parameter):
        return None
    storage = t.untyped_storage()
    return storage.data_ptr(), storage.nbytes()  # a storage shared by views counts once


def optimizer_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the tensors in `optimizer`'s state (none before its first step)."""
    return sum(
        v.untyped_storage().nbytes()
        for state in optimizer.state.values()
        for v in state.values()
        if isinstance(v, torch.Tensor)
    )


def build_model(
    name: ModelName, features: int, classes: int, seed: int = 0, hidden: int = 64,
    blocks: int = 1,
) -> nn.Module:  # fmt: skip
    """A model for `features` inputs and `classes` outputs, initialised from `seed`
    (`initialise`). The MLP has `blocks` hidden layers of `hidden` units; the
    transformer (one block) reads the input as 8 tokens (an 8×8 digit's rows), so
    `features` must be a multiple of 8."""
    net: nn.Module
    if name == "mlp":
        net = MLP([features, *[hidden] * blocks, classes])
    elif blocks != 1:
        raise InvalidRequest(f"{name}: one block only, got blocks={blocks}")
    elif name == "transformer":
        if features % TOKENS:
            raise InvalidRequest(
                f"transformer: {features} features do not split into {TOKENS} tokens"
            )
        net = TransformerClassifier(TOKENS, features // TOKENS, classes, hidden)
    else:
        raise InvalidRequest(f"unknown model {name!r}: expected 'mlp' or 'transformer'")
    return initialise(net, seed)


def build_split(features: int, hidden: int, classes: int, blocks: int, seed: int) -> BlockSplit:
    """A `BlockSplit` whose MLP starts as `build_model("mlp", ...)` with the same seed
    (its output modules are initialised after the MLP's layers)."""
    return initialise(BlockSplit(features, hidden, classes, blocks), seed)


def initialise(net: M, seed: int) -> M:
    """torch's default initialisation of `net`'s layers (`reset_parameters`), drawn in
    definition order from a generator of its own: the same seed gives the same model
    in any thread (torch's global RNG is shared by a process's ranks on threads)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in net.modules():
            if isinstance(module, nn.Linear):
                nn.init.kaiming_uniform_(module.weight, a=math.sqrt(5), generator=g)
                bound = 1 / math.sqrt(module.in_features)
                nn.init.uniform_(module.bias, -bound, bound, generator=g)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
            elif isinstance(module, TransformerClassifier):
                nn.init.normal_(module.pos, 0.0, 0.02, generator=g)
    return net
