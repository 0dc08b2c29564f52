"""`make bench`: the OpenAI-compatible endpoint (`rdu serve`), each figure beside its
floor in the same run.

- Requests per wall second at `--time-scale 0`: `rdu serve` (llama3.1-8b on one
  socket) answering non-streamed completions of 16 tokens to 16 concurrent clients;
  floor: a bare FastAPI app on the same uvicorn answering a fixed completion. The
  ratio is the endpoint's overhead.
- Pacing at `--time-scale 1`: 32 concurrent streaming clients, each 64 tokens, against
  `rdu serve` with models from slow to fast aggregate token rates. Each client measures
  its TTFT (send to first token) and its mean inter-token gap; the endpoint's `usage`
  says the emulated ones. Floor: the same 32 clients against a bare FastAPI app that
  streams at once; its TTFT is what the clients and the HTTP stack take on this
  machine, and is taken off the clients' TTFT. A burst holds when TTFT and gap agree
  at p50 and p99 over the clients, within 10% or 5 ms, whichever is larger (the issue's
  bound). Every server, the bare app's too, first takes one burst that is not counted:
  a fresh server's first burst paid its cold start (the bare app's TTFT p99 32 ms cold,
  12-18 ms warm, in one run), which moved the floor and the misses from run to run.
  Then BURSTS bursts each; the floor's percentiles are their medians, and a run's miss
  is its median burst's. The target, the issue's, is on the run at about 1,000
  aggregate tokens/s (llama3.1-405b on 16 sockets): its largest miss at most its bound.
  Reported beside it, with no target: the highest aggregate emulated token rate up to
  which every run holds, and its floor, the aggregate tokens/s the bare app streams to
  the same 32 clients, 64 tokens each, as fast as it can: what this machine's HTTP
  stack and clients carry.

Each `rdu serve` is its own process, as users run it, so the clients' event loop does
not share the server's interpreter.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
from fastapi import FastAPI
from fastapi.responses import StreamingResponse

from rdurack.devtools.bench_figure import BenchFigure
from rdurack.devtools.ports import free_port

RDU = [sys.executable, "-m", "rdurack.cli.main"]
CLIENTS, TOKENS = 32, 64
PACING_REL, PACING_ABS_S = 0.10, 0.005
# The issue's bound holds "at an aggregate emulated rate of about 1,000 tokens/s (for
# example llama3.1-405b on 16 sockets)": that run carries the target; the faster ones
# find where pacing stops holding on this machine, which the issue asks reported.
PACING_TARGET_RUN = ("llama3.1-405b", 16)
FLOOR_TTFT_TOKENS = 2  # the TTFT floor's streams: their first token is what counts
BURSTS = 3  # counted bursts of CLIENTS streams per server, after one not counted
# From slow to fast: the aggregate emulated rate grows down the list.
PACING_RUNS = [("llama3.1-405b", 16), ("llama3.1-70b", 8), ("llama3.1-70b", 16),
               ("llama3.1-8b", 4), ("llama3.1-8b", 16)]  # fmt: skip
THROUGHPUT_REQUESTS, THROUGHPUT_CLIENTS = 400, 16
# One burst: each client's TTFT and mean gap (s), and the endpoint's usage.
Streams = list[tuple[float, float, dict[str, float]]]


@contextmanager
def _process(args: list[str], url: str, probe: str) -> Iterator[str]:
    """A server process until the block ends (SIGTERM by its pid); ready once `probe`
    answers anything over HTTP."""
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(url + probe, timeout=2)
                break
            except httpx.TransportError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{args[2:4]} did not answer on {url}") from None
                time.sleep(0.05)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


@contextmanager
def _rdu_serve(model: str, sockets: int, time_scale: float) -> Iterator[str]:
    """`rdu serve` as a process on a free port."""
    port = free_port()
    args = [*RDU, "serve", "--model", model, "--sockets", str(sockets), "--time-scale",
            str(time_scale), "--port", str(port), "--max-waiting", "1024"]  # fmt: skip
    with _process(args, f"http://127.0.0.1:{port}", "/v1/models") as url:
        yield url


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


def bare_app() -> FastAPI:
    """The floor: FastAPI answering at once, a fixed completion or a stream of the
    request's `max_completion_tokens` tokens (run by `python -m uvicorn
    rdurack.devtools.bench_endpoint:bare_app --factory`)."""
    app = FastAPI()
    answer = {"id": "cmpl-0", "object": "text_completion", "created": 0, "model": "m",
              "choices": [{"index": 0, "text": "x " * 16, "finish_reason": "length"}]}  # fmt: skip
    chunk = {"choices": [{"index": 0, "delta": {"content": "x "}, "finish_reason": None}]}
    usage = {"choices": [], "usage": {"time_to_first_token": 0.0,
                                      "completion_tokens_after_first_per_sec": 1.0,
                                      "total_latency": 0.0}}  # fmt: skip

    @app.post("/v1/completions")
    async def complete() -> dict[str, object]:
        return answer

    @app.post("/v1/chat/completions")
    async def chat(body: dict[str, Any]) -> StreamingResponse:
        tokens = int(body.get("max_completion_tokens", 2))

        async def events() -> AsyncIterator[str]:
            for data in [*[chunk] * tokens, usage]:
                yield f"data: {json.dumps(data)}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


@contextmanager
def _bare() -> Iterator[str]:
    """The bare app as its own process, as `rdu serve` is."""
    port = free_port()
    args = [sys.executable, "-m", "uvicorn", "rdurack.devtools.bench_endpoint:bare_app",
            "--factory", "--port", str(port), "--log-level", "warning"]  # fmt: skip
    with _process(args, f"http://127.0.0.1:{port}", "/v1/completions") as url:
        yield url


def bench_throughput() -> list[BenchFigure]:
    with _rdu_serve("llama3.1-8b", 1, 0.0) as url:
        served = asyncio.run(_hammer(url, THROUGHPUT_REQUESTS, THROUGHPUT_CLIENTS))
    with _bare() as url:
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
    # The largest miss over TTFT and the gap at p50 and p99, as a share of its bound:
    # the clients' TTFT less the floor's, against the emulated TTFT.
    worst: float

    @property
    def holds(self) -> bool:
        return self.worst <= 1.0


class _Conn:
    """One client's keep-alive HTTP/1.1 connection, writing a prepared request and
    reading the chunked server-sent events back, with no client library in between: a
    library's per-request work, times 32 streams on 2 cores, would be measured as the
    endpoint's lateness."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def stream(self, request: bytes) -> tuple[float, float, dict[str, float]]:
        """The client's TTFT and mean gap (s) from writing `request`, and the usage."""
        sent = time.perf_counter()
        self.writer.write(request)
        status = await self.reader.readline()
        if b" 200 " not in status:
            raise RuntimeError(f"the endpoint answered {status!r}")
        while (await self.reader.readline()).strip():  # headers
            pass
        seen: list[float] = []
        usage: dict[str, float] = {}
        while True:
            size = int((await self.reader.readline()).strip() or b"0", 16)
            if size == 0:  # the last chunk
                await self.reader.readline()
                break
            now = time.perf_counter()
            body = (await self.reader.readexactly(size + 2))[:-2]
            for line in body.split(b"\n"):
                if not line.startswith(b"data: {"):
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    usage = chunk["usage"]
                elif chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                    seen.append(now)
        gap = (seen[-1] - seen[0]) / max(1, len(seen) - 1)
        return seen[0] - sent, gap, usage


def _request(port: int, model: str, tokens: int) -> bytes:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hello there"}],
                       "max_completion_tokens": tokens, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()  # fmt: skip
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")  # fmt: skip
    return head.encode() + body


async def _streams(url: str, model: str, tokens: int = TOKENS) -> Streams:
    """CLIENTS streams of `tokens` at once, over connections opened beforehand."""
    port = int(url.rsplit(":", 1)[1])
    opened = [await asyncio.open_connection("127.0.0.1", port) for _ in range(CLIENTS)]
    conns = [_Conn(r, w) for r, w in opened]
    request = _request(port, model, tokens)
    try:
        return await asyncio.gather(*(c.stream(request) for c in conns))
    finally:
        for c in conns:
            c.writer.close()


def _bursts(url: str, model: str, tokens: int = TOKENS) -> list[Streams]:
    """BURSTS bursts of CLIENTS streams, after one that is not counted (a fresh server's
    first pays its cold start)."""
    asyncio.run(_streams(url, model, tokens))
    return [asyncio.run(_streams(url, model, tokens)) for _ in range(BURSTS)]


def _floor(bursts: list[Streams]) -> dict[int, float]:
    """The TTFT floor at p50 and p99 (s): the median over the bursts of each's."""
    return {
        q: statistics.median(float(np.percentile([t for t, _, _ in b], q)) for b in bursts)
        for q in (50, 99)
    }


def _pacing(runs: Streams, floor: dict[int, float]) -> Pacing:
    ttft = [t for t, _, _ in runs]
    gap = [g for _, g, _ in runs]
    e_ttft = [u["time_to_first_token"] for _, _, u in runs]
    e_gap = [1 / u["completion_tokens_after_first_per_sec"] for _, _, u in runs]
    worst = 0.0
    for q in (50, 99):
        pairs = (
            (np.percentile(ttft, q) - floor[q], np.percentile(e_ttft, q)),
            (np.percentile(gap, q), np.percentile(e_gap, q)),
        )
        for measured, emulated in pairs:
            bound = max(PACING_REL * emulated, PACING_ABS_S)
            worst = max(worst, abs(measured - emulated) / bound)
    # All start at once: the run lasts as long as its slowest request.
    rate = CLIENTS * TOKENS / max(u["total_latency"] for _, _, u in runs)
    return Pacing(rate, worst)


def bench_pacing() -> list[BenchFigure]:
    with _bare() as url:
        floor = _floor(_bursts(url, "m", FLOOR_TTFT_TOKENS))
        bare = asyncio.run(_streams(url, "m"))  # warm by now
    # The bare app's aggregate token rate: all start at once, until the last token.
    bare_rate = CLIENTS * TOKENS / max(t + g * (TOKENS - 1) for t, g, _ in bare)
    figures = [
        BenchFigure(f"floor: TTFT of {CLIENTS} streams from a bare FastAPI app, p{q} "
                    f"(median of {BURSTS} bursts)", 1e3 * floor[q], "ms", None, "lower")
        for q in (50, 99)
    ]  # fmt: skip
    runs = []
    for model, sockets in PACING_RUNS:
        with _rdu_serve(model, sockets, 1.0) as url:
            bursts = sorted((_pacing(b, floor) for b in _bursts(url, model)), key=lambda p: p.worst)
        p = bursts[len(bursts) // 2]  # the median burst
        runs.append(p)
        target = 1.0 if (model, sockets) == PACING_TARGET_RUN else None
        figures.append(BenchFigure(
            f"pacing: {model} on {sockets} sockets, {CLIENTS} streams, largest miss, median "
            f"of {BURSTS} bursts ({p.rate:,.0f} tokens/s)", p.worst, "x bound", target,
            "lower"))  # fmt: skip
    # The highest rate up to which every run held (a run that held above one that
    # missed does not count).
    held = 0.0
    for p in sorted(runs, key=lambda r: r.rate):
        if not p.holds:
            break
        held = p.rate
    what = f"every run: TTFT beyond the floor's and ITL within 10% or 5 ms, {CLIENTS} streams"
    # Reported, as the issue asks, with no target of its own: a threshold on the runs'
    # ladder, it moves by a whole step when a run sits at its bound.
    figures.append(BenchFigure(f"pacing holds up to ({what})", held, "tokens/s", None,
                               "higher", bare_rate))  # fmt: skip
    return figures


def bench_endpoint() -> list[BenchFigure]:
    return bench_throughput() + bench_pacing()
