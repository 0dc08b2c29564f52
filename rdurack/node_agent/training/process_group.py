"""torch.distributed's "rdu" backend: a `ProcessGroup` whose collectives carry tensors'
bytes over the socket's gRPC links (node_agent/collective_engine.py) and advance the
socket's emulated clock as the link model says.

A rank's script calls `dist.init_process_group(backend="rdu")`; torch then calls the
factory `register(links)` registered for this job, once for the default group and once
for each `new_group`, with the group's global ranks. Each collective runs at once, in
the call, on the rank's thread: a failure (a peer that never arrives within the job's
`wall_timeout_s`, a link down, a peer that issued another collective in that place) raises
from the call. That is where torch's C++ sees it: a DDP backward that all-reduces
raises from `loss.backward()`. (A torch Future completed with an exception crashes
DDP's reducer, and one that fails only in `Work.wait()` never reaches backward: the
feasibility study behind issue 20.) The returned Work is complete; its `wait()` returns
at once, so `async_op=True` overlaps nothing in wall time: the emulated clock is what
says what overlaps.

Tensors travel as numpy views of their memory (CPU tensors share it), reduced in place.
bfloat16, which numpy lacks, travels as float32 (twice the bytes on the emulated links:
said in docs/training.md). Ops the engine has no schedule for are composed from those it
has, with their cost: reduce_scatter is an all-reduce of which each rank keeps its
part (twice a ring reduce-scatter's traffic), all_to_all is n-1 rounds of pairwise sends.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Work

from rdurack.errors import InvalidRequest
from rdurack.node_agent.collective_engine import CollectiveEngine
from rdurack.node_agent.training.script_checks import Checks
from rdurack.node_agent.training.script_time import Streams, in_backward
from rdurack.rack.topology import SocketId
from rdurack.workloads.training.group import Done

NAME = "rdu"  # init_process_group(backend="rdu"): the rack's links; torch's "nccl" here

_REDUCE_OPS = {
    dist.ReduceOp.SUM: "sum",
    dist.ReduceOp.AVG: "mean",
    dist.ReduceOp.MAX: "max",
    dist.ReduceOp.MIN: "min",
    dist.ReduceOp.PRODUCT: "product",
}


@dataclass
class CollectiveStats:
    """What a rank's collectives took: emulated ns and bytes, by operation."""

    ns: dict[str, int] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)
    nbytes: dict[str, int] = field(default_factory=dict)

    def add(self, op: str, ns: int, nbytes: int) -> None:
        self.ns[op] = self.ns.get(op, 0) + ns
        self.calls[op] = self.calls.get(op, 0) + 1
        self.nbytes[op] = self.nbytes.get(op, 0) + nbytes


@dataclass
class RankLinks:
    """What a rank's process groups run on: its socket's collective engine and streams
    (script_time.py), the job's sockets by global rank, and where the groups' counts
    go."""

    engine: CollectiveEngine
    streams: Streams
    job_id: str
    sockets: list[str]  # socket ids, by global rank
    # Wall seconds a collective waits for a peer (one that never comes: dead or hung).
    wall_timeout_s: float = 60.0
    checks: Checks | None = None  # the article's mistakes, looked for
    stats: CollectiveStats = field(default_factory=CollectiveStats)


def _uncounted(method: Callable[..., Work]) -> Callable[..., Work]:
    """A group's method: the tensor copies it makes are not the script's compute."""

    @functools.wraps(method)
    def run(self: RduProcessGroup, *args: Any, **kwargs: Any) -> Work:
        with self.links.streams.paused():
            return method(self, *args, **kwargs)

    return run


class RduProcessGroup(dist.ProcessGroup):
    """One rank's end of a group of the job's ranks over the links.

    The methods are what torch.distributed's functions call on a group; torch's stubs
    overload some with other forms (hence the ignores), which never reach Python."""

    def __init__(
        self, links: RankLinks, ranks: Sequence[int], rank: int, name: str, timeout_s: float
    ):
        """`ranks`: the group's global ranks in group-rank order; `rank`: this one's
        group rank; `timeout_s`: the group's timeout, emulated seconds: how late a rank
        may reach a step's gradient all-reduce (script_checks.py). On the hardware it is
        the wall time NCCL waits; here the wall wait for a dead peer is the job's
        `wall_timeout_s`, as emulated and wall seconds are not the same."""
        super().__init__(rank, len(ranks))  # type: ignore[call-arg]  # stubs: (store, ...)
        self.links = links
        self.members = [SocketId.parse(links.sockets[r]) for r in ranks]
        self.group_name_ = name
        self.timeout_s = timeout_s
        self._seq = 0  # collectives so far, the same count on every member

    def getBackendName(self) -> str:  # noqa: N802 (torch's name)
        return NAME

    @property
    def name_(self) -> str:
        return NAME

    # ------------------------------------------------------------ the links

    def _run(
        self,
        op: str,
        array: np.ndarray | None,
        *,
        what: str,
        root: int | None = None,
        reduce_op: str = "sum",
        members: list[SocketId] | None = None,
        place: str = "",
    ) -> np.ndarray | None:
        """One engine collective on the socket's clock; `what` (op, shapes, dtype) must
        be the same on every member at this place in the group's sequence (`place`:
        default the next one)."""
        if not place:
            self._seq += 1
            place = str(self._seq)
        links = self.links
        members = members or self.members
        sequence = f"{links.job_id}/pg/{self.group_name_}/{place}:"
        src = None if root is None else str(members[root])
        plan = links.engine.plan(op, members, array, root=src, reduce_op=reduce_op)
        with links.streams.collective(op) as clock:
            start = clock.now_ns
            out = links.engine.run(
                sequence + what, plan, clock, links.wall_timeout_s, array, sequence
            )
            links.stats.add(op, clock.now_ns - start, plan.nbytes)
            if clock is not links.streams.clock:  # a gradient all-reduce, in backward
                links.streams.gradients(start, clock.now_ns, plan.nbytes, out.traffic)
        return out.buffer

    def _reduce_op(self, opts: Any) -> str:
        op = _REDUCE_OPS.get(opts.reduceOp.op if hasattr(opts.reduceOp, "op") else opts.reduceOp)
        if op is None:
            raise InvalidRequest(
                f"the rdu backend does not reduce with {opts.reduceOp}: use SUM, AVG, MAX, "
                "MIN or PRODUCT"
            )
        return op

    def _all_reduce(self, t: torch.Tensor, reduce_op: str) -> None:
        if self.size() == 1:
            return
        with _numpy(t) as a:
            checks = self.links.checks
            if checks is not None and in_backward():  # a DDP gradient bucket
                checks.gradient_bucket(a, self.links.streams.clock, self.timeout_s)
            self._run("all_reduce", a, what=f"all_reduce.{reduce_op}{_sig(a)}", reduce_op=reduce_op)

    def _gather(self, t: torch.Tensor) -> np.ndarray:
        """Every member's `t`, stacked by group rank."""
        with _numpy(t, write=False) as a:
            if self.size() == 1:
                return a.reshape(1, *a.shape).copy()
            out = self._run("all_gather", np.ascontiguousarray(a), what=f"all_gather{_sig(a)}")
        assert out is not None
        return out.reshape(self.size(), *a.shape)

    # ------------------------------------------------------------ torch's API

    @_uncounted
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Work:
        op = self._reduce_op(opts) if opts is not None else "sum"
        for t in tensors:
            self._all_reduce(t, op)
        return Done(tensors)

    @_uncounted
    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> Work:
        return self.allreduce(tensors, opts)

    @_uncounted
    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> Work:
        for t in tensors:
            if self.size() > 1:
                with _numpy(t) as a:
                    self._run("broadcast", a, what=f"broadcast{_sig(a)}", root=opts.rootRank)
        return Done(tensors)

    @_uncounted
    def allgather(
        self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None
    ) -> Work:
        for out, t in zip(outputs, inputs, strict=True):
            _check_count(out, self.size(), "all_gather's output list")
            parts = self._gather(t)
            for o, part in zip(out, parts, strict=True):
                o.copy_(_tensor(part, t))
        return Done([o for out in outputs for o in out])

    @_uncounted
    def _allgather_base(self, output: torch.Tensor, t: torch.Tensor, opts: Any = None) -> Work:
        if output.numel() != t.numel() * self.size():
            raise InvalidRequest(
                f"all_gather_into_tensor: the output holds {output.numel()} elements, not "
                f"{self.size()} x {t.numel()}"
            )
        output.copy_(_tensor(self._gather(t), t).reshape(output.shape))
        return Done([output])

    @_uncounted
    def reduce_scatter(
        self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any = None
    ) -> Work:
        op = self._reduce_op(opts) if opts is not None else "sum"
        for out, parts in zip(outputs, inputs, strict=True):
            _check_count(parts, self.size(), "reduce_scatter's input list")
            whole = torch.stack([p.reshape(out.shape) for p in parts])
            self._all_reduce(whole, op)
            out.copy_(whole[self.rank()])
        return Done(outputs)

    @_uncounted
    def _reduce_scatter_base(self, output: torch.Tensor, t: torch.Tensor, opts: Any = None) -> Work:
        if t.numel() != output.numel() * self.size():
            raise InvalidRequest(
                f"reduce_scatter_tensor: the input holds {t.numel()} elements, not "
                f"{self.size()} x {output.numel()}"
            )
        whole = t.detach().clone().reshape(self.size(), -1)
        self._all_reduce(whole, self._reduce_op(opts) if opts is not None else "sum")
        output.copy_(whole[self.rank()].reshape(output.shape))
        return Done([output])

    @_uncounted
    def barrier(self, opts: Any = None) -> Work:
        if self.size() > 1:
            self._run("barrier", None, what="barrier")
        return Done([])

    @_uncounted
    def alltoall(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> Work:
        _check_count(outputs, self.size(), "all_to_all's output list")
        _check_count(inputs, self.size(), "all_to_all's input list")
        me, n = self.rank(), self.size()
        outputs[me].copy_(inputs[me])
        self._seq += 1  # one place in the sequence; each pair's send a place within it
        # Round k: send to rank me+k, take from rank me-k (no two wait on each other).
        for k in range(1, n):
            to, frm = (me + k) % n, (me - k) % n
            for src, dst, t in ((me, to, inputs[to]), (frm, me, outputs[frm])):
                pair = [self.members[src], self.members[dst]]
                with _numpy(t, write=dst == me) as a:
                    self._run("send", np.ascontiguousarray(a) if src == me else a,
                              what=f"all_to_all{_sig(a)}", root=0, members=pair,
                              place=f"{self._seq}.{src}>{dst}")  # fmt: skip
        return Done(outputs)

    @_uncounted
    def alltoall_base(
        self,
        output: torch.Tensor,
        t: torch.Tensor,
        output_splits: list[int],
        input_splits: list[int],
        opts: Any = None,
    ) -> Work:
        n = self.size()
        outs = list(torch.split(output, output_splits or [output.shape[0] // n] * n))
        ins = list(torch.split(t, input_splits or [t.shape[0] // n] * n))
        results = [o.clone() for o in outs]
        self.alltoall(results, [i.contiguous() for i in ins])
        for o, r in zip(outs, results, strict=True):
            o.copy_(r)
        return Done([output])


def register(links: RankLinks) -> None:
    """Make `init_process_group(backend="rdu")` and `new_group` in this process build
    groups over `links` (the rank this process runs now; a later job re-registers)."""

    made: dict[str, int] = {}  # this job's groups so far, by their ranks

    def create(opts: Any, _backend_opts: Any) -> RduProcessGroup:
        if not opts.global_ranks_in_group and links.checks is not None:  # the default group
            links.checks.group_made(opts.group_size, opts.group_rank)
        ranks = list(opts.global_ranks_in_group) or list(range(opts.group_size))
        if len(ranks) != opts.group_size or max(ranks) >= len(links.sockets):
            raise InvalidRequest(
                f"a process group of {opts.group_size} ranks on a job of "
                f"{len(links.sockets)} sockets"
            )
        # Named by its ranks and how many groups of them this job made: the same on every
        # member (all call new_group in the same order). torch's own group name counts
        # the groups of the process, whose earlier jobs differ between sockets.
        key = ",".join(map(str, ranks))
        made[key] = made.get(key, 0) + 1
        name = f"{key}#{made[key]}"
        return RduProcessGroup(links, ranks, opts.group_rank, name, opts.timeout.total_seconds())

    dist.Backend.register_backend(NAME, create, extended_api=True, devices=["cpu"])


# ------------------------------------------------------------------ tensors and arrays


class _numpy:  # noqa: N801 (a context manager used like a function)
    """`t` as a contiguous numpy array sharing its memory where it can; on exit, what
    the array holds is written back to `t` when it could not be shared (`write`)."""

    def __init__(self, t: torch.Tensor, write: bool = True) -> None:
        self.t, self.write = t, write
        self.shared = _shared(t)
        src = t.detach()
        self.array = src.numpy() if self.shared else src.to(torch.float32).contiguous().numpy()

    def __enter__(self) -> np.ndarray:
        return self.array

    def __exit__(self, *exc: object) -> None:
        if self.write and not self.shared and exc[0] is None:
            self.t.detach().copy_(torch.from_numpy(self.array))


def _shared(t: torch.Tensor) -> bool:
    """Whether numpy can work on `t`'s own memory."""
    return t.device.type == "cpu" and t.is_contiguous() and t.dtype != torch.bfloat16


def _tensor(a: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a)).to(like.dtype)


def _sig(a: np.ndarray) -> str:
    """An array's shape and dtype, as a collective's tag shows them."""
    return f"[{'x'.join(map(str, a.shape))}]{a.dtype}"


def _check_count(items: Sequence[object], n: int, what: str) -> None:
    if len(items) != n:
        raise InvalidRequest(f"{what} has {len(items)} tensors for a group of {n}")
