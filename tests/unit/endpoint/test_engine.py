"""A model's engine on its own (no HTTP): the predictor's replay of the same requests
gives the same emulated times; cancelling frees at once; the queue has its bound."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import replace

import pytest

from rdurack.endpoint.engine import UNAVAILABLE_FOR_S, Engine, Handle, QueueFull, Token, Unavailable
from rdurack.endpoint.server import engines
from rdurack.rack.models import builtin_models
from rdurack.rack.presets import platform
from rdurack.workloads.predictor import Predictor
from rdurack.workloads.serving.stream.arrivals import Arrival
from rdurack.workloads.serving.stream.pricing import Pass
from rdurack.workloads.serving.stream.replay import StreamSetting, prepare, replay
from rdurack.workloads.serving.stream.scheduler import Policy

MODEL = "llama3.1-70b"
RACK = platform("sn40l-rack16")


def _engine(policy: Policy, max_waiting: int = 256) -> Engine:
    setting = StreamSetting(MODEL, 8, policy, max_batch=4)
    return engines(Predictor(RACK), [MODEL], setting, builtin_models(), 0.0, max_waiting)[MODEL]


async def _all(engine: Engine, lengths: list[tuple[int, int]]) -> list[list[Token]]:
    handles = [engine.submit(p, o) for p, o in lengths]  # one tick: all arrive at 0

    async def tokens(i: int) -> list[Token]:
        out = []
        while (t := await handles[i].tokens.get()) is not None:
            out.append(t)
        return out

    engine.start()
    try:
        return await asyncio.gather(*(tokens(i) for i in range(len(handles))))
    finally:
        await engine.stop()


@pytest.mark.parametrize("policy", list(Policy))
def test_the_engine_times_requests_as_the_predictors_replay(policy: Policy) -> None:
    lengths = [(300, 20), (1200, 5), (64, 40), (700, 12), (90, 9), (2000, 3)]
    got = asyncio.run(_all(_engine(policy), lengths))
    setting = StreamSetting(MODEL, 8, policy, max_batch=4)
    arrivals = [Arrival(i, 0.0, p, o) for i, (p, o) in enumerate(lengths)]
    want = replay(Predictor(RACK), setting, arrivals, builtin_models())
    assert [len(t) for t in got] == [o for _, o in lengths]
    ttft = sorted(t[0].emulated_s for t in got)
    e2e = sorted(t[-1].emulated_s for t in got)
    assert ttft[-1] == pytest.approx(want.ttft_s.max, rel=1e-9)
    assert e2e[-1] == pytest.approx(want.e2e_s.max, rel=1e-9)
    assert sum(ttft) / len(ttft) == pytest.approx(want.ttft_s.mean, rel=1e-9)
    assert sum(e2e) / len(e2e) == pytest.approx(want.e2e_s.mean, rel=1e-9)


def test_a_cancelled_request_leaves_the_batch_and_its_cache_at_once() -> None:
    async def run() -> tuple[int, int, int]:
        engine = _engine(Policy.CONTINUOUS)
        keep, drop = engine.submit(100, 50), engine.submit(100, 5000)
        engine.start()
        try:
            assert (await drop.tokens.get()) is not None  # both are running
            engine.cancel(drop)
            reserved = engine.scheduler.reserved_tokens  # at once: keep's alone
            given = 1
            while await drop.tokens.get() is not None:  # what was out before: then the end
                given += 1
            assert given < 5000
            while await keep.tokens.get() is not None:
                pass
            return reserved, engine.running, engine.scheduler.reserved_tokens
        finally:
            await engine.stop()

    reserved, running, left = asyncio.run(run())
    assert reserved == 150 and (running, left) == (0, 0)


def test_the_queue_bound_refuses_with_a_retry_hint() -> None:
    async def run() -> None:
        engine = _engine(Policy.CONTINUOUS, max_waiting=2)
        engine.submit(10, 5)
        engine.submit(10, 5)
        with pytest.raises(QueueFull, match="2 requests are waiting"):
            engine.submit(10, 5)
        await engine.stop()

    asyncio.run(run())


def test_a_failed_planned_call_leaves_the_engine_serving_as_the_predictor_says() -> None:
    """A slow executor (5 ms of wall a call) makes the engine plan several iterations a
    call; one call fails; the requests after it get the predictor's replay."""
    setting = StreamSetting(MODEL, 8, Policy.CONTINUOUS, max_batch=4)
    pricer, scheduler = prepare(Predictor(RACK), setting, builtin_models())
    calls: list[int] = []

    async def slow(passes: Sequence[Pass], start_s: float) -> list[float]:
        calls.append(len(passes))
        await asyncio.sleep(0.005)
        if len(passes) > 1 and calls.count(-1) == 0:  # the first planned call fails
            calls.append(-1)
            raise Unavailable("the rack did not run its pass")
        return [pricer.seconds(p) for p in passes]

    engine = Engine(MODEL, scheduler, pricer, slow, 0.02, plans_ahead=True)

    async def run() -> tuple[list[Handle], list[tuple[Arrival, list[float]]]]:
        engine.start()
        try:
            first = [engine.submit(300, 200) for _ in range(2)]
            for h in first:
                while await h.tokens.get() is not None:
                    pass
            await asyncio.sleep(UNAVAILABLE_FOR_S)  # the engine takes requests again
            second = [engine.submit(p, o) for p, o in [(300, 4), (64, 6)]]
            out = []
            for h in second:
                times = []
                while (t := await h.tokens.get()) is not None:
                    times.append(t.emulated_s)
                out.append((h.arrival, times))
            return first, out
        finally:
            await engine.stop()

    first, second = asyncio.run(asyncio.wait_for(run(), 60))  # a stuck request fails
    assert all(h.error is not None for h in first)
    assert -1 in calls and max(calls[calls.index(-1) :]) > 1, calls  # planned again
    assert [len(t) for _, t in second] == [4, 6]
    shift = min(a.at_s for a, _ in second)
    again = [replace(a, at_s=a.at_s - shift) for a, _ in second]
    want = replay(Predictor(RACK), setting, again, builtin_models())
    e2e = [t[-1] - a.at_s for a, t in second]
    assert max(e2e) == pytest.approx(want.e2e_s.max, rel=1e-9)
    assert sum(e2e) / 2 == pytest.approx(want.e2e_s.mean, rel=1e-9)


def test_no_token_of_a_planned_call_leaves_before_its_emulated_time() -> None:
    """A call of one iteration takes 20 ms of wall, so the next carries about 16
    iterations of llama3.1-8b, and answers at once: each of their tokens still waits
    for its own iteration's end on the wall clock (they once all left with the first)."""
    setting = StreamSetting("llama3.1-8b", 8, Policy.CONTINUOUS, max_batch=4)
    pricer, scheduler = prepare(Predictor(RACK), setting, builtin_models())
    plans: list[int] = []

    async def slow_then_fast(passes: Sequence[Pass], start_s: float) -> list[float]:
        plans.append(len(passes))
        if len(passes) == 1:
            await asyncio.sleep(0.02)
        return [pricer.seconds(p) for p in passes]

    engine = Engine("llama3.1-8b", scheduler, pricer, slow_then_fast, 1.0, plans_ahead=True)

    async def run() -> list[tuple[float, Token]]:
        engine.start()
        try:
            h = engine.submit(64, 60)
            out = []
            while (t := await h.tokens.get()) is not None:
                out.append((time.monotonic(), t))
            return out
        finally:
            await engine.stop()

    got = asyncio.run(asyncio.wait_for(run(), 60))
    assert len(got) == 60 and max(plans) > 4, plans  # planned calls, several iterations
    wall0 = engine._wall0  # the engine's wall origin: emulated s x scale after it
    early = [t.emulated_s - (wall - wall0) for wall, t in got]
    assert max(early) < 1e-3, f"a token left {max(early) * 1e3:.1f} ms before its time"
