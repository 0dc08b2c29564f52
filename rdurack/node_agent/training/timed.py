"""A DDP rank's compute on its socket's emulated clock: each forward and backward takes
the time the timing model prices its step at (workloads/training/job.py, `StepCost`),
times the socket's slowdown (a fault).

`forward` starts after the communication stream (the previous step's all-reduce);
`backward` marks when each gradient bucket is ready, in proportion to its bytes
(scaling.py, `split_by_bytes`), for the communication stream to start it then, and ends
with the process group's lateness check. `TimedModel` wraps a built-in model so that its
passes do both; a preset model's timing-only loop calls them directly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rdurack.node_agent.training.backend import LinkBackend
from rdurack.node_agent.training.host import RankHost
from rdurack.rack.clock import seconds_to_ns
from rdurack.workloads.training.arrays import Array, Params
from rdurack.workloads.training.job import StepCost
from rdurack.workloads.training.scaling import split_by_bytes

if TYPE_CHECKING:
    from rdurack.workloads.training.models import Model


class TimedModel:
    """A built-in model whose passes advance the socket's emulated clock by the timing
    model, and whose backward marks when each gradient bucket is ready."""

    def __init__(self, model: Model, backend: LinkBackend, cost: StepCost, socket: RankHost):
        self.model = model
        self.backend = backend
        self.cost = cost
        self.socket = socket
        # The model's own dicts: optimizers and DDP update them in place.
        self.params: Params = model.params
        self.grads: Params = model.grads
        self.dtype = model.dtype

    @property
    def frozen(self) -> Params:
        return self.model.frozen

    def forward(self, x: Array, y: Array) -> float:
        forward(self.backend, self.cost, self.socket)
        return self.model.forward(x, y)

    def backward(self) -> None:
        self.model.backward()
        backward(self.backend, self.cost, self.socket)

    def logits(self, x: Array) -> Array:
        return self.model.logits(x)

    def saved_bytes(self) -> int:
        return self.model.saved_bytes()


def forward(backend: LinkBackend, cost: StepCost, socket: RankHost) -> None:
    """A step's forward on the socket's clock, after the communication stream."""
    backend.begin_step()
    socket.clock.advance(cost.forward_s * socket.slowdown)
    backend.compute_s += cost.forward_s


def backward(backend: LinkBackend, cost: StepCost, socket: RankHost) -> None:
    """Backward's compute on the socket's clock; each bucket ready in proportion to its
    bytes (split_by_bytes); then the lateness check."""
    backend.compute_s += cost.backward_s
    start = socket.clock.now_ns
    total = cost.backward_s * socket.slowdown
    done = 0.0
    backend.ready.clear()
    for share in split_by_bytes(total, cost.bucket_bytes):
        done += share
        backend.ready.append(start + seconds_to_ns(done))
    socket.clock.advance(total)
    backend.step += 1
    backend.check_lateness()
