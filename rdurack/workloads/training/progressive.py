"""Training strategies as stages: `full` is one stage, `progressive` is ProFL's.

ProFL (Wu, Li, Xu, "Breaking the Memory Wall for Heterogeneous Federated Learning via
Progressive Training", arXiv 2404.13349) trains a model block by block (blocks.py):

- shrinking stage, back to front (block B-1 down to 0): block i and its output module
  train on top of blocks 0..i-1 frozen at their initialization; what it learns is
  block i's initial parameters and its output module for the growing stage. The model
  shrinks as it goes: block i then leaves HBM for DDR, with its output module;
- growing stage, front to back (block 0 up to B-1): block i trains from those initial
  parameters with its output module, on top of blocks 0..i-1 already trained and
  frozen; it freezes when its effective movement (movement.py) falls below the
  threshold, or at the stage's step budget, and the next block starts.

The growing stage's block 0 starts where the shrinking stage's block 0 ended (the same
model on the same data): it freezes at its first window when it had converged there.

Frozen blocks keep their weights in HBM (forward needs them) and nothing else: no
gradients, no optimizer state, no stored activations. Blocks not yet grown wait in
DDR; an output module whose block is frozen is dropped (the last block's output
module is the model's classifier, which stays).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from rdurack.errors import InvalidRequest
from rdurack.rack.spec import Tier

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
