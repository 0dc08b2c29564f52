"""Kernel jobs: a model's prefill, decode or training step on N sockets (tensor
parallel), or a whole batch of requests served (phase serve: the prefill, then the
decode). What is refused up front, the run (its steps in chunks on every node at once,
progress between chunks), and its result (KernelResult, per socket; a serve job's with
the report of `rdu predict serve`, made by the same code from the sockets' clocks)."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from rdurack.errors import InvalidRequest
from rdurack.orchestrator.gateway import KernelRun
from rdurack.orchestrator.jobs import JobSpec, KernelWorkload
from rdurack.orchestrator.kinds.contract import JobRun, KindContext, by_node, workload_of
from rdurack.orchestrator.results import KernelResult
from rdurack.rack.kernels import Phase, step
from rdurack.telemetry import names
from rdurack.workloads.predictor import Predictor
from rdurack.workloads.serving.batch import ServeBatch, resolve
from rdurack.workloads.serving.costs import Cost, segments
from rdurack.workloads.serving.report import report

# Workloads known to pass `validate`, kept for reuse (a few hundred bytes each).
VALID_KEPT = 1024


class KernelKind:
    """Kernel jobs on the rack of `context`."""

    def __init__(self, context: KindContext) -> None:
        self.context = context
        self.predictor = Predictor(context.platform)
        # Workloads that passed, oldest first. Whether one passes depends only on it and
        # on the context (the rack, its models), neither of which changes; pricing its
        # step to know was the largest part of SubmitJob's own CPU in a profile under a
        # stream of submissions, which mostly repeat a few workloads
        # (docs/control-plane.md, "Latency").
        self._valid: dict[KernelWorkload, None] = {}
        self._valid_lock = threading.Lock()

    def validate(self, spec: JobSpec) -> None:
        """The wrong platform or payload mode, an unknown model, an impossible socket
        count, a model that does not fit its sockets; speculation outside a serve job."""
        w = workload_of(spec, KernelWorkload)
        rack = self.context.platform.name
        if spec.platform != rack:
            raise InvalidRequest(f"spec.platform: this rack is {rack!r}, not {spec.platform!r}")
        if spec.payload_mode == "functional":
            raise InvalidRequest(
                "spec.payload_mode: FUNCTIONAL kernel jobs need models with real weights; "
                "the presets have none: use TIMING"
            )
        with self._valid_lock:
            if w in self._valid:
                return
        self._check(spec, w)
        with self._valid_lock:
            self._valid[w] = None
            if len(self._valid) > VALID_KEPT:
                del self._valid[next(iter(self._valid))]  # the oldest

    def _check(self, spec: JobSpec, w: KernelWorkload) -> None:
        """What `validate` asks of the spec's workload `w` (raises InvalidRequest)."""
        if w.model not in self.context.models:
            accepted = ", ".join(sorted(self.context.models))
            raise InvalidRequest(
                f"spec.kernel.model: unknown model {w.model!r}; accepted: {accepted}"
            )
        self.context.scheduler.check(spec)
        if w.serves:
            self._batch(w)  # the TP split, the plan, the draft and HBM, with the numbers
            return
        if w.speculative is not None:
            raise InvalidRequest(
                "spec.kernel.speculative: speculative decoding runs in a SERVE job (a whole "
                f"batch); a {w.step_phase().name} job runs plain steps"
            )
        try:
            model = self.context.models[w.model].placed(w.expert_mapping)
        except InvalidRequest as e:
            raise InvalidRequest(f"spec.kernel.expert_mapping: {e}") from None
        step(model, w.step_phase(), w.batch_size, w.sequence_length, w.num_sockets)  # TP divides
        kv_tokens = (
            0 if w.phase is Phase.TRAIN else w.batch_size * (w.sequence_length + w.output_tokens)
        )
        self.predictor.check_fits_hbm(model, w.num_sockets, kv_tokens)

    def attributes(self, spec: JobSpec) -> dict[str, str]:
        w = workload_of(spec, KernelWorkload)
        return {names.ATTR_JOB_MODEL: w.model, names.ATTR_JOB_PHASE: str(w.phase)}

    def execute(self, job: JobRun) -> None:
        """A decode job's tokens (other phases: its one step) in the context's
        `progress_chunks` chunks, progress after each; a serve job's prefill, then its
        decode in as many segments."""
        w = workload_of(job.job.spec, KernelWorkload)
        if w.serves:
            self._serve(job, w)
            return
        start = job.start()
        nodes = by_node(job.job.sockets)
        total = w.output_tokens if w.phase is Phase.DECODE else 1
        chunks = _split(total, min(self.context.progress_chunks, total))
        now, done, spent = start, 0, Cost()
        for steps in chunks:
            runs = self._run(job, w, nodes, steps, now)
            spent += _measured(runs, now)
            now = max(r.end_ns for r in runs)
            done += steps
            job.progress(done / total, f"{done} of {total} steps", now)
        job.finish(self._result(w, spent, total), end_ns=now)

    def _serve(self, job: JobRun, w: KernelWorkload) -> None:
        """The prefill alone, then the decode iterations in segments; the report from
        what the sockets' clocks measured, by workloads/serving/report.py."""
        batch = self._batch(w)
        start = job.start()
        nodes = by_node(job.job.sockets)
        now, prefill, decode = start, Cost(), Cost()
        for first, count in segments(batch, self.context.progress_chunks):
            runs = self._run(job, w, nodes, count, now, first)
            if first == 0:
                prefill = _measured(runs, now)
                message = "prefill: first token"
            else:
                decode += _measured(runs, now)
                message = f"{first + count - 1} of {batch.iterations} decode iterations"
            now = max(r.end_ns for r in runs)
            job.progress((first + count) / batch.steps, message, now)
        served = report(batch, prefill, decode)
        total = prefill + decode
        job.finish(
            KernelResult(
                emulated_s=served.e2e_s,
                kernel_calls=round(total.kernel_calls),
                hbm_bandwidth_utilization=served.hbm_bandwidth_utilization,
                compute_utilization=self._compute_utilization(total),
                tokens_per_s=served.tokens_per_s,
                launch_overhead_s=total.launch_s,
                serve=served,
            ),
            end_ns=now,
        )

    def _batch(self, w: KernelWorkload) -> ServeBatch:
        return resolve(w.serve_request(), self.context.platform, self.context.models)

    def _run(
        self,
        job: JobRun,
        w: KernelWorkload,
        nodes: dict[int, list[str]],
        steps: int,
        at: int,
        first: int = 0,
    ) -> list[KernelRun]:
        """`steps` steps (from `first`) on every node of the job at once, from `at`."""
        job.check()

        def part(node: int, ids: list[str]) -> list[KernelRun]:
            return job.gateway.run_kernel(
                node, job.job.id, ids, w, steps, at, first_step=first, group=job.job.sockets
            )

        return job.on_nodes(nodes, part)

    def _result(self, w: KernelWorkload, spent: Cost, steps: int) -> KernelResult:
        """A kernel job's result; bytes, calls and FLOPs are per socket."""
        emulated_s = spent.seconds
        peak = self.context.platform.socket.hbm.bandwidth_bytes_per_s
        tokens_per_s = None
        if w.phase is Phase.DECODE:
            tokens_per_s = w.batch_size * steps / emulated_s if emulated_s else 0.0
        return KernelResult(
            emulated_s=emulated_s,
            kernel_calls=round(spent.kernel_calls),
            hbm_bandwidth_utilization=spent.hbm_bytes / (emulated_s * peak) if emulated_s else 0.0,
            compute_utilization=self._compute_utilization(spent),
            tokens_per_s=tokens_per_s,
            launch_overhead_s=spent.launch_s,
        )

    def _compute_utilization(self, spent: Cost) -> float:
        peak = self.context.platform.socket.peak_flops_per_s
        return spent.flops / (spent.seconds * peak) if spent.seconds else 0.0


def _measured(runs: Sequence[KernelRun], start_ns: int) -> Cost:
    """What a chunk cost a socket, from the sockets' runs since `start_ns`: its time by
    their clocks, the rest per socket (every socket of the group runs the same kernels)."""
    return Cost(
        seconds=(max(r.end_ns for r in runs) - start_ns) * 1e-9,
        launch_s=max(r.launch_ns for r in runs) * 1e-9,
        collective_s=max(r.collective_ns for r in runs) * 1e-9,
        hbm_bytes=max(r.hbm_bytes for r in runs),
        flops=max(r.flops for r in runs),
        kernel_calls=max(r.kernel_calls for r in runs),
    )


def _split(total: int, parts: int) -> list[int]:
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]
