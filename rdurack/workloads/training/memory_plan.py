"""What a rank of a built-in training job will hold, stage by stage, before it runs.

`plan_memory` builds the job's model as the loop does (strategy.py), and runs the
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

from rdurack.rack.memory import TieredMemory
from rdurack.rack.spec import SocketSpec, Tier
from rdurack.workloads.training.data import data_shape
from rdurack.workloads.training.loop import make_optimizer
from rdurack.workloads.training.memory import Holding, MemoryAccount
from rdurack.workloads.training.models import optimizer_bytes
from rdurack.workloads.training.movement import EffectiveMovement
from rdurack.workloads.training.progressive import Stage
from rdurack.workloads.training.rank import TrainSpec
from rdurack.workloads.training.strategy import Trainee

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
