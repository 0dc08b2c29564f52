"""The collective backend protocol, and `ThreadGroup`: one in-process group of threads.

`Backend` is all that the training core needs from a transport: in-place all-reduce and
broadcast, all-gather, barrier. On the cluster it is implemented over the sockets' gRPC
links (one rank per socket actor); here `ThreadGroup` implements it for tests, one rank
per thread, with the same failure behaviour a real group must have:

- every collective has a deadline: a rank that never arrives makes the others fail
  after `timeout_s` wall seconds with an error naming the collective and the missing
  ranks (never a hang), as NCCL's watchdog does;
- a timed-out group is aborted, as NCCL aborts its communicator: every later
  collective on any rank fails at once instead of waiting for a partner that left;
- ranks that call different collectives at the same position in their sequence (rank 0
  all-reduces while rank 1 broadcasts) get a clear error instead of corrupt data.

Results are bitwise identical on every rank (one rank reduces, in rank order, and all
copy the result), which is what keeps DDP replicas identical step after step.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar

import numpy as np

from rdurack.errors import InvalidRequest, LinkFailure, RdurackError
from rdurack.workloads.training.data import Array

ReduceOpName = Literal["sum", "mean"]
T = TypeVar("T")


class Backend(Protocol):
    """One rank's end of a process group. Every rank must call the same collectives in
    the same order; each call blocks until all ranks have made it (or times out)."""

    @property
    def rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    def set_timeout(self, timeout_s: float) -> None:
        """Wall seconds this rank waits at a collective for the others."""

    def all_reduce(self, array: Array, op: ReduceOpName = "sum") -> None:
        """Replace `array` in place with the element-wise sum (or mean) over ranks."""

    def broadcast(self, array: Array, src: int) -> None:
        """Replace `array` in place with rank `src`'s."""

    def all_gather(self, array: Array) -> list[Array]:
        """Every rank's `array` (same shape and dtype on all), indexed by rank."""

    def barrier(self) -> None:
        """Return once every rank has arrived."""


class CollectiveTimeout(LinkFailure):
    """Ranks that never arrived at a collective within the timeout."""

    def __init__(
        self,
        collective: str,
        seq: int,
        rank: int,
        missing: list[int],
        world_size: int,
        timeout_s: float,
    ) -> None:
        self.collective, self.seq, self.rank = collective, seq, rank
        self.missing, self.world_size, self.timeout_s = list(missing), world_size, timeout_s
        who = (
            f"rank {missing[0]} never arrived"
            if len(missing) == 1
            else f"ranks {', '.join(map(str, missing))} never arrived"
        )
        super().__init__(
            f"{collective} #{seq} timed out after {timeout_s:g} s on rank {rank}: {who} "
            f"({world_size - len(missing)} of {world_size} ranks did). A rank skipped "
            "this collective, died, or is a straggler slower than the timeout; if ranks "
            "are only slow, pass a larger timeout to init_process_group"
        )

    def __reduce__(self) -> tuple[type, tuple[str, int, int, list[int], int, float]]:
        # Errors cross process boundaries (Ray actors): rebuild from the fields.
        return (
            type(self),
            (self.collective, self.seq, self.rank, self.missing, self.world_size, self.timeout_s),
        )


class GroupAborted(LinkFailure):
    """The group was aborted (a timeout or a failed rank); no collective can complete."""


class CollectiveMismatch(RdurackError):
    """Ranks called different collectives (or shapes) at the same point of their sequence."""


@dataclass(slots=True)
class _Arrival:
    """What one rank brought to a collective."""

    collective: str  # "all_reduce", "broadcast", "all_gather", "barrier"
    signature: str  # what must agree across ranks, e.g. "float32[10, 64] op=mean"
    data: Array | None  # a private copy of the rank's array; None when it sends nothing


@dataclass(slots=True)
class _Slot:
    """The rendezvous of one collective (by sequence number) until every rank left it."""

    arrivals: dict[int, _Arrival] = field(default_factory=dict)
    done: bool = False
    result: Any = None
    error: str | None = None  # a mismatch: every rank raises CollectiveMismatch with it
    left: int = 0  # ranks that took the result; the last one removes the slot


def _describe(array: Array) -> str:
    return f"{array.dtype}[{', '.join(map(str, array.shape))}]"


class ThreadGroup:
    """An in-process process group of `world_size` ranks, one per thread.

    `backend(rank)` gives rank `rank`'s `Backend`; `run(fn)` runs `fn(backend)` on one
    thread per rank and returns the results by rank. Collectives match by position in
    each rank's own sequence of calls, as NCCL's do.
    """

    def __init__(self, world_size: int, timeout_s: float = 30.0) -> None:
        if world_size < 1:
            raise InvalidRequest(f"world_size must be at least 1, got {world_size}")
        if not timeout_s > 0:
            raise InvalidRequest(f"timeout_s must be positive, got {timeout_s}")
        self.world_size = world_size
        self.timeout_s = timeout_s  # default wall seconds per collective, per rank
        self._cond = threading.Condition()
        self._slots: dict[int, _Slot] = {}
        self._aborted: str | None = None  # why, once aborted
        self._backends = [_ThreadBackend(self, r, timeout_s) for r in range(world_size)]

    def backend(self, rank: int) -> Backend:
        """Rank `rank`'s end of the group (the same object on every call)."""
        if not 0 <= rank < self.world_size:
            raise InvalidRequest(
                f"rank {rank} is not in a group of {self.world_size} "
                f"(ranks 0..{self.world_size - 1})"
            )
        return self._backends[rank]

    @property
    def aborted(self) -> str | None:
        """Why the group was aborted, or None while it is healthy."""
        with self._cond:
            return self._aborted

    def abort(self, reason: str) -> None:
        """Fail every pending and future collective with `reason` (first reason wins)."""
        with self._cond:
            if self._aborted is None:
                self._aborted = reason
            self._cond.notify_all()

    def run(self, fn: Callable[[Backend], T]) -> list[T]:
        """Run `fn(backend)` on one thread per rank; results by rank.

        A rank that raises aborts the group, so the others fail fast instead of waiting
        out the timeout; the lowest-ranked *root cause* is re-raised (a timeout or a
        bad argument rather than the GroupAborted it caused), with the others as notes.
        """
        results: list[Any] = [None] * self.world_size
        errors: dict[int, BaseException] = {}

        def body(rank: int) -> None:
            try:
                results[rank] = fn(self._backends[rank])
            except BaseException as e:
                errors[rank] = e
                self.abort(f"rank {rank} failed: {e}")

        threads = [
            threading.Thread(target=body, args=(r,), name=f"rank{r}", daemon=True)
            for r in range(self.world_size)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            causes = [r for r in sorted(errors) if not isinstance(errors[r], GroupAborted)]
            first = causes[0] if causes else min(errors)
            err = errors[first]
            for r in sorted(errors):
                if r != first:
                    err.add_note(f"rank {r}: {type(errors[r]).__name__}: {errors[r]}")
            raise err
        return results

    # ------------------------------------------------------------ the rendezvous

    def _rendezvous(self, rank: int, seq: int, arrival: _Arrival, timeout_s: float) -> Any:
        """Wait until every rank brought collective `seq`; the shared result."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            if self._aborted is not None:
                raise GroupAborted(f"{arrival.collective} #{seq} on rank {rank}: {self._aborted}")
            slot = self._slots.setdefault(seq, _Slot())
            slot.arrivals[rank] = arrival
            if len(slot.arrivals) == self.world_size:
                self._complete(seq, slot)
                self._cond.notify_all()
            while not slot.done:
                if self._aborted is not None:
                    raise GroupAborted(
                        f"{arrival.collective} #{seq} on rank {rank}: {self._aborted}"
                    )
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    missing = sorted(set(range(self.world_size)) - set(slot.arrivals))
                    err = CollectiveTimeout(
                        arrival.collective, seq, rank, missing, self.world_size, timeout_s
                    )
                    # A timed-out communicator is unusable (NCCL aborts it): the late rank
                    # must not wait for partners that have given up.
                    if self._aborted is None:
                        self._aborted = str(err)
                    self._cond.notify_all()
                    raise err
                self._cond.wait(remaining)
            slot.left += 1
            if slot.left == self.world_size:
                del self._slots[seq]
            if slot.error is not None:
                raise CollectiveMismatch(slot.error)
            return slot.result

    def _complete(self, seq: int, slot: _Slot) -> None:
        """Compute a collective's result once, under the lock, in rank order."""
        slot.done = True
        arrivals = [slot.arrivals[r] for r in range(self.world_size)]
        kinds = {(a.collective, a.signature) for a in arrivals}
        if len(kinds) > 1:
            calls = "; ".join(
                f"rank {r} called {a.collective}({a.signature})" for r, a in enumerate(arrivals)
            )
            slot.error = (
                f"collective #{seq} does not match across ranks: {calls}. Every rank must "
                "call the same collectives, with the same shapes, in the same order"
            )
            return
        kind = arrivals[0].collective
        if kind == "all_reduce":
            total = np.array(arrivals[0].data, copy=True)
            for a in arrivals[1:]:
                total += a.data  # rank order: the same bits on every rank
            if arrivals[0].signature.endswith("op=mean"):
                total /= self.world_size  # in place: keeps the dtype (a Python int divisor)
            slot.result = total
        elif kind == "broadcast":
            slot.result = next(a.data for a in arrivals if a.data is not None)
        elif kind == "all_gather":
            slot.result = [a.data for a in arrivals]
        else:  # barrier
            slot.result = None


class _ThreadBackend:
    """Rank `rank`'s `Backend` in a `ThreadGroup`: counts its own collectives."""

    def __init__(self, group: ThreadGroup, rank: int, timeout_s: float) -> None:
        self._group = group
        self._rank = rank
        self._timeout_s = timeout_s
        self._seq = 0  # position in this rank's sequence of collectives

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._group.world_size

    def set_timeout(self, timeout_s: float) -> None:
        if not timeout_s > 0:
            raise InvalidRequest(f"timeout must be positive, got {timeout_s} s")
        self._timeout_s = timeout_s

    def _call(self, collective: str, signature: str, data: Array | None) -> Any:
        seq = self._seq
        self._seq += 1
        arrival = _Arrival(collective, signature, data)
        return self._group._rendezvous(self._rank, seq, arrival, self._timeout_s)

    def all_reduce(self, array: Array, op: ReduceOpName = "sum") -> None:
        if op not in ("sum", "mean"):
            raise InvalidRequest(f"all_reduce op must be 'sum' or 'mean', got {op!r}")
        if op == "mean" and not np.issubdtype(array.dtype, np.floating):
            raise InvalidRequest(f"all_reduce mean needs a floating array, got {array.dtype}")
        result = self._call("all_reduce", f"{_describe(array)} op={op}", array.copy())
        np.copyto(array, result)

    def broadcast(self, array: Array, src: int) -> None:
        if not 0 <= src < self.world_size:
            raise InvalidRequest(
                f"broadcast src {src} is not a rank of a group of {self.world_size}"
            )
        data = array.copy() if src == self._rank else None
        result = self._call("broadcast", f"{_describe(array)} src={src}", data)
        if src != self._rank:
            np.copyto(array, result)

    def all_gather(self, array: Array) -> list[Array]:
        result = self._call("all_gather", _describe(array), array.copy())
        return [np.array(a, copy=True) for a in result]  # private copies per rank

    def barrier(self) -> None:
        self._call("barrier", "", None)
