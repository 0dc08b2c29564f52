"""What the timeline of a job shows: one row per socket, one bar per operation on the
emulated timeline, coloured by what the operation did.

The x axis is emulated time since the job's first operation (the emulated attributes
of the hardware spans, not their wall stamps). Spans inside another one's bar are not
bars of their own (a collective's transfers, a training segment's steps), but for a
step's gradient all-reduce, a band in the lower half of the row over the training bar
it overlaps. An operation too short to see as a bar is a tick.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from rdurack.telemetry import names
from rdurack.traces.plotdata.units import TimeUnit, duration_text
from rdurack.traces.spans import Span, TraceError, hardware_spans

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
EXTRA_COLORS = ("#bcbd22", "#e377c2", "#aec7e8", "#98df8a", "#c5b0d5", "#c49c94")
# Spans whose time another span's bar already shows: a collective's transfers, a
# segment's steps (and the stages that group them).
NOT_BARS = frozenset({names.SPAN_TRAIN_STAGE, names.SPAN_TRAIN_STEP, names.SPAN_TRANSFER})
# Spans drawn as a band in the lower half of their row, over the bar they overlap.
BANDS = frozenset({names.SPAN_TRAIN_ALLREDUCE})
# An operation narrower than the timeline's extent over this would be invisible as a
# bar: it is drawn as a tick.
THIN_PARTS = 1500
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


def socket_key(service: str) -> tuple[int, int, str]:
    """Sockets by node and index (rdu-n0-s2 before rdu-n0-s10), other services last."""
    m = _SOCKET.match(service)
    return (int(m.group(1)), int(m.group(2)), "") if m else (1 << 30, 0, service)


def kinds_in_order(found: Iterable[str]) -> list[str]:
    """The kinds present, known ones in legend order, then the others by name."""
    present = set(found)
    return [k for k in KIND_COLORS if k in present] + sorted(present - set(KIND_COLORS))


def kind_colors(kinds: Sequence[str]) -> dict[str, str]:
    """A colour per kind: a known kind's own, the others' from EXTRA_COLORS in turn."""
    extra = iter(EXTRA_COLORS * (1 + len(kinds) // len(EXTRA_COLORS)))
    return {k: KIND_COLORS.get(k) or next(extra) for k in kinds}


def legend_label(kind: str) -> str:
    """A kind's legend entry; a band says where it is drawn."""
    if kind == ALLREDUCE:
        return "gradient all-reduce, traced steps\n(lower half: it overlaps backward)"
    return kind


def describe(spans: Sequence[Span]) -> str:
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


@dataclass(frozen=True)
class Bar:
    """One operation on its socket's row, in the timeline's unit since its first op."""

    row: int  # the socket's row, 0 on top
    start: float
    width: float
    band: bool  # drawn in the lower half of the row (BANDS)
    tick: bool  # too thin to see as a bar: drawn as a tick


@dataclass(frozen=True)
class Timeline:
    """The timeline of a job's hardware spans, ready to draw."""

    job_id: str
    sockets: list[str]  # the rows, top down
    kinds: list[str]  # legend order
    colors: dict[str, str]  # per kind
    bars: dict[str, list[Bar]]  # per kind, in span order
    unit: TimeUnit
    extent_ns: int  # from the first operation's start to the last one's end, at least 1
    thin_ns: float  # operations shorter than this are ticks
    operations: int
    has_ticks: bool
    described: str  # 'model on platform', or ''

    def title(self) -> str:
        what = self.described
        return (
            f"Job {self.job_id}: what each socket did, on the emulated timeline\n"
            f"{what + ', ' if what else ''}{len(self.sockets)} sockets, {self.operations} "
            f"operations, {self.extent_ns / self.unit.ns:.4g} {self.unit.name} emulated"
        )

    def tick_label(self) -> str:
        return f"tick: shorter than {duration_text(self.thin_ns)}"


def timeline(spans: Sequence[Span], job_id: str) -> Timeline:
    """The timeline of the job's hardware spans; raises TraceError if it has none.
    Spans inside another's bar (NOT_BARS) are left out; BANDS are bands."""
    ops = [s for s in hardware_spans(spans) if s.name not in NOT_BARS]
    if not ops:
        raise TraceError(f"job {job_id} has no hardware spans (rdu.*) to draw a timeline of")
    t0 = min(s.emulated_start_ns for s in ops)
    extent = max(max(s.emulated_end_ns for s in ops) - t0, 1)
    unit = TimeUnit.for_extent(extent)
    sockets = sorted({s.service for s in ops}, key=socket_key)
    row = {sid: i for i, sid in enumerate(sockets)}
    kinds = kinds_in_order(op_kind(s) for s in ops)
    thin = extent / THIN_PARTS
    bars: dict[str, list[Bar]] = {k: [] for k in kinds}
    for s in ops:
        start = (s.emulated_start_ns - t0) / unit.ns
        width = (s.emulated_end_ns - s.emulated_start_ns) / unit.ns
        bar = Bar(row[s.service], start, width, s.name in BANDS, width * unit.ns < thin)
        bars[op_kind(s)].append(bar)
    return Timeline(
        job_id=job_id,
        sockets=sockets,
        kinds=kinds,
        colors=kind_colors(kinds),
        bars=bars,
        unit=unit,
        extent_ns=extent,
        thin_ns=thin,
        operations=len(ops),
        has_ticks=any((s.emulated_end_ns - s.emulated_start_ns) < thin for s in ops),
        described=describe(ops),
    )
