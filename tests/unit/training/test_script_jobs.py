"""A script job as it is submitted: what is refused up front with the reason, what
`rdu submit train --script` sends, and its ranks' logs as JobService reads them."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from rdurack.cli.train import script_job
from rdurack.errors import InvalidRequest
from rdurack.orchestrator.logs import MAX_LOG_BYTES, read_logs
from rdurack.workloads.training.job import (
    MAX_LOOP_BYTES,
    SCRIPT_PROGRESS_S,
    SCRIPT_STOP_S,
    START_TIMEOUT_S,
    TrainingWorkload,
    log_path,
)


def workload(source: str = "print('hi')\n", **fields: object) -> TrainingWorkload:
    return TrainingWorkload.model_validate(
        {"world_size": 3, "script": source.encode(), "script_name": "train.py", **fields}
    )


def test_a_script_job_takes_any_world_size_and_says_what_it_trains() -> None:
    w = workload()  # 3 ranks, the default global batch of 64: not the built-in loop's
    assert w.user_code and w.label == "(script train.py)"
    # Its calls come back within SCRIPT_PROGRESS_S; the first meets the peers (up to
    # wall_timeout_s), and one may stop a script past run_timeout_s (SCRIPT_STOP_S).
    assert w.call_timeout_s(60.0) == 60.0 + w.wall_timeout_s + SCRIPT_PROGRESS_S + SCRIPT_STOP_S
    assert w.call_timeout_s(60.0) < w.run_timeout_s  # not the whole run in one call
    # Starting the ranks (no step, no peer met) has its own bound, beside the caller's.
    assert w.call_timeout_s(60.0, prepare=True) == START_TIMEOUT_S + 60.0


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"script": b"x = (\n"}, "train.py, line 1"),
        ({"script": b"\xff\xfe"}, "not UTF-8"),
        ({"script_name": "../train.py"}, "a plain file name ending in .py"),
        ({"script_name": "train.sh"}, "a plain file name ending in .py"),
        ({"loop": b"pickled"}, "a script or a client's loop, not both"),
        ({"strategy": "progressive", "blocks": 2}, "strategy progressive is the built-in"),
    ],
)
def test_a_script_that_could_never_run_is_refused_naming_why(
    fields: dict[str, object], named: str
) -> None:
    with pytest.raises(ValidationError, match=named.replace("(", r"\(").replace(")", r"\)")):
        workload(**fields)  # type: ignore[arg-type]


def test_the_cli_sends_the_files_content_name_and_split_arguments(tmp_path: Path) -> None:
    f = tmp_path / "train.py"
    f.write_text("import sys\n")
    job = script_job(f, "--lr 0.1 --name 'two words'", 16, None, 120.0)
    assert job.script == b"import sys\n" and job.script_name == "train.py"
    assert list(job.script_args) == ["--lr", "0.1", "--name", "two words"]
    assert job.world_size == 16 and job.run_timeout_s == 120.0


@pytest.mark.parametrize(
    ("make", "args", "named"),
    [
        (None, "", "No such file"),
        ("big", "", f"limit {MAX_LOOP_BYTES:,}"),
        ("ok", "--name 'unclosed", "--script-args: No closing quotation"),
    ],
)
def test_the_cli_refuses_a_script_it_cannot_send(
    tmp_path: Path, make: str | None, args: str, named: str
) -> None:
    f = tmp_path / "train.py"
    if make == "big":
        f.write_bytes(b"#" * (MAX_LOOP_BYTES + 1))
    elif make == "ok":
        f.write_text("pass\n")
    with pytest.raises(InvalidRequest, match=named):
        script_job(f, args, 4, None, None)


def test_logs_are_each_ranks_tail_and_a_missing_one_is_skipped(tmp_path: Path) -> None:
    for rank, text in ((0, "hello\n"), (2, "é" + "x" * MAX_LOG_BYTES)):
        log_path(tmp_path, rank).parent.mkdir(parents=True, exist_ok=True)
        log_path(tmp_path, rank).write_text(text)
    logs = read_logs(tmp_path, 4)
    assert [(g.rank, g.truncated) for g in logs] == [(0, False), (2, True)]
    assert logs[0].text == "hello\n"
    assert logs[1].text == "x" * MAX_LOG_BYTES  # the last MiB, whole characters
    (only,) = read_logs(tmp_path, 4, rank=0)
    assert only.rank == 0
    assert read_logs(tmp_path, 4, rank=1) == []  # rank 1 printed nothing yet
    with pytest.raises(InvalidRequest, match="4 is not a rank of a job of 4"):
        read_logs(tmp_path, 4, rank=4)
