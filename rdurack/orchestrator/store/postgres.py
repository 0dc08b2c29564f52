"""The shared job store: PostgreSQL, selected with `--store postgresql://...`.

A SQLite file lives on one host's disk, so a second orchestrator replica elsewhere
cannot open it; a PostgreSQL server is reached by every replica over the network. The
tables are the store's one schema (schema.py); this module adds where its version is
kept and how writes made on several connections at once stay apart:
- Each write is one transaction on a pooled connection, and returns after its COMMIT,
  which with `synchronous_commit` on (insisted on below) is after the server flushed it
  to its WAL: durable before the orchestrator acknowledges it. PostgreSQL groups the
  flushes of commits that arrive together itself, so no group commit is needed here.
- Writes lock the job rows they change (`SELECT ... FOR UPDATE`), so two writers of one
  job take turns; submission numbers come from a sequence, so concurrent submissions do
  not contend for MAX(seq) + 1.
- Reads use pooled connections in autocommit: each statement sees what was committed
  when it began.
A server that cannot be reached, or a connection that breaks, is StoreUnavailable
(UNAVAILABLE at the gRPC edge): the client may retry.
"""

from __future__ import annotations

import functools
import select
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

import psycopg
from psycopg.rows import DictRow, dict_row
from psycopg_pool import ConnectionPool

from rdurack.errors import InvalidRequest, StoreUnavailable
from rdurack.orchestrator.jobs import Job
from rdurack.orchestrator.store.schema import (
    SCHEMA_STATEMENTS,
    SCHEMA_VERSION,
    check_version,
    first_event,
    first_event_args,
    submission,
)

# Connections per orchestrator, opened as the load asks (from one): enough that the
# gRPC workers' concurrent calls seldom queue for one, few enough that two replicas (64)
# stay under PostgreSQL's default max_connections of 100 (3 of them kept for
# superusers). A call beyond them waits for a connection (up to POOL_WAIT_S, then
# StoreUnavailable). Waiting is dear in Python: with 64 SubmitJob calls in flight,
# 16 connections sustained 838-900 calls/s, 32 sustained 1,014-1,143 (64: 1,087-1,185),
# the orchestrator's CPU a call 0.98-1.02 ms to 0.79-0.87, over a quarter of it in
# the kernel (futexes: threads handing the interpreter and the pool to each other).
POOL_SIZE = 32
POOL_WAIT_S = 30.0
CONNECT_TIMEOUT_S = 10  # libpq's connect_timeout: a server that does not answer
# pg_advisory_xact_lock key held while the schema is made: replicas that start together
# make it once (concurrent CREATE TABLE IF NOT EXISTS can collide in the catalog).
SCHEMA_LOCK = 0x7264757261636B  # "rdurack"


class PostgresBackend:
    """The store's tables in the PostgreSQL database at `url` (libpq's URL form; a
    password is better in PGPASSWORD or ~/.pgpass, which libpq reads, than in a flag)."""

    lock_rows = " FOR UPDATE"
    # The server's clock, read anew (now() would be the transaction's start).
    clock_s = "EXTRACT(EPOCH FROM clock_timestamp())::DOUBLE PRECISION"
    share_rows = " FOR SHARE"

    def __init__(self, url: str) -> None:
        self.location = redacted(url)
        try:
            # One connection of its own first: a refused connection says why (a pool
            # would retry in the background and only time out).
            with psycopg.connect(url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S) as conn:
                self._open_schema(conn)
        except psycopg.Error as e:
            raise InvalidRequest(f"cannot open job store {self.location}: {_one_line(e)}") from e
        self._pool = ConnectionPool(
            url,
            min_size=1,
            max_size=POOL_SIZE,
            timeout=POOL_WAIT_S,
            kwargs={"autocommit": True, "connect_timeout": CONNECT_TIMEOUT_S},
            configure=_durable,
            check=self._check,
            name="rdurack-job-store",
            open=True,
        )

    @contextmanager
    def write(self) -> Iterator[_Connection]:
        with self._connection() as conn, conn.transaction():
            yield _Connection(conn)

    def submit(self, job: Job) -> int | None:
        # One statement on a connection in autocommit: atomic, and committed (flushed:
        # _durable) when it answers, in one round trip where BEGIN, the sequence, the
        # two inserts and COMMIT took five, about 0.45 ms of a 0.75 ms submission here.
        # The event's foreign key is checked at the statement's end, the job's row in.
        sql, args = submission(job, "nextval('jobs_seq')")
        with self._connection() as conn:
            row = (
                _Connection(conn)
                .execute(
                    f"WITH j AS ({sql}), e AS ({first_event('id')} FROM j) SELECT seq FROM j",
                    (*args, *first_event_args(job)),
                )
                .fetchone()
            )
        return None if row is None else int(row["seq"])

    @contextmanager
    def read(self) -> Iterator[_Connection]:
        with self._connection() as conn:
            yield _Connection(conn)

    def close(self) -> None:
        self._pool.close()

    def _check(self, conn: psycopg.Connection[Any]) -> None:
        """Each connection, before it is handed out: one the server closed (a restart,
        a failover) is replaced rather than failing the call that got it.

        A server that ends a connection says so on it (an error message, then the end
        of the stream), so an idle connection on which nothing arrived since its last
        answer is taken as it is: asking the server (an empty query) was one more round
        trip on every call of the store, a ninth of a submission's. One with something
        to read is asked."""
        if _quiet(conn):
            return
        try:
            ConnectionPool.check_connection(conn)
        except psycopg.OperationalError:
            # What closed this one closed the idle others too. Test them all now: found
            # one at a time, each would add the pool's backoff (none, then 1 s, doubled
            # each time) to the call waiting: six would exceed POOL_WAIT_S.
            self._pool.check()
            raise

    @contextmanager
    def _connection(self) -> Iterator[psycopg.Connection[Any]]:
        try:
            with self._pool.connection() as conn:
                yield conn
        except psycopg.OperationalError as e:  # PoolTimeout is one too
            raise StoreUnavailable(f"job store {self.location}: {_one_line(e)}") from e

    def _open_schema(self, conn: psycopg.Connection[Any]) -> None:
        """Create the schema, or check the one found, in one transaction (PostgreSQL's
        DDL is transactional: the tables appear together with their version)."""
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
            conn.execute("CREATE TABLE IF NOT EXISTS rdurack_schema (version INTEGER NOT NULL)")
            row = conn.execute("SELECT version FROM rdurack_schema").fetchone()
            found = 0 if row is None else int(row[0])
            check_version(self.location, found)
            for statement in SCHEMA_STATEMENTS:
                conn.execute(statement)
            conn.execute("CREATE SEQUENCE IF NOT EXISTS jobs_seq OWNED BY jobs.seq")
            # PostgreSQL stores began at version 2; version 3 only added a table, made
            # above. A later version's step goes here, before the version is written.
            if row is None:
                conn.execute("INSERT INTO rdurack_schema VALUES (%s)", (SCHEMA_VERSION,))
            elif found < SCHEMA_VERSION:
                conn.execute("UPDATE rdurack_schema SET version = %s", (SCHEMA_VERSION,))


class _Connection:
    """A pooled connection as the store's Db: its `?` placeholders as psycopg's `%s`,
    rows by column name."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._conn = conn

    def execute(self, sql: str, args: Sequence[Any] = ()) -> psycopg.Cursor[DictRow]:
        return self._conn.cursor(row_factory=dict_row).execute(_placeholders(sql), args)


@functools.lru_cache(maxsize=256)
def _placeholders(sql: str) -> str:
    # The store's statements hold no other `?` nor any `%`.
    return sql.replace("?", "%s")


def _durable(conn: psycopg.Connection[Any]) -> None:
    """A new pooled connection: with `synchronous_commit` off a COMMIT returns before
    the WAL is flushed, and the store would acknowledge what a crash can lose. Any other
    setting (local, remote_write, on, remote_apply) flushes locally first."""
    row = conn.execute("SHOW synchronous_commit").fetchone()
    if row is not None and row[0] == "off":
        conn.execute("SET synchronous_commit = on")


def _quiet(conn: psycopg.Connection[Any]) -> bool:
    """Whether nothing arrived on an idle connection's socket since its last answer (a
    poll, no round trip)."""
    try:
        readable, _, _ = select.select([conn.fileno()], [], [], 0)
    except (OSError, ValueError, psycopg.Error):  # closed, or no socket at all
        return False
    return not readable


def _one_line(error: Exception) -> str:
    """libpq's message, which may run over lines (a hint below the error), as one."""
    return "; ".join(line.strip() for line in str(error).splitlines() if line.strip())


def redacted(url: str) -> str:
    """`url` for messages and logs: its password, if any, replaced by ***."""
    parts = urlsplit(url)
    user, at, host = parts.netloc.rpartition("@")
    netloc = f"{user.split(':', 1)[0]}:***@{host}" if at and ":" in user else parts.netloc
    query = "&".join(
        "password=***" if q.partition("=")[0] == "password" else q
        for q in parts.query.split("&")
        if q
    )
    # Built by hand: urlunsplit drops the empty host of postgresql:///dbname.
    return f"{parts.scheme}://{netloc}{parts.path}" + (f"?{query}" if query else "")
