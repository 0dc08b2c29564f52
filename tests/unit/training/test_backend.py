"""ThreadGroup: collectives between threads, and never a hang."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from rdurack.errors import InvalidRequest, LinkFailure
from rdurack.workloads.training.backend import (
    Backend,
    CollectiveMismatch,
    CollectiveTimeout,
    GroupAborted,
    ThreadGroup,
)


def test_collectives_give_every_rank_the_same_result() -> None:
    def body(b: Backend) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[np.ndarray]]:
        s = np.full(3, b.rank + 1.0, dtype=np.float32)
        b.all_reduce(s, "sum")
        m = np.full(3, b.rank + 1.0, dtype=np.float32)
        b.all_reduce(m, "mean")
        c = np.arange(2.0) + 10 * b.rank
        b.broadcast(c, src=2)
        gathered = b.all_gather(np.array([b.rank]))
        b.barrier()
        return s, m, c, gathered

    for s, m, c, gathered in ThreadGroup(4, timeout_s=5).run(body):
        assert s.tolist() == [10.0] * 3 and s.dtype == np.float32
        assert m.tolist() == [2.5] * 3 and m.dtype == np.float32
        assert c.tolist() == [20.0, 21.0]
        assert [int(g[0]) for g in gathered] == [0, 1, 2, 3]


def test_a_rank_that_never_arrives_times_out_naming_it() -> None:
    group = ThreadGroup(3, timeout_s=0.3)

    def body(b: Backend) -> BaseException | None:
        if b.rank == 2:
            return None  # skips the collective
        try:
            b.all_reduce(np.zeros(4), "sum")
        except LinkFailure as e:
            return e
        return None

    t0 = time.monotonic()
    errors = group.run(body)
    elapsed = time.monotonic() - t0
    assert 0.3 <= elapsed < 3.0  # waited the timeout, then failed: no hang
    for e in errors[:2]:
        assert isinstance(e, LinkFailure)
        assert "all_reduce #0" in str(e) and "rank 2 never arrived" in str(e)
    assert any(isinstance(e, CollectiveTimeout) and e.missing == [2] for e in errors[:2])
    # The group is aborted: the late rank fails at once instead of waiting.
    with pytest.raises(GroupAborted, match="rank 2 never arrived"):
        group.backend(2).all_reduce(np.zeros(4))


def test_run_reraises_the_root_cause_without_waiting_for_the_timeout() -> None:
    def body(b: Backend) -> None:
        if b.rank == 1:
            raise ValueError("bad input on rank 1")
        b.barrier()

    t0 = time.monotonic()
    with pytest.raises(ValueError, match="bad input on rank 1") as info:
        ThreadGroup(3, timeout_s=30).run(body)
    assert time.monotonic() - t0 < 5  # the others were released by the abort
    assert any("GroupAborted" in n for n in info.value.__notes__)


def test_ranks_calling_different_collectives_get_a_clear_error() -> None:
    def body(b: Backend) -> None:
        x = np.zeros(3)
        if b.rank == 0:
            b.all_reduce(x)
        else:
            b.broadcast(x, src=0)

    with pytest.raises(
        CollectiveMismatch, match=r"rank 0 called all_reduce.*rank 1 called broadcast"
    ):
        ThreadGroup(2, timeout_s=5).run(body)


def test_mismatched_shapes_are_refused() -> None:
    with pytest.raises(CollectiveMismatch, match=r"float64\[3\].*float64\[4\]"):
        ThreadGroup(2, timeout_s=5).run(lambda b: b.all_reduce(np.zeros(3 + b.rank)))


def test_a_straggler_within_the_timeout_is_waited_for() -> None:
    group = ThreadGroup(2, timeout_s=2.0)

    def body(b: Backend) -> None:
        if b.rank == 1:
            time.sleep(0.2)
        b.barrier()

    group.run(body)  # no error


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(InvalidRequest):
        ThreadGroup(0)
    group = ThreadGroup(2)
    with pytest.raises(InvalidRequest, match=r"rank 2 is not in a group of 2"):
        group.backend(2)
    assert group.backend(1) is group.backend(1)
    with pytest.raises(InvalidRequest, match="src 5"):
        group.backend(0).broadcast(np.zeros(1), src=5)
    with pytest.raises(InvalidRequest, match="floating"):
        group.backend(0).all_reduce(np.zeros(1, dtype=np.int64), "mean")


def test_group_threads_do_not_leak() -> None:
    before = threading.active_count()
    ThreadGroup(4, timeout_s=5).run(lambda b: b.barrier())
    assert threading.active_count() == before
