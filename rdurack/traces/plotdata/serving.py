"""What the plot of a serving study shows (`rdu predict serve --rate R1,R2,... --plot`,
and the docs' figure of the what-if study): for each configuration (a platform, its
sockets, a batching policy), the time to first token at p50 and p99 and the inter-token
latency at p99 against the request rate, from the predictor's stream reports.

Its latency axes are ticked in plain numbers (`latency_ticks`). A curve goes to and
from a dict (`as_dict`, `from_dict`), so that a figure can carry the figures it draws
(in its PNG's text) and the docs' test can compare them with the tables beside it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from rdurack.workloads.serving.stream.report import StreamReport

# Latency ticks (ms) per decade, coarse to fine: "200", not "2 x 10^2"; the coarsest
# that puts three ticks on the data is used.
MANTISSAS = ((1, 2, 5), (1, 1.5, 2, 3, 5, 7), (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 7, 8, 9))


@dataclass(frozen=True)
class RateCurve:
    """One configuration's study: per rate (requests/s), its latencies (emulated s)."""

    label: str  # which configuration: platform, sockets, policy
    model: str
    requests: int  # per rate
    rates: tuple[float, ...]
    ttft_p50_s: tuple[float, ...]
    ttft_p99_s: tuple[float, ...]
    itl_p99_s: tuple[float, ...]
    source: str = ""  # the command that computed it, when a figure records it

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RateCurve:
        """The curve of `as_dict` (read back from JSON: lists for tuples)."""
        return cls(
            label=str(data["label"]),
            model=str(data["model"]),
            requests=int(data["requests"]),
            rates=tuple(data["rates"]),
            ttft_p50_s=tuple(data["ttft_p50_s"]),
            ttft_p99_s=tuple(data["ttft_p99_s"]),
            itl_p99_s=tuple(data["itl_p99_s"]),
            source=str(data.get("source", "")),
        )


def configuration(r: StreamReport) -> str:
    """'8 × sn40l-rack16, continuous': what tells a study's curve apart from another's
    of the same model ('chunked-prefill 512' names its chunk)."""
    policy = f"{r.policy} {r.chunk_tokens}" if r.chunk_tokens else r.policy
    return f"{r.num_sockets} × {r.platform}, {policy}"


def rate_curve(
    rates: Sequence[float], reports: Sequence[StreamReport], source: str = ""
) -> RateCurve:
    """The curve of a study: `reports[i]` served the stream at `rates[i]`."""
    if len(rates) != len(reports) or not reports:
        raise ValueError(f"a study needs a report per rate, got {len(rates)} and {len(reports)}")
    first = reports[0]
    return RateCurve(
        label=configuration(first),
        model=first.model,
        requests=first.requests + first.refused,
        rates=tuple(rates),
        ttft_p50_s=tuple(r.ttft_s.p50 for r in reports),
        ttft_p99_s=tuple(r.ttft_s.p99 for r in reports),
        itl_p99_s=tuple(r.itl_s.p99 for r in reports),
        source=source,
    )


def rates_title(curves: Sequence[RateCurve]) -> str:
    """The figure's title: the model(s) and the requests of each stream."""
    models = ", ".join(dict.fromkeys(c.model for c in curves))
    requests = ", ".join(str(n) for n in dict.fromkeys(c.requests for c in curves))
    return f"{models}: latency against the request rate ({requests} requests a rate)"


def latency_ticks(lo_ms: float, hi_ms: float) -> list[float]:
    """Ticks for latencies from `lo_ms` to `hi_ms` on a log axis, a tick beyond each end."""
    for mantissas in MANTISSAS:
        ticks = [round(m * 10.0**e, 6) for e in range(-2, 7) for m in mantissas]
        inside = [t for t in ticks if lo_ms <= t <= hi_ms]
        if len(inside) >= 3:
            break
    below = [t for t in ticks if t < lo_ms][-1:]
    above = [t for t in ticks if t > hi_ms][:1]
    return below + inside + above
