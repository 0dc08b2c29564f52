"""The job store's SQLite file: its tables and schema version, opening a file (creating
or migrating its schema), and how a job maps to a row and back.

The store's reads and writes are in store.py; this module holds the rest of its SQL.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager

from rdurack.errors import InvalidRequest, RdurackError
from rdurack.orchestrator.jobs import Job, JobSpec, JobState
from rdurack.orchestrator.results import RESULTS, JobResult

# Bumped whenever the schema changes; kept in the file's `PRAGMA user_version`.
SCHEMA_VERSION = 2  # 2: jobs have a tenant (migrated from 1 on open)

# The jobs table, by name: the schema creates it as `jobs`, a migration as a new table
# it then renames (SQLite cannot change a table's constraints in place).
_JOBS_TABLE = """
CREATE TABLE IF NOT EXISTS {name} (
    id                TEXT PRIMARY KEY,
    seq               INTEGER NOT NULL UNIQUE,  -- submission order, assigned by the store
    tenant            TEXT NOT NULL DEFAULT '', -- who submitted it, '' for none (open rack)
    client_request_id TEXT,                     -- NULL for non-idempotent submissions
    state             TEXT NOT NULL,
    priority          INTEGER NOT NULL,         -- copy of spec.priority, for the index
    spec              TEXT NOT NULL,            -- JobSpec as JSON
    sockets           TEXT NOT NULL,            -- JSON list of socket names
    attempts          INTEGER NOT NULL,
    created_s         REAL NOT NULL,
    updated_s         REAL NOT NULL,
    started_s         REAL,                     -- wall clock of the last start
    finished_s        REAL,                     -- wall clock of the terminal state
    emulated_start_ns INTEGER,
    emulated_end_ns   INTEGER,
    result            TEXT,                     -- JSON object or NULL
    error             TEXT NOT NULL,
    -- Idempotency keys are per tenant: one tenant's key never finds another's job.
    UNIQUE (tenant, client_request_id)
)"""

_SCHEMA = (
    _JOBS_TABLE.format(name="jobs")
    + """;
-- The scheduler's question: the PENDING jobs, highest priority first, then FIFO.
CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs (state, priority, seq);
-- A tenant's jobs, newest first (ListJobs).
CREATE INDEX IF NOT EXISTS jobs_by_tenant ON jobs (tenant, seq);
CREATE TABLE IF NOT EXISTS events (
    job_id  TEXT NOT NULL REFERENCES jobs (id),
    seq     INTEGER NOT NULL,                   -- 1, 2, 3... within one job
    kind    TEXT NOT NULL,
    payload TEXT NOT NULL,                      -- JSON object
    time_s  REAL NOT NULL,
    PRIMARY KEY (job_id, seq)
);
"""
)

# Version 1 had no tenant and a store-wide unique client_request_id.
_V1_COLUMNS = (
    "id, seq, client_request_id, state, priority, spec, sockets, attempts, created_s, "
    "updated_s, started_s, finished_s, emulated_start_ns, emulated_end_ns, result, error"
)
JOB_COLUMNS = "tenant, " + _V1_COLUMNS

# Parsed job specs kept for reuse (see JobRows.spec); about 1-2 KB each.
SPEC_CACHE = 10_000


class UnsupportedStoreVersion(RdurackError):
    """The store file was written by a newer rdurack whose schema this one does not know."""

    def __init__(self, path: str, found: int, known: int):
        self.path, self.found, self.known = path, found, known
        super().__init__(
            f"job store {path} has schema version {found}; this rdurack knows versions up "
            f"to {known}: run a newer rdurack, or point it at another store path"
        )

    def __reduce__(self) -> tuple[type, tuple[str, int, int]]:
        return (type(self), (self.path, self.found, self.known))


def connect(path: str) -> sqlite3.Connection:
    # isolation_level=None: no implicit transactions; writes open them explicitly, so
    # what is atomic is visible in the code. check_same_thread=False: the gRPC worker
    # threads share the connection, and a lock serializes them.
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    db.row_factory = sqlite3.Row  # columns by name in `JobRows.job`
    return db


def open_schema(
    db: sqlite3.Connection,
    write: Callable[[], AbstractContextManager[sqlite3.Connection]],
    path: str,
    in_memory: bool,
) -> None:
    """Make `db` (the writer) ready: WAL and full sync, the schema created or migrated
    to SCHEMA_VERSION in one write (`write` opens it), foreign keys enforced."""
    if not in_memory:
        # WAL: readers never block the writer, and a commit is one append to the log
        # rather than a rewrite of the pages. (In-memory databases have no WAL.)
        db.execute("PRAGMA journal_mode=WAL")
    # FULL: each commit is fsynced before it returns. The orchestrator acknowledges a
    # submission or a state change only after the commit, so an acknowledged job
    # survives a crash or a power cut; with WAL's usual NORMAL the last commits could
    # be lost on power failure even though the client was told they were stored.
    db.execute("PRAGMA synchronous=FULL")
    # Foreign keys are off (SQLite's default) while the schema is made or migrated:
    # a migration drops and recreates the jobs table that events refer to. They are
    # checked before the migration commits, and enforced from then on.
    db.execute("PRAGMA foreign_keys=OFF")
    with write() as w:
        found = int(w.execute("PRAGMA user_version").fetchone()[0])
        if found > SCHEMA_VERSION:
            raise UnsupportedStoreVersion(path, found, SCHEMA_VERSION)
        if found == 1:
            _migrate_v1(w)
        # executescript would COMMIT our transaction first; run statement by statement
        # so the schema and its version appear together.
        for statement in _SCHEMA.split(";"):
            if statement.strip():
                w.execute(statement)
        if w.execute("PRAGMA foreign_key_check").fetchone() is not None:
            raise InvalidRequest(f"job store {path}: events refer to missing jobs")
        if found < SCHEMA_VERSION:
            w.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
    db.execute("PRAGMA foreign_keys=ON")


def _migrate_v1(db: sqlite3.Connection) -> None:
    """Version 1 -> 2: every job gets tenant '' (it was submitted to an open rack), and
    idempotency keys become unique per tenant. SQLite's way to change a table's
    constraints: a new table, the rows copied, the old one dropped, the new renamed; all
    inside the caller's transaction, so a crash leaves version 1 as it was."""
    db.execute(_JOBS_TABLE.format(name="jobs_v2"))
    db.execute(f"INSERT INTO jobs_v2 (tenant, {_V1_COLUMNS}) SELECT '', {_V1_COLUMNS} FROM jobs")
    db.execute("DROP TABLE jobs")  # its index goes with it; the schema recreates it
    db.execute("ALTER TABLE jobs_v2 RENAME TO jobs")


def insert_job(db: sqlite3.Connection, job: Job) -> None:
    """The row of a job just submitted (nothing set yet but its submission)."""
    db.execute(
        f"INSERT INTO jobs ({JOB_COLUMNS}) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            job.tenant,
            job.id,
            job.seq,
            job.client_request_id,
            job.state.value,
            job.spec.priority,
            job.spec.model_dump_json(),
            "[]",
            job.attempts,
            job.created_s,
            job.updated_s,
            None,
            None,
            None,
            None,
            None,
            job.error,
        ),
    )


def result_json(result: JobResult | None) -> str | None:
    """A result as its column holds it (raises before anything is written if it
    cannot be encoded)."""
    return None if result is None else result.model_dump_json()


class JobRows:
    """Rows of the jobs table to Jobs, with the parsed specs kept for reuse."""

    def __init__(self) -> None:
        # Parsed specs by job id, oldest first; its own lock: rows are turned into jobs
        # outside the store's locks.
        self._specs: dict[str, JobSpec] = {}
        self._lock = threading.Lock()

    def spec(self, job_id: str, text: str) -> JobSpec:
        """The job's spec parsed from its JSON, from the cache when it was parsed before.

        A spec never changes after submission, so a parsed (frozen) one is reused: the
        scheduler reads every queued job each round, and validating thousands of specs
        per round was most of the orchestrator's CPU under a stream of submissions."""
        with self._lock:
            spec = self._specs.get(job_id)
        if spec is None:
            spec = JobSpec.model_validate_json(text)
            with self._lock:
                self._specs[job_id] = spec
                if len(self._specs) > SPEC_CACHE:
                    del self._specs[next(iter(self._specs))]  # the oldest entry
        return spec

    def job(self, row: sqlite3.Row) -> Job:
        result = row["result"]
        return Job(
            id=row["id"],
            spec=self.spec(row["id"], row["spec"]),
            state=JobState(row["state"]),
            seq=row["seq"],
            client_request_id=row["client_request_id"],
            tenant=row["tenant"],
            sockets=tuple(json.loads(row["sockets"])),
            attempts=row["attempts"],
            created_s=row["created_s"],
            updated_s=row["updated_s"],
            started_s=row["started_s"],
            finished_s=row["finished_s"],
            emulated_start_ns=row["emulated_start_ns"],
            emulated_end_ns=row["emulated_end_ns"],
            result=None if result is None else RESULTS.validate_json(result),
            error=row["error"],
        )
