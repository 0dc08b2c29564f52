"""Generated tables in the docs must equal what the code computes today."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs" / "figures.md"


def _blocks(text: str) -> dict[str, str]:
    pattern = re.compile(r"<!-- generated: (.+?) -->\n(.*?)<!-- end generated -->", re.S)
    return {cmd: body for cmd, body in pattern.findall(text)}


def test_figures_md_has_both_generated_tables() -> None:
    assert set(_blocks(DOCS.read_text())) == {
        "rdu bench paper --markdown",
        "rdu spec --platform sn40l-rack16 --markdown",
    }


@pytest.mark.parametrize("command", sorted(_blocks(DOCS.read_text())))
def test_generated_table_is_up_to_date(command: str) -> None:
    args = command.split()[1:]
    done = subprocess.run(
        [sys.executable, "-m", "rdurack.cli.main", *args],
        capture_output=True,
        text=True,
        check=True,
    )
    assert _blocks(DOCS.read_text())[command] == done.stdout, (
        f"docs/figures.md is stale: regenerate the block with `{command}`"
    )


def test_readme_count_of_reproduced_figures_is_current() -> None:
    from rdurack.workloads.paper.study import PaperStudy

    readme = (DOCS.parents[1] / "README.md").read_text()
    found = re.search(r"reproduces (\d+) of (\d+) published figures", readme)
    assert found, "README.md no longer states how many figures it reproduces"
    figures = PaperStudy().figures()
    assert (int(found[1]), int(found[2])) == (sum(f.ok for f in figures), len(figures))
