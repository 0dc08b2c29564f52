"""The options of `rdu predict serve` that make it replay a stream of requests
(workloads/serving/stream/) instead of pricing one batch."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from math import isfinite
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from rdurack.cli.options import in_place_of
from rdurack.cli.views import emit, study_table
from rdurack.errors import InvalidRequest
from rdurack.rack.models import ModelSpec
from rdurack.workloads.coe.catalog import expert_names
from rdurack.workloads.predictor import Predictor
from rdurack.workloads.serving.stream.arrivals import Arrival, poisson, read_trace
from rdurack.workloads.serving.stream.bundle import BundleSetting, assign_experts
from rdurack.workloads.serving.stream.replay import StreamSetting, replay
from rdurack.workloads.serving.stream.report import StreamReport
from rdurack.workloads.serving.stream.scheduler import DEFAULT_CHUNK_TOKENS, Policy

# Assumption: 64 requests at once, a common serving default (vLLM's max_num_seqs is 256
# on GPUs; a rack's HBM holds fewer long sequences). Set it with --max-batch.
DEFAULT_MAX_BATCH = 64


class ArrivalProcess(StrEnum):
    POISSON = "poisson"


ArrivalsOpt = Annotated[
    ArrivalProcess | None,
    typer.Option(help="replay a stream of requests arriving so (with --rate, --requests)"),
]
RateOpt = Annotated[
    str | None,
    typer.Option(help="requests per second (--arrivals); several, comma-separated: a study"),
]
RequestsOpt = Annotated[int, typer.Option(min=1, help="requests in the stream (--arrivals)")]
SeedOpt = Annotated[int, typer.Option(help="the seed of the arrival times (--arrivals)")]
TraceOpt = Annotated[
    Path | None,
    typer.Option(
        help="replay the requests of this file: Vidur's CSV "
        "(arrived_at,num_prefill_tokens,num_decode_tokens) or LLMServingSim's JSONL "
        "(input_toks, output_toks, arrival_time_ns)"
    ),
]
PolicyOpt = Annotated[
    Policy | None,
    typer.Option(help="how requests are batched (docs/serving.md); default: continuous"),
]
MaxBatchOpt = Annotated[
    int | None, typer.Option(min=1, help="requests running at once, at most; default: 64")
]
ChunkTokensOpt = Annotated[
    int | None,
    typer.Option(
        min=1, help=f"chunked prefill: new tokens per iteration; default: {DEFAULT_CHUNK_TOKENS}"
    ),
]
SloTtftOpt = Annotated[
    float | None, typer.Option(min=0, help="SLO on time to first token, ms (goodput)")
]
SloItlOpt = Annotated[
    float | None, typer.Option(min=0, help="SLO on time per output token, ms (goodput)")
]
ExpertsOpt = Annotated[
    int | None,
    typer.Option(
        min=1,
        help="serve a CoE bundle of this many catalog experts of --model (routed by a "
        "--model router, on one node; PAPER: 150 llama2-7b), each request routed to one "
        "drawn with --skew",
    ),
]
SkewOpt = Annotated[
    float | None,
    typer.Option(min=0, help="the Zipf exponent of the experts' popularity (--experts); 0: "
                 "uniform; default: 1"),
]  # fmt: skip
PlotOpt = Annotated[
    Path | None,
    typer.Option(
        help="also draw the study (several --rate): TTFT p50 and p99 and ITL p99 against "
        "the rate, a PNG"
    ),
]


@dataclass(frozen=True)
class StreamOptions:
    """Where the stream's requests come from, and how they are served."""

    process: ArrivalProcess | None
    rates: list[float]  # empty with a trace
    requests: int
    seed: int
    trace: Path | None
    policy: Policy
    max_batch: int
    chunk_tokens: int
    slo_ttft_s: float | None
    slo_itl_s: float | None
    plot: Path | None = None  # the study's PNG
    experts: int | None = None  # a CoE bundle's
    skew: float = 1.0

    def streams(self, prompt_tokens: int, output_tokens: int) -> list[list[Arrival]]:
        """The requests: the trace's, or a Poisson stream of these lengths per rate;
        for a bundle, each with its expert (drawn from the seed after the arrivals')."""
        if self.trace is not None:
            out = [read_trace(self.trace)]
        else:
            out = [
                poisson(rate, self.requests, prompt_tokens, output_tokens, self.seed)
                for rate in self.rates
            ]
        if self.experts is None:
            return out
        names = expert_names(self.experts)
        return [assign_experts(arrivals, names, self.skew, self.seed + 1) for arrivals in out]

    def bundle(self, model: str) -> BundleSetting | None:
        """The bundle of --experts of `model` (its router too), or None."""
        if self.experts is None:
            return None
        return BundleSetting(self.experts, model, model)


def stream_options(
    arrivals: ArrivalsOpt = None,
    rate: RateOpt = None,
    requests: RequestsOpt = 100,
    seed: SeedOpt = 0,
    trace: TraceOpt = None,
    policy: PolicyOpt = None,
    max_batch: MaxBatchOpt = None,
    chunk_tokens: ChunkTokensOpt = None,
    slo_ttft_ms: SloTtftOpt = None,
    slo_itl_ms: SloItlOpt = None,
    plot: PlotOpt = None,
    experts: ExpertsOpt = None,
    skew: SkewOpt = None,
) -> StreamOptions | None:
    """The stream options; None without --arrivals or --trace (where a stream option
    given anyway is refused: it would be ignored)."""
    if arrivals is not None and trace is not None:
        raise InvalidRequest("--arrivals and --trace each give the requests: give one")
    if trace is not None and rate is not None:
        raise InvalidRequest("--rate is --arrivals': a trace's requests arrive when it says")
    if arrivals is None and trace is None:
        given = (rate, policy, max_batch, chunk_tokens, slo_ttft_ms, slo_itl_ms, plot, experts)
        if any(g is not None for g in given) or skew is not None:
            raise InvalidRequest(
                "--rate, --policy, --max-batch, --chunk-tokens, the SLOs, --plot and "
                "--experts are a stream's: they need --arrivals or --trace"
            )
        return None
    if skew is not None and experts is None:
        raise InvalidRequest("--skew is --experts': the popularity of a bundle's experts")
    if chunk_tokens is not None and policy is not Policy.CHUNKED:
        raise InvalidRequest("--chunk-tokens is --policy chunked-prefill's")
    if arrivals is not None and rate is None:
        raise InvalidRequest("--arrivals poisson needs --rate (requests per second)")
    rates = [] if rate is None else _rates(rate)
    if plot is not None and len(rates) < 2:
        raise InvalidRequest("--plot draws a study against the rate: give --rate two rates or more")
    return StreamOptions(
        arrivals,
        rates,
        requests,
        seed,
        trace,
        policy or Policy.CONTINUOUS,
        max_batch or DEFAULT_MAX_BATCH,
        chunk_tokens or DEFAULT_CHUNK_TOKENS,
        None if slo_ttft_ms is None else slo_ttft_ms / 1e3,
        None if slo_itl_ms is None else slo_itl_ms / 1e3,
        plot,
        experts,
        1.0 if skew is None else skew,
    )


def _rates(text: str) -> list[float]:
    try:
        rates = [float(x) for x in text.split(",")]
    except ValueError:
        rates = []
    if not rates or not all(r > 0 and isfinite(r) for r in rates):
        raise InvalidRequest(
            f"--rate: requests per second, positive, separated by commas; got {text!r}"
        )
    return rates


def streams(command: Callable[..., None]) -> Callable[..., None]:
    """`command` with its `StreamOptions | None` parameter shown to typer as the
    options of `stream_options`, in its place."""
    return in_place_of(command, StreamOptions | None, stream_options)


SWEEP = (  # column, StreamReport field (a percentile's as "field.p99"), scale, format
    ("TTFT p50 (ms)", "ttft_s.p50", 1e3, "{:.0f}"),
    ("TTFT p99 (ms)", "ttft_s.p99", 1e3, "{:.0f}"),
    ("ITL p50 (ms)", "itl_s.p50", 1e3, "{:.1f}"),
    ("ITL p99 (ms)", "itl_s.p99", 1e3, "{:.1f}"),
    ("e2e p99 (s)", "e2e_s.p99", 1.0, "{:.2f}"),
    ("output tokens/s", "output_tokens_per_s", 1.0, "{:.0f}"),
    ("mean batch", "mean_batch", 1.0, "{:.1f}"),
)


def serve_stream(
    p: Predictor,
    setting: StreamSetting,
    stream: StreamOptions,
    lengths: tuple[int, int],
    models: dict[str, ModelSpec],
    as_json: bool,
    markdown: bool,
) -> None:
    """Replay the stream (each rate's, for a study) and print the report, or the
    study's table; progress goes to stderr."""
    console = Console(stderr=True)
    reports: list[StreamReport] = []
    for arrivals in stream.streams(*lengths):
        label = f"rate {stream.rates[len(reports)]:g}/s: " if len(stream.rates) > 1 else ""

        def told(done: int, total: int, label: str = label) -> None:
            console.print(f"{label}served {done} of {total} requests", highlight=False)

        reports.append(replay(p, setting, arrivals, models, told))
    if stream.plot is not None:  # matplotlib loads only for a plot (half a second)
        from rdurack.traces.plotdata.serving import rate_curve
        from rdurack.traces.plots.serving import plot_rates

        drawn = plot_rates([rate_curve(stream.rates, reports)], stream.plot)
        print(f"wrote {drawn}", file=sys.stderr)  # stdout keeps the study alone, unwrapped
    title = f"stream: {setting.model} on {p.platform.name}"
    if len(reports) == 1 and not markdown:
        emit(as_json, reports[0].model_dump(mode="json"), title)
        return
    if as_json:
        rows = [r.model_dump(mode="json") for r in reports]
        print(json.dumps({"rates": stream.rates, "rows": rows}))
        return
    columns = ["rate (req/s)"] + [c for c, _, _, _ in SWEEP]
    slo = setting.slo_ttft_s is not None or setting.slo_itl_s is not None
    if slo:
        columns.append("met SLOs")
    cells = []
    for rate, r in zip(stream.rates or [0.0], reports, strict=True):
        data = r.model_dump()
        row = [f"{rate:g}" if stream.rates else "trace"]
        for _, key, scale, form in SWEEP:
            field, _, inner = key.partition(".")
            value = data[field][inner] if inner else data[field]
            row.append(form.format(value * scale))
        if slo:
            row.append(f"{r.slo_attainment:.0%}")
        cells.append(row)
    first = reports[0]
    chunks = f" of {first.chunk_tokens} tokens" if first.chunk_tokens else ""
    caption = (
        f"{first.model} on {first.num_sockets} {first.platform} sockets, {first.policy}"
        f"{chunks} batching up to {first.max_batch}, {first.requests + first.refused} requests"
    )
    study_table(columns, cells, caption, markdown)
