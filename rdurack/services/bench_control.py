"""Benchmarks of the control plane: a rack brought up as `rdu up` does (Ray head, two node
agents x 8 sockets, the orchestrator, each its own process), then gRPC clients.

- "rdu up to ready": wall seconds from `local_rack.up` to the orchestrator serving.
- "jobs scheduled per second": a batch of small jobs (1-socket llama2-7b prefill of 128
  tokens) is submitted; the figure is the batch size over the wall time from the first
  submission until no job of the batch is PENDING any more.
- "cluster CoE requests per wall second": one CoE job serving a Poisson load in timing
  mode, requests over the wall time from its submission to its end.
- SubmitJob latency p50 and p99: 50 client threads, each with its own channel, submit
  small jobs back to back for a few seconds.

The clients run in this process, on the same machine as the rack: latencies include
their own share of the CPU.
"""

from __future__ import annotations

import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path

import grpc

from rdurack.rack.errors import RdurackError
from rdurack.services import local_rack
from rdurack.services.bench_figure import BenchFigure
from rdurack.services.grpc_server import channel
from rdurack.v1 import common_pb2, job_pb2, job_pb2_grpc

CLIENTS = 50
LATENCY_S = 4.0
BATCH = 200
BATCH_DEADLINE_S = 120.0
RPC_TIMEOUT_S = 10.0
COE_REQUESTS = 2000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _small_job(name: str) -> job_pb2.SubmitJobRequest:
    return job_pb2.SubmitJobRequest(
        spec=job_pb2.JobSpec(
            name=name,
            kernel=job_pb2.KernelJob(
                model="llama2-7b",
                phase=common_pb2.PHASE_PREFILL,
                sequence_length=128,
                batch_size=1,
                num_sockets=1,
            ),
        )
    )


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
        stub.SubmitJob(_small_job("warm-up"), timeout=RPC_TIMEOUT_S)
        start = time.perf_counter()
        ids = {
            stub.SubmitJob(_small_job(f"batch {i}"), timeout=RPC_TIMEOUT_S).job.id
            for i in range(BATCH)
        }
        deadline = time.monotonic() + BATCH_DEADLINE_S
        while _pending(stub, ids):
            if time.monotonic() > deadline:
                raise RdurackError(f"jobs still PENDING {BATCH_DEADLINE_S:g} s after submission")
            time.sleep(0.02)
        elapsed = time.perf_counter() - start
    return BenchFigure("jobs scheduled per second", BATCH / elapsed, "jobs/s", None, "higher")


def _submit_latency(address: str) -> list[BenchFigure]:
    latencies: list[list[float]] = [[] for _ in range(CLIENTS)]
    errors: list[str] = []
    ready = threading.Barrier(CLIENTS + 1)
    stop = threading.Event()

    def client(i: int) -> None:
        with channel(address) as ch:
            stub = job_pb2_grpc.JobServiceStub(ch)
            try:
                stub.SubmitJob(_small_job(f"client {i} warm-up"), timeout=RPC_TIMEOUT_S)
            except grpc.RpcError as e:
                errors.append(str(e))
            ready.wait(timeout=60)
            n = 0
            while not stop.is_set():
                t = time.perf_counter()
                try:
                    stub.SubmitJob(_small_job(f"client {i} #{n}"), timeout=RPC_TIMEOUT_S)
                except grpc.RpcError as e:
                    errors.append(str(e))
                    return
                latencies[i].append(time.perf_counter() - t)
                n += 1

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    ready.wait(timeout=60)
    time.sleep(LATENCY_S)
    stop.set()
    for t in threads:
        t.join(timeout=RPC_TIMEOUT_S + 5)
    if errors:
        raise RdurackError(f"{len(errors)} SubmitJob calls failed; the first: {errors[0]}")
    all_ms = sorted(1e3 * s for per in latencies for s in per)
    if len(all_ms) < 100:
        raise RdurackError(f"only {len(all_ms)} SubmitJob calls completed in {LATENCY_S:g} s")
    q = statistics.quantiles(all_ms, n=100)
    return [
        BenchFigure(f"SubmitJob latency p50, {CLIENTS} clients", q[49], "ms", None, "lower"),
        BenchFigure(f"SubmitJob latency p99, {CLIENTS} clients", q[98], "ms", 25.0, "lower"),
        BenchFigure(
            f"SubmitJob calls per second, {CLIENTS} clients",
            len(all_ms) / LATENCY_S,
            "calls/s",
            None,
            "higher",
        ),
    ]


def _coe_rate(address: str, requests: int = COE_REQUESTS) -> BenchFigure:
    """Emulated CoE requests the cluster completes per wall second, timing mode: one job
    serving a Poisson load on both nodes (two TP8 replicas), from submission to its end.
    The load outruns the rack (400 arrivals per emulated second), so batches are full."""
    spec = job_pb2.JobSpec(
        name="bench coe",
        coe_inference=job_pb2.CoeInferenceJob(
            num_experts=150,
            num_sockets=16,
            poisson=job_pb2.PoissonLoad(requests=requests, rate_per_s=400.0, skew=1.0, seed=1),
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
        200,
        "higher",
    )


def bench_control() -> list[BenchFigure]:
    with tempfile.TemporaryDirectory(prefix="rdurack-bench-") as tmp:
        state = Path(tmp)
        start = time.perf_counter()
        rack = local_rack.up(state, port=_free_port())
        try:
            figures = [
                BenchFigure("rdu up to ready", time.perf_counter() - start, "s", 10.0, "lower")
            ]
            figures.append(_coe_rate(rack.orchestrator))  # first: an idle rack
            figures.append(_scheduling_rate(rack.orchestrator))
            figures += _submit_latency(rack.orchestrator)
            return figures
        finally:
            local_rack.down(state)
