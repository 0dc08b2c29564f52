"""Regenerate the generated blocks of the docs: `python -m rdurack.devtools.docs` (`make docs`).

A block is the output of one `rdu` command between two markers::

    <!-- generated: rdu bench paper --markdown -->
    ...
    <!-- end generated -->

A figure is a PNG beside the page (its path relative to docs/) drawn from the page's
blocks whose command starts with a prefix, each run again with `--json`; between its
markers, the image's link::

    <!-- figure: img/serving-rates.png from: rdu predict serve -->
    ![...](img/serving-rates.png)
    <!-- end figure -->

Two kinds are drawn: `rdu predict serve` studies (several `--rate`) and one
`rdu predict ddp` scaling study (step time and efficiency against ranks). The PNG
carries the figures it shows (traces/plots/serving.py `read_curves`,
traces/plots/scaling.py `read_scaling`).

`tests/unit/test_docs.py` fails when a block differs from what its command prints today,
or a figure from the blocks it was drawn from, so a page never shows figures the code no
longer computes.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from rdurack.traces.plotdata.scaling import scaling_curve, scaling_title
from rdurack.traces.plotdata.serving import RateCurve, rate_curve, rates_title
from rdurack.workloads.serving.stream.report import StreamReport

BLOCK = re.compile(r"(<!-- generated: (.+?) -->\n)(.*?)(<!-- end generated -->)", re.S)
FIGURE = re.compile(r"(<!-- figure: (\S+) from: (.+?) -->\n)(.*?)(<!-- end figure -->)", re.S)
STUDIES = "rdu predict serve"  # the blocks a figure of rates draws
SCALING = "rdu predict ddp"  # ... and a figure of DDP scaling (the one block its prefix names)

DOCS = Path(__file__).resolve().parents[2] / "docs"


def blocks(text: str) -> dict[str, str]:
    """Each block's command and the text it holds now."""
    return {m[2]: m[3] for m in BLOCK.finditer(text)}


def figures(text: str) -> dict[str, str]:
    """Each figure's path (relative to docs/) and the command prefix of its blocks."""
    return {m[2]: m[3] for m in FIGURE.finditer(text)}


def sources(text: str, prefix: str) -> list[str]:
    """The commands of the blocks a figure draws, in the page's order."""
    return [command for command in blocks(text) if command.startswith(prefix + " ")]


def study(command: str) -> RateCurve:
    """The curve of a block's study of rates: its command run with --json."""
    args = [a for a in command.split() if a != "--markdown"]
    data = json.loads(run(" ".join([*args, "--json"])))
    reports = [StreamReport.model_validate(row) for row in data["rows"]]
    return rate_curve(data["rates"], reports, source=command)


def draw(text: str, name: str, prefix: str) -> str:
    """Draw figure `name` from the page's blocks (`text`); its link, for the page."""
    if prefix == SCALING or prefix.startswith(SCALING + " "):
        return draw_scaling(text, name, prefix)
    if prefix != STUDIES:
        raise ValueError(f"a figure draws {STUDIES} or {SCALING} studies, not {prefix!r}")
    from rdurack.traces.plots.serving import plot_rates  # matplotlib: only to draw

    curves = [study(command) for command in sources(text, prefix)]
    plot_rates(curves, DOCS / name)
    return f"![{rates_title(curves)}]({name})\n"


def draw_scaling(text: str, name: str, prefix: str) -> str:
    """Draw figure `name` from the page's one `rdu predict ddp` block that `prefix`
    names; its link."""
    from rdurack.traces.plots.scaling import plot_scaling  # matplotlib: only to draw

    found = sources(text, prefix)
    if len(found) != 1:
        raise ValueError(f"a scaling figure draws one block, {prefix!r} names {len(found)}")
    command = found[0]
    args = [a for a in command.split() if a != "--markdown"]
    curve = scaling_curve(json.loads(run(" ".join([*args, "--json"]))), source=command)
    plot_scaling(curve, DOCS / name)
    return f"![{scaling_title(curve)}]({name})\n"


def run(command: str) -> str:
    """What `command` (an `rdu ...` line) prints, run in this interpreter."""
    args = command.split()
    if args[0] != "rdu":
        raise ValueError(f"a generated block runs rdu, not {args[0]!r}")
    done = subprocess.run(
        [sys.executable, "-m", "rdurack.cli.main", *args[1:]],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


def regenerate(path: Path) -> list[str]:
    """Rewrite the blocks of one page, then redraw its figures from them; returns the
    commands whose output changed and the figures that changed."""
    text = path.read_text()
    changed: list[str] = []

    def fill(match: re.Match[str]) -> str:
        fresh = run(match[2])
        if fresh != match[3]:
            changed.append(match[2])
        return match[1] + fresh + match[4]

    new = BLOCK.sub(fill, text)

    def picture(match: re.Match[str]) -> str:
        png = DOCS / match[2]
        before = png.read_bytes() if png.exists() else b""
        link = draw(new, match[2], match[3])
        if png.read_bytes() != before or link != match[4]:
            changed.append(match[2])
        return match[1] + link + match[5]

    new = FIGURE.sub(picture, new)
    if new != text:
        path.write_text(new)
    return changed


def main() -> None:
    for page in sorted(DOCS.glob("*.md")):
        for command in regenerate(page):
            print(f"{page.name}: regenerated `{command}`")


if __name__ == "__main__":
    main()
