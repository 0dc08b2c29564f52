"""A script rank's memory, measured from its real tensors and held on the socket's HBM
(workloads/training/memory.py's account, under the socket's capacity or the job's cap).

What is counted, as torch on an accelerator would hold it:
- weights: the parameters of every module forward runs (a global forward hook), frozen
  ones too: they stay in memory;
- gradients: one per weight that requires grad (frozen ones, `requires_grad_(False)`,
  have none), from backward on;
- activations: the other tensors autograd saves for backward (its saved-tensor
  hooks), distinct storages, held from the end of forward until backward ends;
- optimizer: the tensors in each optimizer's state, after its step.

Not counted: DDP's gradient buckets (a second copy of the gradients unless the script
passes gradient_as_bucket_view=True), the data loader's batches, and temporaries that
are not saved for backward: the figures are a floor of what the hardware would need.
A part that does not fit fails the script where it grows, with OutOfMemory's message.
"""

from __future__ import annotations

from typing import Any

import torch

from rdurack.rack.spec import Tier
from rdurack.workloads.training.memory import MemoryAccount
from rdurack.workloads.training.models import activation, optimizer_bytes


class TensorMemory:
    """Rank memory from tensors, held on `account` as it changes."""

    def __init__(self, account: MemoryAccount) -> None:
        self.account = account
        self._weights: dict[int, tuple[int, bool]] = {}  # id -> (bytes, trains)
        self._saved: dict[int, int] = {}  # activations since forward began
        self._optimizers: dict[int, int] = {}  # id(optimizer) -> its state's bytes
        self.peaks: dict[str, int] = {}  # the most each part held, bytes

    def module_runs(self, module: torch.nn.Module, *_: Any) -> None:
        """`module`'s forward begins (a global forward pre-hook)."""
        for p in module.parameters(recurse=False):
            self._weights[id(p)] = (p.untyped_storage().nbytes(), p.requires_grad)

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        """autograd saves `t` for backward (a saved-tensor hook)."""
        found = activation(t)
        if found is not None:
            self._saved[found[0]] = found[1]
        return t

    def forward_ended(self) -> None:
        """Backward begins: forward's weights and activations are all there."""
        self._hold("weights", sum(n for n, _ in self._weights.values()))
        self._hold("gradients", sum(n for n, trains in self._weights.values() if trains))
        self._hold("activations", sum(self._saved.values()))

    def backward_ended(self) -> None:
        self._saved.clear()
        self._hold("activations", 0)

    def stepped(self, optimizer: torch.optim.Optimizer) -> None:
        """`optimizer` stepped: its state now exists."""
        self._optimizers[id(optimizer)] = optimizer_bytes(optimizer)
        self._hold("optimizer", sum(self._optimizers.values()))

    def _hold(self, part: str, nbytes: int) -> None:
        self.account.hold(part, Tier.HBM, nbytes)
        self.peaks[part] = max(self.peaks.get(part, 0), nbytes)

    def breakdown(self) -> dict[str, Any]:
        """The most each part held (TrainingMemory's fields), and the most at once."""
        parts = {
            p: self.peaks.get(p, 0) for p in ("weights", "gradients", "optimizer", "activations")
        }
        parts["total"] = self.account.window_peaks()[Tier.HBM.value]
        return parts
