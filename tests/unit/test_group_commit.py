"""Group commit: writes share commits, and none returns before its commit is on disk
(the WAL fsynced, outside the writers' lock)."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rdurack.orchestrator.store import group_commit
from rdurack.orchestrator.store.group_commit import CommitFailed, GroupCommit


@pytest.fixture
def db(tmp_path: Path) -> Iterator[tuple[Path, sqlite3.Connection, GroupCommit]]:
    """A connection as the SQLite store opens its file's: WAL, its COMMITs not synced,
    the group commit fsyncing the WAL after each."""
    path = tmp_path / "g.sqlite"
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("CREATE TABLE t (k TEXT PRIMARY KEY)")
    yield path, conn, GroupCommit(conn, threading.Lock(), Path(f"{path}-wal"))
    conn.close()


def _on_disk(path: Path) -> set[str]:
    """What another connection (another process, after a crash) reads from the file."""
    other = sqlite3.connect(path)
    try:
        return {k for (k,) in other.execute("SELECT k FROM t")}
    finally:
        other.close()


def _held_commit(
    gc: GroupCommit, bodies: list[Callable[[sqlite3.Connection], None]]
) -> tuple[list[threading.Thread], list[BaseException | None], Callable[[], bool]]:
    """Start a writer per body while another batch's commit is (as far as the writers can
    tell) in progress: every body runs, none can return. Returns the threads, their
    outcomes (None: returned) and a wait until every body has run."""
    with gc._done:
        gc._committing = True  # another leader's commit is on its way to the disk
    outcomes: list[BaseException | None] = [None] * len(bodies)
    ran = threading.Condition()
    count = [0]

    def writer(i: int) -> None:
        try:
            with gc.write() as conn:
                try:
                    bodies[i](conn)
                finally:
                    with ran:
                        count[0] += 1
                        ran.notify_all()
        except BaseException as e:
            outcomes[i] = e

    def all_ran() -> bool:
        with ran:
            return ran.wait_for(lambda: count[0] == len(bodies), timeout=5)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    return threads, outcomes, all_ran


def insert(key: str) -> Callable[[sqlite3.Connection], None]:
    def body(c: sqlite3.Connection) -> None:
        c.execute("INSERT INTO t VALUES (?)", (key,))

    return body


def _finish_held_commit(gc: GroupCommit) -> None:
    with gc._done:
        gc._committing = False
        gc._done.notify_all()


def test_writes_during_a_commit_share_the_next_one_and_wait_for_it(
    db: tuple[Path, sqlite3.Connection, GroupCommit],
) -> None:
    path, conn, gc = db
    commits: list[str] = []
    conn.set_trace_callback(lambda sql: commits.append(sql) if sql == "COMMIT" else None)

    threads, outcomes, all_ran = _held_commit(gc, [insert(k) for k in "abc"])
    assert all_ran()
    time.sleep(0.05)  # time for a writer that wrongly returns early to do so
    assert all(t.is_alive() for t in threads)  # no write acknowledged before its commit
    assert _on_disk(path) == set()
    _finish_held_commit(gc)
    for t in threads:
        t.join(5)
    assert outcomes == [None, None, None]
    assert _on_disk(path) == {"a", "b", "c"}
    assert commits == ["COMMIT"]  # three writes, one commit


def test_a_failed_write_is_undone_alone(db: tuple[Path, sqlite3.Connection, GroupCommit]) -> None:
    path, _, gc = db

    def good(c: sqlite3.Connection) -> None:
        c.execute("INSERT INTO t VALUES ('kept')")

    def bad(c: sqlite3.Connection) -> None:
        c.execute("INSERT INTO t VALUES ('undone')")
        raise ValueError("refused")

    threads, outcomes, all_ran = _held_commit(gc, [good, bad])
    assert all_ran()
    _finish_held_commit(gc)
    for t in threads:
        t.join(5)
    assert outcomes[0] is None
    assert isinstance(outcomes[1], ValueError) and str(outcomes[1]) == "refused"
    assert _on_disk(path) == {"kept"}


def test_a_failed_commit_fails_every_write_of_its_batch(
    db: tuple[Path, sqlite3.Connection, GroupCommit],
) -> None:
    path, conn, gc = db

    def deny_commit(action: int, arg1: str | None, *_: object) -> int:
        if action == sqlite3.SQLITE_TRANSACTION and arg1 == "COMMIT":
            return sqlite3.SQLITE_DENY
        return sqlite3.SQLITE_OK

    threads, outcomes, all_ran = _held_commit(gc, [insert("x"), insert("y")])
    assert all_ran()
    conn.set_authorizer(deny_commit)
    _finish_held_commit(gc)
    for t in threads:
        t.join(5)
    assert all(isinstance(o, CommitFailed) for o in outcomes), outcomes
    assert _on_disk(path) == set()
    conn.set_authorizer(None)
    with gc.write() as c:  # the store carries on after a failed commit
        c.execute("INSERT INTO t VALUES ('z')")
    assert _on_disk(path) == {"z"}


def _writer(
    gc: GroupCommit, key: str, outcomes: dict[str, BaseException | None]
) -> threading.Thread:
    """A thread writing `key`; its outcome in `outcomes` (None: acknowledged)."""

    def run() -> None:
        try:
            with gc.write() as c:
                c.execute("INSERT INTO t VALUES (?)", (key,))
            outcomes[key] = None
        except BaseException as e:
            outcomes[key] = e

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_a_write_returns_after_the_wal_is_flushed_and_the_next_writes_run_meanwhile(
    db: tuple[Path, sqlite3.Connection, GroupCommit], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, _, gc = db
    flushing = threading.Event()
    release = threading.Event()
    flushed: list[Path] = []

    def slow_fsync(wal: Path) -> None:  # the disk, taking its time
        flushed.append(wal)
        flushing.set()
        assert release.wait(5)

    monkeypatch.setattr(group_commit, "_fsync", slow_fsync)
    outcomes: dict[str, BaseException | None] = {}
    first = _writer(gc, "a", outcomes)
    assert flushing.wait(5)  # its COMMIT is done; the WAL's flush is under way
    assert _on_disk(path) == {"a"}
    # The writers' lock is free during the flush: the next write's body runs now...
    body_ran = threading.Event()

    def second_body() -> None:
        with gc.write() as c:
            c.execute("INSERT INTO t VALUES ('b')")
            body_ran.set()

    second = threading.Thread(target=second_body)
    second.start()
    assert body_ran.wait(5)
    time.sleep(0.05)  # time for a writer that wrongly returns early to do so
    # ... but neither write is acknowledged before the flush of its own COMMIT returns.
    assert first.is_alive() and second.is_alive()
    release.set()
    first.join(5)
    second.join(5)
    assert outcomes == {"a": None}
    assert not second.is_alive()
    assert flushed == [Path(f"{path}-wal")] * 2  # one flush per batch, after its COMMIT
    assert _on_disk(path) == {"a", "b"}


def test_a_failed_flush_fails_every_write_of_its_batch(
    db: tuple[Path, sqlite3.Connection, GroupCommit], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, _, gc = db

    def broken_fsync(wal: Path) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(group_commit, "_fsync", broken_fsync)
    threads, outcomes, all_ran = _held_commit(gc, [insert("x"), insert("y")])
    assert all_ran()
    _finish_held_commit(gc)
    for t in threads:
        t.join(5)
    assert all(isinstance(o, CommitFailed) for o in outcomes), outcomes
    assert all("Input/output error" in str(o) for o in outcomes)
