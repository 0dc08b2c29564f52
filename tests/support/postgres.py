"""The tests' throwaway PostgreSQL server: rdurack/devtools/postgres.py, which `make
bench` uses too (one piece of code; the bench, in the package, cannot import tests/)."""

from __future__ import annotations

from rdurack.devtools.postgres import PostgresServer

__all__ = ["PostgresServer"]
