"""`rdu demo`, which `make run` runs: the whole demo as a user runs it, on a free port."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from rdurack.cli.demo import DemoJob, demo_jobs, outcome_ok
from tests.support.ports import free_port

pytestmark = pytest.mark.integration


def test_demo_runs_every_section_and_takes_the_rack_down(tmp_path: Path) -> None:
    state = tmp_path / "state"
    env = {**os.environ, "COLUMNS": "200"}  # rich wraps tables at the terminal's width
    port = str(free_port())
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "rdurack.cli.main",
            "demo",
            "--state-dir",
            str(state),
            "--port",
            port,
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    for title in ("1. What fusion buys", "2. Composition of Experts", "150 experts", "3. DDP"):
        assert title in out
    # Every job ended as expected: the DGXs out of memory at 150 experts, the rest done.
    tables = out[out.index("1. What fusion buys") :]  # not the progress bars above them
    assert tables.count("SUCCEEDED") == len(demo_jobs()) - 2
    assert tables.count("out of memory:") == 2  # the outcome column, not the caption
    assert "unexpected" not in out
    # rdu down stopped the four processes rdu up started, and they are gone.
    stopped = [int(p) for p in re.findall(r"\(pid (\d+)\): stopped", out)]
    assert len(stopped) == 4
    for pid in stopped:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def _done(state: str, oom: bool = False) -> dict[str, object]:
    return {"state": state, "oom": oom}


def test_outcome_ok_expects_oom_only_where_the_paper_does() -> None:
    jobs = demo_jobs()
    dgx150 = [j for j in jobs if j.oom_expected]
    assert sorted(j.label for j in dgx150) == ["dgx-a100", "dgx-h100"]
    assert all(j.section == "coe150" for j in dgx150)
    sn = next(j for j in jobs if j.section == "coe150" and not j.oom_expected)
    assert outcome_ok(sn, _done("SUCCEEDED"))
    assert not outcome_ok(sn, _done("FAILED", oom=True))
    assert outcome_ok(dgx150[0], _done("FAILED", oom=True))
    assert not outcome_ok(dgx150[0], _done("SUCCEEDED"))  # a DGX holding 1 T params is wrong
    assert not outcome_ok(dgx150[0], _done("FAILED"))  # failing for another reason too
    kernel: DemoJob = jobs[0]
    assert not outcome_ok(kernel, _done("CANCELLED"))
