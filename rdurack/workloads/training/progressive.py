"""Training strategies as stages: `full` is one stage, `progressive` is ProFL's.

ProFL (Wu, Li, Xu, "Breaking the Memory Wall for Heterogeneous Federated Learning via
Progressive Training", arXiv 2404.13349) trains a model block by block (models.py, `BlockSplit`):

- shrinking stage, back to front (block B-1 down to 0): block i and its output module
  train on top of blocks 0..i-1 frozen at their initialization; what it learns is
  block i's initial parameters and its output module for the growing stage. The model
  shrinks as it goes: block i then leaves HBM for DDR, with its output module;
- growing stage, front to back (block 0 up to B-1): block i trains from those initial
  parameters with its output module, on top of blocks 0..i-1 already trained and
  frozen; it freezes when its effective movement (below) falls below the
  threshold, or at the stage's step budget, and the next block starts.

The growing stage's block 0 starts where the shrinking stage's block 0 ended (the same
model on the same data): it freezes at its first window when it had converged there.

Frozen blocks keep their weights in HBM (forward needs them) and nothing else: no
gradients, no optimizer state, no stored activations. Blocks not yet grown wait in
DDR; an output module whose block is frozen is dropped (the last block's output
module is the model's classifier, which stays).

When a block has converged: the effective movement of its parameters over a window.

ProFL freezes a block once "a scalar metric" says it has learned what it can (Wu, Li,
Xu, arXiv 2404.13349, abstract); the paper's formula is not public, so this one is
ours. Over a window of W optimizer steps k = 1..W, with Δ_kj = θ_kj − θ_(k−1)j the
update of scalar parameter j:

    m_j = |Σ_k Δ_kj| / Σ_k |Δ_kj|        (0 <= m_j <= 1; m_j = 0 if j did not move)

    movement = mean of m_j over the block's scalars

m_j is 1 when every step moved j the same way (still descending) and falls when its
steps cancel (it oscillates around a minimum under gradient noise; for independent
steps E[m_j] ≈ 1/√W). Windows tumble: one value every W steps. The block freezes at
the end of the first window whose movement is below the threshold.

Memory: m_j is tracked on a fixed, seeded sample of at most `sample` of the block's
scalars (all of them in a smaller block): the sample mean estimates the block's mean,
and the metric holds 3 float64 values and one index per sampled scalar instead of
copies of the whole block. `nbytes` is what it holds (accounted as "movement").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from rdurack.errors import InvalidRequest
from rdurack.rack.spec import Tier
from rdurack.workloads.training.data import Array, Params

Strategy = Literal["full", "progressive"]
Phase = Literal["full", "shrink", "grow"]
STRATEGIES: tuple[Strategy, ...] = ("full", "progressive")


@dataclass(frozen=True)
class Stage:
    """What one stage trains: the whole model, or one block."""

    phase: Phase
    block: int | None = None  # None: the whole model

    @property
    def name(self) -> str:
        return self.phase if self.block is None else f"{self.phase} block {self.block}"


def stage_order(strategy: Strategy, blocks: int) -> list[Stage]:
    """The stages in training order."""
    if strategy == "full":
        return [Stage("full")]
    if blocks < 2:
        raise InvalidRequest(f"progressive training needs a model of >= 2 blocks, got {blocks}")
    return [Stage("shrink", i) for i in reversed(range(blocks))] + [
        Stage("grow", i) for i in range(blocks)
    ]


def block_name(i: int) -> str:
    return f"block.{i}"


def output_name(i: int) -> str:
    return f"output.{i}"


def placement(stage: Stage, blocks: int) -> dict[str, Tier]:
    """Where each module's weights are during a progressive stage: `block.{i}` and
    `output.{i}` (block i's output module; `output.{blocks-1}` is the classifier) to
    their tier. A module not listed is not held (an output module of a frozen block)."""
    if stage.block is None:
        raise InvalidRequest("placement is per block: the full strategy holds one model")
    i = stage.block
    where: dict[str, Tier] = {}
    for j in range(blocks):
        where[block_name(j)] = Tier.HBM if j <= i else Tier.DDR
        if j == i:
            where[output_name(j)] = Tier.HBM
        elif stage.phase == "shrink" or j > i:
            where[output_name(j)] = Tier.DDR
    return where


@dataclass
class StageReport:
    """One stage of one rank, once it ended. Peaks are the rank's socket's, bytes."""

    phase: Phase
    block: int | None
    start_step: int  # global step count when it began
    steps: int
    converged: bool  # frozen by the movement metric (False: at the step budget)
    movement: float | None  # the last completed window's effective movement
    loss: float | None  # this rank's last local batch loss
    test_accuracy: float | None = None  # the stage's model, on rank 0
    peak_bytes: dict[str, int] = field(default_factory=dict)  # tier name -> bytes

    @property
    def name(self) -> str:
        return Stage(self.phase, self.block).name

    @property
    def frozen_at_step(self) -> int | None:
        """The step the metric froze the block at; None when it ran its budget."""
        return self.start_step + self.steps if self.converged else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "phase": self.phase,
            "block": self.block,
            "start_step": self.start_step,
            "steps": self.steps,
            "converged": self.converged,
            "frozen_at_step": self.frozen_at_step,
            "movement": self.movement,
            "loss": self.loss,
            "test_accuracy": self.test_accuracy,
            "peak_bytes": dict(self.peak_bytes),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StageReport:
        return cls(
            phase=d["phase"],
            block=d.get("block"),
            start_step=int(d["start_step"]),
            steps=int(d["steps"]),
            converged=bool(d["converged"]),
            movement=d.get("movement"),
            loss=d.get("loss"),
            test_accuracy=d.get("test_accuracy"),
            peak_bytes={k: int(v) for k, v in d.get("peak_bytes", {}).items()},
        )


DEFAULT_WINDOW_STEPS = 25
DEFAULT_THRESHOLD = 0.45
DEFAULT_SAMPLE = 256  # scalars per block the metric follows


class EffectiveMovement:
    """The movement of the parameters `params` (name -> array, updated in place by the
    optimizer), one value per completed window of `window` steps."""

    def __init__(
        self,
        params: Params,
        window: int = DEFAULT_WINDOW_STEPS,
        threshold: float = DEFAULT_THRESHOLD,
        sample: int = DEFAULT_SAMPLE,
        seed: int = 0,
    ) -> None:
        if window < 2:
            raise InvalidRequest(f"the movement window must be >= 2 steps, got {window}")
        if not 0 < threshold < 1:
            raise InvalidRequest(f"the movement threshold must be in (0, 1), got {threshold}")
        if not params or sample < 1:
            raise InvalidRequest("the movement metric needs parameters and a sample >= 1")
        self.params = params
        self.window = window
        self.threshold = threshold
        sizes = [p.size for p in params.values()]
        total = sum(sizes)
        rng = np.random.default_rng([seed, total])
        chosen = np.sort(rng.choice(total, size=min(total, sample), replace=False))
        # Per tensor, the flat indices of its sampled scalars.
        offsets = np.cumsum([0, *sizes])
        self._where: list[tuple[str, Array]] = []
        for (name, _), lo, hi in zip(params.items(), offsets[:-1], offsets[1:], strict=True):
            mine = chosen[(chosen >= lo) & (chosen < hi)] - lo
            if mine.size:
                self._where.append((name, mine.astype(np.int64)))
        self._prev = self._values()
        self._start = self._prev.copy()
        self._path = np.zeros_like(self._prev)  # Σ |Δ| over the window, per scalar
        self.steps = 0  # steps seen
        self.last: float | None = None  # movement of the last completed window
        self.history: list[float] = []  # every completed window's movement

    @property
    def sampled(self) -> int:
        return int(self._prev.size)

    @property
    def nbytes(self) -> int:
        """What the metric holds: three float64 values and one index per sampled scalar."""
        index = sum(idx.nbytes for _, idx in self._where)
        return self._prev.nbytes + self._start.nbytes + self._path.nbytes + index

    def _values(self) -> Array:
        return np.concatenate(
            [self.params[name].ravel()[idx].astype(np.float64) for name, idx in self._where]
        )

    def update(self) -> float | None:
        """After an optimizer step: the window's movement if this step completed a
        window, else None."""
        now = self._values()
        self._path += np.abs(now - self._prev)
        self._prev = now
        self.steps += 1
        if self.steps % self.window:
            return None
        moved = np.abs(now - self._start)
        ratio = np.divide(moved, self._path, out=np.zeros_like(moved), where=self._path > 0)
        self.last = float(ratio.mean())
        self.history.append(self.last)
        self._start = now.copy()
        self._path[...] = 0.0
        return self.last

    def converged(self, movement: float | None) -> bool:
        """Whether a window's movement says the block has converged."""
        return movement is not None and movement < self.threshold
