"""Endpoint jobs: the sockets of one model of an OpenAI-compatible endpoint (`rdu serve
--rack`), held until the job is cancelled.

The endpoint batches its requests itself (endpoint/engine.py); it sends the job its
iterations as forward passes (`run`, the RunPasses RPC), which run on the job's sockets
as kernel jobs do: their clocks advance by each pass, their HBM holds the model's weight
share and the KV cache the engine's requests hold, and each pass is a span on their
lanes. `execute` only holds the sockets: it starts the job and waits, between checks,
until the job is cancelled, its run is stopped (a socket died: the job is queued again,
and `run` answers unavailable until it runs again), or the orchestrator stops.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from rdurack.errors import InvalidRequest, LinkFailure
from rdurack.orchestrator.jobs import EndpointWorkload, JobSpec
from rdurack.orchestrator.kinds.contract import Cancelled, JobRun, KindContext, by_node, workload_of
from rdurack.rack.kernels import Phase, step
from rdurack.telemetry import names
from rdurack.telemetry.served import PassesServed
from rdurack.workloads.predictor import Predictor
from rdurack.workloads.serving.stream.pricing import Pass, kv_budget_tokens

# Bounds on what a client sends with passes: an offset of a century of emulated time,
# a KV cache of 2^40 tokens; beyond them the sockets' ns clocks and sizes overflow.
MAX_OFFSET_NS = 100 * 365 * 24 * 3600 * 10**9
MAX_KV_TOKENS = 1 << 40

# How often a held job checks whether it was cancelled or its run stopped, wall s: the
# delay before a cancelled endpoint's sockets are free.
CHECK_S = 0.2


@dataclass
class _Held:
    """A running endpoint job: its run, its emulated start, and a lock that keeps one
    call of passes at a time on its sockets (and the job from ending under one)."""

    job: JobRun
    start_ns: int
    lock: threading.Lock = field(default_factory=threading.Lock)


class EndpointKind:
    """Endpoint jobs on the rack of `context`."""

    def __init__(self, context: KindContext) -> None:
        self.context = context
        self.predictor = Predictor(context.platform)
        self._held: dict[str, _Held] = {}  # job id -> the job while it runs
        self._lock = threading.Lock()
        self._stopping = threading.Event()  # the orchestrator stops: holds end

    def stop(self) -> None:
        """The orchestrator stops: every hold ends, its job left RUNNING in the store (as
        after a crash), so that the next orchestrator queues it again."""
        self._stopping.set()

    def validate(self, spec: JobSpec) -> None:
        """The wrong platform, an unknown model, an impossible socket count, a model
        whose weights leave no HBM for a KV cache on its sockets."""
        w = workload_of(spec, EndpointWorkload)
        rack = self.context.platform.name
        if spec.platform != rack:
            raise InvalidRequest(f"spec.platform: this rack is {rack!r}, not {spec.platform!r}")
        if w.model not in self.context.models:
            accepted = ", ".join(sorted(self.context.models))
            raise InvalidRequest(
                f"spec.endpoint.model: unknown model {w.model!r}; accepted: {accepted}"
            )
        self.context.scheduler.check(spec)
        model = self.context.models[w.model].placed(None)
        if w.bundle is not None:
            router = w.bundle.router_model
            if router not in self.context.models:
                accepted = ", ".join(sorted(self.context.models))
                raise InvalidRequest(
                    f"spec.endpoint.bundle.router_model: unknown model {router!r}; "
                    f"accepted: {accepted}"
                )
            try:
                step(model, Phase.DECODE, 1, 1, w.num_sockets)
                w.bundle.check(
                    self.context.platform, model, self.context.models[router], w.num_sockets
                )
            except InvalidRequest as e:
                raise InvalidRequest(f"spec.endpoint.bundle: {e}") from None
            return
        try:
            step(model, Phase.DECODE, 1, 1, w.num_sockets)  # the TP split divides the heads
            budget = kv_budget_tokens(self.predictor, model, w.num_sockets)
        except InvalidRequest as e:
            raise InvalidRequest(f"spec.endpoint.num_sockets: {e}") from None
        if budget <= 0:
            raise InvalidRequest(
                f"spec.endpoint.num_sockets: {w.model} on {w.num_sockets} sockets leaves no "
                "HBM for a KV cache; use more sockets"
            )

    def attributes(self, spec: JobSpec) -> dict[str, str]:
        w = workload_of(spec, EndpointWorkload)
        return {names.ATTR_JOB_MODEL: w.model, names.ATTR_JOB_PHASE: "endpoint"}

    def execute(self, job: JobRun) -> None:
        """Hold the sockets until the job is cancelled (or its run stopped: raised)."""
        held = _Held(job, 0)
        try:
            with held.lock:  # a pass asked for as soon as the job runs waits for its start
                with self._lock:
                    self._held[job.job.id] = held
                held.start_ns = job.start()
            job.progress(0.0, "serving: the endpoint's passes run here", held.start_ns)
            while not self._stopping.wait(CHECK_S):
                job.check()  # Cancelled or Aborted end the hold
        finally:
            with self._lock:
                self._held.pop(job.job.id, None)
            with held.lock:  # a call of passes in flight ends first
                pass

    def run(
        self,
        job_id: str,
        offset_ns: int,
        passes: Sequence[Pass],
        kv_tokens: int,
        served: PassesServed | None = None,
    ) -> tuple[list[int], int]:
        """`passes` one after the other on the job's sockets, the first from `offset_ns`
        after the job's start; each pass's duration on the slowest socket (ns), and the
        job's start (ns). LinkFailure (unavailable) while the job is not running.
        `served`: the requests each pass served (their spans link to theirs)."""
        if not 0 <= offset_ns <= MAX_OFFSET_NS:
            raise InvalidRequest(f"offset_ns: {offset_ns} is not within 0..{MAX_OFFSET_NS}")
        if not 0 <= kv_tokens <= MAX_KV_TOKENS:
            raise InvalidRequest(f"kv_tokens: {kv_tokens} is not within 0..{MAX_KV_TOKENS}")
        if not passes:
            raise InvalidRequest("passes: at least one")
        with self._lock:
            held = self._held.get(job_id)
        gone = LinkFailure(
            f"endpoint job {job_id} is not running on its sockets now (queued again after "
            "a socket failed, or ended)"
        )
        if held is None:
            raise gone
        with held.lock:
            job = held.job
            try:
                job.check()
            except Cancelled:
                raise gone from None
            w = workload_of(job.job.spec, EndpointWorkload)

            def part(node: int, ids: list[str]) -> list[list[int]]:
                runs = job.gateway.run_passes(
                    node, job_id, ids, w, passes, kv_tokens, held.start_ns + offset_ns, served
                )
                return [list(r.durations_ns) for r in runs]

            per_socket = job.on_nodes(by_node(job.job.sockets), part)
        return [max(d[i] for d in per_socket) for i in range(len(passes))], held.start_ns
