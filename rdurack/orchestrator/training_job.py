"""DDP training jobs on the rack: what is refused up front, and the job's result from
its ranks' reports.

A job's ranks are its sockets in order (node by node), one process each. The
orchestrator runs the job in segments of steps (progress between them, cancellation,
a retry resumes from the last checkpoint rank 0 wrote).
"""

from __future__ import annotations

import base64
from typing import Any

from rdurack.errors import InvalidRequest, OneProcessPerSocket
from rdurack.rack.models import ModelSpec
from rdurack.rack.spec import PlatformSpec
from rdurack.workloads.training.job import (
    NUMPY_MODELS,
    RankReport,
    TrainingWorkload,
    check_fits,
    step_cost,
)
from rdurack.workloads.training.progressive import Stage

FIELD = "spec.training"


def validate_training(
    w: TrainingWorkload, platform: PlatformSpec, functional: bool, models: dict[str, ModelSpec]
) -> None:
    """Refuse, before storing, a training job that could never run: the wrong payload
    mode for its model, a rank that does not fit a socket (RESOURCE_EXHAUSTED)."""
    if w.world_size > platform.sockets:
        raise OneProcessPerSocket(
            f"{FIELD}.world_size: {w.world_size} ranks on {platform.sockets} sockets would put "
            f"two processes on one socket; each rank needs a socket of its own (one process "
            f"per socket): use a world_size of at most {platform.sockets}"
        )
    if w.loop:
        if not functional:
            raise InvalidRequest(f"{FIELD}.loop: a client's own loop computes: use FUNCTIONAL")
    elif w.functional != functional:
        mode = "FUNCTIONAL" if w.functional else "TIMING"
        kind = "a small real numpy model" if w.functional else "a model preset, timed only"
        raise InvalidRequest(
            f"spec.payload_mode: {w.model!r} is {kind}: run it in {mode} mode "
            f"(numpy models: {', '.join(NUMPY_MODELS)}; presets: {', '.join(sorted(models))})"
        )
    check_fits(w, platform, step_cost(w, platform, models))


def training_result(
    w: TrainingWorkload,
    platform: PlatformSpec,
    reports: list[RankReport],
    losses: list[float],
    start_ns: int,
) -> dict[str, Any]:
    """The job's result (TrainingResult's fields) from its ranks' final reports."""
    reports = sorted(reports, key=lambda r: r.rank)
    first = reports[0]
    end = max(r.end_ns for r in reports)
    emulated_s = (end - start_ns) * 1e-9
    steps = first.step - first.result.get("start_step", 0)
    per = (lambda ns: ns * 1e-9 / steps) if steps else (lambda ns: 0.0)
    # Steps, from when the last rank began its first (after DDP's initial broadcast).
    step_s = per(end - max(r.steps_began_ns for r in reports))
    diagnostics: list[dict[str, Any]] = []
    for r in reports:  # the same finding on many ranks is one diagnostic
        for d in r.result.get("diagnostics", []):
            if all(d["code"] != seen["code"] for seen in diagnostics):
                diagnostics.append({k: d[k] for k in ("code", "message", "step")})
    result: dict[str, Any] = {
        "kind": "training",
        "emulated_s": emulated_s,
        "steps_completed": first.step,
        "samples_per_s": steps * w.global_batch / emulated_s if emulated_s else 0.0,
        # What a step takes beyond a rank's compute: the all-reduce backward did not
        # hide, and any wait for a straggler.
        "exposed_allreduce_s": max(0.0, step_s - per(first.compute_ns)),
        "step_time_s": step_s,
        "peak_hbm_bytes": max(r.hbm_peak_bytes for r in reports),
        "diagnostics": diagnostics,
        "losses": losses,
        "memory": first.memory,
        "compute_s": per(first.compute_ns),
        # The rank that waited least: its communication stream's all-reduce time, not
        # counting waits for late peers (the root of the initial broadcast runs ahead).
        "allreduce_s": per(min(r.all_reduce_ns for r in reports)),
        "world_size": w.world_size,
        "start_step": first.result.get("start_step", 0),
        "checkpoints": [c for r in reports for c in r.result.get("checkpoints", [])],
        "platform": platform.name,
        "model": w.model if not w.loop else "(client loop)",
        "loop_results": [base64.b64encode(r.loop_result).decode() for r in reports]
        if w.loop
        else [],
    }
    if first.result.get("final_loss") is not None:
        result["final_loss"] = first.result["final_loss"]
    if first.result.get("test_accuracy") is not None:
        result["test_accuracy"] = first.result["test_accuracy"]
    result |= {
        "strategy": w.strategy,
        "hbm_cap_bytes": w.hbm_cap_bytes,
        "peak_ddr_bytes": max(r.peak_bytes.get("ddr", 0) for r in reports),
        "socket_memory": [
            {
                "socket_id": r.socket_id,
                **{f"peak_{t}_bytes": r.peak_bytes.get(t, 0) for t in ("sram", "hbm", "ddr")},
            }
            for r in reports
        ],
        "stages": job_stages(reports),
    }
    return result


def job_stages(reports: list[RankReport]) -> list[dict[str, Any]]:
    """The job's stages (TrainingStage's fields) from its ranks' reports."""
    ranks = [r.result.get("stages", []) for r in sorted(reports, key=lambda r: r.rank)]
    return [
        stage_fields([stages[i] for stages in ranks if i < len(stages)])
        for i in range(len(ranks[0]))
    ]


def stage_fields(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """TrainingStage's fields from one stage of each rank (StageReport.to_dict() with
    its emulated_s), rank order: rank 0's steps, movement, loss and accuracy; peaks and
    duration, the largest over the ranks."""
    lead = ranks[0]
    stage: dict[str, Any] = {
        "name": Stage(lead["phase"], lead.get("block")).name,
        "phase": lead["phase"],
        "start_step": lead["start_step"],
        "steps": lead["steps"],
        "converged": lead["converged"],
        "peak_hbm_bytes": max(s["peak_bytes"].get("hbm", 0) for s in ranks),
        "peak_ddr_bytes": max(s["peak_bytes"].get("ddr", 0) for s in ranks),
        "emulated_s": max(s.get("emulated_s", 0.0) for s in ranks),
    }
    for key, field in (
        ("block", "block"),
        ("frozen_at_step", "frozen_at_step"),
        ("movement", "movement"),
        ("test_accuracy", "test_accuracy"),
        ("loss", "final_loss"),
    ):
        if lead.get(key) is not None:
            stage[field] = lead[key]
    return stage
