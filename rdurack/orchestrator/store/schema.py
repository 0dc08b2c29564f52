"""The job store's tables, the same in SQLite and PostgreSQL: their schema and its
version, and how a job maps to a row and back.

The statements are written in the SQL both databases speak (BIGINT and DOUBLE PRECISION
are SQLite's INTEGER and REAL); what each database adds (where the version is kept,
SQLite's pragmas and migration from version 1, PostgreSQL's submission sequence) is in
sqlite.py and postgres.py. The store's reads and writes are in jobstore.py.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from rdurack.errors import RdurackError
from rdurack.orchestrator.jobs import Job, JobSpec, JobState
from rdurack.orchestrator.results import RESULTS, JobResult
from rdurack.orchestrator.store.backend import Row

# Bumped whenever the schema changes; SQLite keeps it in the file's `PRAGMA
# user_version`, PostgreSQL in the table `rdurack_schema`.
# 2: jobs have a tenant (migrated from 1 on open); 3: the leader's lease (a new table,
# made on open).
SCHEMA_VERSION = 3

# The jobs table, by name: the schema creates it as `jobs`, a migration as a new table
# it then renames (SQLite cannot change a table's constraints in place). 64-bit
# integers: emulated times in ns pass 2**31 within 2 s.
JOBS_TABLE = """
CREATE TABLE IF NOT EXISTS {name} (
    id                TEXT PRIMARY KEY,
    seq               BIGINT NOT NULL UNIQUE,   -- submission order, assigned by the store
    tenant            TEXT NOT NULL DEFAULT '', -- who submitted it, '' for none (open rack)
    client_request_id TEXT,                     -- NULL for non-idempotent submissions
    state             TEXT NOT NULL,
    priority          BIGINT NOT NULL,          -- copy of spec.priority, for the index
    spec              TEXT NOT NULL,            -- JobSpec as JSON
    sockets           TEXT NOT NULL,            -- JSON list of socket names
    attempts          BIGINT NOT NULL,
    created_s         DOUBLE PRECISION NOT NULL,
    updated_s         DOUBLE PRECISION NOT NULL,
    started_s         DOUBLE PRECISION,         -- wall clock of the last start
    finished_s        DOUBLE PRECISION,         -- wall clock of the terminal state
    emulated_start_ns BIGINT,
    emulated_end_ns   BIGINT,
    result            TEXT,                     -- JSON object or NULL
    error             TEXT NOT NULL,
    -- Idempotency keys are per tenant: one tenant's key never finds another's job.
    UNIQUE (tenant, client_request_id)
)"""

_SCHEMA = (
    JOBS_TABLE.format(name="jobs")
    + """;
-- The scheduler's question: the PENDING jobs, highest priority first, then FIFO.
CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs (state, priority, seq);
-- A tenant's jobs, newest first (ListJobs).
CREATE INDEX IF NOT EXISTS jobs_by_tenant ON jobs (tenant, seq);
CREATE TABLE IF NOT EXISTS events (
    job_id  TEXT NOT NULL REFERENCES jobs (id),
    seq     BIGINT NOT NULL,                    -- 1, 2, 3... within one job
    kind    TEXT NOT NULL,
    payload TEXT NOT NULL,                      -- JSON object
    time_s  DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (job_id, seq)
);
-- The leader's lease (orchestrator/leadership.py), one row per lease name. `epoch`
-- grows by one with each new holder's term and fences its writes. `expires_s` is on
-- the database's clock, so replicas' clocks need not agree. (No semicolons in these
-- comments: the statements are split at them.)
CREATE TABLE IF NOT EXISTS leases (
    name      TEXT PRIMARY KEY,
    holder    TEXT NOT NULL,
    epoch     BIGINT NOT NULL,
    expires_s DOUBLE PRECISION NOT NULL
)
"""
)
# One by one: SQLite's executescript would commit the caller's transaction first, and
# the schema must appear together with its version.
SCHEMA_STATEMENTS = tuple(s for s in _SCHEMA.split(";") if s.strip())

# Version 1 had no tenant and a store-wide unique client_request_id.
V1_COLUMNS = (
    "id, seq, client_request_id, state, priority, spec, sockets, attempts, created_s, "
    "updated_s, started_s, finished_s, emulated_start_ns, emulated_end_ns, result, error"
)
JOB_COLUMNS = "tenant, " + V1_COLUMNS

# Parsed job specs kept for reuse (see JobRows.spec); about 1-2 KB each.
SPEC_CACHE = 10_000


class UnsupportedStoreVersion(RdurackError):
    """The store was written by a newer rdurack whose schema this one does not know."""

    def __init__(self, path: str, found: int, known: int):
        self.path, self.found, self.known = path, found, known
        super().__init__(
            f"job store {path} has schema version {found}; this rdurack knows versions up "
            f"to {known}: run a newer rdurack, or point it at another store"
        )

    def __reduce__(self) -> tuple[type, tuple[str, int, int]]:
        return (type(self), (self.path, self.found, self.known))


def check_version(location: str, found: int) -> None:
    """Refuse a store of a schema newer than this rdurack's (before anything is written)."""
    if found > SCHEMA_VERSION:
        raise UnsupportedStoreVersion(location, found, SCHEMA_VERSION)


def submission(job: Job, next_seq: str) -> tuple[str, tuple[Any, ...]]:
    """The statement that inserts the row of a job just submitted (nothing set yet but
    its submission), its number drawn by the SQL expression `next_seq`, and its
    arguments. It returns the row's `id` and `seq`, or no row, and writes nothing, when
    the job's id or idempotency key is taken: on PostgreSQL by a concurrent submission
    that committed first (the insert waited for it), which the caller then reads."""
    sql = (
        f"INSERT INTO jobs ({JOB_COLUMNS}) "
        f"VALUES (?, ?, {next_seq}, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT DO NOTHING RETURNING id, seq"
    )
    args = (
        job.tenant,
        job.id,
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
    )
    return sql, args


EVENT_COLUMNS = "job_id, seq, kind, payload, time_s"


def first_event(job_id: str) -> str:
    """The statement that inserts a submitted job's first event, its state, number 1,
    for the job whose id the SQL expression `job_id` gives; its arguments are
    first_event_args."""
    return f"INSERT INTO events ({EVENT_COLUMNS}) SELECT {job_id}, 1, 'state', ?, ?"


def first_event_args(job: Job) -> tuple[str, float]:
    """first_event's arguments for `job`: its payload and time."""
    return json.dumps({"state": job.state.value}), job.created_s


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

    def job(self, row: Row) -> Job:
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
