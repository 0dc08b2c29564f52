"""The pacing benchmark's arithmetic (devtools/bench_endpoint.py), with the servers and
their streams replaced: which bursts count, what the floor is, which run holds the
target."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from rdurack.devtools import bench_endpoint as be

FLOOR_S = [0.010, 0.030, 0.020]  # the bare app's counted bursts: median 20 ms
COLD_S = 0.5  # every server's first burst: cold, and not to be counted
E_TTFT_S, E_GAP_S = 0.1, 0.01  # the emulated TTFT and gap (bound: 10 ms at these)
# Per run (PACING_RUNS' order): its aggregate emulated rate (tokens/s) and the TTFT
# error of each counted burst (s, beyond floor + emulated).
RUNS = [
    (952.0, [0.0, 0.020, 0.005]),  # misses 0, 2, 0.5: the median burst's is 0.5
    (2586.0, [0.002, 0.004, 0.003]),  # 0.3
    (4513.0, [0.009, 0.001, 0.008]),  # 0.8
    (8523.0, [0.015, 0.030, 0.001]),  # 1.5: misses
    (11186.0, [0.0, 0.0, 0.0]),  # holds, above one that missed: does not count
]


def _burst(ttft_s: float, rate: float) -> be.Streams:
    usage = {
        "time_to_first_token": E_TTFT_S,
        "completion_tokens_after_first_per_sec": 1 / E_GAP_S,
        "total_latency": be.CLIENTS * be.TOKENS / rate,
    }
    return [(ttft_s, E_GAP_S, usage)] * be.CLIENTS


def test_pacing_counts_warm_bursts_takes_medians_and_holds_the_target_on_the_1000_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    served: dict[str, Iterator[be.Streams]] = {}

    def server(name: str, bursts: list[be.Streams]) -> Any:
        @contextlib.contextmanager
        def up(*_: object) -> Iterator[str]:
            served[name] = iter(bursts)
            yield name

        return up

    bare = [_burst(s, 1.0) for s in [COLD_S, *FLOOR_S]]
    bare.append(_burst(0.001, 1.0))  # the bare app's own rate, after its bursts
    monkeypatch.setattr(be, "_bare", server("bare", bare))
    runs = iter(RUNS)

    @contextlib.contextmanager
    def rdu_serve(model: str, sockets: int, time_scale: float) -> Iterator[str]:
        rate, errors = next(runs)
        ttfts = [COLD_S + 1.0, *(0.020 + E_TTFT_S + e for e in errors)]
        with server(model, [_burst(t, rate) for t in ttfts])() as url:
            yield url

    async def streams(url: str, model: str, tokens: int = be.TOKENS) -> be.Streams:
        return next(served[url])

    monkeypatch.setattr(be, "_rdu_serve", rdu_serve)
    monkeypatch.setattr(be, "_streams", streams)
    monkeypatch.setattr(be, "BURSTS", 3)
    figures = {f.name.split(" (")[0]: f for f in be.bench_pacing()}

    p50, p99 = (
        figures[f"floor: TTFT of 32 streams from a bare FastAPI app, p{q}"] for q in (50, 99)
    )
    assert (p50.value, p99.value) == pytest.approx((20.0, 20.0))  # ms: cold burst not in it
    misses = [f for name, f in figures.items() if name.startswith("pacing: ")]
    assert [f.value for f in misses] == pytest.approx([0.5, 0.3, 0.8, 1.5, 0.0], abs=1e-9)
    # Only the run at about 1,000 tokens/s holds the target.
    assert [f.target for f in misses] == [1.0, None, None, None, None]
    assert misses[0].name.startswith("pacing: llama3.1-405b on 16 sockets")
    held = figures["pacing holds up to"]
    assert held.value == pytest.approx(4513.0)
    assert held.target is None and held.floor == pytest.approx(
        be.CLIENTS * be.TOKENS / (0.001 + E_GAP_S * (be.TOKENS - 1))
    )
