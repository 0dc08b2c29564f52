"""`make bench`: the predictor's speed in process, each figure beside its floor.

- The predictor's CoE requests per wall second: batches of 8 with prompt and output
  lengths drawn at random (seeded), on the three CoE platforms, one Predictor per
  platform as a serving study would hold them. Its floor is a gauge of the interpreter
  itself, which is all the predictor is built on: units per wall second of a fixed
  piece of plain Python (GAUGE_READS dict reads and multiply-adds, no rdurack code),
  run in slices that alternate with the predictor's so that both see the same machine.
  A slower machine moves both; a slower predictor moves only the figure.
- The serving engine (batching, cache-aware routing, LRU switching) on the predictor:
  CoE requests per wall second of a Poisson load on both nodes of the rack. It is also
  the floor of the cluster's CoE rate (bench_control.py), the same load run on the
  rack's sockets.
"""

from __future__ import annotations

import random
import time

from rdurack.devtools.bench_figure import BenchFigure
from rdurack.rack.models import builtin_models
from rdurack.rack.presets import builtin_platforms
from rdurack.workloads.coe.bundle import PredictedReplicas
from rdurack.workloads.coe.engine import CoeEngine
from rdurack.workloads.coe.router import Router
from rdurack.workloads.coe.spec import CoeWorkload, PoissonLoad, build_requests
from rdurack.workloads.predictor import CoeSetting, Predictor, predict_coe

PREDICTOR_TARGET = 100_000  # requests/s, an absolute bound held on the value
SLICES = 6  # predictor and gauge take turns this many times each
GAUGE_READS = 16
# The CoE load of the serving engine and of the cluster's figure: 400 arrivals per
# emulated second outrun the rack, so batches are full.
COE_RATE_PER_S = 400.0


def gauge(seconds: float) -> tuple[int, float]:
    """Units of the gauge done in about `seconds`, and the wall seconds they took."""
    table = {i: 1.0 + i / 256 for i in range(256)}
    units = 0
    start = time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        for i in range(1000):
            total = 0.0
            for k in range(GAUGE_READS):
                total += table[(i + k) & 255] * 1.0001
        units += 1000
    return units, elapsed


def bench_predictor_speed(seconds: float = 3.0) -> list[BenchFigure]:
    """The module docstring's first figure, over about `seconds` of the predictor's."""
    rng = random.Random(7)
    models = builtin_models()
    predictors = [Predictor(builtin_platforms()[n]) for n in ("sn40l-node", "dgx-a100", "dgx-h100")]
    requests = units = 0
    predicting = gauging = 0.0
    for _ in range(SLICES):
        start = time.perf_counter()
        while time.perf_counter() - start < seconds / SLICES:
            setting = CoeSetting(
                experts=100,
                batch=8,
                output_tokens=rng.choice((20, 50, 200)),
                prompt_tokens=rng.choice((128, 256, 512, 1024, 2048)),
            )
            for p in predictors:
                requests += len(predict_coe(p, setting, models).request_s)
        predicting += time.perf_counter() - start
        done, took = gauge(seconds / SLICES)
        units += done
        gauging += took
    return [
        BenchFigure(
            "predictor CoE requests per wall second",
            requests / predicting,
            "requests/s",
            PREDICTOR_TARGET,
            "higher",
            floor=units / gauging,
            absolute=True,
        )
    ]


def engine_rate(requests: int, sockets: int = 16) -> float:
    """CoE requests per wall second of the serving engine on the predictor, for the
    Poisson load of `requests` on the rack's `sockets`."""
    rack = builtin_platforms()["sn40l-rack16"]
    models = builtin_models()
    w = CoeWorkload(
        num_sockets=sockets,
        poisson=PoissonLoad(requests=requests, rate_per_s=COE_RATE_PER_S, seed=1),
    )
    router = Router.for_catalog(w.num_experts)
    load = build_requests(w, router)
    engine = CoeEngine(w, rack, models, router.names, PredictedReplicas(rack, models), (0, 1))
    start = time.perf_counter()
    report = engine.run(load)
    return report.requests / (time.perf_counter() - start)


def bench_serving_engine(requests: int = 20_000) -> list[BenchFigure]:
    """The module docstring's second figure."""
    return [
        BenchFigure(
            "serving engine on the predictor, CoE requests per wall second",
            engine_rate(requests),
            "requests/s",
            None,
            "higher",
        )
    ]
