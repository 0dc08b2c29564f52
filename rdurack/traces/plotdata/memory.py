"""What the memory plot of a job shows: bytes used per tier over emulated time, summed
over the job's sockets, and each tier's capacity on the platform the spans name.

Where the numbers come from, the first that the spans hold:
- a span carrying `rdurack.memory.<tier>.used_bytes` (the socket's tier use after the
  op; proposed in docs/tracing.md);
- a training job's `rdu.train.step` spans: each traced step's peak per tier, held until
  the next traced step;
- a CoE job's deploy and expert-switch spans, which carry no tier occupancy: a bundle
  deploy's pinned bytes (HBM) and catalog size, each expert switch's loaded bytes and
  evicted experts. That is the experts' weights only (not the router or the KV cache).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from rdurack.rack.presets import builtin_platforms
from rdurack.telemetry import names
from rdurack.traces.plotdata.units import TimeUnit, bytes_unit
from rdurack.traces.spans import Span, hardware_spans

GB = 1e9
# Proposed socket attribute (not in telemetry/names.py yet): the tier's used bytes on
# the socket when the op ended. `memory_series` prefers it to the derivation.
TIER_USED_ATTR = "rdurack.memory.{tier}.used_bytes"
TIERS = ("sram", "hbm", "ddr")
# The capacity line is drawn when it is at most this many times the peak use; farther
# off it would squash the data into the bottom of the plot, so it is only named.
CAPACITY_SHOWN_WITHIN = 6


@dataclass(frozen=True)
class MemorySeries:
    """Bytes used per tier over emulated time (ns since the job's first op), summed
    over the sockets, as steps: (time, bytes from then on)."""

    tiers: dict[str, list[tuple[int, int]]]
    sockets: int
    end_ns: int
    source: str  # how the numbers were obtained (shown under the plot)
    labels: dict[str, str] = field(default_factory=dict)  # per tier: what the line is


def _held_sums(events: Iterable[tuple[int, str, int]]) -> list[tuple[int, int]]:
    """Steps of the sum over sockets of (time, socket, bytes) reports, each socket's
    last report holding until its next."""
    last: dict[str, int] = {}
    steps: list[tuple[int, int]] = [(0, 0)]
    for t, sid, nbytes in sorted(events):
        last[sid] = nbytes
        steps.append((t, sum(last.values())))
    return steps


def _reported(
    ops: Sequence[Span], key: str, t0: int, at_end: bool = True
) -> list[tuple[int, int]] | None:
    """`_held_sums` of the spans carrying attribute `key`, stamped at their end (or
    start); None when none carries it."""
    events = [
        ((s.emulated_end_ns if at_end else s.emulated_start_ns) - t0, s.service, int(a[key]))
        for s in ops
        if key in (a := s.attributes)
    ]
    return _held_sums(events) if events else None


def _running_sums(changes: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Steps of the running sum of (time, change in bytes), from (0, 0)."""
    total = 0
    steps = [(0, 0)]
    for t, delta in sorted(changes):
        total += delta
        steps.append((t, total))
    return steps


def _expert_deltas(ops: Sequence[Span], t0: int) -> dict[str, list[tuple[int, int]]]:
    """(time, change in bytes) of HBM and DDR from deploy and expert-switch spans."""
    deltas: dict[str, list[tuple[int, int]]] = {"hbm": [], "ddr": []}
    for sid in {s.service for s in ops}:
        mine = [s for s in ops if s.service == sid]
        switches = [s for s in mine if s.name == names.SPAN_EXPERT_SWITCH]
        loaded = [int(s.attributes.get(names.ATTR_BYTES, 0)) for s in switches]
        # Every expert of a bundle is the same model: one loaded share sizes them all.
        share = max(loaded, default=0)
        for s in mine:
            start, stop = s.emulated_start_ns - t0, s.emulated_end_ns - t0
            if s.name == names.SPAN_DEPLOY:
                pinned = int(s.attributes.get(names.ATTR_BYTES, 0))
                experts = int(s.attributes.get(names.ATTR_EXPERTS, 0))
                deltas["hbm"].append((stop, pinned))
                if share:
                    deltas["ddr"].append((start, experts * share))
            elif s.name == names.SPAN_EXPERT_SWITCH and not s.attributes.get(names.ATTR_SWITCH_HIT):
                evicted = s.attributes.get(names.ATTR_EVICTED) or []
                deltas["hbm"].append((start, -share * len(evicted)))
                deltas["hbm"].append((stop, int(s.attributes.get(names.ATTR_BYTES, 0))))
    return deltas


def memory_series(spans: Sequence[Span]) -> MemorySeries | None:
    """Tier use over time from the job's hardware spans (module docstring); None when
    the spans say nothing about memory (a kernel job: its weights and KV cache are not
    in spans)."""
    ops = sorted(hardware_spans(spans), key=lambda s: (s.emulated_start_ns, s.emulated_end_ns))
    if not ops:
        return None
    t0 = min(s.emulated_start_ns for s in ops)
    end = max(s.emulated_end_ns for s in ops) - t0
    sockets = len({s.service for s in ops})
    tiers: dict[str, list[tuple[int, int]]] = {}
    for tier in TIERS:  # reported use after each op
        found = _reported(ops, TIER_USED_ATTR.format(tier=tier), t0)
        if found is not None:
            tiers[tier] = found
    if tiers:
        return MemorySeries(tiers, sockets, end, "the sockets' reported tier use")
    trained = [s for s in ops if s.name == names.SPAN_TRAIN_STEP]
    for tier in TIERS:  # a training job: each traced step's peak, from its start
        key = names.ATTR_PEAK_BYTES.format(tier=tier)
        found = _reported(trained, key, t0, at_end=False)
        if found is not None and any(n for _, n in found):
            tiers[tier] = found
    if tiers:
        traced = max(Counter(s.service for s in trained).values())
        return MemorySeries(
            tiers,
            sockets,
            end,
            f"from the rdu.train.step spans ({traced} traced steps per rank): each traced "
            "step's peak, held until the next traced step",
            {t: f"{t.upper()}: peak during each traced step" for t in tiers},
        )
    deltas = _expert_deltas(ops, t0)
    if not any(deltas.values()):
        return None
    for tier, changes in deltas.items():
        if changes:
            tiers[tier] = _running_sums(changes)
    return MemorySeries(
        tiers,
        sockets,
        end,
        "derived from deploy and expert-switch spans: expert weights only "
        "(the router and the KV cache are not in the spans)",
        {"hbm": "experts' weights in HBM", "ddr": "expert catalog in DDR"},
    )


def capacity_bytes(spans: Sequence[Span], tier: str, sockets: int) -> int | None:
    """The tier's capacity over `sockets` sockets of the platform the spans name; None
    when they name none that is built in."""
    platform = next(
        (
            str(s.attributes[names.ATTR_PLATFORM])
            for s in spans
            if names.ATTR_PLATFORM in s.attributes
        ),
        None,
    )
    spec = builtin_platforms().get(platform or "")
    if spec is None:
        return None
    memory = {"sram": spec.socket.sram, "hbm": spec.socket.hbm, "ddr": spec.socket.ddr}[tier]
    return int(memory.capacity_bytes) * sockets


@dataclass(frozen=True)
class MemoryPanel:
    """One tier's panel: its steps in the plot's units, to its series' end."""

    tier: str
    times: list[float]  # in the plot's time unit
    values: list[float]  # in `unit`
    unit: str  # the panel's own byte unit
    scale: float  # bytes per unit
    label: str  # what the line is
    capacity_bytes: int | None  # over the job's sockets; None: unknown

    @property
    def top(self) -> float:
        return max(self.values) if self.values else 0.0

    @property
    def capacity_label(self) -> str:
        return f"{self.tier.upper()} capacity ({(self.capacity_bytes or 0) / GB:,.0f} GB)"

    @property
    def capacity_off_scale(self) -> bool:
        """The capacity is too far above the data to draw (it is only named)."""
        if self.capacity_bytes is None:
            return False
        return self.capacity_bytes / self.scale > CAPACITY_SHOWN_WITHIN * max(self.top, 1e-9)

    @property
    def y_top(self) -> float:
        """The y axis's top, in `unit`: the capacity when it is drawn, else head room
        above the highest step for the legend in the upper left."""
        cap = self.capacity_bytes
        if cap is None or cap / self.scale > CAPACITY_SHOWN_WITHIN * self.top:
            return max(self.top * 1.4, 1e-3)
        return cap / self.scale * 1.05


@dataclass(frozen=True)
class MemoryPlot:
    """What the memory plot of a job shows: a panel per tier the series holds."""

    job_id: str
    series: MemorySeries
    unit: TimeUnit
    panels: list[MemoryPanel]

    def title(self) -> str:
        return (
            f"Job {self.job_id}: memory per tier, summed over its {self.series.sockets} "
            f"sockets\n{self.series.source}"
        )


def memory_plot(spans: Sequence[Span], job_id: str) -> MemoryPlot | None:
    """The memory plot of the job's spans; None when they hold no memory data."""
    series = memory_series(spans)
    if series is None:
        return None
    unit = TimeUnit.for_extent(max(series.end_ns, 1))
    panels = []
    for tier in (t for t in TIERS if t in series.tiers):
        steps = series.tiers[tier] + [(series.end_ns, series.tiers[tier][-1][1])]
        # Bytes in the panel's own unit: a training job's kB are not 0.0000 GB.
        name, scale = bytes_unit(max(b for _, b in steps))
        panels.append(
            MemoryPanel(
                tier,
                [t / unit.ns for t, _ in steps],
                [b / scale for _, b in steps],
                name,
                scale,
                series.labels.get(tier, f"{tier.upper()} used"),
                capacity_bytes(spans, tier, series.sockets),
            )
        )
    return MemoryPlot(job_id, series, unit, panels)
