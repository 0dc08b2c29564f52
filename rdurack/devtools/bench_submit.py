"""SubmitJob and WatchJob on each job store, each figure beside its floor in the same run.

For each store (SQLite, then PostgreSQL on a throwaway server: devtools/postgres.py),
two servers, each on a new store of that kind and in processes of its own
(bench_servers.py):
- the product: a rack brought up as `rdu up` does, its orchestrator on that store;
- the floor: the bare grpcio server of bench_floor.py, making the same durable write
  (the same store class, committed and flushed before the answer) and nothing else.
Every load comes from the load generator (bench_loadgen.py), a process of its own, the
same for both servers, in one of two ways:
- at once: each scheduled call goes to both servers at the same moment, so that a stall
  of the machine, which sets a p99, delays a call of each. The ratios with targets are
  taken so. But the machine then carries both servers' loads;
- in turns: the load switches between the two in slices (SLICE_S; SUSTAIN_SLICE_S for
  the closed loop), given to each in a shuffled order, so that a burst of load from
  elsewhere falls on both alike over many slices, while the machine carries one
  server's load at a time, as the issue's bounds assume. The absolute bounds are held
  on what is measured so, and the closed loop is run so (at once, the two servers would
  share the cores, and each sustain less than it can alone).
The whole sequence runs ROUNDS times over; a percentile is taken over every round's
calls together, a rate is the median over the rounds. A first round, not counted, warms
both (the servers' caches and connections, the rack's holds settling): the product's
p99 in the first two rounds was twice its p99 in the others.

While the figures with targets are measured, the rack's 16 sockets are held by two
endpoint jobs (bench_servers.held): what is submitted queues, and the rack runs
nothing. What is measured is then the control plane, admission to answer: the
orchestrator's gRPC server, tracing, checks, validation, the durable write, waking the
scheduler and the watchers. The loads, in order (LOADS):
1. open, at once: 50 clients offering RATE SubmitJob calls/s in all to each server,
   SERVER_S seconds a round (open loop: a call's latency runs from its scheduled time);
2. watch, at once: WatchJob streams opened at WATCH_RATE/s on each server, SERVER_S
   seconds a round, each on one of the jobs submitted just before, timed from its
   scheduled time to its first event;
3. and 4. the same two in turns, SERVER_S seconds on each server a round;
5. sustained: IN_FLIGHT SubmitJob calls kept outstanding, SUSTAIN_S on each server a
   round (closed loop, in turns).
Then the holds are cancelled and the rack runs the thousands of jobs it was given, and
the open load runs RUNNING_ROUNDS more times on the product: SubmitJob while the rack's
own work (the node agents and 16 socket actors running jobs, on the same two cores as
the orchestrator and the load generator) goes on; beside the floor in turns, no target.

Targets: p99 at most P99_RATIO x its floor's, at once, and at most P99_MS in turns
(WatchJob's first event: the same two); calls/s sustained at least SUSTAINED_PER_S; no
call failed. The absolute figures carry their floor and ratio (bench_figure.py:
`absolute`).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from rdurack import RAY_ENVIRONMENT
from rdurack.devtools.bench_figure import BenchFigure
from rdurack.devtools.bench_loadgen import Outcome
from rdurack.devtools.bench_servers import (
    floor_server,
    held,
    pg_password,
    rack,
    without_password,
)
from rdurack.devtools.postgres import PostgresServer
from rdurack.errors import RdurackError

RATE = 200.0  # SubmitJob calls/s offered, in all
# Each load runs this many times on the two servers. A percentile is taken over every
# round's calls together (8,000 a server), a rate is the median over the rounds. The
# ratios are taken at once (module docstring): a p99 rests on a few stalls of the
# machine, and loaded in turns each stall fell in one server's slice. Two floor servers
# against each other (the same code, the same store), in turns in shuffled slices of
# 0.25 s: their p99 ratios in three runs 1.18, 1.09 and 0.77 (SubmitJob), 1.19, 0.94
# and 1.16 (WatchJob); at once, 0.94, 1.01, 0.94 and 1.00, 0.98, 1.01. But at once every
# p99 is higher, the floors' too (SubmitJob's floor on SQLite 12-17 ms in six runs,
# against 8-10 in turns in four), so the absolute bounds are held in turns
# (docs/benchmarks.md, "How the loads are run").
ROUNDS = 10
RUNNING_ROUNDS = 2  # of the open load while the rack runs its queue (no target)
# The open loads' slices in turns: ten calls at RATE. The same two floor servers in
# slices of 0.05 s, three runs: 0.95, 0.99 and 0.91 (SubmitJob), 0.91, 0.93 and 1.04
# (WatchJob): a stall longer than a slice falls on both, the shorter ones average out.
SLICE_S = 0.05
SERVER_S = 4.0  # seconds of each open load on each server, each round
# WatchJob streams opened per second: the SubmitJob load's offered rate, as the issue
# holds watch streams to "the same bound" (and twice the streams of the 100/s before:
# the p99 is the 80th slowest of some 8,000 a server, not the 40th of 4,000; at 100/s
# two runs' ratios on PostgreSQL were 41% apart).
WATCH_RATE = 200.0
# The closed loop's slices are longer: at each switch a server's first calls wait for
# the other's last (some 60 ms at 64 in flight).
SUSTAIN_SLICE_S = 1.0
SUSTAIN_S = 2.0  # on each server, each round
IN_FLIGHT = 64
P99_RATIO = 3.0  # the issue's: p99 at most 3x the floor's
P99_MS = 25.0  # ... and at most 25 ms
SUSTAINED_PER_S = 1000.0
LOAD_TIMEOUT_S = 180.0
_AT_ONCE = ("--seconds", f"{SERVER_S:g}", "--slice-s", "0")
_IN_TURNS = ("--seconds", f"{2 * SERVER_S:g}", "--slice-s", f"{SLICE_S:g}")
# Each load's load generator arguments, by name; a name's first word is its mode.
LOADS = {
    "open": ("--rate", f"{RATE:g}", *_AT_ONCE),
    "watch": ("--rate", f"{WATCH_RATE:g}", *_AT_ONCE),
    "open in turns": ("--rate", f"{RATE:g}", *_IN_TURNS),
    "watch in turns": ("--rate", f"{WATCH_RATE:g}", *_IN_TURNS),
    "sustained": (
        "--in-flight",
        str(IN_FLIGHT),
        "--seconds",
        f"{2 * SUSTAIN_S:g}",
        "--slice-s",
        f"{SUSTAIN_SLICE_S:g}",
    ),
}
# The open load on the product alone, while the rack runs its queue.
RUNNING = ("--rate", f"{RATE:g}", "--seconds", f"{SERVER_S:g}")


def quantile(values_ms: list[float], q: int) -> float:
    """The q-th percentile (1..99) of at least two values."""
    if len(values_ms) < 2:
        raise RdurackError(f"too few calls to take a percentile of ({len(values_ms)})")
    return statistics.quantiles(values_ms, n=100)[q - 1]


def rate(outcome: Outcome) -> float:
    """Calls answered per second of a load."""
    return outcome.calls / outcome.elapsed_s


def load(
    name: str, addresses: list[str], seed: int = 1000, args: tuple[str, ...] = ()
) -> list[Outcome]:
    """The load `name` of LOADS (or its mode with `args`) on the servers at `addresses`,
    from bench_loadgen.py in its own process (`seed`: its clients' schedules): an
    Outcome for each server."""
    mode = name.split()[0]
    command = [sys.executable, "-m", "rdurack.devtools.bench_loadgen", mode, "--seed", str(seed)]
    for address in addresses:
        command += ["--address", address]
    done = subprocess.run(
        [*command, *(args or LOADS[name])],
        capture_output=True,
        text=True,
        timeout=LOAD_TIMEOUT_S,
        env={**os.environ, **RAY_ENVIRONMENT},
        check=False,
    )
    if done.returncode != 0:
        raise RdurackError(f"the load generator ({mode}) failed: {done.stderr[-2000:]}")
    return [Outcome(**o) for o in json.loads(done.stdout.splitlines()[-1])]


def percentile(rounds: list[Outcome], q: int) -> float:
    """The q-th percentile of the latencies of every round's calls, together (ms)."""
    return quantile([ms for o in rounds for ms in o.latencies_ms], q)


def median_rate(rounds: list[Outcome]) -> float:
    """The median over the rounds of each round's calls/s."""
    return statistics.median(rate(o) for o in rounds)


Rounds = dict[str, list[Outcome]]  # each load's rounds, by load


def measure(floor: str, product: str) -> tuple[Rounds, Rounds]:
    """Every load of LOADS on the floor at `floor` and the product at `product`, ROUNDS
    times over after a round not counted, each round with its own schedules: (the
    floor's rounds, the product's), by load."""
    runs: tuple[Rounds, Rounds] = ({}, {})
    for r in range(-1, ROUNDS):
        for name in LOADS:
            outcomes = load(name, [floor, product], seed=1000 + 100 * r)
            if r < 0:
                continue  # the warm-up round (module docstring)
            for out, outcome in zip(runs, outcomes, strict=True):
                out.setdefault(name, []).append(outcome)
    return runs


def figures(
    store: str, floor: Rounds, product: Rounds, running: list[Outcome]
) -> list[BenchFigure]:
    """The figures of one store (module docstring); `running`: the rounds of the open
    load on the rack running its queue. A percentile is over every round's calls, a
    rate the median over the rounds."""
    failed = [o for rounds in floor.values() for o in rounds if o.errors]
    if failed:
        raise RdurackError(f"the floor server failed calls: {failed[0].first_error}")
    at = f"{RATE:g} calls/s offered, {store}"
    watch = f"WatchJob first event p99, {WATCH_RATE:g} streams/s opened, {store}"
    sustained = f"SubmitJob calls/s sustained, {IN_FLIGHT} in flight, {store}"
    busy = f"{at}, the rack running its queue"
    at_once, in_turns = "at once with its floor", "in turns with its floor"
    errors = sum(o.errors for rounds in [*product.values(), running] for o in rounds)

    def beside(
        name: str, load: str, q: int, target: float | None = None, runs: list[Outcome] | None = None
    ) -> BenchFigure:
        """The q-th percentile of the product's `load` (or of `runs`), beside the floor's."""
        value = percentile(product[load] if runs is None else runs, q)
        return BenchFigure(name, value, "ms", target, "lower", floor=percentile(floor[load], q))

    rate = BenchFigure(
        sustained,
        median_rate(product["sustained"]),
        "calls/s",
        None,
        "higher",
        floor=median_rate(floor["sustained"]),
    )
    return [
        beside(f"SubmitJob latency p50, {at}, {in_turns}", "open in turns", 50),
        beside(f"SubmitJob latency p99, {at}, {at_once}", "open", 99, P99_RATIO),
        _absolute(beside(f"SubmitJob latency p99, {at}, {in_turns}", "open in turns", 99), P99_MS),
        beside(f"{watch}, {at_once}", "watch", 99, P99_RATIO),
        _absolute(beside(f"{watch}, {in_turns}", "watch in turns", 99), P99_MS),
        rate,
        _absolute(rate, SUSTAINED_PER_S),
        beside(f"SubmitJob latency p50, {busy}", "open in turns", 50, runs=running),
        beside(f"SubmitJob latency p99, {busy}", "open in turns", 99, runs=running),
        BenchFigure(f"calls failed in these loads, {store}", errors, "calls", 0, "lower"),
    ]


def _one_store(name: str, product_store: str, floor_store: str, root: Path) -> list[BenchFigure]:
    """The figures of one store: the rack on `product_store`, the floor on
    `floor_store` (module docstring)."""
    logs = root / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    with rack(root / name, product_store) as orchestrator, floor_server(floor_store, logs) as floor:
        with held(orchestrator):
            floors, products = measure(floor, orchestrator)
        running = [
            load("open", [orchestrator], 1000 + 100 * r, RUNNING)[0] for r in range(RUNNING_ROUNDS)
        ]
    return figures(name, floors, products, running)


def _absolute(figure: BenchFigure, bound: float) -> BenchFigure:
    """`figure` against the issue's absolute `bound` on its value, its floor and ratio
    still carried (bench_figure.py)."""
    return replace(figure, name=f"{figure.name}: absolute", target=bound, absolute=True)


def bench_submit() -> list[BenchFigure]:
    with tempfile.TemporaryDirectory(prefix="rdurack-bench-submit-") as tmp:
        root = Path(tmp)
        # SQLite: the rack's default store (STATE_DIR/jobs.sqlite), the floor's its own.
        out = _one_store("SQLite", "", str(root / "floor.sqlite"), root)
        with (
            PostgresServer.started() as server,
            pg_password(server.password),
            server.database() as product,
            server.database() as floor,
        ):
            urls = without_password(product), without_password(floor)
            out += _one_store("PostgreSQL", *urls, root)
        return out
