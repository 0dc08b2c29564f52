"""A DDP rank's compute on its socket's emulated clock: each forward and backward takes
the time the timing model prices its step at (workloads/training/scaling.py, `StepCost`),
times the socket's slowdown (a fault).

`forward` starts after the communication stream (the previous step's all-reduce);
`backward` marks when each gradient bucket is ready, in proportion to its bytes
(scaling.py, `split_by_bytes`), for the communication stream to start it then, and ends
with the process group's lateness check. `StepTiming` calls them for a built-in model's
stage, before its passes run (the gradient buckets torch's DDP all-reduces in backward
take the ready times); a preset model's timing-only loop calls them directly.
"""

from __future__ import annotations

from rdurack.node_agent.training.backend import LinkBackend
from rdurack.node_agent.training.host import RankHost
from rdurack.rack.clock import seconds_to_ns
from rdurack.workloads.training.scaling import StepCost, split_by_bytes


class StepTiming:
    """A built-in model's passes (one stage's, priced as `cost`) on the socket's clock."""

    def __init__(self, backend: LinkBackend, cost: StepCost, socket: RankHost) -> None:
        self.backend = backend
        self.cost = cost
        self.socket = socket

    def forward(self) -> None:
        forward(self.backend, self.cost, self.socket)

    def backward(self) -> None:
        backward(self.backend, self.cost, self.socket)


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
