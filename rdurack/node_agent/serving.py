"""A socket's serving calls: a serve job's steps (`serve`) and an endpoint's forward
passes (`run_passes`), priced by workloads/serving/ as `rdu predict serve` prices them.

A mixin of Socket (node_agent/socket.py), which holds the state these calls use: a
socket's calls are one actor's methods, and serving is one concept among its kernels,
programs, training and collectives.
"""

from __future__ import annotations

from rdurack.errors import InvalidRequest, UnknownName
from rdurack.node_agent.job_memory import JobMemory
from rdurack.node_agent.runs import PassesRun, Run
from rdurack.node_agent.timeline.hardware_trace import HardwareTrace
from rdurack.node_agent.timeline.pacing import Pacer
from rdurack.rack.clock import EmulatedClock
from rdurack.rack.models import ModelSpec
from rdurack.rack.placement import place
from rdurack.rack.spec import PlatformSpec
from rdurack.telemetry.propagation import extract
from rdurack.telemetry.served import PassesServed
from rdurack.workloads.predictor import Predictor
from rdurack.workloads.serving.batch import ServeRequest, resolve
from rdurack.workloads.serving.costs import Cost, serve_parts
from rdurack.workloads.serving.stream.bundle import BundleLayout
from rdurack.workloads.serving.stream.pricing import Pass, cost


class Serving:
    """The serving calls of a Socket; the attributes are the socket's (its __init__)."""

    name: str
    platform: PlatformSpec
    clock: EmulatedClock
    slowdown: float
    _held: JobMemory
    _pacer: Pacer
    _trace: HardwareTrace
    _predictor: Predictor
    _models: dict[str, ModelSpec]

    def _hold(self, job_id: str) -> None:
        raise NotImplementedError  # the socket's: the job must hold it

    def serve(
        self,
        job_id: str,
        request: ServeRequest,
        first_step: int,
        steps: int,
        start_ns: int | None = None,
        carrier: dict[str, str] | None = None,
    ) -> Run:
        """Steps first_step .. first_step + steps - 1 of a serve job (step 0 the prefill,
        step i the decode iteration i - 1), priced by workloads/serving/ as `rdu predict
        serve` prices them: this socket's share of a TP group of `request.sockets`. The
        models' weight shares and final KV caches are held in HBM for the job. A span
        for the prefill and one for the decode iterations."""
        self._hold(job_id)
        batch = resolve(request, self.platform, self._models)
        for m, placement in zip(batch.models, batch.placements, strict=True):
            self._held.hold_model(job_id, m.name, placement, batch.kv_tokens())
        self._pacer.meet(start_ns)
        start = self.clock.now_ns
        total = Cost()
        for part in serve_parts(self._predictor, batch, first_step, steps):
            at = self.clock.now_ns
            self.clock.advance(part.cost.seconds * self.slowdown)
            total += part.cost
            self._trace.serve(extract(carrier), job_id, at, self.clock.now_ns, batch, part)
        self._pacer.pace()
        return Run(
            self.name,
            start,
            self.clock.now_ns,
            kernel_calls=round(total.kernel_calls),
            hbm_bytes=round(total.hbm_bytes),
            flops=round(total.flops),
            launch_ns=round(total.launch_s * 1e9),
            collective_ns=round(total.collective_s * 1e9),
        )

    def run_passes(
        self,
        job_id: str,
        model: ModelSpec,
        group_size: int,
        passes: list[Pass],
        kv_tokens: int,
        start_ns: int | None = None,
        carrier: dict[str, str] | None = None,
        served: PassesServed | None = None,
        bundle: BundleLayout | None = None,
    ) -> PassesRun:
        """An endpoint's forward passes, one after the other, priced as `rdu predict
        serve --arrivals` prices them: this socket's share of a TP group of
        `group_size`. The model's weight share stays held in HBM for the job; its KV
        cache is what the engine's requests hold now (`kv_tokens`, the whole group's).
        A span per pass, linked to the spans of the requests it served (`served`). Of
        a CoE `bundle` (`model` its experts'), the socket holds the bundle's share
        instead of the model's, and a pass pays its router and its switch."""
        self._hold(job_id)
        if not passes:
            raise InvalidRequest("passes: at least one")
        router = None
        if bundle is None:
            placed = place(model, self.platform, group_size, 0)
            self._held.hold_model(job_id, model.name, placed, 0)
        else:
            if bundle.router_model not in self._models:
                raise UnknownName("model", bundle.router_model, sorted(self._models))
            router = self._models[bundle.router_model]
            self._held.hold(job_id, bundle.holdings(model, router, group_size))
        kv = place(model, self.platform, group_size, kv_tokens).kv_hbm_bytes
        self._held.hold_kv(job_id, model.name, kv_tokens, kv)
        self._pacer.meet(start_ns)
        start = self.clock.now_ns
        parent = extract(carrier)
        links = served.links() if served is not None else [[] for _ in passes]
        durations = []
        for i, done in enumerate(passes):
            at = self.clock.now_ns
            spent = cost(self._predictor, model, group_size, done, router)
            self.clock.advance(spent.seconds * self.slowdown)
            durations.append(self.clock.now_ns - at)
            self._trace.passed(
                parent, job_id, at, self.clock.now_ns, model.name, done, spent, kv_tokens,
                None if served is None else served.first_iteration + i, links[i],
            )  # fmt: skip
        self._pacer.pace()
        return PassesRun(self.name, start, self.clock.now_ns, tuple(durations))
