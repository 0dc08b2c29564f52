"""`make bench`: the runner's JSON contract and failure rule, without the slow benchmarks."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from rdurack.devtools import bench, bench_torch
from rdurack.devtools.bench import bench_paper_fidelity, run, table
from rdurack.devtools.bench_figure import BenchFigure
from rdurack.devtools.bench_predictor import bench_predictor_speed, bench_serving_engine, gauge
from rdurack.devtools.bench_serve import ANSWER_TARGET_MS, _medians_ms, bench_serve
from rdurack.devtools.bench_training import progressive_figures
from rdurack.errors import RdurackError
from rdurack.workloads.training.job import TrainingWorkload
from rdurack.workloads.training.profl import Comparison, Outcome, Shrunken

MET = BenchFigure("fake latency", 1.5, "ms", 2.0, "lower")
MISSED = BenchFigure("fake throughput", 10.0, "ops/s", 100.0, "higher")
UNTARGETED = BenchFigure("fake count", 3.0, "things", None, "higher")
UNTARGETED_FLOOR = BenchFigure("fake floored count", 3.0, "things", None, "higher", floor=2.0)
ABSOLUTE = BenchFigure("fake bound", 20.0, "ms", 25.0, "lower", floor=4.0, absolute=True)
KEYS = {"name", "value", "unit", "floor", "ratio", "target", "holds", "better"}


def _fake() -> list[BenchFigure]:
    return [MET, MISSED]


def _untargeted() -> list[BenchFigure]:
    return [UNTARGETED]


def _broken() -> list[BenchFigure]:
    raise RuntimeError("this benchmark cannot run")


def _read(path: Path) -> list[dict[str, Any]]:
    data = json.loads(path.read_text())
    assert isinstance(data, list)
    for item in data:
        assert isinstance(item, dict)
    return data


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check_schema(item: dict[str, Any]) -> None:
    assert set(item) == KEYS
    assert isinstance(item["name"], str)
    assert item["name"]
    assert _number(item["value"])
    assert isinstance(item["unit"], str)
    assert item["target"] is None or _number(item["target"])
    assert item["better"] in ("lower", "higher")
    # What a target holds: the ratio only where there is one; none without a target.
    assert item["holds"] in ((None,) if item["target"] is None else ("ratio", "value"))
    assert item["holds"] != "ratio" or item["ratio"] is not None
    # A floor is the same quantity measured bare in the same run; the ratio is value over
    # it, and there is a ratio exactly when there is a floor.
    assert item["floor"] is None or (_number(item["floor"]) and item["floor"] > 0)
    if item["floor"] is None:
        assert item["ratio"] is None
    else:
        assert item["ratio"] == pytest.approx(item["value"] / item["floor"])


def test_run_writes_every_figure_and_succeeds_when_a_target_is_missed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bench, "BENCHMARKS", [("fake", _fake), ("untargeted", _untargeted)])
    out = tmp_path / "b.json"

    assert run(out) == 0

    data = _read(out)
    for item in data:
        _check_schema(item)
    none = {"floor": None, "ratio": None}
    assert data == [
        {"name": "fake latency", "value": 1.5, "unit": "ms", **none, "target": 2.0,
         "holds": "value", "better": "lower"},
        {"name": "fake throughput", "value": 10.0, "unit": "ops/s", **none, "target": 100.0,
         "holds": "value", "better": "higher"},
        {"name": "fake count", "value": 3.0, "unit": "things", **none, "target": None,
         "holds": None, "better": "higher"},
    ]  # fmt: skip


def test_only_runs_the_benchmarks_named_and_refuses_a_name_that_matches_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bench, "BENCHMARKS", [("fake", _fake), ("untargeted", _untargeted)])
    out = tmp_path / "b.json"
    assert run(out, ["UNTARG"]) == 0
    assert [item["name"] for item in _read(out)] == ["fake count"]
    with pytest.raises(
        RdurackError, match="no benchmark's name contains 'nothing'; they are: fake; untargeted"
    ):
        run(out, ["nothing"])


def test_run_creates_the_output_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench, "BENCHMARKS", [("fake", _fake)])
    out = tmp_path / "build" / "deeper" / "b.json"
    assert run(out) == 0
    assert [item["name"] for item in _read(out)] == ["fake latency", "fake throughput"]


@pytest.mark.parametrize("broken_first", [True, False], ids=["broken-first", "broken-last"])
def test_a_benchmark_that_raises_fails_the_run_after_the_others_are_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, broken_first: bool
) -> None:
    benchmarks = [("broken", _broken), ("fake", _fake)]
    if not broken_first:
        benchmarks.reverse()
    monkeypatch.setattr(bench, "BENCHMARKS", benchmarks)
    out = tmp_path / "b.json"

    assert run(out) == 1

    data = _read(out)
    for item in data:
        _check_schema(item)
    assert [item["name"] for item in data] == ["fake latency", "fake throughput"]


def test_run_with_only_a_broken_benchmark_writes_an_empty_list(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bench, "BENCHMARKS", [("broken", _broken)])
    out = tmp_path / "b.json"
    assert run(out) == 1
    assert _read(out) == []


@pytest.mark.parametrize(
    ("value", "target", "better", "met"),
    [
        (1.0, 2.0, "lower", True),
        (2.0, 2.0, "lower", True),
        (3.0, 2.0, "lower", False),
        (3.0, 2.0, "higher", True),
        (2.0, 2.0, "higher", True),
        (1.0, 2.0, "higher", False),
        (1.0, None, "lower", None),
        (1.0, None, "higher", None),
    ],
)
def test_met(value: float, target: float | None, better: str, met: bool | None) -> None:
    assert better in ("lower", "higher")
    figure = BenchFigure("f", value, "u", target, "lower" if better == "lower" else "higher")
    assert figure.met is met


@pytest.mark.parametrize(
    ("value", "floor", "target", "better", "ratio", "met"),
    [
        (30.0, 12.0, 3.0, "lower", 2.5, True),  # p99 2.5x its floor's: within 3x
        (40.0, 12.0, 3.0, "lower", 40 / 12, False),
        (2.0, 0.5, 3.0, "lower", 4.0, False),  # 2.0 <= 3, but 4x its floor: missed
        (0.9, 1.0, 0.8, "higher", 0.9, True),  # link at 0.9x its floor: at least 0.8x
        (0.7, 1.0, 0.8, "higher", 0.7, False),
        (5.0, 2.0, None, "higher", 2.5, None),  # a floor shown, no target on it
    ],
)
def test_a_figure_with_a_floor_holds_its_target_on_the_ratio(
    value: float, floor: float, target: float | None, better: str, ratio: float, met: bool | None
) -> None:
    figure = BenchFigure("f", value, "u", target, "lower" if better == "lower" else "higher", floor)
    assert figure.ratio == pytest.approx(ratio)
    assert figure.held == figure.ratio
    assert figure.met is met
    _check_schema(figure.to_json())


def test_an_absolute_figure_carries_its_floor_and_ratio_and_holds_its_value() -> None:
    # 5x its floor, which a ratio target of 3 would miss; its bound is 25 ms: met.
    assert (ABSOLUTE.ratio, ABSOLUTE.holds, ABSOLUTE.held, ABSOLUTE.met) == (
        5.0,
        "value",
        20.0,
        True,
    )
    item = ABSOLUTE.to_json()
    _check_schema(item)
    assert (item["floor"], item["ratio"], item["holds"]) == (4.0, 5.0, "value")
    assert BenchFigure("f", 30.0, "ms", 25.0, "lower", floor=4.0, absolute=True).met is False


def test_a_figure_without_a_floor_holds_its_target_on_the_value() -> None:
    assert MET.floor is None and MET.ratio is None and MET.held == MET.value == 1.5
    assert BenchFigure("f", 0.0, "u", 1.0, "lower", floor=0.0).ratio is None  # no ratio to 0


def test_run_writes_each_floor_and_ratio(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    floored = BenchFigure("fake p99", 9.0, "ms", 3.0, "lower", floor=4.0)
    monkeypatch.setattr(bench, "BENCHMARKS", [("floored", lambda: [floored, UNTARGETED_FLOOR])])
    out = tmp_path / "b.json"
    assert run(out) == 0
    data = _read(out)
    for item in data:
        _check_schema(item)
    assert data[0] == {"name": "fake p99", "value": 9.0, "unit": "ms", "floor": 4.0, "ratio": 2.25,
                       "target": 3.0, "holds": "ratio", "better": "lower"}  # fmt: skip
    assert (data[1]["floor"], data[1]["ratio"], data[1]["target"]) == (2.0, 1.5, None)


def test_the_table_prints_each_floor_its_ratio_and_what_the_target_holds() -> None:
    floored = BenchFigure("fake p99", 9.0, "ms", 3.0, "lower", floor=4.0)
    console = Console(width=200, record=True, color_system=None)
    console.print(table([floored, MET, MISSED, UNTARGETED_FLOOR, ABSOLUTE]))
    rows = {line.split("│")[1].strip(): line for line in console.export_text().splitlines()
            if line.startswith("│")}  # fmt: skip
    cells = {name: [c.strip() for c in line.split("│")[2:-1]] for name, line in rows.items()}
    assert cells["fake p99"] == ["9", "ms", "4", "2.25", "ratio ≤ 3", "met"]
    assert cells["fake latency"] == ["1.5", "ms", "—", "", "≤ 2 ms", "met"]
    assert cells["fake throughput"] == ["10", "ops/s", "—", "", "≥ 100 ops/s", "missed"]
    assert cells["fake floored count"] == ["3", "things", "2", "1.50", "—", ""]
    assert cells["fake bound"] == ["20", "ms", "4", "5.00", "≤ 25 ms", "met"]


def test_the_fakes_meet_and_miss_their_targets() -> None:
    assert MET.met is True
    assert MISSED.met is False
    assert UNTARGETED.met is None


def test_paper_fidelity_figures() -> None:
    figures = bench_paper_fidelity()
    assert [f.name for f in figures] == [
        "paper figures reproduced",
        "paper value figures, largest |error|",
    ]
    reproduced, largest_error = figures
    assert reproduced.unit == "figures"
    assert reproduced.better == "higher"
    assert reproduced.target is not None
    assert reproduced.target >= 1
    assert reproduced.target == int(reproduced.target)
    assert 0 <= reproduced.value <= reproduced.target
    assert largest_error.unit == "%"
    assert largest_error.better == "lower"
    assert largest_error.target == 15.0
    assert largest_error.value >= 0
    for f in figures:
        _check_schema(json.loads(json.dumps(f.to_json())))


def test_predictor_speed_is_a_positive_rate() -> None:
    (figure,) = bench_predictor_speed(seconds=0.2)
    assert figure.unit == "requests/s"
    assert figure.better == "higher"
    assert figure.value > 0
    assert figure.target is not None
    assert figure.target > 0
    # Beside the interpreter's gauge, measured in the same slices; the target on the value.
    assert figure.floor is not None and figure.floor > 0 and figure.holds == "value"
    _check_schema(json.loads(json.dumps(figure.to_json())))


def test_the_gauge_counts_whole_batches_of_units_in_the_time_it_took() -> None:
    units, took = gauge(0.05)
    assert units > 0 and units % 1000 == 0 and took >= 0.05


def test_serving_engine_speed_is_a_positive_rate() -> None:
    (figure,) = bench_serving_engine(requests=200)
    assert figure.unit == "requests/s" and figure.better == "higher" and figure.value > 0
    _check_schema(json.loads(json.dumps(figure.to_json())))


def test_serve_figures_are_each_answer_beside_its_floors() -> None:
    figures = bench_serve(repeats=1, process_repeats=1)
    for f in figures:
        _check_schema(json.loads(json.dumps(f.to_json())))
        assert f.unit == "ms" and f.better == "lower" and f.value > 0
    answers = [f for f in figures if f.name.startswith("rdu predict serve answer")]
    floors = [f for f in figures if f.name.startswith("floor: ")]
    process = [f for f in figures if f.name.startswith("rdu predict serve --json")]
    assert len(answers) == 2 and len(process) == 1 and len(floors) == 3
    assert {f.target for f in answers} == {ANSWER_TARGET_MS} == {50.0}
    assert all(f.target is None for f in floors + process)
    # Each answer carries the in-process floor and holds the 50 ms on its value.
    assert all(f.floor == floors[0].value and f.holds == "value" for f in answers)
    assert "in process" in floors[0].name and "import rdurack" in floors[-1].name


def test_a_figure_and_its_floors_are_timed_in_turns() -> None:
    order: list[str] = []

    def call(name: str) -> Callable[[], object]:
        return lambda: order.append(name)

    medians = _medians_ms({n: call(n) for n in "abc"}, repeats=3)
    # One of each, then again: a slow moment of the machine falls on all of them alike.
    assert order == list("abcabcabc")
    assert set(medians) == set("abc") and all(ms >= 0 for ms in medians.values())


def test_progressive_figures_are_the_mean_and_the_worst_seed_against_each_target() -> None:
    def comparison(full: float, grown: float, shrunk: float, hbm: int) -> Comparison:
        small = TrainingWorkload(blocks=4, hidden=44)

        def outcome(accuracy: float, peak: int) -> Outcome:
            return Outcome(small, accuracy, peak, 0, 1)

        return Comparison(
            outcome(full, 1000),
            outcome(grown, hbm),
            outcome(shrunk, 900),
            Shrunken(small, 1, 900, "width"),
        )

    # Seed A: progressive 1 point below full, 0.5 above the shrunken model, HBM 50% less;
    # seed B: 2.5 below full, 1 below the shrunken model, HBM 45% less.
    figures = progressive_figures(
        [comparison(0.97, 0.96, 0.955, 500), comparison(0.98, 0.955, 0.965, 550)]
    )
    got = {f.name: (round(f.value, 6), f.met) for f in figures}
    hbm = "progressive vs full training: peak HBM per socket, less by"
    gap = "progressive vs full training: test accuracy below by"
    over = "progressive vs the largest shrunken model under the cap (4 x 44): accuracy above by"
    assert got == {
        f"{hbm} (mean of 2 seeds)": (47.5, True),
        f"{hbm} (worst of 2 seeds)": (45.0, True),
        f"{gap} (mean of 2 seeds)": (1.75, True),
        f"{gap} (worst of 2 seeds)": (2.5, False),
        f"{over} (mean of 2 seeds)": (-0.25, False),
        f"{over} (worst of 2 seeds)": (-1.0, False),
    }


def test_the_torch_bench_reads_rank_0s_figures_or_says_what_the_script_printed() -> None:
    from rdurack.devtools.bench_torch import _figures

    out = 'starting\n{"step_s": 0.5, "all_reduce_s": 0.2, "bytes": 8}\nbye\n'
    assert _figures(out) == {"step_s": 0.5, "all_reduce_s": 0.2, "bytes": 8}
    with pytest.raises(RuntimeError, match="printed no figures:\nTraceback"):
        _figures("Traceback (most recent call last): ...")


def test_the_torch_figures_are_the_medians_of_runs_in_turns_with_gloo(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rdurack.devtools import bench_torch

    calls: list[str] = []
    gloo = iter([0.10, 0.30, 0.20])  # step seconds, run by run
    rack = iter([1.5, 0.5, 0.9])

    def on(name: str, steps: Any) -> Callable[[], dict[str, float]]:
        def run() -> dict[str, float]:
            calls.append(name)
            step = next(steps)
            return {"step_s": step, "all_reduce_s": step / 2, "bytes": 2_100_000}

        return run

    monkeypatch.setattr(bench_torch, "RUNS", 3)
    monkeypatch.setattr(bench_torch, "on_gloo", on("gloo", gloo))
    monkeypatch.setattr(bench_torch, "on_rack", on("rack", rack))
    step, all_reduce = bench_torch.bench_torch()
    assert calls == ["gloo", "rack"] * 3
    assert (step.value, step.floor) == pytest.approx((900.0, 200.0))
    assert (all_reduce.value, all_reduce.floor) == pytest.approx((450.0, 100.0))
    assert "2.1 MB" in all_reduce.name


def test_torch_figures_are_rank_0s_line_and_a_failure_shows_where_it_began() -> None:
    assert bench_torch._figures('warning\n{"step_s": 0.5}\ntorchrun: done\n') == {"step_s": 0.5}
    out = "rank 7: gloo failed here\n" + "x" * 10_000 + "\nrank 0 ended by SIGTERM"
    with pytest.raises(RuntimeError, match="no figures") as info:
        bench_torch._figures(out)
    message = str(info.value)
    assert "rank 7: gloo failed here" in message and "rank 0 ended by SIGTERM" in message
    assert len(message) < 4200  # the middle left out
