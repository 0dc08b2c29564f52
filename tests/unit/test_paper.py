"""`rdu bench paper`: which published figures the one parameter set reproduces."""

from __future__ import annotations

import pytest

from rdurack.workloads.calibration import record
from rdurack.workloads.paper.figure import Figure
from rdurack.workloads.paper.study import PaperStudy

# Known misses, each explained with numbers in docs/figures.md ("Misses"): one launch cost
# per SO call cannot give the paper's 1.4-8x HO-over-SO decode gain without breaking the
# fusion figures; fitting it as close as it goes leaves the prefill fusion range's low
# end (Bloom-176B at 8K) and the prefill HO-over-SO cap just outside; KL Table 1's FLOPs
# count more than two per weight.
KNOWN_MISSES = {
    "ho_over_so_decode",
    "ho_over_so_prefill_train",
    "fusion_prefill",
    "kl_gflops_per_token",
}


def test_every_figure_but_the_documented_misses_is_reproduced() -> None:
    figures = record.with_left_out(PaperStudy().figures(), record.read())
    missed = {f.key for f in figures if not f.ok}
    assert missed == KNOWN_MISSES
    # Left out of the fit, the fitted figures the fit meets stay within 20%, but Table
    # IV's 8B row: the only plain figure on two nodes, so the only one that pins the
    # inter-node latency (docs/figures.md, "Misses").
    left_out_missed = {f.key for f in figures if f.left_out_ok is False}
    assert left_out_missed == KNOWN_MISSES - {"kl_gflops_per_token"} | {"table_iv_llama3_1_8b"}


def test_figure_keys_are_unique_and_sourced() -> None:
    figures = PaperStudy().figures()
    assert len({f.key for f in figures}) == len(figures)
    assert all(f.source for f in figures)


def test_figure_verdicts() -> None:
    assert Figure("a", "", "", "x", 10.0, 10.9).ok
    assert not Figure("a", "", "", "x", 10.0, 11.1).ok
    left_out = Figure("a", "", "", "x", 10.0, 10.9, fitted=True, left_out=11.9)
    assert left_out.left_out_ok and left_out.left_out_error == pytest.approx(0.19)
    assert not Figure("a", "", "", "x", 10.0, 10.9, fitted=True, left_out=12.1).left_out_ok
    assert Figure("a", "", "", "x", 10.0, 10.9).left_out_ok is None
    assert Figure("a", "", "", "x", (1.0, 3.0), (1.5, 2.9)).ok
    assert not Figure("a", "", "", "x", (1.0, 3.0), (0.9, 2.9)).ok
    assert Figure("a", "", "", "", True, True).ok
    assert not Figure("a", "", "", "", True, False).ok
    assert Figure("a", "", "", "x", 10.0, 9.0).error == -0.1
