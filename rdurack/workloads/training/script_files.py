"""A script job's files: its source, checked before it is stored, and where its ranks
keep their files under the job's directory (the orchestrator's checkpoint directory for
the job, on a filesystem every node agent sees): one working folder all ranks share, as
torchrun's ranks on one node share theirs, and one log per rank (its stdout and stderr
as they interleaved)."""

from __future__ import annotations

from pathlib import Path

WORK = "work"  # the ranks' shared working folder (their cwd)
LOGS = "logs"


def work_dir(job_dir: Path) -> Path:
    return job_dir / WORK


def log_path(job_dir: Path, rank: int) -> Path:
    """Rank `rank`'s stdout and stderr."""
    return job_dir / LOGS / f"rank-{rank}.log"


def check_script(source: bytes, name: str) -> None:
    """Refuse a script that could never run: a bad file name, text that is not UTF-8,
    a syntax error (with its line)."""
    if not name.endswith(".py") or "/" in name or "\\" in name or name.startswith("."):
        raise ValueError(f"script_name {name!r}: a plain file name ending in .py, e.g. train.py")
    try:
        text = source.decode()
    except UnicodeDecodeError as e:
        raise ValueError(f"{name}: not UTF-8 text (byte {e.start})") from None
    try:
        compile(text, name, "exec")
    except SyntaxError as e:
        raise ValueError(f"{name}, line {e.lineno}: {e.msg}") from None
