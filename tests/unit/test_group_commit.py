"""Group commit: writes share commits, and none returns before its commit is on disk."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rdurack.orchestrator.store.group_commit import CommitFailed, GroupCommit


@pytest.fixture
def db(tmp_path: Path) -> Iterator[tuple[Path, sqlite3.Connection, GroupCommit]]:
    path = tmp_path / "g.sqlite"
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE t (k TEXT PRIMARY KEY)")
    yield path, conn, GroupCommit(conn, threading.Lock())
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
