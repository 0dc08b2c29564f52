"""proto <-> domain conversion for jobs and the rack view (both directions, one place)."""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format
from google.protobuf.timestamp_pb2 import Timestamp
from pydantic import ValidationError

from rdurack.errors import InvalidRequest
from rdurack.orchestrator.gateway import NodeView
from rdurack.orchestrator.jobs import EndpointWorkload, Job, JobSpec, JobState
from rdurack.orchestrator.results import RESULTS, JobResult
from rdurack.orchestrator.store import Event
from rdurack.v1 import common_pb2, job_pb2, rack_pb2, serve_pb2
from rdurack.wire import rack as convert
from rdurack.wire import training as training_convert
from rdurack.wire.passes import bundle_from_proto, bundle_to_proto
from rdurack.workloads.coe.spec import CoeWorkload
from rdurack.workloads.serving.speculative import SpeculativeSetting
from rdurack.workloads.training.job import TrainingWorkload

STATE_TO_PROTO = {s: common_pb2.JobState.Value(f"JOB_STATE_{s.value}") for s in JobState}
STATE_FROM_PROTO = {v: k for k, v in STATE_TO_PROTO.items()}


def spec_from_proto(p: job_pb2.JobSpec, default_platform: str) -> JobSpec:
    """A typed JobSpec; errors name the proto field path (spec.kernel.num_sockets)."""
    kind = p.WhichOneof("workload")
    if kind is None:
        raise InvalidRequest("spec.workload: required; set spec.kernel")
    if kind == "coe_inference":
        workload = _coe_from_proto(p.coe_inference)
    elif kind == "training":
        workload = training_convert.workload_from_proto(p.training)
    elif kind == "endpoint":
        # Proto3's 0 is unset: a socket count of 0 is refused by the model.
        workload = {"kind": "endpoint", "model": p.endpoint.model}
        workload["num_sockets"] = p.endpoint.num_sockets
        workload["bundle"] = bundle_from_proto(p.endpoint, "spec.endpoint.bundle")
    else:
        workload = _kernel(p)
    try:
        return JobSpec(
            name=p.name,
            priority=p.priority,
            platform=p.platform or default_platform,
            payload_mode="functional"
            if p.payload_mode == common_pb2.PAYLOAD_MODE_FUNCTIONAL
            else "timing",
            workload=workload,
        )
    except ValidationError as e:
        first = e.errors()[0]
        loc = [str(x) for x in first["loc"] if x != "workload"]  # the tag is the proto's oneof
        raise InvalidRequest(f"spec.{'.'.join(loc)}: {first['msg']}") from None


def _kernel(p: job_pb2.JobSpec) -> dict[str, Any]:
    k = p.kernel
    if k.phase == common_pb2.PHASE_UNSPECIFIED:
        raise InvalidRequest("spec.kernel.phase: required (PREFILL, DECODE, TRAIN or SERVE)")
    if k.phase not in convert.JOB_PHASES:
        raise InvalidRequest(f"spec.kernel.phase: {k.phase} is not PREFILL, DECODE, TRAIN or SERVE")
    if k.fusion_plan not in convert.PLANS and k.fusion_plan != common_pb2.FUSION_PLAN_UNSPECIFIED:
        raise InvalidRequest(f"spec.kernel.fusion_plan: {k.fusion_plan} is not a fusion plan")
    workload: dict[str, Any] = {
        "kind": "kernel",
        "model": k.model,
        "phase": convert.JOB_PHASES[k.phase],
        # Proto3 cannot tell 0 from unset: a required size of 0 is refused by the model.
        "sequence_length": k.sequence_length,
        "num_sockets": k.num_sockets,
    }
    if k.fusion_plan != common_pb2.FUSION_PLAN_UNSPECIFIED:
        workload["fusion_plan"] = convert.PLANS[k.fusion_plan]
    if k.batch_size:
        workload["batch_size"] = k.batch_size
    if k.output_tokens:
        workload["output_tokens"] = k.output_tokens
    if k.HasField("speculative"):
        workload["speculative"] = speculative_from_proto(k.speculative)
    if k.expert_mapping:
        try:
            workload["expert_mapping"] = convert.mapping(k.expert_mapping)
        except InvalidRequest as e:
            raise InvalidRequest(f"spec.kernel.{e}") from None
    return workload


def speculative_from_proto(p: serve_pb2.SpeculativeDecoding) -> dict[str, Any]:
    """A SpeculativeSetting's fields, the set ones only (proto3's zero is unset): its
    defaults fill the rest."""
    d: dict[str, Any] = {"draft_model": p.draft_model or None}
    if p.draft_tokens:
        d["draft_tokens"] = p.draft_tokens
    if p.HasField("acceptance"):
        d["acceptance"] = p.acceptance
    return d


def speculative_to_proto(s: SpeculativeSetting | None) -> serve_pb2.SpeculativeDecoding | None:
    if s is None:
        return None
    return serve_pb2.SpeculativeDecoding(
        draft_model=s.draft_model or "", draft_tokens=s.draft_tokens, acceptance=s.acceptance
    )


def _coe_from_proto(c: job_pb2.CoeInferenceJob) -> dict[str, Any]:
    """Proto3 cannot tell 0 from unset: unset (zero) fields are left out, so the
    model's defaults apply; fields where zero means something are `optional`."""
    d: dict[str, Any] = json_format.MessageToDict(c, preserving_proto_field_name=True)
    d["kind"] = "coe_inference"
    if "decode_plan" in d:
        value = common_pb2.FusionPlan.Value(d["decode_plan"])
        if value not in convert.PLANS:
            raise InvalidRequest("spec.coe_inference.decode_plan: not a fusion plan")
        d["decode_plan"] = convert.PLANS[value]
    for key in ("num_experts", "reserved_hbm_bytes", "seed", "batch_size", "output_tokens"):
        if key in d:
            d[key] = int(d[key])  # MessageToDict writes 64-bit integers as strings
    if "poisson" in d and "seed" in d["poisson"]:
        d["poisson"]["seed"] = int(d["poisson"]["seed"])
    return d


def spec_to_proto(spec: JobSpec, client_request_id: str | None = None) -> job_pb2.JobSpec:
    w = spec.workload
    msg = job_pb2.JobSpec(
        name=spec.name,
        priority=spec.priority,
        platform=spec.platform,
        client_request_id=client_request_id or "",
        payload_mode=common_pb2.PAYLOAD_MODE_FUNCTIONAL
        if spec.payload_mode == "functional"
        else common_pb2.PAYLOAD_MODE_TIMING,
    )
    if isinstance(w, CoeWorkload):
        d = w.model_dump(mode="json", exclude={"kind"}, exclude_none=True)
        if w.decode_plan is not None:
            d["decode_plan"] = convert.PLAN_TO_PROTO[w.decode_plan]
        json_format.ParseDict(d, msg.coe_inference)
        return msg
    if isinstance(w, TrainingWorkload):
        msg.training.CopyFrom(training_convert.workload_to_proto(w))
        return msg
    if isinstance(w, EndpointWorkload):
        msg.endpoint.CopyFrom(
            job_pb2.EndpointJob(
                model=w.model, num_sockets=w.num_sockets, bundle=bundle_to_proto(w.bundle)
            )
        )
        return msg
    msg.kernel.CopyFrom(
        job_pb2.KernelJob(
            model=w.model,
            phase=convert.job_phase_to_proto(w.phase),
            fusion_plan=convert.plan_to_proto(w.fusion_plan),
            sequence_length=w.sequence_length,
            batch_size=w.batch_size,
            num_sockets=w.num_sockets,
            output_tokens=w.output_tokens,
            speculative=speculative_to_proto(w.speculative),
            expert_mapping=convert.mapping_to_proto(w.expert_mapping),
        )
    )
    return msg


def timestamp(seconds: float) -> Timestamp:
    t = Timestamp()
    t.FromNanoseconds(int(seconds * 1e9))
    return t


def result_to_proto(result: JobResult) -> job_pb2.JobResult:
    """The result's kind names the JobResult oneof field it sets; its fields are the
    message's (a field left None, such as a kernel's tokens_per_s outside decode, is
    left unset)."""
    fields = result.model_dump(mode="json", exclude={"kind"}, exclude_none=True)
    return json_format.ParseDict({result.kind: fields}, job_pb2.JobResult())


def job_to_proto(job: Job) -> job_pb2.Job:
    msg = job_pb2.Job(
        id=job.id,
        spec=spec_to_proto(job.spec, job.client_request_id),
        state=STATE_TO_PROTO[job.state],
        create_time=timestamp(job.created_s),
        update_time=timestamp(job.updated_s),
        sockets=[convert.socket_ref(s) for s in job.sockets],
        emulated_start_ns=job.emulated_start_ns or 0,
        emulated_end_ns=job.emulated_end_ns or 0,
        error_message=job.error,
        tenant=job.tenant,
    )
    if job.started_s is not None:
        msg.start_time.CopyFrom(timestamp(job.started_s))
    if job.finished_s is not None:
        msg.end_time.CopyFrom(timestamp(job.finished_s))
    if job.result is not None:
        msg.result.CopyFrom(result_to_proto(job.result))
    return msg


def event_to_proto(event: Event) -> job_pb2.JobEvent:
    msg = job_pb2.JobEvent(job_id=event.job_id, sequence=event.seq, time=timestamp(event.time_s))
    p = event.payload
    if event.kind == "state":
        previous = p.get("previous")
        msg.state_change.CopyFrom(
            job_pb2.JobStateChange(
                from_state=STATE_TO_PROTO[JobState(previous)]
                if previous
                else common_pb2.JOB_STATE_UNSPECIFIED,
                to_state=STATE_TO_PROTO[JobState(p["state"])],
                reason=str(p.get("reason") or p.get("error") or ""),
            )
        )
    elif event.kind == "result":  # a result as JSON (a kernel's may have no kind)
        msg.result.CopyFrom(result_to_proto(RESULTS.validate_python(p)))
    elif event.kind == "progress":
        msg.progress.CopyFrom(
            job_pb2.JobProgress(fraction=float(p["fraction"]), message=str(p.get("message", "")))
        )
    else:  # other notes (a placement that failed and will be retried)
        msg.progress.CopyFrom(job_pb2.JobProgress(message=f"{event.kind}: {p}"))
    return msg


def node_to_proto(node: NodeView) -> rack_pb2.NodeStatus:
    msg = rack_pb2.NodeStatus(
        index=node.index,
        agent_address=node.address,
        healthy=node.healthy,
        health_reason=node.error,
    )
    if node.since_s is not None:
        msg.health_since.CopyFrom(timestamp(node.since_s))
    for s in node.sockets:
        status = msg.sockets.add(
            ref=convert.socket_ref(s.socket_id),
            health=convert.health(s.healthy, s.dead),
            current_job_id=s.job_id,
            emulated_clock_ns=s.clock_ns,
            link_address=s.link_address,
            tiers=[convert.tier_usage(name, t) for name, t in s.tiers.items()],
            health_reason=s.reason,
            slowdown=s.slowdown,
            incarnation=s.incarnation,
        )
        if s.since_s is not None:
            status.health_since.CopyFrom(timestamp(s.since_s))
    return msg
