"""The job store: every job and its event history in one SQLite file.

A job is written, and the write is on disk, before the orchestrator acknowledges it; a
restarted orchestrator opens the same file, calls `recover()` and carries on with every
job it had. All SQL of the orchestrator lives here and in store_schema.py (the file's
tables, its opening and migration, a row as a Job).

One connection writes for every thread (the gRPC server's workers share the store): a
lock serializes its use, and every write is atomic, so a job row and the event that
records its change are both written or neither is. Writes are group-committed
(group_commit.py): writes that arrive while a commit is on its way to the disk share the
next one, and none returns before its commit does. Reads go through a second connection,
which sees committed data only (WAL); an in-memory store, which has one connection only,
reads through the writer's.
"""

from __future__ import annotations

import builtins
import json
import sqlite3
import threading
import time
from collections.abc import Collection, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from rdurack.errors import InvalidRequest, UnknownName
from rdurack.orchestrator.group_commit import GroupCommit
from rdurack.orchestrator.jobs import Job, JobSpec, JobState
from rdurack.orchestrator.store_schema import (
    JOB_COLUMNS,
    JobRows,
    connect,
    insert_job,
    open_schema,
    result_json,
)

# Job fields `transition` may change. The id, spec, submission order and creation time
# are fixed at submission; the state and update time are set by `Job.moved`.
MUTABLE_FIELDS = frozenset(
    {"sockets", "attempts", "emulated_start_ns", "emulated_end_ns", "result", "error"}
)

RESTART_ERROR = "orchestrator restarted while the job was running (attempt {n} of {m})"


@dataclass(frozen=True)
class Event:
    """One entry of a job's history, replayed by WatchJob."""

    job_id: str
    seq: int  # 1, 2, 3... within the job
    kind: str  # "state" for a transition; other kinds are progress reports
    payload: dict[str, Any]
    time_s: float  # wall clock, seconds


class JobStore:
    """Jobs and their events in SQLite; see the module docstring."""

    def __init__(self, path: str | Path):
        self.path = str(path)
        in_memory = self.path in (":memory:", "")
        if not in_memory:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._db = connect(self.path)
        self._lock = threading.Lock()
        self._commits = GroupCommit(self._db, self._lock)
        self._reader, self._read_lock = self._db, self._lock  # a file's: set below
        self._rows = JobRows()
        try:
            open_schema(self._db, self._write, self.path, in_memory)
            if not in_memory:
                # Opened after the schema exists; WAL is a property of the file, so this
                # connection reads committed data only, without waiting for the writer.
                self._reader, self._read_lock = connect(self.path), threading.Lock()
                self._reader.execute("PRAGMA query_only=ON")
        except sqlite3.DatabaseError as e:  # e.g. "file is not a database"
            self._close()
            raise InvalidRequest(f"cannot open job store {self.path}: {e}") from e
        except BaseException:
            self._close()
            raise

    # ------------------------------------------------------------------ plumbing

    def _write(self) -> AbstractContextManager[sqlite3.Connection]:
        """One atomic write, on disk when the block exits (group_commit.py)."""
        return self._commits.write()

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        # Reads take the reader's lock: a sqlite3 connection is not safe to use from two
        # threads at once.
        with self._read_lock:
            yield self._reader

    def _load(self, db: sqlite3.Connection, job_id: str) -> Job:
        row = db.execute(f"SELECT {JOB_COLUMNS} FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None:
            # No such job. Do not list the accepted ids: a long-lived store has thousands.
            raise UnknownName("job", job_id, accepted=[])
        return self._rows.job(row)

    @staticmethod
    def _append_event(
        db: sqlite3.Connection, job_id: str, kind: str, payload: str, time_s: float
    ) -> int:
        """Append one event (payload already JSON); inside a write transaction, so no
        other writer can take the same next number."""
        (last,) = db.execute(
            "SELECT COALESCE(MAX(seq), 0) FROM events WHERE job_id = ?", (job_id,)
        ).fetchone()
        seq = int(last) + 1
        db.execute(
            "INSERT INTO events (job_id, seq, kind, payload, time_s) VALUES (?, ?, ?, ?, ?)",
            (job_id, seq, kind, payload, time_s),
        )
        return seq

    @staticmethod
    def _move(
        db: sqlite3.Connection, job: Job, state: JobState, reason: str = "", **changes: Any
    ) -> Job:
        """Write `job` moved to `state` and its state event; inside a write transaction."""
        new = job.moved(state, **changes)  # raises IllegalTransition
        # Encode before writing anything, so a result that is not JSON changes nothing.
        sockets = json.dumps(list(new.sockets))
        result = result_json(new.result)
        # Compare-and-set on the state we read: if the row moved meanwhile (another
        # writer), nothing is written and the caller re-reads instead of overwriting.
        done = db.execute(
            "UPDATE jobs SET state = ?, sockets = ?, attempts = ?, updated_s = ?, "
            "started_s = ?, finished_s = ?, "
            "emulated_start_ns = ?, emulated_end_ns = ?, result = ?, error = ? "
            "WHERE id = ? AND state = ?",
            (
                new.state.value,
                sockets,
                new.attempts,
                new.updated_s,
                new.started_s,
                new.finished_s,
                new.emulated_start_ns,
                new.emulated_end_ns,
                result,
                new.error,
                job.id,
                job.state.value,
            ),
        )
        if done.rowcount != 1:
            raise _StateChanged
        payload: dict[str, Any] = {"state": new.state.value, "previous": job.state.value}
        if "sockets" in changes:
            payload["sockets"] = list(new.sockets)
        if new.error and new.error != job.error:
            payload["error"] = new.error
        if reason:
            payload["reason"] = reason
        JobStore._append_event(db, job.id, "state", json.dumps(payload), new.updated_s)
        return new

    # ------------------------------------------------------------------ API

    def submit(
        self, job_id: str, spec: JobSpec, client_request_id: str | None = None, tenant: str = ""
    ) -> tuple[Job, bool]:
        """Store a new PENDING job of `tenant`; (job, True). A client request id the same
        tenant used before: (its job, False). Another tenant's ids are never seen."""
        with self._write() as db:
            if client_request_id is not None:
                row = db.execute(
                    f"SELECT {JOB_COLUMNS} FROM jobs WHERE tenant = ? AND client_request_id = ?",
                    (tenant, client_request_id),
                ).fetchone()
                if row is not None:
                    existing = self._rows.job(row)
                    if existing.spec != spec:
                        raise InvalidRequest(
                            f"client_request_id {client_request_id!r} was used for a "
                            f"different job spec (job {existing.id}); use a new request id "
                            "for a new job"
                        )
                    return existing, False  # a retried request: the job it already made
            if db.execute("SELECT 1 FROM jobs WHERE id = ?", (job_id,)).fetchone():
                raise InvalidRequest(f"job id {job_id!r} is already in the store")
            # Jobs are never deleted, so MAX + 1 only grows; the write lock makes it unique.
            (last,) = db.execute("SELECT COALESCE(MAX(seq), 0) FROM jobs").fetchone()
            job = Job(
                id=job_id,
                spec=spec,
                seq=int(last) + 1,
                client_request_id=client_request_id,
                tenant=tenant,
            )
            insert_job(db, job)
            first = json.dumps({"state": job.state.value})
            self._append_event(db, job.id, "state", first, job.created_s)
        return job, True

    def get(self, job_id: str) -> Job:
        with self._read() as db:
            return self._load(db, job_id)

    def list(
        self, states: Collection[JobState] | None = None, tenant: str | None = None
    ) -> builtins.list[Job]:
        """Every job (or those in `states`, of `tenant`) in submission order."""
        where: builtins.list[str] = []
        args: tuple[str, ...] = ()
        if states is not None:
            if not states:
                return []
            args = tuple(JobState(s).value for s in states)
            where.append(f"state IN ({', '.join('?' * len(args))})")
        if tenant is not None:
            where.append("tenant = ?")
            args += (tenant,)
        query = f"SELECT {JOB_COLUMNS} FROM jobs"
        if where:
            query += " WHERE " + " AND ".join(where)
        with self._read() as db:
            rows = db.execute(query + " ORDER BY seq", args).fetchall()
        return [self._rows.job(r) for r in rows]

    def any_queued(self) -> bool:
        """Whether any job is PENDING (one index lookup, no job read)."""
        with self._read() as db:
            row = db.execute(
                "SELECT 1 FROM jobs WHERE state = ? LIMIT 1", (JobState.PENDING.value,)
            ).fetchone()
        return row is not None

    def queued_lazily(self, page: int = 64) -> Iterator[Job]:
        """The PENDING jobs in `queued` order, read a page at a time as they are taken:
        a scheduling round that fills the free sockets early reads a page or two, not a
        queue of thousands (each a Job to build). Pages are read at different moments: a
        job queued meanwhile ahead of the position reached waits for the next round."""
        after: tuple[int, int] | None = None  # (priority, seq) of the last job yielded
        while True:
            query = f"SELECT {JOB_COLUMNS} FROM jobs WHERE state = ?"
            args: tuple[str | int, ...] = (JobState.PENDING.value,)
            if after is not None:
                query += " AND (priority < ? OR (priority = ? AND seq > ?))"
                args += (after[0], after[0], after[1])
            with self._read() as db:
                cursor = db.execute(query + " ORDER BY priority DESC, seq LIMIT ?", (*args, page))
                rows = cursor.fetchall()
            for row in rows:
                yield self._rows.job(row)
            if len(rows) < page:
                return
            after = (rows[-1]["priority"], rows[-1]["seq"])

    def queued_ids(self) -> set[str]:
        """The ids of every PENDING job (no job read)."""
        with self._read() as db:
            rows = db.execute("SELECT id FROM jobs WHERE state = ?", (JobState.PENDING.value,))
            return {r["id"] for r in rows.fetchall()}

    def queued(self) -> builtins.list[Job]:
        """PENDING jobs in the order the scheduler should consider them."""
        with self._read() as db:
            rows = db.execute(
                f"SELECT {JOB_COLUMNS} FROM jobs WHERE state = ? ORDER BY priority DESC, seq",
                (JobState.PENDING.value,),
            ).fetchall()
        return [self._rows.job(r) for r in rows]

    def transition(self, job_id: str, state: JobState, *, reason: str = "", **changes: Any) -> Job:
        """Move a job to `state` (with `changes` to its mutable fields) and record the event.

        Raises IllegalTransition when the table forbids the move, UnknownName for no such
        job; in both cases nothing is written. `reason` goes into the event only.
        """
        unknown = sorted(set(changes) - MUTABLE_FIELDS)
        if unknown:
            raise InvalidRequest(
                f"a transition cannot change {', '.join(unknown)}; it may change: "
                f"{', '.join(sorted(MUTABLE_FIELDS))}"
            )
        if "sockets" in changes:
            changes["sockets"] = tuple(changes["sockets"])
        while True:
            try:
                with self._write() as db:
                    return self._move(db, self._load(db, job_id), state, reason, **changes)
            except _StateChanged:
                # Another writer moved the job between our read and our write (only
                # possible from another process: the lock and IMMEDIATE serialize this
                # one). Re-read: the move may now be illegal, and `moved` will say so.
                continue

    def add_event(self, job_id: str, kind: str, payload: dict[str, Any]) -> int:
        """Append a progress event to a job's history; returns its seq."""
        text = json.dumps(payload)  # fail before writing if it is not JSON
        with self._write() as db:
            self._load(db, job_id)  # UnknownName for no such job
            return self._append_event(db, job_id, kind, text, time.time())

    def events(self, job_id: str, after: int = 0) -> builtins.list[Event]:
        """The job's events with seq > `after`, oldest first."""
        with self._read() as db:
            rows = db.execute(
                "SELECT seq, kind, payload, time_s FROM events "
                "WHERE job_id = ? AND seq > ? ORDER BY seq",
                (job_id, after),
            ).fetchall()
            if not rows:
                self._load(db, job_id)  # no events, or no such job?
        return [
            Event(job_id, r["seq"], r["kind"], json.loads(r["payload"]), r["time_s"]) for r in rows
        ]

    def recover(
        self, policy: Literal["retry", "fail"] = "retry", max_attempts: int = 3
    ) -> builtins.list[Job]:
        """At orchestrator start: settle every job a crash left SCHEDULED or RUNNING.

        SCHEDULED jobs never started: back to PENDING with their placement undone.
        RUNNING jobs lost their run: PENDING again if `policy` is "retry" and they have
        been started fewer than `max_attempts` times, else FAILED. Returns the changed jobs.
        """
        if policy not in ("retry", "fail"):
            raise InvalidRequest(f"unknown recovery policy {policy!r}; accepted: retry, fail")
        if max_attempts < 1:
            raise InvalidRequest(f"max_attempts must be at least 1, not {max_attempts}")
        changed: builtins.list[Job] = []
        # One transaction: a crash during recovery leaves every job as it was, and the
        # next start recovers them all again.
        with self._write() as db:
            rows = db.execute(
                f"SELECT {JOB_COLUMNS} FROM jobs WHERE state IN (?, ?) ORDER BY seq",
                (JobState.SCHEDULED.value, JobState.RUNNING.value),
            ).fetchall()
            for job in map(self._rows.job, rows):
                if job.state is JobState.SCHEDULED:
                    new = self._move(
                        db,
                        job,
                        JobState.PENDING,
                        sockets=(),
                        reason="orchestrator restarted before the job started; "
                        "its placement was undone",
                    )
                else:
                    why = RESTART_ERROR.format(n=job.attempts, m=max_attempts)
                    if policy == "retry" and job.attempts < max_attempts:
                        # Its emulated times belonged to the lost run; the event log keeps
                        # the history.
                        new = self._move(
                            db,
                            job,
                            JobState.PENDING,
                            reason=f"{why}; retrying",
                            sockets=(),
                            emulated_start_ns=None,
                            emulated_end_ns=None,
                        )
                    else:
                        new = self._move(
                            db,
                            job,
                            JobState.FAILED,
                            error=why,
                            reason="retries exhausted"
                            if policy == "retry"
                            else "recovery policy is fail",
                        )
                changed.append(new)
        return changed

    def close(self) -> None:
        self._close()

    def _close(self) -> None:
        with self._lock:
            self._db.close()
        if self._reader is not self._db:
            with self._read_lock:
                self._reader.close()

    def __enter__(self) -> JobStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _StateChanged(Exception):
    """Internal: the compare-and-set in `_move` found the job in another state."""
