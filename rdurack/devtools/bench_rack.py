"""Benchmarks of the data plane: a real rack of 2 node agents x 8 socket actors.

Wall-clock figures on a shared 2-core machine are noisy: each figure is the median of
several runs (after a warm-up, where there is one to make), beside its floor measured
in the same run, the two taking turns (bench_rack_floors.py), and its target is a ratio
to that floor: bring-up at most 2x its floor, link throughput at least 0.8x, the
all-reduce at most 1.5x. The rack's memory has no floor and keeps its absolute target.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import psutil
import ray

from rdurack.devtools import bench_rack_floors as floors
from rdurack.devtools.bench_figure import BenchFigure
from rdurack.node_agent.actors import start_ray
from rdurack.node_agent.agent import NodeAgent
from rdurack.node_agent.in_process import start_rack
from rdurack.rack.presets import platform

JOB = "bench"
LINK_BYTES = 64_000_000  # 64 MB of float32
ALL_REDUCE_ELEMENTS = 4_000_000  # 16 MB of float32
BRING_UPS = 3


def rack_pss_bytes() -> int:
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


def _up() -> tuple[float, list[NodeAgent]]:
    """Ray and the rack's node agents started, every socket ready: (wall seconds, the
    agents)."""
    started = time.monotonic()
    start_ray()
    agents = start_rack(platform("sn40l-rack16"))
    return time.monotonic() - started, agents


def _down(agents: list[NodeAgent]) -> None:
    for a in agents:
        a.stop()
    ray.shutdown()


def bench_rack() -> list[BenchFigure]:
    # The bring-up and its floor take turns, BRING_UPS times each, the floor once more
    # after the last rack is down (the median of each): one bring-up moved 20% between
    # two runs.
    bring_ups, floor_ups, agents = floors.ups_in_turns(floors.bring_up_s, _up, _down, BRING_UPS)
    idle_pss = rack_pss_bytes()  # the rack itself, before any payload is put on it
    try:
        for a in agents:
            a.reserve(JOB, a.socket_ids)
        send = _link_run(agents[0])
        all_reduce_run = _all_reduce_run(agents, sorted(s for a in agents for s in a.socket_ids))
        send()
        all_reduce_run()
        # After the transfers, before the floors start their own actors: the sockets
        # keep freed payload buffers for reuse (node_agent/heap.py), and this shows what
        # that holds, with the benchmark's tensors (64 MB on two sockets, 16 MB on each)
        # still in place.
        busy_pss = rack_pss_bytes()
        with floors.link(LINK_BYTES) as bare_send:
            link_s, link_floor_s = floors.alternate(send, bare_send)
        with floors.ring(ALL_REDUCE_ELEMENTS) as bare_ring:
            all_reduce, all_reduce_floor = floors.alternate(all_reduce_run, bare_ring)
    finally:
        _down(agents)
    floor_ups.append(floors.bring_up_s())
    return [
        BenchFigure(
            "wall time to bring up 16 ready sockets",
            statistics.median(bring_ups),
            "s",
            2.0,
            "lower",
            floor=statistics.median(floor_ups),
        ),
        BenchFigure(
            "streamed link throughput, 64 MB",
            LINK_BYTES / link_s / 1e9,
            "GB/s",
            0.8,
            "higher",
            floor=LINK_BYTES / link_floor_s / 1e9,
        ),
        BenchFigure(
            "functional ring all-reduce, 16 MB across 16 sockets",
            all_reduce,
            "s",
            1.5,
            "lower",
            floor=all_reduce_floor,
        ),
        BenchFigure("memory of the whole rack, idle (PSS)", idle_pss / 1e9, "GB", 3.0, "lower"),
        BenchFigure(
            "memory of the whole rack after the transfers (PSS)",
            busy_pss / 1e9,
            "GB",
            3.0,
            "lower",
        ),
    ]


def _link_run(agent: NodeAgent) -> Callable[[], float]:
    """A run of the link figure: wall seconds to stream 64 MB from one socket actor to
    another over their gRPC link."""
    pair = agent.socket_ids[:2]
    payload = np.ones(LINK_BYTES // 4, dtype=np.float32)
    for sid in pair:
        agent.put_tensor(JOB, sid, "link", payload)
    counter = iter(range(1_000_000))

    def run() -> float:
        t = time.perf_counter()
        agent.collective(JOB, "send", f"link-{next(counter)}", pair, tensor="link", root=pair[0])
        return time.perf_counter() - t

    return run


def _all_reduce_run(agents: list[NodeAgent], ids: list[str]) -> Callable[[], float]:
    """A run of the all-reduce figure: wall seconds of a functional ring all-reduce of
    16 MB of float32 across all 16 sockets."""
    data = np.ones(ALL_REDUCE_ELEMENTS, dtype=np.float32)
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

    return run
