"""`rdu submit coe`: Composition-of-Experts inference on the rack, and the JSONL request
traces it reads (`--trace`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from rdurack.cli.jobs import payload_mode, submit_and_follow
from rdurack.cli.options import WATCH_TIMEOUT_S, JsonOpt, NameOpt, TimeoutOpt, WaitOpt
from rdurack.client.connection import Target
from rdurack.errors import InvalidRequest
from rdurack.rack.kernels import FusionPlan
from rdurack.v1 import job_pb2
from rdurack.wire.rack import PLAN_TO_PROTO
from rdurack.workloads.coe.spec import MAX_REQUESTS, TraceRequest


def read_trace(path: Path) -> list[job_pb2.CoeTraceRequest]:
    """A JSONL request trace: one object per line with arrival_s, prompt or
    prompt_tokens, and optionally expert and output_tokens. Errors name the line."""
    out: list[job_pb2.CoeTraceRequest] = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise InvalidRequest(f"--trace {path}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise InvalidRequest(f"--trace {path}: not UTF-8 text (byte {e.start})") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if len(out) >= MAX_REQUESTS:
            raise InvalidRequest(f"--trace {path}: more than {MAX_REQUESTS} requests")
        try:
            t = TraceRequest.model_validate(json.loads(line))
        except json.JSONDecodeError as e:
            raise InvalidRequest(f"--trace {path}:{n}: not JSON ({e.msg})") from None
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(x) for x in first["loc"])
            raise InvalidRequest(f"--trace {path}:{n}: {where}: {first['msg']}") from None
        msg = job_pb2.CoeTraceRequest(
            arrival_s=t.arrival_s, expert=t.expert or "", output_tokens=t.output_tokens or 0
        )
        if t.prompt is not None:
            msg.prompt = t.prompt
        if t.prompt_tokens is not None:
            msg.prompt_tokens = t.prompt_tokens
        out.append(msg)
    if not out:
        raise InvalidRequest(f"--trace {path}: no requests in the file")
    return out


def submit_coe_cmd(
    experts: Annotated[int, typer.Option(min=1, help="experts in the bundle")] = 150,
    batch_size: Annotated[int, typer.Option(min=1, help="requests per router pass")] = 8,
    output_tokens: Annotated[int, typer.Option(min=1, help="tokens per prompt")] = 20,
    platform: Annotated[
        str, typer.Option(help="the rack's own (default), or dgx-a100 / dgx-h100 / sn40l-node")
    ] = "",
    trace: Annotated[
        Path | None, typer.Option(help="JSONL requests: arrival_s, prompt|prompt_tokens, expert")
    ] = None,
    prompt: Annotated[
        list[str] | None, typer.Option("--prompt", help="a prompt (repeatable); routed by text")
    ] = None,
    poisson_rate: Annotated[
        float | None, typer.Option(min=0.0, help="Poisson load: arrivals per emulated second")
    ] = None,
    requests: Annotated[int, typer.Option(min=1, help="Poisson load: requests")] = 1000,
    skew: Annotated[float, typer.Option(min=0.0, help="Poisson load: Zipf exponent")] = 1.0,
    routing: Annotated[str, typer.Option(help="router, hint or hash")] = "router",
    node_routing: Annotated[str, typer.Option(help="cache-aware or random")] = "cache-aware",
    sockets: Annotated[int, typer.Option(min=1, help="8: one node; 16: both nodes")] = 8,
    pin: Annotated[list[str] | None, typer.Option("--pin", help="keep an expert in HBM")] = None,
    decode_plan: Annotated[
        FusionPlan | None, typer.Option(help="default: kernel-looped on SN40L, unfused on GPUs")
    ] = None,
    expert_model: Annotated[str, typer.Option(help="tiny-lm with --functional")] = "llama2-7b",
    functional: Annotated[
        bool, typer.Option("--functional", help="tiny experts really generate tokens")
    ] = False,
    seed: Annotated[int, typer.Option(min=0)] = 0,
    name: NameOpt = "",
    wait: WaitOpt = False,
    timeout: TimeoutOpt = WATCH_TIMEOUT_S,
    *,
    to: Target,
    as_json: JsonOpt = False,
) -> None:
    """Composition-of-Experts inference: route prompts to experts, switch them DDR->HBM,
    decode; with --wait a progress bar, then a summary."""
    coe = job_pb2.CoeInferenceJob(
        num_experts=experts,
        batch_size=batch_size,
        output_tokens=output_tokens,
        expert_model=expert_model,
        routing=routing,
        node_routing=node_routing,
        num_sockets=sockets,
        pinned_experts=pin or [],
        prompts=prompt or [],
        seed=seed,
    )
    if decode_plan is not None:
        coe.decode_plan = PLAN_TO_PROTO[decode_plan]
    if trace is not None:
        coe.trace.extend(read_trace(trace))
    if poisson_rate is not None:
        coe.poisson.CopyFrom(
            job_pb2.PoissonLoad(requests=requests, rate_per_s=poisson_rate, skew=skew, seed=seed)
        )
    spec = job_pb2.JobSpec(
        name=name, platform=platform, coe_inference=coe, payload_mode=payload_mode(functional)
    )
    submit_and_follow(spec, to, wait=wait, timeout_s=timeout, as_json=as_json)
