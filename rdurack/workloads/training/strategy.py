"""What a training strategy trains at each stage, and where the weights are meanwhile.

`Trainee` holds a rank's parameters for a strategy (progressive.py): for `full`, the
model (models.py) trained whole in one stage; for `progressive`, an MLP split into
blocks with output modules (models.BlockSplit), one block per stage. Per stage it gives the
model the loop trains and what that stage holds, for the memory account (memory.py).

`plan_memory` says what a rank of a built-in training job will hold, stage by stage,
before it runs: it builds the job's model as the loop does (a `Trainee`), and runs the
loop's accounting (memory.py) on a scratch socket for two steps of each stage on a
batch of zeros of the rank's size: the same arrays (parameters, gradients, the
optimizer's state after its first step, what forward keeps for backward, the movement
metric's sample), so the plan is what the run will account, not a formula beside it.
(Two steps: the optimizer's state appears at the first one.) This is how a job that
cannot fit is refused before it is stored.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from rdurack.errors import InvalidRequest
from rdurack.rack.memory import TieredMemory
from rdurack.rack.spec import SocketSpec, Tier
from rdurack.workloads.training.data import Params, data_shape
from rdurack.workloads.training.memory import Holding, MemoryAccount
from rdurack.workloads.training.models import (
    BlockSplit,
    ModelName,
    Trainable,
    build_model,
    build_split,
    optimizer_bytes,
    views,
)
from rdurack.workloads.training.progressive import (
    EffectiveMovement,
    Stage,
    Strategy,
    block_name,
    placement,
    stage_order,
)
from rdurack.workloads.training.rank import TrainSpec


def make_optimizer(spec: TrainSpec, model: Trainable) -> torch.optim.Optimizer:
    """torch.optim's SGD or Adam over what `model` trains."""
    if spec.optimizer == "sgd":
        return torch.optim.SGD(
            model.trained, lr=spec.lr, momentum=spec.momentum, weight_decay=spec.weight_decay
        )
    return torch.optim.Adam(model.trained, lr=spec.lr, weight_decay=spec.weight_decay)


def _nbytes(params: Params) -> int:
    return sum(p.nbytes for p in params.values())


class Trainee:
    """One rank's parameters under `strategy`, stage by stage."""

    def __init__(
        self,
        strategy: Strategy,
        model: ModelName,
        features: int,
        classes: int,
        seed: int,
        hidden: int,
        blocks: int,
    ) -> None:
        self.strategy = strategy
        self.stages = stage_order(strategy, blocks)
        self.split: BlockSplit | None = None
        if strategy == "full":
            net = build_model(model, features, classes, seed, hidden, blocks=blocks)
            self.model = Trainable(net)
        else:
            if model != "mlp":
                raise InvalidRequest(
                    f"progressive training splits an MLP into blocks; {model!r} is one block"
                )
            self.split = build_split(features, hidden, classes, blocks, seed)
            # What the last stage completes: the MLP, without the output modules.
            self.model = Trainable(self.split, list(self.split.layers.parameters()))

    @property
    def params(self) -> Params:
        """Every parameter a rank holds (DDP broadcasts them from rank 0)."""
        return self.model.params if self.split is None else self._params(self.split)

    def stage_model(self, stage: Stage) -> Trainable:
        """The model `stage` trains."""
        if self.split is None or stage.block is None:
            return self.model
        return self.split.stage(stage.block)

    def block_params(self, stage: Stage) -> Params | None:
        """The block whose movement decides when the stage ends; None: full training."""
        if self.split is None or stage.block is None:
            return None
        return self._params(self.split.block(stage.block))

    def _params(self, module: nn.Module) -> Params:
        assert self.split is not None
        return views(self.split, list(module.parameters()))

    def weights(self, stage: Stage) -> dict[str, Holding]:
        """Each module's weights during `stage`: part -> (tier, bytes)."""
        if self.split is None or stage.block is None:
            return {"weights": (Tier.HBM, _nbytes(self.model.params))}
        split = self.split
        out: dict[str, Holding] = {}
        for part, tier in placement(stage, split.blocks).items():
            i = int(part.rsplit(".", 1)[1])
            module = split.block(i) if part == block_name(i) else split.output(i)
            out[part] = (tier, _nbytes(self._params(module)))
        return out

    def holdings(
        self, stage: Stage, model: Trainable, movement: EffectiveMovement | None
    ) -> dict[str, Holding]:
        """What `stage` holds from its start: weights, the trained part's gradients,
        the movement metric. (Optimizer state and activations come and go with steps.)"""
        out = self.weights(stage)
        out["gradients"] = (Tier.HBM, _nbytes(model.grads))
        if movement is not None:
            out["movement"] = (Tier.HBM, movement.nbytes)
        return out


WEIGHT_PARTS = ("weights", "block.", "output.")  # part names (prefixes) of weights


@dataclass(frozen=True)
class StagePlan:
    """One stage: its peak per tier, and what it holds at its HBM peak."""

    stage: Stage
    peak_bytes: dict[str, int]  # tier name -> bytes
    parts: dict[str, Holding]  # part -> (tier, bytes), at the peak (after forward)

    def hbm_parts(self) -> dict[str, int]:
        """HBM bytes by kind: weights, gradients, optimizer, activations, movement."""
        out = dict.fromkeys(("weights", "gradients", "optimizer", "activations", "movement"), 0)
        for part, (tier, nbytes) in self.parts.items():
            if tier != Tier.HBM:
                continue
            kind = "weights" if part.startswith(WEIGHT_PARTS) else part
            out[kind] += nbytes
        return out


@dataclass(frozen=True)
class MemoryPlan:
    stages: list[StagePlan]

    def peak(self, tier: Tier) -> int:
        return max(s.peak_bytes[tier.value] for s in self.stages)

    def peak_stage(self, tier: Tier = Tier.HBM) -> StagePlan:
        """The (first) stage that reaches the tier's peak."""
        return max(self.stages, key=lambda s: s.peak_bytes[tier.value])


def plan_memory(spec: TrainSpec, socket: SocketSpec) -> MemoryPlan:
    """Per stage of `spec`'s strategy, the peak bytes per tier one rank reaches."""
    features, classes = data_shape(spec)
    trainee = Trainee(
        spec.strategy, spec.model, features, classes, spec.seed, spec.hidden, spec.blocks
    )
    account = MemoryAccount(TieredMemory("plan", socket), "plan/")
    x = np.zeros((spec.local_batch, features), dtype=np.float32)
    y = np.zeros(spec.local_batch, dtype=np.int64)
    stages: list[StagePlan] = []
    for stage in trainee.stages:
        model = trainee.stage_model(stage)
        optimizer = make_optimizer(spec, model)
        block = trainee.block_params(stage)
        movement = (
            EffectiveMovement(block, spec.freeze_window, spec.freeze_threshold)
            if block is not None
            else None
        )
        account.place(trainee.holdings(stage, model, movement))
        account.begin_stage()
        parts: dict[str, Holding] = {}
        for _ in range(2):
            model.forward(x, y)
            account.hold("activations", Tier.HBM, model.saved_bytes())
            parts = account.held()
            model.backward()
            account.release("activations")
            optimizer.step()  # on a scratch model: its values do not matter
            account.hold("optimizer", Tier.HBM, optimizer_bytes(optimizer))
        stages.append(StagePlan(stage, account.end_stage(), parts))
    account.close()
    return MemoryPlan(stages)
