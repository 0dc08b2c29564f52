"""Where a script job's ranks keep their files, under the job's directory (the
orchestrator's checkpoint directory for the job, on a filesystem every node agent sees):
one working folder all ranks share, as torchrun's ranks on one node share theirs, and
one log per rank (its stdout and stderr as they interleaved)."""

from __future__ import annotations

from pathlib import Path

WORK = "work"  # the ranks' shared working folder (their cwd)
LOGS = "logs"


def work_dir(job_dir: Path) -> Path:
    return job_dir / WORK


def log_path(job_dir: Path, rank: int) -> Path:
    """Rank `rank`'s stdout and stderr."""
    return job_dir / LOGS / f"rank-{rank}.log"
