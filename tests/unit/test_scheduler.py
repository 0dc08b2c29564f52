"""The scheduler: gang, topology-aware placement, priority/FIFO, backfill, starvation guard."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from rdurack.errors import InvalidRequest
from rdurack.orchestrator.jobs import Job, JobSpec
from rdurack.orchestrator.scheduler import Placement, Scheduler
from rdurack.rack.topology import SocketId

ALL = [str(SocketId(n, i)) for n in range(2) for i in range(8)]


def spec(k: int, priority: int = 0) -> JobSpec:
    return JobSpec(
        workload={"kind": "kernel", "model": "llama2-7b", "phase": "decode", "num_sockets": k},
        priority=priority,
    )


def job(job_id: str, k: int, priority: int = 0, seq: int = 0) -> Job:
    return Job(job_id, spec(k, priority), seq=seq)


def node_of(socket: str) -> int:
    return SocketId.parse(socket).node


def nodes_of(p: Placement) -> set[int]:
    return {node_of(s) for s in p.sockets}


def by_id(placements: list[Placement]) -> dict[str, Placement]:
    return {p.job_id: p for p in placements}


# ------------------------------------------------------------------ gang


def test_a_sixteen_socket_job_takes_the_whole_empty_rack() -> None:
    placed = Scheduler(2, 8).schedule([job("wide", 16)], busy=())
    assert placed == [Placement("wide", tuple(ALL))]


def test_a_sixteen_socket_job_is_not_placed_when_one_socket_is_busy() -> None:
    assert Scheduler(2, 8).schedule([job("wide", 16)], busy={"rdu-n1-s3"}) == []


# ------------------------------------------------------------------ racks


def test_two_racks_name_their_sockets_and_a_32_socket_job_takes_them_all() -> None:
    s = Scheduler(4, 8, nodes_per_rack=2)
    [p] = s.schedule([job("wide", 32)], busy=())
    assert len(p.sockets) == 32 and p.sockets[16] == "rdu-r1-n2-s0"
    assert {SocketId.parse(x).rack for x in p.sockets} == {0, 1}


def test_a_job_that_fits_one_rack_does_not_cross_the_spine() -> None:
    # 12 sockets: two nodes of 6 common free indices. Nodes 1 and 2 fit best (6 free
    # each, the same indices) but sit in two racks; rack 0 holds the job on nodes 0, 1.
    busy = {"rdu-n1-s0", "rdu-n1-s1", "rdu-r1-n2-s0", "rdu-r1-n2-s1"}
    [p] = Scheduler(4, 8, nodes_per_rack=2).schedule([job("x", 12)], busy)
    assert nodes_of(p) == {0, 1}
    # On one rack of four nodes the same busy sockets give the best fit, nodes 1 and 2.
    one_rack = {"rdu-n1-s0", "rdu-n1-s1", "rdu-n2-s0", "rdu-n2-s1"}
    [p] = Scheduler(4, 8).schedule([job("x", 12)], one_rack)
    assert nodes_of(p) == {1, 2}


def test_a_job_that_fits_no_single_rack_crosses_the_spine() -> None:
    [p] = Scheduler(4, 8, nodes_per_rack=2).schedule([job("y", 24)], busy=())
    assert nodes_of(p) == {0, 1, 2}
    assert {SocketId.parse(x).rack for x in p.sockets} == {0, 1}


def test_nodes_that_do_not_make_whole_racks_are_refused() -> None:
    with pytest.raises(InvalidRequest, match="5 nodes do not make racks of 2"):
        Scheduler(5, 8, nodes_per_rack=2)


# ------------------------------------------------------------------ topology


def test_a_four_socket_job_stays_in_one_node_on_the_lowest_indices() -> None:
    [p] = Scheduler(2, 8).schedule([job("a", 4)], busy=())
    assert p.sockets == ("rdu-n0-s0", "rdu-n0-s1", "rdu-n0-s2", "rdu-n0-s3")


def test_two_fours_fill_one_node_leaving_the_other_whole_for_an_eight() -> None:
    placed = by_id(
        Scheduler(2, 8).schedule([job("a", 4, seq=1), job("b", 4, seq=2), job("c", 8, seq=3)], ())
    )
    assert nodes_of(placed["a"]) == nodes_of(placed["b"]) == {0}
    assert placed["c"].sockets == tuple(f"rdu-n1-s{i}" for i in range(8))


def test_best_fit_prefers_the_fuller_node() -> None:
    # Node 1 has 3 free, node 0 has 8: a 2 goes in node 1 and keeps node 0 whole.
    busy = {f"rdu-n1-s{i}" for i in range(5)}
    [p] = Scheduler(2, 8).schedule([job("a", 2)], busy)
    assert p.sockets == ("rdu-n1-s5", "rdu-n1-s6")


def test_a_wide_job_is_rail_aligned_on_the_same_indices_of_each_node() -> None:
    busy = {"rdu-n0-s0", "rdu-n1-s1"}  # indices 0 and 1 are not free on both nodes
    [p] = Scheduler(2, 8).schedule([job("w", 12)], busy)
    assert p.sockets == tuple(f"rdu-n{n}-s{i}" for n in range(2) for i in range(2, 8))


def test_a_wide_job_waits_when_no_common_indices_suffice() -> None:
    # Each node has 6 free, but only 4 indices are free on both: a 12 cannot be aligned.
    busy = {"rdu-n0-s0", "rdu-n0-s1", "rdu-n1-s2", "rdu-n1-s3"}
    assert Scheduler(2, 8).schedule([job("w", 12)], busy) == []


def test_a_wide_job_on_a_larger_rack_uses_the_fewest_nodes() -> None:
    # 4 nodes x 4: a 12 spans 3 nodes with 4 each; best fit takes the fuller nodes first.
    busy = {"rdu-n0-s0"}
    [p] = Scheduler(4, 4).schedule([job("w", 8)], busy)
    assert len(nodes_of(p)) == 2 and 0 not in nodes_of(p)
    [q] = Scheduler(4, 4).schedule([job("w", 12)], ())
    assert nodes_of(q) == {0, 1, 2}


# ------------------------------------------------------------------ never overlap


def _check_round(s: Scheduler, queued: list[Job], busy: set[str], bad: set[str]) -> None:
    placed = s.schedule(queued, busy, bad)
    asked = {j.id: j.spec.sockets for j in queued}
    taken: set[str] = set()
    for p in placed:
        assert len(p.sockets) == asked[p.job_id]
        assert len(set(p.sockets)) == len(p.sockets)
        assert not taken & set(p.sockets), "two jobs on one socket"
        assert not (busy | bad) & set(p.sockets)
        taken |= set(p.sockets)
        ids = [SocketId.parse(x) for x in p.sockets]
        assert ids == sorted(ids)
        by_node: dict[int, set[int]] = {}
        for sid in ids:
            by_node.setdefault(sid.node, set()).add(sid.index)
        if len(p.sockets) <= 8:
            assert len(by_node) == 1
        else:
            # Rail-aligned: the same indices on every node it spans.
            assert len({frozenset(v) for v in by_node.values()}) == 1
    assert len({p.job_id for p in placed}) == len(placed)


def test_placements_never_overlap_across_random_queues() -> None:
    rng = random.Random(20240611)
    sizes = [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16]
    s = Scheduler(2, 8, starvation_rounds=3)
    for it in range(200):
        busy = set(rng.sample(ALL, rng.randint(0, 10)))
        bad = set(rng.sample(ALL, rng.randint(0, 3)))
        queued = [
            job(f"j{it}-{n}", rng.choice(sizes), rng.randint(-2, 2), seq=n)
            for n in range(rng.randint(0, 30))
        ]
        queued.sort(key=lambda j: (-j.spec.priority, j.seq))
        _check_round(s, queued, busy, bad)


# ------------------------------------------------------------------ order and backfill


def test_the_callers_order_is_respected_when_one_fits_at_a_time() -> None:
    s = Scheduler(2, 8)
    queued = [job("hi", 16, priority=5, seq=3), job("a", 16, seq=1), job("b", 16, seq=2)]
    started: list[str] = []
    while queued:
        [p] = s.schedule(queued, busy=())
        started.append(p.job_id)
        queued = [j for j in queued if j.id != p.job_id]
    assert started == ["hi", "a", "b"]


def test_a_blocked_wide_head_does_not_stop_a_later_small_job() -> None:
    placed = Scheduler(2, 8).schedule(
        [job("wide", 16, priority=9), job("small", 2)], busy={"rdu-n0-s0"}
    )
    assert [p.job_id for p in placed] == ["small"]


def test_starvation_guard_drains_the_rack_for_the_wide_job() -> None:
    s = Scheduler(2, 8, starvation_rounds=3)
    wide = job("wide", 16, priority=1)
    holder = {"rdu-n0-s7"}  # a long job keeps one socket, so the wide job cannot start
    for r in range(3):
        placed = s.schedule([wide, job(f"small{r}", 1)], busy=holder)
        assert [p.job_id for p in placed] == [f"small{r}"]  # backfilled around it
        # The small job finishes before the next round; only the holder remains.
    assert s.skips == {"wide": 3}
    # Overtaken 3 times: now nothing behind it starts while the rack drains.
    assert s.schedule([wide, job("small3", 1)], busy=holder) == []
    assert s.schedule([wide, job("small4", 1)], busy=holder) == []
    # The holder finishes: the wide job gets the whole rack, before any small job.
    placed = s.schedule([wide, job("small5", 1)], busy=())
    assert [p.job_id for p in placed] == ["wide"]
    assert s.skips == {}  # the counter of a placed job is forgotten


def test_rounds_nobody_overtakes_do_not_count_and_gone_jobs_are_forgotten() -> None:
    s = Scheduler(2, 8, starvation_rounds=5)
    wide = job("wide", 16)
    s.schedule([wide, job("s", 1)], busy={"rdu-n0-s0"})
    assert s.skips == {"wide": 1}
    s.schedule([wide], busy={"rdu-n0-s0"})  # nothing overtook it
    assert s.skips == {"wide": 1}
    s.schedule([job("other", 1)], busy=())  # the wide job left the queue (cancelled)
    assert s.skips == {}


def test_jobs_ahead_of_a_starving_job_still_start() -> None:
    s = Scheduler(2, 8, starvation_rounds=1)
    s.schedule([job("wide", 16), job("s", 1)], busy={"rdu-n0-s0"})
    placed = s.schedule([job("urgent", 2, priority=9), job("wide", 16), job("t", 1)], {"rdu-n0-s0"})
    assert [p.job_id for p in placed] == ["urgent"]


def test_a_job_that_cannot_fit_the_healthy_rack_never_drains_it() -> None:
    s = Scheduler(2, 8, starvation_rounds=1)
    bad = {"rdu-n1-s0"}  # with a socket down a 16 cannot run even on an idle rack
    for r in range(3):
        placed = s.schedule([job("wide", 16), job(f"s{r}", 1)], busy=(), unhealthy=bad)
        assert [p.job_id for p in placed] == [f"s{r}"]


# ------------------------------------------------------------------ health


def test_unhealthy_sockets_are_never_used() -> None:
    bad = {"rdu-n0-s0", "rdu-n0-s5", "rdu-n1-s2"}
    placed = Scheduler(2, 8).schedule([job(f"j{n}", 1, seq=n) for n in range(16)], (), bad)
    taken = {s for p in placed for s in p.sockets}
    assert len(placed) == 13
    assert taken == set(ALL) - bad


def test_an_unknown_socket_is_refused() -> None:
    with pytest.raises(InvalidRequest, match="rdu-n2-s0 is not a socket"):
        Scheduler(2, 8).schedule([job("a", 1)], busy={"rdu-n2-s0"})
    with pytest.raises(InvalidRequest, match="bad socket id"):
        Scheduler(2, 8).schedule([job("a", 1)], busy={"gpu0"})


# ------------------------------------------------------------------ check


def test_check_refuses_more_sockets_than_the_rack_has() -> None:
    with pytest.raises(InvalidRequest) as err:
        Scheduler(2, 8).check(spec(17))
    assert (
        str(err.value) == "spec.kernel.num_sockets: 17 sockets asked; the rack has 16 (2 nodes x 8)"
    )


def test_check_refuses_a_size_that_cannot_be_rail_aligned() -> None:
    with pytest.raises(
        InvalidRequest, match=r"^spec\.kernel\.num_sockets: 11 sockets asked"
    ) as err:
        Scheduler(2, 8).check(spec(11))
    assert "10, 12, 14, 16" in str(err.value)


@pytest.mark.parametrize("k", [1, 3, 8, 10, 12, 16])
def test_check_accepts_sizes_that_fit(k: int) -> None:
    Scheduler(2, 8).check(spec(k))


# ------------------------------------------------------------------ scale


def test_a_thousand_job_queue_schedules() -> None:
    rng = random.Random(7)
    queued = [job(f"j{n}", rng.choice([1, 2, 4, 8, 16]), seq=n) for n in range(1000)]
    s = Scheduler(2, 8)
    placed = s.schedule(queued, busy=())
    assert sum(len(p.sockets) for p in placed) <= 16
    # Everything left was overtaken (or stood behind a full rack) and is still queued.
    assert set(s.skips) <= {j.id for j in queued}


def test_a_lazily_walked_queue_keeps_the_counters_of_jobs_it_did_not_reach() -> None:
    """A round that stops early (the rack filled up) does not forget the starvation
    counter of a queued job further back: `still_queued` names every queued job."""
    s = Scheduler(1, 2)
    big, small = job("big", 2, seq=1), job("small", 1, seq=2)
    assert [p.job_id for p in s.schedule([big, small], busy={ALL[0]})] == ["small"]
    assert s.skips == {"big": 1}  # overtaken by a later job
    x, y = job("x", 1, priority=5, seq=3), job("y", 1, priority=5, seq=4)
    walked: list[str] = []

    def lazily() -> Iterator[Job]:
        for j in (x, y, big):
            walked.append(j.id)
            yield j

    placed = s.schedule(lazily(), busy=(), still_queued={"x", "y", "big"})
    assert [p.job_id for p in placed] == ["x", "y"]
    assert walked == ["x", "y"]  # the rack was full: big was never read
    assert s.skips == {"big": 1}  # and its count is kept
    # A job that is no longer in `still_queued` loses its count, walked or not.
    s.schedule([], busy=(), still_queued={"small"})
    assert s.skips == {}
