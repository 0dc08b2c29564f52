"""`rdu trace` (traces/export.py): both files written from a trace dir, the dir the
state dir implies, lost parents counted, and its errors (and `rdu plot`'s) one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rdurack.traces.export import write_trace
from rdurack.traces.jaeger import validate_jaeger
from tests.support.traces import OPS, SOCKETS
from tests.unit.traces.conftest import Rdu


def test_rdu_trace_writes_both_files(job_dir: Path, tmp_path: Path, rdu: Rdu) -> None:
    out = tmp_path / "out"
    code, stdout, err = rdu("trace", "job-a", "--out", str(out), "--trace-dir", str(job_dir),
                            "--json")  # fmt: skip
    assert code == 0, err
    summary = json.loads(stdout)
    assert summary["spans"] == 4 + len(SOCKETS) * len(OPS) and summary["sockets"] == 2
    assert validate_jaeger(json.loads(Path(summary["jaeger"]).read_text())) == []
    assert json.loads(Path(summary["chrome"]).read_text())["traceEvents"]


def test_the_trace_dir_defaults_to_the_state_dirs(job_dir: Path, tmp_path: Path, rdu: Rdu) -> None:
    # job_dir is tmp_path/traces: STATE_DIR/traces for the state dir tmp_path.
    code, stdout, err = rdu("trace", "job-b", "--out", str(tmp_path / "o"),
                            "--state-dir", str(tmp_path))  # fmt: skip
    assert code == 0, err
    assert (tmp_path / "o" / "job-b.jaeger.json").is_file()
    assert "job job-b:" in stdout


@pytest.mark.parametrize("command", ["trace", "plot"])
def test_errors_are_one_line(job_dir: Path, tmp_path: Path, rdu: Rdu, command: str) -> None:
    out = str(tmp_path / "o")
    code, _, err = rdu(command, "nope", "--out", out, "--trace-dir", str(job_dir))
    assert code == 2 and err.count("\n") == 1
    assert "no spans of job 'nope'" in err and "job-a" in err and "job-b" in err
    code, _, err = rdu(command, "job-a", "--out", out, "--trace-dir", str(tmp_path / "absent"))
    assert code == 2 and err.count("\n") == 1
    assert "no trace dir" in err and "RDURACK_TRACE_DIR" in err and "rdu up" in err
    (tmp_path / "empty").mkdir()
    code, _, err = rdu(command, "job-a", "--out", out, "--trace-dir", str(tmp_path / "empty"))
    assert code == 2 and "no trace files" in err


def test_write_trace_reports_lost_parents(job_dir: Path, tmp_path: Path) -> None:
    for f in job_dir.glob("rdurack-node-agent-0-*.jsonl"):
        f.unlink()  # the agent crashed before writing anything
    written = write_trace("job-a", job_dir, tmp_path / "o")
    assert written.missing_parents == len(SOCKETS) * len(OPS)  # their parent was lost
    assert written.services == 1 + len(SOCKETS)
