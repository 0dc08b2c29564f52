"""Group commit: many atomic writes on one SQLite connection, one fsync for several.

Every write is fsynced before it is acknowledged, and the job store's single connection
does one write at a time. Group commit keeps every write atomic and still acknowledges
none before it is on disk, but lets the writes that arrive while a commit is on its way
to the disk share the next one:

- A write runs under `lock` inside the connection's open transaction (BEGIN IMMEDIATE,
  opened by the first write of a batch), in a SAVEPOINT of its own: if it raises, only
  its changes are rolled back, and the exception reaches its caller.
- Then the writer waits until its batch is committed and flushed. The first writer to
  wait while no commit is in progress leads: it COMMITs (taking `lock`: the batch is
  every write made until then), then fsyncs the WAL file; the others wait for it.
  `write` returns only once an fsync that began after the COMMIT holding its changes
  has returned, so an acknowledged write is on disk.
- The fsync runs outside `lock`. The connection runs with `synchronous=NORMAL` (its
  COMMIT writes the WAL and does not wait for the disk) and the leader flushes the WAL
  itself once it has released the lock, so that the next batch's writes run on the
  connection while the disk works. With `synchronous=FULL` the fsync ran inside COMMIT,
  under the lock, and every writer queued behind it: that was where SubmitJob's time
  went under load (docs/control-plane.md, "Latency"). NORMAL alone could lose the last
  commits in a power cut; none of them is acknowledged before the leader's fsync, and
  WAL keeps the file consistent either way.
- If that COMMIT or fsync fails, every writer of the batch gets the error (CommitFailed;
  after a failed fsync the batch's writes may or may not be on disk: a client retries
  with its request id, which finds the job if it was kept), and a failed COMMIT's
  transaction is rolled back.

Readers on the same connection would see writes not yet committed; the job store reads
through a second connection (WAL: it sees committed data only). It may see a batch in
the moment between its COMMIT and its fsync, before any writer of it is answered: a
power cut then loses what it saw, but nothing that was acknowledged (a later commit's
fsync flushes the earlier ones too: the WAL is one file, written in order).
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from rdurack.errors import RdurackError

# Outcomes of failed batches kept for their waiters (one per failed commit; a waiter
# reads its own soon after, and batch numbers only grow).
_FAILURES_KEPT = 64


class CommitFailed(RdurackError):
    """The commit holding a write failed: the write is not in the store."""


class GroupCommit:
    """Atomic writes on `db` (autocommit mode, isolation_level=None), several per commit.

    `lock` serializes every use of `db`; a caller that reads on `db` takes it too.
    `wal` (settable before the first write): the database's WAL file, which the leader
    fsyncs after each COMMIT, outside the lock, for a connection in WAL mode with
    `synchronous=NORMAL`; None: the COMMIT syncs by itself (`synchronous=FULL`), or there
    is nothing to sync (an in-memory database)."""

    def __init__(
        self, db: sqlite3.Connection, lock: threading.Lock, wal: Path | None = None
    ) -> None:
        self._db = db
        self.wal = wal
        self._lock = lock  # guards `db`, `_open` and `_batch`
        self._open = False  # a transaction is open on `db`
        self._batch = 0  # number of the batch the open (or next) transaction is
        self._done = threading.Condition()  # guards the three below
        self._settled = 0  # every batch up to this one is committed or failed
        self._committing = False
        self._failures: dict[int, BaseException] = {}

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """One atomic write: the body runs under the lock in a savepoint; the block
        exits once its commit is on disk. Raises the body's exception (its changes
        undone) or CommitFailed."""
        with self._lock:
            if not self._open:
                # IMMEDIATE takes SQLite's write lock before the first read, so a
                # read-check-write cannot interleave with another process's writes.
                self._db.execute("BEGIN IMMEDIATE")
                self._open = True
                self._batch += 1
            batch = self._batch
            self._db.execute("SAVEPOINT write")
            error: BaseException | None = None
            try:
                yield self._db
            except BaseException as e:
                error = e
                # If SQLite dropped the whole transaction, its COMMIT fails and says so.
                with suppress(sqlite3.Error):
                    self._db.execute("ROLLBACK TO write")
            try:
                self._db.execute("RELEASE write")
            except sqlite3.Error:
                if error is None:
                    raise
        if error is None:
            self._wait(batch)
            return
        # Nothing of ours to commit, but the batch's transaction must not stay open (it
        # holds SQLite's write lock): commit the others' writes, then report our error.
        with suppress(CommitFailed):  # the body's own error is the one its caller needs
            self._wait(batch)
        raise error

    def _wait(self, batch: int) -> None:
        """Return once `batch` is committed and flushed; raise CommitFailed if its
        commit or flush failed."""
        with self._done:
            while self._settled < batch and self._committing:
                self._done.wait()
            lead = self._settled < batch
            if lead:
                self._committing = True
        if lead:
            self._commit()
        with self._done:
            failure = self._failures.get(batch)
        if failure is not None:
            raise CommitFailed(f"the job store could not commit: {failure}") from failure

    def _commit(self) -> None:
        """Commit the open transaction (every write so far), as the batch's leader, then
        flush it to the disk without holding the lock."""
        error: BaseException | None = None
        with self._lock:
            batch = self._batch
            if self._open:
                try:
                    self._db.execute("COMMIT")
                except sqlite3.Error as e:
                    error = e
                    with suppress(sqlite3.Error):  # SQLite may have rolled back already
                        self._db.execute("ROLLBACK")
                finally:
                    self._open = False
        if error is None and self.wal is not None:
            try:
                _fsync(self.wal)
            except OSError as e:
                error = e
        with self._done:
            if error is not None:
                self._failures[batch] = error
                for old in sorted(self._failures)[:-_FAILURES_KEPT]:
                    del self._failures[old]
            self._settled = batch
            self._committing = False
            self._done.notify_all()


def _fsync(path: Path) -> None:
    """Flush a file's written data to the disk. Opened for each flush: the file at the
    path is always the one flushed (fsync flushes the file, whichever descriptor), and
    no descriptor is held across a checkpoint's reset of the WAL."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
