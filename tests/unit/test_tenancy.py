"""Tenants as plain data: the job store's tenant column (and its migration from version
1), the scheduler's quota allowance, and the orchestrator's ownership checks."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from rdurack.errors import InvalidRequest, PermissionDenied, QuotaExceeded, UnknownName
from rdurack.orchestrator.jobs import Job, JobSpec, JobState, KernelWorkload
from rdurack.orchestrator.orchestrator import Orchestrator
from rdurack.orchestrator.results import KernelResult
from rdurack.orchestrator.scheduler import Scheduler
from rdurack.orchestrator.store import JobStore
from rdurack.orchestrator.store.schema import SCHEMA_VERSION
from rdurack.rack.kernels import Phase
from tests.support.fake_rack import RACK, FakeGateway

# Version 1 of the store, as rdurack 0.1.0 wrote it (store.py before tenants).
V1_SCHEMA = """
CREATE TABLE jobs (
    id TEXT PRIMARY KEY, seq INTEGER NOT NULL UNIQUE, client_request_id TEXT UNIQUE,
    state TEXT NOT NULL, priority INTEGER NOT NULL, spec TEXT NOT NULL,
    sockets TEXT NOT NULL, attempts INTEGER NOT NULL, created_s REAL NOT NULL,
    updated_s REAL NOT NULL, started_s REAL, finished_s REAL, emulated_start_ns INTEGER,
    emulated_end_ns INTEGER, result TEXT, error TEXT NOT NULL
);
CREATE INDEX jobs_by_state ON jobs (state, priority, seq);
CREATE TABLE events (
    job_id TEXT NOT NULL REFERENCES jobs (id), seq INTEGER NOT NULL, kind TEXT NOT NULL,
    payload TEXT NOT NULL, time_s REAL NOT NULL, PRIMARY KEY (job_id, seq)
);
PRAGMA user_version=1;
"""


def spec(sockets: int = 4) -> JobSpec:
    return JobSpec(
        workload=KernelWorkload(model="llama2-7b", phase=Phase.DECODE, num_sockets=sockets)
    )


def test_a_version_1_store_is_migrated_with_its_jobs_and_events(tmp_path: Path) -> None:
    path = tmp_path / "jobs.sqlite"
    raw = sqlite3.connect(path)
    raw.executescript(V1_SCHEMA)
    raw.execute(
        "INSERT INTO jobs VALUES ('old1', 1, 'req-1', 'SUCCEEDED', 0, ?, '[]', 1, 1.0, 2.0,"
        " 1.5, 2.0, 0, 10, '{\"emulated_s\": 1e-08}', '')",
        (spec().model_dump_json(),),
    )
    raw.execute("INSERT INTO events VALUES ('old1', 1, 'state', '{\"state\": \"PENDING\"}', 1.0)")
    raw.commit()
    raw.close()

    with JobStore(path) as store:
        old = store.get("old1")
        assert (old.tenant, old.state, old.client_request_id) == ("", JobState.SUCCEEDED, "req-1")
        assert old.result == KernelResult(emulated_s=1e-08) and store.events("old1")[0].seq == 1
        # Idempotency keys are per tenant now: another tenant may use "req-1".
        new, created = store.submit("new1", spec(), "req-1", tenant="alice")
        assert created and new.seq == 2 and new.tenant == "alice"
        again, created = store.submit("x", spec(), "req-1")  # the open rack's own key
        assert not created and again.id == "old1"
        assert [j.id for j in store.list(tenant="alice")] == ["new1"]
        assert [j.id for j in store.list(tenant="")] == ["old1"]
    raw = sqlite3.connect(path)
    # 1 -> 2 gave jobs a tenant; 2 -> 3 added the leader's lease table.
    assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 3
    indexes = {r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type='index'")}
    assert {"jobs_by_state", "jobs_by_tenant"} <= indexes
    tables = {r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert "leases" in tables
    raw.close()
    with JobStore(path) as store:  # a second open migrates nothing more
        assert [j.id for j in store.list()] == ["old1", "new1"]
        # Foreign keys are enforced again, on the connection that writes.
        with pytest.raises(sqlite3.IntegrityError), store._write() as db:
            db.execute("INSERT INTO events VALUES ('nope', 1, 'state', '{}', 1.0)")


def test_the_scheduler_keeps_each_tenant_within_its_allowance() -> None:
    s = Scheduler(2, 8)
    queued = [
        Job("a1", spec(8), seq=1, tenant="alice"),
        Job("a2", spec(4), seq=2, tenant="alice"),
        Job("b1", spec(4), seq=3, tenant="bob"),
        Job("c1", spec(2), seq=4),  # no tenant, no quota
    ]
    placed = {p.job_id for p in s.schedule(queued, busy=(), allowance={"alice": 10, "bob": 3})}
    # alice: 8 fit her 10, then 4 more would be 12; bob's 4 exceed his 3.
    assert placed == {"a1", "c1"}
    assert s.skips == {}  # held back by a quota is not being overtaken: no draining
    placed = {p.job_id for p in s.schedule(queued[1:], busy=(), allowance={"alice": 4})}
    assert placed == {"a2", "b1", "c1"}


def test_ownership_and_quota_in_the_orchestrator(tmp_path: Path) -> None:
    gateway = FakeGateway()
    gateway.gate.clear()  # keep jobs running
    o = Orchestrator(
        JobStore(tmp_path / "jobs.sqlite"), gateway, RACK, poll_s=0.05, quotas={"bob": 4}
    )
    try:
        job, _ = o.submit(spec(2), tenant="alice")
        assert o.get(job.id).tenant == "alice" and o.get(job.id, "alice").id == job.id
        with pytest.raises(PermissionDenied) as theirs:
            o.get(job.id, "bob")
        with pytest.raises(PermissionDenied) as missing:
            o.get("no-such-job", "bob")
        assert str(theirs.value).replace(job.id, "?") == str(missing.value).replace(
            "no-such-job", "?"
        )
        with pytest.raises(UnknownName):  # unscoped (admin, open rack): plain NOT_FOUND
            o.get("no-such-job")
        with pytest.raises(PermissionDenied):
            o.cancel(job.id, "mine now", tenant="bob")
        assert o.get(job.id).state is JobState.PENDING
        with pytest.raises(PermissionDenied):
            next(o.watch(job.id, tenant="bob"))
        assert o.jobs(tenant="bob") == [] and [j.id for j in o.jobs(tenant="alice")] == [job.id]
        with pytest.raises(QuotaExceeded, match=r"'bob': a job of 8 sockets .* quota of 4"):
            o.submit(spec(8), tenant="bob")
        with pytest.raises(InvalidRequest):  # validation still comes first
            o.submit(spec(17), tenant="bob")
    finally:
        gateway.gate.set()
        o.stop()
        o.store.close()
