"""A stream of requests served in the predictor: `rdu predict serve --arrivals ...`.

A discrete-event loop on the emulated clock: requests arrive at their times; whenever
the sockets are free the scheduler picks the next iteration (serving/stream/
scheduler.py), the timing model prices it (serving/stream/pricing.py), and the clock
moves to its end. When nothing can run the clock jumps to the next arrival. The
endpoint drives the same scheduler with the same prices on the socket actors.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rdurack.errors import InvalidRequest, UnknownName
from rdurack.rack.kernels import FusionPlan
from rdurack.rack.models import ExpertMapping, ModelSpec
from rdurack.rack.timing import tp_group
from rdurack.workloads.predictor import Predictor
from rdurack.workloads.serving.stream.arrivals import Arrival
from rdurack.workloads.serving.stream.bundle import CONTEXT_TOKENS, Bundle, BundleSetting
from rdurack.workloads.serving.stream.pricing import Pricer, kv_budget_tokens
from rdurack.workloads.serving.stream.report import StreamReport, summarize
from rdurack.workloads.serving.stream.scheduler import (
    DEFAULT_CHUNK_TOKENS,
    Policy,
    Refused,
    Running,
    Scheduler,
)

# How often a long replay reports its progress: every this many served requests.
PROGRESS_EVERY = 50


@dataclass(frozen=True)
class StreamSetting:
    """How one model serves a stream: on how many sockets, under which policy."""

    model: str
    sockets: int | None = None  # None: every socket of the platform
    policy: Policy = Policy.CONTINUOUS
    max_batch: int = 64
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS  # chunked-prefill's tokens per iteration
    plan: FusionPlan | None = None  # None: the platform's default decode plan
    expert_mapping: ExpertMapping | None = None
    slo_ttft_s: float | None = None
    slo_itl_s: float | None = None
    bundle: BundleSetting | None = None  # a CoE bundle's experts: `model` is its name


def prepare(
    p: Predictor, setting: StreamSetting, models: dict[str, ModelSpec]
) -> tuple[Pricer, Scheduler]:
    """The model of `setting` on its sockets: what prices its iterations, and its
    scheduler (its KV budget what the sockets hold beside the weights). A bundle runs on
    one node: by default all its sockets."""
    plan = setting.plan or p.default_decode_plan()
    if setting.bundle is not None:
        sockets = setting.sockets or p.platform.node.sockets
        b = Bundle(p, setting.bundle, models, sockets, setting.max_batch)
        scheduler = Scheduler(
            setting.policy,
            setting.max_batch,
            b.kv_budget_tokens,
            setting.chunk_tokens,
            b.region(),
            CONTEXT_TOKENS,
        )
        return Pricer(p, b.expert, sockets, plan, b), scheduler
    if setting.model not in models:
        raise UnknownName("model", setting.model, sorted(models))
    model = models[setting.model].placed(setting.expert_mapping)
    sockets = p.platform.sockets if setting.sockets is None else setting.sockets
    tp_group(p.platform, sockets)  # a socket count the platform has
    budget = kv_budget_tokens(p, model, sockets)
    scheduler = Scheduler(setting.policy, setting.max_batch, budget, setting.chunk_tokens)
    return Pricer(p, model, sockets, plan), scheduler


def replay(
    p: Predictor,
    setting: StreamSetting,
    arrivals: Sequence[Arrival],
    models: dict[str, ModelSpec],
    progress: Callable[[int, int], None] | None = None,
) -> StreamReport:
    """Serve `arrivals` (sorted by time) on the predictor's platform; `progress(done,
    total)` is told every PROGRESS_EVERY served requests."""
    pricer, scheduler = prepare(p, setting, models)
    served: list[Running] = []
    refusals: list[str] = []
    now, i, iterations, batch_sum = 0.0, 0, 0, 0
    while i < len(arrivals) or scheduler.busy:
        while i < len(arrivals) and arrivals[i].at_s <= now:
            try:
                scheduler.arrive(arrivals[i])
            except Refused as e:
                refusals.append(str(e))
            i += 1
        it = scheduler.next(now)
        if it is None:
            if i == len(arrivals):
                break
            now = arrivals[i].at_s
            continue
        now += pricer(it).seconds
        iterations += 1
        batch_sum += it.batch
        for r in scheduler.finish(it, now):
            served.append(r)
            if progress is not None and len(served) % PROGRESS_EVERY == 0:
                progress(len(served), len(arrivals))
    if not served:
        raise InvalidRequest(f"no request could be served: {refusals[0]}")
    return summarize(
        served,
        refusals,
        iterations,
        batch_sum,
        setting.slo_ttft_s,
        setting.slo_itl_s,
        platform=p.platform.name,
        model=setting.model if setting.bundle else pricer.model.name,
        num_sockets=pricer.sockets,
        policy=setting.policy.value,
        max_batch=setting.max_batch,
        chunk_tokens=setting.chunk_tokens if setting.policy is Policy.CHUNKED else None,
        kv_budget_tokens=scheduler.kv_budget_tokens,
        switches=scheduler.switches if setting.bundle else None,
    )
