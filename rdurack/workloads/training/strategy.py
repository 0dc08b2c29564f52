"""What a training strategy trains at each stage, and where the weights are meanwhile.

`Trainee` holds a rank's parameters for a strategy (progressive.py): for `full`, the
model (models.py) trained whole in one stage; for `progressive`, an MLP split into
blocks with output modules (models.BlockSplit), one block per stage. Per stage it gives the
model the loop trains and what that stage holds, for the memory account (memory.py).
"""

from __future__ import annotations

from torch import nn

from rdurack.errors import InvalidRequest
from rdurack.rack.spec import Tier
from rdurack.workloads.training.arrays import Params
from rdurack.workloads.training.memory import Holding
from rdurack.workloads.training.models import (
    BlockSplit,
    ModelName,
    Trainable,
    build_model,
    build_split,
    views,
)
from rdurack.workloads.training.movement import EffectiveMovement
from rdurack.workloads.training.progressive import (
    Stage,
    Strategy,
    block_name,
    placement,
    stage_order,
)


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
