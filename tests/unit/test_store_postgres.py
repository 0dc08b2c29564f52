"""What only the PostgreSQL store has: its schema version in a table, opened once by
replicas that start together, durable commits insisted on, connections the server
closed replaced, a server out of reach refused or UNAVAILABLE, passwords kept out of
messages. Its behaviour as a store is test_store.py's, which runs on both stores."""

from __future__ import annotations

import contextlib
import threading

import grpc
import psycopg
import pytest
from psycopg_pool import ConnectionPool

from rdurack.api.status import status_of
from rdurack.errors import InvalidRequest, StoreUnavailable
from rdurack.orchestrator.jobs import JobSpec, KernelWorkload
from rdurack.orchestrator.store import JobStore
from rdurack.orchestrator.store import postgres as pg
from rdurack.orchestrator.store.postgres import redacted
from rdurack.orchestrator.store.schema import SCHEMA_VERSION, UnsupportedStoreVersion
from rdurack.rack.kernels import Phase
from tests.support.ports import free_port
from tests.support.postgres import PostgresServer


def spec() -> JobSpec:
    return JobSpec(workload=KernelWorkload(model="llama3-8b", phase=Phase.DECODE))


def sql(url: str, statement: str) -> list[tuple[object, ...]]:
    """One statement on a connection of its own (not the store's); its rows."""
    with psycopg.connect(url, autocommit=True) as conn:
        cursor = conn.execute(statement.encode())  # bytes: a literal statement
        return cursor.fetchall() if cursor.description else []


def test_a_store_from_a_future_schema_is_refused_without_its_password(postgres_url: str) -> None:
    JobStore(postgres_url).close()
    assert sql(postgres_url, "SELECT version FROM rdurack_schema") == [(SCHEMA_VERSION,)]
    sql(postgres_url, f"UPDATE rdurack_schema SET version = {SCHEMA_VERSION + 6}")
    with pytest.raises(UnsupportedStoreVersion, match=f"version {SCHEMA_VERSION + 6}") as info:
        JobStore(postgres_url)
    password = psycopg.conninfo.conninfo_to_dict(postgres_url)["password"]
    assert isinstance(password, str) and password not in str(info.value)
    assert ":***@127.0.0.1" in str(info.value)
    # Refusing it changed nothing.
    assert sql(postgres_url, "SELECT version FROM rdurack_schema") == [(SCHEMA_VERSION + 6,)]


def test_replicas_that_start_together_make_the_schema_once(postgres_url: str) -> None:
    barrier = threading.Barrier(4)
    opened: list[JobStore] = []
    errors: list[BaseException] = []

    def start() -> None:
        barrier.wait()
        try:
            opened.append(JobStore(postgres_url))
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=start) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    try:
        assert errors == [] and len(opened) == 4
        assert sql(postgres_url, "SELECT version FROM rdurack_schema") == [(SCHEMA_VERSION,)]
        opened[0].submit("j1", spec())
        assert [j.id for j in opened[3].list()] == ["j1"]
    finally:
        for store in opened:
            store.close()


def test_commits_are_durable_even_where_the_database_says_otherwise(postgres_url: str) -> None:
    sql(postgres_url, f'ALTER DATABASE "{database(postgres_url)}" SET synchronous_commit = off')
    assert sql(postgres_url, "SHOW synchronous_commit") == [("off",)]
    with JobStore(postgres_url) as store, store._write() as db:
        assert db.execute("SHOW synchronous_commit").fetchone()["synchronous_commit"] == "on"


def database(url: str) -> str:
    name = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
    assert isinstance(name, str)
    return name


def terminate(server: PostgresServer, url: str) -> None:
    """End every connection to the database of `url`, and wait until they are gone."""
    sql(
        server.url(),  # from another database: this one may refuse connections
        "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity "
        f"WHERE datname = '{database(url)}'",
    )


def test_connections_the_server_closed_are_replaced(
    postgres: PostgresServer, postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Replaced all at once: one at a time, the pool's backoff between them (0, 1 s,
    # 2 s, 4 s) would exceed this wait with four.
    monkeypatch.setattr(pg, "POOL_WAIT_S", 2.5)
    with JobStore(postgres_url) as store:
        store.submit("j1", spec())
        with contextlib.ExitStack() as held:  # four connections in the pool, idle after
            for _ in range(4):
                held.enter_context(store._read()).execute("SELECT 1")
        terminate(postgres, postgres_url)  # as a server restart would
        for _ in range(4):
            assert store.get("j1").id == "j1"
        store.submit("j2", spec())
        assert [j.id for j in store.list()] == ["j1", "j2"]


def test_a_connection_with_nothing_from_the_server_is_handed_out_without_asking_it(
    postgres: PostgresServer, postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[object] = []
    real_check = ConnectionPool.check_connection

    def counted(conn: psycopg.Connection[object]) -> None:
        asked.append(conn)
        real_check(conn)

    monkeypatch.setattr(ConnectionPool, "check_connection", staticmethod(counted))
    with JobStore(postgres_url) as store:
        store.submit("j1", spec())
        for _ in range(3):
            assert store.get("j1").id == "j1"
        assert asked == []  # no round trip before each call
        terminate(postgres, postgres_url)  # the server says so on every connection
        assert store.get("j1").id == "j1"  # on a new connection
        assert asked  # the ended one was asked, and replaced


def test_a_server_that_cannot_be_reached_is_unavailable(
    postgres: PostgresServer, postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pg, "POOL_WAIT_S", 0.5)  # not the 30 s a real call waits
    with JobStore(postgres_url) as store:
        store.submit("j1", spec())
        sql(postgres.url(), f'ALTER DATABASE "{database(postgres_url)}" ALLOW_CONNECTIONS false')
        terminate(postgres, postgres_url)
        with pytest.raises(StoreUnavailable, match="job store postgresql://") as info:
            store.get("j1")
        assert status_of(info.value) is grpc.StatusCode.UNAVAILABLE


def test_a_store_that_cannot_be_opened_is_refused_without_its_password() -> None:
    url = f"postgresql://someone:s3cret@127.0.0.1:{free_port()}/jobs"
    with pytest.raises(InvalidRequest, match="cannot open job store") as info:
        JobStore(url)
    assert "s3cret" not in str(info.value) and "someone:***@127.0.0.1" in str(info.value)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://u:pw@db:5432/jobs", "postgresql://u:***@db:5432/jobs"),
        ("postgresql://u@db/jobs", "postgresql://u@db/jobs"),
        ("postgres://db/jobs?password=pw&sslmode=require", "postgres://db/jobs?password=***&sslmode=require"),
        ("postgresql:///jobs", "postgresql:///jobs"),
    ],
)  # fmt: skip
def test_a_password_is_never_shown(url: str, shown: str) -> None:
    assert redacted(url) == shown
