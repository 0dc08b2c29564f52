"""The job store's SQLite file: how it is opened (WAL, full sync, its schema version),
and results in the format of rows written before results were models (PostgreSQL
stores began after them: test_store_postgres.py)."""

from __future__ import annotations

import base64
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from rdurack.errors import InvalidRequest
from rdurack.orchestrator.jobs import JobSpec, JobState, KernelWorkload
from rdurack.orchestrator.results import RESULTS, CoeResult, KernelResult, TrainingResult
from rdurack.orchestrator.store import JobStore
from rdurack.orchestrator.store.schema import SCHEMA_VERSION, UnsupportedStoreVersion
from rdurack.rack.kernels import Phase
from rdurack.workloads.coe.report import CoeReport, RequestResult


def spec() -> JobSpec:
    return JobSpec(workload=KernelWorkload(model="llama3-8b", phase=Phase.DECODE))


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "jobs.sqlite"


def test_file_store_uses_wal_and_flushes_it_after_each_commit(db_path: Path) -> None:
    with JobStore(db_path) as store, store._write() as writer:
        assert writer.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        # NORMAL: the COMMIT does not wait for the disk; the group commit fsyncs the WAL
        # after it, outside its lock, before any write of it returns (group_commit.py).
        assert writer.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
    assert store._backend._commits.wal == Path(f"{db_path}-wal")  # type: ignore[attr-defined]
    # WAL is a property of the file: another connection sees it too.
    other = sqlite3.connect(db_path)
    try:
        assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert other.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    finally:
        other.close()


# ------------------------------------------------------------------ opening


def test_a_store_from_a_future_schema_is_refused(db_path: Path) -> None:
    JobStore(db_path).close()
    raw = sqlite3.connect(db_path)
    raw.execute(f"PRAGMA user_version={SCHEMA_VERSION + 6}")
    raw.commit()
    raw.close()
    with pytest.raises(UnsupportedStoreVersion, match=f"schema version {SCHEMA_VERSION + 6}"):
        JobStore(db_path)
    # Refusing it changed nothing.
    raw = sqlite3.connect(db_path)
    assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 6
    raw.close()


def test_a_file_that_is_not_a_database_is_refused(tmp_path: Path) -> None:
    bogus = tmp_path / "jobs.sqlite"
    bogus.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(InvalidRequest, match="cannot open job store"):
        JobStore(bogus)


# ------------------------------------------------------------------ results of old rows

# Results as the code before the result models stored them: json.dumps of a dict. A
# kernel job's had no kind (and tokens_per_s for decode only).
OLD_KERNEL: dict[str, Any] = {
    "emulated_s": 2e-05,
    "kernel_calls": 60,
    "hbm_bandwidth_utilization": 0.5,
    "compute_utilization": 0.25,
}
OLD_COE: dict[str, Any] = {
    "kind": "coe_inference",
    # The engine's report as the old dataclass wrote it: every field, lists for sequences.
    **CoeReport(
        platform="sn40l-rack16",
        decode_plan="fused-ho",
        requests=1,
        emulated_s=0.5,
        switches_per_expert={"expert-0": 1},
        diagnostics=("a pitfall",),
        per_request=(
            RequestResult(
                index=0,
                expert="expert-0",
                replica=1,
                arrival_s=0.0,
                ttft_s=0.1,
                tpot_s=0.01,
                e2e_s=0.3,
                switch_s=0.02,
                hit=False,
                output_tokens=8,
            ),
        ),
        rerouted_requests=1,
        failed_replicas=(0,),
    ).model_dump(mode="json"),
}
OLD_TRAINING: dict[str, Any] = {
    "kind": "training",
    "emulated_s": 1.5,
    "steps_completed": 40,
    "samples_per_s": 1700.0,
    "exposed_allreduce_s": 0.001,
    "step_time_s": 0.03,
    "peak_hbm_bytes": 2**30,
    "diagnostics": [{"code": "replicas-differ", "message": "rank 1 differs", "step": 3}],
    "losses": [2.3, 1.1],
    "memory": {
        "weights": 1,
        "gradients": 2,
        "optimizer": 3,
        "activations": 4,
        "movement": 0,
        "total": 10,
    },
    "compute_s": 0.02,
    "allreduce_s": 0.004,
    "world_size": 2,
    "start_step": 0,
    "checkpoints": ["/ck/ckpt-00000040.pt"],
    "platform": "sn40l-rack16",
    "model": "(client loop)",
    "loop_results": [base64.b64encode(b"\x80\xff+/").decode()] * 2,
    "final_loss": 1.1,
    "test_accuracy": 0.9,
    "strategy": "progressive",
    "hbm_cap_bytes": 128_000,
    "peak_ddr_bytes": 7,
    "socket_memory": [
        {"socket_id": s, "peak_sram_bytes": 0, "peak_hbm_bytes": 2**30, "peak_ddr_bytes": 7}
        for s in ("rdu-n0-s0", "rdu-n0-s1")
    ],
    "stages": [
        {
            "name": "shrink block 1",
            "phase": "shrink",
            "start_step": 0,
            "steps": 20,
            "converged": True,
            "peak_hbm_bytes": 2**30,
            "peak_ddr_bytes": 7,
            "emulated_s": 0.7,
            "block": 1,
            "frozen_at_step": 18,
            "movement": 0.01,
            "final_loss": 1.5,
        }
    ],
}


@pytest.mark.parametrize(
    ("old", "model"),
    [(OLD_KERNEL, KernelResult), (OLD_COE, CoeResult), (OLD_TRAINING, TrainingResult)],
)
def test_a_result_row_in_the_old_format_loads(
    db_path: Path, old: dict[str, Any], model: type[Any]
) -> None:
    """A row and a result event written by the code before the result models (plain
    JSON dicts) load as the models, every key and value kept."""
    with JobStore(db_path) as store:
        store.submit("old", spec())
        store.add_event("old", "result", old)  # as the old code wrote its result event
    raw = sqlite3.connect(db_path)
    raw.execute(
        "UPDATE jobs SET state = 'SUCCEEDED', result = ? WHERE id = 'old'", (json.dumps(old),)
    )
    raw.commit()
    raw.close()
    with JobStore(db_path) as store:
        result = store.get("old").result
        assert isinstance(result, model)
        assert json.loads(result.model_dump_json(exclude_none=True)) == {"kind": "kernel", **old}
        assert RESULTS.validate_python(store.events("old")[-1].payload) == result


def test_a_result_is_stored_and_read_back_as_its_model(store_location: str) -> None:
    """On both stores (tests/conftest.py)."""
    with JobStore(store_location) as store:
        store.submit("none", spec())
        store.transition("none", JobState.CANCELLED)
        for old in (OLD_KERNEL, OLD_COE, OLD_TRAINING):
            result = RESULTS.validate_python(old)
            store.submit(result.kind, spec())
            store.transition(result.kind, JobState.FAILED, error="x", result=result)
    with JobStore(store_location) as store:
        for old in (OLD_KERNEL, OLD_COE, OLD_TRAINING):
            result = RESULTS.validate_python(old)
            assert store.get(result.kind).result == result
        assert store.get("none").result is None
