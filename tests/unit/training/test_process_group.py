"""The "rdu" torch.distributed backend over real sockets' links, one rank per thread
(node_agent/training/process_group.py): each collective's result, its emulated time on
the socket's clock, and the errors a script gets instead of a hang."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import pytest
import torch
import torch.distributed as dist

from rdurack.errors import LinkFailure
from rdurack.node_agent.collective_engine import CollectiveMismatch
from rdurack.node_agent.socket import Socket
from rdurack.node_agent.training.process_group import RankLinks, RduProcessGroup
from rdurack.node_agent.training.script_kernels import Unfused
from rdurack.node_agent.training.script_time import StepRecord, Streams
from rdurack.rack.presets import platform
from rdurack.rack.timing import Timer

T = TypeVar("T")
RACK = platform("sn40l-rack16")
GROUP = ["rdu-n0-s0", "rdu-n0-s1", "rdu-n0-s2", "rdu-n1-s0"]  # one crosses the nodes
JOB = "job-pg"


@pytest.fixture(scope="module")
def sockets() -> Iterator[list[Socket]]:
    made = [Socket(sid, RACK, timeout_s=10.0) for sid in GROUP]
    peers = {s.name: s.address() for s in made}
    try:
        for s in made:
            s.connect(peers)
            s.reserve(JOB)
        yield made
    finally:
        for s in made:
            s.close()


def groups(sockets: list[Socket], wall_timeout_s: float = 10.0) -> list[RduProcessGroup]:
    """A fresh default group on every socket (its own name: tags never meet old ones)."""
    name = f"g{next(_names)}"
    return [
        RduProcessGroup(
            RankLinks(
                s.engine, Streams(s.clock, Unfused(Timer(RACK, [s.id]))), JOB, GROUP, wall_timeout_s
            ),
            range(len(GROUP)),
            r,
            name,
            1800.0,
        )
        for r, s in enumerate(sockets)
    ]


_names = iter(range(1_000_000))


def each(pgs: list[RduProcessGroup], body: Callable[[RduProcessGroup], T]) -> list[T]:
    with ThreadPoolExecutor(len(pgs)) as pool:
        futures = [pool.submit(body, pg) for pg in pgs]
        return [f.result(timeout=60) for f in futures]


def opts(op: dist.ReduceOp.RedOpType) -> dist.AllreduceOptions:
    o = dist.AllreduceOptions()
    o.reduceOp = dist.ReduceOp(op)
    return o


def test_all_reduce_sums_averages_and_takes_the_max(sockets: list[Socket]) -> None:
    def body(pg: RduProcessGroup) -> list[torch.Tensor]:
        r = pg.rank()
        out = []
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.MAX, dist.ReduceOp.MIN):
            t = torch.tensor([r + 1.0, 10.0 * r, -r], dtype=torch.float32)
            assert pg.allreduce([t], opts(op)).wait()
            out.append(t)
        half = torch.full((5,), r + 1.0, dtype=torch.bfloat16)  # numpy has no bfloat16
        pg.allreduce([half], opts(dist.ReduceOp.SUM))
        out.append(half)
        return out

    for s, m, mx, mn, half in each(groups(sockets), body):
        assert s.tolist() == [10.0, 60.0, -6.0]
        assert m.tolist() == [2.5, 15.0, -1.5]
        assert mx.tolist() == [4.0, 30.0, 0.0]
        assert mn.tolist() == [1.0, 0.0, -3.0]
        assert half.dtype == torch.bfloat16 and half.tolist() == [10.0] * 5


def test_broadcast_gather_scatter_and_all_to_all(sockets: list[Socket]) -> None:
    n = len(GROUP)

    def body(pg: RduProcessGroup) -> tuple[torch.Tensor, ...]:
        r = pg.rank()
        b = torch.arange(3.0) + 100 * r
        bo = dist.BroadcastOptions()
        bo.rootRank = 2
        pg.broadcast([b], bo)
        gathered = [torch.zeros(2, dtype=torch.int64) for _ in range(n)]
        pg.allgather([gathered], [torch.tensor([r, -r])])
        flat = torch.zeros(2 * n, dtype=torch.int64)
        pg._allgather_base(flat, torch.tensor([r, -r]))
        part = torch.zeros(2)
        pg.reduce_scatter([part], [[torch.full((2,), float(r * 10 + j)) for j in range(n)]])
        outs = [torch.zeros(1) for _ in range(n)]
        pg.alltoall(outs, [torch.tensor([float(10 * r + j)]) for j in range(n)])
        pg.barrier()
        return b, torch.stack(gathered), flat, part, torch.cat(outs)

    for r, (b, gathered, flat, part, a2a) in enumerate(each(groups(sockets), body)):
        assert b.tolist() == [200.0, 201.0, 202.0]
        assert gathered.tolist() == [[i, -i] for i in range(n)]
        assert flat.tolist() == [x for i in range(n) for x in (i, -i)]
        # sum over ranks s of (10 s + r) = 10 * 6 + 4 r
        assert part.tolist() == [60.0 + 4 * r] * 2
        assert a2a.tolist() == [10.0 * s + r for s in range(n)]  # rank s's part r


def test_a_collective_takes_emulated_time_and_counts_bytes(sockets: list[Socket]) -> None:
    pgs = groups(sockets)
    before = [s.clock.now_ns for s in sockets]
    each(pgs, lambda pg: pg.allreduce([torch.ones(1 << 16)]))
    stats = pgs[0].links.stats
    assert stats.calls["all_reduce"] == 1 and stats.nbytes["all_reduce"] == 4 << 16
    assert stats.ns["all_reduce"] > 0
    assert all(s.clock.now_ns > t for s, t in zip(sockets, before, strict=True))


def test_an_all_reduce_in_backward_runs_on_the_comm_stream_in_its_steps_window(
    sockets: list[Socket],
) -> None:
    """What a rank's step span shows (runner.py): its gradients' all-reduce, issued in
    backward as DDP issues its buckets, with its bytes and the links it sent on."""
    pgs = groups(sockets)

    def step(pg: RduProcessGroup) -> StepRecord | None:
        w = torch.ones(256, requires_grad=True)
        w.register_hook(lambda g: pg.allreduce([g], opts(dist.ReduceOp.SUM)).wait() and None)  # type: ignore[no-untyped-call]
        (2 * w).sum().backward()  # type: ignore[no-untyped-call]
        streams = pg.links.streams
        streams.step_began()
        streams.step_ended()
        (record,) = streams.records
        return record

    for r, record in enumerate(each(pgs, step)):
        assert record is not None and record.step == 1
        window = record.gradients
        assert window is not None and (window.nbytes, window.buckets) == (256 * 4, 1)
        assert window.bytes_sent > 0 and window.bytes_received > 0
        assert f"{GROUP[r]}->{GROUP[(r + 1) % len(GROUP)]}" in window.links  # its ring
        assert record.began_ns <= window.start_ns < window.end_ns <= record.end_ns
    assert pgs[0].links.stats.calls["all_reduce"] == 1


def test_ranks_issuing_different_collectives_fail_at_once_naming_both(
    sockets: list[Socket],
) -> None:
    def body(pg: RduProcessGroup) -> BaseException | None:
        t = torch.ones(4)
        try:
            if pg.rank() == 1:
                bo = dist.BroadcastOptions()
                bo.rootRank = 0
                pg.broadcast([t], bo)
            else:
                pg.allreduce([t])
        except LinkFailure as e:  # the others wait for rank 1 (on the cluster the job's
            return e  # failure aborts their waits) until the group's timeout
        return None

    errors = each(groups(sockets, wall_timeout_s=2.0), body)
    found = [e for e in errors if isinstance(e, CollectiveMismatch)]
    assert found, f"no rank saw the mismatch: {errors}"
    message = str(found[0])
    assert "all_reduce" in message and "broadcast" in message and "same order" in message
    for s in sockets:  # what the failed collectives left must not meet the next job
        s.engine._endpoint.mailbox.reset()


def test_a_groups_name_is_the_same_on_every_rank_whatever_each_process_ran_before(
    sockets: list[Socket],
) -> None:
    """torch numbers groups per process; ranks whose processes ran other jobs before
    must still name (and tag) the job's groups alike, or their collectives never meet."""
    from datetime import timedelta

    import torch.distributed as dist
    from torch._C._distributed_c10d import _DistributedBackendOptions

    from rdurack.node_agent.training.process_group import register

    def group(process_groups_before: int, ranks: list[int]) -> str:
        s = sockets[0]
        register(RankLinks(s.engine, Streams(s.clock, Unfused(Timer(RACK, [s.id]))), JOB, GROUP))
        create = dist.Backend._plugins["RDU"].creator_fn
        made = ""
        for n in range(2):  # the job's first and second group of these ranks
            opts = _DistributedBackendOptions()
            opts.group_rank, opts.group_size = 0, len(ranks)
            opts.timeout = timedelta(seconds=60)
            opts.group_id = str(process_groups_before + n)  # torch's per-process count
            opts.global_ranks_in_group = ranks
            made += create(opts, None).group_name_ + ";"
        return made

    assert group(0, [0, 1]) == group(7, [0, 1]) == "0,1#1;0,1#2;"
