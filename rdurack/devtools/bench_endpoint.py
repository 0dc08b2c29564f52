"""`make bench`: the OpenAI-compatible endpoint (`rdu serve`), each figure beside its
floor in the same run.

- Requests per wall second at `--time-scale 0`: `rdu serve` (llama3.1-8b on one
  socket) answering non-streamed completions of 16 tokens to 16 concurrent clients;
  floor: a bare FastAPI app on the same uvicorn answering a fixed completion. The
  ratio is the endpoint's overhead.
- Pacing at `--time-scale 1`: 32 concurrent streaming clients, each 64 tokens, against
  `rdu serve` with models from slow to fast aggregate token rates. Each client measures
  its TTFT (send to first token) and its mean inter-token gap; the endpoint's `usage`
  says the emulated ones. A run holds when both agree at p50 and p99 over the clients,
  within 10% or 5 ms, whichever is larger (the issue's bound). The figure is the highest
  aggregate emulated token rate at which a run holds; the target is about 1,000 tokens/s
  (llama3.1-405b on 16 sockets).

Each `rdu serve` is its own process, as users run it, so the clients' event loop does
not share the server's interpreter.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import httpx
import numpy as np
from fastapi import FastAPI

from rdurack.devtools.bench_figure import BenchFigure
from rdurack.devtools.ports import free_port
from rdurack.endpoint.server import in_thread

RDU = [sys.executable, "-m", "rdurack.cli.main"]
CLIENTS, TOKENS = 32, 64
PACING_REL, PACING_ABS_S = 0.10, 0.005
PACING_TARGET = 1000.0  # tokens/s: the "about 1,000" (llama3.1-405b on 16)
# From slow to fast: the aggregate emulated rate grows down the list.
PACING_RUNS = [("llama3.1-405b", 16), ("llama3.1-70b", 8), ("llama3.1-70b", 16),
               ("llama3.1-8b", 4), ("llama3.1-8b", 16)]  # fmt: skip
THROUGHPUT_REQUESTS, THROUGHPUT_CLIENTS = 400, 16


@contextmanager
def _rdu_serve(model: str, sockets: int, time_scale: float) -> Iterator[str]:
    """`rdu serve` as a process on a free port, until the block ends (SIGTERM by pid)."""
    port = free_port()
    args = [*RDU, "serve", "--model", model, "--sockets", str(sockets), "--time-scale",
            str(time_scale), "--port", str(port), "--max-waiting", "1024"]  # fmt: skip
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(url + "/v1/models", timeout=2)
                break
            except httpx.TransportError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"rdu serve did not answer on {url}") from None
                time.sleep(0.05)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


# ------------------------------------------------------------------ throughput


async def _hammer(url: str, requests: int, clients: int) -> float:
    """Requests per wall second: `clients` at once, `requests` in all."""
    body = {"model": "llama3.1-8b", "prompt": "hello", "max_tokens": 16}
    left = list(range(requests))
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:

        async def worker() -> None:
            while left:
                left.pop()
                r = await client.post("/v1/completions", json=body)
                r.raise_for_status()

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        return requests / (time.perf_counter() - start)


def _bare_app() -> FastAPI:
    app = FastAPI()
    answer = {"id": "cmpl-0", "object": "text_completion", "created": 0, "model": "m",
              "choices": [{"index": 0, "text": "x " * 16, "finish_reason": "length"}]}  # fmt: skip

    @app.post("/v1/completions")
    async def complete() -> dict[str, object]:
        return answer

    return app


def bench_throughput() -> list[BenchFigure]:
    with _rdu_serve("llama3.1-8b", 1, 0.0) as url:
        served = asyncio.run(_hammer(url, THROUGHPUT_REQUESTS, THROUGHPUT_CLIENTS))
    with in_thread(_bare_app(), free_port()) as url:
        bare = asyncio.run(_hammer(url, THROUGHPUT_REQUESTS, THROUGHPUT_CLIENTS))
    what = f"{THROUGHPUT_CLIENTS} clients, 16-token completions"
    return [
        BenchFigure(
            f"rdu serve requests per wall s at --time-scale 0 ({what})",
            served,
            "req/s",
            None,
            "higher",
        ),
        BenchFigure(
            f"floor: a bare FastAPI app on uvicorn ({what})", bare, "req/s", None, "higher"
        ),
        BenchFigure(
            "rdu serve overhead over the bare app (time per request)",
            bare / served,
            "x",
            None,
            "lower",
        ),
    ]


# ------------------------------------------------------------------ pacing


@dataclass(frozen=True)
class Pacing:
    rate: float  # aggregate emulated tokens/s of the run
    worst: float  # the largest miss over TTFT and ITL at p50 and p99, as a share of its bound

    @property
    def holds(self) -> bool:
        return self.worst <= 1.0


async def _stream(client: httpx.AsyncClient, model: str) -> tuple[float, float, dict[str, float]]:
    """One streamed chat: the client's TTFT and mean gap (s), and the usage."""
    body = {"model": model, "messages": [{"role": "user", "content": "hello there"}],
            "max_completion_tokens": TOKENS, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    sent = time.perf_counter()
    seen: list[float] = []
    usage: dict[str, float] = {}
    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            elif chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                seen.append(time.perf_counter())
    gap = (seen[-1] - seen[0]) / (len(seen) - 1)
    return seen[0] - sent, gap, usage


async def _pace(url: str, model: str) -> Pacing:
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        runs = await asyncio.gather(*(_stream(client, model) for _ in range(CLIENTS)))
    ttft = [t for t, _, _ in runs]
    gap = [g for _, g, _ in runs]
    e_ttft = [u["time_to_first_token"] for _, _, u in runs]
    e_gap = [1 / u["completion_tokens_after_first_per_sec"] for _, _, u in runs]
    worst = 0.0
    for measured, emulated in ((ttft, e_ttft), (gap, e_gap)):
        for q in (50, 99):
            m, e = np.percentile(measured, q), np.percentile(emulated, q)
            worst = max(worst, abs(m - e) / max(PACING_REL * e, PACING_ABS_S))
    # All start at once: the run lasts as long as its slowest request.
    rate = CLIENTS * TOKENS / max(u["total_latency"] for _, _, u in runs)
    return Pacing(rate, worst)


def bench_pacing() -> list[BenchFigure]:
    held = 0.0
    figures = []
    for model, sockets in PACING_RUNS:
        with _rdu_serve(model, sockets, 1.0) as url:
            p = asyncio.run(_pace(url, model))
        figures.append(
            BenchFigure(
                f"pacing: {model} on {sockets} sockets, {CLIENTS} streams, largest miss "
                f"({p.rate:,.0f} tokens/s)",
                p.worst,
                "x bound",
                1.0,
                "lower",
            )
        )
        if p.holds:
            held = max(held, p.rate)
    figures.append(
        BenchFigure(
            f"pacing holds up to (TTFT and ITL within 10% or 5 ms at p50 and p99, {CLIENTS} "
            "streams)",
            held,
            "tokens/s",
            PACING_TARGET,
            "higher",
        )
    )
    return figures


def bench_endpoint() -> list[BenchFigure]:
    return bench_throughput() + bench_pacing()
