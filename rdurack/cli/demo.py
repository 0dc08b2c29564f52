"""`rdu demo` (what `make run` runs): the rack's three questions answered by jobs on a
rack brought up for the purpose, each set beside what the predictor and the paper say.

1. What fusion buys: llama2-7b decoding 20 tokens on 8 sockets under each fusion plan.
2. What a DGX costs for Composition of Experts: PAPER Table V's setting (100 experts,
   batch 8, 20 output tokens) on the rack's SN40L node and emulated DGX A100 / H100
   nodes; then 150 experts, which the SN40L node serves and a DGX cannot hold.
3. How DDP behaves: digits, trained data-parallel on 16 sockets (both nodes).

Every number it prints was measured on the emulated cluster, except the "predictor" and
"paper" columns, which come from `rdurack.workloads.paper` (the same figures as
`rdu bench paper`). A DGX job that runs out of memory is the expected outcome, not a
failure of the demo; any other job that does not succeed makes the demo exit 1.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from rdurack.cli.follow import follow_all
from rdurack.cli.options import WATCH_TIMEOUT_S, PortOpt, StateDirOpt, TimeoutOpt
from rdurack.cli.views import format_seconds, job_dict, styled_state
from rdurack.client.connection import Target, one_line_errors
from rdurack.client.jobs import JobClient
from rdurack.v1 import common_pb2, job_pb2
from rdurack.workloads.paper.figure import Figure
from rdurack.workloads.paper.study import PaperStudy
from rdurack.workloads.paper.table_v import TABLE_V_DECODE_PLAN, TABLE_V_EXPERTS

FUSION_PLANS = ("unfused", "fused-so", "fused-ho", "kernel-looped")
DGX = ("dgx-a100", "dgx-h100")
DDP_WORLD_SIZE = 16
DDP_EPOCHS = 10  # digits at global batch 128: 100 steps; measured 96% test accuracy


@dataclass(frozen=True)
class DemoJob:
    section: str  # "fusion", "coe", "coe150" or "ddp"
    label: str  # the fusion plan, or the platform
    spec: job_pb2.JobSpec
    oom_expected: bool = False


def _plan(name: str) -> common_pb2.FusionPlan.ValueType:
    return common_pb2.FusionPlan.Value("FUSION_PLAN_" + name.upper().replace("-", "_"))


SN40L = "sn40l node (this rack)"  # the rack's own platform: a job's platform left empty


def demo_jobs() -> list[DemoJob]:
    """The demo's jobs, in submission order."""
    jobs = [
        DemoJob(
            "fusion",
            plan,
            job_pb2.JobSpec(
                name=f"demo: llama2-7b decode, {plan}",
                kernel=job_pb2.KernelJob(
                    model="llama2-7b",
                    phase=common_pb2.PHASE_DECODE,
                    fusion_plan=_plan(plan),
                    sequence_length=1024,
                    batch_size=1,
                    num_sockets=8,
                    output_tokens=20,
                ),
            ),
        )
        for plan in FUSION_PLANS
    ]

    def coe(platform: str, experts: int, plan: str | None) -> job_pb2.JobSpec:
        return job_pb2.JobSpec(
            name=f"demo: CoE {experts} experts on {platform}",
            platform="" if platform == SN40L else platform,
            coe_inference=job_pb2.CoeInferenceJob(
                num_experts=experts,
                batch_size=8,
                output_tokens=20,
                # The SN40L decodes as PAPER Table V is reproduced (workloads/paper/
                # table_v.py TABLE_V_DECODE_PLAN); GPUs run unfused, their default.
                decode_plan=_plan(plan) if plan else common_pb2.FUSION_PLAN_UNSPECIFIED,
            ),
        )

    jobs.append(DemoJob("coe", SN40L, coe(SN40L, TABLE_V_EXPERTS, TABLE_V_DECODE_PLAN.value)))
    jobs += [DemoJob("coe", p, coe(p, TABLE_V_EXPERTS, None)) for p in DGX]
    jobs.append(DemoJob("coe150", SN40L, coe(SN40L, 150, None)))
    jobs += [DemoJob("coe150", p, coe(p, 150, None), oom_expected=True) for p in DGX]
    jobs.append(
        DemoJob(
            "ddp",
            f"{DDP_WORLD_SIZE} sockets",
            job_pb2.JobSpec(
                name=f"demo: DDP digits on {DDP_WORLD_SIZE} sockets",
                payload_mode=common_pb2.PAYLOAD_MODE_FUNCTIONAL,  # a real numpy MLP
                training=job_pb2.TrainingJob(
                    model="mlp",
                    dataset="digits",
                    world_size=DDP_WORLD_SIZE,
                    global_batch=128,
                    epochs=DDP_EPOCHS,
                    learning_rate=0.3,
                ),
            ),
        )
    )
    return jobs


def outcome_ok(job: DemoJob, done: dict[str, Any]) -> bool:
    """Did the job end as the demo expects: SUCCEEDED, or FAILED with oom for a DGX
    asked to hold 150 experts?"""
    if job.oom_expected:
        return done["state"] == "FAILED" and bool(done.get("oom"))
    return bool(done["state"] == "SUCCEEDED")


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _fx(value: float | tuple[float, float] | bool) -> str:
    """A value figure of workloads/paper/ as a ratio (the Table V figures are values)."""
    return _x(value) if isinstance(value, float | int) and not isinstance(value, bool) else "-"


def _fusion_table(rows: list[tuple[DemoJob, dict[str, Any]]]) -> Table:
    table = Table(title="1. What fusion buys: llama2-7b decoding 20 tokens on 8 sockets")
    for col in ("fusion plan", "state", "emulated", "kernel calls", "tokens/s", "speedup"):
        table.add_column(col)
    base = next((d["emulated_s"] for j, d in rows if j.label == "unfused"), None)
    for j, d in rows:
        e = d["emulated_s"]
        table.add_row(
            j.label,
            styled_state(d["state"]),
            format_seconds(e),
            "-" if d["kernel_calls"] is None else f"{d['kernel_calls']:,}",
            "-" if d["tokens_per_s"] is None else f"{d['tokens_per_s']:.0f}",
            _x(base / e if base and e else None),
        )
    table.caption = "speedup: over unfused. PAPER Sec. VI: fused decode 1x-13x over unfused."
    return table


def _coe_table(rows: list[tuple[DemoJob, dict[str, Any]]], figures: dict[str, Figure]) -> Table:
    table = Table(
        title=f"2. Composition of Experts, PAPER Table V setting: {TABLE_V_EXPERTS} experts, "
        "batch 8, 20 output tokens, TP8"
    )
    for col in ("platform", "state", "emulated", "switching", "SN40L faster by", "predictor"):
        table.add_column(col)
    table.add_column("paper")
    sn = next((d for j, d in rows if j.label == SN40L), None)
    for j, d in rows:
        faster = predicted = published = "-"
        if j.label in DGX and sn and sn["emulated_s"] and d["emulated_s"]:
            faster = _x(d["emulated_s"] / sn["emulated_s"])
            switch = ""
            if sn["switch_s"] and d["switch_s"]:
                switch = f", switching {_x(d['switch_s'] / sn['switch_s'])}"
            faster += switch
            overall = figures[f"coe_overall_b8_t20_{j.label}"]
            switching = figures[f"switch_speedup_{j.label.replace('-', '_')}"]
            predicted = f"{_fx(overall.predicted)}, {_fx(switching.predicted)}"
            published = f"{_fx(overall.published)}, {_fx(switching.published)}"
        table.add_row(
            j.label,
            styled_state(d["state"]),
            format_seconds(d["emulated_s"]),
            format_seconds(d["switch_s"]),
            faster,
            predicted,
            published,
        )
    table.caption = (
        "overall, then model switching. predictor: rdu predict coe; paper: PAPER Table V "
        "and Sec. VI-C (rdu bench paper)."
    )
    return table


def _coe150_table(rows: list[tuple[DemoJob, dict[str, Any]]]) -> Table:
    table = Table(title="   150 experts (about 1 T parameters): who can hold them?")
    for col in ("platform", "state", "outcome"):
        table.add_column(col)
    for j, d in rows:
        if d.get("oom"):
            outcome = f"out of memory: {d.get('oom_reason') or d.get('error')}"
        elif d["state"] == "SUCCEEDED":
            outcome = f"serves them from DDR: {format_seconds(d['emulated_s'])} emulated"
        else:
            outcome = d.get("error") or "-"
        table.add_row(j.label, styled_state(d["state"]), outcome)
    table.caption = "PAPER Sec. VI-C: at 150 experts the DGX runs out of memory."
    return table


def _ddp_table(rows: list[tuple[DemoJob, dict[str, Any]]]) -> Table:
    table = Table(title="3. DDP: digits, data-parallel, gradients all-reduced over the links")
    for col in ("ranks", "state", "steps", "test accuracy", "step (emulated)", "samples/s"):
        table.add_column(col)
    for j, d in rows:
        acc = d.get("test_accuracy")
        sps = d.get("samples_per_s")
        table.add_row(
            j.label,
            styled_state(d["state"]),
            "-" if d.get("steps_completed") is None else str(d["steps_completed"]),
            "-" if acc is None else f"{acc:.1%}",
            format_seconds(d.get("step_time_s")),
            "-" if sps is None else f"{sps:,.0f}",
        )
    return table


def demo_cmd(
    state_dir: StateDirOpt = Path(".state"),
    port: PortOpt = 50051,
    timeout: TimeoutOpt = WATCH_TIMEOUT_S,
) -> None:
    """rdu up; fusion, CoE against DGX, and DDP jobs; their tables; rdu down (always)."""
    from rdurack.processes import local_rack

    console = Console()
    console.print(
        f"[bold]rdu up[/]: Ray, 2 node agents x 8 sockets, the orchestrator ({state_dir})"
    )
    rack = local_rack.up(
        state_dir,
        port=port,
        on_ready=lambda name, address: console.print(f"  {name:<14} ready at {address}"),
    )
    bad: list[str] = []
    try:
        jobs = demo_jobs()
        with one_line_errors(rack.orchestrator), Target(rack.orchestrator).channel() as ch:
            client = JobClient(ch)
            ids = []
            for j in jobs:
                submitted = client.submit(j.spec).job
                ids.append(submitted.id)
                console.print(f"  submitted {submitted.id}: {j.spec.name}")
            follow_all(client, ids, timeout, console)
            done = [job_dict(client.get(i)) for i in ids]
        rows = list(zip(jobs, done, strict=True))
        figures = {f.key: f for f in PaperStudy().figures()}

        def section(name: str) -> list[tuple[DemoJob, dict[str, Any]]]:
            return [(j, d) for j, d in rows if j.section == name]

        console.print(_fusion_table(section("fusion")))
        console.print(_coe_table(section("coe"), figures))
        console.print(_coe150_table(section("coe150")))
        console.print(_ddp_table(section("ddp")))
        for j, d in rows:
            if not outcome_ok(j, d):
                bad.append(f"{d['job_id']} ({j.spec.name}) {d['state']}: {d.get('error')}")
        for line in bad:
            console.print(f"[red]unexpected: {line}[/]")
    finally:
        console.print("[bold]rdu down[/]")
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a 2nd Ctrl-C must not skip it
        try:
            for line in local_rack.down(state_dir):
                console.print(f"  {line}")
        finally:
            signal.signal(signal.SIGINT, previous)
    if bad:
        raise typer.Exit(1)
