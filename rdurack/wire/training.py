"""Training jobs to and from rdurack.v1: the TrainingJob spec (job API and node agent
API alike) and a rank's progress report (RunTraining)."""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format

from rdurack.orchestrator.kinds.training import stage_fields
from rdurack.v1 import job_pb2, node_agent_pb2
from rdurack.workloads.training.job import RankReport, TrainingWorkload

# Fields a client may leave at zero for the default, but whose zero the model refuses:
# proto3 cannot tell 0 from unset, so an unset one is left out and the default applies.
ZERO_IS_DEFAULT = (
    "timeout_s",
    "wall_timeout_s",
    "learning_rate",
    "blocks",
    "freeze_window",
    "freeze_threshold",
)


def workload_from_proto(t: job_pb2.TrainingJob) -> dict[str, Any]:
    """The TrainingWorkload fields a message sets (pydantic validates them)."""
    d: dict[str, Any] = json_format.MessageToDict(t, preserving_proto_field_name=True)
    d["kind"] = "training"
    for key in ("seed", "bucket_cap_bytes", "hbm_cap_bytes"):
        if key in d:
            d[key] = int(d[key])  # MessageToDict writes 64-bit integers as strings
    for key in ZERO_IS_DEFAULT:
        if d.get(key) == 0:
            del d[key]
    return d


def workload_to_proto(w: TrainingWorkload) -> job_pb2.TrainingJob:
    d = w.model_dump(mode="json", exclude={"kind"}, exclude_none=True)
    return json_format.ParseDict(d, job_pb2.TrainingJob())


def report_to_proto(r: RankReport) -> node_agent_pb2.RankTraining:
    result = r.result
    msg = node_agent_pb2.RankTraining(
        socket_id=r.socket_id,
        rank=r.rank,
        step=r.step,
        total_steps=r.total,
        finished=r.finished,
        losses=r.losses,
        emulated_start_ns=r.start_ns,
        emulated_end_ns=r.end_ns,
        steps_began_ns=r.steps_began_ns,
        compute_ns=r.compute_ns,
        all_reduce_ns=r.all_reduce_ns,
        exposed_ns=r.exposed_ns,
        memory=job_pb2.TrainingMemory(**r.memory),
        hbm_peak_bytes=r.hbm_peak_bytes,
        ddr_peak_bytes=r.peak_bytes.get("ddr", 0),
        sram_peak_bytes=r.peak_bytes.get("sram", 0),
        stage=r.stage,
        stages=[stage_to_proto(st) for st in result.get("stages", [])],
        diagnostics=[
            job_pb2.TrainingDiagnostic(code=d["code"], message=d["message"], step=d["step"])
            for d in result.get("diagnostics", [])
        ],
        samples_seen=result.get("samples_seen", 0),
        start_step=result.get("start_step", 0),
        checkpoints=result.get("checkpoints", []),
        loop_result=r.loop_result,
    )
    if "script" in result:
        msg.script.CopyFrom(node_agent_pb2.ScriptRank(**result["script"]))
    if result.get("test_accuracy") is not None:
        msg.test_accuracy = result["test_accuracy"]
    if result.get("final_loss") is not None:
        msg.final_loss = result["final_loss"]
    return msg


def report_from_proto(m: node_agent_pb2.RankTraining) -> RankReport:
    result: dict[str, Any] = {}
    if m.finished:
        result = {
            "diagnostics": [
                {"code": d.code, "message": d.message, "step": d.step} for d in m.diagnostics
            ],
            "samples_seen": m.samples_seen,
            "start_step": m.start_step,
            "checkpoints": list(m.checkpoints),
            "test_accuracy": m.test_accuracy if m.HasField("test_accuracy") else None,
            "final_loss": m.final_loss if m.HasField("final_loss") else None,
            "stages": [stage_from_proto(st) for st in m.stages],
        }
        if m.HasField("script"):
            x = m.script
            result["script"] = {
                "steps": x.steps,
                "step_time_s": x.step_time_s,
                "compute_s": x.compute_s,
                "allreduce_s": x.allreduce_s,
                "exposed_allreduce_s": x.exposed_allreduce_s,
                "flops": x.flops,
                "operators": x.operators,
                "saved": list(x.saved),
            }
    mem = m.memory
    return RankReport(
        socket_id=m.socket_id,
        rank=m.rank,
        step=m.step,
        total=m.total_steps,
        finished=m.finished,
        losses=list(m.losses),
        start_ns=m.emulated_start_ns,
        end_ns=m.emulated_end_ns,
        steps_began_ns=m.steps_began_ns,
        compute_ns=m.compute_ns,
        all_reduce_ns=m.all_reduce_ns,
        exposed_ns=m.exposed_ns,
        memory={
            "weights": mem.weights,
            "gradients": mem.gradients,
            "optimizer": mem.optimizer,
            "activations": mem.activations,
            "movement": mem.movement,
            "total": mem.total,
        },
        hbm_peak_bytes=m.hbm_peak_bytes,
        result=result,
        loop_result=m.loop_result,
        peak_bytes={"sram": m.sram_peak_bytes, "hbm": m.hbm_peak_bytes, "ddr": m.ddr_peak_bytes},
        stage=m.stage,
    )


def stage_to_proto(d: dict[str, Any]) -> job_pb2.TrainingStage:
    """One rank's stage (StageReport.to_dict(), with its emulated_s) as a message."""
    fields = stage_fields([d]).model_dump(mode="json", exclude_none=True)
    return json_format.ParseDict(fields, job_pb2.TrainingStage())


def stage_from_proto(m: job_pb2.TrainingStage) -> dict[str, Any]:
    """The inverse of stage_to_proto (SRAM, which training does not use, is 0)."""
    d = json_format.MessageToDict(
        m, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    return {
        "phase": m.phase,
        "block": d.get("block"),
        "start_step": m.start_step,
        "steps": m.steps,
        "converged": m.converged,
        "frozen_at_step": d.get("frozen_at_step"),
        "movement": d.get("movement"),
        "loss": d.get("final_loss"),
        "test_accuracy": d.get("test_accuracy"),
        "peak_bytes": {"sram": 0, "hbm": m.peak_hbm_bytes, "ddr": m.peak_ddr_bytes},
        "emulated_s": m.emulated_s,
    }
