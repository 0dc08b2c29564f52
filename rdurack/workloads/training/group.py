"""The built-in loop's process group: a `torch.distributed.ProcessGroup` over a `Backend`
(backend.py: the socket's links on the rack, a `ThreadGroup` in one process), so that
torch's own `DistributedDataParallel` averages the gradients.

DDP is given the group (`DistributedDataParallel(module, process_group=...)`), so no
default group is needed: several ranks live in one process, each with a group of its
own (threads of a `ThreadGroup`), and a socket actor runs a built-in job without
`init_process_group`. DDP calls what is here: all-reduce (its gradient buckets, SUM of
gradients it divided by the world size), broadcast (`_sync_module_states`), all-gather
(its parameter-shape check). Each collective runs in the call, on the caller's thread,
and its errors raise from the call: inside `loss.backward()` for a gradient bucket,
where torch's C++ passes them on (a torch Future completed with an exception would
crash DDP's reducer; node_agent/training/process_group.py says more). The returned Work
is complete.

Tensors travel as numpy views of their memory (CPU tensors share it), reduced in place.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Work

from rdurack.errors import InvalidRequest
from rdurack.workloads.training.backend import Backend

NAME = "rdulink"  # what the group calls its backend (torch's "nccl" on GPUs)


class Done(Work):
    """A collective that already ran (in the call that returned it)."""

    def __init__(self, result: list[torch.Tensor]) -> None:
        super().__init__()
        self._future: torch.futures.Future[list[torch.Tensor]] = torch.futures.Future()
        self._future.set_result(result)

    def wait(self, timeout: timedelta | None = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def get_future(self) -> torch.futures.Future[list[torch.Tensor]]:
        return self._future


class BackendGroup(dist.ProcessGroup):
    """One rank's process group over `backend`. The methods are what DDP and
    torch.distributed's functions call on a group; torch's stubs overload some with
    other forms (hence the ignores), which never reach Python."""

    def __init__(self, backend: Backend) -> None:
        super().__init__(backend.rank, backend.world_size)  # type: ignore[call-arg]
        self.backend = backend

    def getBackendName(self) -> str:  # noqa: N802 (torch's name)
        return NAME

    @property
    def name_(self) -> str:
        return NAME

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Work:  # type: ignore[override]
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        op = getattr(op, "op", op)
        if op not in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
            raise InvalidRequest(f"the built-in loop's group reduces with SUM or AVG, not {op}")
        for t in tensors:
            self.backend.all_reduce(_flat(t), "mean" if op == dist.ReduceOp.AVG else "sum")
        return Done(tensors)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> Work:  # type: ignore[override]
        for t in tensors:
            self.backend.broadcast(_flat(t), opts.rootRank)
        return Done(tensors)

    def allgather(  # type: ignore[override]
        self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None
    ) -> Work:
        for out, t in zip(outputs, inputs, strict=True):
            for o, part in zip(out, self.backend.all_gather(_flat(t)), strict=True):
                o.copy_(torch.from_numpy(part).reshape(o.shape))
        return Done([o for out in outputs for o in out])

    def _allgather_base(self, output: torch.Tensor, t: torch.Tensor, opts: Any = None) -> Work:
        parts = self.backend.all_gather(_flat(t))
        output.copy_(torch.from_numpy(np.concatenate(parts)).reshape(output.shape))
        return Done([output])

    def barrier(self, opts: Any = None) -> Work:
        self.backend.barrier()
        return Done([])


def _flat(t: torch.Tensor) -> np.ndarray:
    """`t`'s memory as a one-dimensional numpy array (collectives work in place)."""
    if t.device.type != "cpu" or not t.is_contiguous():
        raise InvalidRequest("the built-in loop's collectives take contiguous CPU tensors")
    return t.detach().numpy().reshape(-1)


# ------------------------------------------------------------------ the loop's own calls
# torch.distributed's functions take registered groups only; these call any group.


def broadcast(group: dist.ProcessGroup, t: torch.Tensor, src: int) -> None:
    """Rank `src`'s `t` into every rank's, in place."""
    opts = dist.BroadcastOptions()
    opts.rootRank = src
    group.broadcast([t], opts).wait()


def all_gather(group: dist.ProcessGroup, t: torch.Tensor) -> list[torch.Tensor]:
    """Every rank's `t` (the same shape on all), by rank."""
    out = [torch.empty_like(t) for _ in range(group.size())]
    group.allgather([out], [t]).wait()
    return out


def barrier(group: dist.ProcessGroup) -> None:
    group.barrier().wait()
