"""Kernel jobs: a model's prefill, decode or training step on N sockets (tensor
parallel). What is refused up front, the run (its steps in chunks on every node at
once, progress between chunks), and its result (KernelResult, per socket)."""

from __future__ import annotations

from rdurack.errors import InvalidRequest
from rdurack.orchestrator.gateway import KernelRun
from rdurack.orchestrator.jobs import JobSpec, KernelWorkload
from rdurack.orchestrator.kinds.contract import JobRun, KindContext, by_node, workload_of
from rdurack.orchestrator.results import KernelResult
from rdurack.rack.kernels import Phase, step
from rdurack.telemetry import names
from rdurack.workloads.predictor import Predictor


class KernelKind:
    """Kernel jobs on the rack of `context`."""

    def __init__(self, context: KindContext) -> None:
        self.context = context
        self.predictor = Predictor(context.platform)

    def validate(self, spec: JobSpec) -> None:
        """The wrong platform or payload mode, an unknown model, an impossible socket
        count, a model that does not fit its sockets."""
        w = workload_of(spec, KernelWorkload)
        rack = self.context.platform.name
        if spec.platform != rack:
            raise InvalidRequest(f"spec.platform: this rack is {rack!r}, not {spec.platform!r}")
        if spec.payload_mode == "functional":
            raise InvalidRequest(
                "spec.payload_mode: FUNCTIONAL kernel jobs need models with real weights; "
                "the presets have none: use TIMING"
            )
        if w.model not in self.context.models:
            accepted = ", ".join(sorted(self.context.models))
            raise InvalidRequest(
                f"spec.kernel.model: unknown model {w.model!r}; accepted: {accepted}"
            )
        self.context.scheduler.check(spec)
        model = self.context.models[w.model]
        step(model, w.phase, w.batch_size, w.sequence_length, w.num_sockets)  # TP divides
        kv_tokens = (
            0 if w.phase is Phase.TRAIN else w.batch_size * (w.sequence_length + w.output_tokens)
        )
        self.predictor.check_fits_hbm(model, w.num_sockets, kv_tokens)

    def attributes(self, spec: JobSpec) -> dict[str, str]:
        w = workload_of(spec, KernelWorkload)
        return {names.ATTR_JOB_MODEL: w.model, names.ATTR_JOB_PHASE: w.phase.value}

    def execute(self, job: JobRun) -> None:
        """A decode job's tokens (other phases: its one step) in the context's
        `progress_chunks` chunks, progress after each."""
        start = job.start()
        w = workload_of(job.job.spec, KernelWorkload)
        nodes = by_node(job.job.sockets)
        total = w.output_tokens if w.phase is Phase.DECODE else 1
        chunks = _split(total, min(self.context.progress_chunks, total))
        now, done, calls, hbm_bytes, flops = start, 0, 0, 0, 0
        for steps in chunks:
            job.check()

            def part(n: int, ids: list[str], steps: int = steps, at: int = now) -> list[KernelRun]:
                return job.gateway.run_kernel(n, job.job.id, ids, w, steps, at)

            runs = job.on_nodes(nodes, part)
            now = max(r.end_ns for r in runs)
            done += steps
            calls += max(r.kernel_calls for r in runs)  # per socket: all run the same kernels
            hbm_bytes += max(r.hbm_bytes for r in runs)
            flops += max(r.flops for r in runs)
            job.progress(done / total, f"{done} of {total} steps", now)
        job.finish(self._result(w, now - start, total, calls, hbm_bytes, flops), end_ns=now)

    def _result(
        self,
        w: KernelWorkload,
        emulated_ns: int,
        steps: int,
        calls: int,
        hbm_bytes: int,
        flops: int,
    ) -> KernelResult:
        """A kernel job's result; bytes, calls and FLOPs are per socket."""
        emulated_s = emulated_ns * 1e-9
        socket = self.context.platform.socket
        peak = socket.hbm.bandwidth_bytes_per_s
        tokens_per_s = None
        if w.phase is Phase.DECODE:
            tokens_per_s = w.batch_size * steps / emulated_s if emulated_s else 0.0
        return KernelResult(
            emulated_s=emulated_s,
            kernel_calls=calls,
            hbm_bandwidth_utilization=hbm_bytes / (emulated_s * peak) if emulated_s else 0.0,
            compute_utilization=(
                flops / (emulated_s * socket.peak_flops_per_s) if emulated_s else 0.0
            ),
            tokens_per_s=tokens_per_s,
        )


def _split(total: int, parts: int) -> list[int]:
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]
