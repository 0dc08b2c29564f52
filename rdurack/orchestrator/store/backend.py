"""What the job store needs of a database: the seam between its one logic (jobstore.py)
and the two databases it runs on (sqlite.py, postgres.py).

The store's logic writes its SQL once, with `?` placeholders, in the SQL both databases
speak; a backend runs it. What differs between them is here as data or a method: how a
write is made atomic and durable, how concurrent writers are kept apart, how a
submission is written (its number drawn, in as few round trips as the database allows),
and how the schema is opened (each backend's module).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from rdurack.orchestrator.jobs import Job


class Row(Protocol):
    """A result row, its columns by name (sqlite3.Row, or psycopg's dict row)."""

    def __getitem__(self, key: str, /) -> Any: ...


class Cursor(Protocol):
    """What a statement returns."""

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...  # a Row or None

    def fetchall(self) -> list[Any]: ...  # Rows


class Db(Protocol):
    """A connection as the store uses it: SQL with `?` placeholders."""

    def execute(self, sql: str, args: Sequence[Any] = (), /) -> Cursor: ...


class Backend(Protocol):
    """A database holding the store's tables (schema.py), opened and at SCHEMA_VERSION."""

    # Where the store is, for messages: a file path, or a URL without its password.
    location: str
    # Appended to a write's SELECT of the job rows it is about to change. Where writers
    # run concurrently (PostgreSQL: several connections, several replicas) it locks
    # those rows until the write commits; SQLite serializes every write anyway.
    lock_rows: str
    # An expression for the database's clock, in seconds since the epoch: leases expire
    # on it, so that replicas on hosts whose clocks differ agree on when.
    clock_s: str
    # Appended to a fenced write's SELECT of the lease row: where writers run
    # concurrently it keeps the lease from changing hands until the write commits
    # (PostgreSQL: FOR SHARE; SQLite serializes every write anyway).
    share_rows: str

    def write(self) -> AbstractContextManager[Db]:
        """One atomic write: everything the block executes is committed, and durable,
        when the block exits, or none of it is (the block's exception propagates)."""
        ...

    def submit(self, job: Job) -> int | None:
        """Insert `job`, just submitted, and its first event, as one atomic write,
        durable when this returns: its submission number (the next), or None, and
        nothing written, when its id or idempotency key is taken (schema.submission)."""
        ...

    def read(self) -> AbstractContextManager[Db]:
        """A connection that sees committed data only."""
        ...

    def close(self) -> None: ...
