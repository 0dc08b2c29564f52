"""The job store: every job and its event history, in SQLite or PostgreSQL.

A job is written, and the write is durable, before the orchestrator acknowledges it; a
restarted orchestrator, or a replica that takes over as leader, opens the same store,
calls `recover()` and carries on with every job it had. Every write is atomic, so a job
row and the event that records its change are both written or neither is.

This is the store's one logic, and its SQL, for both databases; what differs between
them (connections, commits, concurrent writers, the schema's opening) is a Backend
(backend.py): sqlite.py, the default, a file on this host; postgres.py, a server that
several orchestrator replicas share. `JobStore(where)` picks one by `where`.

The leader's lease is kept here too (lease.py): `claim_lease`, `release_lease`. A
leader writes through `fenced(term, ...)`, a view of the store whose every write but a
submission (any replica accepts those) first checks, in its own transaction, that the
lease still carries the leader's term, and records the term in the state events it
writes.
"""

from __future__ import annotations

import builtins
import copy
import json
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from rdurack.errors import InvalidRequest, NotLeader, RdurackError, UnknownName
from rdurack.orchestrator.jobs import Job, JobSpec, JobState
from rdurack.orchestrator.store import lease as leases
from rdurack.orchestrator.store.backend import Backend, Db
from rdurack.orchestrator.store.lease import Lease, Term
from rdurack.orchestrator.store.schema import EVENT_COLUMNS, JOB_COLUMNS, JobRows, result_json
from rdurack.orchestrator.store.sqlite import SqliteBackend

# Job fields `transition` may change. The id, spec, submission order and creation time
# are fixed at submission; the state and update time are set by `Job.moved`.
MUTABLE_FIELDS = frozenset(
    {"sockets", "attempts", "emulated_start_ns", "emulated_end_ns", "result", "error"}
)

RESTART_ERROR = "orchestrator restarted while the job was running (attempt {n} of {m})"

URL_SCHEMES = ("postgresql://", "postgres://")  # libpq's two spellings
# A submission whose insert found its id or key taken reads again; the second reading
# finds the job that took it (PostgreSQL: the insert waited for its commit).
SUBMIT_TRIES = 3


def is_url(where: str | Path) -> bool:
    """Whether a store location names a PostgreSQL server (else it is a SQLite path)."""
    return isinstance(where, str) and where.startswith(URL_SCHEMES)


def open_backend(where: str | Path) -> Backend:
    """The database at `where`: a postgresql:// URL, else a SQLite file path."""
    if is_url(where):
        # Imported here: psycopg and libpq take a tenth of a second to load, and the
        # default store does not need them.
        from rdurack.orchestrator.store.postgres import PostgresBackend

        return PostgresBackend(str(where))
    return SqliteBackend(where)


@dataclass(frozen=True)
class Event:
    """One entry of a job's history, replayed by WatchJob."""

    job_id: str
    seq: int  # 1, 2, 3... within the job
    kind: str  # "state" for a transition; other kinds are progress reports
    payload: dict[str, Any]
    time_s: float  # wall clock, seconds


class JobStore:
    """Jobs and their events in the store at `where`; see the module docstring."""

    def __init__(self, where: str | Path):
        self._backend = open_backend(where)
        self.location = self._backend.location
        self._rows = JobRows()
        # Set on a fenced view only (`fenced`): the term its writes belong to, and
        # whether its replica still leads in it by its own clock.
        self._term: Term | None = None
        self._leading: Callable[[Term], bool] = lambda term: True

    def fenced(self, term: Term, leading: Callable[[Term], bool]) -> JobStore:
        """This store as a leader's `term` writes to it: each write first checks that
        `leading(term)` (the replica's own clock says its term has not lapsed) and then,
        in the write's transaction, that the lease still carries `term`; else it raises
        NotLeader and writes nothing. State events it writes record the term's epoch.
        The view shares this store's database: closing this store closes it."""
        view = copy.copy(self)
        view._term, view._leading = term, leading
        return view

    # ------------------------------------------------------------------ plumbing

    @contextmanager
    def _write(self) -> Iterator[Db]:
        """One atomic write, durable when the block exits; fenced on a fenced view."""
        term = self._term
        if term is not None and not self._leading(term):
            raise NotLeader(f"replica {term.holder}: its term {term.epoch} as leader has lapsed")
        with self._backend.write() as db:
            if term is not None:
                leases.check(db, self._backend, term)
            yield db

    @contextmanager
    def _read(self) -> Iterator[Db]:
        """Committed data only."""
        with self._backend.read() as db:
            yield db

    def _load(self, db: Db, job_id: str, lock: str = "") -> Job:
        row = db.execute(f"SELECT {JOB_COLUMNS} FROM jobs WHERE id = ?{lock}", (job_id,)).fetchone()
        if row is None:
            # No such job. Do not list the accepted ids: a long-lived store has thousands.
            raise UnknownName("job", job_id, accepted=[])
        return self._rows.job(row)

    def _locked(self, db: Db, job_id: str) -> Job:
        """The job, read inside a write to change it: no other writer changes it until
        this write commits."""
        return self._load(db, job_id, self._backend.lock_rows)

    @staticmethod
    def _append_event(db: Db, job_id: str, kind: str, payload: str, time_s: float) -> int:
        """Append one event (payload already JSON) as the job's next; inside a write that
        locked the job, so no other writer can take the same number. (A job's first
        event is written with it: schema.first_event.)"""
        last = db.execute(
            "SELECT COALESCE(MAX(seq), 0) AS last FROM events WHERE job_id = ?", (job_id,)
        ).fetchone()["last"]
        seq = int(last) + 1
        db.execute(
            f"INSERT INTO events ({EVENT_COLUMNS}) VALUES (?, ?, ?, ?, ?)",
            (job_id, seq, kind, payload, time_s),
        )
        return seq

    def _move(self, db: Db, job: Job, state: JobState, reason: str = "", **changes: Any) -> Job:
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
        if self._term is not None:
            payload["term"] = self._term.epoch  # which leader's term wrote it
        self._append_event(db, job.id, "state", json.dumps(payload), new.updated_s)
        return new

    # ------------------------------------------------------------------ API

    def submit(
        self, job_id: str, spec: JobSpec, client_request_id: str | None = None, tenant: str = ""
    ) -> tuple[Job, bool]:
        """Store a new PENDING job of `tenant`; (job, True). A client request id the same
        tenant used before: (its job, False). Another tenant's ids are never seen."""
        for _ in range(SUBMIT_TRIES):
            if client_request_id is not None:
                existing = self._requested(tenant, client_request_id)
                if existing is not None:
                    if existing.spec != spec:
                        raise InvalidRequest(
                            f"client_request_id {client_request_id!r} was used for a "
                            f"different job spec (job {existing.id}); use a new request id "
                            "for a new job"
                        )
                    return existing, False  # a retried request: the job it already made
            job = Job(id=job_id, spec=spec, client_request_id=client_request_id, tenant=tenant)
            seq = self._backend.submit(job)
            if seq is not None:
                return replace(job, seq=seq), True
            # Its id was taken (asked only now: a submission's round trips are its
            # latency on PostgreSQL), or a concurrent submission took the request id
            # and has committed (the backend's write returns only then): read again.
            with self._read() as db:
                if db.execute("SELECT 1 FROM jobs WHERE id = ?", (job_id,)).fetchone():
                    raise InvalidRequest(f"job id {job_id!r} is already in the store")
        raise RdurackError(f"job {job_id!r}: its submission kept colliding; submit it again")

    def _requested(self, tenant: str, client_request_id: str) -> Job | None:
        """The job `tenant` submitted with this idempotency key, if any (committed)."""
        with self._read() as db:
            row = db.execute(
                f"SELECT {JOB_COLUMNS} FROM jobs WHERE tenant = ? AND client_request_id = ?",
                (tenant, client_request_id),
            ).fetchone()
        return None if row is None else self._rows.job(row)

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
                    return self._move(db, self._locked(db, job_id), state, reason, **changes)
            except _StateChanged:
                # Another writer moved the job between our read and our write (neither
                # SQLite's IMMEDIATE nor PostgreSQL's row lock lets one, but the write
                # must not overwrite if one did). Re-read: the move may now be illegal,
                # and `moved` will say so.
                continue

    def add_event(self, job_id: str, kind: str, payload: dict[str, Any]) -> int:
        """Append a progress event to a job's history; returns its seq."""
        text = json.dumps(payload)  # fail before writing if it is not JSON
        with self._write() as db:
            self._locked(db, job_id)  # UnknownName for no such job
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

    def cancelled(self, job_ids: Collection[str]) -> set[str]:
        """Which of `job_ids` are CANCELLED (by any replica)."""
        ids = tuple(job_ids)
        if not ids:
            return set()
        with self._read() as db:
            rows = db.execute(
                f"SELECT id FROM jobs WHERE state = ? AND id IN ({', '.join('?' * len(ids))})",
                (JobState.CANCELLED.value, *ids),
            ).fetchall()
        return {r["id"] for r in rows}

    # ------------------------------------------------------------------ the lease

    def claim_lease(self, holder: str, ttl_s: float, term: Term | None = None) -> Lease:
        """Renew `term`, or start a term of `holder` if the lease is free (lease.py);
        the lease as it is afterwards, whoever holds it."""
        with self._backend.write() as db:
            return leases.claim(db, self._backend, holder, ttl_s, term)

    def release_lease(self, term: Term) -> None:
        """End `term` now if the lease still carries it."""
        with self._backend.write() as db:
            leases.release(db, self._backend, term)

    def lease(self) -> Lease:
        with self._backend.read() as db:
            return leases.read(db, self._backend)

    def recover(
        self, policy: Literal["retry", "fail"] = "retry", max_attempts: int = 3
    ) -> builtins.list[Job]:
        """When a replica's term as leader begins (at an orchestrator's start, or a
        takeover): settle every job the previous leader left SCHEDULED or RUNNING.

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
                f"SELECT {JOB_COLUMNS} FROM jobs WHERE state IN (?, ?) ORDER BY seq"
                + self._backend.lock_rows,
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
        self._backend.close()

    def __enter__(self) -> JobStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _StateChanged(Exception):
    """Internal: the compare-and-set in `_move` found the job in another state."""
