"""Group commit: many atomic writes on one SQLite connection, one fsync for several.

With `synchronous=FULL` every COMMIT waits for the disk (about 0.5 ms here, more under
load), and the job store's single connection does one write at a time: a stream of
submissions and job transitions queued behind each other's fsyncs. Group commit keeps
every write atomic and still acknowledges none before it is on disk, but lets the writes
that arrive while a commit is in progress share the next one:

- A write runs under `lock` inside the connection's open transaction (BEGIN IMMEDIATE,
  opened by the first write of a batch), in a SAVEPOINT of its own: if it raises, only
  its changes are rolled back, and the exception reaches its caller.
- Then the writer waits until its batch is committed. The first writer to wait while no
  commit is in progress commits (taking `lock`: the batch is every write made until
  then); the others wait for it. `write` returns only once the COMMIT that holds its
  changes has returned, so an acknowledged write is on disk.
- If that COMMIT fails, every writer of the batch gets the error (none of them is on
  disk), and the transaction is rolled back.

Readers on the same connection would see writes not yet committed; the job store reads
through a second connection (WAL: it sees committed data only).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress

from rdurack.errors import RdurackError

# Outcomes of failed batches kept for their waiters (one per failed commit; a waiter
# reads its own soon after, and batch numbers only grow).
_FAILURES_KEPT = 64


class CommitFailed(RdurackError):
    """The commit holding a write failed: the write is not in the store."""


class GroupCommit:
    """Atomic writes on `db` (autocommit mode, isolation_level=None), several per commit.

    `lock` serializes every use of `db`; a caller that reads on `db` takes it too."""

    def __init__(self, db: sqlite3.Connection, lock: threading.Lock) -> None:
        self._db = db
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
        """Return once `batch` is committed; raise CommitFailed if its commit failed."""
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
        """Commit the open transaction (every write so far), as the batch's leader."""
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
        with self._done:
            if error is not None:
                self._failures[batch] = error
                for old in sorted(self._failures)[:-_FAILURES_KEPT]:
                    del self._failures[old]
            self._settled = batch
            self._committing = False
            self._done.notify_all()
