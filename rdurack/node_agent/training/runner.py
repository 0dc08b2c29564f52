"""`RankRunner`: one rank of one training job on a socket, run in segments of steps
(the orchestrator sees progress between them), each segment traced.

What it runs: the built-in loop (workloads/training/loop.py) for the built-in models, its
passes timed on the socket's clock (training/timed.py); a timing-only loop of the same
shape for model presets (DDP's traffic and compute as descriptors, no numbers); or a
torchrun-style script or a client's own function (training/script.py, over the "rdu"
torch process group), once, in a thread of its own (training/script_thread.py) that each
segment waits on for some steps. The built-in loops' collectives go over training/backend.py, each
waiting at most the workload's `wall_timeout_s` for a peer.

Memory: the built-in loop accounts what it holds, stage by stage, on the socket's tiers
(workloads/training/memory.py; a progressive stage change moves weights between HBM and
DDR, which takes the copy's emulated time); a script or a client's function holds its
tensors as it runs (training/script_memory.py); a preset holds its planned memory for the
whole job. Either way under the job's HBM cap. A job on another platform (a DGX) takes
that platform's socket memory instead of the socket's.
"""

from __future__ import annotations

import importlib
from collections.abc import Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opentelemetry.context import Context

from rdurack.errors import InvalidRequest, RdurackError
from rdurack.node_agent.timeline.hardware_trace import HardwareTrace
from rdurack.node_agent.training.backend import LinkBackend
from rdurack.node_agent.training.host import RankHost
from rdurack.node_agent.training.recorder import RankRecorder
from rdurack.node_agent.training.timed import StepTiming, backward, forward
from rdurack.rack.clock import seconds_to_ns
from rdurack.rack.memory import TieredMemory
from rdurack.rack.models import ModelSpec
from rdurack.rack.presets import platform as preset
from rdurack.rack.spec import PlatformSpec, Tier
from rdurack.workloads.training.data import import_loader
from rdurack.workloads.training.job import (
    SCRIPT_PROGRESS_S,
    RankReport,
    TrainingWorkload,
)
from rdurack.workloads.training.memory import MemoryAccount
from rdurack.workloads.training.rank import (
    CheckpointEvent,
    RankContext,
    RankResult,
    StageEvent,
    StepInfo,
)
from rdurack.workloads.training.scaling import model_cost, step_cost

if TYPE_CHECKING:  # torch: the runner imports it where a built-in model, a script or a
    # client's function runs
    from rdurack.node_agent.training.script import ScriptRank
    from rdurack.node_agent.training.script_memory import TensorMemory
    from rdurack.node_agent.training.script_thread import ScriptThread
    from rdurack.workloads.training.models import Trainable


JOB_ENDED = "its job ended"  # why a script still running when its job ends stops


class RankRunner:
    """One rank of one training job on `socket`."""

    def __init__(
        self,
        socket: RankHost,
        job_id: str,
        w: TrainingWorkload,
        platform_name: str,
        group: list[str],
        models: dict[str, ModelSpec],
        checkpoint_dir: str = "",
    ) -> None:
        if socket.name not in group:
            raise InvalidRequest(f"{socket.name} is not a rank of {group}")
        self.socket = socket
        self.job_id = job_id
        self.w = w
        self.group = group
        self.rank = group.index(socket.name)
        self.platform: PlatformSpec = (
            socket.platform
            if platform_name in ("", socket.platform.name)
            else preset(platform_name)
        )
        self.memory = (
            socket.memory
            if self.platform is socket.platform
            else TieredMemory(socket.name, self.platform.socket)
        )
        self.cost = step_cost(w, self.platform, models)
        self.backend = LinkBackend(
            socket.engine, socket.clock, job_id, group, self.rank, w.wall_timeout_s
        )
        self.backend.set_timeout(w.timeout_s)
        self.recorder = RankRecorder(self.rank, w.blocks)
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else None
        self._script: ScriptRank | None = None
        self._thread: ScriptThread | None = None  # a script's, once it started
        self._tensors: TensorMemory | None = None
        self._start_ns = socket.clock.now_ns
        self._steps: Generator[StepInfo, None, RankResult | None] | None = None
        self._step = StepInfo(0, 0, 0.0)
        self._result: dict[str, Any] | None = None
        self._loop_result = b""
        self.account = MemoryAccount(self.memory, f"{job_id}/train/", w.hbm_cap_bytes)
        # The built-in loop accounts its own arrays; a script or a client's function
        # holds its tensors as it runs (script_memory.py); a preset holds the plan.
        self._accounted = w.functional and not w.user_code
        if not self._accounted:
            if not w.user_code:
                self.account.place(
                    {
                        part: (Tier.HBM, nbytes)
                        for part, nbytes in self.cost.memory.to_dict().items()
                        if part != "total" and nbytes
                    }
                )
            self.account.begin_stage()
            self.account.mark()
        self._memory: dict[str, Any] = self.cost.memory.to_dict()  # a script's: measured

    def prepare(self) -> RankReport:
        """Start the rank and run no step: what its steps run on imported now (the
        constructor imported the cost model's), so that its first step meets its peers
        without keeping them waiting for its start (job.START_TIMEOUT_S)."""
        if self.w.user_code:  # torch and a script's support
            importlib.import_module("rdurack.node_agent.training.script")
        elif self.w.functional:  # torch, DDP and the dataset's loader
            importlib.import_module("rdurack.workloads.training.loop")
            import_loader(self.w.dataset)
        return self._report([])

    def advance(
        self, steps: int, hardware: HardwareTrace, parent: Context, start_ns: int | None = None
    ) -> RankReport:
        """Run up to `steps` more steps (0: to the end) from `start_ns` (default: the
        socket's clock), and trace them on `hardware`, children of `parent`."""
        clock = self.socket.clock
        if start_ns is not None:
            clock.advance_to(start_ns)
            if self._steps is None:
                self._start_ns = clock.now_ns
        began = clock.now_ns
        losses = self._run(steps)
        if not self._accounted:
            self.account.end_stage()
        report = self._report(losses)
        self.recorder.segment(hardware, parent, self.job_id, self.w.model, began, report)
        return report

    def _run(self, steps: int) -> list[float]:
        """Up to `steps` more steps (0: to the end), or the client's loop; their losses."""
        losses: list[float] = []
        if self._result is not None:
            return losses
        if self.w.user_code:
            self._result = self._script_segment(steps)
            return losses
        if self._steps is None:
            self._steps = self._make_steps()
        while steps == 0 or len(losses) < steps:
            try:
                self._step = next(self._steps)
            except StopIteration as end:
                result = end.value
                self._result = result.to_dict() if result is not None else {}
                break
            losses.append(self._step.loss)
            self._end_step(self._step)
        return losses

    def _report(self, losses: list[float]) -> RankReport:
        b = self.backend
        outcome = self._result or {}
        stages = zip(outcome.get("stages", []), self.recorder.stage_ns, strict=False)
        for stage, (began, ended) in stages:
            stage["emulated_s"] = (ended - began) * 1e-9
        return RankReport(
            socket_id=self.socket.name,
            rank=self.rank,
            step=self._step.step,
            total=self._step.total,
            finished=self._result is not None,
            losses=losses,
            start_ns=self._start_ns,
            end_ns=self.socket.clock.now_ns,
            steps_began_ns=b.steps_began_ns or self._start_ns,
            compute_ns=seconds_to_ns(b.compute_s),
            all_reduce_ns=b.all_reduce_ns,
            exposed_ns=b.exposed_ns,
            memory=self._memory,
            hbm_peak_bytes=self.account.peaks[Tier.HBM.value],
            result=outcome,
            loop_result=self._loop_result,
            peak_bytes=dict(self.account.peaks),
            stage=self._step.stage,
        )

    def _make_steps(self) -> Generator[StepInfo, None, RankResult | None]:
        if self.w.functional:
            ctx = RankContext(
                self.backend,
                self.rank,
                self.socket.name,
                self.checkpoint_dir,
                timing=self._timed,
                memory=self.account,
                on_stage=self._on_stage,
                on_checkpoint=self._on_checkpoint,
            )
            return self._functional(ctx)
        return self._timing()

    def _timed(self, model: Trainable) -> StepTiming:
        """The passes of `model` (a stage's) on the socket's clock."""
        cost = model_cost(model, self.w, self.platform, self.cost.memory)
        return StepTiming(self.backend, cost, self.socket)

    def _on_stage(self, event: StageEvent) -> None:
        """A stage began (its weights' moves between tiers take their copy time) or
        ended."""
        self.backend.settle()
        clock = self.socket.clock
        if event.report is None:
            self.account.mark()  # the stage's first step counts from its own holdings
            clock.advance(event.copy_s)
            self.recorder.stage_began(clock.now_ns)
        else:
            self.recorder.stage_ended(event.stage.name, event.report, clock.now_ns)

    def _end_step(self, info: StepInfo) -> None:
        b = self.backend
        b.settle()  # the step lasts until its gradients are all-reduced
        gradients, b.gradients = b.gradients, None
        peaks = self.account.window_peaks()
        self.account.mark()
        self.recorder.step_ended(
            info, b.step_began_ns, self.socket.clock.now_ns, gradients, b.exposed_ns, peaks
        )

    def _on_checkpoint(self, event: CheckpointEvent) -> None:
        self.backend.settle()
        self.recorder.checkpoint(event, self.socket.clock.now_ns)

    def _functional(self, ctx: RankContext) -> Generator[StepInfo, None, RankResult | None]:
        from rdurack.workloads.training.loop import train_steps  # torch: see _run_script

        result = yield from train_steps(ctx, self.w.train_spec(resume=True))
        self.backend.settle()
        return result

    def _timing(self) -> Generator[StepInfo, None, RankResult | None]:
        """A preset model: DDP's traffic and compute as descriptors, no numbers."""
        b, cost, socket = self.backend, self.cost, self.socket
        itemsize = 2  # BF16 gradients and weights
        b.broadcast_bytes(cost.memory.gradients, itemsize)  # DDP: rank 0's parameters
        total = self.w.steps or 10
        for step in range(total):
            forward(b, cost, socket)
            backward(b, cost, socket)
            for nbytes in cost.bucket_bytes:
                b.all_reduce_bytes(nbytes, itemsize)
            yield StepInfo(step + 1, total, float("nan"))
        b.settle()
        return None

    def _script_segment(self, steps: int) -> dict[str, Any] | None:
        """The job's script (or its client's function) as this rank: started in a
        thread at the first call, then waited for up to `steps` more optimizer steps
        or SCRIPT_PROGRESS_S (0 steps: to its end); its steps traced; its result once it
        has ended."""
        if self._thread is None:
            self._start_script()
        assert self._thread is not None and self._script is not None
        streams = self._script.links.streams
        ended = self._thread.wait(steps, SCRIPT_PROGRESS_S)
        records, streams.records = streams.records, []
        for r in records:
            if r is None:
                self.recorder.skipped()
                continue
            info = StepInfo(r.step, 0, float("nan"))  # total 0: traced (it is recorded)
            self.recorder.step_ended(info, r.began_ns, r.end_ns, r.gradients, r.exposed_ns, {})
        self._step = StepInfo(streams.steps, streams.steps if ended else 0, float("nan"))
        return self._script_result() if ended else None

    def _start_script(self) -> None:
        if self.checkpoint_dir is None:
            raise InvalidRequest(
                "a script job needs a job directory: start the orchestrator with a "
                "checkpoint directory (its ranks share a working folder there)"
            )
        # torch only where a job runs torch (a built-in model, a script, a function),
        # not for a preset's timing-only job: importing it takes a socket about a second
        # of CPU, which 32 sockets at once on two cores can hardly spare (their agents'
        # heartbeats starved once).
        from rdurack.node_agent.training.script import ScriptRank
        from rdurack.node_agent.training.script_memory import TensorMemory
        from rdurack.node_agent.training.script_thread import ScriptThread

        script = ScriptRank(self.socket, self.job_id, self.group, self.rank, self.w, self.platform)
        self._script, self._tensors = script, TensorMemory(self.account)
        job_dir, memory = self.checkpoint_dir, self._tensors
        name = f"rank {self.rank} ({self.socket.name})"
        self._thread = ScriptThread(
            lambda: script.run(job_dir, memory), script.links.streams, self.w.run_timeout_s, name
        )

    def _script_result(self) -> dict[str, Any]:
        """A finished script's figures per optimizer step."""
        assert self._script is not None and self._tensors is not None
        self._memory = self._tensors.breakdown()
        self._loop_result = self._script.returned
        streams = self._script.links.streams
        b = self.backend
        b.all_reduce_ns, b.exposed_ns = streams.all_reduce_ns, streams.exposed_ns
        b.compute_s = streams.compute_ns * 1e-9
        steps = max(streams.steps, 1)
        checks = self._script.links.checks
        assert checks is not None
        return {
            "rank": self.rank,
            "device": self.socket.name,
            "diagnostics": checks.diagnostics,
            "script": {
                "saved": checks.saved,
                "steps": streams.steps,
                "step_time_s": streams.step_s(),
                "compute_s": streams.compute_ns * 1e-9 / steps,
                "allreduce_s": streams.all_reduce_ns * 1e-9 / steps,
                "exposed_allreduce_s": streams.exposed_ns * 1e-9 / steps,
                "flops": streams.flops,
                "operators": streams.operators,
            },
        }

    def request_stop(self, reason: str = JOB_ENDED) -> None:
        """Ask this rank's script, if it still runs, to stop (script_thread.py)."""
        if self._thread is not None:
            self._thread.request_stop(reason)

    def stopping(self) -> ScriptThread | None:
        """Stop this rank's script if it still runs (the job ended without it: cancelled,
        or another rank failed); its thread if that has not ended yet."""
        thread = self._thread
        if thread is None or not thread.alive:
            return None
        try:
            thread.stop(JOB_ENDED)
        except RdurackError:
            return thread
        return None

    def close(self) -> ScriptThread | None:
        """Free what the rank holds; a script's thread that did not stop yet."""
        lingering = self.stopping()
        if self._script is not None:
            self._script.close()
        self.account.close()
        return lingering
