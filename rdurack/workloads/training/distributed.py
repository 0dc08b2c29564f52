"""torch.distributed's names with explicit state: one `Distributed` object per rank.

torch keeps the default process group in a module global; here each rank holds a
`Distributed` built on its transport (the `Backend` the cluster, or a `ThreadGroup`,
gave this process), so several ranks live in one process without sharing anything.
`init_process_group` checks what torch users get wrong (the article's "a process group
with wrong world size or rank") against the transport's real size and rank, and says so
with the numbers instead of hanging.
"""

from __future__ import annotations

from datetime import timedelta
from enum import StrEnum

from rdurack.errors import InvalidRequest, RdurackError
from rdurack.workloads.training.arrays import Array
from rdurack.workloads.training.backend import Backend, ReduceOpName

BACKEND_NAME = "rdulink"  # the rack's socket-to-socket links; torch's "nccl" here
# torch's default process-group timeout (datetime.timedelta(minutes=30)), seconds.
DEFAULT_TIMEOUT_S = 1800.0


class ReduceOp(StrEnum):
    """torch.distributed.ReduceOp members this backend supports."""

    SUM = "sum"
    AVG = "mean"


class NotInitialized(RdurackError):
    """A collective or query before init_process_group (or after destroy)."""


class Distributed:
    """One rank's torch.distributed: `init_process_group`, collectives, teardown."""

    def __init__(self, transport: Backend) -> None:
        self._transport = transport  # this process's end of the group, before init
        self._initialized = False
        self._timeout_s = DEFAULT_TIMEOUT_S

    # ------------------------------------------------------------ lifecycle

    def init_process_group(
        self,
        backend: str = BACKEND_NAME,
        *,
        world_size: int,
        rank: int,
        timeout: timedelta | float = DEFAULT_TIMEOUT_S,
    ) -> None:
        """Join the group. `world_size` and `rank` must be the real ones: every process
        passes the same world size, and each its own rank. `timeout` (a timedelta or
        seconds) bounds every collective's wait: make it longer than the slowest
        straggler, or the fast ranks fail waiting for it."""
        if self._initialized:
            raise InvalidRequest(
                "init_process_group called twice on this rank: destroy_process_group first"
            )
        if backend != BACKEND_NAME:
            raise InvalidRequest(
                f"init_process_group: backend {backend!r} is not available; "
                f"use {BACKEND_NAME!r} (the rack's socket links, as 'nccl' on GPUs)"
            )
        if world_size < 1:
            # Its upper bound is the group's real size, checked below (the orchestrator
            # holds a job to the platform's sockets, one rank each).
            raise InvalidRequest(f"init_process_group: world_size={world_size}: at least 1")
        if not 0 <= rank < world_size:
            raise InvalidRequest(
                f"init_process_group: rank={rank} is outside 0..{world_size - 1} "
                f"for world_size={world_size}"
            )
        real_size, real_rank = self._transport.world_size, self._transport.rank
        if world_size != real_size:
            raise InvalidRequest(
                f"init_process_group: world_size={world_size} but the process group has "
                f"{real_size} ranks (0..{real_size - 1}): every process must pass the "
                "group's real size, or collectives wait for ranks that do not exist"
            )
        if rank != real_rank:
            raise InvalidRequest(
                f"init_process_group: rank={rank} but this process holds rank {real_rank} "
                f"of {real_size}: each process must pass its own rank (ranks are unique "
                f"0..{real_size - 1}), or two processes claim one rank and one is never heard"
            )
        timeout_s = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
        if not timeout_s > 0:
            raise InvalidRequest(f"init_process_group: timeout must be positive, got {timeout_s} s")
        self._transport.set_timeout(timeout_s)
        self._timeout_s = timeout_s
        self._initialized = True

    def destroy_process_group(self) -> None:
        """Leave the group; collectives fail until the next init_process_group."""
        self._require("destroy_process_group")
        self._initialized = False

    def is_initialized(self) -> bool:
        return self._initialized

    # ------------------------------------------------------------ queries

    def get_rank(self) -> int:
        self._require("get_rank")
        return self._transport.rank

    def get_world_size(self) -> int:
        self._require("get_world_size")
        return self._transport.world_size

    def get_backend(self) -> str:
        self._require("get_backend")
        return BACKEND_NAME

    @property
    def timeout_s(self) -> float:
        """Wall seconds a collective waits for the other ranks."""
        return self._timeout_s

    # ------------------------------------------------------------ collectives

    def broadcast(self, tensor: Array, src: int) -> None:
        """Copy rank `src`'s `tensor` into every rank's, in place."""
        self._require("broadcast")
        self._transport.broadcast(tensor, src)

    def all_reduce(self, tensor: Array, op: ReduceOp = ReduceOp.SUM) -> None:
        """Reduce `tensor` over ranks in place (SUM, or AVG: the sum / world size)."""
        self._require("all_reduce")
        name: ReduceOpName = "mean" if ReduceOp(op) is ReduceOp.AVG else "sum"
        self._transport.all_reduce(tensor, name)

    def all_gather(self, tensor_list: list[Array], tensor: Array) -> None:
        """torch's signature: fill `tensor_list` (one array per rank) with every rank's
        `tensor`."""
        self._require("all_gather")
        if len(tensor_list) != self._transport.world_size:
            raise InvalidRequest(
                f"all_gather: tensor_list has {len(tensor_list)} entries for a world of "
                f"{self._transport.world_size}"
            )
        for out, got in zip(tensor_list, self._transport.all_gather(tensor), strict=True):
            out[...] = got

    def barrier(self) -> None:
        self._require("barrier")
        self._transport.barrier()

    def _require(self, what: str) -> None:
        if not self._initialized:
            raise NotInitialized(
                f"{what}: the process group is not initialized; call "
                "init_process_group(backend='rdulink', world_size=..., rank=...) first"
            )
