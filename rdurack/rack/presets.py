"""Built-in platforms, each number with its source.

Sources (full references in docs/figures.md):
  PAPER = Prabhakar et al., "SambaNova SN40L: Scaling the AI Memory Wall with Dataflow
          and Composition of Experts", arXiv 2405.07518 (MICRO 2024).
  KL    = Koeplinger et al., "Kernel Looping", arXiv 2410.23668.
  A100  = NVIDIA A100 Tensor Core GPU datasheet (SXM 80GB); DGX A100 datasheet.
  H100  = NVIDIA H100 Tensor Core GPU datasheet (SXM 80GB); DGX H100 datasheet.

The peer-to-peer links of the SN40L, its kernel efficiencies and launch overheads, and
the GPUs' software overheads are not published. Those the published figures constrain
are assumptions with a range and a reason (calibration.py), fitted jointly once for all
figures (no knob per figure) and read from calibration.json; the others are set here
with their reasons. Pass other `values` to build the platforms a fit tries.
"""

from __future__ import annotations

from collections.abc import Mapping

from rdurack.errors import UnknownName
from rdurack.rack.calibration import assumption, fitted_values
from rdurack.rack.spec import (
    KernelCostSpec,
    LinkSpec,
    NodeSpec,
    PlatformSpec,
    SocketSpec,
    SpineSpec,
    TierSpec,
)

GB = 1e9  # decimal, as the papers and datasheets write capacities and bandwidths
TB = 1e12

# ---------------------------------------------------------------- SN40L (one socket)

Values = Mapping[str, float]  # assumption name -> value (rack/calibration.py)
# Every preset is one rack; `with_racks` (rdu predict --racks) and what-if files add more.
ONE_RACK = "one rack: the platform as published; --racks or a what-if file scales it"


def _fitted(v: Values, *names: str) -> tuple[dict[str, float], dict[str, str]]:
    """Fields set by assumptions: {field: value} and {field: source}, keyed by the last
    part of each assumption's field path."""
    values, sources = {}, {}
    for name in names:
        a = assumption(name)
        field = a.field.rpartition(".")[2]
        values[field], sources[field] = v[name], a.source
    return values, sources


def _sn40l_kernels(v: Values) -> KernelCostSpec:
    values, sources = _fitted(
        v,
        "sn40l.compute_efficiency",
        "sn40l.memory_efficiency",
        "sn40l.launch_so_ns",
        "sn40l.launch_ho_ns",
        "sn40l.pipeline_fill_ns",
        "sn40l.invocation_ns",
    )
    return KernelCostSpec(dataflow_fusion=True, sources=sources, **values)


def _sn40l_socket(v: Values) -> SocketSpec:
    return SocketSpec(
        name="SN40L",
        kind="rdu",
        peak_flops_per_s=638e12,
        sram=TierSpec(
            capacity_bytes=520_000_000,
            bandwidth_bytes_per_s=100 * TB,
            sources={
                "capacity_bytes": "PAPER Table II: 520 MB on-chip SRAM (text: 520 MiB)",
                "bandwidth_bytes_per_s": "assumption: PAPER says 'hundreds of TB/s' aggregate; "
                "we take the lower bound; it never binds in the published workloads",
            },
        ),
        hbm=TierSpec(
            capacity_bytes=64_000_000_000,
            bandwidth_bytes_per_s=1.8 * TB,
            sources={
                "capacity_bytes": "PAPER Table II: 64 GB HBM",
                "bandwidth_bytes_per_s": "PAPER Table II: 1.8 TB/s (text: 'about 2 TB/s')",
            },
        ),
        ddr=TierSpec(
            capacity_bytes=1_500_000_000_000,
            bandwidth_bytes_per_s=200 * GB,
            sources={
                "capacity_bytes": "PAPER Table II: 1.5 TB DDR",
                "bandwidth_bytes_per_s": "PAPER Table II: 200 GB/s (text: 'over 200 GB/s')",
            },
        ),
        ddr_to_hbm_bandwidth_bytes_per_s=200 * GB,
        kernels=_sn40l_kernels(v),
        sources={
            "peak_flops_per_s": "PAPER Table II: 638 BF16 TFLOP/s (the article seed says 688 FP16)",
            "ddr_to_hbm_bandwidth_bytes_per_s": "PAPER Table II: a copy is bound by the slower "
            "side, DDR at 200 GB/s",
        },
    )


def _link(v: Values, latency: str, bandwidth: float, bandwidth_source: str) -> LinkSpec:
    values, sources = _fitted(v, latency)
    return LinkSpec(
        bandwidth_bytes_per_s=bandwidth,
        sources={**sources, "bandwidth_bytes_per_s": bandwidth_source},
        **values,
    )


def _sn40l_node(v: Values) -> NodeSpec:
    return NodeSpec(
        sockets=8,
        socket=_sn40l_socket(v),
        ddr_to_hbm_node_bandwidth_bytes_per_s=1 * TB,
        # Assumption: PAPER shows peer-to-peer links but not their topology; an 8-socket
        # node without a switch is naturally a full mesh (as AMD MI300X nodes are).
        fabric="mesh",
        intra_node_link=_link(
            v,
            "sn40l.intra_node_latency_ns",
            64 * GB,
            "assumption: SN40L peer-to-peer bandwidth is not published; a x16 Gen5-class "
            "link per pair of sockets (64 GB/s each way), as in MI300X meshes",
        ),
        sources={
            "sockets": "PAPER Sec. IV: an SN40L node has 8 sockets and one host",
            "ddr_to_hbm_node_bandwidth_bytes_per_s": "PAPER Sec. VI-C: 'over 1 TB/s' aggregate "
            "DDR->HBM per 8-socket node; we take the stated lower bound",
        },
    )


def _sn40l_platform(v: Values, name: str, nodes: int, description: str) -> PlatformSpec:
    return PlatformSpec(
        name=name,
        description=description,
        nodes=nodes,
        node=_sn40l_node(v),
        inter_node_link=_link(
            v,
            "sn40l.inter_node_latency_ns",
            50 * GB,
            "assumption: not published; a 400 Gb/s-class network port per socket between "
            "the rack's two nodes",
        ),
        sources={
            "nodes": "PAPER Sec. IV: a DataScale SN40L rack is two 8-socket nodes",
            "racks": ONE_RACK,
        },
    )


# ---------------------------------------------------------------- GPUs and DGX nodes


def _gpu_kernels(v: Values, gpu: str) -> KernelCostSpec:
    values, sources = _fitted(
        v,
        "gpu.compute_efficiency",
        "gpu.memory_efficiency",
        f"{gpu.lower()}.launch_so_ns",
        "gpu.invocation_ns",
    )
    return KernelCostSpec(
        launch_ho_ns=None,
        pipeline_fill_ns=0.0,
        dataflow_fusion=False,
        sources={
            **sources,
            "pipeline_fill_ns": "GPUs run the comparison unfused: no fused pipeline to fill",
        },
        **values,
    )


def _gpu(
    v: Values,
    name: str,
    peak_flops: float,
    hbm_bw: float,
    l2_bytes: int,
    host_share_bytes: int,
    pcie_bw: float,
    src: str,
    pcie: str,
) -> SocketSpec:
    return SocketSpec(
        name=name,
        kind="gpu",
        peak_flops_per_s=peak_flops,
        sram=TierSpec(
            capacity_bytes=l2_bytes,
            bandwidth_bytes_per_s=3 * hbm_bw,
            sources={
                "capacity_bytes": f"{src} datasheet: L2 cache",
                "bandwidth_bytes_per_s": "assumption: L2 bandwidth is not in the datasheet; "
                "unused by the unfused GPU model",
            },
        ),
        hbm=TierSpec(
            capacity_bytes=80_000_000_000,
            bandwidth_bytes_per_s=hbm_bw,
            sources={
                "capacity_bytes": f"{src} datasheet: 80 GB HBM",
                "bandwidth_bytes_per_s": f"{src} datasheet: HBM bandwidth",
            },
        ),
        ddr=TierSpec(
            capacity_bytes=host_share_bytes,
            bandwidth_bytes_per_s=pcie_bw,
            sources={
                "capacity_bytes": f"DGX {src} datasheet: 2 TB host DRAM, one eighth per GPU",
                "bandwidth_bytes_per_s": f"{src}: a GPU reaches host DRAM over {pcie}",
            },
        ),
        ddr_to_hbm_bandwidth_bytes_per_s=pcie_bw,
        kernels=_gpu_kernels(v, src),
        sources={
            "peak_flops_per_s": f"{src} datasheet: dense BF16 Tensor Core peak",
            "ddr_to_hbm_bandwidth_bytes_per_s": f"{src}: host to GPU over {pcie}",
        },
    )


def _a100(v: Values) -> SocketSpec:
    return _gpu(
        v,
        "A100-SXM-80GB",
        312e12,
        2.0 * TB,
        40_000_000,
        250_000_000_000,
        32 * GB,
        "A100",
        "PCIe 4 x16 (32 GB/s)",
    )


def _h100(v: Values) -> SocketSpec:
    return _gpu(
        v,
        "H100-SXM-80GB",
        989e12,
        3.35 * TB,
        50_000_000,
        250_000_000_000,
        64 * GB,
        "H100",
        "PCIe 5 x16 (64 GB/s)",
    )


def _dgx(
    v: Values, name: str, gpu: SocketSpec, nvlink_bw: float, nic_bw: float, src: str
) -> PlatformSpec:
    return PlatformSpec(
        name=name,
        description=f"DGX {src}: 8 x {gpu.name}, HBM plus host DRAM over PCIe",
        nodes=1,
        node=NodeSpec(
            sockets=8,
            socket=gpu,
            ddr_to_hbm_node_bandwidth_bytes_per_s=gpu.ddr_to_hbm_bandwidth_bytes_per_s,
            fabric="switch",  # NVSwitch
            intra_node_link=_link(
                v,
                "gpu.nvlink_latency_ns",
                nvlink_bw,
                f"{src} datasheet: NVLink per GPU {2 * nvlink_bw / GB:.0f} GB/s both ways, "
                "half each way, via NVSwitch",
            ),
            sources={
                "sockets": f"DGX {src} datasheet: 8 GPUs",
                "ddr_to_hbm_node_bandwidth_bytes_per_s": "PAPER Sec. VI-C: DGX switching is "
                "estimated at one host-to-GPU link's bandwidth for the whole node (which "
                "topology limit causes it is not stated; we model a node-level cap)",
            },
        ),
        inter_node_link=LinkSpec(
            bandwidth_bytes_per_s=nic_bw,
            latency_ns=5_000.0,
            sources={
                "bandwidth_bytes_per_s": f"DGX {src} datasheet: one InfiniBand port per GPU",
                "latency_ns": "assumption: a few microseconds through a NIC and switch",
            },
        ),
        sources={
            "nodes": "one DGX node, the unit PAPER Table V compares against",
            "racks": ONE_RACK,
        },
    )


def builtin_platforms(values: Values | None = None) -> dict[str, PlatformSpec]:
    """Every built-in platform by name (a fresh dict: callers may not share state), its
    assumptions at the calibrated values or at `values`."""
    v = fitted_values() if values is None else values
    return {
        "sn40l-node": _sn40l_platform(
            v, "sn40l-node", 1, "one SN40L node: 8 RDU sockets sharing one host"
        ),
        "sn40l-rack16": _sn40l_platform(
            v, "sn40l-rack16", 2, "a DataScale SN40L rack: 2 nodes x 8 RDU sockets"
        ),
        "dgx-a100": _dgx(v, "dgx-a100", _a100(v), 300 * GB, 25 * GB, "A100"),
        "dgx-h100": _dgx(v, "dgx-h100", _h100(v), 450 * GB, 50 * GB, "H100"),
    }


# ---------------------------------------------------------------- racks of racks

SPINE_LATENCY_NS = 10_000.0
SPINE_OVERSUBSCRIPTION = 1.0


def default_spine(p: PlatformSpec) -> SpineSpec:
    """The spine assumed between racks of `p` when nothing says otherwise. No SN40L
    multi-rack network is published: every number is an assumption."""
    return SpineSpec(
        bandwidth_bytes_per_s=p.inter_node_link.bandwidth_bytes_per_s,
        latency_ns=SPINE_LATENCY_NS,
        oversubscription=SPINE_OVERSUBSCRIPTION,
        sources={
            "bandwidth_bytes_per_s": "assumption: each socket's own network port (the "
            f"{p.inter_node_link.bandwidth_bytes_per_s / GB:.0f} GB/s of its rail inside "
            "the rack, a 400 Gb/s-class Ethernet/InfiniBand port on SN40L) reaches the "
            "spine: rail-optimised cabling",
            "latency_ns": "assumption: NIC, leaf, spine, leaf, NIC: two more switch hops "
            "than a hop inside the rack, about twice its fitted ~5 us, a collective "
            "step included",
            "oversubscription": "assumption: a non-blocking (1:1) leaf-spine fabric, as "
            "training clusters are built; a what-if file sets 2 or 4 for a cheaper one",
        },
    )


def with_racks(p: PlatformSpec, racks: int) -> PlatformSpec:
    """`p` scaled to `racks` racks of its nodes, on its spine or the default one."""
    if racks == p.racks:
        return p
    spine = p.spine if p.spine is not None else default_spine(p)
    sources = {**p.sources, "racks": f"--racks {racks}: a study of {racks} racks"}
    return PlatformSpec.model_validate(
        {**p.model_dump(), "racks": racks, "spine": spine.model_dump(), "sources": sources}
    )


def platform(name: str, values: Values | None = None) -> PlatformSpec:
    platforms = builtin_platforms(values)
    if name not in platforms:
        raise UnknownName("platform", name, sorted(platforms))
    return platforms[name]
