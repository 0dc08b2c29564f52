"""A client's own training function on a rank: it gets the torch.distributed API bound
to the rank's links (`TrainContext`), runs once, and its return value goes back to the
client pickled (docs: who may submit one).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ray import cloudpickle

from rdurack.node_agent.training.backend import LinkBackend
from rdurack.workloads.training.distributed import Distributed


@dataclass
class TrainContext:
    """What a user's training function gets on its rank (Ray Train's
    `train_loop_per_worker` receives its config the same way): the torch.distributed
    API bound to this rank's links, before init_process_group."""

    dist: Distributed
    rank: int
    world_size: int
    device: str
    checkpoint_dir: Path | None
    config: dict[str, Any]


def run_user_loop(
    loop: bytes, backend: LinkBackend, device: str, checkpoint_dir: Path | None
) -> bytes:
    """Run the pickled function `loop` on `backend`'s rank of socket `device`; its
    return value, pickled. The compute stream waits for the last all-reduce."""
    fn: Callable[[TrainContext], Any] = cloudpickle.loads(loop)
    ctx = TrainContext(
        Distributed(backend), backend.rank, backend.world_size, device, checkpoint_dir, {}
    )
    value = fn(ctx)
    backend.settle()
    return bytes(cloudpickle.dumps(value))  # type: ignore[no-untyped-call]
