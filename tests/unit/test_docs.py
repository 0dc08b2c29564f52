"""Generated tables in the docs must equal what the code computes today."""

from __future__ import annotations

import re

import pytest

from rdurack.devtools.docs import DOCS, blocks, run

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


def test_readme_count_of_reproduced_figures_is_current() -> None:
    from rdurack.workloads.paper.study import PaperStudy

    readme = (DOCS.parent / "README.md").read_text()
    found = re.search(r"reproduces (\d+) of (\d+) published figures", readme)
    assert found, "README.md no longer states how many figures it reproduces"
    figures = PaperStudy().figures()
    assert (int(found[1]), int(found[2])) == (sum(f.ok for f in figures), len(figures))
