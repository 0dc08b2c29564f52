"""How `rdu` shows things: a job and the rack as the dicts `--json` prints and tables
show, the formats of their cells (seconds, bytes, tokens/s, a job's state), and `emit`,
which prints a dict as one JSON object or as a two-column table."""

from __future__ import annotations

import json
from typing import Any, cast

from google.protobuf import json_format
from rich.console import Console
from rich.table import Table

from rdurack.v1 import common_pb2, job_pb2, rack_pb2
from rdurack.workloads.serving.report import ServeReport

# The CoE result fields the CLI shows, in order (`per_request` follows in --json).
RESULT_KEYS = (
    "emulated_s",
    "requests",
    "tokens",
    "tokens_per_s",
    "switch_s",
    "switches",
    "hbm_hit_rate",
    "router_s",
    "p50_latency_s",
    "p99_latency_s",
    "p50_ttft_s",
    "p99_ttft_s",
    "mean_tpot_s",
    "switches_per_expert",
    "oom",
    "oom_reason",
    "diagnostics",
    "decode_plan",
)
# The training result fields the CLI shows, in order.
TRAINING_KEYS = (
    "test_accuracy",
    "final_loss",
    "step_time_s",
    "samples_per_s",
    "peak_hbm_bytes",
    "emulated_s",
    "steps_completed",
    "start_step",
    "compute_s",
    "allreduce_s",
    "exposed_allreduce_s",
    "memory",
    "diagnostics",
    "losses",
    "checkpoints",
    "peak_ddr_bytes",
    "hbm_cap_bytes",
    "socket_memory",
    "stages",
)
TIER_NAMES = {common_pb2.TIER_SRAM: "sram", common_pb2.TIER_HBM: "hbm", common_pb2.TIER_DDR: "ddr"}


# --------------------------------------------------------------------- printing


def emit(as_json: bool, data: dict[str, Any], title: str) -> None:
    """`data` as one JSON object, or as a table of its keys and values (a nested
    object's as `key.inner`)."""
    if as_json:
        print(json.dumps(data))
        return
    table = Table(title=title, show_header=False)
    for key, value in _flat(data):
        if isinstance(value, list):
            value = ", ".join(fmt(v) for v in value)
        table.add_row(key, fmt(value))
    Console().print(table)


def study_table(columns: list[str], cells: list[list[str]], caption: str, markdown: bool) -> None:
    """A study's rows: a Markdown table with its caption under it, or a terminal table
    with its caption above."""
    if markdown:
        print("| " + " | ".join(columns) + " |")
        print("|" + "---|" * len(columns))
        for line in cells:
            print("| " + " | ".join(line) + " |")
        print(f"\n{caption}.")
        return
    table = Table(title=caption)
    for column in columns:
        table.add_column(column, justify="right")
    for line in cells:
        table.add_row(*line)
    Console().print(table)


def _flat(data: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    rows: list[tuple[str, Any]] = []
    for key, value in data.items():
        if isinstance(value, dict) and value:
            rows += _flat(value, f"{prefix}{key}.")
        else:
            rows.append((f"{prefix}{key}", value))
    return rows


def fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return "-" if value is None else str(value)


def show_job(job: job_pb2.Job, as_json: bool) -> None:
    """One job: its dict as JSON, or a table where long lists are summed up."""
    data = job_dict(job)
    if as_json:
        print(json.dumps(data))
        return
    data["sockets"] = ", ".join(data["sockets"]) or None
    per_request = data.pop("per_request", None)
    if per_request:
        data["per_request"] = f"{len(per_request)} requests (--json lists them)"
    losses = data.pop("losses", None)
    if losses:
        data["losses"] = f"{len(losses)} steps, first {losses[0]:.4f}, last {losses[-1]:.4f}"
    emit(False, data, f"job {job.id}")


# --------------------------------------------------------------------- cells


def state_name(value: int) -> str:
    """A job state as `rdu` names it: SUCCEEDED, not JOB_STATE_SUCCEEDED."""
    return common_pb2.JobState.Name(cast(common_pb2.JobState.ValueType, value)).removeprefix(
        "JOB_STATE_"
    )


def styled_state(state: str) -> str:
    color = {"SUCCEEDED": "green", "FAILED": "red", "CANCELLED": "yellow"}.get(state)
    return f"[{color}]{state}[/]" if color else state


def format_seconds(value: float | None) -> str:
    if value is None:
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value / 1e-9:.3g} ns"


def format_size(n: int) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} B"


def format_tokens(job: dict[str, Any]) -> str:
    """Tokens per emulated second for tables: decode's generated tokens; other phases
    only when the orchestrator reports a rate."""
    rate = job["tokens_per_s"]
    if rate is None or (rate == 0 and job["phase"] != "decode"):
        return "-"
    return f"{rate:,.0f}"


# --------------------------------------------------------------------- a job


def _proto_dict(message: Any) -> dict[str, Any]:
    return json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


def job_dict(job: job_pb2.Job) -> dict[str, Any]:
    """One job as the CLI prints it; result fields are null until it SUCCEEDED."""
    kind = job.spec.WhichOneof("workload")
    if kind == "coe_inference":
        return coe_dict(job)
    if kind == "training":
        return training_dict(job)
    if kind == "endpoint":  # the sockets of a model of `rdu serve --rack`: no result
        e = job.spec.endpoint
        return _essentials(job, e.model, "endpoint", num_sockets=e.num_sockets)
    k = job.spec.kernel
    has = job.result.HasField("kernel")
    r = job.result.kernel
    emulated: float | None = r.emulated_s if has else None
    if emulated is None and job.emulated_end_ns:
        emulated = (job.emulated_end_ns - job.emulated_start_ns) / 1e9
    data = {
        "job_id": job.id,
        "name": job.spec.name,
        "state": state_name(job.state),
        "model": k.model,
        "phase": common_pb2.Phase.Name(k.phase).removeprefix("PHASE_").lower(),
        "fusion_plan": common_pb2.FusionPlan.Name(k.fusion_plan)
        .removeprefix("FUSION_PLAN_")
        .lower()
        .replace("_", "-"),
        "num_sockets": k.num_sockets,
        "sockets": [s.id for s in job.sockets],
        "emulated_s": emulated,
        "kernel_calls": r.kernel_calls if has else None,
        "hbm_bandwidth_utilization": r.hbm_bandwidth_utilization if has else None,
        "compute_utilization": r.compute_utilization if has else None,
        "tokens_per_s": r.tokens_per_s if has else None,
        "launch_overhead_s": r.launch_overhead_s if has else None,
        "error": job.error_message or None,
    }
    if k.phase == common_pb2.PHASE_SERVE:
        data |= serve_fields(job)
    return data


def serve_fields(job: job_pb2.Job) -> dict[str, Any]:
    """A serve job's figures, the fields of `rdu predict serve` (its report, once the job
    has one; before, its spec's sizes and nulls)."""
    if job.result.kernel.HasField("serve"):
        report = ServeReport.model_validate(
            json_format.MessageToDict(job.result.kernel.serve, preserving_proto_field_name=True)
        )
        return report.model_dump(mode="json")
    k = job.spec.kernel
    sizes = {
        "platform": job.spec.platform,
        "model": k.model,
        "num_sockets": k.num_sockets,
        "batch_size": k.batch_size,
        "prompt_tokens": k.sequence_length,
        "output_tokens": k.output_tokens,
    }
    return {key: sizes.get(key) for key in ServeReport.model_fields}


def _essentials(job: job_pb2.Job, model: str, phase: str, **sizes: int) -> dict[str, Any]:
    """The fields a CoE or training job shows first, its `sizes` between its platform and
    its sockets (the order of --json and of the table)."""
    return {
        "job_id": job.id,
        "name": job.spec.name,
        "state": state_name(job.state),
        "model": model,
        "phase": phase,
        "platform": job.spec.platform,
        **sizes,
        "sockets": [s.id for s in job.sockets],
        "error": job.error_message or None,
    }


def coe_dict(job: job_pb2.Job) -> dict[str, Any]:
    """A CoE job: its spec's essentials and, once it has one, its result (a job that
    FAILED for lack of memory has one too, with oom true)."""
    c = job.spec.coe_inference
    has = job.result.HasField("coe_inference")
    data = _essentials(
        job,
        c.expert_model or "llama2-7b",
        "coe",
        num_experts=c.num_experts or 150,
        num_sockets=c.num_sockets or 8,
    )
    result = _proto_dict(job.result.coe_inference)
    for key in RESULT_KEYS:
        data[key] = result.get(key) if has else None
    if has:
        data["tokens"] = int(result.get("tokens", 0))
        data["per_request"] = result.get("per_request", [])
    return data


def training_dict(job: job_pb2.Job) -> dict[str, Any]:
    """A training job: its spec's essentials and, once it SUCCEEDED, its result."""
    t = job.spec.training
    has = job.result.HasField("training")
    result = _proto_dict(job.result.training)
    data = _essentials(
        job, t.model or "mlp", "train", world_size=t.world_size or 4, num_sockets=t.world_size or 4
    )
    for key in TRAINING_KEYS:
        data[key] = result.get(key) if has else None
    data["strategy"] = t.strategy or "full"
    if has:
        # MessageToDict writes 64-bit integers as strings.
        for key in ("peak_hbm_bytes", "peak_ddr_bytes", "hbm_cap_bytes"):
            data[key] = int(result.get(key, 0))
        data["memory"] = {k: int(v) for k, v in (data["memory"] or {}).items()}
        for row in (*data["stages"], *data["socket_memory"]):
            for key in [k for k in row if k.endswith("_bytes")]:
                row[key] = int(row[key])
    data["tokens_per_s"] = None  # the jobs table's column; training reports samples/s
    return data


# --------------------------------------------------------------------- the rack


def rack_dict(rack: rack_pb2.RackStatus) -> dict[str, Any]:
    """The rack as `rdu status --json` prints it: its nodes, and every socket's health,
    job, emulated clock and memory per tier."""
    sockets: list[dict[str, Any]] = []
    for node in rack.nodes:
        for s in node.sockets:
            sockets.append(
                {
                    "id": s.ref.id,
                    "node": s.ref.node_index,
                    "socket": s.ref.socket_index,
                    "health": rack_pb2.SocketHealth.Name(s.health).removeprefix("SOCKET_HEALTH_"),
                    "health_reason": s.health_reason or None,
                    "health_since_s": _seconds_of(s, "health_since"),
                    "slowdown": s.slowdown or 1.0,
                    "incarnation": s.incarnation,
                    "job": s.current_job_id or None,
                    "emulated_clock_ns": s.emulated_clock_ns,
                    "link_address": s.link_address,
                    "tiers": {
                        TIER_NAMES.get(t.tier, str(t.tier)): {
                            "used_bytes": t.used_bytes,
                            "peak_bytes": t.peak_bytes,
                            "capacity_bytes": t.capacity_bytes,
                        }
                        for t in s.tiers
                    },
                }
            )
    return {
        "platform": rack.platform,
        "nodes": [
            {
                "index": n.index,
                "agent_address": n.agent_address,
                "healthy": n.healthy,
                "health_reason": n.health_reason or None,
                "health_since_s": _seconds_of(n, "health_since"),
            }
            for n in rack.nodes
        ],
        "sockets": sockets,
        "control_plane": {
            "replica": rack.control_plane.replica,
            "leader": rack.control_plane.leader or None,
            "term": rack.control_plane.term or None,
        },
    }


def _seconds_of(msg: rack_pb2.SocketStatus | rack_pb2.NodeStatus, field: str) -> float | None:
    """A Timestamp field as wall-clock seconds (Unix time), None when unset."""
    if not msg.HasField(field):  # type: ignore[arg-type]
        return None
    return float(getattr(msg, field).ToNanoseconds() * 1e-9)
