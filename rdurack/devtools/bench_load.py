"""The load the control-plane benchmarks put on an orchestrator (bench_control.py
brings the rack up and reads the figures): small jobs, sent by many concurrent client
threads, each with its own channel.

- SubmitJob latency p50 and p99, 50 clients (closed loop): 50 client threads, each with
  its own channel, submit small jobs back to back for a few seconds. Each client waits
  for its answer before sending again, so this measures the orchestrator at saturation:
  the latency is about clients / throughput, whatever the server does per call.
  No target: SubmitJob's latency at a given offered load, beside its floor, is
  bench_submit.py's (open loop, from a load generator in another process).
- 1,000 submissions from 100 clients (issue 10): 100 client threads, each with its own
  connected channel, submit 10 jobs each back to back, all starting together. Timed from
  the start to the last answer: errors (failed calls), latency p99, submissions/s.
- 100 WatchJob streams (issue 10): 100 jobs are submitted (priority 1: ahead of the jobs
  the earlier figures left queued), then 100 client threads, each
  with its own connected channel, open a WatchJob stream on one job each, all at once,
  and read it to its end. Figures: errors (streams that failed or did not end with the
  job finished); p99 of the time from opening a stream to its first event; p99 of the
  event delivery latency, from the orchestrator recording a change (the event's time)
  to a stream receiving it, over the events recorded after their stream opened;
  events delivered per second over all streams.

The clients run in this process, on the same machine as the rack: latencies include
their own share of the CPU.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable

import grpc

from rdurack.api.server import channel
from rdurack.devtools.bench_figure import BenchFigure
from rdurack.devtools.bench_loadgen import small_job
from rdurack.errors import RdurackError
from rdurack.v1 import common_pb2, job_pb2, job_pb2_grpc

CLIENTS = 50
LATENCY_S = 4.0
DEADLINE_S = 120.0  # for a client thread, or a WatchJob stream, to end
RPC_TIMEOUT_S = 10.0
LOAD_CLIENTS = 100  # issue 10: concurrent clients and WatchJob streams
LOAD_SUBMISSIONS = 1000
CONNECT_TIMEOUT_S = 30.0


def _timed_submit(stub: job_pb2_grpc.JobServiceStub, name: str, errors: list[str]) -> float | None:
    """One SubmitJob of a small job: its latency (s), or None with the error in `errors`."""
    t = time.perf_counter()
    try:
        stub.SubmitJob(small_job(name), timeout=RPC_TIMEOUT_S)
    except grpc.RpcError as e:
        errors.append(str(e))
        return None
    return time.perf_counter() - t


def _quantile(values_ms: list[float], q: int) -> float:
    """The q-th percentile (1..99) of at least two values."""
    return statistics.quantiles(values_ms, n=100)[q - 1]


def _connected(address: str) -> grpc.Channel:
    """A channel already connected to `address`, so timing starts with no handshake."""
    ch = channel(address)
    grpc.channel_ready_future(ch).result(timeout=CONNECT_TIMEOUT_S)
    return ch


def _together(count: int, body: Callable[[int, threading.Barrier], None]) -> float:
    """Run body(i, start) on `count` threads; each calls start.wait() when ready, and the
    clock starts when all have. Returns the wall seconds from then until all ended."""
    start = threading.Barrier(count + 1)
    threads = [threading.Thread(target=body, args=(i, start), daemon=True) for i in range(count)]
    for t in threads:
        t.start()
    start.wait(timeout=CONNECT_TIMEOUT_S * 2)
    began = time.perf_counter()
    for t in threads:
        t.join(timeout=DEADLINE_S)
    if any(t.is_alive() for t in threads):
        raise RdurackError(f"clients still running {DEADLINE_S:g} s after the start")
    return time.perf_counter() - began


def submit_latency(address: str) -> list[BenchFigure]:
    """Closed loop: 50 clients back to back (module docstring)."""
    latencies: list[list[float]] = [[] for _ in range(CLIENTS)]
    errors: list[str] = []
    ready = threading.Barrier(CLIENTS + 1)
    stop = threading.Event()

    def client(i: int) -> None:
        with channel(address) as ch:
            stub = job_pb2_grpc.JobServiceStub(ch)
            try:
                stub.SubmitJob(small_job(f"client {i} warm-up"), timeout=RPC_TIMEOUT_S)
            except grpc.RpcError as e:
                errors.append(str(e))
            ready.wait(timeout=60)
            n = 0
            while not stop.is_set():
                took = _timed_submit(stub, f"client {i} #{n}", errors)
                if took is None:
                    return
                latencies[i].append(took)
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
        BenchFigure(f"SubmitJob latency p99, {CLIENTS} clients", q[98], "ms", None, "lower"),
        BenchFigure(
            f"SubmitJob calls per second, {CLIENTS} clients",
            len(all_ms) / LATENCY_S,
            "calls/s",
            None,
            "higher",
        ),
    ]


def many_submissions(address: str) -> list[BenchFigure]:
    """Issue 10: 1,000 submissions from 100 clients, 10 each back to back."""
    per_client = LOAD_SUBMISSIONS // LOAD_CLIENTS
    latencies: list[float] = []
    errors: list[str] = []

    def client(i: int, start: threading.Barrier) -> None:
        with _connected(address) as ch:
            stub = job_pb2_grpc.JobServiceStub(ch)
            start.wait(timeout=CONNECT_TIMEOUT_S * 2)
            for n in range(per_client):
                took = _timed_submit(stub, f"load {i} #{n}", errors)
                if took is not None:
                    latencies.append(took)

    elapsed = _together(LOAD_CLIENTS, client)
    what = f"{LOAD_SUBMISSIONS:,} submissions from {LOAD_CLIENTS} clients"
    all_ms = [1e3 * s for s in latencies]
    return [
        BenchFigure(f"{what}: errors", len(errors), "calls", 0, "lower"),
        BenchFigure(f"{what}: latency p99", _quantile(all_ms, 99), "ms", None, "lower"),
        BenchFigure(f"{what}: throughput", len(all_ms) / elapsed, "calls/s", None, "higher"),
    ]


def watch_streams(address: str) -> list[BenchFigure]:
    """Issue 10: 100 WatchJob streams, one per job, opened at once (module docstring)."""
    with _connected(address) as ch:
        stub = job_pb2_grpc.JobServiceStub(ch)
        jobs = [
            stub.SubmitJob(small_job(f"watched {i}", priority=1), timeout=RPC_TIMEOUT_S).job.id
            for i in range(LOAD_CLIENTS)
        ]
    first_ms: list[float] = []
    delivery_ms: list[float] = []
    received = [0] * LOAD_CLIENTS  # events per stream
    errors: list[str] = []

    def watcher(i: int, start: threading.Barrier) -> None:
        with _connected(address) as ch:
            stub = job_pb2_grpc.JobServiceStub(ch)
            start.wait(timeout=CONNECT_TIMEOUT_S * 2)
            opened, opened_wall = time.perf_counter(), time.time()
            last = common_pb2.JOB_STATE_UNSPECIFIED
            try:
                request = job_pb2.WatchJobRequest(job_id=jobs[i])
                for n, event in enumerate(stub.WatchJob(request, timeout=DEADLINE_S)):
                    got_wall = time.time()
                    received[i] += 1
                    if n == 0:
                        first_ms.append(1e3 * (time.perf_counter() - opened))
                    recorded = event.time.ToMicroseconds() * 1e-6
                    if recorded >= opened_wall:  # a live event, not replayed history
                        delivery_ms.append(1e3 * (got_wall - recorded))
                    if event.HasField("state_change"):
                        last = event.state_change.to_state
            except grpc.RpcError as e:
                errors.append(f"{jobs[i]}: {e.code().name if isinstance(e, grpc.Call) else e}")
                return
            if last != common_pb2.JOB_STATE_SUCCEEDED:
                errors.append(f"{jobs[i]}: the stream ended in state {last}")

    elapsed = _together(LOAD_CLIENTS, watcher)
    what = f"{LOAD_CLIENTS} WatchJob streams"
    if len(first_ms) < 2 or len(delivery_ms) < 2:
        raise RdurackError(f"{what}: too few events ({len(delivery_ms)}); errors: {errors[:3]}")
    return [
        BenchFigure(f"{what}: errors", len(errors), "streams", 0, "lower"),
        BenchFigure(f"{what}: first event p99", _quantile(first_ms, 99), "ms", None, "lower"),
        BenchFigure(
            f"{what}: event delivery latency p99", _quantile(delivery_ms, 99), "ms", None, "lower"
        ),
        BenchFigure(
            f"{what}: events delivered per second",
            sum(received) / elapsed,
            "events/s",
            None,
            "higher",
        ),
    ]
