"""`rdu` commands for a running rack: up, down, status, submit, jobs, job, watch, cancel.
They talk to the orchestrator's JobService and RackService.
"""

from __future__ import annotations

import functools
import json
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar, cast

import grpc
import typer
from google.protobuf import json_format
from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from rdurack.api.server import channel
from rdurack.cli.app import JsonOpt, app, emit
from rdurack.errors import RdurackError
from rdurack.orchestrator.jobs import JobState
from rdurack.rack.kernels import FusionPlan, Phase
from rdurack.security.tls import ENV_CA, ENV_SERVER_NAME, TlsConfig, tls_from
from rdurack.v1 import common_pb2, job_pb2, job_pb2_grpc, rack_pb2, rack_pb2_grpc

# --------------------------------------------------------------------- the rack: up and down

DEFAULT_ADDRESS = "127.0.0.1:50051"
RPC_TIMEOUT_S = 30.0
WATCH_TIMEOUT_S = 600.0
TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")

StateDirOpt = Annotated[
    Path,
    typer.Option(
        "--state-dir",
        envvar="RDURACK_STATE_DIR",
        help="where rdu up records its processes, logs and the job store",
    ),
]
AddressOpt = Annotated[
    str,
    typer.Option("--address", envvar="RDURACK_ORCHESTRATOR", help="the orchestrator's host:port"),
]
TimeoutOpt = Annotated[
    float, typer.Option("--timeout", min=1, help="seconds to wait for the job to end")
]
TokenOpt = Annotated[
    str,
    typer.Option(
        "--token", envvar="RDURACK_TOKEN", help="bearer token (the rack's tokens file names it)"
    ),
]
TokenFileOpt = Annotated[
    Path | None,
    typer.Option("--token-file", envvar="RDURACK_TOKEN_FILE", help="a file holding the token"),
]
TlsCaOpt = Annotated[
    Path | None,
    typer.Option(
        "--tls-ca", envvar=ENV_CA, help="TLS: the CA of the orchestrator's certificate (PEM)"
    ),
]
TlsNameOpt = Annotated[
    str,
    typer.Option(
        "--tls-server-name",
        envvar=ENV_SERVER_NAME,
        help="TLS: the name to expect in its certificate (default: the host dialled)",
    ),
]


@dataclass(frozen=True)
class Target:
    """The orchestrator a client command talks to, and how (TLS, token)."""

    address: str
    token: str | None = None
    tls: TlsConfig | None = None

    def channel(self) -> grpc.Channel:
        return channel(self.address, tls=self.tls, token=self.token)


def target(
    address: str,
    token: str = "",
    token_file: Path | None = None,
    tls_ca: Path | None = None,
    tls_server_name: str = "",
) -> Target:
    """A Target from the connection options every client command takes."""
    if token and token_file is not None:
        raise RdurackError("--token and --token-file: give one of them")
    if token_file is not None:
        try:
            token = token_file.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as e:
            raise RdurackError(f"--token-file {token_file}: {getattr(e, 'strerror', e)}") from None
        if not token:
            raise RdurackError(f"--token-file {token_file}: the file is empty")
    if tls_server_name and tls_ca is None:
        raise RdurackError("--tls-server-name needs --tls-ca")
    tls = tls_from(tls_ca, server_name=tls_server_name or None)
    if tls is not None:
        tls.ca_pem()  # a missing or bad CA file is the user's error, said now
    return Target(address, token or None, tls)


# gRPC codes that mean the request was wrong (exit 2), as for bad command-line values.
USER_ERRORS = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
    }
)


class RackCallFailed(RdurackError):
    """A call to the orchestrator failed: one line for the user, and the exit code."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code

    @classmethod
    def from_rpc(cls, e: grpc.RpcError, address: str) -> RackCallFailed:
        code = e.code() if isinstance(e, grpc.Call) else None
        details = (e.details() if isinstance(e, grpc.Call) else None) or str(code or e)
        if code in USER_ERRORS:
            return cls(details, 2)
        if code == grpc.StatusCode.UNAVAILABLE:
            return cls(
                f"the orchestrator at {address} is unavailable; is the rack up? run rdu up "
                "(if it serves TLS: --tls-ca)",
                1,
            )
        name = code.name if code is not None else "error"
        return cls(f"{name} from {address}: {' '.join(details.split())}", 1)


F = TypeVar("F", bound=Callable[..., Any])


def talks_to_orchestrator(command: F) -> F:
    """A command's gRPC failures become one line naming the orchestrator it called."""

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except grpc.RpcError as e:
            raise RackCallFailed.from_rpc(e, kwargs.get("address", DEFAULT_ADDRESS)) from None

    return cast(F, run)


@app.command("up")
def up_cmd(
    nodes: Annotated[int, typer.Option(min=1, max=64, help="node agents")] = 2,
    sockets_per_node: Annotated[int, typer.Option(min=1, max=64)] = 8,
    state_dir: StateDirOpt = Path(".state"),
    port: Annotated[int, typer.Option(min=0, max=65535, help="orchestrator port")] = 50051,
    timeout: Annotated[float, typer.Option(min=1, help="seconds to wait for readiness")] = 120,
    tls: Annotated[
        bool,
        typer.Option(
            "--tls", help="TLS everywhere, with a throwaway CA in STATE_DIR/tls (mutual in-rack)"
        ),
    ] = False,
    tokens: Annotated[
        Path | None,
        typer.Option(
            "--tokens", help="a tokens file: the orchestrator requires bearer tokens (tenants)"
        ),
    ] = None,
    time_scale: Annotated[
        float, typer.Option(min=0, help="pacing: wall s per emulated s (0: no pacing)")
    ] = 0.0,
) -> None:
    """Start local Ray, the node agents and the orchestrator; return once all serve."""
    from rdurack.processes import local_rack

    rack = local_rack.up(
        state_dir,
        nodes,
        sockets_per_node,
        port,
        timeout,
        on_ready=lambda name, address: print(f"{name:<14} ready at {address}", flush=True),
        tls=tls,
        tokens=tokens,
        time_scale=time_scale,
    )
    print(
        f"rack up: {nodes} x {sockets_per_node} sockets; orchestrator at {rack.orchestrator}; "
        f"logs in {state_dir / 'logs'}; stop it with: rdu down --state-dir {state_dir}"
    )
    print(f"security: {rack.security()}")


@app.command("down")
def down_cmd(state_dir: StateDirOpt = Path(".state")) -> None:
    """Stop what rdu up started in the state dir, by the process ids it recorded."""
    from rdurack.processes import local_rack

    for line in local_rack.down(state_dir):
        print(line)


# --------------------------------------------------------------------- the rack: a client


def _stubs(to: Target) -> tuple[grpc.Channel, job_pb2_grpc.JobServiceStub]:
    ch = to.channel()
    return ch, job_pb2_grpc.JobServiceStub(ch)


def _state(value: int) -> str:
    return common_pb2.JobState.Name(cast(common_pb2.JobState.ValueType, value)).removeprefix(
        "JOB_STATE_"
    )


def _job_dict(job: job_pb2.Job) -> dict[str, Any]:
    """One job as the CLI prints it; result fields are null until it SUCCEEDED."""
    kind = job.spec.WhichOneof("workload")
    if kind == "coe_inference":
        return _coe_dict(job)
    if kind == "training":
        return _training_dict(job)
    k = job.spec.kernel
    has = job.result.HasField("kernel")
    r = job.result.kernel
    emulated: float | None = r.emulated_s if has else None
    if emulated is None and job.emulated_end_ns:
        emulated = (job.emulated_end_ns - job.emulated_start_ns) / 1e9
    return {
        "job_id": job.id,
        "name": job.spec.name,
        "state": _state(job.state),
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


def _coe_dict(job: job_pb2.Job) -> dict[str, Any]:
    """A CoE job: its spec's essentials and, once it has one, its result (a job that
    FAILED for lack of memory has one too, with oom true)."""
    c = job.spec.coe_inference
    has = job.result.HasField("coe_inference")
    r = job.result.coe_inference
    data: dict[str, Any] = {
        "job_id": job.id,
        "name": job.spec.name,
        "state": _state(job.state),
        "model": c.expert_model or "llama2-7b",
        "phase": "coe",
        "platform": job.spec.platform,
        "num_experts": c.num_experts or 150,
        "num_sockets": c.num_sockets or 8,
        "sockets": [s.id for s in job.sockets],
        "error": job.error_message or None,
    }
    result = json_format.MessageToDict(
        r, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    for key in RESULT_KEYS:
        data[key] = result.get(key) if has else None
    if has:
        data["tokens"] = int(result.get("tokens", 0))
        data["per_request"] = result.get("per_request", [])
    return data


def _training_dict(job: job_pb2.Job) -> dict[str, Any]:
    """A training job: its spec's essentials and, once it SUCCEEDED, its result."""
    t = job.spec.training
    has = job.result.HasField("training")
    result = json_format.MessageToDict(
        job.result.training,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
    )
    data: dict[str, Any] = {
        "job_id": job.id,
        "name": job.spec.name,
        "state": _state(job.state),
        "model": t.model or "mlp",
        "phase": "train",
        "platform": job.spec.platform,
        "world_size": t.world_size or 4,
        "num_sockets": t.world_size or 4,
        "sockets": [s.id for s in job.sockets],
        "error": job.error_message or None,
    }
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


def _get(stub: job_pb2_grpc.JobServiceStub, job_id: str) -> job_pb2.Job:
    return stub.GetJob(job_pb2.GetJobRequest(job_id=job_id), timeout=RPC_TIMEOUT_S).job


def _progress(console: Console, show: bool = True) -> Progress:
    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=not show,
    )


def _follow(
    stub: job_pb2_grpc.JobServiceStub,
    job_id: str,
    timeout_s: float,
    progress: Progress,
    task: TaskID,
) -> bool:
    """Feed one job's WatchJob events into a progress bar until the stream ends; False if
    the deadline passed first."""
    try:
        for event in stub.WatchJob(job_pb2.WatchJobRequest(job_id=job_id), timeout=timeout_s):
            kind = event.WhichOneof("event")
            if kind == "state_change":
                state = _state(event.state_change.to_state)
                progress.update(task, description=f"{job_id} {state}")
                if state == "SUCCEEDED":
                    progress.update(task, completed=1.0)
            elif kind == "progress":
                message = event.progress.message
                progress.update(
                    task,
                    completed=event.progress.fraction,
                    description=f"{job_id} {message}" if message else None,
                )
    except grpc.RpcError as e:
        if isinstance(e, grpc.Call) and e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            return False
        raise
    return True


def _watch(
    stub: job_pb2_grpc.JobServiceStub, job_id: str, timeout_s: float, show: bool
) -> job_pb2.Job:
    """Follow a job until it ends (a progress bar on stderr when `show`); the job."""
    with _progress(Console(stderr=True), show) as progress:
        ended = _follow(stub, job_id, timeout_s, progress, progress.add_task(job_id, total=1.0))
    job = _get(stub, job_id)
    if not ended and _state(job.state) not in TERMINAL:
        _fail(
            f"job {job_id} is still {_state(job.state)} after {timeout_s:g} s; "
            f"rdu watch {job_id} follows it further",
            1,
        )
    return job


def _fail(message: str, code: int) -> NoReturn:
    print(f"rdu: {message}", file=sys.stderr)
    raise typer.Exit(code)


def _show_job(job: job_pb2.Job, as_json: bool) -> None:
    data = _job_dict(job)
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


def _ended(job: job_pb2.Job, as_json: bool) -> None:
    """Print a finished job; exit 1 (saying why) unless it SUCCEEDED."""
    _show_job(job, as_json)
    state = _state(job.state)
    if state != "SUCCEEDED":
        _fail(f"job {job.id} {state}: {job.error_message or 'no reason given'}", 1)


def submit_and_follow(
    spec: job_pb2.JobSpec, to: Target, *, wait: bool, timeout_s: float, as_json: bool
) -> None:
    """Submit; print the job id (or the job, --json); with `wait` follow it to its end
    (progress bar on stderr) and print it, exiting 1 unless it SUCCEEDED."""
    ch, stub = _stubs(to)
    with ch:
        reply = stub.SubmitJob(job_pb2.SubmitJobRequest(spec=spec), timeout=RPC_TIMEOUT_S)
        job = reply.job
        if not wait:
            print(json.dumps(_job_dict(job)) if as_json else job.id)
            return
        if not as_json:
            print(job.id, file=sys.stderr)
        _ended(_watch(stub, job.id, timeout_s, show=not as_json), as_json)


submit_app = typer.Typer(help="Submit a job to the rack's orchestrator.", no_args_is_help=True)
app.add_typer(submit_app, name="submit")


@submit_app.command("kernel")
@talks_to_orchestrator
def submit_kernel_cmd(
    model: Annotated[str, typer.Option(help="model preset, e.g. llama2-7b")],
    phase: Annotated[Phase, typer.Option(help="one prefill pass, decode tokens, one train step")],
    fusion_plan: Annotated[
        FusionPlan | None, typer.Option(help="default: the orchestrator's (fused-ho)")
    ] = None,
    seq: Annotated[int, typer.Option(min=1, help="prompt length, or the decode context")] = 1024,
    batch_size: Annotated[int, typer.Option(min=1)] = 1,
    sockets: Annotated[int, typer.Option(min=1, help="sockets, gang-scheduled")] = 8,
    output_tokens: Annotated[int, typer.Option(min=1, help="decode: tokens to generate")] = 1,
    priority: Annotated[int, typer.Option(help="higher runs first")] = 0,
    name: Annotated[str, typer.Option(help="a label for the job")] = "",
    request_id: Annotated[
        str, typer.Option(help="idempotency key: resubmitting returns the first job")
    ] = "",
    wait: Annotated[bool, typer.Option("--wait", help="follow the job until it ends")] = False,
    timeout: TimeoutOpt = WATCH_TIMEOUT_S,
    address: AddressOpt = DEFAULT_ADDRESS,
    token: TokenOpt = "",
    token_file: TokenFileOpt = None,
    tls_ca: TlsCaOpt = None,
    tls_server_name: TlsNameOpt = "",
    as_json: JsonOpt = False,
) -> None:
    """A kernel job: one model's prefill, decode or train step on N sockets."""
    kernel = job_pb2.KernelJob(
        model=model,
        phase=common_pb2.Phase.Value(f"PHASE_{phase.name}"),
        sequence_length=seq,
        batch_size=batch_size,
        num_sockets=sockets,
        output_tokens=output_tokens if phase == Phase.DECODE else 0,
    )
    if fusion_plan is not None:
        kernel.fusion_plan = common_pb2.FusionPlan.Value(f"FUSION_PLAN_{fusion_plan.name}")
    spec = job_pb2.JobSpec(
        name=name, priority=priority, client_request_id=request_id, kernel=kernel
    )
    ch, stub = _stubs(target(address, token, token_file, tls_ca, tls_server_name))
    with ch:
        reply = stub.SubmitJob(job_pb2.SubmitJobRequest(spec=spec), timeout=RPC_TIMEOUT_S)
        job = reply.job
        if not wait:
            if as_json:
                print(json.dumps({**_job_dict(job), "deduplicated": reply.deduplicated}))
            else:
                print(job.id)
            return
        if not as_json:
            print(job.id, file=sys.stderr)
        _ended(_watch(stub, job.id, timeout, show=not as_json), as_json)


@app.command("watch")
@talks_to_orchestrator
def watch_cmd(
    job_id: Annotated[str, typer.Argument(help="a job id, e.g. job-000001")],
    timeout: TimeoutOpt = WATCH_TIMEOUT_S,
    address: AddressOpt = DEFAULT_ADDRESS,
    token: TokenOpt = "",
    token_file: TokenFileOpt = None,
    tls_ca: TlsCaOpt = None,
    tls_server_name: TlsNameOpt = "",
    as_json: JsonOpt = False,
) -> None:
    """A progress bar until the job ends; exit 1 if it FAILED or was CANCELLED."""
    ch, stub = _stubs(target(address, token, token_file, tls_ca, tls_server_name))
    with ch:
        _ended(_watch(stub, job_id, timeout, show=not as_json), as_json)


@app.command("job")
@talks_to_orchestrator
def job_cmd(
    job_id: Annotated[str, typer.Argument(help="a job id")],
    address: AddressOpt = DEFAULT_ADDRESS,
    token: TokenOpt = "",
    token_file: TokenFileOpt = None,
    tls_ca: TlsCaOpt = None,
    tls_server_name: TlsNameOpt = "",
    as_json: JsonOpt = False,
) -> None:
    """One job: its state, sockets and result."""
    ch, stub = _stubs(target(address, token, token_file, tls_ca, tls_server_name))
    with ch:
        _show_job(_get(stub, job_id), as_json)


@app.command("cancel")
@talks_to_orchestrator
def cancel_cmd(
    job_id: Annotated[str, typer.Argument(help="a job id")],
    reason: Annotated[str, typer.Option(help="recorded as the job's error")] = "cancelled by rdu",
    address: AddressOpt = DEFAULT_ADDRESS,
    token: TokenOpt = "",
    token_file: TokenFileOpt = None,
    tls_ca: TlsCaOpt = None,
    tls_server_name: TlsNameOpt = "",
    as_json: JsonOpt = False,
) -> None:
    """Cancel a job that has not ended; its sockets are released."""
    ch, stub = _stubs(target(address, token, token_file, tls_ca, tls_server_name))
    with ch:
        job = stub.CancelJob(
            job_pb2.CancelJobRequest(job_id=job_id, reason=reason), timeout=RPC_TIMEOUT_S
        ).job
    if as_json:
        print(json.dumps(_job_dict(job)))
    else:
        print(f"{job.id} {_state(job.state)}")


@app.command("jobs")
@talks_to_orchestrator
def jobs_cmd(
    state: Annotated[
        list[JobState] | None,
        typer.Option("--state", case_sensitive=False, help="only jobs in this state (repeatable)"),
    ] = None,
    limit: Annotated[int, typer.Option(min=1, help="at most this many jobs")] = 1000,
    address: AddressOpt = DEFAULT_ADDRESS,
    token: TokenOpt = "",
    token_file: TokenFileOpt = None,
    tls_ca: TlsCaOpt = None,
    tls_server_name: TlsNameOpt = "",
    as_json: JsonOpt = False,
) -> None:
    """Jobs, newest first."""
    states = [common_pb2.JobState.Value(f"JOB_STATE_{s.value}") for s in state or []]
    jobs: list[job_pb2.Job] = []
    page_token = ""
    ch, stub = _stubs(target(address, token, token_file, tls_ca, tls_server_name))
    with ch:
        while len(jobs) < limit:
            page = stub.ListJobs(
                job_pb2.ListJobsRequest(
                    states=states, page_size=min(500, limit - len(jobs)), page_token=page_token
                ),
                timeout=RPC_TIMEOUT_S,
            )
            jobs += page.jobs
            page_token = page.next_page_token
            if not page_token or not page.jobs:
                break
    rows = [_job_dict(j) for j in jobs[:limit]]
    if as_json:
        print(json.dumps({"jobs": rows}))
        return
    table = Table(title=f"jobs at {address}")
    for col in ("job", "name", "state", "workload", "sockets", "emulated", "tokens/s"):
        table.add_column(col, no_wrap=col in ("job", "state"))
    table.add_column("error")
    for r in rows:
        table.add_row(
            r["job_id"],
            r["name"],
            _styled_state(r["state"]),
            f"{r['model']} {r['phase']}",
            ",".join(s.removeprefix("rdu-") for s in r["sockets"]) or str(r["num_sockets"]),
            _seconds(r["emulated_s"]),
            _tokens(r),
            r["error"] or "",
        )
    Console().print(table)


def _tokens(job: dict[str, Any]) -> str:
    """Tokens per emulated second for tables: decode's generated tokens; other phases
    only when the orchestrator reports a rate."""
    rate = job["tokens_per_s"]
    if rate is None or (rate == 0 and job["phase"] != "decode"):
        return "-"
    return f"{rate:,.0f}"


def _styled_state(state: str) -> str:
    color = {"SUCCEEDED": "green", "FAILED": "red", "CANCELLED": "yellow"}.get(state)
    return f"[{color}]{state}[/]" if color else state


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value / 1e-9:.3g} ns"


def _size(n: int) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} B"


TIER_NAMES = {common_pb2.TIER_SRAM: "sram", common_pb2.TIER_HBM: "hbm", common_pb2.TIER_DDR: "ddr"}


def _rack_dict(rack: rack_pb2.RackStatus) -> dict[str, Any]:
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
    }


def _seconds_of(msg: rack_pb2.SocketStatus | rack_pb2.NodeStatus, field: str) -> float | None:
    """A Timestamp field as wall-clock seconds (Unix time), None when unset."""
    if not msg.HasField(field):  # type: ignore[arg-type]
        return None
    return float(getattr(msg, field).ToNanoseconds() * 1e-9)


@app.command("status")
@talks_to_orchestrator
def status_cmd(
    address: AddressOpt = DEFAULT_ADDRESS,
    token: TokenOpt = "",
    token_file: TokenFileOpt = None,
    tls_ca: TlsCaOpt = None,
    tls_server_name: TlsNameOpt = "",
    as_json: JsonOpt = False,
) -> None:
    """The rack: every socket's health, job, emulated clock and memory per tier."""
    with target(address, token, token_file, tls_ca, tls_server_name).channel() as ch:
        rack = (
            rack_pb2_grpc.RackServiceStub(ch)
            .GetRack(rack_pb2.GetRackRequest(), timeout=RPC_TIMEOUT_S)
            .rack
        )
    data = _rack_dict(rack)
    if as_json:
        print(json.dumps(data))
        return
    table = Table(title=f"{data['platform']} at {address}")
    for col in ("node", "socket", "health", "job", "clock", "HBM used/peak/cap."):
        table.add_column(col, no_wrap=col in ("socket", "health"))
    table.add_column("DDR used")
    table.add_column("SRAM used")
    empty = {"used_bytes": 0, "peak_bytes": 0, "capacity_bytes": 0}
    for s in data["sockets"]:
        hbm = s["tiers"].get("hbm", empty)
        health = s["health"]
        table.add_row(
            str(s["node"]),
            s["id"],
            f"[green]{health}[/]" if health == "HEALTHY" else f"[red]{health}[/]",
            s["job"] or "",
            _seconds(s["emulated_clock_ns"] / 1e9) if s["emulated_clock_ns"] else "0",
            f"{_size(hbm['used_bytes'])}/{_size(hbm['peak_bytes'])}/{_size(hbm['capacity_bytes'])}",
            _size(s["tiers"].get("ddr", empty)["used_bytes"]),
            _size(s["tiers"].get("sram", empty)["used_bytes"]),
        )
    Console().print(table)
    err = Console(stderr=True)
    for n in data["nodes"]:
        if not n["healthy"]:
            err.print(f"[red]node {n['index']}: {n['health_reason'] or 'not healthy'}[/]")
    for s in data["sockets"]:
        if s["health"] != "HEALTHY" and s["health_reason"]:
            err.print(f"[red]{s['id']}: {s['health_reason']}[/]")
        elif s["slowdown"] != 1.0:
            err.print(f"[yellow]{s['id']}: {s['slowdown']:g}x slower (injected fault)[/]")


# --------------------------------------------------------------------- following jobs


def _follow_all(
    stub: job_pb2_grpc.JobServiceStub, ids: list[str], timeout_s: float, console: Console
) -> None:
    """One progress bar per job, each fed by its own WatchJob stream in a thread."""
    errors: list[str] = []
    with _progress(console) as progress:

        def follow(job_id: str, task: TaskID) -> None:
            try:
                if not _follow(stub, job_id, timeout_s, progress, task):
                    errors.append(f"{job_id} did not end within {timeout_s:g} s")
            except grpc.RpcError as e:
                details = e.details() if isinstance(e, grpc.Call) else str(e)
                errors.append(f"watching {job_id}: {details}")

        threads = [
            threading.Thread(target=follow, args=(i, progress.add_task(i, total=1.0)), daemon=True)
            for i in ids
        ]
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():  # joined in slices: Ctrl-C still reaches this thread
                t.join(0.2)
    for e in errors:
        console.print(f"[yellow]{e}[/]")
