"""The socket class without Ray: four sockets in one process, real gRPC links."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

from rdurack.errors import InvalidRequest, LinkFailure, OutOfMemory, SocketBusy
from rdurack.node_agent.collective_engine import _apply
from rdurack.node_agent.links.mailbox import Message, Parts
from rdurack.node_agent.runs import Run
from rdurack.node_agent.socket import Socket
from rdurack.rack.clock import EmulatedClock
from rdurack.rack.collectives import (
    Algorithm,
    all_reduce_schedule,
    broadcast_schedule,
    simulate,
)
from rdurack.rack.kernels import FusionPlan, Phase
from rdurack.rack.models import model
from rdurack.rack.presets import platform
from rdurack.rack.spec import Tier
from rdurack.rack.topology import SocketId, Topology
from rdurack.workloads.predictor import Predictor
from tests.support.sockets import together

RACK = platform("sn40l-rack16")
IDS = ["rdu-n0-s0", "rdu-n0-s1", "rdu-n1-s0", "rdu-n1-s1"]  # rail-aligned across nodes
JOB = "job-1"


@pytest.fixture
def sockets() -> Iterator[dict[str, Socket]]:
    made = {sid: Socket(sid, RACK, timeout_s=5.0) for sid in IDS}
    peers = {sid: s.address() for sid, s in made.items()}
    for s in made.values():
        s.connect(peers)
        s.reserve(JOB)
    yield made
    for s in made.values():
        s.close()


def expected_ns(schedule: Any) -> int:
    return max(simulate(Topology(RACK), schedule).values())


@pytest.mark.parametrize("algorithm", ["ring", "direct", "two-shot"])
def test_functional_all_reduce_equals_numpy_sum(sockets: dict[str, Socket], algorithm: str) -> None:
    rng = np.random.default_rng(1)
    data = {sid: rng.standard_normal(1003).astype(np.float32) for sid in IDS}
    for sid, s in sockets.items():
        s.put_tensor(JOB, "x", data[sid])
    runs = together(
        sockets,
        lambda s: s.collective(JOB, "all_reduce", "t", IDS, tensor="x", algorithm=algorithm),
    )
    total = sum(data.values())
    for s in sockets.values():
        np.testing.assert_allclose(s.get_tensor(JOB, "x"), total, rtol=1e-5)
    members = [SocketId.parse(i) for i in IDS]
    sched = all_reduce_schedule(Topology(RACK), members, 1003, 4, Algorithm(algorithm))
    assert max(r.end_ns for r in runs.values()) == expected_ns(sched)


def test_timing_mode_takes_the_same_emulated_time(sockets: dict[str, Socket]) -> None:
    for s in sockets.values():
        s.put_tensor(JOB, "x", np.ones(250_000, dtype=np.float32))
    functional = together(
        sockets, lambda s: s.collective(JOB, "all_reduce", "f", IDS, tensor="x", algorithm="ring")
    )
    # Like a job, the second collective starts at the latest clock of its members.
    start = max(r.end_ns for r in functional.values())
    timing = together(
        sockets,
        lambda s: s.collective(
            JOB,
            "all_reduce",
            "t",
            IDS,
            nbytes=1_000_000,
            dtype="float32",
            algorithm="ring",
            start_ns=start,
        ),
    )
    for sid in IDS:
        assert timing[sid].duration_ns == functional[sid].duration_ns
        assert timing[sid].bytes_sent == functional[sid].bytes_sent > 0


def test_mean_broadcast_all_gather_send_barrier(sockets: dict[str, Socket]) -> None:
    for i, s in enumerate(sockets.values()):
        s.put_tensor(JOB, "v", np.full(10, float(i + 1), dtype=np.float64))
    together(
        sockets, lambda s: s.collective(JOB, "all_reduce", "m", IDS, tensor="v", reduce_op="mean")
    )
    assert all(np.allclose(s.get_tensor(JOB, "v"), 2.5) for s in sockets.values())

    for i, s in enumerate(sockets.values()):
        s.put_tensor(JOB, "b", np.arange(7, dtype=np.int64) * (i + 1))
    start = max(s.clock.now_ns for s in sockets.values())
    runs = together(
        sockets,
        lambda s: s.collective(JOB, "broadcast", "b", IDS, tensor="b", root=IDS[2], start_ns=start),
    )
    assert all(np.array_equal(s.get_tensor(JOB, "b"), np.arange(7) * 3) for s in sockets.values())
    members = [SocketId.parse(i) for i in IDS]
    sched = broadcast_schedule(Topology(RACK), members, SocketId.parse(IDS[2]), 7, 8)
    assert max(r.end_ns for r in runs.values()) == max(
        simulate(Topology(RACK), sched, start).values()
    )

    for i, s in enumerate(sockets.values()):
        s.put_tensor(JOB, "g", np.full(3, i, dtype=np.int32))
    together(sockets, lambda s: s.collective(JOB, "all_gather", "g", IDS, tensor="g"))
    gathered = sockets[IDS[0]].get_tensor(JOB, "g")
    assert gathered.shape == (4, 3)
    assert np.array_equal(gathered[:, 0], [0, 1, 2, 3])  # rank order, not ring order

    pair = {sid: sockets[sid] for sid in IDS[:2]}
    pair[IDS[0]].put_tensor(JOB, "p", np.arange(5, dtype=np.float32))
    pair[IDS[1]].put_tensor(JOB, "p", np.zeros(5, dtype=np.float32))
    together(pair, lambda s: s.collective(JOB, "send", "p", IDS[:2], tensor="p", root=IDS[0]))
    assert np.array_equal(pair[IDS[1]].get_tensor(JOB, "p"), np.arange(5))

    before = {sid: s.clock.now_ns for sid, s in sockets.items()}
    together(sockets, lambda s: s.collective(JOB, "barrier", "z", IDS))
    # A barrier: nobody leaves before the last member arrived.
    assert min(s.clock.now_ns for s in sockets.values()) >= max(before.values())


def test_an_inter_node_transfer_costs_latency_plus_bytes_over_bandwidth(
    sockets: dict[str, Socket],
) -> None:
    pair = {sid: sockets[sid] for sid in ("rdu-n0-s1", "rdu-n1-s1")}
    nbytes = 64_000_000
    runs = together(
        pair, lambda s: s.collective(JOB, "send", "x", list(pair), nbytes=nbytes, dtype="uint8")
    )
    link = RACK.inter_node_link
    expected = link.latency_ns + nbytes / link.bandwidth_bytes_per_s * 1e9
    assert runs["rdu-n1-s1"].duration_ns == pytest.approx(expected, abs=2)
    assert runs["rdu-n1-s1"].bytes_received == nbytes


def test_a_socket_serves_one_job_at_a_time(sockets: dict[str, Socket]) -> None:
    s = sockets[IDS[0]]
    with pytest.raises(SocketBusy, match="one job at a time"):
        s.reserve("job-2")
    with pytest.raises(SocketBusy):
        s.allocate("job-2", "w", "hbm", 10)
    s.allocate(JOB, "w", "hbm", 10)
    assert s.release(JOB)
    assert s.memory.used_bytes(Tier.HBM) == 0  # the job's allocations went with it
    with pytest.raises(InvalidRequest, match="not reserved"):
        s.allocate("job-2", "w", "hbm", 10)
    s.reserve("job-2")


def test_an_allocation_larger_than_the_tier_names_tier_asked_and_free(
    sockets: dict[str, Socket],
) -> None:
    s = sockets[IDS[0]]
    with pytest.raises(OutOfMemory) as err:
        s.allocate(JOB, "huge", "hbm", 65_000_000_000)
    assert (err.value.tier, err.value.asked_bytes, err.value.free_bytes) == (
        "hbm",
        65_000_000_000,
        64_000_000_000,
    )
    with pytest.raises(OutOfMemory, match="HBM"):
        s.run_kernel(
            JOB, model("llama3.1-405b"), Phase.DECODE, FusionPlan.KERNEL_LOOPED, 1, 1024, 1
        )


def test_kernels_advance_the_clock_by_the_timing_model(sockets: dict[str, Socket]) -> None:
    s = sockets[IDS[0]]
    m = model("llama2-7b")
    run = s.run_kernel(JOB, m, Phase.DECODE, FusionPlan.KERNEL_LOOPED, 1, 1024, 8, steps=20)
    step = Predictor(RACK).step(m, Phase.DECODE, FusionPlan.KERNEL_LOOPED, 1, 1024, 8).total_s
    assert run.duration_ns == pytest.approx(20 * step * 1e9, abs=1)
    assert s.memory.used_bytes(Tier.HBM) > m.weight_bytes / 8  # weights and KV cache held
    s.slow(3.0)
    slow = s.run_kernel(JOB, m, Phase.DECODE, FusionPlan.KERNEL_LOOPED, 1, 1024, 8, steps=20)
    assert slow.duration_ns == pytest.approx(3 * run.duration_ns, abs=3)
    with pytest.raises(InvalidRequest):
        s.slow(0.5)


def test_a_link_down_is_a_clear_error_not_a_hang(sockets: dict[str, Socket]) -> None:
    for s in sockets.values():
        s.timeout_s = 1.0
    sockets[IDS[0]].set_link_down(IDS[1])
    started = time.monotonic()
    with ThreadPoolExecutor(4) as pool:
        futures = [
            pool.submit(s.collective, JOB, "all_reduce", "d", IDS, nbytes=4096, algorithm="ring")
            for s in sockets.values()
        ]
        errors = [f.exception(timeout=10) for f in futures]
    assert time.monotonic() - started < 5
    assert all(isinstance(e, LinkFailure) for e in errors)
    assert any("down" in str(e) for e in errors)
    assert any("no message" in str(e) for e in errors)


def test_pacing_follows_emulated_time() -> None:
    s = Socket("rdu-n0-s0", RACK, time_scale=1.0)
    try:
        s.reserve(JOB)
        started = time.monotonic()
        run = s.run_kernel(
            JOB, model("llama2-7b"), Phase.DECODE, FusionPlan.KERNEL_LOOPED, 1, 1024, 8, steps=100
        )
        wall = time.monotonic() - started
        assert wall >= run.duration_ns * 1e-9 * 0.95
    finally:
        s.close()
    with pytest.raises(InvalidRequest):
        Socket("rdu-n0-s0", RACK, time_scale=-1)


def test_a_delayed_link_adds_its_latency_to_each_transfer_and_nothing_else(
    sockets: dict[str, Socket],
) -> None:
    """Two rails at once, one delayed: their transfers differ by the delay exactly."""

    def both(tag: str) -> dict[str, Run]:
        def send(s: Socket) -> Run:
            pair = [s.name.replace("n1", "n0"), s.name.replace("n0", "n1")]
            return s.collective(JOB, "send", tag, pair, nbytes=1 << 20, dtype="uint8")

        return together(sockets, send)

    sockets["rdu-n0-s0"].set_link_delay("rdu-n1-s0", 250_000)
    runs = both("a")
    assert runs["rdu-n1-s0"].duration_ns - runs["rdu-n1-s1"].duration_ns == 250_000
    sockets["rdu-n0-s0"].set_link_delay("rdu-n1-s0", 0)
    runs = both("b")
    # Undelayed, rail 0's second transfer arrives when rail 1's does (same clocks, same
    # links), before rail 0's receiver clock, which the first delay had moved ahead.
    assert runs["rdu-n1-s1"].end_ns < runs["rdu-n1-s0"].start_ns
    assert runs["rdu-n1-s0"].end_ns == runs["rdu-n1-s0"].start_ns  # still delayed: 250 us later
    with pytest.raises(InvalidRequest, match=">= 0"):
        sockets["rdu-n0-s0"].set_link_delay("rdu-n1-s0", -1)


def test_an_abort_ends_a_wait_for_a_dead_peer_at_once(sockets: dict[str, Socket]) -> None:
    """A survivor waiting for a peer's message (the peer died: it never sends) returns as
    soon as it is aborted, naming why, instead of after its link timeout."""
    waiter = sockets["rdu-n0-s0"]
    waiter.timeout_s = 60.0
    with ThreadPoolExecutor(1) as pool:
        started = time.monotonic()
        future = pool.submit(
            waiter.collective, JOB, "send", "t", ["rdu-n0-s1", "rdu-n0-s0"], nbytes=8
        )
        time.sleep(0.2)  # it is waiting for rdu-n0-s1's message
        assert not future.done()
        assert not waiter.abort("another-job", "no")  # not its job: nothing happens
        assert waiter.abort(JOB, "rdu-n0-s1 died")
        error = future.exception(timeout=10)
    assert isinstance(error, LinkFailure) and "rdu-n0-s1 died" in str(error)
    assert time.monotonic() - started < 30  # far below the 60 s it would have waited
    beat = waiter.heartbeat()
    assert (beat.job_id, beat.slowdown, beat.tiers) == (JOB, 1.0, {})
    # A new job on the socket waits normally again.
    waiter.release(JOB)
    waiter.reserve("job-2")
    sockets["rdu-n0-s1"].release(JOB)
    sockets["rdu-n0-s1"].reserve("job-2")
    pair = {sid: sockets[sid] for sid in ("rdu-n0-s0", "rdu-n0-s1")}
    together(pair, lambda s: s.collective("job-2", "send", "u", list(pair), nbytes=8))


def test_a_restarted_socket_continues_its_predecessors_clock() -> None:
    s = Socket("rdu-n0-s0", RACK, clock_ns=123_456)
    try:
        assert s.clock.now_ns == 123_456 and s.heartbeat().clock_ns == 123_456
    finally:
        s.close()


def test_pacing_does_not_make_up_the_jump_to_a_jobs_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """A job starts at the latest clock of its sockets; a socket whose clock was behind
    jumps there idle, and only the work after the jump is paced."""
    slept: list[float] = []
    monkeypatch.setattr("rdurack.node_agent.timeline.pacing.time.sleep", slept.append)
    s = Socket("rdu-n0-s0", RACK, time_scale=2.0)
    try:
        s.reserve(JOB)
        run = s.run_kernel(
            JOB, model("llama2-7b"), Phase.DECODE, FusionPlan.KERNEL_LOOPED, 1, 1024, 8,
            steps=10, start_ns=30 * 10**9,
        )  # fmt: skip
        assert run.start_ns == 30 * 10**9
        assert sum(slept) == pytest.approx(2.0 * run.duration_ns * 1e-9, abs=0.05)
    finally:
        s.close()


@pytest.mark.parametrize("reduce", [True, False])
def test_received_parts_apply_in_order_even_off_element_boundaries(reduce: bool) -> None:
    """A message in parts (as a stream delivers it) is added or copied part by part; parts
    that split an element (a foreign sender's chunking) are joined first."""
    values = np.arange(10, dtype=np.float32)
    raw = values.tobytes()
    for cuts in ((0, 16, 40), (0, 6, 40), (0, 6, 7, 9, 40)):  # on element boundaries, off
        parts = Parts(raw[lo:hi] for lo, hi in itertools.pairwise(cuts))
        msg = Message("rdu-n0-s1", "t", 0, 1, len(raw), parts, "float32", (10,))
        target = np.ones(10, dtype=np.float32)
        _apply(target, msg, np.add if reduce else None, timeout_s=1.0)
        np.testing.assert_array_equal(target, values + 1 if reduce else values)


def test_a_collective_on_a_clock_of_its_own_leaves_the_sockets_clock_alone(
    sockets: dict[str, Socket],
) -> None:
    """The engine advances the clock a call is given (a rank's communication stream),
    never the socket's; scratch link busy times leave the socket's links free."""
    members = [SocketId.parse(i) for i in IDS]
    schedule = all_reduce_schedule(Topology(RACK), members, 1 << 18, 4, Algorithm.RING)
    start = max(s.clock.now_ns for s in sockets.values()) + 1000

    def on_stream(s: Socket, scratch: bool) -> int:
        engine = s.engine.scratch() if scratch else s.engine
        stream = EmulatedClock(start)
        plan = engine.plan("all_reduce", members, nbytes=1 << 20, itemsize=4)
        engine.run(f"stream-{scratch}", plan, stream, 5.0)
        return stream.now_ns

    before = {sid: s.clock.now_ns for sid, s in sockets.items()}
    with ThreadPoolExecutor(len(sockets)) as pool:
        ends = list(pool.map(lambda s: on_stream(s, True), sockets.values(), timeout=30))
    assert max(ends) == max(simulate(Topology(RACK), schedule, start).values())
    assert {sid: s.clock.now_ns for sid, s in sockets.items()} == before
    # The scratch run took no busy time on the socket's links: a run on them from the
    # same start takes as long.
    with ThreadPoolExecutor(len(sockets)) as pool:
        again = list(pool.map(lambda s: on_stream(s, False), sockets.values(), timeout=30))
    assert again == ends
    assert {sid: s.clock.now_ns for sid, s in sockets.items()} == before
