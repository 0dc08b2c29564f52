"""Every unpublished assumption the model rests on: its allowed range, its reason, and the
value the joint calibration chose for it.

PAPER, KL and the datasheets publish the hardware's peaks; they do not publish how close
kernels come to them, what a launch or a link hop costs, or the prompts of PAPER's
evaluation. Each of those numbers is an `Assumption` here. `rdu calibrate`
(workloads/calibration/) fits all of them at once, by one objective, against a named set
of published figures, and writes the chosen values to `calibration.json` beside this
module; the presets (presets.py) and the studies read them from there. A value at the
edge of its range says the model wanted to go further than the reason allows.

An assumption sets either a field of some platform presets (`platforms`, `field`: a
dotted path into PlatformSpec) or a setting of a workload study (no platforms; the study
reads it by name).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Literal

from rdurack.config import Config
from rdurack.errors import InvalidRequest, UnknownName

CALIBRATION_FILE = Path(__file__).with_name("calibration.json")
SN40L = ("sn40l-node", "sn40l-rack16")
GPUS = ("dgx-a100", "dgx-h100")
KERNELS = "node.socket.kernels"


class Assumption(Config):
    """One unpublished number: where it goes, the range its reason allows, why."""

    name: str
    platforms: tuple[str, ...] = ()  # the presets it sets; () for a workload setting
    field: str = ""  # dotted path into PlatformSpec
    low: float
    high: float
    scale: Literal["linear", "log"] = "linear"  # log: the range spans orders of magnitude
    integer: bool = False
    unit: str = ""
    reason: str

    @property
    def source(self) -> str:
        """The `sources` text of a preset field this assumption sets."""
        unit = f" {self.unit}" if self.unit else ""
        return (
            f"fitted: joint calibration (docs/figures.md) within "
            f"[{self.low:.4g}, {self.high:.4g}]{unit}: {self.reason}"
        )


ASSUMPTIONS: tuple[Assumption, ...] = (
    # ---------------------------------------------------------------- SN40L kernels
    Assumption(
        name="sn40l.compute_efficiency",
        platforms=SN40L,
        field=f"{KERNELS}.compute_efficiency",
        low=0.15,
        high=0.8,
        reason="the fraction of 638 TFLOP/s a fused GEMM pipeline sustains; from a small "
        "TP8 slice of a 7B layer (low) to the best large GEMMs of dataflow chips (high)",
    ),
    Assumption(
        name="sn40l.memory_efficiency",
        platforms=SN40L,
        field=f"{KERNELS}.memory_efficiency",
        low=0.8,
        high=0.98,
        reason="the fraction of HBM bandwidth a weight stream reaches; KL reports over 90% "
        "for kernel-looped decode, and no HBM streams above 98%",
    ),
    Assumption(
        name="sn40l.launch_so_ns",
        platforms=SN40L,
        field=f"{KERNELS}.launch_so_ns",
        low=5e3,
        high=200e3,
        scale="log",
        unit="ns",
        reason="a host-orchestrated kernel call (Program/Argument Load, a host round trip "
        "over PCIe): from a few microseconds to a fraction of a millisecond",
    ),
    Assumption(
        name="sn40l.launch_ho_ns",
        platforms=SN40L,
        field=f"{KERNELS}.launch_ho_ns",
        low=1e3,
        high=30e3,
        scale="log",
        unit="ns",
        reason="a hardware-orchestrated kernel call (the schedule runs on the chip): at "
        "least a microsecond, below a host round trip",
    ),
    Assumption(
        name="sn40l.pipeline_fill_ns",
        platforms=SN40L,
        field=f"{KERNELS}.pipeline_fill_ns",
        low=1e3,
        high=100e3,
        scale="log",
        unit="ns",
        reason="filling and draining a pipeline of 20+ operators per call (PAPER Sec. III): "
        "tens of stages of microseconds each",
    ),
    Assumption(
        name="sn40l.invocation_ns",
        platforms=SN40L,
        field=f"{KERNELS}.invocation_ns",
        low=0.0,
        high=100e6,
        unit="ns",
        reason="loading a model's program and arguments before its first kernel (PAPER Sec. "
        "III: Program Load, Argument Load); none to a tenth of a second",
    ),
    Assumption(
        name="sn40l.intra_node_latency_ns",
        platforms=SN40L,
        field="node.intra_node_link.latency_ns",
        low=300.0,
        high=10e3,
        scale="log",
        unit="ns",
        reason="one hop of the unpublished peer-to-peer link inside a node, a step of a "
        "collective included: from a serdes hop to a software-driven transfer",
    ),
    Assumption(
        name="sn40l.inter_node_latency_ns",
        platforms=SN40L,
        field="inter_node_link.latency_ns",
        low=1e3,
        high=30e3,
        scale="log",
        unit="ns",
        reason="one hop between the rack's two nodes through a NIC and cable, a collective "
        "step included",
    ),
    # ---------------------------------------------------------------- GPUs (NeMo, TP8)
    Assumption(
        name="gpu.compute_efficiency",
        platforms=GPUS,
        field=f"{KERNELS}.compute_efficiency",
        low=0.3,
        high=0.8,
        reason="the fraction of dense BF16 peak a framework's GEMMs and attention sustain "
        "in prefill: 30% for small TP8 slices, 80% for the best large GEMMs",
    ),
    Assumption(
        name="gpu.memory_efficiency",
        platforms=GPUS,
        field=f"{KERNELS}.memory_efficiency",
        low=0.6,
        high=0.95,
        reason="the fraction of HBM bandwidth a streaming GPU kernel reaches",
    ),
    Assumption(
        name="a100.launch_so_ns",
        platforms=("dgx-a100",),
        field=f"{KERNELS}.launch_so_ns",
        low=2e3,
        high=60e3,
        scale="log",
        unit="ns",
        reason="a CUDA kernel launch plus the framework's dispatch per kernel, on an A100 "
        "host; a launch alone is a few microseconds",
    ),
    Assumption(
        name="h100.launch_so_ns",
        platforms=("dgx-h100",),
        field=f"{KERNELS}.launch_so_ns",
        low=2e3,
        high=60e3,
        scale="log",
        unit="ns",
        reason="the same on an H100 host (a newer CPU and GPU: not the A100's figure)",
    ),
    Assumption(
        name="gpu.nvlink_latency_ns",
        platforms=GPUS,
        field="node.intra_node_link.latency_ns",
        low=500.0,
        high=20e3,
        scale="log",
        unit="ns",
        reason="one step of an NCCL all-reduce of a small message through NVSwitch",
    ),
    Assumption(
        name="gpu.invocation_ns",
        platforms=GPUS,
        field=f"{KERNELS}.invocation_ns",
        low=0.0,
        high=100e6,
        unit="ns",
        reason="a framework's per-request setup before the first kernel (PAPER's DGX "
        "figures are NeMo latencies): none to a tenth of a second",
    ),
    # ---------------------------------------------------------------- workloads
    Assumption(
        name="speculative.draft_tokens",
        low=2,
        high=8,
        integer=True,
        unit="tokens",
        reason="drafts per iteration of speculative decoding (PAPER Table IV's 70B and "
        "405B rows used it without saying how): deployments draft 2 to 8 tokens, past "
        "which the expected yield flattens while the draft's cost keeps growing",
    ),
    Assumption(
        name="speculative.acceptance",
        low=0.5,
        high=0.9,
        reason="the chance the target accepts a drafted token: a same-family draft on "
        "chat text is reported to agree on half to nine in ten tokens",
    ),
    Assumption(
        name="table_v.prompt_tokens",
        low=128,
        high=4096,
        scale="log",
        integer=True,
        unit="tokens",
        reason="PAPER Table V's prompts are not published; chat prompts with their "
        "system preamble run from a hundred to a few thousand tokens",
    ),
)


def assumption(name: str) -> Assumption:
    for a in ASSUMPTIONS:
        if a.name == name:
            return a
    raise UnknownName("assumption", name, [a.name for a in ASSUMPTIONS])


def checked(values: Mapping[str, float], *, whole: bool = True) -> dict[str, float]:
    """`values` for every assumption, each inside its range; integer assumptions rounded
    unless `whole` is False (a fit moves them continuously, then rounds its result)."""
    missing = [a.name for a in ASSUMPTIONS if a.name not in values]
    unknown = sorted(set(values) - {a.name for a in ASSUMPTIONS})
    if missing or unknown:
        raise InvalidRequest(f"calibration values: missing {missing}, unknown {unknown}")
    out: dict[str, float] = {}
    for a in ASSUMPTIONS:
        v = float(values[a.name])
        v = float(round(v)) if a.integer and whole else v
        if not a.low <= v <= a.high:
            raise InvalidRequest(f"{a.name} = {v:.4g} is outside [{a.low:.4g}, {a.high:.4g}]")
        out[a.name] = v
    return out


def fitted_values() -> dict[str, float]:
    """The values `rdu calibrate --write` chose (calibration.json), a fresh dict."""
    return dict(_read())


@cache  # the file ships with the package and never changes while a process runs
def _read() -> tuple[tuple[str, float], ...]:
    try:
        data = json.loads(CALIBRATION_FILE.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise InvalidRequest(f"{CALIBRATION_FILE}: {e}; run rdu calibrate --write") from None
    return tuple(checked(data["values"]).items())
