"""Benchmarks of the control plane: a rack brought up as `rdu up` does (Ray head, two node
agents x 8 sockets, the orchestrator, each its own process), then gRPC clients.

- "rdu up to ready": wall seconds from `local_rack.up` to the orchestrator serving;
  floor: the same processes started the same way with nothing of rdurack's services in
  them (bench_up_floor.py), each on its own Ray, the two taking turns UPS times (the
  floor first), the median of each. Target: 10 s, held on the value.
- "jobs scheduled per second": a batch of small jobs (1-socket llama2-7b prefill of 128
  tokens) is submitted; the figure is the batch size over the wall time from the first
  submission until no job of the batch is PENDING any more.
- "cluster CoE requests per wall second": one CoE job serving a Poisson load in timing
  mode, requests over the wall time from its submission to its end; floor: the same
  load on the serving engine in process (bench_predictor.engine_rate, the median of
  3), which prices what the sockets run without the cluster around it, so the ratio is
  the share of the engine's speed the cluster keeps. Target: 200 requests/s, held on
  the value.
- SubmitJob latencies from 50 closed-loop clients, 1,000 submissions from 100 clients,
  100 WatchJob streams: the load bench_load.py puts on the same rack, after the figures
  above, while the rack runs what they queued. (SubmitJob and WatchJob beside their
  floors, on both stores: bench_submit.py.)
"""

from __future__ import annotations

import itertools
import statistics
import tempfile
import time
from pathlib import Path

from rdurack.api.server import channel
from rdurack.devtools import bench_load, bench_up_floor
from rdurack.devtools.bench_figure import BenchFigure
from rdurack.devtools.bench_load import RPC_TIMEOUT_S
from rdurack.devtools.bench_loadgen import small_job
from rdurack.devtools.bench_predictor import COE_RATE_PER_S, engine_rate
from rdurack.devtools.bench_rack_floors import ups_in_turns
from rdurack.devtools.ports import free_port
from rdurack.errors import RdurackError
from rdurack.processes import local_rack
from rdurack.processes.rack_record import RackProcesses
from rdurack.v1 import common_pb2, job_pb2, job_pb2_grpc

BATCH = 200
BATCH_DEADLINE_S = 120.0
COE_REQUESTS = 2000
UP_TARGET_S = 10.0
# Bring-ups of each, in turns: with one of each, the ratio was 1.12-1.40 in three runs
# of `make bench` on one evening (the floor first, then the rack, seconds apart).
UPS = 3
COE_TARGET_PER_S = 200.0


def _pending(stub: job_pb2_grpc.JobServiceStub, ids: set[str]) -> int:
    """How many of `ids` are still PENDING."""
    pending = 0
    token = ""
    while True:
        page = stub.ListJobs(
            job_pb2.ListJobsRequest(
                states=[common_pb2.JOB_STATE_PENDING], page_size=500, page_token=token
            ),
            timeout=RPC_TIMEOUT_S,
        )
        pending += sum(j.id in ids for j in page.jobs)
        token = page.next_page_token
        if not token or not page.jobs:
            return pending


def _scheduling_rate(address: str) -> BenchFigure:
    with channel(address) as ch:
        stub = job_pb2_grpc.JobServiceStub(ch)
        stub.SubmitJob(small_job("warm-up"), timeout=RPC_TIMEOUT_S)
        start = time.perf_counter()
        ids = {
            stub.SubmitJob(small_job(f"batch {i}"), timeout=RPC_TIMEOUT_S).job.id
            for i in range(BATCH)
        }
        deadline = time.monotonic() + BATCH_DEADLINE_S
        while _pending(stub, ids):
            if time.monotonic() > deadline:
                raise RdurackError(f"jobs still PENDING {BATCH_DEADLINE_S:g} s after submission")
            time.sleep(0.02)
        elapsed = time.perf_counter() - start
    return BenchFigure("jobs scheduled per second", BATCH / elapsed, "jobs/s", None, "higher")


def _coe_rate(address: str, requests: int = COE_REQUESTS) -> BenchFigure:
    """Emulated CoE requests the cluster completes per wall second, timing mode: one job
    serving a Poisson load on both nodes (two TP8 replicas), from submission to its end.
    The load outruns the rack (400 arrivals per emulated second), so batches are full."""
    spec = job_pb2.JobSpec(
        name="bench coe",
        coe_inference=job_pb2.CoeInferenceJob(
            num_experts=150,
            num_sockets=16,
            poisson=job_pb2.PoissonLoad(
                requests=requests, rate_per_s=COE_RATE_PER_S, skew=1.0, seed=1
            ),
        ),
    )
    with channel(address) as ch:
        stub = job_pb2_grpc.JobServiceStub(ch)
        start = time.perf_counter()
        job = stub.SubmitJob(job_pb2.SubmitJobRequest(spec=spec), timeout=RPC_TIMEOUT_S).job
        for _ in stub.WatchJob(job_pb2.WatchJobRequest(job_id=job.id), timeout=BATCH_DEADLINE_S):
            pass
        elapsed = time.perf_counter() - start
        done = stub.GetJob(job_pb2.GetJobRequest(job_id=job.id), timeout=RPC_TIMEOUT_S).job
    if done.state != common_pb2.JOB_STATE_SUCCEEDED:
        raise RdurackError(f"the CoE job ended {done.state}: {done.error_message}")
    served = done.result.coe_inference.requests
    return BenchFigure(
        "cluster CoE requests per wall second (timing mode)",
        served / elapsed,
        "requests/s",
        COE_TARGET_PER_S,
        "higher",
        floor=statistics.median(engine_rate(requests) for _ in range(3)),
        absolute=True,
    )


def bench_control() -> list[BenchFigure]:
    with tempfile.TemporaryDirectory(prefix="rdurack-bench-") as tmp:
        racks = itertools.count()

        def up() -> tuple[float, RackProcesses]:
            start = time.perf_counter()
            rack = local_rack.up(Path(tmp) / f"rack-{next(racks)}", port=free_port())
            return time.perf_counter() - start, rack

        def down(rack: RackProcesses) -> None:
            local_rack.down(rack.state_dir)

        # The floor on its own Ray, while no rack is up.
        ups, floors, rack = ups_in_turns(bench_up_floor.up_s, up, down, UPS)
        try:  # the figures below on the last rack brought up
            figures = [_coe_rate(rack.orchestrator)]  # first: an idle rack
            figures.append(_scheduling_rate(rack.orchestrator))
            figures += bench_load.submit_latency(rack.orchestrator)
            # The figures added later run after those, with their jobs still queued
            # (the rack runs some 20 small jobs per second): the watched jobs go first
            # by priority, so that they run while watched.
            figures += bench_load.watch_streams(rack.orchestrator)
            figures += bench_load.many_submissions(rack.orchestrator)
        finally:
            down(rack)
    up_s, floor = statistics.median(ups), statistics.median(floors)
    up_figure = BenchFigure(
        "rdu up to ready", up_s, "s", UP_TARGET_S, "lower", floor, absolute=True
    )
    return [up_figure, *figures]
