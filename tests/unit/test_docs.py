"""Generated tables in the docs must equal what the code computes today, and a figure
what the tables it was drawn from say."""

from __future__ import annotations

import re

import pytest

from rdurack.cli.stream import SWEEP
from rdurack.devtools.docs import DOCS, FIGURE, SCALING, STUDIES, blocks, figures, run, sources
from rdurack.traces.plotdata.scaling import scaling_title
from rdurack.traces.plotdata.serving import RateCurve, rates_title
from rdurack.traces.plots.scaling import read_scaling
from rdurack.traces.plots.serving import read_curves

FIGURES = DOCS / "figures.md"
GENERATED = [
    (page.name, command)
    for page in sorted(DOCS.glob("*.md"))
    for command in sorted(blocks(page.read_text()))
]


def test_figures_md_has_its_generated_tables() -> None:
    assert set(blocks(FIGURES.read_text())) == {
        "rdu bench paper --markdown",
        "rdu bench assumptions --markdown",
        "rdu spec --platform sn40l-rack16 --markdown",
    }


@pytest.mark.parametrize(("page", "command"), GENERATED, ids=[f"{p}: {c}" for p, c in GENERATED])
def test_generated_table_is_up_to_date(page: str, command: str) -> None:
    assert blocks((DOCS / page).read_text())[command] == run(command), (
        f"docs/{page} is stale: regenerate its blocks with `make docs` ({command})"
    )


FIGURED = [
    (page.name, name, prefix)
    for page in sorted(DOCS.glob("*.md"))
    for name, prefix in figures(page.read_text()).items()
    if prefix == STUDIES
]


def _table(markdown: str) -> list[dict[str, str]]:
    """The rows of a generated study table, by column."""
    lines = [line.strip("|").split(" | ") for line in markdown.splitlines() if line[:1] == "|"]
    header, _, *rows = [[cell.strip() for cell in line] for line in lines]
    return [dict(zip(header, row, strict=True)) for row in rows]


def _cells(c: RateCurve) -> list[dict[str, str]]:
    """A curve's figures as its table prints them."""
    form = {column: (scale, f) for column, _, scale, f in SWEEP}
    columns = {"TTFT p50 (ms)": c.ttft_p50_s, "TTFT p99 (ms)": c.ttft_p99_s,
               "ITL p99 (ms)": c.itl_p99_s}  # fmt: skip
    return [
        {"rate (req/s)": f"{rate:g}"}
        | {k: form[k][1].format(v[i] * form[k][0]) for k, v in columns.items()}
        for i, rate in enumerate(c.rates)
    ]


def test_serving_md_has_its_figure() -> None:
    assert figures((DOCS / "serving.md").read_text()) == {
        "img/serving-rates.png": "rdu predict serve"
    }


@pytest.mark.parametrize(("page", "name", "prefix"), FIGURED, ids=[n for _, n, _ in FIGURED])
def test_a_figure_shows_what_the_tables_it_was_drawn_from_say(
    page: str, name: str, prefix: str
) -> None:
    text = (DOCS / page).read_text()
    curves = read_curves(DOCS / name)
    stale = f"docs/{name} is stale: redraw it with `make docs`"
    assert [c.source for c in curves] == sources(text, prefix), stale
    for c in curves:  # every point as its table prints it
        want = _cells(c)
        got = [{k: row[k] for k in want[0]} for row in _table(blocks(text)[c.source])]
        assert got == want, stale
    link = next(m[4] for m in FIGURE.finditer(text) if m[2] == name)
    assert link == f"![{rates_title(curves)}]({name})\n", stale


def test_training_md_has_its_scaling_figure_of_what_its_table_says() -> None:
    text = (DOCS / "training.md").read_text()
    prefix = f"{SCALING} --model llama3.1-8b --racks 64"
    assert figures(text) == {"img/ddp-racks.png": prefix}
    curve = read_scaling(DOCS / "img/ddp-racks.png")
    stale = "docs/img/ddp-racks.png is stale: redraw it with `make docs`"
    assert [curve.source] == sources(text, prefix), stale
    rows = _table(blocks(text)[curve.source])
    want = [
        {"ranks": str(n), "step": f"{t * 1e3:.3f} ms", "efficiency": f"{e:.1%}"}
        for n, t, e in zip(curve.ranks, curve.step_s, curve.efficiency, strict=True)
    ]
    assert [{k: row[k] for k in want[0]} for row in rows] == want, stale
    link = next(m[4] for m in FIGURE.finditer(text) if m[2] == "img/ddp-racks.png")
    assert link == f"![{scaling_title(curve)}](img/ddp-racks.png)\n", stale


def test_readme_count_of_reproduced_figures_is_current() -> None:
    from rdurack.workloads.paper.study import PaperStudy

    readme = (DOCS.parent / "README.md").read_text()
    found = re.search(r"reproduces (\d+) of (\d+) published figures", readme)
    assert found, "README.md no longer states how many figures it reproduces"
    figures = PaperStudy().figures()
    assert (int(found[1]), int(found[2])) == (sum(f.ok for f in figures), len(figures))
