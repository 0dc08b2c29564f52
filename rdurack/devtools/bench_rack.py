"""Benchmarks of the data plane: a real rack of 2 node agents x 8 socket actors.

Wall-clock figures on a shared 2-core machine are noisy: each figure is the median of
a few runs after a warm-up, and the table prints it beside its target.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import psutil
import ray

from rdurack.devtools.bench_figure import BenchFigure
from rdurack.node_agent.actors import start_ray
from rdurack.node_agent.agent import NodeAgent, start_rack
from rdurack.rack.presets import platform

JOB = "bench"
RUNS = 3


def _median(run: Callable[[], float], runs: int = RUNS) -> float:
    run()  # warm-up: first gRPC connections, first numpy buffers
    return statistics.median(run() for _ in range(runs))


def _rack_pss_bytes() -> int:
    """Proportional set size of this process and every process it started (Ray's GCS,
    raylet and socket workers): shared pages are counted once across them."""
    me = psutil.Process()
    total = 0
    for proc in [me, *me.children(recursive=True)]:
        try:
            total += proc.memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return total


def bench_rack() -> list[BenchFigure]:
    started = time.monotonic()
    start_ray()
    rack = platform("sn40l-rack16")
    agents = start_rack(rack)
    bring_up = time.monotonic() - started
    idle_pss = _rack_pss_bytes()  # the rack itself, before any payload is put on it
    try:
        for a in agents:
            a.reserve(JOB, a.socket_ids)
        figures = [
            BenchFigure("wall time to bring up 16 ready sockets", bring_up, "s", 8.0, "lower"),
            _link_throughput(agents[0]),
            _functional_all_reduce(agents, sorted(s for a in agents for s in a.socket_ids)),
            BenchFigure("memory of the whole rack, idle (PSS)", idle_pss / 1e9, "GB", 3.0, "lower"),
        ]
        # After the transfers: the sockets keep freed payload buffers for reuse
        # (node_agent/heap.py), and this shows what that holds, with the benchmark's
        # tensors (64 MB on two sockets, 16 MB on each) still in place.
        busy_pss = _rack_pss_bytes()
        figures.append(
            BenchFigure(
                "memory of the whole rack after the transfers (PSS)",
                busy_pss / 1e9,
                "GB",
                3.0,
                "lower",
            )
        )
        return figures
    finally:
        for a in agents:
            a.stop()
        ray.shutdown()


def _link_throughput(agent: NodeAgent) -> BenchFigure:
    """64 MB streamed from one socket actor to another over their gRPC link."""
    pair = agent.socket_ids[:2]
    payload = np.ones(16_000_000, dtype=np.float32)  # 64 MB
    for sid in pair:
        agent.put_tensor(JOB, sid, "link", payload)
    counter = iter(range(1_000_000))

    def run() -> float:
        t = time.perf_counter()
        agent.collective(JOB, "send", f"link-{next(counter)}", pair, tensor="link", root=pair[0])
        return time.perf_counter() - t

    seconds = _median(run)
    return BenchFigure(
        "streamed link throughput, 64 MB", payload.nbytes / seconds / 1e9, "GB/s", 0.8, "higher"
    )


def _functional_all_reduce(agents: list[NodeAgent], ids: list[str]) -> BenchFigure:
    """Functional ring all-reduce of 16 MB of float32 across all 16 sockets."""
    data = np.ones(4_000_000, dtype=np.float32)  # 16 MB
    for a in agents:
        for sid in a.socket_ids:
            a.put_tensor(JOB, sid, "ar", data)
    counter = iter(range(1_000_000))

    def run() -> float:
        tag = f"ar-{next(counter)}"
        t = time.perf_counter()
        with ThreadPoolExecutor(len(agents)) as pool:
            futures = [
                pool.submit(
                    a.collective, JOB, "all_reduce", tag, ids, tensor="ar", algorithm="ring"
                )
                for a in agents
            ]
            for f in futures:
                f.result()
        return time.perf_counter() - t

    return BenchFigure(
        "functional ring all-reduce, 16 MB across 16 sockets", _median(run), "s", 0.6, "lower"
    )
