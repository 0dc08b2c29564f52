"""The servers the SubmitJob and WatchJob figures load (bench_submit.py), each in
processes of its own: the bare floor server (bench_floor.py), and a rack brought up as
`rdu up` does, whose sockets can be held so that what is submitted queues.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import psutil

from rdurack.devtools.ports import free_port
from rdurack.errors import RdurackError
from rdurack.processes import children, local_rack
from rdurack.v1 import common_pb2, job_pb2, job_pb2_grpc

READY_S = 60.0
RPC_TIMEOUT_S = 10.0
# The rack's 16 sockets held by two endpoint jobs of 8 (held()): a model that fits 8.
HOLD_MODEL, HOLD_SOCKETS, HOLD_JOBS = "llama2-7b", 8, 2


@contextlib.contextmanager
def floor_server(store: str, logs: Path) -> Iterator[str]:
    """The bare server of bench_floor.py on `store`, its own process; its address."""
    proc = children.spawn(
        "floor", "rdurack.devtools.bench_floor", ["--store", store], logs, os.environ
    )
    try:
        ready = children.await_ready({"floor": (proc, "floor")}, logs, time.monotonic() + READY_S)
        yield ready["floor"]
    finally:
        children.stop(psutil.Process(proc.pid), wait_s=10)


@contextlib.contextmanager
def rack(state: Path, store: str = "") -> Iterator[str]:
    """A rack as `rdu up` brings it up (Ray head, two node agents x 8 sockets, the
    orchestrator, each its own process) on `store` (empty: SQLite in `state`); the
    orchestrator's address."""
    up = local_rack.up(state, port=free_port(), store=store)
    try:
        yield up.orchestrator
    finally:
        local_rack.down(state)


@contextlib.contextmanager
def held(address: str) -> Iterator[None]:
    """Every socket of the rack at `address` held, for the block, by endpoint jobs
    (which hold their sockets, idle, until cancelled): what is submitted meanwhile
    queues instead of running. Cancelled after the block."""
    with grpc.insecure_channel(address) as ch:
        stub = job_pb2_grpc.JobServiceStub(ch)
        ids = [_hold(stub, i) for i in range(HOLD_JOBS)]
        deadline = time.monotonic() + READY_S
        while not all(_state(stub, i) == common_pb2.JOB_STATE_RUNNING for i in ids):
            if time.monotonic() > deadline:
                raise RdurackError(f"the rack's hold jobs were not running {READY_S:g} s after")
            time.sleep(0.1)
        try:
            yield
        finally:
            for i in ids:
                stub.CancelJob(job_pb2.CancelJobRequest(job_id=i), timeout=RPC_TIMEOUT_S)


def _hold(stub: job_pb2_grpc.JobServiceStub, i: int) -> str:
    endpoint = job_pb2.EndpointJob(model=HOLD_MODEL, num_sockets=HOLD_SOCKETS)
    spec = job_pb2.JobSpec(name=f"bench hold {i}", endpoint=endpoint)
    request = job_pb2.SubmitJobRequest(spec=spec)
    return stub.SubmitJob(request, timeout=RPC_TIMEOUT_S).job.id


def _state(stub: job_pb2_grpc.JobServiceStub, job_id: str) -> int:
    request = job_pb2.GetJobRequest(job_id=job_id)
    return int(stub.GetJob(request, timeout=RPC_TIMEOUT_S).job.state)


@contextlib.contextmanager
def pg_password(password: str) -> Iterator[None]:
    """PGPASSWORD set for the processes started meanwhile (libpq reads it), so that the
    password is not in their arguments, which `ps` shows."""
    before = os.environ.get("PGPASSWORD")
    os.environ["PGPASSWORD"] = password
    try:
        yield
    finally:
        if before is None:
            del os.environ["PGPASSWORD"]
        else:
            os.environ["PGPASSWORD"] = before


def without_password(url: str) -> str:
    """A postgresql://USER:PASSWORD@HOST... URL without its password."""
    scheme, _, rest = url.partition("://")
    user_password, _, host = rest.rpartition("@")
    return f"{scheme}://{user_password.partition(':')[0]}@{host}"
