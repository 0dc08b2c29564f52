"""Hardware specification of a platform: sockets, their memory tiers, links and nodes.

One `PlatformSpec` describes anything rdurack can emulate: an SN40L node (1 x 8 sockets),
the 16-socket SN40L rack (2 x 8) and, for comparison, DGX A100 / H100 nodes (GPUs as
sockets, host DRAM as their capacity tier). Every number is in SI units named in the
field (`_bytes`, `_bytes_per_s`, `_ns`, `_flops_per_s`) and every numeric field carries
its source in `sources`: a paper table, a datasheet, or "assumption: why". The validator
refuses a spec with an unsourced number, so the rule cannot rot.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, ClassVar, Literal, Self

from pydantic import Field, model_validator

from rdurack.config import Config


class Tier(StrEnum):
    """The three memory tiers of a socket, fastest first."""

    SRAM = "sram"
    HBM = "hbm"
    DDR = "ddr"


class Sourced(Config):
    """A config model whose every numeric field must name its source."""

    sources: dict[str, str] = Field(default_factory=dict)
    # Counts `numbers()` leaves out while they keep their default: one rack is every
    # preset's shape, and listing it would only add a line to every platform's table.
    shape_defaults: ClassVar[dict[str, int]] = {}

    @model_validator(mode="after")
    def _every_number_has_a_source(self) -> Self:
        numeric = [
            name
            for name, value in self
            if isinstance(value, int | float) and not isinstance(value, bool)
        ]
        missing = [name for name in numeric if not self.sources.get(name)]
        if missing:
            raise ValueError(
                f"{type(self).__name__}: no source for {', '.join(missing)}; every hardware "
                "number needs a paper, a datasheet or 'assumption: <why>' in `sources`"
            )
        unknown = sorted(set(self.sources) - set(numeric))
        if unknown:
            raise ValueError(f"{type(self).__name__}: sources for unknown fields {unknown}")
        return self

    def numbers(self, prefix: str = "") -> list[tuple[str, float, str]]:
        """Every number in this model and the models inside it: (dotted path, value,
        source), in field order."""
        rows: list[tuple[str, float, str]] = []
        for name, value in self:
            path = f"{prefix}{name}"
            if isinstance(value, Sourced):
                rows += value.numbers(path + ".")
            elif self.shape_defaults.get(name) == value:
                continue
            elif isinstance(value, int | float) and not isinstance(value, bool):
                rows.append((path, float(value), self.sources[name]))
        return rows


class TierSpec(Sourced):
    """One memory tier of one socket."""

    capacity_bytes: int = Field(gt=0)
    # Peak bandwidth between this tier and the socket's compute units.
    bandwidth_bytes_per_s: float = Field(gt=0)


class KernelCostSpec(Sourced):
    """How close kernels come to the roofline, and what launching one costs."""

    # Fraction of peak FLOP/s a compute-bound kernel reaches.
    compute_efficiency: float = Field(gt=0, le=1)
    # Fraction of peak HBM bandwidth a streaming kernel reaches.
    memory_efficiency: float = Field(gt=0, le=1)
    # Host-orchestrated (software-scheduled) launch of one kernel call.
    launch_so_ns: float = Field(ge=0)
    # Hardware-orchestrated launch (schedule offloaded to the chip); None where the
    # platform has no such mode (GPUs launch every kernel from the host).
    launch_ho_ns: float | None = Field(default=None, ge=0)
    # Each call of a fused kernel fills its deep pipeline and drains it at the end (the
    # layer-boundary synchronisation kernel looping removes). Unfused single-operator
    # kernels have shallow pipelines and pay none.
    pipeline_fill_ns: float = Field(default=0.0, ge=0)
    # Each invocation of a model (one request's prefill and decode of one model, or a
    # router pass) starts by loading that model's program and arguments onto the
    # devices: on an RDU the Program and Argument Loads of PAPER Sec. III; on a GPU the
    # framework's per-request setup. Paid once per invocation, not per kernel.
    invocation_ns: float = Field(default=0.0, ge=0)
    # Whether a whole decoder block can run as one streaming dataflow kernel with its
    # intermediates in SRAM. False for GPUs: the comparison runs them unfused.
    dataflow_fusion: bool = True


class SocketSpec(Sourced):
    """One accelerator socket: an SN40L RDU or, for comparison, one GPU."""

    name: str
    kind: Literal["rdu", "gpu"]
    peak_flops_per_s: float = Field(gt=0)  # dense BF16
    sram: TierSpec
    hbm: TierSpec
    # The capacity tier: DDR on an RDU; for a GPU, its share of the node's host DRAM.
    ddr: TierSpec
    # Copy bandwidth from this socket's DDR into its HBM (before any node-level cap).
    ddr_to_hbm_bandwidth_bytes_per_s: float = Field(gt=0)
    kernels: KernelCostSpec

    def tier(self, tier: Tier) -> TierSpec:
        return {Tier.SRAM: self.sram, Tier.HBM: self.hbm, Tier.DDR: self.ddr}[tier]


class LinkSpec(Sourced):
    """A point-to-point link, one direction."""

    bandwidth_bytes_per_s: float = Field(gt=0)
    latency_ns: float = Field(ge=0)


class NodeSpec(Sourced):
    """Sockets sharing one host; links between them."""

    sockets: int = Field(gt=0)
    socket: SocketSpec
    # Aggregate cap on DDR->HBM (or host->GPU) copies of all sockets of the node at once.
    ddr_to_hbm_node_bandwidth_bytes_per_s: float = Field(gt=0)
    # How sockets of a node reach each other. "mesh": a dedicated link per pair of
    # sockets, so sends to different peers run in parallel. "switch": each socket has
    # one port into a switch (NVSwitch), so what it sends at once shares that port.
    fabric: Literal["mesh", "switch"]
    # One link of the mesh, or one socket's port into the switch; one direction.
    intra_node_link: LinkSpec


class SpineSpec(Sourced):
    """The network between racks, as one socket sees it: socket i of a node reaches socket
    i of every node of every other rack through a leaf-spine fabric (rail-optimised, as
    multi-rack accelerator clusters are cabled). One direction."""

    # One socket's port into the fabric, before oversubscription.
    bandwidth_bytes_per_s: float = Field(gt=0)
    # NIC, leaf, spine, leaf, NIC: one transfer's fixed time.
    latency_ns: float = Field(ge=0)
    # Ports into the leaves over ports up to the spine: when every socket of a rack sends
    # across racks at once, each gets bandwidth / oversubscription. 1: non-blocking.
    oversubscription: float = Field(ge=1)

    @property
    def link(self) -> LinkSpec:
        """The spine as one socket's link across racks (bandwidth after oversubscription:
        collectives send from every socket of a rack at once)."""
        return LinkSpec(
            bandwidth_bytes_per_s=self.bandwidth_bytes_per_s / self.oversubscription,
            latency_ns=self.latency_ns,
            sources={
                "bandwidth_bytes_per_s": f"{self.sources['bandwidth_bytes_per_s']}; divided "
                f"by the oversubscription ({self.sources['oversubscription']})",
                "latency_ns": self.sources["latency_ns"],
            },
        )


MAX_RACKS = 1024  # 16,384 SN40L sockets: past any cluster the predictor is meant for


class PlatformSpec(Sourced):
    """A whole emulated machine: `racks` racks of `nodes` identical nodes each.

    Inter-node topology is "rail": socket i of one node links to socket i of every other
    node of its rack, the usual way multi-node accelerators are cabled. Racks meet through
    a spine (`spine`, needed when racks > 1) on the same rails.
    """

    shape_defaults: ClassVar[dict[str, int]] = {"racks": 1}

    name: str
    description: str
    racks: int = Field(default=1, gt=0, le=MAX_RACKS)
    nodes: int = Field(gt=0)  # per rack
    node: NodeSpec
    inter_node_link: LinkSpec
    spine: SpineSpec | None = None

    @model_validator(mode="after")
    def _racks_need_a_spine(self) -> Self:
        if self.racks > 1 and self.spine is None:
            raise ValueError(
                f"{self.name}: {self.racks} racks need a spine (bandwidth_bytes_per_s, "
                "latency_ns, oversubscription) to link them"
            )
        return self

    @property
    def sockets(self) -> int:
        return self.racks * self.nodes * self.node.sockets

    @property
    def nodes_total(self) -> int:
        """Nodes of every rack: one node agent (one host) each, numbered 0..nodes_total-1."""
        return self.racks * self.nodes

    @property
    def sockets_per_rack(self) -> int:
        return self.nodes * self.node.sockets

    @property
    def socket(self) -> SocketSpec:
        return self.node.socket

    def overridden(self, overrides: dict[str, Any], origin: str) -> PlatformSpec:
        """This spec with `overrides` (a nested dict) merged in, validated again.

        Every number an override replaces gets the source "what-if override (origin)",
        so a result computed from it says so.
        """
        merged = _merge(self.model_dump(), overrides, origin)
        return PlatformSpec.model_validate(merged)


def _merge(base: dict[str, Any], overrides: dict[str, Any], origin: str) -> dict[str, Any]:
    out = dict(base)
    for key, value in overrides.items():
        if key == "sources":
            raise ValueError("a what-if file sets values; their sources are written for it")
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            out[key] = _merge(base[key], value, origin)
            continue
        if isinstance(value, dict) and key in base and base[key] is None:
            # A part the base lacks (a spine): every number in it comes from the file.
            out[key] = _merge({"sources": {}, **dict.fromkeys(value)}, value, origin)
            continue
        if key not in base:
            # Let pydantic name the unknown field in its error.
            out[key] = value
            continue
        out[key] = value
        if "sources" not in base:
            continue
        if value is None:  # an optional number removed: nothing left to source
            out["sources"] = {k: v for k, v in out["sources"].items() if k != key}
        elif isinstance(value, int | float) and not isinstance(value, bool):
            out["sources"] = {**out["sources"], key: f"what-if override ({origin})"}
    return out
