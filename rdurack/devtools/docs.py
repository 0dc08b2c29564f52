"""Regenerate the generated blocks of the docs: `python -m rdurack.devtools.docs` (`make docs`).

A block is the output of one `rdu` command between two markers::

    <!-- generated: rdu bench paper --markdown -->
    ...
    <!-- end generated -->

`tests/unit/test_docs.py` fails when a block differs from what its command prints today,
so a page never shows figures the code no longer computes.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

BLOCK = re.compile(r"(<!-- generated: (.+?) -->\n)(.*?)(<!-- end generated -->)", re.S)

DOCS = Path(__file__).resolve().parents[2] / "docs"


def blocks(text: str) -> dict[str, str]:
    """Each block's command and the text it holds now."""
    return {m[2]: m[3] for m in BLOCK.finditer(text)}


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
    """Rewrite the blocks of one page; returns the commands whose output changed."""
    text = path.read_text()
    changed: list[str] = []

    def fill(match: re.Match[str]) -> str:
        fresh = run(match[2])
        if fresh != match[3]:
            changed.append(match[2])
        return match[1] + fresh + match[4]

    new = BLOCK.sub(fill, text)
    if new != text:
        path.write_text(new)
    return changed


def main() -> None:
    for page in sorted(DOCS.glob("*.md")):
        for command in regenerate(page):
            print(f"{page.name}: regenerated `{command}`")


if __name__ == "__main__":
    main()
