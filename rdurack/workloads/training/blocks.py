"""An MLP split into blocks, each with an output module, and the model one stage trains.

The model is the same MLP full training trains, `[features, hidden × blocks, classes]`
(models.MLP, parameters `layers.{i}.*`): block i is its layer i (Linear, then ReLU);
the classifier `layers.{blocks}.*` is the last block's output module. Every other block
i has an output module of its own, `outputs.{i}.*`: a Linear from the block's `hidden`
outputs to the classes, which lets the block learn alone (ProFL's output modules; a
linear read-out is ours, for an MLP).

`StageModel` is what one progressive stage trains: blocks 0..i-1 frozen (forward only:
they keep no activations and have no gradients), block i and its output module
trained. Its parameters and gradients are those two modules only, so the optimizer
holds state and DDP all-reduces gradients for them only.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import DTypeLike

from rdurack.errors import InvalidRequest
from rdurack.workloads.training.arrays import TRAIN_DTYPE, Array, Params
from rdurack.workloads.training.models import (
    MLP,
    _linear,
    _linear_backward,
    _uniform,
    softmax_cross_entropy,
)


class BlockSplit:
    """The MLP's blocks and their output modules; arrays shared with `mlp`."""

    def __init__(
        self,
        features: int,
        hidden: int,
        classes: int,
        blocks: int,
        seed: int = 0,
        dtype: DTypeLike = TRAIN_DTYPE,
    ) -> None:
        if blocks < 2:
            raise InvalidRequest(f"a block split needs at least 2 blocks, got {blocks}")
        self.blocks = blocks
        self.mlp = MLP([features, *[hidden] * blocks, classes], seed=seed, dtype=dtype)
        rng = np.random.default_rng([seed, 1])  # the MLP's own stream stays as full's
        self.outputs: Params = {}
        for i in range(blocks - 1):
            self.outputs[f"outputs.{i}.weight"] = _uniform(rng, hidden, (classes, hidden), dtype)
            self.outputs[f"outputs.{i}.bias"] = _uniform(rng, hidden, (classes,), dtype)

    def block(self, i: int) -> Params:
        """Block i's parameters (the MLP's arrays)."""
        self._check(i)
        p = self.mlp.params
        return {
            f"layers.{i}.weight": p[f"layers.{i}.weight"],
            f"layers.{i}.bias": p[f"layers.{i}.bias"],
        }

    def output(self, i: int) -> Params:
        """Block i's output module: its own, or the classifier for the last block."""
        self._check(i)
        if i == self.blocks - 1:
            p, prefix = self.mlp.params, f"layers.{self.blocks}"
        else:
            p, prefix = self.outputs, f"outputs.{i}"
        return {f"{prefix}.weight": p[f"{prefix}.weight"], f"{prefix}.bias": p[f"{prefix}.bias"]}

    @property
    def params(self) -> Params:
        """Every array: the MLP's, then the output modules (what DDP broadcasts)."""
        return {**self.mlp.params, **self.outputs}

    def stage(self, i: int) -> StageModel:
        """The model that trains block i, blocks before it frozen."""
        return StageModel([self.block(j) for j in range(i)], self.block(i), self.output(i))

    def _check(self, i: int) -> None:
        if not 0 <= i < self.blocks:
            raise InvalidRequest(f"block {i} of {self.blocks}: blocks are 0..{self.blocks - 1}")


class StageModel:
    """Frozen blocks, then a trained block (Linear, ReLU) and its output module (Linear)."""

    def __init__(self, frozen: list[Params], block: Params, output: Params) -> None:
        self._frozen = frozen
        self._block = list(block.values())  # weight, bias
        self._output = list(output.values())
        self.params: Params = {**block, **output}
        self.grads: Params = {name: np.zeros_like(p) for name, p in self.params.items()}
        self.dtype: np.dtype[Any] = self._block[0].dtype
        self._saved: tuple[Array, Array, Array] | None = None  # block input, output, dlogits

    @property
    def frozen(self) -> Params:
        return {name: p for block in self._frozen for name, p in block.items()}

    def _features(self, x: Array) -> Array:
        """The frozen blocks' output: computed, not kept."""
        h = np.asarray(x, dtype=self.dtype)
        if h.ndim != 2 or h.shape[1] != self._input_width:
            raise InvalidRequest(f"input of shape {h.shape}: expected (batch, {self._input_width})")
        for block in self._frozen:
            w, b = block.values()
            h = np.maximum(_linear(h, w, b), 0)
        return h

    @property
    def _input_width(self) -> int:
        first = next(iter(self._frozen[0].values())) if self._frozen else self._block[0]
        return int(first.shape[1])

    def _run(self, x: Array) -> tuple[Array, Array, Array]:
        h = self._features(x)
        r = np.maximum(_linear(h, *self._block), 0)
        return h, r, _linear(r, *self._output)

    def forward(self, x: Array, y: Array) -> float:
        h, r, logits = self._run(x)
        loss, dlogits = softmax_cross_entropy(logits, np.asarray(y))
        self._saved = (h, r, dlogits)
        return loss

    def backward(self) -> None:
        if self._saved is None:
            raise InvalidRequest("backward() without a forward() before it")
        h, r, dlogits = self._saved
        self._saved = None
        names = list(self.params)
        dr, dw, db = _linear_backward(r, self._output[0], dlogits)
        np.copyto(self.grads[names[2]], dw, casting="no")
        np.copyto(self.grads[names[3]], db, casting="no")
        _, dw, db = _linear_backward(h, self._block[0], dr * (r > 0))
        np.copyto(self.grads[names[0]], dw, casting="no")
        np.copyto(self.grads[names[1]], db, casting="no")

    def logits(self, x: Array) -> Array:
        return self._run(x)[2]

    def saved_bytes(self) -> int:
        return sum(a.nbytes for a in self._saved) if self._saved is not None else 0
