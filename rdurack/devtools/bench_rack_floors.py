"""The floors of the data plane's figures (bench_rack.py), measured in the same run, on
the same Ray, with bare processes (bench_bare.py):

- bring-up: Ray started as the rack starts it (`start_ray`), 16 bare actors
  (num_cpus=0) each answering once, and two bare gRPC servers (the node agents'): the
  processes and servers the rack needs, with nothing of a socket in them;
- link throughput: the same bytes, in the link's chunks, streamed from one bare actor
  to another over one gRPC client stream (no header, no checks, no tracing, no
  emulated time), timed from this process's call to the sender until it answers;
- functional all-reduce: a ring of 16 bare actors moving the same segments over one
  gRPC client stream to the next member each, adding with numpy.

Each is timed as its figure is, the two taking turns (`alternate`: the medians of RUNS
after a warm-up).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any, TypeVar

import grpc
import ray

from rdurack.devtools.bench_bare import BareActor, MemberActor
from rdurack.errors import InvalidRequest, RdurackError
from rdurack.node_agent.actors import start_ray

T = TypeVar("T")
RUNS = 7  # with 3, the link's ratio moved 43% between two runs
ACTORS = 16  # the rack's sockets
SERVERS = 2  # the rack's node agents


def median_s(run: Callable[[], float], runs: int = RUNS) -> float:
    """The median of `runs` calls of `run` (each returns its seconds), after one more
    as a warm-up (first connections, first buffers)."""
    run()
    return statistics.median(run() for _ in range(runs))


def alternate(
    product: Callable[[], float], floor: Callable[[], float], runs: int = RUNS
) -> tuple[float, float]:
    """The medians of `runs` calls of each (seconds), after a warm-up of each, the two
    taking turns: a moment of load on the shared machine falls on both alike."""
    product()
    floor()
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(runs):
        times[0].append(product())
        times[1].append(floor())
    return statistics.median(times[0]), statistics.median(times[1])


def ups_in_turns(
    floor: Callable[[], float],
    up: Callable[[], tuple[float, T]],
    down: Callable[[T], None],
    times: int,
) -> tuple[list[float], list[float], T]:
    """A bring-up and its floor in turns, `times` each, the floor first, each bring-up
    but the last taken down before the next floor: (the bring-ups' seconds, the
    floor's, what the last bring-up brought up, left up for the figures after it)."""
    if times < 1:  # nothing would be up for the figures after it
        raise InvalidRequest(f"bring-ups in turns: times must be at least 1, not {times}")
    ups: list[float] = []
    floors: list[float] = []
    for i in range(times):
        floors.append(floor())
        took, kept = up()
        ups.append(took)
        if i < times - 1:
            down(kept)
    return ups, floors, kept


def bring_up_s(actors: int = ACTORS, servers: int = SERVERS) -> float:
    """Wall seconds from nothing to Ray, `actors` bare actors and `servers` bare gRPC
    servers up (the rack's sockets and node agents). Starts and stops its own Ray: call
    it while none runs."""
    started = time.monotonic()
    start_ray()
    bare = [BareActor.remote() for _ in range(actors)]
    ray.get([a.ready.remote() for a in bare])
    grpc_servers = []
    for _ in range(servers):
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        server.add_insecure_port("127.0.0.1:0")
        server.start()
        grpc_servers.append(server)
    took = time.monotonic() - started
    for server in grpc_servers:
        server.stop(0)
    ray.shutdown()
    return took


@contextlib.contextmanager
def _members(count: int, payload_bytes: int) -> Iterator[list[Any]]:
    """`count` bare members, each connected to the next (a ring; two: a pair), on the
    Ray this process has joined; killed after the block."""
    members = [MemberActor.remote(payload_bytes) for _ in range(count)]
    try:
        addresses = ray.get([m.address.remote() for m in members])
        ray.get([m.connect.remote(addresses[(i + 1) % count]) for i, m in enumerate(members)])
        yield members
    finally:
        for m in members:
            ray.kill(m)


@contextlib.contextmanager
def link(nbytes: int) -> Iterator[Callable[[], float]]:
    """A run of the link's floor: wall seconds to stream `nbytes` from one bare actor to
    another."""
    with _members(2, nbytes) as (sender, _):

        def run() -> float:
            t = time.perf_counter()
            ray.get(sender.send.remote(nbytes))
            return time.perf_counter() - t

        yield run


@contextlib.contextmanager
def ring(elements: int, size: int = ACTORS) -> Iterator[Callable[[], float]]:
    """A run of the all-reduce's floor: wall seconds of a ring all-reduce of `elements`
    float32 over `size` bare actors."""
    with _members(size, 0) as members:

        def run() -> float:
            t = time.perf_counter()
            sums = ray.get([m.all_reduce.remote(i, size, elements) for i, m in enumerate(members)])
            took = time.perf_counter() - t
            if sums != [float(size)] * size:  # a ring that moved the wrong bytes
                raise RdurackError(f"the bare ring all-reduced to {sums}, not {size}")
            return took

        yield run
