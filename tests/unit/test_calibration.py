"""The joint calibration: the assumption registry, the presets built from it, the
objective, and the record `rdu calibrate --write` keeps (it must match the code)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from rdurack.errors import InvalidRequest, UnknownName
from rdurack.rack.calibration import ASSUMPTIONS, assumption, checked, fitted_values
from rdurack.rack.kernels import FusionPlan
from rdurack.rack.presets import builtin_platforms
from rdurack.workloads.calibration import record
from rdurack.workloads.calibration.fit import (
    Objective,
    cost,
    descend,
    fitted_figures,
    from_unit,
    residual,
    sensitivity,
    to_unit,
)
from rdurack.workloads.paper.figure import Figure
from rdurack.workloads.paper.study import PaperStudy
from tests.support.cli import rdu


def _at(spec: Any, path: str) -> tuple[Any, str]:
    """A preset's value at a dotted path, and the source its model gives it."""
    *parents, name = path.split(".")
    for part in parents:
        spec = getattr(spec, part)
    return getattr(spec, name), spec.sources[name]


def test_every_platform_assumption_sets_its_field_with_a_fitted_source() -> None:
    values = fitted_values()
    platforms = builtin_platforms()
    set_by_assumptions = 0
    for a in ASSUMPTIONS:
        for name in a.platforms:
            value, source = _at(platforms[name], a.field)
            assert value == values[a.name], (a.name, name)
            assert source == a.source and source.startswith("fitted: "), (a.name, name)
            set_by_assumptions += 1
    assert set_by_assumptions >= 20


def test_presets_follow_the_values_they_are_given() -> None:
    values = {**fitted_values(), "sn40l.compute_efficiency": 0.2, "gpu.nvlink_latency_ns": 700}
    platforms = builtin_platforms(values)
    assert platforms["sn40l-rack16"].socket.kernels.compute_efficiency == 0.2
    assert platforms["dgx-h100"].node.intra_node_link.latency_ns == 700


def test_values_outside_their_range_or_unknown_are_refused() -> None:
    values = fitted_values()
    with pytest.raises(InvalidRequest, match=r"sn40l.compute_efficiency = 0.9 is outside"):
        checked({**values, "sn40l.compute_efficiency": 0.9})
    with pytest.raises(InvalidRequest, match="unknown \\['nope'\\]"):
        checked({**values, "nope": 1.0})
    with pytest.raises(UnknownName):
        assumption("nope")
    prompt = checked({**values, "table_v.prompt_tokens": 700.4})["table_v.prompt_tokens"]
    assert prompt == 700  # an integer assumption


def test_unit_coordinates_span_each_range() -> None:
    for a in ASSUMPTIONS:
        assert from_unit(a, 0.0) == pytest.approx(a.low)
        assert from_unit(a, 1.0) == pytest.approx(a.high)
        middle = from_unit(a, 0.5)
        assert to_unit(a, middle) == pytest.approx(0.5)
        if a.scale == "log":  # the geometric middle
            assert middle == pytest.approx(math.sqrt(a.low * a.high))


def test_residuals_are_log_ratios_and_distances_outside_a_range() -> None:
    assert residual(Figure("v", "", "", "x", 2.0, 2.2)) == pytest.approx(math.log(1.1))
    assert residual(Figure("r", "", "", "x", (1.0, 3.0), (1.5, 2.5))) == 0.0
    low = Figure("r", "", "", "x", (1.5, 3.0), (1.2, 2.5))
    assert residual(low) == pytest.approx(math.log(1.5 / 1.2))
    both = Figure("r", "", "", "x", (1.5, 3.0), (1.2, 3.3))
    assert residual(both) == pytest.approx(math.log(1.5 / 1.2) + math.log(3.3 / 3.0))


def test_the_fit_set_is_values_and_ranges_only() -> None:
    figures = fitted_figures(fitted_values())
    assert len(figures) >= 15
    assert not any(isinstance(f.published, bool) for f in figures)


def test_the_record_matches_what_the_code_predicts_now() -> None:
    """A model change without `rdu calibrate --write` fails here, naming the figures."""
    kept = record.read()
    assert kept.values == fitted_values()
    assert record.stale(kept, PaperStudy().figures()) == []
    assert kept.cost == pytest.approx(cost(kept.values), rel=1e-9)
    assert set(kept.leave_one_out) == set(kept.in_sample)


def test_the_recorded_values_are_a_minimum() -> None:
    """Searched again from the recorded values, least squares finds nothing meaningfully
    better (2% of the cost: the search stops at a tolerance, and may stop elsewhere)."""
    kept = record.read()
    again = descend(Objective(), kept.values)
    assert again.cost >= kept.cost * 0.98


def test_a_record_is_written_whole_and_read_back(tmp_path: Path) -> None:
    kept = record.read()
    path = record.write(kept, tmp_path / "calibration.json")
    assert record.read(path) == kept
    assert not (tmp_path / "calibration.json.tmp").exists()
    (tmp_path / "bad.json").write_text('{"values": {}}')
    with pytest.raises(InvalidRequest, match="rdu calibrate --write"):
        record.read(tmp_path / "bad.json")


def test_stale_names_the_figures_whose_prediction_moved() -> None:
    kept = record.read()
    figures = PaperStudy().figures()
    key = next(f.key for f in figures if f.fitted and isinstance(f.predicted, float))
    moved = [
        f if f.key != key else Figure(f.key, f.what, f.source, f.unit, f.published, 1e9, True)
        for f in figures
    ]
    assert record.stale(kept, moved) == [key]


def test_sensitivity_moves_the_figures_an_assumption_drives() -> None:
    moves = sensitivity(fitted_values())
    assert set(moves) == {a.name for a in ASSUMPTIONS}
    # The DGX's switch-free expert time scales with the GPUs' prefill efficiency.
    low, high = moves["gpu.compute_efficiency"]["coe_expert_b1_t20_dgx-a100"]
    assert isinstance(low, float) and isinstance(high, float) and low > high


def test_table_vs_decode_plan_is_a_what_if_of_the_objective() -> None:
    values = fitted_values()
    looped = {f.key: f.predicted for f in Objective().figures(values)}
    fused = {f.key: f.predicted for f in Objective(FusionPlan.FUSED_HO).figures(values)}
    # Per-layer fused decode is slower on the SN40L: its speedups over the DGX fall.
    slower, faster = fused["coe_expert_b1_t200_dgx-a100"], looped["coe_expert_b1_t200_dgx-a100"]
    assert isinstance(slower, float) and isinstance(faster, float) and slower < faster
    # The figures without Table V do not move.
    assert fused["kl_speedup_max"] == looped["kl_speedup_max"]


def test_rdu_calibrate_refuses_to_write_a_what_if() -> None:
    done = rdu("calibrate", "--write", "--table-v-decode-plan", "fused-ho")
    assert done.returncode == 2
    assert "--write records the calibration the presets use" in done.stderr
    assert "Traceback" not in done.stderr
