"""Built-in platforms, each number with its source.

Sources (full references in docs/figures.md):
  PAPER = Prabhakar et al., "SambaNova SN40L: Scaling the AI Memory Wall with Dataflow
          and Composition of Experts", arXiv 2405.07518 (MICRO 2024).
  KL    = Koeplinger et al., "Kernel Looping", arXiv 2410.23668.
  A100  = NVIDIA A100 Tensor Core GPU datasheet (SXM 80GB); DGX A100 datasheet.
  H100  = NVIDIA H100 Tensor Core GPU datasheet (SXM 80GB); DGX H100 datasheet.

The peer-to-peer links of the SN40L, its kernel efficiencies and launch overheads are
not published. They are assumptions, chosen once for all figures (no knob per figure):
`rdu bench paper` lists which published figures each one was fitted against and which
figures are predicted without having been used.
"""

from __future__ import annotations

from rdurack.errors import UnknownName
from rdurack.rack.spec import (
    KernelCostSpec,
    LinkSpec,
    NodeSpec,
    PlatformSpec,
    SocketSpec,
    TierSpec,
)

GB = 1e9  # decimal, as the papers and datasheets write capacities and bandwidths
TB = 1e12

# ---------------------------------------------------------------- SN40L (one socket)

SN40L_KERNELS = KernelCostSpec(
    compute_efficiency=0.55,
    memory_efficiency=0.93,
    launch_so_ns=25_000.0,
    launch_ho_ns=5_000.0,
    pipeline_fill_ns=40_000.0,
    dataflow_fusion=True,
    sources={
        "compute_efficiency": "assumption: about half of the 638 TFLOP/s peak, sustained by "
        "a large fused GEMM pipeline; set before any comparison, not tuned",
        "memory_efficiency": "fitted: KL's kernel-looped decode reaches over 90% of peak "
        "memory bandwidth on 8 and 16 sockets, launches and pipeline fills included",
        "launch_so_ns": "assumption: host-orchestrated Program/Argument Load and launch "
        "per kernel call (a host round trip); set before any comparison, not tuned",
        "launch_ho_ns": "assumption: hardware-orchestrated launch per kernel call (the "
        "schedule runs on the chip, no host round trip)",
        "pipeline_fill_ns": "assumption: filling and draining a fused pipeline of 20+ "
        "operators per call; fitted: the least largest error over KL's up-to-2.2x "
        "kernel-looping gain and PAPER Table V's two overall speedups",
    },
)

SN40L = SocketSpec(
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
    kernels=SN40L_KERNELS,
    sources={
        "peak_flops_per_s": "PAPER Table II: 638 BF16 TFLOP/s (the article seed says 688 FP16)",
        "ddr_to_hbm_bandwidth_bytes_per_s": "PAPER Table II: a copy is bound by the slower "
        "side, DDR at 200 GB/s",
    },
)

SN40L_INTRA_NODE_LINK = LinkSpec(
    bandwidth_bytes_per_s=64 * GB,
    latency_ns=1_000.0,
    sources={
        "bandwidth_bytes_per_s": "assumption: SN40L peer-to-peer bandwidth is not published; "
        "a x16 Gen5-class link per pair of sockets (64 GB/s each way), as in MI300X meshes",
        "latency_ns": "assumption: not published; about one microsecond per hop, typical of "
        "a switchless serdes link",
    },
)

SN40L_INTER_NODE_LINK = LinkSpec(
    bandwidth_bytes_per_s=50 * GB,
    latency_ns=5_000.0,
    sources={
        "bandwidth_bytes_per_s": "assumption: not published; a 400 Gb/s-class network port "
        "per socket between the rack's two nodes",
        "latency_ns": "assumption: not published; a few microseconds through a NIC and cable",
    },
)


def _sn40l_node() -> NodeSpec:
    return NodeSpec(
        sockets=8,
        socket=SN40L,
        ddr_to_hbm_node_bandwidth_bytes_per_s=1 * TB,
        # Assumption: PAPER shows peer-to-peer links but not their topology; an 8-socket
        # node without a switch is naturally a full mesh (as AMD MI300X nodes are).
        fabric="mesh",
        intra_node_link=SN40L_INTRA_NODE_LINK,
        sources={
            "sockets": "PAPER Sec. IV: an SN40L node has 8 sockets and one host",
            "ddr_to_hbm_node_bandwidth_bytes_per_s": "PAPER Sec. VI-C: 'over 1 TB/s' aggregate "
            "DDR->HBM per 8-socket node; we take the stated lower bound",
        },
    )


def _sn40l_platform(name: str, nodes: int, description: str) -> PlatformSpec:
    return PlatformSpec(
        name=name,
        description=description,
        nodes=nodes,
        node=_sn40l_node(),
        inter_node_link=SN40L_INTER_NODE_LINK,
        sources={"nodes": "PAPER Sec. IV: a DataScale SN40L rack is two 8-socket nodes"},
    )


# ---------------------------------------------------------------- GPUs and DGX nodes


def _gpu_kernels(gpu: str) -> KernelCostSpec:
    return KernelCostSpec(
        compute_efficiency=0.6,
        memory_efficiency=0.85,
        launch_so_ns=4_500.0,
        launch_ho_ns=None,
        pipeline_fill_ns=0.0,
        dataflow_fusion=False,
        sources={
            "compute_efficiency": f"assumption: fraction of {gpu} dense BF16 peak a large "
            "GEMM sustains in a framework (NeMo)",
            "memory_efficiency": f"assumption: fraction of {gpu} HBM bandwidth a streaming "
            "kernel sustains",
            "launch_so_ns": "assumption: CUDA kernel launch plus framework dispatch per "
            "kernel; fitted to KL: GPUs use only 21% of peak memory bandwidth in decode",
            "pipeline_fill_ns": "GPUs run the comparison unfused: no fused pipeline to fill",
        },
    )


def _gpu(
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
        kernels=_gpu_kernels(src),
        sources={
            "peak_flops_per_s": f"{src} datasheet: dense BF16 Tensor Core peak",
            "ddr_to_hbm_bandwidth_bytes_per_s": f"{src}: host to GPU over {pcie}",
        },
    )


A100_80GB = _gpu(
    "A100-SXM-80GB",
    312e12,
    2.0 * TB,
    40_000_000,
    250_000_000_000,
    32 * GB,
    "A100",
    "PCIe 4 x16 (32 GB/s)",
)
H100_80GB = _gpu(
    "H100-SXM-80GB",
    989e12,
    3.35 * TB,
    50_000_000,
    250_000_000_000,
    64 * GB,
    "H100",
    "PCIe 5 x16 (64 GB/s)",
)


def _dgx(name: str, gpu: SocketSpec, nvlink_bw: float, nic_bw: float, src: str) -> PlatformSpec:
    return PlatformSpec(
        name=name,
        description=f"DGX {src}: 8 x {gpu.name}, HBM plus host DRAM over PCIe",
        nodes=1,
        node=NodeSpec(
            sockets=8,
            socket=gpu,
            ddr_to_hbm_node_bandwidth_bytes_per_s=gpu.ddr_to_hbm_bandwidth_bytes_per_s,
            fabric="switch",  # NVSwitch
            intra_node_link=LinkSpec(
                bandwidth_bytes_per_s=nvlink_bw,
                latency_ns=800.0,
                sources={
                    "bandwidth_bytes_per_s": f"{src} datasheet: NVLink per GPU "
                    f"{2 * nvlink_bw / GB:.0f} GB/s both ways, half each way, via NVSwitch",
                    "latency_ns": "assumption: per ring step of an NCCL small-message "
                    "all-reduce; fitted with launch_so_ns to KL's 21% decode bandwidth",
                },
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
        sources={"nodes": "one DGX node, the unit PAPER Table V compares against"},
    )


def builtin_platforms() -> dict[str, PlatformSpec]:
    """Every built-in platform by name (a fresh dict: callers may not share state)."""
    return {
        "sn40l-node": _sn40l_platform(
            "sn40l-node", 1, "one SN40L node: 8 RDU sockets sharing one host"
        ),
        "sn40l-rack16": _sn40l_platform(
            "sn40l-rack16", 2, "a DataScale SN40L rack: 2 nodes x 8 RDU sockets"
        ),
        "dgx-a100": _dgx("dgx-a100", A100_80GB, 300 * GB, 25 * GB, "A100"),
        "dgx-h100": _dgx("dgx-h100", H100_80GB, 450 * GB, 50 * GB, "H100"),
    }


def platform(name: str) -> PlatformSpec:
    platforms = builtin_platforms()
    if name not in platforms:
        raise UnknownName("platform", name, sorted(platforms))
    return platforms[name]
