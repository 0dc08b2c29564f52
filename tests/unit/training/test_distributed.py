"""torch.distributed's API with explicit state, and the process-group mistakes."""

from __future__ import annotations

import time
from datetime import timedelta

import numpy as np
import pytest

from rdurack.errors import InvalidRequest, LinkFailure
from rdurack.workloads.training.backend import Backend, ThreadGroup
from rdurack.workloads.training.distributed import Distributed, NotInitialized, ReduceOp


def test_init_and_collectives() -> None:
    def body(b: Backend) -> tuple[int, int, np.ndarray, list[np.ndarray]]:
        dist = Distributed(b)
        assert not dist.is_initialized()
        dist.init_process_group("rdulink", world_size=2, rank=b.rank, timeout=timedelta(seconds=5))
        t = np.array([b.rank + 1.0, 4.0], dtype=np.float32)
        dist.all_reduce(t, op=ReduceOp.AVG)
        out = [np.zeros(1) for _ in range(2)]
        dist.all_gather(out, np.array([float(b.rank)]))
        dist.barrier()
        rank, world = dist.get_rank(), dist.get_world_size()
        dist.destroy_process_group()
        assert not dist.is_initialized()
        return rank, world, t, out

    for r, (rank, world, t, out) in enumerate(ThreadGroup(2).run(body)):
        assert (rank, world) == (r, 2)
        assert t.tolist() == [1.5, 4.0]
        assert [float(o[0]) for o in out] == [0.0, 1.0]


def test_wrong_world_size_names_the_numbers() -> None:
    dist = Distributed(ThreadGroup(2).backend(0))
    with pytest.raises(InvalidRequest, match=r"world_size=4 but the process group has 2 ranks"):
        dist.init_process_group("rdulink", world_size=4, rank=0)
    assert not dist.is_initialized()


def test_wrong_rank_names_the_numbers() -> None:
    dist = Distributed(ThreadGroup(4).backend(1))
    with pytest.raises(InvalidRequest, match=r"rank=0 but this process holds rank 1 of 4"):
        dist.init_process_group("rdulink", world_size=4, rank=0)
    with pytest.raises(InvalidRequest, match=r"rank=4 is outside 0..3"):
        dist.init_process_group("rdulink", world_size=4, rank=4)


@pytest.mark.parametrize(
    ("world_size", "says"), [(0, "world_size=0: at least 1"), (17, "group has 2 ranks")]
)
def test_world_size_outside_the_group_is_refused(world_size: int, says: str) -> None:
    with pytest.raises(InvalidRequest, match=says):
        Distributed(ThreadGroup(2).backend(0)).init_process_group(
            "rdulink", world_size=world_size, rank=0
        )


def test_only_the_rdulink_backend() -> None:
    with pytest.raises(InvalidRequest, match=r"'nccl' is not available; use 'rdulink'"):
        Distributed(ThreadGroup(1).backend(0)).init_process_group("nccl", world_size=1, rank=0)


def test_collectives_before_init_are_a_clear_error() -> None:
    dist = Distributed(ThreadGroup(1).backend(0))
    with pytest.raises(NotInitialized, match=r"all_reduce: the process group is not initialized"):
        dist.all_reduce(np.zeros(1))
    with pytest.raises(NotInitialized, match="get_rank"):
        dist.get_rank()
    dist.init_process_group("rdulink", world_size=1, rank=0)
    with pytest.raises(InvalidRequest, match="twice"):
        dist.init_process_group("rdulink", world_size=1, rank=0)


def test_a_timeout_too_short_for_a_straggler() -> None:
    """The article: fast ranks time out waiting for a straggler unless the timeout
    passed to init_process_group is long enough."""

    def run(timeout_s: float) -> None:
        def body(b: Backend) -> None:
            dist = Distributed(b)
            dist.init_process_group("rdulink", world_size=2, rank=b.rank, timeout=timeout_s)
            if b.rank == 1:
                time.sleep(0.5)  # the straggler
            dist.barrier()

        ThreadGroup(2, timeout_s=60).run(body)

    with pytest.raises(LinkFailure, match=r"barrier #0 timed out after 0.2 s on rank 0: rank 1"):
        run(0.2)
    run(5.0)  # long enough: no error
