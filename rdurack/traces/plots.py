"""Pictures of a job and of the paper study, with matplotlib (`rdu plot`,
`rdu bench paper --plot`).

- `plot_timeline`: a Gantt chart of the sockets' emulated timeline, one row per socket,
  bars coloured by operation, the x axis in emulated time since the job's first
  operation (the emulated attributes of the hardware spans, not their wall stamps).
  Spans inside another one's bar are not bars of their own (a collective's transfers,
  a training segment's steps), but for a step's gradient all-reduce, drawn as a band in
  the lower half of the row, over the training bar it overlaps.
- `plot_memory`: memory per tier over emulated time, summed over the job's sockets.
  A training job's comes from its `rdu.train.step` spans: each traced step's peak per
  tier, held until the next traced step. A CoE job's hardware spans carry no tier
  occupancy, so it is derived from what they do carry: a bundle deploy's pinned bytes
  (HBM) and catalog size, each expert switch's loaded bytes and evicted experts. That is
  the experts' weights only (not the router or the KV cache). A span carrying
  `rdurack.memory.<tier>.used_bytes` (the socket's tier use after the op; proposed in
  docs/tracing.md) is used instead of either, when present.
- `plot_loss`: a training loss curve from (step, loss) pairs (`span_loss_points`: from
  the step spans' losses).
- `plot_stages`: a training job's peak memory (HBM, DDR) and test accuracy per stage
  (progressive: shrinking then growing, block by block), from its `rdu.train.stage`
  spans or its result's `stages`.
- `plot_paper`: published against predicted for every figure of `rdu bench paper`.

Drawing uses matplotlib's object API on an Agg canvas: no pyplot, no global figure
state, no display needed.
"""

from __future__ import annotations

import math
import re
import textwrap
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import NullFormatter

from rdurack.rack.presets import builtin_platforms
from rdurack.telemetry import names
from rdurack.traces.files import Span, TraceError, hardware_spans
from rdurack.workloads.paper import Figure as PaperFigure

DPI = 120
GB = 1e9
# Proposed socket attribute (not in telemetry/names.py yet): the tier's used bytes on
# the socket when the op ended. `plot_memory` prefers it to the derivation.
TIER_USED_ATTR = "rdurack.memory.{tier}.used_bytes"
TIERS = ("sram", "hbm", "ddr")
# The capacity line is drawn when it is at most this many times the peak use; farther
# off it would squash the data into the bottom of the plot, so it is only named.
CAPACITY_SHOWN_WITHIN = 6

TRAINING = "training (DDP steps)"  # a segment of a rank's steps
ALLREDUCE = "gradient all-reduce (traced steps)"  # a traced step's, drawn as a band
# Operation kinds, in legend order, with colours a reader tells apart (and that print
# in grey scale as different shades).
KIND_COLORS: dict[str, str] = {
    "bundle deploy": "#7f7f7f",
    "router": "#9467bd",
    "expert switch DDR→HBM": "#d62728",
    "expert switch: HBM hit": "#ff9896",
    "prefill": "#1f77b4",
    "decode": "#2ca02c",
    TRAINING: "#8c564b",
    ALLREDUCE: "#ffd92f",
    "checkpoint": "#000000",
    "block freeze": "#e377c2",
    "collective": "#ff7f0e",
    "generate (functional)": "#17becf",
}
_EXTRA_COLORS = ("#bcbd22", "#e377c2", "#aec7e8", "#98df8a", "#c5b0d5", "#c49c94")
# Spans whose time another span's bar already shows: a collective's transfers, a
# segment's steps (and the stages that group them).
NOT_BARS = frozenset({names.SPAN_TRAIN_STAGE, names.SPAN_TRAIN_STEP, names.SPAN_TRANSFER})
# Spans drawn as a band in the lower half of their row, over the bar they overlap.
BANDS = frozenset({names.SPAN_TRAIN_ALLREDUCE})
_SOCKET = re.compile(r"^rdu-n(\d+)-s(\d+)$")


# The kinds of spans whose name alone says what they did.
_KIND_OF_NAME = {
    names.SPAN_DEPLOY: "bundle deploy",
    names.SPAN_COLLECTIVE: "collective",
    names.SPAN_GENERATE: "generate (functional)",
    names.SPAN_TRAIN_FREEZE: "block freeze",
    names.SPAN_TRAIN: TRAINING,
    names.SPAN_TRAIN_ALLREDUCE: ALLREDUCE,
    names.SPAN_CHECKPOINT: "checkpoint",
}


def op_kind(span: Span) -> str:
    """What a hardware span did, as the legend names it."""
    a = span.attributes
    if span.name == names.SPAN_KERNEL:
        role = a.get(names.ATTR_KERNEL_ROLE) or a.get(names.ATTR_JOB_PHASE) or "kernel"
        return {"train": TRAINING}.get(str(role), str(role))
    if span.name == names.SPAN_EXPERT_SWITCH:
        return "expert switch: HBM hit" if a.get(names.ATTR_SWITCH_HIT) else "expert switch DDR→HBM"
    known = _KIND_OF_NAME.get(span.name)
    return known or span.name.removeprefix("rdu.").replace("_", " ")


def _socket_key(service: str) -> tuple[int, int, str]:
    m = _SOCKET.match(service)
    return (int(m.group(1)), int(m.group(2)), "") if m else (1 << 30, 0, service)


@dataclass(frozen=True)
class TimeUnit:
    name: str
    ns: float  # nanoseconds per unit

    @classmethod
    def for_extent(cls, extent_ns: float) -> TimeUnit:
        """µs below 2 ms, ms below 2 s, else s: axis numbers stay short."""
        if extent_ns < 2e6:
            return cls("µs", 1e3)
        if extent_ns < 2e9:
            return cls("ms", 1e6)
        return cls("s", 1e9)


def _save(fig: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)  # attaches the Agg canvas; savefig renders through it
    fig.savefig(path, dpi=DPI)
    return path


def _describe(spans: Sequence[Span]) -> str:
    """'llama2-7b on sn40l-rack16' from the spans' model and platform attributes."""
    model = next(
        (s.attributes[names.ATTR_JOB_MODEL] for s in spans if names.ATTR_JOB_MODEL in s.attributes),
        "",
    )
    platform = next(
        (s.attributes[names.ATTR_PLATFORM] for s in spans if names.ATTR_PLATFORM in s.attributes),
        "",
    )
    return " on ".join(str(x) for x in (model, platform) if x)


# ------------------------------------------------------------------ the timeline


def plot_timeline(spans: Sequence[Span], job_id: str, path: Path) -> Path:
    """A Gantt chart of the job's hardware spans; raises TraceError if it has none.
    Spans inside another's bar (NOT_BARS) are not drawn; BANDS are drawn over it."""
    ops = [s for s in hardware_spans(spans) if s.name not in NOT_BARS]
    if not ops:
        raise TraceError(f"job {job_id} has no hardware spans (rdu.*) to draw a timeline of")
    t0 = min(s.emulated_start_ns for s in ops)
    extent = max(max(s.emulated_end_ns for s in ops) - t0, 1)
    unit = TimeUnit.for_extent(extent)
    sockets = sorted({s.service for s in ops}, key=_socket_key)
    row = {sid: i for i, sid in enumerate(sockets)}
    kinds = _kinds(op_kind(s) for s in ops)
    colors = _colors(kinds)

    fig = Figure(figsize=(12, max(3.2, 0.42 * len(sockets) + 2.0)), layout="constrained")
    ax = fig.add_subplot()
    # Ops narrower than this many ns would be invisible as bars: they are drawn as ticks.
    thin = extent / 1500
    for kind in kinds:
        bars: dict[int, list[tuple[float, float]]] = {}
        ticks_x: list[float] = []
        ticks_y: list[float] = []
        band = False
        for s in ops:
            if op_kind(s) != kind:
                continue
            band = s.name in BANDS
            start = (s.emulated_start_ns - t0) / unit.ns
            width = (s.emulated_end_ns - s.emulated_start_ns) / unit.ns
            if width * unit.ns < thin:
                ticks_x.append(start)
                ticks_y.append(row[s.service] + (0.2 if s.name in BANDS else 0.0))
            else:
                bars.setdefault(row[s.service], []).append((start, width))
        for y, xs in bars.items():
            # A thin white edge parts back-to-back ops of one kind. The row's top is at
            # y - 0.38 (the y axis runs down); a band fills its lower half.
            top, height = (y + 0.02, 0.36) if band else (y - 0.38, 0.76)
            ax.broken_barh(
                xs, (top, height), facecolors=colors[kind], edgecolor="white", linewidth=0.4
            )
        if ticks_x:
            ax.plot(
                ticks_x,
                ticks_y,
                linestyle="none",
                marker="|",
                markersize=14,
                markeredgewidth=1.6,
                color=colors[kind],
                zorder=3,
            )
    ax.set_yticks(range(len(sockets)), sockets)
    ax.set_ylim(len(sockets) - 0.5, -0.5)  # the first socket on top
    # A margin on the left: a tick at 0 (a deploy) is not hidden by the axis.
    ax.set_xlim(-extent / unit.ns * 0.005, extent / unit.ns * 1.01)
    ax.set_xlabel(f"emulated time since the job's first operation ({unit.name})")
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    what = _describe(ops)
    ax.set_title(
        f"Job {job_id}: what each socket did, on the emulated timeline\n"
        f"{what + ', ' if what else ''}{len(sockets)} sockets, {len(ops)} operations, "
        f"{extent / unit.ns:.4g} {unit.name} emulated",
        loc="left",
    )
    handles: list[Artist] = [Patch(facecolor=colors[k], label=_legend(k)) for k in kinds]
    if any((s.emulated_end_ns - s.emulated_start_ns) < thin for s in ops):  # say what a tick means
        handles.append(
            Line2D(
                [],
                [],
                linestyle="none",
                marker="|",
                markersize=12,
                color="black",
                label=f"tick: shorter than {_duration(thin)}",
            )
        )
    fig.legend(handles=handles, loc="outside right upper", title="operation", frameon=False)
    return _save(fig, path)


def _legend(kind: str) -> str:
    """A kind's legend entry; a band says where it is drawn."""
    if kind == ALLREDUCE:
        return "gradient all-reduce, traced steps\n(lower half: it overlaps backward)"
    return kind


def _duration(ns: float) -> str:
    unit = TimeUnit.for_extent(ns * 2)  # 1.5 ms, not 0.0015 s
    return f"{ns / unit.ns:.3g} {unit.name}"


def _kinds(found: Iterable[str]) -> list[str]:
    """The kinds present, known ones in legend order, then the others by name."""
    present = set(found)
    return [k for k in KIND_COLORS if k in present] + sorted(present - set(KIND_COLORS))


def _colors(kinds: Sequence[str]) -> dict[str, str]:
    extra = iter(_EXTRA_COLORS * (1 + len(kinds) // len(_EXTRA_COLORS)))
    return {k: KIND_COLORS.get(k) or next(extra) for k in kinds}


# ------------------------------------------------------------------ memory


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


def memory_series(spans: Sequence[Span]) -> MemorySeries | None:
    """Tier use over time from the job's hardware spans; None when the spans say
    nothing about memory (a kernel job: its weights and KV cache are not in spans)."""
    ops = sorted(hardware_spans(spans), key=lambda s: (s.emulated_start_ns, s.emulated_end_ns))
    if not ops:
        return None
    t0 = min(s.emulated_start_ns for s in ops)
    end = max(s.emulated_end_ns for s in ops) - t0
    sockets = {s.service for s in ops}
    tiers: dict[str, list[tuple[int, int]]] = {}
    for tier in TIERS:  # reported use after each op
        found = _reported(ops, TIER_USED_ATTR.format(tier=tier), t0)
        if found is not None:
            tiers[tier] = found
    if tiers:
        return MemorySeries(tiers, len(sockets), end, "the sockets' reported tier use")
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
            len(sockets),
            end,
            f"from the rdu.train.step spans ({traced} traced steps per rank): each traced "
            "step's peak, held until the next traced step",
            {t: f"{t.upper()}: peak during each traced step" for t in tiers},
        )
    deltas: dict[str, list[tuple[int, int]]] = {"hbm": [], "ddr": []}
    for sid in sockets:
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
    if not any(deltas.values()):
        return None
    for tier, changes in deltas.items():
        if not changes:
            continue
        total = 0
        steps = [(0, 0)]
        for t, delta in sorted(changes):
            total += delta
            steps.append((t, total))
        tiers[tier] = steps
    return MemorySeries(
        tiers,
        len(sockets),
        end,
        "derived from deploy and expert-switch spans: expert weights only "
        "(the router and the KV cache are not in the spans)",
        {"hbm": "experts' weights in HBM", "ddr": "expert catalog in DDR"},
    )


def _capacity(spans: Sequence[Span], tier: str, sockets: int) -> int | None:
    """The tier's capacity over `sockets` sockets of the platform the spans name."""
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


def plot_memory(spans: Sequence[Span], job_id: str, path: Path) -> Path | None:
    """Memory per tier over emulated time; None (nothing written) when the spans hold
    no memory data."""
    series = memory_series(spans)
    if series is None:
        return None
    unit = TimeUnit.for_extent(max(series.end_ns, 1))
    tiers = [t for t in TIERS if t in series.tiers]
    fig = Figure(figsize=(12, 2.2 + 2.2 * len(tiers)), layout="constrained")
    axes: list[Axes] = []
    for i in range(len(tiers)):
        axes.append(fig.add_subplot(len(tiers), 1, i + 1, sharex=axes[0] if axes else None))
    for ax, tier in zip(axes, tiers, strict=True):
        steps = series.tiers[tier] + [(series.end_ns, series.tiers[tier][-1][1])]
        # Bytes in the axis's own unit: a training job's kB are not 0.0000 GB.
        name, scale = _bytes_unit(max(b for _, b in steps))
        xs = [t / unit.ns for t, _ in steps]
        ys = [b / scale for _, b in steps]
        color = {"hbm": "#1f77b4", "ddr": "#8c564b", "sram": "#2ca02c"}[tier]
        ax.step(
            xs,
            ys,
            where="post",
            color=color,
            linewidth=2,
            label=series.labels.get(tier, f"{tier.upper()} used"),
        )
        ax.fill_between(xs, ys, step="post", color=color, alpha=0.15)
        capacity = _capacity(spans, tier, series.sockets)
        top = max(ys) if ys else 0.0
        if capacity is not None:
            ax.axhline(
                capacity / scale,
                color="black",
                linestyle="--",
                linewidth=1,
                label=f"{tier.upper()} capacity ({capacity / GB:,.0f} GB)",
            )
            # Keep the data readable: show the capacity line only when it is near.
            if capacity / scale > CAPACITY_SHOWN_WITHIN * max(top, 1e-9):
                ax.lines[-1].remove()
                ax.text(
                    0.99,
                    0.95,
                    f"capacity {capacity / GB:,.0f} GB (off the scale)",
                    transform=ax.transAxes,
                    ha="right",
                    va="top",
                    fontsize=9,
                )
        if capacity is None or capacity / scale > CAPACITY_SHOWN_WITHIN * top:
            # Head room above the highest step for the legend in the upper left.
            ax.set_ylim(0, max(top * 1.4, 1e-3))
        else:
            ax.set_ylim(0, capacity / scale * 1.05)
        ax.set_ylabel(f"{tier.upper()} ({name})")
        ax.set_xlim(0, series.end_ns / unit.ns * 1.01)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", frameon=False)
    axes[-1].set_xlabel(f"emulated time since the job's first operation ({unit.name})")
    axes[0].set_title(
        f"Job {job_id}: memory per tier, summed over its {series.sockets} sockets\n{series.source}",
        loc="left",
    )
    return _save(fig, path)


# ------------------------------------------------------------------ training loss


def loss_points(result: Mapping[str, Any] | None) -> list[tuple[int, float]]:
    """(step, loss) pairs from a job result (`rdu job ID --json`): a `losses` list, per
    step from step 1, or a list of {"step", "loss"} objects or [step, loss] pairs.
    Empty when there are none."""
    if not result:
        return []
    raw = result.get("losses") or result.get("loss_curve") or []
    points: list[tuple[int, float]] = []
    for i, item in enumerate(raw):
        if isinstance(item, int | float) and not isinstance(item, bool):
            points.append((i + 1, float(item)))
        elif isinstance(item, Mapping) and "loss" in item:
            points.append((int(item.get("step", i + 1)), float(item["loss"])))
        elif isinstance(item, Sequence) and len(item) == 2:
            points.append((int(item[0]), float(item[1])))
    return [(s, x) for s, x in points if math.isfinite(x)]


def span_loss_points(spans: Sequence[Span]) -> list[tuple[int, float]]:
    """(step, loss) pairs from hardware spans carrying `rdurack.train.loss` and
    `rdurack.train.step` (the traced `rdu.train.step` spans). Each DDP rank reports its
    local batch's loss; with equal local batches their mean is the global batch's loss,
    so a step's loss is the mean over its ranks."""
    by_step: dict[int, list[float]] = {}
    for s in hardware_spans(spans):
        a = s.attributes
        if names.ATTR_LOSS in a and names.ATTR_STEP in a:
            loss = float(a[names.ATTR_LOSS])
            if math.isfinite(loss):
                by_step.setdefault(int(a[names.ATTR_STEP]), []).append(loss)
    return [(step, sum(xs) / len(xs)) for step, xs in sorted(by_step.items())]


def plot_loss(
    points: Sequence[tuple[int, float]], job_id: str, path: Path, what: str = "loss"
) -> Path | None:
    """The loss per optimizer step; None (nothing written) without points. `what`: the
    y axis's label (whose loss it is)."""
    if not points:
        return None
    steps = [s for s, _ in points]
    losses = [x for _, x in points]
    stride = min((b - a for a, b in pairwise(steps)), default=1)
    fig = Figure(figsize=(8, 4.5), layout="constrained")
    ax = fig.add_subplot()
    ax.plot(
        steps,
        losses,
        marker="o" if len(points) <= 80 else None,
        markersize=3,
        color="#1f77b4",
        linewidth=1.5,
    )
    positive = all(x > 0 for x in losses)
    if positive and max(losses) / min(losses) > 100:
        ax.set_yscale("log")  # losses that fall by decades
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(what)
    ax.grid(alpha=0.3)
    of = f"{len(points)} traced steps, one in {stride}" if stride > 1 else f"{len(points)} steps"
    ax.set_title(
        f"Job {job_id}: training loss, {of}, {losses[0]:.4g} → {losses[-1]:.4g}",
        loc="left",
    )
    return _save(fig, path)


# ------------------------------------------------------------------ training stages


@dataclass(frozen=True)
class StagePoint:
    """One training stage as the stage figure draws it."""

    name: str  # "full", "shrink block 3", "grow block 0", ...
    peak_hbm_bytes: int  # the largest over the job's sockets
    peak_ddr_bytes: int
    accuracy: float | None  # the stage's model on the held-out split
    steps: int
    converged: bool  # ended by the movement metric


def stage_points(spans: Sequence[Span]) -> list[StagePoint]:
    """The stages of a training job from its `rdu.train.stage` spans (one per rank per
    stage), in training order: peaks the largest over ranks, accuracy rank 0's."""
    by_name: dict[str, list[Span]] = {}
    for span in sorted(hardware_spans(spans), key=lambda s: s.emulated_start_ns):
        if span.name == names.SPAN_TRAIN_STAGE:
            by_name.setdefault(str(span.attributes.get(names.ATTR_TRAIN_STAGE, "?")), []).append(
                span
            )
    points = []
    for name, mine in by_name.items():
        a = [s.attributes for s in mine]
        accuracy = next(
            (float(x[names.ATTR_TRAIN_ACCURACY]) for x in a if names.ATTR_TRAIN_ACCURACY in x),
            None,
        )
        points.append(
            StagePoint(
                name,
                max(int(x.get(names.ATTR_PEAK_BYTES.format(tier="hbm"), 0)) for x in a),
                max(int(x.get(names.ATTR_PEAK_BYTES.format(tier="ddr"), 0)) for x in a),
                accuracy,
                int(a[0].get(names.ATTR_STEPS, 0)),
                bool(a[0].get(names.ATTR_TRAIN_CONVERGED, False)),
            )
        )
    return points


def result_stage_points(result: Mapping[str, Any] | None) -> list[StagePoint]:
    """The stages of a job result (`rdu job ID --json`); empty without any."""
    return [
        StagePoint(
            str(st.get("name", "?")),
            int(st.get("peak_hbm_bytes", 0)),
            int(st.get("peak_ddr_bytes", 0)),
            float(st["test_accuracy"]) if st.get("test_accuracy") is not None else None,
            int(st.get("steps", 0)),
            bool(st.get("converged", False)),
        )
        for st in (result or {}).get("stages") or []
    ]


def _bytes_unit(top: float) -> tuple[str, float]:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if top >= scale:
            return unit, scale
    return "B", 1.0


def plot_stages(
    points: Sequence[StagePoint], job_id: str, path: Path, hbm_cap_bytes: int = 0
) -> Path | None:
    """Peak HBM and DDR per stage (bars, labelled), and each stage's test accuracy
    below (labelled points); a stage the movement metric ended is marked. None
    (nothing written) without stages."""
    if not points:
        return None
    xs = list(range(len(points)))
    top = max(max(p.peak_hbm_bytes, p.peak_ddr_bytes) for p in points)
    unit, scale = _bytes_unit(max(top, hbm_cap_bytes))
    hbm_color, ddr_color, acc_color = "#1f77b4", "#8c564b", "#2ca02c"
    fig = Figure(figsize=(max(9.0, 1.15 * len(points) + 3), 7.6), layout="constrained")
    grid = fig.add_gridspec(2, 1, height_ratios=[3, 2])
    ax = fig.add_subplot(grid[0])
    width = 0.38
    hbm = [p.peak_hbm_bytes / scale for p in points]
    ddr = [p.peak_ddr_bytes / scale for p in points]
    ax.bar([x - width / 2 for x in xs], hbm, width, color=hbm_color)
    ax.bar([x + width / 2 for x in xs], ddr, width, color=ddr_color, alpha=0.75)
    for x, h, d in zip(xs, hbm, ddr, strict=True):
        ax.text(x - width / 2, h, f"{h:.3g}", ha="center", va="bottom", fontsize=8, color=hbm_color)
        if d:
            ax.text(x + width / 2, d, f"{d:.3g}", ha="center", va="bottom", fontsize=8,
                    color=ddr_color)  # fmt: skip
    # Direct labels instead of a legend: the tallest bar of each tier is named in place.
    for values, dx, tier in ((hbm, -width / 2, "HBM"), (ddr, width / 2, "DDR")):
        tallest = max(xs, key=lambda i: values[i])
        if values[tallest]:
            ax.text(tallest + dx, values[tallest] * 0.5, tier, rotation=90, ha="center",
                    va="center", color="white", fontsize=9, fontweight="bold")  # fmt: skip
    ceiling = max(hbm + ddr + [hbm_cap_bytes / scale])
    if hbm_cap_bytes:
        cap = hbm_cap_bytes / scale
        ax.axhline(cap, color="#d62728", linestyle="--", linewidth=1.2)
        ax.text(-0.55, cap * 1.02, f"HBM cap per socket: {cap:.3g} {unit}", ha="left",
                va="bottom", color="#d62728", fontsize=9)  # fmt: skip
    ax.set_ylim(0, ceiling * 1.25)
    ax.set_xlim(-0.6, len(points) - 0.4)
    ax.tick_params(axis="x", labelbottom=False)  # the stages are named below
    ax.set_ylabel(f"peak per socket ({unit})")
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    ax.set_title(
        f"Job {job_id}: peak memory of each stage on a socket (the largest over its "
        "sockets)\nblue: HBM, brown: DDR (blocks not yet grown, output modules waiting)",
        loc="left",
    )
    acc_ax = fig.add_subplot(grid[1], sharex=ax)
    measured = [(x, p.accuracy) for x, p in zip(xs, points, strict=True) if p.accuracy is not None]
    if measured:
        acc_ax.plot([x for x, _ in measured], [100 * a for _, a in measured], color=acc_color,
                    marker="o", linewidth=1.5)  # fmt: skip
        for x, a in measured:
            acc_ax.text(x, 100 * a + 2, f"{100 * a:.1f}%", ha="center", va="bottom", fontsize=8,
                        color=acc_color)  # fmt: skip
    labels = [
        f"{p.name.replace(' block ', ' ')}\n{p.steps} steps{' ✓' if p.converged else ''}"
        for p in points
    ]
    acc_ax.set_xticks(xs, labels, fontsize=8)
    acc_ax.set_ylim(0, 112)
    acc_ax.set_ylabel("test accuracy (%)")
    acc_ax.grid(axis="y", alpha=0.3)
    acc_ax.set_title(
        "Test accuracy of each stage's model\n✓: the movement metric ended the stage "
        "(else its step budget did)",
        loc="left",
        fontsize=10,
    )
    return _save(fig, path)


# ------------------------------------------------------------------ the paper


def _paper_label(f: PaperFigure) -> str:
    """'what it is [where from]', wrapped: the figure's source up to its first ':' or
    '(' (the table of `rdu bench paper` has the whole of it)."""
    where = re.split(r"[:(]", f.source, maxsplit=1)[0].strip()
    return textwrap.fill(f"{f.what} [{where}]", 56)


def plot_paper(figures: Sequence[PaperFigure], path: Path) -> Path:
    """Published against predicted: value figures as predicted/published with the ±15%
    band, range figures as the published range beside the predicted one, yes/no figures
    as a list. Green: reproduced; red: missed; hollow markers: fitted figures."""
    values = [f for f in figures if not isinstance(f.published, bool | tuple)]
    ranges = [f for f in figures if isinstance(f.published, tuple)]
    flags = [f for f in figures if isinstance(f.published, bool)]
    rows = len(values) + len(ranges)
    fig = Figure(figsize=(13, 2.8 + 0.42 * rows + 0.22 * len(flags)), layout="constrained")
    grid = fig.add_gridspec(
        3,
        1,
        height_ratios=[max(len(values), 1), max(len(ranges), 1) + 0.6, 0.35 * len(flags) + 0.6],
    )
    ok_color, miss_color = "#2ca02c", "#d62728"

    ax = fig.add_subplot(grid[0])
    ax.axvspan(0.85, 1.15, color=ok_color, alpha=0.12, label="±15%: reproduced")
    ax.axvline(1.0, color="black", linewidth=0.8)
    for y, f in enumerate(values):
        assert isinstance(f.published, int | float) and isinstance(f.predicted, int | float)
        ratio = f.predicted / f.published
        color = ok_color if f.ok else miss_color
        ax.plot(
            [ratio],
            [y],
            marker="o",
            markersize=8,
            color=color,
            markerfacecolor="white" if f.fitted else color,
        )
        unit = f" {f.unit}" if f.unit and f.unit != "x" else ("×" if f.unit == "x" else "")
        ax.text(
            1.3, y, f"{f.published:.3g}{unit} → {f.predicted:.3g}{unit}", va="center", fontsize=9
        )
    ax.set_yticks(range(len(values)), [_paper_label(f) for f in values], fontsize=9)
    ax.set_ylim(len(values) - 0.5, -0.5)
    ax.set_xlim(0.6, 1.75)
    ax.set_xlabel("predicted / published  (text: published → predicted)")
    ax.set_title("Value figures: predicted relative to published", loc="left")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(
        handles=[
            Patch(facecolor=ok_color, alpha=0.3, label="±15% band"),
            Line2D([], [], marker="o", linestyle="none", color=ok_color, label="reproduced"),
            Line2D([], [], marker="o", linestyle="none", color=miss_color, label="missed"),
            Line2D(
                [],
                [],
                marker="o",
                linestyle="none",
                color="grey",
                markerfacecolor="white",
                label="fitted (a consistency check)",
            ),
        ],
        loc="upper left",
        bbox_to_anchor=(1.0, 1.0),
        fontsize=9,
        frameon=False,
    )

    ax = fig.add_subplot(grid[1])
    for y, f in enumerate(ranges):
        assert isinstance(f.published, tuple) and isinstance(f.predicted, tuple)
        color = ok_color if f.ok else miss_color
        lo, hi = f.published
        ax.plot([lo, hi], [y - 0.12] * 2, color="#999999", linewidth=9, solid_capstyle="butt")
        plo, phi = f.predicted
        ax.plot(
            [plo, phi],
            [y + 0.14] * 2,
            color=color,
            linewidth=4,
            solid_capstyle="butt",
            marker="|",
            markersize=10,
        )
        ax.text(
            max(hi, phi) * 1.08,
            y,
            f"{lo:.3g}–{hi:.3g} → {plo:.3g}–{phi:.3g}{f.unit}",
            va="center",
            fontsize=9,
        )
    ax.set_yticks(range(len(ranges)), [_paper_label(f) for f in ranges], fontsize=9)
    ax.set_ylim(len(ranges) - 0.4, -0.6)
    ax.set_xscale("log")
    bounds = [
        (min(f.published[0], f.predicted[0]), max(f.published[1], f.predicted[1]))
        for f in ranges
        if isinstance(f.published, tuple) and isinstance(f.predicted, tuple)
    ] or [(1.0, 1.0)]
    lows, highs = [lo for lo, _ in bounds], [hi for _, hi in bounds]
    ax.set_xlim(min(lows) / 1.3, max(highs) * 2.5)  # room for the text beside the bars
    lo_x, hi_x = min(lows) / 1.3, max(highs) * 2.5
    # Plain numbers, not powers of ten: the ratios are read as "3x", not "10^0.5".
    ticks = [t for t in (0.5, 1, 2, 3, 5, 10, 20, 50, 100) if lo_x <= t <= hi_x]
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("value (log scale)")
    ax.set_title(
        "Range figures: published range (grey) and the predicted range (green inside, red not)",
        loc="left",
    )
    ax.grid(axis="x", which="both", alpha=0.3)

    ax = fig.add_subplot(grid[2])
    ax.axis("off")
    lines = [
        f"{'✓' if f.ok else '✗'}  {f.what}: published {'yes' if f.published else 'no'}, "
        f"predicted {'yes' if f.predicted else 'no'}"
        for f in flags
    ]
    ax.text(
        0,
        1,
        "Yes/no figures\n" + "\n".join(lines),
        va="top",
        ha="left",
        fontsize=9,
        transform=ax.transAxes,
    )
    ok = sum(f.ok for f in figures)
    fig.suptitle(
        f"rdu bench paper: {ok} of {len(figures)} published figures reproduced from one "
        "parameter set",
        x=0.01,
        ha="left",
        fontsize=13,
    )
    return _save(fig, path)
