"""Shared test set-up. Importing rdurack first sets Ray's loopback environment; the
certificates of the security tests (tests/support/certs.py), made once per session; the
job store's two databases: a PostgreSQL server (tests/support/postgres.py), started
once per session when a test first asks for it, and `store_location` (and `store`, a
JobStore there), which run a test on each store."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import rdurack  # noqa: F401  (sets RAY_* defaults before any test imports ray)
from rdurack.orchestrator.store import JobStore
from tests.support.certs import RackCerts, make_rack_certs
from tests.support.postgres import PostgresServer

STORES = ("sqlite", "postgresql")


@pytest.fixture(scope="session")
def rack_certs(tmp_path_factory: pytest.TempPathFactory) -> RackCerts:
    return make_rack_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    with PostgresServer.started() as server:
        yield server


@pytest.fixture
def postgres_url(postgres: PostgresServer) -> Iterator[str]:
    """A PostgreSQL database of the test's own, empty."""
    with postgres.database() as url:
        yield url


@pytest.fixture(params=STORES)
def store_location(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where the test's job store lives, once for each store: a SQLite file (its folder
    not made yet: the store makes it), or a PostgreSQL URL of a new database."""
    if request.param == "sqlite":
        return str(tmp_path / "state" / "jobs.sqlite")
    url: str = request.getfixturevalue("postgres_url")
    return url


@pytest.fixture
def store(store_location: str) -> Iterator[JobStore]:
    """A job store on each database (`store_location`), closed after the test."""
    with JobStore(store_location) as s:
        yield s
