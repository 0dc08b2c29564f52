"""Writers at once: threads of one store, and stores on one database (as replicas, or
an orchestrator and the next); every test on both stores (tests/conftest.py)."""

from __future__ import annotations

import threading

import pytest

from rdurack.errors import UnknownName
from rdurack.orchestrator.jobs import IllegalTransition, Job
from rdurack.orchestrator.store import JobStore
from rdurack.orchestrator.store.backend import Db
from tests.support.store import S, spec, states


def test_every_acknowledged_submission_is_seen_by_another_store_when_submit_returns(
    store_location: str,
) -> None:
    """SubmitJob acknowledges what `submit` returns: from many threads at once, each job
    is already committed, for another store on other connections (another replica, or
    the next orchestrator), when its submit returns."""
    missing: list[str] = []
    with JobStore(store_location) as store, JobStore(store_location) as other:

        def client(c: int) -> None:
            for n in range(10):
                job, _ = store.submit(f"job-{c}-{n}", spec())
                try:
                    other.get(job.id)
                except UnknownName:
                    missing.append(job.id)

        threads = [threading.Thread(target=client, args=(c,)) for c in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert missing == []
        jobs = other.list()
        assert len(jobs) == 120 and len({j.seq for j in jobs}) == 120


def race_to_submit(stores: tuple[JobStore, JobStore], r: int) -> list[tuple[str, bool]]:
    """Four threads, released together, alternating between `stores`, each submit a job
    of its own id with the client request id `req-r`: (job id, created) each."""
    barrier = threading.Barrier(4)
    got: list[tuple[str, bool]] = []

    def submit(n: int) -> None:
        barrier.wait()
        job, created = stores[n % 2].submit(f"r{r}-{n}", spec(), client_request_id=f"req-{r}")
        got.append((job.id, created))

    threads = [threading.Thread(target=submit, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return got


def test_racing_stores_with_one_request_id_make_one_job(store_location: str) -> None:
    """Two stores on one database (two replicas), threads of each submitting with one
    client request id at once: one job is made, and every caller gets it."""
    with JobStore(store_location) as a, JobStore(store_location) as b:
        for r in range(5):
            got = race_to_submit((a, b), r)
            assert len(got) == 4 and len({job_id for job_id, _ in got}) == 1, got
            assert sum(created for _, created in got) == 1, got
        assert len(a.list()) == len(b.list()) == 5


def race_to_schedule(store: JobStore, job_id: str) -> tuple[list[str], list[Exception]]:
    """Two threads, released together, each place `job_id` on its own node."""
    barrier = threading.Barrier(2)
    won: list[str] = []
    lost: list[Exception] = []

    def place(node: str) -> None:
        barrier.wait()
        try:
            store.transition(job_id, S.SCHEDULED, sockets=(f"{node}.s0",))
            won.append(node)
        except IllegalTransition as e:
            lost.append(e)

    threads = [threading.Thread(target=place, args=(n,)) for n in ("n0", "n1")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return won, lost


def test_racing_threads_cannot_both_schedule_a_job(store: JobStore) -> None:
    for r in range(20):
        store.submit(f"j{r}", spec())
        won, lost = race_to_schedule(store, f"j{r}")
        assert len(won) == 1 and len(lost) == 1, (won, lost)
        job = store.get(f"j{r}")
        assert job.state is S.SCHEDULED and job.sockets == (f"{won[0]}.s0",)
        assert states(store, f"j{r}") == ["PENDING", "SCHEDULED"]


def test_a_stale_read_loses_the_compare_and_set(
    store: JobStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another process moves the job between our read and our write: the write must not
    # land on top of it. Simulate the stale read by serving an old copy once.
    store.submit("j1", spec())
    stale = store.get("j1")
    store.transition("j1", S.SCHEDULED, sockets=("n1.s0",))
    real_load = store._load
    served: list[Job] = []

    def load_once_stale(db: Db, job_id: str, lock: str = "") -> Job:
        if not served:
            served.append(stale)
            return stale
        return real_load(db, job_id, lock)

    monkeypatch.setattr(store, "_load", load_once_stale)
    with pytest.raises(IllegalTransition, match="is SCHEDULED"):
        store.transition("j1", S.SCHEDULED, sockets=("n0.s0",))
    assert served == [stale]  # the stale copy was used, then re-read
    assert store.get("j1").sockets == ("n1.s0",)
    assert states(store, "j1") == ["PENDING", "SCHEDULED"]


def test_two_stores_on_one_database_share_one_submission_order(store_location: str) -> None:
    with JobStore(store_location) as a, JobStore(store_location) as b:
        for i in range(3):
            a.submit(f"a{i}", spec())
            b.submit(f"b{i}", spec())
        assert [(j.id, j.seq) for j in a.list()] == [
            ("a0", 1), ("b0", 2), ("a1", 3), ("b1", 4), ("a2", 5), ("b2", 6)
        ]  # fmt: skip
        b.transition("a0", S.CANCELLED)
        assert a.get("a0").state is S.CANCELLED  # no stale cache
