"""The plot of a serving study (`rdu predict serve --rate ... --plot`, the docs' figure):
its curves from the predictor's reports, its axes' ticks, and the PNG that keeps the
curves it draws."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rdurack.rack.models import builtin_models
from rdurack.rack.presets import platform
from rdurack.traces.plotdata.serving import (
    RateCurve,
    configuration,
    latency_ticks,
    rate_curve,
    rates_title,
)
from rdurack.traces.plots.serving import plot_rates, read_curves
from rdurack.traces.plots.training import plot_loss
from rdurack.workloads.predictor import Predictor
from rdurack.workloads.serving.stream.arrivals import poisson
from rdurack.workloads.serving.stream.replay import StreamSetting, replay
from rdurack.workloads.serving.stream.report import StreamReport
from rdurack.workloads.serving.stream.scheduler import Policy

RATES = [2.0, 50.0]


def _study(policy: Policy) -> list[StreamReport]:
    p, setting = Predictor(platform("sn40l-rack16")), StreamSetting("llama3.1-8b", 1, policy)
    return [replay(p, setting, poisson(r, 40, 256, 16), builtin_models()) for r in RATES]


def test_a_curve_is_the_studys_percentiles_rate_by_rate() -> None:
    reports = _study(Policy.CONTINUOUS)
    c = rate_curve(RATES, reports, source="rdu predict serve ...")
    assert (c.label, c.model, c.requests) == ("1 × sn40l-rack16, continuous", "llama3.1-8b", 40)
    assert c.rates == (2.0, 50.0)
    assert c.ttft_p50_s == tuple(r.ttft_s.p50 for r in reports)
    assert c.ttft_p99_s == tuple(r.ttft_s.p99 for r in reports)
    assert c.itl_p99_s == tuple(r.itl_s.p99 for r in reports)
    assert c.ttft_p99_s[0] < c.ttft_p99_s[1]  # at 50/s they queue
    assert RateCurve.from_dict(json.loads(json.dumps(c.as_dict()))) == c
    assert rates_title([c]) == "llama3.1-8b: latency against the request rate (40 requests a rate)"
    with pytest.raises(ValueError, match="a report per rate"):
        rate_curve([2.0], reports)


def test_chunked_prefill_is_labelled_with_its_chunk() -> None:
    report = _study(Policy.CHUNKED)[0]
    assert configuration(report) == "1 × sn40l-rack16, chunked-prefill 512"


def test_latency_ticks_are_plain_numbers_a_few_to_the_data() -> None:
    # The docs' study: 89 ms to 13 s, 1-2-5 a decade.
    wide = latency_ticks(89.0, 13057.0)
    assert wide == [50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000]
    # A narrow range gets finer ticks: three or more on the data, one beyond each end.
    assert latency_ticks(65.0, 147.0) == [60, 70, 80, 90, 100, 120, 150]
    assert latency_ticks(70.5, 79.5) == [70, 80]  # none on the data at the finest: the ends


def test_the_png_keeps_the_curves_it_draws(tmp_path: Path) -> None:
    curves = [
        rate_curve(RATES, _study(Policy.CONTINUOUS), source="a"),
        rate_curve(RATES, _study(Policy.STATIC), source="b"),
    ]
    drawn = plot_rates(curves, tmp_path / "rates.png")
    data = drawn.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 10_000  # a drawing
    assert read_curves(drawn) == curves
    with pytest.raises(ValueError, match="no study"):
        plot_rates([], tmp_path / "none.png")
    loss = plot_loss([(1, 2.0), (2, 1.0)], "j", tmp_path / "loss.png")
    assert loss is not None
    with pytest.raises(ValueError, match="not a plot of rdurack's"):
        read_curves(loss)
