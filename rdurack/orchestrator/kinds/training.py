"""DDP training jobs on the rack: what is refused up front, the run (segments of steps
on every node at once), and the job's result (TrainingResult) from its ranks' reports.

A job's ranks are its sockets in order (node by node), one process each; they meet over
the links. The job runs in segments of steps: progress and cancellation between them,
and a retry resumes from the last checkpoint rank 0 wrote in the job's directory.
"""

from __future__ import annotations

import base64
import math
from pathlib import Path
from typing import Any

from rdurack.errors import InvalidRequest, OneProcessPerSocket
from rdurack.orchestrator.jobs import JobSpec
from rdurack.orchestrator.kinds.contract import JobRun, KindContext, by_node, workload_of
from rdurack.orchestrator.kinds.platforms import job_platform
from rdurack.orchestrator.results import (
    TrainingDiagnostic,
    TrainingMemory,
    TrainingResult,
    TrainingSocketMemory,
    TrainingStage,
)
from rdurack.rack.spec import PlatformSpec
from rdurack.telemetry import names
from rdurack.workloads.training.job import (
    BUILT_IN_MODELS,
    RankReport,
    TrainingWorkload,
    ranks_of,
)
from rdurack.workloads.training.progressive import Stage
from rdurack.workloads.training.rank import EVERY_RANK_CHECKPOINTS
from rdurack.workloads.training.scaling import check_fits, step_cost

FIELD = "spec.training"


class TrainingKind:
    """Training jobs on the rack of `context`. `checkpoint_dir`: where jobs checkpoint
    (a directory per job) on a filesystem every node agent sees; None: they do not."""

    def __init__(self, context: KindContext, checkpoint_dir: Path | None) -> None:
        self.context = context
        self.checkpoint_dir = checkpoint_dir

    def validate(self, spec: JobSpec) -> None:
        """Refuse, before storing, a training job that could never run: the wrong payload
        mode for its model, a rank that does not fit a socket (RESOURCE_EXHAUSTED), a
        size the rack cannot place."""
        w = workload_of(spec, TrainingWorkload)
        platform = job_platform(self.context.platform, spec.platform)
        functional = spec.payload_mode == "functional"
        if w.world_size > platform.sockets:
            raise OneProcessPerSocket(
                f"{FIELD}.world_size: {w.world_size} ranks on {platform.sockets} sockets would "
                f"put two processes on one socket; each rank needs a socket of its own (one "
                f"process per socket): use a world_size of at most {platform.sockets}"
            )
        if w.user_code:
            what = "script" if w.script else "loop"
            if not functional:
                raise InvalidRequest(f"{FIELD}.{what}: the user's code computes: use FUNCTIONAL")
            if self.checkpoint_dir is None:
                raise InvalidRequest(
                    f"{FIELD}.{what}: the ranks of a script or a client's loop share a job "
                    "directory, and this orchestrator has none: start it with a checkpoint "
                    "directory"
                )
        elif w.functional != functional:
            mode = "FUNCTIONAL" if w.functional else "TIMING"
            kind = "a small real torch model" if w.functional else "a model preset, timed only"
            presets = ", ".join(sorted(self.context.models))
            raise InvalidRequest(
                f"spec.payload_mode: {w.model!r} is {kind}: run it in {mode} mode "
                f"(built-in models: {', '.join(BUILT_IN_MODELS)}; presets: {presets})"
            )
        if not w.user_code:  # the user's code holds what its tensors hold, as it runs
            check_fits(w, platform, step_cost(w, platform, self.context.models))
        self.context.scheduler.check(spec)

    def attributes(self, spec: JobSpec) -> dict[str, str]:
        return {names.ATTR_JOB_MODEL: workload_of(spec, TrainingWorkload).model}

    def execute(self, job: JobRun) -> None:
        """Segments of steps on every node at once (the ranks meet over the links);
        progress and cancellation between segments."""
        start = job.start()
        w = workload_of(job.job.spec, TrainingWorkload)
        platform = job_platform(self.context.platform, job.job.spec.platform)
        ranks = ranks_of(list(job.job.sockets))
        links = {s.socket_id: s.link_address for n in job.gateway.nodes() for s in n.sockets}
        group = [(sid, links.get(sid, "")) for sid in ranks]
        nodes = by_node(ranks)
        checkpoints = str(self.checkpoint_dir / job.job.id) if self.checkpoint_dir else ""
        name = "" if platform is self.context.platform else platform.name
        # Every rank started (its imports, its runner) before any waits for a peer: a
        # rank still starting is not a dead one (job.START_TIMEOUT_S).
        job.progress(0.0, f"starting {len(ranks)} ranks", start)

        def start_ranks(n: int, ids: list[str]) -> list[RankReport]:
            return job.gateway.train(
                n, job.job.id, ids, w, group, platform_name=name, checkpoint_dir=checkpoints,
                prepare=True,
            )  # fmt: skip

        job.on_nodes(nodes, start_ranks)
        losses: list[float] = []
        segment, first = 1, True  # the first segment is one step: it tells the total
        said = ""  # the last progress message
        while True:
            job.check()

            def part(
                n: int, ids: list[str], steps: int = segment, at: int = start if first else 0
            ) -> list[RankReport]:
                return job.gateway.train(
                    n,
                    job.job.id,
                    ids,
                    w,
                    group,
                    platform_name=name,
                    steps=steps,
                    start_ns=at,
                    checkpoint_dir=checkpoints,
                )

            reports = job.on_nodes(nodes, part)
            first = False
            lead = min(reports, key=lambda r: r.rank)
            losses += [x for x in lead.losses if not math.isnan(x)]  # timing mode: none
            loss = f", loss {losses[-1]:.4f}" if losses else ""
            fraction, message = _progress(w, lead, loss)
            if message != said:  # a script's call may come back with no new step
                job.progress(fraction, message, max(r.end_ns for r in reports))
                said = message
            if all(r.finished for r in reports):
                break
            # A script's total is its own (unknown here): as many steps again as it has
            # done, each call coming back within a window of wall time anyway
            # (SCRIPT_PROGRESS_S).
            chunk = lead.step if w.user_code else lead.total // self.context.progress_chunks
            segment = max(1, chunk)
        result = training_result(w, platform, reports, losses, start)
        job.finish(result, end_ns=max(r.end_ns for r in reports))


def _progress(w: TrainingWorkload, lead: RankReport, loss: str) -> tuple[float, str]:
    """The job's progress (a fraction) and its message, from rank 0's report."""
    if not lead.total:  # a script running: its steps so far, of a total it decides
        return 0.0, f"step {lead.step}{loss}"
    # Progressive: the total is every stage's budget; blocks freeze earlier.
    of = f"at most {lead.total}, {lead.stage}" if w.strategy != "full" else lead.total
    return lead.step / lead.total, f"step {lead.step} of {of}{loss}"


def training_result(
    w: TrainingWorkload,
    platform: PlatformSpec,
    reports: list[RankReport],
    losses: list[float],
    start_ns: int,
) -> TrainingResult:
    """The job's result from its ranks' final reports."""
    reports = sorted(reports, key=lambda r: r.rank)
    first = reports[0]
    end = max(r.end_ns for r in reports)
    emulated_s = (end - start_ns) * 1e-9
    steps = first.step - first.result.get("start_step", 0)
    per = (lambda ns: ns * 1e-9 / steps) if steps else (lambda ns: 0.0)
    # Steps, from when the last rank began its first (after DDP's initial broadcast).
    step_s = per(end - max(r.steps_began_ns for r in reports))
    script = [r.result["script"] for r in reports if "script" in r.result]
    if script:  # a script's own steps: what each rank measured (node_agent/.../runner.py)
        steps = script[0]["steps"]
        step_s = max(x["step_time_s"] for x in script)
        # The all-reduce and its exposed part of one rank, the one that waited least
        # (as for the built-in jobs).
        least = min(script, key=lambda x: x["allreduce_s"])
    diagnostics: list[TrainingDiagnostic] = []
    for r in reports:  # the same finding on many ranks is one diagnostic
        for d in r.result.get("diagnostics", []):
            if all(d["code"] != seen.code for seen in diagnostics):
                diagnostics.append(
                    TrainingDiagnostic(code=d["code"], message=d["message"], step=d["step"])
                )
    if script and (shared := checkpoint_writers(script)):
        diagnostics.append(shared)
    return TrainingResult(
        emulated_s=emulated_s,
        steps_completed=first.step,
        # A script's batch is its own: not known here.
        samples_per_s=steps * w.global_batch / emulated_s if emulated_s and not script else 0.0,
        # What a step takes beyond a rank's compute: the all-reduce backward did not
        # hide, and any wait for a straggler.
        exposed_allreduce_s=least["exposed_allreduce_s"]
        if script
        else max(0.0, step_s - per(first.compute_ns)),
        step_time_s=step_s,
        peak_hbm_bytes=max(r.hbm_peak_bytes for r in reports),
        diagnostics=tuple(diagnostics),
        losses=tuple(losses),
        memory=TrainingMemory.model_validate(first.memory),
        compute_s=script[0]["compute_s"] if script else per(first.compute_ns),
        # The rank that waited least: its communication stream's all-reduce time, not
        # counting waits for late peers (the root of the initial broadcast runs ahead).
        allreduce_s=least["allreduce_s"] if script else per(min(r.all_reduce_ns for r in reports)),
        world_size=w.world_size,
        start_step=first.result.get("start_step", 0),
        checkpoints=tuple(c for r in reports for c in r.result.get("checkpoints", [])),
        platform=platform.name,
        model=w.label,
        loop_results=tuple(base64.b64encode(r.loop_result).decode() for r in reports)
        if w.loop
        else (),
        final_loss=first.result.get("final_loss"),
        test_accuracy=first.result.get("test_accuracy"),
        strategy=w.strategy,
        hbm_cap_bytes=w.hbm_cap_bytes,
        peak_ddr_bytes=max(r.peak_bytes.get("ddr", 0) for r in reports),
        socket_memory=tuple(
            TrainingSocketMemory(
                socket_id=r.socket_id,
                peak_sram_bytes=r.peak_bytes.get("sram", 0),
                peak_hbm_bytes=r.peak_bytes.get("hbm", 0),
                peak_ddr_bytes=r.peak_bytes.get("ddr", 0),
            )
            for r in reports
        ),
        stages=job_stages(reports),
    )


def checkpoint_writers(script: list[dict[str, Any]]) -> TrainingDiagnostic | None:
    """The article's "every rank writes checkpoints": a file that more than one rank
    saved (`script`: each rank's figures, rank order)."""
    writers: dict[str, list[int]] = {}
    for rank, figures in enumerate(script):
        for path in dict.fromkeys(figures.get("saved", [])):
            writers.setdefault(path, []).append(rank)
    shared = {p: ranks for p, ranks in writers.items() if len(ranks) > 1}
    if not shared:
        return None
    path, ranks = max(shared.items(), key=lambda kv: len(kv[1]))
    return TrainingDiagnostic(
        code=EVERY_RANK_CHECKPOINTS,
        message=(
            f"{len(ranks)} ranks saved {Path(path).name}: they write the same file over "
            "each other (and on the hardware, each its own copy's I/O). Save on rank 0 "
            "only, then dist.barrier() before the others load it"
        ),
        step=0,
    )


def job_stages(reports: list[RankReport]) -> tuple[TrainingStage, ...]:
    """The job's stages from its ranks' reports."""
    ranks = [r.result.get("stages", []) for r in sorted(reports, key=lambda r: r.rank)]
    return tuple(
        stage_fields([stages[i] for stages in ranks if i < len(stages)])
        for i in range(len(ranks[0]))
    )


def stage_fields(ranks: list[dict[str, Any]]) -> TrainingStage:
    """A TrainingStage from one stage of each rank (StageReport.to_dict() with its
    emulated_s), rank order: rank 0's steps, movement, loss and accuracy; peaks and
    duration, the largest over the ranks."""
    lead = ranks[0]
    return TrainingStage(
        name=Stage(lead["phase"], lead.get("block")).name,
        phase=lead["phase"],
        block=lead.get("block"),
        start_step=lead["start_step"],
        steps=lead["steps"],
        converged=lead["converged"],
        frozen_at_step=lead.get("frozen_at_step"),
        movement=lead.get("movement"),
        test_accuracy=lead.get("test_accuracy"),
        final_loss=lead.get("loss"),
        peak_hbm_bytes=max(s["peak_bytes"].get("hbm", 0) for s in ranks),
        peak_ddr_bytes=max(s["peak_bytes"].get("ddr", 0) for s in ranks),
        emulated_s=max(s.get("emulated_s", 0.0) for s in ranks),
    )
