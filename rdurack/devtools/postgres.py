"""A throwaway PostgreSQL server: for the tests of the shared job store
(tests/support/postgres.py, tests/conftest.py) and for `make bench`'s SubmitJob figures
on the PostgreSQL store (bench_submit.py).

`PostgresServer.started()`: `initdb` into a new temporary folder, `pg_ctl start` on a
free port of 127.0.0.1 with its unix socket in that folder, a random password (other
users of this machine cannot connect); on exit `pg_ctl stop -m fast` and the folder is
deleted. `database()` makes a database of the caller's own (a test's), and drops it after.

The programs are found on PATH, else in Debian's /usr/lib/postgresql/VERSION/bin (where
the `postgresql` package puts them; `make install` installs it where it is missing).
initdb and postgres refuse to run as root: as root, they run as the `postgres` user
(the Debian package's), else as `nobody`.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from rdurack.devtools.ports import free_port

PROGRAMS = ("initdb", "pg_ctl")
DEBIAN_BINS = "/usr/lib/postgresql/*/bin"
USERS = ("postgres", "nobody")  # as root, the first of these that exists runs the server
START_TRIES = 3  # a free port can be taken by another process before the server binds it
START_WAIT_S = 60  # pg_ctl -w: a loaded machine starts a server slowly
SUPERUSER = "postgres"


def program(name: str) -> str:
    """The path of a PostgreSQL program; fails saying how to install it."""
    found = shutil.which(name)
    if found is None:
        # Debian's binaries are off PATH, one folder per major version: the newest.
        candidates = sorted(glob.glob(f"{DEBIAN_BINS}/{name}"), key=_major, reverse=True)
        found = candidates[0] if candidates else None
    if found is None:
        raise RuntimeError(
            f"PostgreSQL's {name} is neither on PATH nor in {DEBIAN_BINS}: `make install` "
            "installs Debian's postgresql package (apt-get install -y postgresql)"
        )
    return found


def _major(path: str) -> int:
    version = Path(path).parents[1].name  # /usr/lib/postgresql/15/bin/initdb -> 15
    return int(version) if version.isdigit() else 0


def _as_user() -> dict[str, Any]:
    """subprocess arguments that run a program as an unprivileged user when this process
    is root (initdb and postgres refuse root); none otherwise."""
    if os.geteuid() != 0:
        return {}
    for name in USERS:
        with contextlib.suppress(KeyError):
            entry = pwd.getpwnam(name)
            return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
    raise RuntimeError(f"running as root, and none of the users {USERS} exists to run PostgreSQL")


class PostgresServer:
    """A throwaway PostgreSQL server (a test session's, or a benchmark's); see the module
    docstring."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.data = folder / "data"
        self.log = folder / "server.log"
        self.password = secrets.token_hex(16)
        self.port = 0
        self._admin: psycopg.Connection[Any] | None = None
        self._lock = threading.Lock()  # the admin connection is not shared by threads

    @classmethod
    @contextlib.contextmanager
    def started(cls) -> Iterator[PostgresServer]:
        # Not under pytest's tmp_path: its folders are root's and closed to others, and
        # the server's user must reach its own.
        folder = Path(tempfile.mkdtemp(prefix="rdurack-pg-"))
        server = cls(folder)
        try:
            server._initdb()
            server._start()
            yield server
        finally:
            try:
                server._stop()
            finally:
                shutil.rmtree(folder, ignore_errors=True)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{SUPERUSER}:{self.password}@127.0.0.1:{self.port}/{database}"

    @contextlib.contextmanager
    def database(self) -> Iterator[str]:
        """A new empty database, its URL; dropped afterwards (with any connection a
        failed test, or a killed process, left open)."""
        name = f"t_{uuid.uuid4().hex[:16]}"
        self.admin(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        try:
            yield self.url(name)
        finally:
            drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
            self.admin(drop.format(sql.Identifier(name)))

    def admin(self, statement: sql.Composed) -> None:
        """One statement as the superuser, outside a transaction (CREATE DATABASE)."""
        with self._lock:
            if self._admin is None or self._admin.closed:
                self._admin = psycopg.connect(self.url(), autocommit=True)
            self._admin.execute(statement)

    def _run(self, *args: str) -> None:
        done = subprocess.run(
            args, capture_output=True, text=True, cwd=self.folder, **_as_user(), check=False
        )
        if done.returncode != 0:
            log = self.log.read_text()[-2000:] if self.log.exists() else ""
            raise RuntimeError(
                f"{' '.join(args[:2])} failed ({done.returncode}): {done.stderr[-2000:]}{log}"
            )

    def _initdb(self) -> None:
        user = _as_user()
        if user:
            os.chown(self.folder, user["user"], user["group"])
        pwfile = self.folder / "password"
        pwfile.write_text(self.password)
        if user:
            os.chown(pwfile, user["user"], user["group"])
        # --no-sync: a throwaway cluster need not be on disk before it starts (the
        # server itself still flushes every commit). --locale C: no locale to install.
        self._run(
            program("initdb"), "-D", str(self.data), "-U", SUPERUSER, f"--pwfile={pwfile}",
            "--auth=scram-sha-256", "--encoding=UTF8", "--locale=C", "--no-sync",
        )  # fmt: skip
        pwfile.unlink()

    def _start(self) -> None:
        for attempt in range(START_TRIES):
            self.port = free_port()
            options = (
                f"-c listen_addresses=127.0.0.1 -c port={self.port} "
                f"-c unix_socket_directories={self.folder}"
            )
            try:
                self._run(
                    program("pg_ctl"), "start", "-D", str(self.data), "-l", str(self.log),
                    "-w", "-t", str(START_WAIT_S), "-o", options,
                )  # fmt: skip
                return
            except RuntimeError:
                if attempt == START_TRIES - 1:
                    raise

    def _stop(self) -> None:
        with self._lock:
            if self._admin is not None:
                self._admin.close()
        if (self.data / "postmaster.pid").exists():
            self._run(program("pg_ctl"), "stop", "-D", str(self.data), "-m", "fast", "-w")
