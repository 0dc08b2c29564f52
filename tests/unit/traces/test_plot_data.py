"""What the plots show, derived without drawing (traces/plotdata/): the timeline's rows
and bars, memory per tier from spans, loss and stage points from spans and from
results, the paper figure's rows, the axis units. None of it needs matplotlib, and
importing it does not load matplotlib."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rdurack.rack.presets import builtin_platforms
from rdurack.telemetry import names
from rdurack.traces.plotdata.memory import memory_plot, memory_series
from rdurack.traces.plotdata.paper import paper_plot
from rdurack.traces.plotdata.timeline import (
    ALLREDUCE,
    EXTRA_COLORS,
    KIND_COLORS,
    TRAINING,
    Bar,
    timeline,
)
from rdurack.traces.plotdata.training import (
    StagePoint,
    loss_log_scale,
    loss_points,
    loss_title,
    result_stage_points,
    span_loss_points,
    stage_points,
)
from rdurack.traces.plotdata.units import TimeUnit, bytes_unit, duration_text
from rdurack.traces.spans import TraceError, read_trace_dir, select_job
from rdurack.workloads.paper.figure import Figure
from tests.support.traces import (
    OPS,
    PAPER_FIGURES,
    SHARE,
    SOCKETS,
    hardware_span,
    progressive_stages,
    reported_use,
    step_span,
)

TRACES = Path(__file__).parents[3] / "rdurack" / "traces"


def _not_drawing() -> list[str]:
    """Every module of rdurack/traces/ but the drawing (traces/plots/)."""
    modules = []
    for path in sorted(TRACES.rglob("*.py")):
        parts = path.relative_to(TRACES).with_suffix("").parts
        if parts[0] != "plots":
            modules.append(".".join(["rdurack", "traces", *parts]).removesuffix(".__init__"))
    return modules


def test_importing_the_plot_data_loads_no_matplotlib() -> None:
    modules = _not_drawing()
    assert "rdurack.traces.plotdata.memory" in modules and "rdurack.traces.spans" in modules
    code = (
        f"import importlib, sys; [importlib.import_module(m) for m in {modules!r}];"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] == 'matplotlib');"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


# ------------------------------------------------------------------ the timeline


def test_the_timeline_has_a_row_per_socket_and_a_bar_per_operation(job_dir: Path) -> None:
    t = timeline(select_job(read_trace_dir(job_dir), "job-a"), "job-a")
    assert t.sockets == SOCKETS
    # Legend order, whatever order the spans come in.
    assert t.kinds == ["bundle deploy", "router", "expert switch DDR→HBM",
                       "expert switch: HBM hit", "prefill", "decode"]  # fmt: skip
    assert t.colors == {k: KIND_COLORS[k] for k in t.kinds}
    assert (t.unit.name, t.extent_ns, t.operations) == ("ms", 93_000_000, len(SOCKETS) * len(OPS))
    # In ms since the first operation, one bar on each socket's row.
    router = sorted(t.bars["router"], key=lambda b: b.row)
    assert router == [Bar(0, 0.0, 40.0, False, False), Bar(1, 0.0, 40.0, False, False)]
    assert sorted((b.row, b.start) for b in t.bars["decode"]) == [(0, 73.0), (1, 73.0)]
    switches = sorted((b.start, b.width) for b in t.bars["expert switch DDR→HBM"])
    assert switches == [(40.0, 13.0), (40.0, 13.0), (60.0, 13.0), (60.0, 13.0)]
    # A deploy and a hit take no time: ticks, and the legend says what a tick is.
    assert all(b.tick for b in t.bars["bundle deploy"] + t.bars["expert switch: HBM hit"])
    assert not any(b.tick for b in t.bars["prefill"])
    assert t.has_ticks and t.thin_ns == 93_000_000 / 1500
    assert t.tick_label() == "tick: shorter than 62 µs"
    assert t.described == "llama2-7b on sn40l-rack16"
    assert t.title().endswith("llama2-7b on sn40l-rack16, 2 sockets, 14 operations, 93 ms emulated")


def test_a_training_timeline_draws_segments_and_all_reduce_bands_not_steps() -> None:
    spans = [
        hardware_span(names.SPAN_TRAIN, "rdu-n0-s10", "a" * 16, 0, 1_000_000),
        hardware_span(names.SPAN_TRAIN, "rdu-n0-s2", "b" * 16, 0, 1_000_000),
        hardware_span(names.SPAN_TRAIN_ALLREDUCE, "rdu-n0-s2", "c" * 16, 500_000, 100_000),
        step_span("rdu-n0-s2", 1),  # inside the segment's bar: not a bar
        hardware_span(
            names.SPAN_KERNEL, "rdu-n0-s2", "d" * 16, 0, 10, {names.ATTR_KERNEL_ROLE: "train"}
        ),
        hardware_span("rdu.some_thing", "rdu-n1-s0", "e" * 16, 0, 2),
    ]
    t = timeline(spans, "j")
    assert t.sockets == ["rdu-n0-s2", "rdu-n0-s10", "rdu-n1-s0"]  # by node, then index
    assert t.kinds == [TRAINING, ALLREDUCE, "some thing"]  # known, then others by name
    assert t.colors["some thing"] == EXTRA_COLORS[0]
    assert [(b.row, b.band) for b in t.bars[ALLREDUCE]] == [(0, True)]
    assert [b.row for b in t.bars[TRAINING]] == [1, 0, 0]  # a "train" kernel is training
    assert (t.unit.name, t.operations) == ("µs", 5)
    assert [b.tick for b in t.bars[TRAINING]] == [False, False, True]


def test_a_timeline_needs_hardware_spans(job_dir: Path) -> None:
    spans = [s for s in select_job(read_trace_dir(job_dir), "job-a") if not s.hardware]
    with pytest.raises(TraceError, match="no hardware spans"):
        timeline(spans, "job-a")
    assert memory_series(spans) is None and memory_plot(spans, "job-a") is None


# ------------------------------------------------------------------ memory


def test_memory_follows_deploys_switches_and_evictions(job_dir: Path) -> None:
    spans = select_job(read_trace_dir(job_dir), "job-a")
    series = memory_series(spans)
    assert series is not None and series.sockets == 2
    n = len(SOCKETS)
    hbm = dict(series.tiers["hbm"])  # emulated ns since the job's start -> bytes
    # a is loaded by 53 ms; b's switch evicts a at 60 ms and has loaded b by 73 ms.
    assert hbm[53_000_000] == n * SHARE
    assert hbm[60_000_000] == 0
    assert hbm[73_000_000] == n * SHARE
    assert series.tiers["hbm"][-1][1] == n * SHARE  # the hit at 93 ms loads nothing
    assert series.tiers["ddr"][-1] == (0, n * 3 * SHARE)  # the catalog, from the deploy
    assert series.end_ns == 93_000_000


def test_tier_use_reported_by_the_sockets_wins_over_the_derivation() -> None:
    spans = [
        reported_use("rdu-n0-s0", 0, 10, hbm=5),
        reported_use("rdu-n0-s1", 0, 10, hbm=7),
        reported_use("rdu-n0-s0", 20, 10, hbm=1),
    ]
    series = memory_series(spans)
    assert series is not None and list(series.tiers) == ["hbm"]
    assert series.tiers["hbm"] == [(0, 0), (10, 5), (10, 12), (30, 8)]


def test_a_training_jobs_memory_is_its_traced_steps_peaks_summed_over_its_sockets() -> None:
    spans = [
        step_span("rdu-n0-s0", 1, hbm=50, ddr=0, sram=0),
        step_span("rdu-n0-s1", 1, hbm=50, ddr=0, sram=0),
        step_span("rdu-n0-s0", 5, hbm=80, ddr=20, sram=0),  # steps 2-4 untraced
        step_span("rdu-n0-s1", 5, hbm=70, ddr=20, sram=0),
    ]
    series = memory_series(spans)
    assert series is not None and series.sockets == 2
    assert list(series.tiers) == ["hbm", "ddr"]  # no SRAM held: no SRAM panel
    # From each traced step's start (emulated ns since the first), held until the next.
    assert series.tiers["hbm"] == [(0, 0), (0, 50), (0, 100), (400, 130), (400, 150)]
    assert series.tiers["ddr"][-1] == (400, 40)
    assert series.end_ns == 500
    assert "2 traced steps per rank" in series.source


def test_a_memory_panel_per_tier_in_its_own_units_with_the_platforms_capacity() -> None:
    gb, mb = 10**9, 10**6
    spans = [
        reported_use("rdu-n0-s0", 0, 1_000_000, hbm=40 * gb, sram=40 * mb),
        reported_use("rdu-n0-s1", 2_000_000, 1_000_000, hbm=50 * gb, sram=50 * mb),
    ]
    plot = memory_plot(spans, "j")
    assert plot is not None and plot.unit == TimeUnit("ms", 1e6)
    sram, hbm = plot.panels  # the tiers' order, SRAM first
    socket = builtin_platforms()["sn40l-rack16"].socket
    assert (hbm.tier, hbm.unit, hbm.label) == ("hbm", "GB", "HBM used")
    # Steps in ms to the job's end (3 ms), held from each op's end.
    assert hbm.times == [0.0, 1.0, 3.0, 3.0] and hbm.values == [0.0, 40.0, 90.0, 90.0]
    assert hbm.capacity_bytes == 2 * socket.hbm.capacity_bytes
    assert not hbm.capacity_off_scale and hbm.y_top == hbm.capacity_bytes / 1e9 * 1.05
    assert hbm.capacity_label == "HBM capacity (128 GB)"
    # 90 MB of SRAM beside 1 GB of capacity: named, not drawn; head room for the legend.
    assert (sram.unit, sram.top, sram.capacity_bytes) == (
        "MB",
        90.0,
        2 * socket.sram.capacity_bytes,
    )
    assert sram.capacity_off_scale and sram.y_top == pytest.approx(90 * 1.4)
    assert plot.title() == (
        "Job j: memory per tier, summed over its 2 sockets\nthe sockets' reported tier use"
    )


# ------------------------------------------------------------------ training


def test_loss_points_from_a_result_or_from_spans() -> None:
    assert loss_points(None) == [] and loss_points({"emulated_s": 1.0}) == []
    assert loss_points({"losses": [2.0, 1.0]}) == [(1, 2.0), (2, 1.0)]
    assert loss_points({"losses": [{"step": 10, "loss": 0.5}]}) == [(10, 0.5)]
    assert loss_points({"loss_curve": [[3, 0.25], [4, float("nan")]]}) == [(3, 0.25)]

    spans = [
        step_span("rdu-n0-s0", 1, loss=2.0),
        step_span("rdu-n0-s1", 1, loss=1.0),
        step_span("rdu-n0-s0", 2, loss=0.5),
        step_span("rdu-n0-s1", 2),  # timing mode: no loss
    ]
    assert span_loss_points(spans) == [(1, 1.5), (2, 0.5)]  # the mean over the ranks


def test_the_loss_curves_title_and_scale() -> None:
    every = [(1, 2.0), (2, 1.5), (3, 1.25)]
    assert loss_title(every, "j") == "Job j: training loss, 3 steps, 2 → 1.25"
    strided = [(10, 3.0), (20, 0.02)]
    assert loss_title(strided, "j") == "Job j: training loss, 2 traced steps, one in 10, 3 → 0.02"
    assert not loss_log_scale(every) and loss_log_scale(strided)  # falls by decades
    assert not loss_log_scale([(1, 3.0), (2, 0.0)])  # a zero loss: no log scale


def test_stage_points_from_stage_spans_or_from_a_result() -> None:
    points = stage_points(progressive_stages())
    # Training order; the largest peak over the ranks; rank 0's accuracy.
    assert points == [
        StagePoint("shrink block 0", 600, 500, 0.9, 25, False),
        StagePoint("grow block 0", 400, 700, 0.95, 25, True),
    ]
    assert [p.label for p in points] == ["shrink 0\n25 steps", "grow 0\n25 steps ✓"]
    result = {"stages": [{"name": "full", "peak_hbm_bytes": "228600", "steps": 630,
                          "test_accuracy": 0.97}]}  # fmt: skip
    assert result_stage_points(result) == [StagePoint("full", 228600, 0, 0.97, 630, False)]
    assert result_stage_points(None) == []


# ------------------------------------------------------------------ the paper, units


def test_the_paper_figures_rows_labels_and_texts() -> None:
    plot = paper_plot(PAPER_FIGURES)
    [v, m] = plot.values
    assert (v.label, v.ratio, v.ok, v.fitted, v.text) == (
        "a value [PAPER Sec. IV]",
        1.05,
        True,
        False,
        "10× → 10.5×",
    )
    assert (m.ratio, m.ok, m.fitted, m.text) == (2.0, False, True, "10 GB → 20 GB")
    [r] = plot.ranges
    assert (r.label, r.ok, r.text) == ("a range [KL Table 1]", True, "1–3 → 1.5–2x")
    assert r.text_x == pytest.approx(3.24)
    assert plot.flags == ["✗  a yes/no: published yes, predicted no"]
    assert plot.range_limits == pytest.approx((1 / 1.3, 7.5))
    assert plot.range_ticks == [1, 2, 3, 5]
    assert plot.title() == (
        "rdu bench paper: 2 of 4 published figures reproduced from one parameter set"
    )
    long = Figure("l", "word " * 20, "PAPER Sec. IV (table)", "", 1.0, 1.0)
    assert all(len(line) <= 56 for line in paper_plot([long]).values[0].label.splitlines())


def test_axis_units() -> None:
    assert TimeUnit.for_extent(1.9e6) == TimeUnit("µs", 1e3)
    assert TimeUnit.for_extent(2e6) == TimeUnit("ms", 1e6)
    assert TimeUnit.for_extent(2e9) == TimeUnit("s", 1e9)
    assert duration_text(1.5e6) == "1.5 ms" and duration_text(62_000) == "62 µs"
    assert [bytes_unit(n) for n in (999, 1e3, 2.5e6, 1e9)] == [
        ("B", 1.0), ("kB", 1e3), ("MB", 1e6), ("GB", 1e9)
    ]  # fmt: skip
