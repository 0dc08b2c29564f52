"""What serving a stream of requests reports: latency percentiles, throughput, goodput.

Per request (emulated seconds): queue time (arrival to admission), time to first token
(arrival to the end of its prefill, queueing included, as a client measures it), each
inter-token latency (the gap between two of its tokens; vLLM's
`vllm:inter_token_latency_seconds` observes every gap), its time per output token (the
mean gap, DistServe's TPOT), and end to end (arrival to its last token).

Percentiles are numpy's (linear between the two nearest ranks). Goodput (DistServe's):
the requests per second that met every SLO given (TTFT, and TPOT against the ITL SLO),
over the stream's span (first arrival to last token).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

import numpy as np

from rdurack.config import Config
from rdurack.workloads.serving.stream.scheduler import Running


class Percentiles(Config):
    """Seconds."""

    mean: float = 0.0
    p50: float = 0.0
    p90: float = 0.0
    p99: float = 0.0
    max: float = 0.0

    @classmethod
    def of(cls, values: Sequence[float]) -> Percentiles:
        if not values:
            return cls()
        a = np.asarray(values, dtype=float)
        p50, p90, p99 = np.percentile(a, [50, 90, 99])
        return cls(mean=float(a.mean()), p50=p50, p90=p90, p99=p99, max=float(a.max()))


class StreamReport(Config):
    """A stream of requests served on `num_sockets` sockets under `policy`."""

    platform: str = ""
    model: str = ""
    num_sockets: int = 0
    policy: str = ""
    max_batch: int = 0
    chunk_tokens: int | None = None  # chunked prefill's new tokens per iteration
    kv_budget_tokens: int = 0  # the KV cache the sockets hold beside the weights
    switches: int | None = None  # a bundle's: iterations that switched an expert in
    requests: int = 0  # served
    refused: int = 0  # could never fit (see `refusals`)
    refusals: tuple[str, ...] = ()  # the first few reasons, one line each
    span_s: float = 0.0  # first arrival to last token
    output_tokens_per_s: float = 0.0  # every generated token over span_s
    requests_per_s: float = 0.0  # served over span_s
    mean_batch: float = 0.0  # requests per iteration (padding included), over iterations
    iterations: int = 0
    queue_s: Percentiles = Percentiles()
    ttft_s: Percentiles = Percentiles()
    itl_s: Percentiles = Percentiles()  # every gap between two tokens of a request
    tpot_s: Percentiles = Percentiles()  # each request's mean gap
    e2e_s: Percentiles = Percentiles()
    slo_ttft_s: float | None = None
    slo_itl_s: float | None = None
    goodput_requests_per_s: float | None = None  # None without an SLO
    slo_attainment: float | None = None  # share of the served requests that met them


def summarize(
    served: Sequence[Running],
    refusals: Sequence[str],
    iterations: int,
    batch_sum: int,
    slo_ttft_s: float | None = None,
    slo_itl_s: float | None = None,
    **identity: object,
) -> StreamReport:
    """The report of `served` (each done), `identity` its platform, model, ... fields."""
    ttft = [r.token_s[0] - r.arrival.at_s for r in served]
    gaps = [b - a for r in served for a, b in pairwise(r.token_s)]
    tpot = [_tpot(r) for r in served if len(r.token_s) > 1]
    e2e = [r.token_s[-1] - r.arrival.at_s for r in served]
    start = min((r.arrival.at_s for r in served), default=0.0)
    span = max((r.token_s[-1] for r in served), default=0.0) - start
    tokens = sum(len(r.token_s) for r in served)
    good = None
    if slo_ttft_s is not None or slo_itl_s is not None:
        good = sum(_meets(r, slo_ttft_s, slo_itl_s) for r in served)
    return StreamReport.model_validate(
        {
            **identity,
            "requests": len(served),
            "refused": len(refusals),
            "refusals": tuple(refusals[:5]),
            "span_s": span,
            "output_tokens_per_s": tokens / span if span else 0.0,
            "requests_per_s": len(served) / span if span else 0.0,
            "mean_batch": batch_sum / iterations if iterations else 0.0,
            "iterations": iterations,
            "queue_s": Percentiles.of([r.admitted_s - r.arrival.at_s for r in served]),
            "ttft_s": Percentiles.of(ttft),
            "itl_s": Percentiles.of(gaps),
            "tpot_s": Percentiles.of(tpot),
            "e2e_s": Percentiles.of(e2e),
            "slo_ttft_s": slo_ttft_s,
            "slo_itl_s": slo_itl_s,
            "goodput_requests_per_s": None if good is None else (good / span if span else 0.0),
            "slo_attainment": None if good is None or not served else good / len(served),
        }
    )


def _tpot(r: Running) -> float:
    return (r.token_s[-1] - r.token_s[0]) / (len(r.token_s) - 1)


def _meets(r: Running, ttft_s: float | None, itl_s: float | None) -> bool:
    if ttft_s is not None and r.token_s[0] - r.arrival.at_s > ttft_s:
        return False
    return itl_s is None or len(r.token_s) < 2 or _tpot(r) <= itl_s
