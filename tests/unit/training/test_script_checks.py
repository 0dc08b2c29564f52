"""A script's ranks comparing notes through the job's store: what each rank sees, a rank
that never comes, and a stopped rank that does not wait out the timeout."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from torch._C._distributed_c10d import HashStore, Store

from rdurack.errors import LinkFailure, RdurackError
from rdurack.node_agent.training.script_checks import Checks
from rdurack.rack.clock import EmulatedClock

SOCKETS = ["rdu-n0-s0", "rdu-n0-s1", "rdu-n0-s2"]


def _checks(store: Store, rank: int, wall_timeout_s: float = 30.0) -> Checks:
    return Checks("job-1", SOCKETS, rank, wall_timeout_s, store=store)


def _on_threads(fn: object, n: int = 3) -> list[object]:
    out: list[object] = [None] * n

    def body(r: int) -> None:
        try:
            out[r] = fn(r)  # type: ignore[operator]
        except Exception as e:  # the test looks at what each rank raised
            out[r] = e

    threads = [threading.Thread(target=body, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


def test_every_rank_sees_every_ranks_data_and_old_keys_go() -> None:
    store = HashStore()
    checks = [_checks(store, r) for r in range(3)]

    def rank(r: int) -> list[list[int]]:
        return [
            checks[r]._exchange("x", np.array([r, 10 * k], dtype=np.int64)).tolist()
            for k in range(3)
        ]

    seen = _on_threads(rank)
    for got in seen:
        assert got == [[0, 0, 1, 0, 2, 0], [0, 10, 1, 10, 2, 10], [0, 20, 1, 20, 2, 20]]
    # Each exchange deletes the rank's key of the one before: only the last stays.
    assert store.num_keys() == 3


def test_a_straggler_beyond_the_timeout_is_named_by_every_rank() -> None:
    store = HashStore()
    checks = [_checks(store, r) for r in range(3)]
    late_ns = {0: 0, 1: 10**6, 2: 5 * 10**9}  # rank 2: 5 emulated s after the others

    def rank(r: int) -> str:
        checks[r].late_s = 1.0
        checks[r].gradient_bucket(np.zeros(4, np.float32), EmulatedClock(late_ns[r]), 1800.0)
        return "on time"

    for outcome in _on_threads(rank):
        assert isinstance(outcome, RdurackError)
        assert "[straggler-timeout] rank 2 (rdu-n0-s2)" in str(outcome)


def test_a_rank_that_never_comes_is_named_after_the_wall_timeout() -> None:
    store = HashStore()
    checks = _checks(store, 0, wall_timeout_s=0.5)
    with pytest.raises(LinkFailure, match=r"rank\(s\) 1, 2 never arrived within 0.5 s"):
        checks._exchange("x", np.zeros(1))


def test_a_stopped_rank_stops_waiting_at_once() -> None:
    store = HashStore()
    checks = _checks(store, 0, wall_timeout_s=600.0)
    checks.stopped = lambda: "its job ended"
    began = time.monotonic()
    with pytest.raises(RdurackError, match=r"stopped while comparing x .*: its job ended"):
        checks._exchange("x", np.zeros(1))
    assert time.monotonic() - began < 60  # one wait slice, not the 600 s timeout
