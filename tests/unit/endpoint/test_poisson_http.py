"""A Poisson stream of 200 requests through HTTP (issue 23's acceptance): `rdu serve`'s
app in a thread, concurrent clients sending each request at its arrival time of the
predictor's seeded stream, scaled to wall time, and the emulated timings of `usage`
against the predictor's replay.

What the clients cannot make exact: a request reaches the server a little after its
time (the event loop, the GIL it shares with the server, a loaded machine: about 1 ms,
at times tens), so its emulated arrival (wall receive time / time scale) is late by that
much / time scale. One that comes late across an iteration's start waits for the next
one, and under continuous batching which requests prefill together changes from there
on. The predictor itself moves so: this stream with every arrival up to 1 ms late (at
random) changes its continuous TPOT p50 by up to 5%, chunked prefill's by up to 9%;
static batching's figures move by under 0.5% there, but a loaded machine makes the
lateness tens of ms (static TTFT p50 came out 9.8% above the seeded stream's within a
full `make test`). So no comparison with the seeded stream is held here: the engine's
scheduling is checked without the clients' jitter, the arrivals it recorded, replayed
in the predictor, must give its figures exactly.

The engine starts each iteration of a busy stream where the last one ended, and a
request received while it chose the next iteration arrives just after that choice
(`endpoint/engine.py`), so the wall's lateness (asyncio's timers wake about 1 ms late)
never adds to the emulated times.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
import pytest

from rdurack.endpoint.app import create_app
from rdurack.endpoint.engine import Handle
from rdurack.endpoint.server import engines
from rdurack.endpoint.text import count_tokens
from rdurack.rack.models import builtin_models
from rdurack.rack.presets import platform
from rdurack.workloads.predictor import Predictor
from rdurack.workloads.serving.stream.arrivals import Arrival, poisson
from rdurack.workloads.serving.stream.replay import StreamSetting, replay
from rdurack.workloads.serving.stream.report import Percentiles, StreamReport
from rdurack.workloads.serving.stream.scheduler import Policy, Running
from tests.support.endpoint import in_thread
from tests.support.ports import free_port

MODEL, SOCKETS, RACK = "llama3.1-8b", 1, "sn40l-rack16"
# 200 requests of 128 tokens in and 32 out at 32 per second span about 7.4 emulated s:
# below saturation for continuous batching, a queue for static (the predictor's p99
# TTFT: static 602 ms, continuous 301 ms, chunked prefill 151 ms).
REQUESTS, RATE, SEED, PROMPT_TOKENS, OUTPUT_TOKENS = 200, 32.0, 0, 128, 32
# Wall s per emulated s: the stream takes about 7.5 s of wall per policy.
TIME_SCALE = 1.0
QUANTILES = ("p50", "p90", "p99")
EXACT = ("mean", "p50", "p90", "p99", "max")
# Connections opened before the first arrival, so that no request pays a TCP handshake
# on its way (about the most that are open at once at this rate).
WARM_CONNECTIONS = 64
STREAM_DEADLINE_S = 60.0  # wall, a whole stream: about 8x what it takes


@dataclass
class Stream:
    """One policy's stream served over HTTP: each request's `usage`, and the arrivals as
    the engine recorded them (emulated s)."""

    policy: Policy
    usages: list[dict[str, Any]]
    recorded: list[Arrival]

    def figures(self) -> dict[str, Percentiles]:
        """TTFT, e2e and TPOT (the mean gap after the first token), from `usage`."""
        u = self.usages
        return {
            "ttft_s": Percentiles.of([x["time_to_first_token"] for x in u]),
            "e2e_s": Percentiles.of([x["total_latency"] for x in u]),
            "tpot_s": Percentiles.of([1 / x["completion_tokens_after_first_per_sec"] for x in u]),
        }


def seeded() -> list[Arrival]:
    return poisson(RATE, REQUESTS, PROMPT_TOKENS, OUTPUT_TOKENS, SEED)


def predicted(policy: Policy, arrivals: list[Arrival]) -> StreamReport:
    setting = StreamSetting(MODEL, SOCKETS, policy)
    return replay(Predictor(platform(RACK)), setting, arrivals, builtin_models())


async def _send(url: str, arrivals: list[Arrival]) -> list[dict[str, Any]]:
    """Each request at its arrival time (scaled to wall), all from one event loop; their
    usage, in arrival order."""
    prompt = "abcd" * PROMPT_TOKENS  # 4 bytes a token (endpoint/text.py)
    assert count_tokens(prompt) == PROMPT_TOKENS
    body = {"model": MODEL, "prompt": prompt, "max_tokens": OUTPUT_TOKENS}
    limits = httpx.Limits(max_connections=REQUESTS, max_keepalive_connections=REQUESTS)
    async with httpx.AsyncClient(base_url=url, timeout=STREAM_DEADLINE_S, limits=limits) as c:
        await asyncio.gather(*(c.get("/v1/models") for _ in range(WARM_CONNECTIONS)))
        start = time.monotonic()

        async def one(a: Arrival) -> dict[str, Any]:
            await asyncio.sleep(max(0.0, start + a.at_s * TIME_SCALE - time.monotonic()))
            r = await c.post("/v1/completions", json=body)
            assert r.status_code == 200, r.text
            usage: dict[str, Any] = r.json()["usage"]
            return usage

        gathered = asyncio.gather(*(one(a) for a in arrivals))
        return await asyncio.wait_for(gathered, STREAM_DEADLINE_S)


def serve_stream(policy: Policy, arrivals: list[Arrival]) -> Stream:
    """The stream through a fresh endpoint (an idle engine at the first arrival, as the
    predictor's replay starts)."""
    setting = StreamSetting(MODEL, SOCKETS, policy)
    served = engines(Predictor(platform(RACK)), [MODEL], setting, builtin_models(), TIME_SCALE)
    app = create_app(served)
    engine = served[MODEL]
    recorded: list[Arrival] = []
    observe = engine.on_done  # the app's metrics

    def done(h: Handle, r: Running | None) -> None:
        observe(h, r)
        recorded.append(h.arrival)

    engine.on_done = done
    with in_thread(app, free_port()) as url:
        usages = asyncio.run(_send(url, arrivals))
    return Stream(policy, usages, sorted(recorded, key=lambda a: a.at_s))


@pytest.fixture(scope="module")
def streams() -> dict[Policy, Stream]:
    arrivals = seeded()
    return {policy: serve_stream(policy, arrivals) for policy in Policy}


def _misses(
    got: dict[str, Percentiles],
    want: StreamReport,
    tolerance: float,
    quantiles: tuple[str, ...] = QUANTILES,
) -> list[str]:
    """Each figure off by more than `tolerance` (relative), as 'field q: got / want'."""
    out = []
    for field, mine in got.items():
        theirs: Percentiles = getattr(want, field)
        for q in quantiles:
            a, b = getattr(mine, q), getattr(theirs, q)
            if abs(a - b) > tolerance * abs(b):
                out.append(f"{field} {q}: {a * 1e3:.2f} ms / {b * 1e3:.2f} ms ({a / b - 1:+.1%})")
    return out


def test_every_request_is_served_in_full_at_its_poisson_time(
    streams: dict[Policy, Stream],
) -> None:
    want = np.array([a.at_s for a in seeded()])
    for s in streams.values():
        assert len(s.usages) == len(s.recorded) == REQUESTS
        assert {(u["prompt_tokens"], u["completion_tokens"]) for u in s.usages} == {
            (PROMPT_TOKENS, OUTPUT_TOKENS)
        }
        # The engine saw the seeded stream, shifted by when the clients started and
        # each request late by what the client and the server took to pass it on.
        late = np.array([a.at_s for a in s.recorded]) - want
        late -= late.min()
        assert float(np.median(late)) < 0.010, f"{s.policy}: the clients lag (emulated s)"


def test_continuous_batching_has_a_lower_p99_ttft_than_static(
    streams: dict[Policy, Stream],
) -> None:
    static = streams[Policy.STATIC].figures()["ttft_s"].p99
    continuous = streams[Policy.CONTINUOUS].figures()["ttft_s"].p99
    assert continuous < static
    arrivals = seeded()  # as the predictor says of the same stream
    want = {p: predicted(p, arrivals).ttft_s.p99 for p in (Policy.STATIC, Policy.CONTINUOUS)}
    assert want[Policy.CONTINUOUS] < want[Policy.STATIC]


@pytest.mark.parametrize("policy", list(Policy))
def test_the_arrivals_the_engine_saw_replay_exactly_in_the_predictor(
    streams: dict[Policy, Stream], policy: Policy
) -> None:
    s = streams[policy]
    misses = _misses(s.figures(), predicted(policy, s.recorded), 1e-9, EXACT)
    assert not misses, f"{policy}: {misses}"
