"""The SubmitJob and WatchJob load of `make bench`, as a process of its own.

`python -m rdurack.devtools.bench_loadgen MODE --address HOST:PORT [...]` puts one load on
a JobService (the orchestrator's, or the bare floor server's: bench_floor.py) and prints
one JSON line: what it measured (`Outcome`). bench_submit.py starts it, once per load
and server, so that the load comes from another process than the server's (as a user's
client would), the same code for the product and its floor, and none of the bench's own
threads (Ray's, the rack's clients) share its interpreter.

It is asyncio (grpc.aio): one thread drives every client, so 50 clients cost the load
generator little CPU and no GIL contention of its own.

- `open`: CLIENTS clients, each with its own connected channel, each sending SubmitJob on
  its own Poisson schedule (seeded), `rate` calls/s in all, for `seconds`. A call's
  latency runs from its scheduled send time, not from when it was sent, so a client
  made late by a slow server counts its wait (no coordinated omission).
- `watch`: the same Poisson schedule, each event opening a WatchJob stream on one of
  `jobs` jobs submitted beforehand (not timed), and reading its first event; the
  latency runs from the scheduled time to that event. Then the stream is cancelled.
- `sustained`: `in_flight` calls always outstanding over CHANNELS channels (closed
  loop: each call sends the next when it answers), for `seconds`; the figure is calls
  answered per second, what the server sustains.

Given several addresses (a product and its floor), each server has its own clients,
and a load spreads over them in one of two ways:
- at once (`slice_s` 0; open and watch): each scheduled call goes to every server at
  the same moment, in an order drawn for each call. A stall of the machine, which sets
  a p99, then delays a call of each server alike. Each server sees `rate` calls/s for
  `seconds`.
- in turns (`slice_s` > 0): time is cut into slices of `slice_s`, each slice given to
  one server (`Turns`), and a call scheduled (open, watch) or started (sustained) in a
  slice goes to its server. So a moment of load from elsewhere on the machine falls on
  the servers alike over many slices, where loads one after the other, seconds apart,
  each met their own. Each server sees `rate` calls/s, or `in_flight` calls, while it is
  loaded, for `seconds` / (servers) in all. The closed loop takes turns: at once, the
  servers would share the cores, and each sustain less than it can alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field

import grpc
from grpc import aio

from rdurack.v1 import common_pb2, job_pb2

CLIENTS = 50
CHANNELS = 16
CONNECT_TIMEOUT_S = 30.0
RPC_TIMEOUT_S = 10.0
SUBMIT = "/rdurack.v1.JobService/SubmitJob"
WATCH = "/rdurack.v1.JobService/WatchJob"


def small_job(name: str, priority: int = 0) -> job_pb2.SubmitJobRequest:
    """The benchmarks' small job: a 1-socket llama2-7b prefill of 128 tokens."""
    return job_pb2.SubmitJobRequest(
        spec=job_pb2.JobSpec(
            name=name,
            priority=priority,
            kernel=job_pb2.KernelJob(
                model="llama2-7b",
                phase=common_pb2.PHASE_PREFILL,
                sequence_length=128,
                batch_size=1,
                num_sockets=1,
            ),
        )
    )


@dataclass
class Outcome:
    """What one load measured. `latencies_ms`: one per call or stream (open, watch),
    whether it failed or not; `calls`: calls answered without error; `elapsed_s`: wall
    seconds from the start of the load to its last answer."""

    mode: str
    calls: int = 0
    errors: int = 0
    first_error: str = ""
    elapsed_s: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)

    def failed(self, error: BaseException) -> None:
        self.errors += 1
        if not self.first_error:
            code = error.code().name if isinstance(error, aio.AioRpcError) else ""
            self.first_error = f"{code} {error}".strip()[:500]


class Turns:
    """Which server each slice of a load goes to: each server the same number of slices
    (the first ones one more, when they do not divide), in an order shuffled by `seed`.
    Not round robin: a disturbance with a period of two slices (a timer of 0.5 s, with
    slices of 0.25 s) then fell on one server's slices all through a round, and the
    floor's and the product's p99 took turns at being twice the other's."""

    def __init__(self, servers: int, seconds: float, slice_s: float, seed: int) -> None:
        self.order = [j % servers for j in range(max(1, math.ceil(seconds / slice_s)))]
        random.Random(f"turns {seed}").shuffle(self.order)
        self.slice_s = slice_s

    def at(self, t_s: float) -> int:
        """The server of the slice `t_s` seconds into the load."""
        return self.order[min(int(t_s / self.slice_s), len(self.order) - 1)]


class _Client:
    """One connected channel and the two methods the load calls on it."""

    def __init__(self, address: str) -> None:
        self.channel = aio.insecure_channel(address)
        self.submit = self.channel.unary_unary(
            SUBMIT,
            request_serializer=job_pb2.SubmitJobRequest.SerializeToString,
            response_deserializer=job_pb2.SubmitJobResponse.FromString,
        )
        self.watch = self.channel.unary_stream(
            WATCH,
            request_serializer=job_pb2.WatchJobRequest.SerializeToString,
            response_deserializer=job_pb2.JobEvent.FromString,
        )

    async def ready(self) -> None:
        await asyncio.wait_for(self.channel.channel_ready(), CONNECT_TIMEOUT_S)


async def _clients(address: str, count: int) -> list[_Client]:
    clients = [_Client(address) for _ in range(count)]
    await asyncio.gather(*(c.ready() for c in clients))
    # One call each before the clock starts: the server's first call on a connection
    # (its handler's first run, the HTTP/2 stream set-up) is not what is measured.
    await asyncio.gather(
        *(c.submit(small_job(f"warm-up {i}"), timeout=RPC_TIMEOUT_S) for i, c in enumerate(clients))
    )
    return clients


async def _poisson(
    mode: str,
    clients: list[list[_Client]],
    rate: float,
    seconds: float,
    seed: int,
    slice_s: float,
    call: Callable[[int, _Client, int, int], Awaitable[None]],
) -> list[Outcome]:
    """Each of CLIENTS schedules calls on its own Poisson schedule, `rate` in all; a call
    is `call(server, client, i, n)` on every server at once (`slice_s` 0), or on the
    server of the slice (of `slice_s`) it is scheduled in (`Turns`); `clients`: each
    server's clients. The latency of each runs from its scheduled time to `call`'s end.
    One Outcome per server."""
    servers = len(clients)
    turns = Turns(servers, seconds, slice_s, seed) if slice_s > 0 else None
    outs = [Outcome(mode) for _ in range(servers)]
    per_client = rate / len(clients[0])
    t0 = time.perf_counter()

    async def client(i: int) -> None:
        rng = random.Random(seed + i)
        first = random.Random(f"first {seed} {i}")  # which server a call at once meets first
        due = rng.expovariate(per_client)
        n = 0
        pending: set[asyncio.Task[None]] = set()
        while due < seconds:
            wait = t0 + due - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            if turns is None:
                ks = list(range(servers))
                first.shuffle(ks)
            else:
                ks = [turns.at(due)]
            for k in ks:
                # Each call on its own task: a slow answer must not delay the next send,
                # which is the client's own schedule (an open loop).
                call_k = call(k, clients[k][i], i, n)
                task = asyncio.create_task(_timed(call_k, t0 + due, outs[k]))
                pending.add(task)
                task.add_done_callback(pending.discard)
            due += rng.expovariate(per_client)
            n += 1
        if pending:
            await asyncio.gather(*pending)

    await asyncio.gather(*(client(i) for i in range(len(clients[0]))))
    for out in outs:
        out.elapsed_s = (time.perf_counter() - t0) / (1 if turns is None else servers)
    return outs


async def _timed(call: Awaitable[None], scheduled: float, out: Outcome) -> None:
    try:
        await call
        out.calls += 1
    except (TimeoutError, grpc.RpcError) as e:
        out.failed(e)
    out.latencies_ms.append(1e3 * (time.perf_counter() - scheduled))


async def _closed(clients: list[list[_Client]]) -> None:
    await asyncio.gather(*(c.channel.close() for each in clients for c in each))


async def open_loop(
    addresses: Sequence[str], rate: float, seconds: float, seed: int, slice_s: float = 0.25
) -> list[Outcome]:
    clients = [await _clients(a, CLIENTS) for a in addresses]

    async def submit(k: int, c: _Client, i: int, n: int) -> None:
        await c.submit(small_job(f"open {i} #{n}"), timeout=RPC_TIMEOUT_S)

    outs = await _poisson("open", clients, rate, seconds, seed, slice_s, submit)
    await _closed(clients)
    return outs


async def watch_loop(
    addresses: Sequence[str],
    rate: float,
    seconds: float,
    seed: int,
    jobs: int,
    slice_s: float = 0.25,
) -> list[Outcome]:
    clients = [await _clients(a, CLIENTS) for a in addresses]
    ids: list[list[str]] = []
    for each in clients:
        answers = await asyncio.gather(
            *(
                each[j % CLIENTS].submit(small_job(f"watched {j}"), timeout=RPC_TIMEOUT_S)
                for j in range(jobs)
            )
        )
        ids.append([a.job.id for a in answers])

    async def first_event(k: int, c: _Client, i: int, n: int) -> None:
        stream = c.watch(job_pb2.WatchJobRequest(job_id=ids[k][(i + n * CLIENTS) % jobs]))
        try:
            async for _ in stream:
                return
            raise grpc.RpcError("the stream ended without an event")
        finally:
            stream.cancel()

    outs = await _poisson("watch", clients, rate, seconds, seed, slice_s, first_event)
    await _closed(clients)
    return outs


async def sustained(
    addresses: Sequence[str], in_flight: int, seconds: float, seed: int, slice_s: float = 1.0
) -> list[Outcome]:
    """`in_flight` closed loops; each call goes to the server whose slice it starts in,
    and counts for it. The boundary costs each server alike: its first calls of a slice
    wait for the other's last to answer, and its own last run into the other's."""
    clients = [await _clients(a, CHANNELS) for a in addresses]
    turns = Turns(len(addresses), seconds, slice_s, seed)
    outs = [Outcome("sustained") for _ in addresses]
    t0 = time.perf_counter()
    end = t0 + seconds

    async def loop(j: int) -> None:
        n = 0
        while (now := time.perf_counter()) < end:
            k = turns.at(now - t0)
            try:
                await clients[k][j % CHANNELS].submit(
                    small_job(f"sustained {j} #{n}"), timeout=RPC_TIMEOUT_S
                )
            except grpc.RpcError as e:
                outs[k].failed(e)
                return
            outs[k].calls += 1
            n += 1

    await asyncio.gather(*(loop(j) for j in range(in_flight)))
    for out in outs:
        out.elapsed_s = (time.perf_counter() - t0) / len(clients)
    await _closed(clients)
    return outs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=("open", "sustained", "watch"))
    parser.add_argument(
        "--address", required=True, action="append", help="a server to load (repeatable)"
    )
    parser.add_argument("--rate", type=float, default=200.0, help="calls/s offered (open, watch)")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=1000)
    parser.add_argument("--in-flight", type=int, default=64, help="calls outstanding (sustained)")
    parser.add_argument("--jobs", type=int, default=200, help="jobs to watch (watch)")
    parser.add_argument(
        "--slice-s",
        type=float,
        help="seconds each server is loaded in turn; 0: every server at once (open, watch)",
    )
    a = parser.parse_args(argv)
    if a.slice_s is not None and not a.slice_s >= 0:  # also refuses NaN
        parser.error(f"--slice-s must be >= 0 s, got {a.slice_s}")
    sliced = a.slice_s if a.slice_s is not None else 0.25
    if a.mode == "open":
        run = open_loop(a.address, a.rate, a.seconds, a.seed, sliced)
    elif a.mode == "watch":
        run = watch_loop(a.address, a.rate, a.seconds, a.seed, a.jobs, sliced)
    elif a.slice_s == 0:
        parser.error("--slice-s 0: the closed loop takes turns (module docstring)")
    else:
        run = sustained(a.address, a.in_flight, a.seconds, a.seed, a.slice_s or 1.0)
    print(json.dumps([asdict(o) for o in asyncio.run(run)]), flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
