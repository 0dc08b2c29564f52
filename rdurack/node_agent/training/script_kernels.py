"""How a script's operators become kernels on the socket's timing model (rack/timing.py),
unfused or fused, as the job asks (its `fusion_plan`).

Unfused: each operator is its own kernel: a software-orchestrated launch and its roofline,
max(FLOPs / compute rate, bytes / HBM rate), its bytes its tensor inputs and outputs.

Fused (a dataflow kernel, SN40L's way): the operators between two sync points run as one
kernel whose intermediates stay on chip. Its HBM traffic is what enters it (inputs it did
not produce, each read once) and what leaves it (outputs still alive when it ends: saved
for backward, returned, kept); its time one launch (software- or hardware-orchestrated,
as the plan says), the pipeline's fill, and the roofline of its FLOPs and that traffic.
Sync points end a kernel: a collective, the turn from forward to backward and back, an
optimizer step, the script's end. A kernel whose intermediates would outgrow the
socket's SRAM ends before the operator that would overflow it (the rest spills into the
next kernel). This is a model of what a dataflow compiler could fuse from the operators
torch runs, not of SambaNova's compiler.
"""

from __future__ import annotations

import weakref
from typing import Protocol

import torch

from rdurack.rack.kernels import FusionPlan
from rdurack.rack.timing import Timer


class Kernels(Protocol):
    """Operators in, kernels' seconds out."""

    def add(self, flops: float, inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> float:
        """An operator ran; the seconds of any kernel that ended with it (or before)."""

    def flush(self) -> float:
        """A sync point: the seconds of the kernel it ends (0.0 if none is open)."""


class Unfused:
    """Each operator its own kernel."""

    def __init__(self, timer: Timer) -> None:
        self.timer = timer

    def add(self, flops: float, inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> float:
        nbytes = sum(t.nbytes for t in inputs) + sum(t.nbytes for t in outputs)
        return self.timer.unfused_s(flops, nbytes)

    def flush(self) -> float:
        return 0.0


class Fused:
    """The operators between sync points as one dataflow kernel."""

    def __init__(self, timer: Timer, plan: FusionPlan, sram_bytes: int) -> None:
        self.timer = timer
        self.plan = plan
        self.sram_bytes = sram_bytes
        self.kernels = 0  # ended so far
        self._reset()

    def _reset(self) -> None:
        self._flops = 0.0
        self._operators = 0
        self._read: dict[int, int] = {}  # storage -> bytes read from HBM
        self._made: dict[int, tuple[weakref.ref[torch.Tensor], int]] = {}  # storage -> out
        self._made_bytes = 0  # what its intermediates would hold on chip

    def add(self, flops: float, inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> float:
        new = sum(t.nbytes for t in outputs)
        seconds = self.flush() if self._made_bytes + new > self.sram_bytes else 0.0
        for t in inputs:
            key = t.untyped_storage().data_ptr()
            if key not in self._made and key not in self._read:
                self._read[key] = t.untyped_storage().nbytes()
        for t in outputs:
            self._made[t.untyped_storage().data_ptr()] = (weakref.ref(t), t.nbytes)
        self._made_bytes += new
        self._flops += flops
        self._operators += 1
        return seconds

    def flush(self) -> float:
        if not self._operators:
            return 0.0
        written = sum(n for ref, n in self._made.values() if ref() is not None)
        hbm_bytes = sum(self._read.values()) + written
        seconds = self.timer.fused_s(self._flops, hbm_bytes, self.plan)
        self.kernels += 1
        self._reset()
        return seconds


def kernels_for(timer: Timer, plan: FusionPlan) -> Kernels:
    """How `timer`'s socket runs a script's operators under `plan`."""
    if plan is FusionPlan.UNFUSED:
        return Unfused(timer)
    return Fused(timer, plan, timer.platform.socket.sram.capacity_bytes)
