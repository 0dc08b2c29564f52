"""What `make bench` measures its figures' floors with, run for real on a small scale:
the bare SubmitJob server and the load generator (their calls, their outcomes), the bare
gRPC members of the data plane's floors (the bytes they move, the sums they compute),
the bare processes of `rdu up`'s floor, and how the SubmitJob figures are made from what
the loads measured. Nothing here is timed against a bound: the targets are `make
bench`'s."""

from __future__ import annotations

import asyncio
import random
import statistics
import subprocess
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest

from rdurack.devtools import bench_loadgen, bench_submit, bench_up_floor
from rdurack.devtools.bench_bare import Member
from rdurack.devtools.bench_floor import serve
from rdurack.devtools.bench_loadgen import (
    CHANNELS,
    CLIENTS,
    Outcome,
    Turns,
    open_loop,
    sustained,
    watch_loop,
)
from rdurack.devtools.bench_rack_floors import alternate, ups_in_turns
from rdurack.devtools.bench_servers import without_password
from rdurack.errors import InvalidRequest, RdurackError
from rdurack.orchestrator.jobs import JobState
from rdurack.orchestrator.store import JobStore
from rdurack.processes import children


@pytest.fixture
def floor(tmp_path: Path) -> Iterator[tuple[str, JobStore]]:
    """The bare floor server on a SQLite store of its own: its address and the store."""
    with JobStore(tmp_path / "floor.sqlite") as store, ThreadPoolExecutor(4) as quick:
        server, address = serve(store, quick)
        try:
            yield address, store
        finally:
            server.stop(0).wait()


def test_the_floor_stores_each_submission_durably_and_streams_its_events(
    floor: tuple[str, JobStore],
) -> None:
    address, store = floor
    (opened,) = asyncio.run(open_loop([address], rate=100.0, seconds=0.3, seed=1))
    assert opened.errors == 0 and opened.calls > 0
    assert len(opened.latencies_ms) == opened.calls  # one latency per call sent
    assert all(ms >= 0 for ms in opened.latencies_ms)
    # Every call answered is a PENDING job in the store (with the clients' warm-ups).
    jobs = store.list()
    assert len(jobs) == opened.calls + CLIENTS
    assert {j.state for j in jobs} == {JobState.PENDING}
    (watched,) = asyncio.run(watch_loop([address], rate=100.0, seconds=0.2, seed=1, jobs=3))
    assert watched.errors == 0 and watched.calls == len(watched.latencies_ms) > 0
    (held,) = asyncio.run(sustained([address], in_flight=4, seconds=0.2, seed=1))
    assert held.errors == 0 and held.calls > 0 and held.elapsed_s > 0
    assert not held.latencies_ms  # a closed loop counts calls, it does not time them


def _due_s(rate: float, seconds: float, seed: int) -> list[float]:
    """Every call the load generator's clients schedule within `seconds` (their seeded
    Poisson schedules, `rate` calls/s in all): each call's due time, seconds."""
    due_s: list[float] = []
    for i in range(CLIENTS):
        rng = random.Random(seed + i)
        due = rng.expovariate(rate / CLIENTS)
        while due < seconds:
            due_s.append(due)
            due += rng.expovariate(rate / CLIENTS)
    return due_s


@pytest.fixture
def two_floors(tmp_path: Path) -> Iterator[tuple[list[JobStore], list[str]]]:
    """Two bare floor servers, each on a SQLite store of its own: the stores, the
    addresses."""
    with (
        JobStore(tmp_path / "a.sqlite") as a,
        JobStore(tmp_path / "b.sqlite") as b,
        ThreadPoolExecutor(4) as quick,
    ):
        servers = [serve(a, quick), serve(b, quick)]
        try:
            yield [a, b], [address for _, address in servers]
        finally:
            for server, _ in servers:
                server.stop(0).wait()


def test_a_load_on_two_servers_sends_each_slice_to_one_in_turn(
    two_floors: tuple[list[JobStore], list[str]],
) -> None:
    rate, seconds, seed, slice_s = 100.0, 1.0, 7, 0.25
    (a, b), addresses = two_floors
    # The calls each server should get: the clients' seeded schedules, slice by slice.
    expected = [0, 0]
    turns = Turns(2, seconds, slice_s, seed)
    for due in _due_s(rate, seconds, seed):
        expected[turns.at(due)] += 1
    outs = asyncio.run(open_loop(addresses, rate, seconds, seed, slice_s))
    assert [o.calls for o in outs] == expected and min(expected) > 0
    assert all(o.errors == 0 and len(o.latencies_ms) == o.calls for o in outs)
    # Each store holds the calls its server answered, and the clients' warm-ups.
    assert [len(a.list()), len(b.list())] == [n + CLIENTS for n in expected]
    # The closed loop takes turns too: each call counts for the server it went to.
    held = asyncio.run(sustained(addresses, 4, seconds=0.4, seed=seed, slice_s=0.1))
    assert all(o.errors == 0 and o.calls > 0 for o in held)
    warm_ups = CLIENTS + CHANNELS
    got = [len(a.list()), len(b.list())]
    assert got == [n + warm_ups + h.calls for n, h in zip(expected, held, strict=True)]


def test_a_load_at_once_sends_every_call_to_each_server(
    two_floors: tuple[list[JobStore], list[str]],
) -> None:
    rate, seconds, seed = 100.0, 0.5, 7
    (a, b), addresses = two_floors
    due_s = _due_s(rate, seconds, seed)  # each call for both servers
    scheduled = len(due_s)
    outs = asyncio.run(open_loop(addresses, rate, seconds, seed, 0))
    assert [o.calls for o in outs] == [scheduled, scheduled] and scheduled > 0
    assert all(o.errors == 0 and len(o.latencies_ms) == o.calls for o in outs)
    assert [len(a.list()), len(b.list())] == [scheduled + CLIENTS] * 2
    # Each server was loaded the whole time, not half of it (as in turns).
    assert all(o.elapsed_s >= max(due_s) for o in outs)
    # The watch load at once: every scheduled stream opened on each server.
    watched = asyncio.run(watch_loop(addresses, rate, seconds, seed, jobs=3, slice_s=0))
    assert [o.calls for o in watched] == [scheduled, scheduled]
    assert all(o.errors == 0 for o in watched)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["open", "--slice-s", "-1"], "--slice-s must be >= 0 s, got -1.0"),
        (["sustained", "--slice-s", "0"], "the closed loop takes turns"),
    ],
)
def test_the_load_generator_refuses_a_slice_it_cannot_keep(
    args: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        bench_loadgen.main([*args, "--address", "127.0.0.1:1"])
    assert exit_.value.code == 2 and says in capsys.readouterr().err


def test_turns_give_each_server_its_share_of_slices_in_a_seeded_order() -> None:
    turns = Turns(2, seconds=8.0, slice_s=0.25, seed=3)
    assert sorted(turns.order) == [0] * 16 + [1] * 16
    assert turns.order != [j % 2 for j in range(32)]  # not round robin
    assert Turns(2, 8.0, 0.25, seed=3).order == turns.order  # the same seed, the same
    assert turns.at(0.3) == turns.order[1] and turns.at(99.0) == turns.order[-1]
    assert Turns(3, seconds=1.0, slice_s=0.25, seed=1).order.count(0) == 2  # 4 slices


def test_an_outcome_counts_its_errors_and_keeps_the_first() -> None:
    out = Outcome("open")
    out.failed(RuntimeError("refused"))
    out.failed(RuntimeError("refused again"))
    assert out.errors == 2 and out.first_error == "refused"


def _members(count: int, payload_bytes: int) -> list[Member]:
    members = [Member(payload_bytes) for _ in range(count)]
    for i, m in enumerate(members):
        m.connect(members[(i + 1) % count].address())
    return members


def test_a_bare_link_moves_every_byte_in_chunks() -> None:
    nbytes = (2 << 20) + 12  # two whole chunks and a piece of a third
    sender, receiver = _members(2, nbytes)
    assert sender.send(nbytes) == nbytes
    got = receiver._received.view(np.float32)[: nbytes // 4]
    assert np.array_equal(got, np.ones(nbytes // 4, dtype=np.float32))


def test_a_bare_ring_all_reduces() -> None:
    size, elements = 4, 1001  # segments of unequal lengths
    members = _members(size, 0)
    sums: list[float] = [0.0] * size

    def rank(i: int) -> None:
        sums[i] = members[i].all_reduce(i, size, elements)

    threads = [threading.Thread(target=rank, args=(i,)) for i in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sums == [float(size)] * size


def test_a_figure_and_its_floor_take_turns_and_each_keeps_its_median() -> None:
    calls: list[str] = []

    def timed(name: str, seconds: list[float]) -> Callable[[], float]:
        left = iter(seconds)

        def run() -> float:
            calls.append(name)
            return next(left)

        return run

    product = timed("product", [9.0, 3.0, 1.0, 2.0])  # a warm-up, then three runs
    floor = timed("floor", [9.0, 0.5, 0.7, 0.6])
    assert alternate(product, floor, runs=3) == (2.0, 0.6)
    assert calls == ["product", "floor"] * 4


def test_bring_ups_take_turns_with_their_floor_and_the_last_stays_up() -> None:
    calls: list[str] = []
    floors = iter([5.0, 6.0, 7.0])

    def floor() -> float:
        calls.append("floor")
        return next(floors)

    def up() -> tuple[float, int]:
        rack = sum(c.startswith("up") for c in calls)
        calls.append(f"up {rack}")
        return 10.0 + rack, rack

    def down(rack: int) -> None:
        calls.append(f"down {rack}")

    assert ups_in_turns(floor, up, down, times=3) == ([10.0, 11.0, 12.0], [5.0, 6.0, 7.0], 2)
    assert calls == ["floor", "up 0", "down 0", "floor", "up 1", "down 1", "floor", "up 2"]


def test_bring_ups_in_turns_need_at_least_one() -> None:
    def never(*_: Any) -> Any:
        raise AssertionError("nothing may be brought up")

    with pytest.raises(InvalidRequest, match="at least 1, not 0"):
        ups_in_turns(never, never, never, times=0)


def _outcome(
    mode: str, latencies_ms: list[float], calls: int = 0, elapsed_s: float = 0.0
) -> Outcome:
    """What a load measured: its latencies (one per call) or its calls over its time."""
    return Outcome(mode, calls or len(latencies_ms), 0, "", elapsed_s or 1.0, latencies_ms)


def test_the_submit_figures_are_the_loads_percentiles_beside_the_floors() -> None:
    fast = [float(ms) for ms in range(1, 101)]  # 1..100 ms
    slow = [2 * ms for ms in fast]
    quick = [ms / 10 for ms in fast]  # in turns: the machine carries one load at a time

    def rounds(mode: str, *latencies: list[float]) -> list[Outcome]:
        return [_outcome(mode, ms) for ms in latencies]

    def p99(*latencies: list[float]) -> float:
        return statistics.quantiles([ms for each in latencies for ms in each], n=100)[98]

    # A percentile is over every round's calls together: slow's, split over two rounds,
    # is slow's own (each half's p99 would be far apart).
    floor = {"open": rounds("open", fast[:60], fast[60:]), "watch": rounds("watch", fast),
             "open in turns": rounds("open", quick), "watch in turns": rounds("watch", quick),
             "sustained": [_outcome("sustained", [], calls=2000, elapsed_s=2.0)]}  # fmt: skip
    product = {"open": rounds("open", slow[:60], slow[60:]), "watch": rounds("watch", fast),
               "open in turns": rounds("open", fast), "watch in turns": rounds("watch", quick),
               "sustained": [_outcome("sustained", [], calls=c, elapsed_s=2.0)
                             for c in (1200, 100, 1300)]}  # fmt: skip
    hot, hotter = [10 * ms for ms in fast], [12 * ms for ms in fast]
    running = rounds("open", hot, hotter)
    figures = {f.name: f for f in bench_submit.figures("S", floor, product, running)}
    at = "200 calls/s offered, S"
    # The ratio is held on the loads at once.
    latency = figures[f"SubmitJob latency p99, {at}, at once with its floor"]
    assert (latency.value, latency.floor) == pytest.approx((p99(slow), p99(fast)))
    assert latency.ratio == pytest.approx(2.0)
    assert latency.target == 3.0 and latency.met is True
    # The 25 ms on the loads in turns, held on the value (99 ms: missed), beside
    # the floor in turns and the ratio.
    absolute = figures[f"SubmitJob latency p99, {at}, in turns with its floor: absolute"]
    assert (absolute.value, absolute.floor) == pytest.approx((p99(fast), p99(quick)))
    assert absolute.ratio == pytest.approx(10.0)
    assert (absolute.target, absolute.holds, absolute.met) == (25.0, "value", False)
    opened = "WatchJob first event p99, 200 streams/s opened, S"
    watched = figures[f"{opened}, in turns with its floor: absolute"]
    assert watched.value == pytest.approx(p99(quick)) and watched.met is True
    # A rate is the median over the rounds: the round at 50 calls/s is out.
    rate = figures["SubmitJob calls/s sustained, 64 in flight, S"]
    assert (rate.value, rate.floor, rate.ratio, rate.target) == (600.0, 1000.0, 0.6, None)
    sustained = figures["SubmitJob calls/s sustained, 64 in flight, S: absolute"]
    assert (sustained.floor, sustained.holds, sustained.met) == (1000.0, "value", False)
    busy = figures[f"SubmitJob latency p99, {at}, the rack running its queue"]
    assert busy.value == pytest.approx(p99(hot, hotter)) and busy.target is None
    assert busy.floor == pytest.approx(p99(quick))  # beside the floor alone, in turns
    assert figures["calls failed in these loads, S"].value == 0


def test_a_floor_that_failed_calls_fails_the_benchmark() -> None:
    broken = _outcome("open", [1.0, 2.0])
    broken.failed(RuntimeError("UNAVAILABLE"))
    fine = {name: [_outcome(name, [1.0, 2.0])] for name in bench_submit.LOADS}
    with pytest.raises(RdurackError, match="UNAVAILABLE"):
        bench_submit.figures("S", {**fine, "open": [broken]}, fine, fine["open"])


def test_a_url_loses_its_password_and_keeps_the_rest() -> None:
    url = "postgresql://postgres:s3cret@127.0.0.1:5432/t_abc"
    assert without_password(url) == "postgresql://postgres@127.0.0.1:5432/t_abc"
    assert without_password("postgresql://u@h/db") == "postgresql://u@h/db"


def test_the_up_floor_starts_rdu_ups_processes_bare_and_stops_each(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spawned: list[subprocess.Popen[bytes]] = []
    spawn = children.spawn

    def recorded(*args: Any) -> subprocess.Popen[bytes]:
        spawned.append(spawn(*args))
        return spawned[-1]

    monkeypatch.setattr(children, "spawn", recorded)
    assert bench_up_floor.up_s(agents=1, sockets=2) > 0
    # The head, one agent, the server: each ended on its SIGTERM, cleanly.
    assert [cast(list[str], p.args)[3] for p in spawned] == ["head", "agent", "server"]
    assert [p.returncode for p in spawned] == [0, 0, 0]
