"""The embedded job store: one SQLite file (the default, `STATE_DIR/jobs.sqlite`).

One connection writes for every thread (the gRPC server's workers share the store): a
lock serializes its use, and every write is atomic. Writes are group-committed
(group_commit.py): writes that arrive while a commit is on its way to the disk share the
next one, and none returns before its commit does. Reads go through a second
connection, which sees committed data only (WAL); an in-memory store, which has one
connection only, reads through the writer's.

A file has one host: more than one orchestrator replica needs the PostgreSQL store.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

from rdurack.errors import InvalidRequest
from rdurack.orchestrator.jobs import Job
from rdurack.orchestrator.store.group_commit import GroupCommit
from rdurack.orchestrator.store.schema import (
    JOBS_TABLE,
    SCHEMA_STATEMENTS,
    SCHEMA_VERSION,
    V1_COLUMNS,
    check_version,
    first_event,
    first_event_args,
    submission,
)


class SqliteBackend:
    """The store's tables in the SQLite file at `path` (":memory:": a store of this
    process only, for tests)."""

    lock_rows = ""  # BEGIN IMMEDIATE: one writer at a time, in every process
    # A file has one host, so one clock: julianday's, in days since 4714 BC, to seconds.
    clock_s = "((julianday('now') - 2440587.5) * 86400.0)"
    share_rows = ""

    def __init__(self, path: str | Path) -> None:
        self.location = str(path)
        in_memory = self.location in (":memory:", "")
        if not in_memory:
            Path(self.location).parent.mkdir(parents=True, exist_ok=True)
        self._db = _connect(self.location)
        self._lock = threading.Lock()
        self._commits = GroupCommit(self._db, self._lock)
        self._reader, self._read_lock = self._db, self._lock  # a file's: set below
        try:
            self._open_schema(in_memory)
            if not in_memory:
                # Opened after the schema exists; WAL is a property of the file, so this
                # connection reads committed data only, without waiting for the writer.
                self._reader, self._read_lock = _connect(self.location), threading.Lock()
                self._reader.execute("PRAGMA query_only=ON")
        except sqlite3.DatabaseError as e:  # e.g. "file is not a database"
            self.close()
            raise InvalidRequest(f"cannot open job store {self.location}: {e}") from e
        except BaseException:
            self.close()
            raise

    def write(self) -> AbstractContextManager[sqlite3.Connection]:
        """One atomic write, on disk when the block exits (group_commit.py)."""
        return self._commits.write()

    def submit(self, job: Job) -> int | None:
        # Jobs are never deleted, so MAX + 1 only grows; the write lock makes it unique.
        sql, args = submission(job, "(SELECT COALESCE(MAX(seq), 0) + 1 FROM jobs)")
        with self.write() as db:
            row = db.execute(sql, args).fetchone()
            if row is None:
                return None
            db.execute(first_event("?"), (job.id, *first_event_args(job)))
            return int(row["seq"])

    @contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        # Reads take the reader's lock: a sqlite3 connection is not safe to use from two
        # threads at once.
        with self._read_lock:
            yield self._reader

    def close(self) -> None:
        with self._lock:
            self._db.close()
        if self._reader is not self._db:
            with self._read_lock:
                self._reader.close()

    def _open_schema(self, in_memory: bool) -> None:
        """Make the writer ready: WAL and its flushes, the schema created or migrated to
        SCHEMA_VERSION in one write, foreign keys enforced."""
        db = self._db
        wal = None
        # WAL: readers never block the writer, and a commit is one append to the log
        # rather than a rewrite of the pages. (In-memory databases have no WAL; a file
        # system that cannot share memory keeps the rollback journal.)
        if not in_memory and db.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal":
            wal = Path(f"{self.location}-wal")
        # Every commit is on disk before its write returns: the orchestrator acknowledges
        # a submission or a state change only after that, so an acknowledged job survives
        # a crash or a power cut. In WAL mode the group commit fsyncs the WAL after each
        # COMMIT itself, outside its lock (group_commit.py), so the COMMIT need not:
        # NORMAL, which keeps the file consistent and put only the last commits at risk,
        # none of which is acknowledged before that fsync. Otherwise FULL: each COMMIT
        # syncs.
        db.execute(f"PRAGMA synchronous={'FULL' if wal is None else 'NORMAL'}")
        self._commits.wal = wal
        # Foreign keys are off (SQLite's default) while the schema is made or migrated:
        # a migration drops and recreates the jobs table that events refer to. They are
        # checked before the migration commits, and enforced from then on.
        db.execute("PRAGMA foreign_keys=OFF")
        with self.write() as w:
            found = int(w.execute("PRAGMA user_version").fetchone()[0])
            check_version(self.location, found)
            if found == 1:
                _migrate_v1(w)
            for statement in SCHEMA_STATEMENTS:
                w.execute(statement)
            if w.execute("PRAGMA foreign_key_check").fetchone() is not None:
                raise InvalidRequest(f"job store {self.location}: events refer to missing jobs")
            if found < SCHEMA_VERSION:
                w.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        db.execute("PRAGMA foreign_keys=ON")


def _connect(path: str) -> sqlite3.Connection:
    # isolation_level=None: no implicit transactions; writes open them explicitly, so
    # what is atomic is visible in the code. check_same_thread=False: the gRPC worker
    # threads share the connection, and a lock serializes them.
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    db.row_factory = sqlite3.Row  # columns by name in `JobRows.job`
    return db


def _migrate_v1(db: sqlite3.Connection) -> None:
    """Version 1 -> 2: every job gets tenant '' (it was submitted to an open rack), and
    idempotency keys become unique per tenant. SQLite's way to change a table's
    constraints: a new table, the rows copied, the old one dropped, the new renamed; all
    inside the caller's transaction, so a crash leaves version 1 as it was. (PostgreSQL
    stores began at version 2.)"""
    db.execute(JOBS_TABLE.format(name="jobs_v2"))
    db.execute(f"INSERT INTO jobs_v2 (tenant, {V1_COLUMNS}) SELECT '', {V1_COLUMNS} FROM jobs")
    db.execute("DROP TABLE jobs")  # its index goes with it; the schema recreates it
    db.execute("ALTER TABLE jobs_v2 RENAME TO jobs")
